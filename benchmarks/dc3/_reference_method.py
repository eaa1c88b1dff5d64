"""The published Pinet (PyPI `pinet-hcnn` 0.2.0) in our harness, as a baseline.

The backbone, loss, optimiser and data are ours and shared with every method; only
the projection layer is the reference's (`benchmarks._reference`), with the
paper's configuration for the problem (App. B.2): its tuned $\\sigma$, 50
iterations for training and testing, Ruiz equilibration with 25 iterations,
$\\omega = 1.7$, 25 backward iterations, Adam at 1e-2 with a constant rate,
batch 2048 and 50 epochs. Install it with
`pip install --no-deps pinet-hcnn==0.2.0 beartype`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._reference import ReferenceDC3Projector
from ._data import Dataset
from ._harness import Run, Trained
from ._pinet import PAPER_SIGMA
from ._training import backbone, fit_network


def default_config(data: Dataset) -> dict:
    """The paper's configuration of the reference for `data`."""
    size = data.source.get("size", "small")
    return {
        "sigma": PAPER_SIGMA.get(size, 1.0),
        "omega": 1.7,
        "n_iter": 50,
        "n_iter_test": 50,
        "n_iter_bwd": 25,
        "equilibrate": True,
        "epochs": 50,
        "batch_size": 2048,
        "lr": 1e-2,
        "lr_schedule": "constant",
        "validate_every": 1,
        "max_time_s": None,
    }


def fit(data: Dataset, config: dict, seed: int, run: Run) -> Trained:
    """Train the shared backbone through the reference's projection layer."""
    dtype = jnp.result_type(float)
    P = data.problem
    layer = ReferenceDC3Projector(
        P.A,
        P.G,
        P.h,
        sigma=config["sigma"],
        omega=config["omega"],
        equilibrate=config["equilibrate"],
        dtype=dtype,
    )
    mlp = backbone(P.n_eq, P.n_var, seed, dtype)
    objective = data.objective_jax(dtype)

    def project(model, X, n_iter):
        Y_raw = jax.vmap(model)(X)
        return layer._call(Y_raw, X, n_iter, config["n_iter_bwd"])

    def loss(model, X):
        return jnp.mean(objective(project(model, X, config["n_iter"])))

    batch_predict = eqx.filter_jit(lambda m, X: project(m, X, config["n_iter_test"]))

    def predict(model, X):
        return batch_predict(model, jnp.asarray(X, dtype))

    mlp = fit_network(
        mlp, data, config, seed, run, loss, predict, filter_spec=eqx.is_inexact_array
    )
    return Trained(
        predict=lambda X: predict(mlp, X),
        predict_single=lambda x: predict(mlp, np.asarray(x)[None]),
        info={"package": "pinet-hcnn 0.2.0"},
    )
