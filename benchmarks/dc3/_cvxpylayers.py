"""cvxpylayers (JAX interface) as the projection layer, the paper's baseline: the
shared MLP, then `benchmarks._common.layers.projection_layer` (eager, not jitted).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .._common.config import PaperTrainingConfig
from .._common.harness import Run, Trained
from .._common.layers import SOLVE_METHOD, projection_layer
from .._common.training import backbone, fit_eager
from ._data import Dataset

MAX_N_VAR = 200  # beyond this, one epoch takes hours on a CPU


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(PaperTrainingConfig):
    """The paper's optimiser and its 25 epochs for this baseline; diffcp's
    `solve_method`; `timing_repeats` caps the timed batch inferences."""

    epochs: int = 25
    solve_method: str = SOLVE_METHOD
    timing_repeats: int = 3


def default_config(data: Dataset) -> Config:
    """The same for every data set."""
    del data
    return Config()


def make_projection(A, G, h, solve_method: str = SOLVE_METHOD):
    r"""An eager `project(R, X) -> Y` onto $\{y : Ay = x, Gy \le h\}$ by
    cvxpylayers."""
    A, G, h = (np.asarray(M, np.float64) for M in (A, G, h))
    return projection_layer(
        A.shape[1], A.shape[0], lambda y, x: [A @ y == x, G @ y <= h], solve_method
    )


def fit(data: Dataset, config: Config, seed: int, run: Run) -> Trained:
    """Train the shared backbone through the cvxpylayers projection with Adam
    (`data` of at most `MAX_N_VAR` variables)."""
    P = data.problem
    if P.n_var > MAX_N_VAR:
        raise ValueError(
            f"cvxpylayers is limited to problems with at most {MAX_N_VAR} variables "
            f"(this one has {P.n_var}): it solves and differentiates every instance "
            "one at a time with a CPU cone solver, so an epoch would take hours."
        )
    dtype = jnp.result_type(float)
    project = make_projection(P.A, P.G, P.h, config.solve_method)
    # Row by row: the batched form broadcasts (n,) against (B, n), which
    # jax_numpy_rank_promotion='raise' (our tests' setting) rejects.
    objective = jax.vmap(data.objective_jax(dtype))
    model = backbone(P.n_eq, P.n_var, seed, dtype)
    info = {"solver": f"cvxpylayers (diffcp, {config.solve_method})"}

    def loss(Y, X):
        return jnp.mean(objective(Y))

    return fit_eager(model, project, loss, data, config, seed, run, info=info)
