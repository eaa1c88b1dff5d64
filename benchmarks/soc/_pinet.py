r"""Our method: an MLP followed by `pinet_eqx.Projector`, trained end to end.

The projector (`benchmarks._common.problems.soc_projector`, with $b$ the
`Parameter` `"b"`) follows the shared backbone; the loss is the mean of $c^\top y_1$.
The objective is linear, so the raw outputs drift ever further from the set in
training: Douglas-Rachford then needs a smaller $\sigma$ and more iterations
(`benchmarks/soc/RESULTS.md`). Hence $\sigma$ at 1/32 of its automatic value; on
the small size `tol=1e-4` within 1000 (training) and 2000 (inference) iterations,
on the large a fixed 200 and 500 (a 20-minute CPU budget); 50 backward BiCGStab
steps; Adam at 1e-2 with a cosine decay, batches of 128, 1000 epochs.

`--set residual_weight=MU` adds $\mu \|y_{raw} - y\|^2$ to the loss (see
`make_loss`): faster, but less accurate for every setting tried
("Projection-residual penalty" in `benchmarks/soc/RESULTS.md`), so off by default.
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
from .._common.problems import soc_projector
from .._common.training import backbone, fit_model
from ._data import SocData


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(pinet_method.PinetConfig):
    """Our configuration (see the module docstring), the small size's."""

    # 1/32 of sigma="auto" (0.095 small, 0.0217 large), see above.
    sigma: float | Literal["auto"] = 0.003
    n_iter: int = 1000
    n_iter_test: int = 2000
    bwd_max_steps: int | None = 50
    tol: float | None = 1e-4  # the float32 floor here is about 4e-5
    residual_weight: float = 0.0  # see `make_loss`
    residual_stop_gradient: bool = True
    residual_margin: float = 0.0
    epochs: int = 1000
    batch_size: int = 128
    lr: float = 1e-2
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    validate_every: int | None = 20
    n_valid: int | None = None


def default_config(data: SocData) -> Config:
    """Our configuration for `data` (see the module docstring)."""
    if data.d1 < 500:
        return Config()
    iterations = dict(sigma=0.0007, n_iter=200, n_iter_test=500, tol=None)
    return Config(**iterations, validate_every=50, n_valid=256)


def make_projector(data: SocData, config: Config) -> pe.Projector:
    """The projection layer onto the data set's feasible set for `config`."""
    settings = pinet_method.projector_settings(config)
    return soc_projector(data.E, data.d1, **settings, tol=config.tol)


def _apply(d2: int):
    """The batched network with `b` taken from the first `d2` context entries."""

    def apply(model, X):
        return jax.vmap(lambda x: model(x, b=x[:d2]))(X)

    return apply


def make_loss(config: Config, d1: int, d2: int):
    r"""`loss(model, X)`, the batch mean of $c^\top y_1 + \mu\, r^2$, with
    $r = (\|y_{raw} - y\| - m)_+$, $\mu$ = `residual_weight`, $m$ =
    `residual_margin` ($y$ a constant in $r$'s gradient with
    `residual_stop_gradient`)."""
    apply = _apply(d2)
    mu = config.residual_weight

    def loss(model, X):
        if not mu:
            return jnp.mean(jnp.sum(X[:, d2:] * apply(model, X)[:, :d1], axis=1))
        Y_raw = jax.vmap(model.raw)(X)
        Y = jax.vmap(lambda y, x: model.projector(y, b=x[:d2]))(Y_raw, X)
        Y_target = jax.lax.stop_gradient(Y) if config.residual_stop_gradient else Y
        # The small constant keeps the norm's gradient finite at zero distance.
        distance = jnp.sqrt(jnp.sum((Y_raw - Y_target) ** 2, axis=1) + 1e-12)
        residual = jnp.maximum(distance - config.residual_margin, 0) ** 2
        objective = jnp.sum(X[:, d2:] * Y[:, :d1], axis=1)
        return jnp.mean(objective + mu * residual)

    return loss


def fit(data: SocData, config: Config, seed: int, run: Run) -> Trained:
    """Set up the projector (auto-tuned if asked), then train the network."""
    dtype = jnp.result_type(float)
    d1, d2 = data.d1, data.d2
    B = data.X_valid[: config.autotune_points, :d2]
    make = functools.partial(make_projector, data, config)
    keep = ("n_iter", "n_iter_test")
    projector, info = pinet_method.build(make, config, B, d1 + d2, seed, keep)
    net = pe.HardConstrainedNet(backbone(d1 + d2, d1 + d2, seed, dtype), projector)
    loss, apply = make_loss(config, d1, d2), _apply(d2)

    def single(model, x):
        return model(x, b=x[:d2])

    trained = fit_model(net, data, config, seed, run, loss, apply, single, info=info)
    # The last validation point is the last epoch trained (`max_time_s` may stop
    # the run early).
    info["epochs_done"] = run.curve[-1]["epoch"] if run.curve else 0
    info["stopped_by_max_time"] = info["epochs_done"] < config.epochs
    return trained
