"""The inference finish: the polish and iterative refinement onto the active set.

Once Douglas-Rachford has identified the active constraints, the projection is,
to first order, the projection onto their intersection. At inference (and in
both modes with `refine=True`) the output is finished in two ways, both solves
of the active-set system of `_active_set`:

- **The polish** (polyhedral sets; at inference, and in training mode too with
  `Projector(polish=True)`): $y_{raw}$ is projected onto the face of the
  iterate's active set; where that point is feasible and its multipliers have
  the signs of their bounds, it is the projection itself (OSQP's polish).
- **Iterative refinement**: `_REFINE_STEPS` steps, each moving $y$ by the
  minimum-norm $\\delta$ with

  $$E \\delta = E y - q,\\qquad c_i^\\top \\delta = c_i^\\top y - h_i,\\qquad
  \\nabla g_j(u)^\\top M \\delta = g_j(u),$$

  over the equality rows, the inequality and box rows that are active or
  violated, and the active constraints $g_j(u) = 0$ of each cone or simplex
  block $u = M y + o$ (its face, `AbstractPolishableCone.face`: the surface
  $\\|x\\| = t$ of a second-order cone, the facet and zeroed entries of an
  $\\ell_1$ cone, the sum and zeroed entries of a simplex, and so on),
  linearised at $y$. The residuals are computed nearly exactly
  (`_residual.RowResidual`), so in float32 the constraints end at the rounding
  of $y$ itself rather than of the products that made it.

Polyhedral sets with fixed matrices take the step of `_active_set.refine`, which
eliminates the equality rows on the host; every other set the general `step`
here, over rows that depend on the instance: one solve with their Gram matrix,
rows scaled to unit length (a regularised Cholesky factorisation, or conjugate
gradients for many rows).
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from .._linalg.krylov import ConjugateGradient, default_rtol
from .._linalg.residual import rounding_weights, stored, two_sum
from .._problem import blocks
from .._problem.lifting import LiftedProblem
from . import derivative as _active_set
from .derivative import clip_rows
from .polish import polish
from .rowsolve import solve_active, unit_rows

# Refinement steps onto the active rows (see `refine`): far from the set
# the first correction is large, and its own rounding (and an approximate active
# set) leave a second, small one.
_REFINE_STEPS = 2
# A refinement may move y by at most this multiple of the violation it removes
# (or by sqrt(eps) relative, whichever is larger): see `refine`.
_MOVE_FACTOR = 100
# A polished point may miss its active rows by at most this multiple of the
# tolerance before the refinement (see `refine`).
_POLISH_SLACK = 100


def refine(
    problem, rows, residual, y, data, flags, pre, y_raw=None, tol=None, strength=None
):
    """`y` refined onto its active constraints, `_REFINE_STEPS` times, kept only
    where that is finite, no less feasible and a small move; the violation
    of the point returned (see `LiftedProblem.violation`), from its residual;
    and whether it was polished.

    With `y_raw` (polyhedral sets), `y` is first polished: replaced by the
    projection of `y_raw` onto a face (see `polish`) where that point satisfies
    the optimality conditions to `tol`; the refinement starts from it, onto
    that face. If the refined point misses `tol`, the iterate is returned.

    Polyhedral sets with fixed matrices use the host-eliminated active-set solve
    (`_active_set.refine`); every other set the general one (`step`), with the
    per-instance rows of the residual sliced per call, except that with fixed
    matrices the first (unweighted) step eliminates the equality rows too
    (`step_eliminated`).

    `y` arrives as stored (see `_residual.stored`), so that the residual, the
    corrections and the updates all see the same point.

    The residual $r = [E; C] y - (q, h, -o)$, with $h$ a bound of each
    inequality row (the one it is pinned to, if any), is computed nearly
    exactly once, at the iterate. Each later step updates it,
    $r \\leftarrow r - [E; C](y - y')$, by an ordinary product: $y - y'$ is the
    small correction, exact in floating point (the two points agree in their
    leading digits), so the product's rounding is that small fraction of the
    rounding of $[E; C] y$.

    **Arguments:**

    - `problem`: the lifted problem; `data` the instance's data.
    - `rows`: the host factorisation of fixed rows (`_active_set.FixedRows`),
        or `None` for per-instance matrices.
    - `residual`: the exact residual of the stacked rows (`RowResidual`).
    - `y`: the iterate's output, as stored.
    - `flags`: its activity flags (see `_active_set.activity`).
    - `pre`: the cone blocks' prox arguments (see
        `_douglas_rachford.cone_argument`), or `None` without cones.
    - `y_raw`: the point projected, to polish; `None` skips the polish.
    - `tol`: the tolerance a polished point must meet.
    - `strength`: how firmly the iterate holds each flag (a function of no
        arguments), for the polish's rounds where its face has no point (see
        `polish`).

    **Returns:** `(y, violation, polished, flags)`, `flags` those of the face
    `y` lies on (the iterate's unless polished).
    """
    data, flags, pre = jax.lax.stop_gradient((data, flags, pre))
    E, C = data.dense_matrices()  # the refinement is dense only
    if problem.per_instance:
        residual = residual.with_matrix(jnp.concatenate([E, C]))
    polished = jnp.asarray(False)
    iterate, iterate_flags = y, tuple(flags)
    if y_raw is not None:
        # It must meet its active rows to its solve's accuracy only: the
        # refinement closes that gap (checked on the point returned).
        candidate, polished, bound, face, _ = polish(
            problem, rows, y_raw, data, flags, tol, _POLISH_SLACK, strength
        )
        y = stored(jnp.where(polished, candidate, y))
        # The refinement holds the polished point to its own face, which the
        # polish's rounds may have moved off the iterate's.
        flags = jax.tree.map(partial(jnp.where, polished), face, iterate_flags)
    hi, lo = flags
    pinned, shifted = _pinned(problem, data, hi, lo)
    correct = _corrector(problem, rows, residual, y, shifted, hi, lo, pre)
    rhs = jnp.concatenate([data.q, pinned, -data.cone_offset])
    out, viol = _refined(problem, correct, residual, y, rhs, shifted, E, C)
    if y_raw is not None:
        # A polished point that ends above the tolerance is not certified; the
        # iterate, as the iteration left it, is then no worse.
        certified = viol <= bound
        failed = polished & ~certified
        out = jnp.where(failed, iterate, out)
        viol = jnp.where(failed, problem.violation(iterate, data), viol)
        polished = polished & certified
        flags = jax.tree.map(partial(jnp.where, polished), flags, iterate_flags)
    return out, viol, polished, flags


def _pinned(problem, data, hi, lo):
    """Each inequality row's bound to take its residual against, and `data`
    with the inequality bounds shifted by it."""
    # Each inequality row's residual is taken against a bound: the one it is
    # pinned to, else its finite one (the upper if both are). The residuals of
    # the rows at or near a bound are then small and nearly exact in the working
    # precision, where the rows' values C y would round at their own, larger,
    # scale; a weakly active row could hide a violation in that rounding.
    d = problem.dim
    finite = jnp.where(
        jnp.isfinite(data.ub_w),
        data.ub_w,
        jnp.where(jnp.isfinite(data.lb_w), data.lb_w, 0.0),
    )
    pinned = jnp.where(hi[d:], data.ub_w, jnp.where(lo[d:], data.lb_w, finite))
    shifted = dataclasses.replace(
        data, lb_w=data.lb_w - pinned, ub_w=data.ub_w - pinned
    )
    return pinned, shifted


def _corrector(problem, rows, residual, y, shifted, hi, lo, pre):
    """One refinement step, `correct(y, r, r_low, last)`: the corrected point
    from the residuals `r` (and what rounding took from them, `r_low`)."""
    # The forward pass does not warn: a failed refinement is simply dropped.
    # Each step's solve (conjugate gradients, for a large active set) stops at
    # the square root of the dtype's default accuracy: a step leaves that
    # fraction of the residual it removes, which the next step sees, nearly
    # exactly, and removes in turn, so two steps leave its square, in about
    # half the conjugate-gradient steps of a full-accuracy solve.
    rtol = math.sqrt(default_rtol(y.dtype))
    solver = ConjugateGradient(rtol=rtol, on_failure="ignore")
    if rows is not None and not problem.groups:
        inputs = _active_set.Inputs(y, dataclasses.replace(shifted, E=None, C=None))

        def correct(y, r, r_low, last):
            del r_low  # the rows' residuals are small: their rounding is too
            return _active_set.refine(
                r, rows, y, inputs, hi, lo, problem.box_index, solver
            )
    else:
        totals_low = residual.totals_low(y.dtype)

        def correct(y, r, r_low, last):
            if rows is not None and not last:
                return step_eliminated(
                    problem, rows, (r, r_low, totals_low), y, shifted, (hi, lo),
                    pre, solver,
                )  # fmt: skip
            # The last step is at rounding level: weighted, it goes where the
            # grid can represent it (see `rounding_weights`).
            weights = rounding_weights(y) if last else None
            return step(
                problem, (r, r_low, totals_low), y, shifted, (hi, lo), pre,
                solver, weights,
            )  # fmt: skip

    return correct


def _refined(problem, correct, residual, y, rhs, shifted, E, C):
    """`_REFINE_STEPS` steps of `correct` from `y`, kept where that is finite,
    no less feasible and a small move: `(point, violation)`."""
    # The cone rows' values M y + o are of the order of y, not small: what
    # rounding takes from them (r_low) is carried along, for the faces.
    r, r_low = residual(y, rhs)
    before = problem.row_violation(y, r, shifted)
    fix = y
    for k in range(_REFINE_STEPS):
        new = stored(correct(fix, r, r_low, k == _REFINE_STEPS - 1))
        change = fix - new
        r, error = two_sum(r, -jnp.concatenate([E @ change, C @ change]))
        r_low = r_low + error
        fix = new
    after = problem.row_violation(fix, r, shifted)
    eps = jnp.finfo(y.dtype).eps
    size = 1 + jnp.max(jnp.abs(y))
    # The correction is meant to be at the scale of the rounding or of the
    # violation it removes. Nearly dependent active rows (a thin slab, nearly
    # parallel rows) make its system nearly singular, and the minimum-norm
    # solve can then throw a converged point far away while keeping it
    # feasible; such a move is rejected and the iterate kept. The slack
    # allows for the rounding of the updated residuals.
    moved = jnp.max(jnp.abs(fix - y))
    keep = (
        jnp.all(jnp.isfinite(fix))
        & (after <= before + 64 * eps * size)
        & (moved <= jnp.maximum(jnp.sqrt(eps) * size, _MOVE_FACTOR * before))
    )
    out, viol = jnp.where(keep, fix, y), jnp.where(keep, after, before)
    return out, viol


def step(problem: LiftedProblem, rows, y, data, flags, pre, solver, weights=None):
    """One refinement step of `y` onto its active constraints.

    **Arguments:**

    - `problem`: the lifted problem; `data` the instance's data (matrices
        included).
    - `rows`: `(r, r_low, totals_low)`: `r` is $[E; C] y - (q, h, -o)$, the
        residual of the stacked matrix (cone offsets $o$ last), computed nearly
        exactly (see `_residual.RowResidual`), with `data`'s inequality bounds
        offset by the same $h$, rounded to the working precision; `r_low` what
        that rounding took from `r` (used for the cone rows, whose values are
        not small); `totals_low` what float32 rounding took from the simplex
        totals, or `None` (see `RowResidual.totals_low`).
    - `y`: the point to refine.
    - `flags`: `(hi, lo)`, the activity flags of $y$'s coordinates then the
        inequality rows (see `_active_set.activity`).
    - `pre`: the cone blocks' prox arguments at the final iterate (user units),
        which fix each block's face.
    - `solver`: the linear solver (symmetric positive semi-definite).
    - `weights`: if given, the correction minimises $\\|w \\odot \\delta\\|$
        rather than $\\|\\delta\\|$ (see `rounding_weights`).

    **Returns:** the refined point.
    """
    (r, r_low, totals_low), (hi, lo) = rows, flags
    E, C = data.dense_matrices()
    d, m_eq, m = problem.dim, problem.n_eq, problem.n_ineq
    box = np.asarray(problem.box_index, np.int32)
    dh, clip_active = clip_rows(y, r[m_eq : m_eq + m], data, hi, lo, box)
    pieces = [E, C[:m], jnp.eye(d, dtype=y.dtype)[box]]
    values = [r[:m_eq], dh]
    active = [jnp.ones((m_eq,), bool), clip_active]
    if problem.groups:
        F, cone_values, cone_active = blocks.face(
            pre,
            r[m_eq + m :],
            problem.groups,
            data.totals,
            C[m:],
            totals_low,
            r_low[m_eq + m :],
        )
        pieces.append(F)
        values.append(cone_values)
        active.append(cone_active)
    M = jnp.concatenate(pieces)
    # delta = delta' / w, with delta' the minimum-norm correction of the rows
    # M diag(1 / w).
    inverse = None if weights is None else 1 / weights
    if inverse is not None:
        M = M * inverse[None, :]
    Ms, scale, usable = unit_rows(M)
    active = jnp.concatenate(active) & usable
    rhs = jnp.where(active, scale * jnp.concatenate(values), 0.0)
    # Inactive entries of rhs are zero and their rows see the identity, so only
    # the active rows move y.
    zeta = solve_active(Ms, active, rhs, solver)
    delta = zeta @ Ms
    return y - (delta if inverse is None else inverse * delta)


def step_eliminated(problem: LiftedProblem, fixed, rows, y, data, flags, pre, solver):
    """`step` without weights, for fixed matrices: the same minimum-norm
    correction, with the equality rows eliminated on the host.

    The correction is $\\delta = E^+ r_E - N R^\\top \\zeta$, with $N$ an
    orthonormal basis of $\\ker E$ and $R$ the other active rows in $\\ker E$
    (the inequality and box rows of `fixed`, and the cone blocks' face rows
    $\\nabla g_j^\\top M N$ from `fixed.cone`), scaled to unit length: one
    solve with their Gram matrix, of the size of the rows left (a second-order
    cone on its surface adds one), where `step`'s includes the equality rows
    and all of $y$. Arguments as for `step`, with `fixed` the host
    factorisation (`FixedRows`, built with `cone`).
    """
    (r, r_low, totals_low), (hi, lo) = rows, flags
    _, C = data.dense_matrices()
    assert fixed.cone is not None  # built for cones
    m_eq, m = problem.n_eq, problem.n_ineq
    box = np.asarray(problem.box_index, np.int32)
    dtype = y.dtype
    r_eq = r[:m_eq]
    dh, clip_active = clip_rows(y, r[m_eq : m_eq + m], data, hi, lo, box)
    particular = r_eq @ fixed.P_y.astype(dtype)  # E^+ r_E
    # The face rows in ker E, and (one more column) their values at the
    # particular correction, from one call.
    rows = jnp.concatenate(
        [fixed.cone.astype(dtype), (C[m:] @ particular)[:, None]], axis=1
    )
    F, values, face_active = blocks.face(
        pre, r[m_eq + m :], problem.groups, data.totals, rows, totals_low,
        r_low[m_eq + m :],
    )  # fmt: skip
    FN, scale, usable = unit_rows(F[:, :-1])
    R = jnp.concatenate([fixed.BN.astype(dtype), FN])
    active = jnp.concatenate([clip_active & fixed.usable, face_active & usable])
    rhs = jnp.concatenate(
        [
            fixed.BP.astype(dtype) @ r_eq - fixed.row_scale.astype(dtype) * dh,
            scale * (F[:, -1] - values),
        ]
    )
    rhs = jnp.where(active, rhs, 0.0)
    zeta = solve_active(R, active, rhs, solver)
    return y - (particular - (zeta @ R) @ fixed.N.astype(dtype).T)
