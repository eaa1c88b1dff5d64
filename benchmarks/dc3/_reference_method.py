"""The published Pinet (PyPI `pinet-hcnn` 0.2.0) in our harness, as a baseline:
our backbone, loss and data, the reference's projection layer at the paper's
configuration (App. B.2)."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp

from .._common.config import PaperTrainingConfig
from .._common.harness import Run, Trained
from .._common.problems import (
    PAPER_N_ITER,
    PAPER_N_ITER_BWD,
    PAPER_OMEGA,
    PAPER_SIGMA,
)
from .._common.reference import ReferenceDC3Projector
from .._common.training import backbone, fit_model
from ._data import Dataset


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(PaperTrainingConfig):
    """The reference's projection settings (the paper's) and the paper's
    optimiser."""

    sigma: float = 1.0
    omega: float = PAPER_OMEGA
    n_iter: int = PAPER_N_ITER
    n_iter_test: int = PAPER_N_ITER
    n_iter_bwd: int = PAPER_N_ITER_BWD
    equilibrate: bool = True


def default_config(data: Dataset) -> Config:
    """The paper's configuration of the reference for `data`."""
    return Config(sigma=PAPER_SIGMA.get(data.source.get("size", "small"), 1.0))


def fit(data: Dataset, config: Config, seed: int, run: Run) -> Trained:
    """Train the shared backbone through the reference's projection layer."""
    dtype = jnp.result_type(float)
    P = data.problem
    settings = dict(sigma=config.sigma, omega=config.omega, dtype=dtype)
    settings["equilibrate"] = config.equilibrate
    layer = ReferenceDC3Projector(P.A, P.G, P.h, **settings)
    train_projection = layer.projection(config.n_iter, config.n_iter_bwd)
    test_projection = layer.projection(config.n_iter_test, config.n_iter_bwd)
    objective = data.objective_jax(dtype)

    def loss(model, X):
        return jnp.mean(objective(train_projection(jax.vmap(model)(X), X)))

    def apply(model, X):
        return test_projection(jax.vmap(model)(X), X)

    model = backbone(P.n_eq, P.n_var, seed, dtype)
    info, spec = {"package": "pinet-hcnn 0.2.0"}, eqx.is_inexact_array
    return fit_model(
        model, data, config, seed, run, loss, apply, info=info, filter_spec=spec
    )
