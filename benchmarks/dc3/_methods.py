"""The registry of methods the DC3 harness can train and evaluate.

Each method is a module with two functions:

- `default_config(data: Dataset) -> dict`: its hyperparameters for a data set
    (the CLI overrides them with `--set key=value`);
- `fit(data: Dataset, config: dict, seed: int, run: Run) -> Trained`: train (or
    set up) the model, calling `run.set_total(steps)` once, `run.step(loss)` after
    each optimiser step and `run.validate(predict, epoch)` after each epoch (or
    every `config["validate_every"]` epochs), and return a `Trained`.

Methods compute in JAX's default float dtype (`float32`, or `float64` when the CLI
runs with `--precision 64`); the data arrive as float64 NumPy arrays.
"""

from __future__ import annotations

import importlib

METHODS = {
    "pinet": "Our projection layer (pinet_eqx.HardConstrainedNet)",
    "reference": "The published Pinet (PyPI pinet-hcnn 0.2.0) with the paper's setup",
    "dc3": "DC3 (Donti et al., 2021), a clean-room JAX reimplementation",
    "jaxopt": "jaxopt.OSQP as the projection layer, implicit differentiation",
    "cvxpylayers": "cvxpylayers (JAX interface) as the projection layer",
    "solver": "OSQP (convex) or IPOPT (non-convex), one context at a time",
    "soft": "Soft-penalty training, our projection only at inference (App. H.4)",
}
_MODULES = {
    "pinet": "_pinet",
    "reference": "_reference_method",
    "dc3": "_dc3net",
    "jaxopt": "_jaxopt",
    "cvxpylayers": "_cvxpylayers",
    "solver": "_solver_method",
    "soft": "_soft",
}


def get(name: str):
    """The module implementing method `name`."""
    if name not in _MODULES:
        raise ValueError(f"Unknown method {name!r}; choose one of {tuple(METHODS)}.")
    return importlib.import_module(f"benchmarks.dc3.{_MODULES[name]}")
