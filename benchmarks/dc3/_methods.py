"""The registry of methods the DC3 harness can train and evaluate.

Each is a module with `default_config(data) -> Config` and `fit(data, config,
seed, run) -> Trained` (`benchmarks._common.harness`), computing in JAX's default
float dtype.
"""

from __future__ import annotations

from .._common.harness import Registry
from .._common.report import Suite

REGISTRY = Registry(
    "benchmarks.dc3",
    {
        "pinet": ("Our projection layer (pinet_eqx.HardConstrainedNet)", "_pinet"),
        "reference": (
            "The published Pinet (PyPI pinet-hcnn 0.2.0) with the paper's setup",
            "_reference_method",
        ),
        "dc3": (
            "DC3 (Donti et al., 2021), a clean-room JAX reimplementation",
            "_dc3net",
        ),
        "jaxopt": (
            "jaxopt.OSQP as the projection layer, implicit differentiation",
            "_jaxopt",
        ),
        "cvxpylayers": (
            "cvxpylayers (JAX interface) as the projection layer",
            "_cvxpylayers",
        ),
        "solver": (
            "OSQP (convex) or IPOPT (non-convex), one context at a time",
            "_solver_method",
        ),
        "soft": (
            "Soft-penalty training, our projection only at inference (App. H.4)",
            "_soft",
        ),
    },
)
METHODS = REGISTRY.descriptions
get = REGISTRY.get
# The report's title, command and method order (`benchmarks._common.report`).
SUITE = Suite(
    "DC3 benchmark results", "python -m benchmarks.dc3", tuple(METHODS), "dc3"
)
