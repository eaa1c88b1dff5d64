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
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._linalg.host_saddle import masked_saddle
from .._linalg.sparse import SparseMatrix
from .._problem.lifting import InstanceData
from . import host_polish
from .rowsolve import solve_masked, unit_rows


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
    s = jnp.where(rows_active, rows.scale * (dh - M @ y_pinned), 0.0)
    dy, zeta = rows.saddle(rows_active, r, s, solver)
    dy = jnp.where(pinned, y_pinned, dy)
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
        """$\\zeta$ of the masked system of the active rows (see `solve_rows`),
        by `solver`."""
        return solve_masked(eqx.Partial(_free_gram, self), active, rhs, solver)

    def saddle(self, active, r, s, solver):
        """`(x, zeta)` with $x + M_s^\\top \\zeta = r$ and $M_s x = s$ on the
        `active` rows ($\\zeta = 0$ on the others; `s` is zero there): the
        projection of $r$ onto the face's tangent space, shifted by $s$.

        Dense rows solve $M_s M_s^\\top \\zeta = M_s r - s$ by `solver`.
        Sparse rows, whose faces defeat conjugate gradients on badly scaled
        sets, solve the whole system on the host in float64
        (`_linalg.host_saddle.masked_saddle`; `solver` is then unused): $x$ is rounded
        once, so a cotangent in the row space of the equality rows (a cost
        constant on the set) maps to zero to float64's rounding, which an
        optimiser such as Adam would otherwise scale to full steps."""
        if not isinstance(self.M, SparseMatrix):
            zeta = self.solve(active, jnp.where(active, self.mv(r) - s, 0.0), solver)
            return r - self.rmv(zeta), zeta
        assert self.free is not None  # sparse rows are never formed

        d = r.shape[0]

        # One vector (x, zeta): the transposition of `custom_linear_solve`
        # needs every part of its right-hand side linear, and `s` may be a
        # constant (no tangent of the bounds).
        def matvec(v):
            x, z = v[:d], v[d:]
            Mx = jnp.where(active, self.mv(x), z)
            return jnp.concatenate([x + self.rmv(jnp.where(active, z, 0.0)), Mx])

        def solve(_, b):
            x, z = masked_saddle(self.M, self.free, self.scale, active, b[:d], b[d:])
            return jnp.concatenate([x, z])

        b = jnp.concatenate([r, s])
        v = jax.lax.custom_linear_solve(matvec, b, solve, symmetric=True)
        return v[:d], v[d:]


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

    The same interface as `FixedRows` (`tangent`), over the free coordinates
    as the per-instance map is (`face_tangent`), its face's system solved on
    the host from the float64 entries (`M.remainder` kept).
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
