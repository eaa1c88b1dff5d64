"""Numerics with no Πnet concept in them.

Sparse matrices inside `jit` (`sparse`), nearly exact residuals and sums
(`residual`), full-precision products (`precision`), the Krylov solvers of the
backward pass (`krylov`), modified Ruiz equilibration (`equilibration`), and the
host's sparse LU and saddle-point factorisations (`host_solve`), the faces'
saddle-point systems reached through `jax.pure_callback` (`host_saddle`), and
worker processes for the host work that holds the GIL (`host_processes`).
This is the bottom layer: it imports nothing from `pinet_eqx`.
"""

from .equilibration import Equilibration as Equilibration, equilibrate as equilibrate
from .krylov import (
    BackwardNotConvergedWarning as BackwardNotConvergedWarning,
    BiCGStab as BiCGStab,
    ConjugateGradient as ConjugateGradient,
)
