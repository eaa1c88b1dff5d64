"""cvxpylayers (JAX interface) as the projection layer, the paper's baseline: the
shared MLP, then `benchmarks._common.layers.projection_layer` onto the App. B.4
set, trained by the shared eager loop (`fit_eager`) under a time budget
(`max_time_s`, 300 s). On the large size a step takes many minutes: there
`epochs` is 0 and the batch time is extrapolated from `timing_batch_rows` rows.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax.numpy as jnp
import numpy as np

from .._common.config import TrainingConfig
from .._common.harness import Run, Trained
from .._common.layers import SOLVE_METHOD, projection_layer
from .._common.training import backbone, fit_eager
from ._data import SocData


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(TrainingConfig):
    """Ours (`_pinet.Config`) where they mean the same, a training-time budget,
    diffcp's cone solver and how to time and score it."""

    epochs: int = 1000
    batch_size: int = 128
    lr: float = 1e-2
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    validate_every: int | None = 20
    n_valid: int | None = 256
    max_time_s: float | None = 300.0
    solve_method: str = SOLVE_METHOD
    timing_repeats: int = 3
    timing_batch_rows: int | None = None
    test_rows: int | None = None


def default_config(data: SocData) -> Config:
    """On the large size no training, timed on 32 rows and scored on 64."""
    if data.d1 < 500:
        return Config()
    return Config(epochs=0, timing_batch_rows=32, test_rows=64)


def make_projection(A: np.ndarray, solve_method: str = SOLVE_METHOD):
    """An eager `project(R, B) -> Y` onto the App. B.4 set by cvxpylayers."""
    import cvxpy as cp

    A = np.asarray(A, np.float64)
    d2, d1 = A.shape
    d = d1 + d2
    E = np.hstack([A, np.eye(d2)])
    return projection_layer(
        d, d2, lambda y, b: [E @ y == b, cp.SOC(y[d - 1], y[d1 : d - 1])], solve_method
    )


def fit(data: SocData, config: Config, seed: int, run: Run) -> Trained:
    """Train the shared backbone through the cvxpylayers projection with Adam."""
    dtype = jnp.result_type(float)
    d1, d2 = data.d1, data.d2
    project_b = make_projection(data.A, config.solve_method)

    def project(R, X):
        return project_b(R, X[:, :d2])

    def loss(Y, X):
        return jnp.mean(jnp.sum(X[:, d2:] * Y[:, :d1], axis=1))

    model = backbone(d1 + d2, d1 + d2, seed, dtype)
    info = {"solver": f"cvxpylayers (diffcp, {config.solve_method})"}
    return fit_eager(model, project, loss, data, config, seed, run, info=info)
