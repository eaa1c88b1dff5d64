"""The polish: the projection onto the face of the iterate's active set.

Where that point is feasible and its multipliers have the signs of their bounds,
it is the projection itself (OSQP's polish), however far the iteration was from
converging. Where the iterate's face has no point (a weakly active bound
flagged beside rows that already pin every free coordinate), a few active-set
rounds on the device move it to the projection's. Polyhedral sets only;
`refine` polishes before it refines, and the finish (`finish`) polishes sparse
sets without refining (their host polish runs its own active-set method).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._linalg.krylov import ConjugateGradient, default_rtol
from .._solver import douglas_rachford as dr
from . import derivative as _active_set
from .face import SparseRows

# The most active-set rounds of a polish of dense rows after the iterate's
# face (see `polish`): a face that Douglas-Rachford got wrong is off by a
# flag or two (a weakly active bound flagged beside rows that pin every
# degree of freedom: DC-OPF hours whose generators all sit at their bounds
# but one).
_ROUNDS = 8


def polish(problem, rows, y_raw, data, flags, tol, slack=1.0, strength=None):
    """The projection of `y_raw` onto the face of the active set, and whether
    it is the projection onto the whole set.

    The face's projection is one solve of the active-row system
    (`_active_set.polish`). It is accepted when it satisfies the optimality
    conditions to `tol` (raised to the rounding of its values): it is finite,
    its multipliers have the signs of their bounds, it satisfies the rows it
    leaves free, and it meets its active rows to `slack` times the tolerance
    (more than 1 where a refinement follows and closes that gap; more than that
    means a badly conditioned active set, where the refinement is no more
    reliable than the solve). Polyhedral sets only.

    With `strength` (dense rows), where the iterate's face has no point (its
    rows are dependent and pin more than they can: one flag is only weakly
    active), up to `_ROUNDS` rounds of an active-set method move it (see
    `_next_face`): the flag of least `strength` leaves, rows of the wrong sign
    leave and violated rows join. Elsewhere the iterate's face is kept: where
    it has a point, the refinement of the iterate onto its rows reaches the
    floor.

    **Arguments:**

    - `problem`, `rows`, `data`: as for `refine`.
    - `y_raw`: the point projected.
    - `flags`: the iterate's activity flags (see `_active_set.activity`).
    - `tol`: the tolerance of the optimality conditions.
    - `slack`: the allowance on the active rows, a multiple of the tolerance.
    - `strength`: a function of no arguments giving how firmly each flag is
        held (`_active_set.strength`), called only where the rounds run; or
        `None` for the iterate's face only.

    **Returns:** `(candidate, accepted, bound, flags, empty)`, `bound` the
    tolerance as raised, `flags` the `(hi, lo)` of the face `candidate` lies
    on and `empty` whether the host's polish proved the set empty (sparse
    rows).
    """
    y_raw, data, flags = jax.lax.stop_gradient((y_raw, data, flags))
    if isinstance(rows, SparseRows):
        return _sparse(problem, rows, y_raw, data, flags, tol)
    attempt = functools.partial(_attempt, problem, rows, y_raw, data, tol, slack)
    first = attempt(*flags)
    if strength is None:
        return first.candidate, first.accepted, first.bound, flags, jnp.asarray(False)
    step = functools.partial(_next_face, problem, rows, data)

    def body(state):
        k, last, hi, lo, held, guess = state
        # The strengths are read off the iterate in the first round only.
        held = jnp.where(k == 0, jax.lax.stop_gradient(strength()), held)
        face = step(last, hi, lo, held, guess)
        return k + 1, attempt(*face[:2]), *face

    # Where the iterate's face has a point but is not the projection's, the
    # refinement of the iterate onto its rows reaches the floor (the toy MPC
    # far from the set: a tenth of the batch) at no cost; where it has none,
    # it cannot (DC-OPF hours with every generator flagged).
    lost = ~first.consistent

    def cond(state):
        k, last = state[:2]
        return (k < _ROUNDS) & ~last.accepted & lost

    held, none = jnp.zeros(flags[0].shape, y_raw.dtype), jnp.full((), -1, jnp.int32)
    _, out, hi, lo, *_ = jax.lax.while_loop(
        cond, body, (jnp.asarray(0), first, *flags, held, none)
    )
    return out.candidate, out.accepted, out.bound, (hi, lo), jnp.asarray(False)


def _accurate(dtype):
    """Conjugate gradients to full accuracy: the multipliers' signs are tested."""
    return ConjugateGradient(rtol=default_rtol(dtype), on_failure="ignore")


def _sparse(problem, rows, y_raw, data, flags, tol):
    """`polish` of `SparseRows`: the host's active-set method, certified in
    float64 (`_host_polish`), whose face may differ from the iterate's."""
    hi, lo = flags
    candidate, wrong_sign, *face = _active_set.polish(
        rows, y_raw, data, hi, lo, problem.box_index, _accurate(y_raw.dtype)
    )
    bound = dr.resolvable_tol(tol, jnp.max(jnp.abs(candidate)))
    # In float32 the products with large entries would round far above the
    # rounding of the point: its certificate is taken as it is.
    accepted = jnp.all(jnp.isfinite(candidate)) & (wrong_sign <= bound)
    # Its NaN says that a Farkas certificate proved the set empty.
    return candidate, accepted, bound, tuple(face), jnp.isnan(wrong_sign)


class _Attempt(NamedTuple):
    """One face's projection: the point, its flags' multipliers (positive
    where the sign is right; in the layout of the flags), the tolerance raised
    to the point's rounding, and whether it is accepted."""

    candidate: Array
    signed: Array
    bound: Array
    accepted: Array
    value: Array
    consistent: Array


def _attempt(problem, rows, y_raw, data, tol, slack, hi, lo) -> _Attempt:
    """The projection onto the face of `hi`, `lo`, tested (see `polish`)."""
    candidate, signed = _active_set.face_point(
        rows, y_raw, data, hi, lo, problem.box_index, _accurate(y_raw.dtype)
    )
    bound = dr.resolvable_tol(tol, jnp.max(jnp.abs(candidate)))
    d = problem.dim
    pinned_y, pinned_w = hi[:d] | lo[:d], hi[d:] | lo[d:]
    free = dataclasses.replace(
        data,
        lb_y=jnp.where(pinned_y, -jnp.inf, data.lb_y),
        ub_y=jnp.where(pinned_y, jnp.inf, data.ub_y),
        lb_w=jnp.where(pinned_w, -jnp.inf, data.lb_w),
        ub_w=jnp.where(pinned_w, jnp.inf, data.ub_w),
    )
    accepted = (
        jnp.all(jnp.isfinite(candidate))
        & (jnp.max(-signed, initial=0.0) <= bound)
        & (problem.violation(candidate, free) <= bound)
        & (problem.violation(candidate, data) <= slack * bound)
    )
    # Its entries' values, and whether it meets its own rows: a face has no
    # point where its rows are dependent and pin more than they can.
    value = jnp.concatenate([candidate, (data.C @ candidate)[: data.lb_w.shape[0]]])
    lower = jnp.concatenate([data.lb_y, data.lb_w])
    upper = jnp.concatenate([data.ub_y, data.ub_w])
    misses = jnp.where(hi | lo, jnp.abs(value - jnp.where(hi, upper, lower)), 0.0)
    consistent = jnp.all(jnp.isfinite(value)) & (
        jnp.max(misses, initial=0.0) <= slack * bound
    )
    return _Attempt(candidate, signed, bound, accepted, value, consistent)


def _next_face(problem, rows, data, attempt: _Attempt, hi, lo, held, guess):
    """The next round's face `(hi, lo, held, guess)` from `attempt`'s.

    Where the face has no point (its solve leaves its own rows unmet: they
    are dependent and pin more than they can), the flag held least firmly
    leaves, remembered as `guess` (-1: none). Where that one is violated at
    the next face's point, it was the wrong one: it joins again and, as in
    Goldfarb and Idnani's dual method, the face's row whose multiplier its
    pull drives to zero first leaves instead. Otherwise (a primal-dual
    active-set round) the rows of the wrong sign leave and the violated rows
    join. Entries with equal bounds never leave.
    """
    y, bound, value = attempt.candidate, attempt.bound, attempt.value
    consistent = attempt.consistent
    C = data.C[: data.lb_w.shape[0]]
    lower = jnp.concatenate([data.lb_y, data.lb_w])
    upper = jnp.concatenate([data.ub_y, data.ub_w])
    flagged = hi | lo
    above = consistent & ~flagged & (value > upper + bound)
    below = consistent & ~flagged & (value < lower - bound)
    index = jnp.arange(value.shape[0])
    loose = jnp.where(flagged & (upper > lower), held, jnp.inf)
    weakest = (index == jnp.argmin(loose)) & jnp.isfinite(loose)
    # The guess back on its side: it joins, and the row leaves whose
    # multiplier falls to zero first along the dependency alpha (the guess's
    # row expressed by the face's rows; Goldfarb and Idnani's step length).
    was = index == guess
    back = jnp.any(was & (above | below))
    d, m = y.shape[0], C.shape[0]
    # (A one-hot of an index out of its range is all zeros.)
    row = jax.nn.one_hot(guess, d, dtype=y.dtype)
    row = row + jax.nn.one_hot(guess - d, m, dtype=y.dtype) @ C
    _, alpha = _active_set.face_point(
        rows, row, data, hi, lo, problem.box_index, _accurate(y.dtype), True
    )
    # (alpha is signed as the multipliers are; the guess pulls on its side.)
    pull = jnp.where(jnp.any(was & below), -alpha, alpha)
    tiny = jnp.finfo(y.dtype).eps ** 0.5 * jnp.max(jnp.abs(alpha), initial=0.0)
    pulled = flagged & (pull > tiny) & (upper > lower)
    ratio = jnp.where(pulled, attempt.signed / pull, jnp.inf)
    swap = back & jnp.any(jnp.isfinite(ratio))
    first_zero = (index == jnp.argmin(ratio)) & swap
    wrong = (attempt.signed < -bound) & (upper > lower)
    leave = jnp.where(consistent, jnp.where(swap, first_zero, wrong), weakest)
    join_hi = jnp.where(swap, was & above, above)
    join_lo = jnp.where(swap, was & below, below)
    hi, lo = (hi & ~leave) | join_hi, (lo & ~leave) | join_lo
    # A row that joins is held firmly: the loosest flags leave first.
    held = jnp.where(join_hi | join_lo, jnp.inf, held)
    guess = jnp.where(consistent, -1, jnp.argmax(weakest)).astype(guess.dtype)
    return hi, lo, held, guess
