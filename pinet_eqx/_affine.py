"""Projection onto the lifted affine set, factorised once on the host.

The lifted polytope of paper Sec. 2.1 is $\\{(y, w) : E y = q,\\ C y - w = 0\\}$. After
column equilibration $y = D_y \\tilde y$, $w = D_w \\tilde w$ it reads
$\\tilde E \\tilde y = q$, $\\tilde w = \\tilde C \\tilde y$ with
$\\tilde C = D_w^{-1} C D_y$. Eliminating $\\tilde w$, the orthogonal projection of
$(s_y, s_w)$ onto it is

$$\\tilde y = K (s_y + \\tilde C^\\top s_w) + L q, \\qquad \\tilde w = \\tilde C \\tilde y,$$

with $K$ the $d \\times d$ block of the lifted projector. Per iteration this costs one
$d \\times d$ and two $m \\times d$ products instead of two products with the whole
$(m_{eq} + m) \\times (d + m)$ lifted matrix.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from jaxtyping import Array, Float

from ._equilibrate import equilibrate as _ruiz


class AffineProjection(eqx.Module):
    """Frozen factors of the equilibrated affine projection (see module docstring).

    All fields are ordinary leaves: they are read through `jax.lax.stop_gradient`
    and kept out of optimisers by `pinet_eqx.trainable_filter`.
    """

    K: Float[Array, "d d"]
    L: Float[Array, "d m_eq"]
    C_tilde: Float[Array, "m_ineq d"]
    d_y: Float[Array, " d"]
    d_w: Float[Array, " m_ineq"]

    def project(self, s_y, s_w, Lq):
        """Return $(\\tilde y, \\tilde w) = \\Pi_{\\tilde{\\mathcal{A}}}(s_y, s_w)$, given
        the precomputed particular part $L q$."""
        z_y = self.K @ (s_y + self.C_tilde.T @ s_w) + Lq
        z_w = self.C_tilde @ z_y
        return z_y, z_w


@dataclasses.dataclass(frozen=True)
class FactorisationInfo:
    """What the host-side factorisation found, for error messages and `repr`."""

    kept_rows: np.ndarray
    dropped_rows: np.ndarray
    # float64 copies, so host-side checks do not suffer from a float32 cast.
    L: np.ndarray
    d_y: np.ndarray

    def particular_solution(self, q: np.ndarray) -> np.ndarray:
        """The point of the affine set closest (in the scaled metric) to the origin,
        in the user's coordinates, for a fixed right-hand side `q`."""
        return self.d_y * (self.L @ q)


def _independent_rows(E: np.ndarray) -> np.ndarray:
    """Indices of a maximal set of linearly independent rows of `E`, sorted."""
    if E.shape[0] == 0:
        return np.arange(0)
    sv = np.linalg.svd(E, compute_uv=False)
    if sv.size == 0 or sv[0] == 0:
        return np.arange(0)
    rank = int(np.sum(sv > sv[0] * max(E.shape) * np.finfo(np.float64).eps * 10))
    # Column pivoting on E^T picks the rows that are most independent first.
    _, _, piv = scipy.linalg.qr(E.T, mode="economic", pivoting=True)
    return np.sort(piv[:rank])


def build_affine_projection(
    E: np.ndarray,
    C: np.ndarray,
    *,
    equilibrate: bool,
    eq_max_iter: int = 25,
    eq_tol: float = 1e-3,
    eq_mode: str = "gauss_seidel",
    dtype=None,
) -> tuple[AffineProjection, FactorisationInfo]:
    """Equilibrate and factorise the lifted affine set in float64 on the host.

    Uses a Householder QR of the (independent-row) lifted matrix's transpose, which
    is backward stable, rather than an explicit pseudo-inverse.

    **Arguments:**

    - `E`: equality matrix, shape `(m_eq, d)`.
    - `C`: inequality matrix, shape `(m_ineq, d)`.
    - `equilibrate`: whether to run modified Ruiz equilibration (paper App. H.1) on
        the lifted matrix $[E\\ 0;\\ C\\ -I]$.
    - `eq_max_iter`, `eq_tol`, `eq_mode`: passed to `pinet_eqx.equilibrate`.
    - `dtype`: dtype of the returned JAX arrays (default: JAX's default float).

    **Returns:**

    The `AffineProjection` and a `FactorisationInfo`.
    """
    m_eq, d = E.shape
    m_in = C.shape[0]
    if equilibrate and m_eq + m_in > 0:
        lifted = np.block(
            [[E, np.zeros((m_eq, m_in))], [C, -np.eye(m_in)]]
        )
        d_r, d_c = _ruiz(lifted, max_iter=eq_max_iter, tol=eq_tol, mode=eq_mode)
        d_r_eq, d_y, d_w = d_r[:m_eq], d_c[:d], d_c[d:]
    else:
        d_r_eq, d_y, d_w = np.ones(m_eq), np.ones(d), np.ones(m_in)

    E_s = d_r_eq[:, None] * E * d_y[None, :]
    C_t = C * d_y[None, :] / d_w[:, None]
    keep = _independent_rows(E_s)
    r = keep.size
    M = np.block(
        [
            [E_s[keep], np.zeros((r, m_in))],
            [C_t, -np.eye(m_in)],
        ]
    )
    if M.shape[0] > 0:
        Q, R = scipy.linalg.qr(M.T, mode="economic")
        Q_y = Q[:d]
        K = np.eye(d) - Q_y @ Q_y.T
        # y-block of the particular solution Q R^{-T} b for b = [D_r q_keep; 0].
        R_inv_T = scipy.linalg.solve_triangular(R, np.eye(R.shape[0]), trans="T")
        G = Q_y @ R_inv_T[:, :r]
        L = np.zeros((d, m_eq))
        L[:, keep] = G * d_r_eq[keep][None, :]
    else:
        K = np.eye(d)
        L = np.zeros((d, m_eq))
    # K is symmetric in exact arithmetic; symmetrise so the adjoint is exact too.
    K = 0.5 * (K + K.T)
    cast = (lambda a: jnp.asarray(a)) if dtype is None else (
        lambda a: jnp.asarray(a, dtype=dtype)
    )
    op = AffineProjection(
        K=cast(K), L=cast(L), C_tilde=cast(C_t), d_y=cast(d_y), d_w=cast(d_w)
    )
    dropped = np.setdiff1d(np.arange(m_eq), keep)
    return op, FactorisationInfo(
        kept_rows=keep, dropped_rows=dropped, L=L, d_y=d_y
    )
