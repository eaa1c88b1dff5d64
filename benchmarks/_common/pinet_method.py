"""The pieces of our method (`pinet_eqx.HardConstrainedNet`) that every suite
configures the same way: the projector's settings, its set-up and auto-tuning,
and the record of the settings in use."""

from __future__ import annotations

import dataclasses
import time
from typing import Literal

import jax
import jax.numpy as jnp

import pinet_eqx as pe

from .config import TrainingConfig
from .problems import PAPER_N_ITER, PAPER_OMEGA


@dataclasses.dataclass(frozen=True, kw_only=True)
class PinetConfig(TrainingConfig):
    """The projector's hyperparameters on top of the training loop's
    (`bwd_max_steps` `None`: the adjoint's default)."""

    sigma: float | Literal["auto"] = "auto"
    omega: float = PAPER_OMEGA
    n_iter: int = PAPER_N_ITER
    n_iter_test: int = 100
    bwd_max_steps: int | None = None
    equilibrate: bool = True
    autotune: bool = False
    autotune_points: int = 150


def projector_settings(config: PinetConfig) -> dict:
    """The keyword arguments of `pe.Projector` for `config`."""
    keys = ("sigma", "omega", "n_iter", "n_iter_test")
    adjoint = pe.ImplicitAdjoint(max_steps=config.bwd_max_steps)
    settings = {k: getattr(config, k) for k in keys}
    return {**settings, "adjoint": adjoint, "equilibrate": config.equilibrate}


def tune_projector(projector: pe.Projector, B, n_var: int, seed: int):
    """`pinet_eqx.autotune` as in App. H.2: on the right-hand sides `B` with
    standard-normal points drawn from `seed`."""
    dtype = jnp.result_type(float)
    B = jnp.asarray(B, dtype)
    Y = jax.random.normal(jax.random.key(seed), (B.shape[0], n_var), dtype)
    return pe.autotune(projector, Y, {"b": B})


def build(make, config: PinetConfig, B, n_var: int, seed: int, keep, tune=None):
    """The projector `make()` builds and the record of its set-up. With `tune`
    (default `config.autotune`) it is auto-tuned on `B` first, and the settings in
    `keep` rise to the tuned iteration count where they are below it."""
    start = time.perf_counter()
    projector = make()
    info = {"setup_s": time.perf_counter() - start}
    if config.autotune if tune is None else tune:
        result = tune_projector(projector, B, n_var, seed)
        raised = {k: max(result.n_iter, getattr(config, k)) for k in keep}
        projector = result.projector.with_settings(**raised)
        info.update(autotune_s=result.seconds, sigma=result.sigma, n_iter=result.n_iter)
    return projector, {**info, **projector_info(projector)}


def projector_info(projector: pe.Projector) -> dict:
    """The projector's settings in use, for the record."""
    return {
        "sigma_used": float(projector.sigma),
        "n_iter_used": int(projector.n_iter),
        "n_iter_test_used": int(projector.n_iter_test),
    }
