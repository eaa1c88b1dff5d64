"""Our method: an MLP followed by `pinet_eqx.Projector`, trained end to end.

The paper's configuration (App. B.2) with our changes, each measured in
`benchmarks/dc3/RESULTS.md`: batches of 256, 100 iterations at inference, the
equality refinement, in float32 a 1e-5 margin on the inequalities, and the
default adjoint (an exact active-set solve) for the paper's 25 BiCGStab steps.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp

import pinet_eqx as pe

from .._common import pinet_method
from .._common.harness import Run, Trained
from .._common.problems import PAPER_SIGMA, dc3_projector
from .._common.training import backbone, fit_model
from ._data import Dataset


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(pinet_method.PinetConfig):
    """Our method's hyperparameters. `library_defaults=True` builds
    `pe.Projector(constraints)` at every library default instead, with only the
    `train_iterations` ablation's `library_n_iter` (as `n_iter`) and
    `library_polish` (as `polish`)."""

    refine: bool | Literal["auto"] = True
    ineq_margin: float = 0.0
    epochs: int = 50
    batch_size: int = 256
    lr: float = 1e-2
    library_defaults: bool = False
    library_n_iter: int | None = None
    library_polish: bool | Literal["auto"] = "auto"


def default_config(data: Dataset) -> Config:
    """The paper's configuration for `data`, plus our inference iterations."""
    size = data.source.get("size", "small")
    return Config(
        sigma=PAPER_SIGMA.get(size, "auto"),
        # In float32 the arithmetic noise of y reaches a few 1e-6 on the active
        # inequalities; projecting onto G y <= h - margin keeps them satisfied.
        ineq_margin=1e-5 if jnp.result_type(float) == jnp.float32 else 0.0,
        # The paper tuned sigma for small and large; other sizes are auto-tuned.
        autotune=size not in PAPER_SIGMA,
    )


def make_projector(data: Dataset, config: Config) -> pe.Projector:
    """The projection layer onto $\\{y : A y = x, G y \\le h\\}$ for `config`."""
    P = data.problem
    if config.library_defaults:
        settings = {"polish": config.library_polish}
        if config.library_n_iter is not None:
            settings["n_iter"] = config.library_n_iter
        return dc3_projector(P.A, P.G, P.h, **settings)
    settings = pinet_method.projector_settings(config)
    h = P.h - config.ineq_margin
    return dc3_projector(P.A, P.G, h, **settings, refine=config.refine)


def fit(data: Dataset, config: Config, seed: int, run: Run) -> Trained:
    """Set up the projector (auto-tuned if asked, except with `library_defaults`),
    then train the network."""
    dtype = jnp.result_type(float)
    B = data.X_valid[: config.autotune_points]
    tune = config.autotune and not config.library_defaults
    make = functools.partial(make_projector, data, config)
    n_var, keep = data.problem.n_var, ("n_iter_test",)
    projector, info = pinet_method.build(make, config, B, n_var, seed, keep, tune)
    net = pe.HardConstrainedNet(
        backbone(data.problem.n_eq, n_var, seed, dtype), projector
    )
    objective = data.objective_jax(dtype)

    def apply(model, X):
        return jax.vmap(model)(X, b=X)

    def loss(model, X):
        return jnp.mean(objective(apply(model, X)))

    def single(model, x):
        return model(x, b=x)

    return fit_model(net, data, config, seed, run, loss, apply, single, info=info)
