"""The registry of methods the DC3 harness can train and evaluate.

Each method is a module with two functions:

- `default_config(data: Dataset) -> Config`: its hyperparameters for a data set,
    a frozen dataclass (`benchmarks._common.config`); the CLI overrides them with
    `--set key=value`, and an unknown key is an error;
- `fit(data: Dataset, config, seed: int, run: Run) -> Trained`: train (or set
    up) the model, calling `run.set_total(steps)` once, `run.step(loss)` after
    each optimiser step and `run.validate(predict, epoch)` after each epoch (or
    every `config.validate_every` epochs), and return a `Trained`; the shared loop
    `benchmarks._common.training.train_loop` does all this.

Methods compute in JAX's default float dtype (`float32`, or `float64` when the CLI
runs with `--precision 64`); the data arrive as float64 NumPy arrays.
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
