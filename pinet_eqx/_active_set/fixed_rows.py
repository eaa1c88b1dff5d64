"""The host-precomputed tangent map of a polyhedral set with fixed matrices.

With fixed matrices the equality rows are eliminated once, on the host, with an
orthonormal basis $N$ of $\\ker E$: $\\dot y = E^+ \\dot q + N (v - B_N^\\top
\\zeta)$ with $v = N^\\top r$ and $B_N$ the inequality and box rows times $N$,
so the per-instance system involves only the inequality and box rows, masked by
the active set (see `_active_set`).
"""

from __future__ import annotations

from typing import cast

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from jaxtyping import Array, Bool, Float

from .._solver.affine import independent_rows
from .rowsolve import row_gram, solve_masked


class FixedRows(eqx.Module):
    """Host-precomputed pieces of the tangent map for fixed matrices.

    Rows are the inequality rows of $C$ followed by the bounded coordinates of
    $y$, each scaled to unit length in $\\ker E$. `lift`, kept for refinement
    only, maps the equality residual and the rows' multipliers to the
    correction in one product (see `refine`). `cone`, for sets with cone or
    simplex blocks, holds their rows $M$ in $\\ker E$, $M N$, for the first
    step of their refinement (`_refine.step_eliminated`).
    """

    N: Float[Array, "d k"]
    P_y: Float[Array, "m_eq d"]
    BN: Float[Array, "n_rows k"]
    BP: Float[Array, "n_rows m_eq"]
    row_scale: Float[Array, " n_rows"]
    gram: Float[Array, "n_rows n_rows"] | None
    usable: Bool[Array, " n_rows"]
    lift: Float[Array, "m_eq+n_rows d"] | None
    cone: Float[Array, "n_cone k"] | None = None

    @staticmethod
    def build(
        E: np.ndarray,
        C: np.ndarray,
        box_index: np.ndarray,
        refine: bool = False,
        cone: np.ndarray | None = None,
    ) -> FixedRows:
        """Factorise in float64.

        **Arguments:**

        - `E`: the fixed equality matrix, shape `(m_eq, d)`; dependent rows are
            dropped (their right-hand sides get no gradient).
        - `C`: the fixed inequality matrix, shape `(m, d)`.
        - `box_index`: the coordinates of $y$ that have a (fixed or
            parameterised) finite bound.
        - `refine`: also build `lift`, for `refine`.
        - `cone`: the rows $M$ of the cone and simplex blocks, shape
            `(n_cone, d)`, if any.

        **Returns:** a `FixedRows`.
        """
        E = np.asarray(E, np.float64)
        C = np.asarray(C, np.float64)
        m_eq, d = E.shape
        keep = independent_rows(E)
        r = keep.size
        P_y = np.zeros((m_eq, d))
        if r:
            # scipy-stubs types `qr` as a union over all its modes.
            Q, R = cast(
                "tuple[np.ndarray, np.ndarray]", scipy.linalg.qr(E[keep].T, mode="full")
            )
            N = Q[:, r:]
            # E_keep^+ = Q_1 R_1^{-T}: the minimum-norm particular solution
            # (trans=1, i.e. "T": solve R^T x = b).
            pinv = Q[:, :r] @ scipy.linalg.solve_triangular(R[:r], np.eye(r), trans=1)
            P_y[keep] = pinv.T
        else:
            N = np.eye(d)
        B = np.concatenate([C, np.eye(d)[box_index]], axis=0)
        BN = B @ N
        norms = np.linalg.norm(BN, axis=1)
        # A row constant on {E y = q} (zero in ker E) can never be moved by the
        # projection; it is left out of the system.
        usable = norms > 1e-12 * max(1.0, norms.max(initial=0.0))
        scale = np.where(usable, 1 / np.where(usable, norms, 1), 0)
        BN = scale[:, None] * BN
        BP = scale[:, None] * (B @ P_y.T)
        n_rows, k = BN.shape
        # Two thin products, or one with the Gram matrix: whichever is cheaper.
        gram = BN @ BN.T if n_rows <= 2 * k else None
        lift = np.concatenate([P_y, -BN @ N.T]) if refine else None
        return FixedRows(
            N=jnp.asarray(N),
            P_y=jnp.asarray(P_y),
            BN=jnp.asarray(BN),
            BP=jnp.asarray(BP),
            row_scale=jnp.asarray(scale),
            gram=None if gram is None else jnp.asarray(gram),
            usable=jnp.asarray(usable),
            lift=None if lift is None else jnp.asarray(lift),
            cone=None if cone is None else jnp.asarray(np.asarray(cone) @ N),
        )

    def tangent(self, active, dy_raw, dq, dh, box, solver):
        """$(\\dot y, \\zeta)$ of the active face (see `fixed_tangent`); `box`
        is implied by how the rows were built."""
        del box
        return fixed_tangent(self, active & self.usable, dy_raw, dq, dh, solver)


def fixed_tangent(fixed: FixedRows, active, dy_raw, dq, dh, solver):
    """$\\dot y = E^+ \\dot q + N (v - B_N^\\top \\zeta)$ with $v = N^\\top \\dot
    y_{raw}$ and $\\zeta$ from the masked active-row system; returns
    $(\\dot y, \\zeta)$.

    The map is affine in its arguments' values too: given $y_{raw}$, $q$ and the
    active rows' bounds it returns the projection of $y_{raw}$ onto the active
    face and its multipliers (see `polish`)."""
    dtype = dy_raw.dtype
    N, BN = fixed.N.astype(dtype), fixed.BN.astype(dtype)
    y0 = dq @ fixed.P_y.astype(dtype)
    v = dy_raw @ N
    # The scaled active rows' residual at the unconstrained tangent y0 + N v.
    zeta = fixed_multipliers(fixed, active, dq, dh, solver, BN @ v)
    return y0 + N @ (v - zeta @ BN), zeta


def fixed_multipliers(fixed: FixedRows, active, dq, dh, solver, moved=0.0):
    """$\\zeta$ of the masked active-row system for fixed matrices, whose
    right-hand side is the scaled active rows' residual $B_N v + B_P \\dot q -
    s \\odot \\dot h$ (`moved` $= B_N v$, zero for a refinement step)."""
    dtype = dq.dtype
    BP, scale = fixed.BP.astype(dtype), fixed.row_scale.astype(dtype)
    rhs = jnp.where(active, moved + BP @ dq - scale * dh, 0.0)
    if fixed.gram is not None:
        apply_gram = eqx.Partial(jnp.matmul, fixed.gram.astype(dtype))
    else:
        apply_gram = eqx.Partial(row_gram, fixed.BN.astype(dtype))
    return solve_masked(apply_gram, active, rhs, solver)
