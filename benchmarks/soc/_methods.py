"""The registry of methods the second-order-cone benchmark can run (as in the DC3
suite; the two solver baselines are objects, `"module:attribute"`)."""

from __future__ import annotations

from .._common.harness import Registry
from .._common.report import Suite

REGISTRY = Registry(
    "benchmarks.soc",
    {
        "pinet": ("Our projection layer (pinet_eqx.HardConstrainedNet)", "_pinet"),
        "cvxpylayers": (
            "cvxpylayers (JAX interface, Clarabel) as the projection layer",
            "_cvxpylayers",
        ),
        "cvxpy": (
            "SCS through a CVXPY DPP-parametrised problem, one instance at a time",
            "_solvers:CVXPY",
        ),
        "scs": (
            "SCS called directly, one factorisation, update(b, c) per instance",
            "_solvers:SCS",
        ),
    },
)
METHODS = REGISTRY.descriptions
get = REGISTRY.get
# The report's title, command and method order (`benchmarks._common.report`).
SUITE = Suite(
    "Second-order-cone benchmark results (paper App. B.4)",
    "python -m benchmarks.soc",
    tuple(METHODS),
    "soc",
)
