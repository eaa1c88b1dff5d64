"""Soft-penalty training, with our projection added only at inference (App. H.4,
"Pinet-inf"): the backbone is trained on
$J(\\hat y) + \\lambda (\\|A \\hat y - x\\|^2 + \\|\\max(G \\hat y - h, 0)\\|^2)$.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

import pinet_eqx as pe

from .._common import pinet_method
from .._common.harness import Run, Trained
from .._common.training import backbone, fit_model
from . import _pinet
from ._data import Dataset


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(_pinet.Config):
    """The projection's settings of `pinet`, a penalty weight and the optimiser."""

    penalty: float = 10.0
    lr: float = 1e-3
    batch_size: int = 200
    lr_schedule: Literal["constant", "cosine"] = "cosine"


def default_config(data: Dataset) -> Config:
    """`pinet`'s configuration for `data`, with this method's optimiser."""
    pinet = _pinet.default_config(data).as_dict()
    for key in ("lr", "batch_size", "lr_schedule"):
        del pinet[key]
    return Config(**pinet)


def penalty(data: Dataset, dtype):
    """$\\|A y - x\\|^2 + \\|\\max(G y - h, 0)\\|^2$ for one `(y, x)`."""
    P = data.problem
    A, G, h = (jnp.asarray(a, dtype) for a in (P.A, P.G, P.h))

    def one(y, x):
        return jnp.sum((A @ y - x) ** 2) + jnp.sum(jnp.maximum(G @ y - h, 0.0) ** 2)

    return one


def fit(data: Dataset, config: Config, seed: int, run: Run) -> Trained:
    """Train the backbone on the penalised loss; the projection joins at
    inference (and in the validation curves, which show the deployed model)."""
    dtype = jnp.result_type(float)
    P = data.problem
    projector = _pinet.make_projector(data, config)
    info = {}
    if config.autotune:
        B = data.X_valid[: config.autotune_points]
        result = pinet_method.tune_projector(projector, B, P.n_var, seed)
        n_iter_test = max(result.n_iter, config.n_iter_test)
        projector = result.projector.with_settings(n_iter_test=n_iter_test)
        info.update(autotune_s=result.seconds, sigma=result.sigma)
    objective = data.objective_jax(dtype)
    violation = jax.vmap(penalty(data, dtype))
    weight = config.penalty

    def loss(net, X):
        # The bare backbone: no projection in training.
        Y = jax.vmap(net.backbone)(X)
        return jnp.mean(objective(Y) + weight * violation(Y, X))

    def apply(net, X):
        return jax.vmap(lambda x: net(x, b=x))(X)

    # Only the backbone trains: the projector's data are frozen.
    net = pe.HardConstrainedNet(backbone(P.n_eq, P.n_var, seed, dtype), projector)
    return fit_model(net, data, config, seed, run, loss, apply, info=info)
