"""The tangent of the projection onto an active face, over its free coordinates,
for dense or sparse rows.

On the face $\\{E y = q,\\ C_a y = h_a,\\ y_B = h_B\\}$ the coordinates pinned
by an active bound follow their bound; the others solve the active-row system
of $M = [E; C]$ restricted to them (`face_tangent`). `FreeRows` applies those
rows as products, formed once when dense, never when sparse (`SparseMatrix`),
and `SparseRows` is the fixed-matrix data of a sparse polyhedral set: its
tangent by this route, and its polish by the host's active-set method.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from . import _host_polish as host_polish
from ._host_solve import masked_solve
from ._lifting import InstanceData
from ._rowsolve import solve_masked, unit_rows
from ._sparse import SparseMatrix


def face_tangent(M, m_eq, r, dq, active, dh, box, solver, lam_dM=None):
    """The projection of the tangent $r$ onto the active face's tangent space,
    and its multipliers: $\\dot y$ minimising $\\|\\dot y - r\\|$ subject
    to $E \\dot y = \\dot q$ and the active rows of $C$ and of the box
    following their bounds' tangents `dh`; returns $(\\dot y, \\zeta)$.

    The coordinates of $y$ pinned by an active box row follow their bound's
    tangent; the others, $F$, solve the active-set system of the rows
    $M = [E; C]$ (dense, or a `SparseMatrix`) restricted to them (the equality
    rows always active): rows over the free coordinates instead of identity rows
    for the pinned ones, a smaller and better conditioned system with the same
    solution. `zeta` holds the multipliers of the rows of $M$ (scaled to unit
    length over $F$), then those of the box rows in `_rows`' layout, from
    stationarity.

    `lam_dM`, for moving rows, is $(y_{raw} - y, \\dot M, y)$: the
    multipliers $(y_{raw} - y)_F = M_F^\\top \\lambda$ then enter $r$."""
    d = r.shape[0]
    dtype = r.dtype
    m = M.shape[0] - m_eq
    on_box = active[m:]
    pinned = jnp.zeros(d, bool).at[box].set(on_box)
    # The pinned coordinates' tangent (their bounds').
    y_pinned = (
        jnp.zeros(d, dtype)
        .at[box]
        .set(jnp.where(on_box, dh[m:], 0.0), unique_indices=True)
    )
    rows = free_rows(M, pinned)
    rows_active = jnp.concatenate([jnp.ones(m_eq, bool), active[:m]]) & rows.usable
    dh = jnp.concatenate([dq, dh[:m]])
    if lam_dM is not None:
        gap, dM, y = lam_dM
        # The multipliers, (y_raw - y)_F = M_F^T lam, enter through the moving rows.
        rhs = jnp.where(rows_active, rows.mv(gap), 0.0)
        lam = rows.scale * rows.solve(rows_active, rhs, solver)
        r = r - lam @ dM
        dh = dh - dM @ y
    # M_F y_F = dh - M y_pinned: the pinned coordinates' share moves to the right.
    rhs = jnp.where(rows_active, rows.mv(r) - rows.scale * (dh - M @ y_pinned), 0.0)
    zeta = rows.solve(rows_active, rhs, solver)
    dy = jnp.where(pinned, y_pinned, r - rows.rmv(zeta))
    # The box rows' multipliers: what stationarity, r - dy = M^T lam + mu on
    # the pinned coordinates, leaves there.
    mu = (r - dy - _rmv(M, rows.scale * zeta))[box]
    return dy, jnp.concatenate([zeta, jnp.where(on_box, mu, 0.0)])


class FreeRows(eqx.Module):
    """The rows of $M$ over the free coordinates, scaled to unit length, as
    products: `mv` is $M_s v$, `rmv` is $M_s^\\top \\zeta$. Dense rows are
    masked and scaled once (`Ms`); sparse ones (`M` a `SparseMatrix`) are
    applied with the mask and scales around each product, never formed."""

    M: Array | SparseMatrix
    free: Float[Array, " d"] | None
    scale: Float[Array, " rows"]
    usable: Bool[Array, " rows"]

    def mv(self, v):
        if self.free is None:
            return self.M @ v
        return self.scale * (self.M @ (self.free * v))

    def rmv(self, z):
        if self.free is None:
            return z @ self.M
        return self.free * _rmv(self.M, self.scale * z)

    def solve(self, active, rhs, solver):
        """$\\zeta$ of the masked system of the active rows (see `solve_rows`):
        by `solver` for dense rows, directly on the host for sparse ones
        (`_host_solve.masked_solve`; `solver` is then unused), whose faces
        defeat conjugate gradients on badly scaled sets."""
        direct = None
        if isinstance(self.M, SparseMatrix):
            assert self.free is not None  # sparse rows are never formed
            direct = eqx.Partial(masked_solve, self.M, self.free, active)
        apply_gram = eqx.Partial(_free_gram, self)
        return solve_masked(apply_gram, active, rhs, solver, direct)


def _free_gram(rows: FreeRows, v):
    return rows.mv(rows.rmv(v))


def _rmv(M, z):
    """$M^\\top z$ for dense or sparse $M$."""
    return M.rmv(z) if isinstance(M, SparseMatrix) else z @ M


def free_rows(M, pinned) -> FreeRows:
    """`FreeRows` of `M` (dense or `SparseMatrix`) without the `pinned`
    coordinates."""
    if isinstance(M, SparseMatrix):
        free = (~pinned).astype(M.dtype)
        norms = jnp.sqrt(M.squared() @ free)
        usable = norms > 0
        scale = jnp.where(usable, 1 / jnp.where(usable, norms, 1), 0)
        return FreeRows(M, free, scale, usable)
    Ms, scale, usable = unit_rows(jnp.where(pinned[None, :], 0.0, M))
    return FreeRows(Ms, None, scale, usable)


class SparseRows(eqx.Module):
    """The tangent map's data for fixed sparse matrices: the stacked rows
    $M = [E; C]$ as a `SparseMatrix` (polyhedral sets, `affine_form="sparse"`).

    The same interface as `FixedRows` (`tangent`), solved as the per-instance
    map is, by conjugate gradients over the free coordinates (`face_tangent`),
    with only sparse products.
    """

    M: SparseMatrix
    m_eq: int = eqx.field(static=True)
    # Its polish certifies the KKT conditions itself, in float64 (see `polish`).
    certifies: ClassVar[bool] = True

    def tangent(self, active, dy_raw, dq, dh, box, solver):
        """$(\\dot y, \\zeta)$ of the active face (see `face_tangent`)."""
        M = self.M.astype(dy_raw.dtype)
        return face_tangent(M, self.m_eq, dy_raw, dq, active, dh, box, solver)

    def polish(self, y_raw, data: InstanceData, hi, lo):
        """`polish`'s `(y, wrong_sign, hi, lo)`, by the host's active-set
        method (`_host_polish`): conjugate gradients stall on the faces of
        badly scaled sparse sets, where a direct solve does not. Its face (the
        flags `hi`, `lo` returned) may differ from the iterate's."""
        assert data.E is not None and data.C is not None  # as built by `data()`
        return host_polish.polish(
            data.E, data.C, y_raw, data.q, data.lb_y, data.ub_y, data.lb_w,
            data.ub_w, hi, lo,
        )  # fmt: skip
