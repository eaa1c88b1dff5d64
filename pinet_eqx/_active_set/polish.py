"""The polish: the projection onto the face of the iterate's active set.

Where that point is feasible and its multipliers have the signs of their bounds,
it is the projection itself (OSQP's polish), however far the iteration was from
converging. Polyhedral sets only; `refine` polishes before it refines, and the
finish (`finish`) polishes sparse sets without refining.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .._linalg.krylov import ConjugateGradient, default_rtol
from .._solver import douglas_rachford as dr
from . import derivative as _active_set


def polish(problem, rows, y_raw, data, flags, tol, slack=1.0):
    """The projection of `y_raw` onto the face of the active set `flags`, and
    whether it is the projection onto the whole set.

    The face's projection is one solve of the active-row system
    (`_active_set.polish`). It is accepted when it satisfies the optimality
    conditions to `tol` (raised to the rounding of its values): it is finite,
    its multipliers have the signs of their bounds, it satisfies the rows it
    leaves free, and it meets its active rows to `slack` times the tolerance
    (more than 1 where a refinement follows and closes that gap; more than that
    means a badly conditioned active set, where the refinement is no more
    reliable than the solve). Polyhedral sets only.

    **Arguments:**

    - `problem`, `rows`, `data`: as for `refine`.
    - `y_raw`: the point projected.
    - `flags`: the iterate's activity flags (see `_active_set.activity`).
    - `tol`: the tolerance of the optimality conditions.
    - `slack`: the allowance on the active rows, a multiple of the tolerance.

    **Returns:** `(candidate, accepted, bound, flags, empty)`, `bound` the
    tolerance as raised, `flags` the `(hi, lo)` of the face `candidate` lies
    on (the iterate's, except for sparse rows: see `_active_set.polish`) and
    `empty` whether the host's polish proved the set empty (sparse rows).
    """
    y_raw, data, flags = jax.lax.stop_gradient((y_raw, data, flags))
    hi, lo = flags
    d = problem.dim
    # Its multipliers' signs are tested, so its solve runs to full accuracy.
    accurate = ConjugateGradient(rtol=default_rtol(y_raw.dtype), on_failure="ignore")
    candidate, wrong_sign, *face = _active_set.polish(
        rows, y_raw, data, hi, lo, problem.box_index, accurate
    )
    bound = dr.resolvable_tol(tol, jnp.max(jnp.abs(candidate)))
    pinned_y, pinned_w = hi[:d] | lo[:d], hi[d:] | lo[d:]
    free = dataclasses.replace(
        data,
        lb_y=jnp.where(pinned_y, -jnp.inf, data.lb_y),
        ub_y=jnp.where(pinned_y, jnp.inf, data.ub_y),
        lb_w=jnp.where(pinned_w, -jnp.inf, data.lb_w),
        ub_w=jnp.where(pinned_w, jnp.inf, data.ub_w),
    )
    accepted = jnp.all(jnp.isfinite(candidate)) & (wrong_sign <= bound)
    certifies = getattr(rows, "certifies", False)
    # Its NaN says that a Farkas certificate proved the set empty.
    empty = jnp.isnan(wrong_sign) if certifies else jnp.asarray(False)
    if not certifies:
        # (A polish certified in float64, `SparseRows`', is taken as it is: in
        # float32 the products with large entries would round far above the
        # rounding of the point.)
        accepted = (
            accepted
            & (problem.violation(candidate, free) <= bound)
            & (problem.violation(candidate, data) <= slack * bound)
        )
    return candidate, accepted, bound, tuple(face), empty
