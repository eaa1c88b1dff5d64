"""Benchmark problems: data generators, reference solvers and metrics.

Importing this subpackage imports only NumPy; JAX and the optional solvers are
imported by the functions that need them.
"""

from ._dc3 import (
    DC3Problem as DC3Problem,
    dc3_objective as dc3_objective,
    dc3_violation as dc3_violation,
    make_dc3 as make_dc3,
    solve_dc3_convex as solve_dc3_convex,
)
