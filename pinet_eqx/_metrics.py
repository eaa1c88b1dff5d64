"""Evaluation metrics used in the paper's benchmarks."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float


def relative_suboptimality(
    objective: Float[ArrayLike, "*batch"], optimal: Float[ArrayLike, "*batch"]
) -> Float[Array, "*batch"]:
    """Relative suboptimality $\\mathrm{RS} = \\max(0, (J(\\hat y) - J^\\star) /
    |J^\\star|)$ (paper Sec. 3.1), elementwise.

    **Arguments:**

    - `objective`: objective values $J(\\hat y)$ of the predictions.
    - `optimal`: optimal values $J^\\star$, same shape.

    **Returns:** the RS, same shape.
    """
    objective = jnp.asarray(objective)
    optimal = jnp.asarray(optimal)
    return jnp.maximum(0.0, (objective - optimal) / jnp.abs(optimal))
