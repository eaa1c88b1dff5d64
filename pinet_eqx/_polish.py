"""Iterative refinement onto the active constraints of any set, at inference.

Once Douglas-Rachford has identified the active constraints, the projection is,
to first order, the projection onto their intersection. One refinement step moves
$y$ by the minimum-norm $\\delta$ with

$$E \\delta = E y - q,\\qquad c_i^\\top \\delta = c_i^\\top y - h_i,\\qquad
\\nabla g_j(u)^\\top M \\delta = g_j(u),$$

over the equality rows, the inequality and box rows that are active or violated,
and the active constraints $g_j(u) = 0$ of each cone or simplex block
$u = M y + o$ (its face, `AbstractPolishableCone.face`: the surface
$\\|x\\| = t$ of a second-order cone, the facet and zeroed entries of an
$\\ell_1$ cone, the sum and zeroed entries of a simplex, and so on), linearised
at $y$. The residuals are computed nearly exactly (`RowResidual`), so in float32
the constraints end at the rounding of $y$ itself rather than of the products
that made it. The step is the active-set solve of `_active_set`, over rows that
depend on the instance: one solve with their Gram matrix, rows scaled to unit
length (a regularised Cholesky factorisation, or conjugate gradients for many
rows).

This is the general counterpart of `_active_set.refine`, which eliminates fixed
equality rows on the host and serves polyhedral sets with fixed matrices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _blocks as blocks
from ._active_set import clip_rows, solve_rows, unit_rows
from ._lifting import InstanceData, LiftedProblem


def step(
    problem: LiftedProblem,
    r,
    r_low,
    totals_low,
    y,
    data: InstanceData,
    hi,
    lo,
    pre,
    solver,
    weights=None,
):
    """One refinement step of `y` onto its active constraints.

    **Arguments:**

    - `problem`: the lifted problem; `data` the instance's data (matrices
        included).
    - `r`: $[E; C] y - (q, h, -o)$, the residual of the stacked matrix (cone
        offsets $o$ last), computed nearly exactly (see `_refine.RowResidual`),
        with `data`'s inequality bounds offset by the same $h$, rounded to the
        working precision.
    - `r_low`: what that rounding took from `r` (used for the cone rows, whose
        values are not small).
    - `totals_low`: what float32 rounding took from the simplex totals, or
        `None` (see `RowResidual.totals_low`).
    - `y`: the point to refine.
    - `hi`, `lo`: the activity flags of $y$'s coordinates then the inequality
        rows (see `_active_set.activity`).
    - `pre`: the cone blocks' prox arguments at the final iterate (user units),
        which fix each block's face.
    - `solver`: the linear solver (symmetric positive semi-definite).
    - `weights`: if given, the correction minimises $\\|w \\odot \\delta\\|$
        rather than $\\|\\delta\\|$ (see `rounding_weights`).

    **Returns:** the refined point.
    """
    assert data.E is not None and data.C is not None  # as built by `data()`
    d, m_eq, m = problem.dim, problem.n_eq, problem.n_ineq
    box = np.asarray(problem.box_index, np.int32)
    dh, clip_active = clip_rows(y, r[m_eq : m_eq + m], data, hi, lo, box)
    pieces = [data.E, data.C[:m], jnp.eye(d, dtype=y.dtype)[box]]
    values = [r[:m_eq], dh]
    active = [jnp.ones((m_eq,), bool), clip_active]
    if problem.groups:
        F, cone_values, cone_active = blocks.face(
            pre,
            r[m_eq + m :],
            problem.groups,
            data.totals,
            data.C[m:],
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
    if Ms.shape[0] <= _DIRECT_ROWS:
        zeta = _direct_solve(Ms, active, rhs)
    else:
        zeta = solve_rows(Ms, active, rhs, solver)
    delta = zeta @ Ms
    return y - (delta if inverse is None else inverse * delta)


# Up to this many rows the active system is solved directly (a Cholesky
# factorisation of their Gram matrix, regularised): cheaper than conjugate
# gradients, whose step count under `vmap` is the batch's worst, and unaffected
# by dependent active rows (a cone's apex next to equality rows).
_DIRECT_ROWS = 512
# The regularisation, relative to the unit diagonal of the scaled rows' Gram
# matrix: it bounds the condition number of the factorised matrix, and leaves
# a correction's error at about this fraction on its weakest directions.
_RIDGE = 1e-6


def _direct_solve(Ms, active, rhs):
    """$\\zeta$ with $(G_{aa} + \\lambda I) \\zeta_a = \\mathrm{rhs}_a$,
    $G = M_s M_s^\\top$, and $\\zeta = 0$ on the inactive rows."""
    a = active.astype(Ms.dtype)
    G = (Ms @ Ms.T) * (a[:, None] * a[None, :])
    G = G + jnp.diag(jnp.where(active, _RIDGE, 1.0).astype(Ms.dtype))
    factor = jax.scipy.linalg.cho_factor(G)
    return a * jax.scipy.linalg.cho_solve(factor, rhs)


# The smallest magnitude a weight sees, relative to the largest: it bounds the
# weights' spread (and the weighted system's conditioning) to 1 / _WEIGHT_FLOOR.
_WEIGHT_FLOOR = 1e-2


def rounding_weights(y):
    """Weights $w_j \\propto \\max(|y_j|, 10^{-2} \\|y\\|_\\infty)$, the
    coordinates' grid spacing, that put a correction where the floating-point
    grid is fine.

    Once the residuals are at the rounding of $y$, the minimum-norm correction
    is below half a unit in the last place of most coordinates and rounds away.
    Minimising $\\|w \\odot \\delta\\|$ instead moves the small coordinates,
    whose grid is fine enough to represent the correction, so the rounded point
    meets its active constraints more closely than a rounding of the exact
    projection does. The move stays at rounding level.
    """
    size = jnp.max(jnp.abs(y))
    scale = jnp.where(size > 0, size, 1)
    return jnp.maximum(jnp.abs(y), _WEIGHT_FLOOR * scale) / scale
