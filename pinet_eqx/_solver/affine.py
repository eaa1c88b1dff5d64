"""Projection onto the lifted affine set, factorised once on the host.

The lifted polytope of paper Sec. 2.1 is $\\{(y, w) : E y = q,\\ C y - w = 0\\}$. After
column equilibration $y = D_y \\tilde y$, $w = D_w \\tilde w$ it reads
$\\tilde E \\tilde y = q$, $\\tilde w = \\tilde C \\tilde y$ with
$\\tilde C = D_w^{-1} C D_y$, and its orthogonal projection is affine,
$\\Pi(s) = P s + p(q)$. Two exact factorisations of $P$ are used, whichever needs
fewer flops per iteration:

- `NullspaceProjection`: $P = N N^\\top$ with $N$ an orthonormal basis of the null
    space of the lifted matrix, $(d + m) \\times k$ with $k = d - \\mathrm{rank}(E)$:
    $2k(d + m)$ multiply-adds.
- `EliminatedProjection`: eliminating $\\tilde w$ gives $\\tilde y = K (s_y +
    \\tilde C^\\top s_w) + L q$, $\\tilde w = \\tilde C \\tilde y$: $d^2 + 2md$
    multiply-adds. Cheaper when there are few equalities.

- `DenseProjection`: $P$ itself, $(d + m)^2$ multiply-adds in one product. More
    flops, but one matrix product per iteration where the others take two: on a
    GPU, where small batched products are bound by kernel launches, that may be
    the cheaper (never chosen by `"auto"`).

- `RangeProjection`: $\\Pi(s) = s - Q Q^\\top s + Q R^{-\\top} \\tilde b$ from a
    reduced QR of the lifted matrix's transpose, computed per instance in JAX when
    a matrix is a per-instance `Parameter` (differentiable, batched by `jax.vmap`).

All beat the two products with the whole $(m_{eq} + m) \\times (d + m)$ lifted
matrix that a pseudo-inverse formulation needs. Vectors are rows (`s @ N`) so that
`jax.vmap` turns them into plain matrix-matrix products, and products with a
transpose contract the stored matrix's last axis (`_times_transpose`) instead of
transposing it.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, cast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from jaxtyping import Array, Float, Int

from .._linalg.equilibration import Equilibration, equilibrate_lifted, group_labels

INCONSISTENT_EQUALITY = (
    "Projector(constraints): the fixed equality system A y = b is inconsistent: "
    "after dropping {dropped} linearly dependent row(s), the remaining rows fix y "
    "in a way that violates row(s) {rows} by up to {residual:.3e}. Check that `b` "
    "lies in the range of `A` (dependent rows must have consistent right-hand "
    "sides)."
)


class AbstractAffineProjection(eqx.Module):
    """$\\Pi_{\\tilde{\\mathcal{A}}}$ in equilibrated coordinates, plus the data to map
    back to the user's coordinates.

    Fixed factorisations are frozen at construction: the projector reads them
    through `jax.lax.stop_gradient`, and `pinet_eqx.trainable_filter` keeps them
    away from optimisers. Per-instance ones are built inside the call.
    """

    d_y: eqx.AbstractVar[Float[Array, " d"]]
    d_w: eqx.AbstractVar[Float[Array, " m"]]

    @abc.abstractmethod
    def particular(self, q: Float[Array, " m_eq"]) -> Array:
        """Per-instance data for `project`, computed once per call."""

    @abc.abstractmethod
    def project(self, s, part) -> Array:
        """Return $\\tilde z = \\Pi_{\\tilde{\\mathcal{A}}}(s)$ for $s = (s_y, s_w)$
        of length $d + m$."""


def _times_transpose(v, M):
    """$v M^\\top$ for rows $v$, multiplying by $M$ as stored.

    Written `v @ M.T`, XLA:CPU copies $M$ transposed before the product; when $M$
    is a jit argument rather than a constant, that copy runs on every iteration of
    the loop that uses it (a 1500 x 500 basis made one DC3-large projection 3.5x
    slower).
    """
    return jax.lax.dot_general(v, M, (((v.ndim - 1,), (1,)), ((), ())))


def lifted_rhs(d_r_eq, d_w, q):
    """The lifted system's right-hand side $b = (D_r q, 0)$, with the equality
    rows' scaling `d_r_eq` and a zero per auxiliary column (`d_w`)."""
    return jnp.concatenate([d_r_eq * q, jnp.zeros(d_w.shape, q.dtype)])


class _ParticularByRows(AbstractAffineProjection):
    """An affine projection whose particular term is $P^\\top q$."""

    if TYPE_CHECKING:
        # Declared by each subclass in its own place: a field here (or an
        # `AbstractVar`) would move `P` first and break files saved before.
        P: Float[Array, "m_eq n"]

    def particular(self, q):
        return q @ self.P


class NullspaceProjection(_ParticularByRows):
    """$\\Pi(s) = N N^\\top s + P^\\top q$, with $N$ orthonormal."""

    N: Float[Array, "n k"]
    P: Float[Array, "m_eq n"]
    d_y: Float[Array, " d"]
    d_w: Float[Array, " m"]

    def project(self, s, part):
        return _times_transpose(s @ self.N, self.N) + part


class DenseProjection(_ParticularByRows):
    """$\\Pi(s) = P s + P_q^\\top q$, with $P = N N^\\top$ stored (symmetric)."""

    P_s: Float[Array, "n n"]
    P: Float[Array, "m_eq n"]
    d_y: Float[Array, " d"]
    d_w: Float[Array, " m"]

    def project(self, s, part):
        return s @ self.P_s + part


class EliminatedProjection(AbstractAffineProjection):
    """$\\tilde y = K (s_y + \\tilde C^\\top s_w) + L q$, $\\tilde w = \\tilde C
    \\tilde y$, with $K$ symmetric."""

    K: Float[Array, "d d"]
    C_tilde: Float[Array, "m d"]
    P_y: Float[Array, "m_eq d"]
    d_y: Float[Array, " d"]
    d_w: Float[Array, " m"]

    def particular(self, q):
        return q @ self.P_y

    def project(self, s, part):
        d = self.K.shape[0]
        z_y = (s[:d] + s[d:] @ self.C_tilde) @ self.K + part
        return jnp.concatenate([z_y, _times_transpose(z_y, self.C_tilde)])


class RangeProjection(AbstractAffineProjection):
    """$\\Pi(s) = s - Q Q^\\top s + Q R^{-\\top} (D_r b)$ with $Q R$ the reduced QR
    of the equilibrated lifted matrix transposed and $b = (q, 0)$."""

    Q: Float[Array, "n r"]
    R: Float[Array, "r r"]
    d_r_eq: Float[Array, " m_eq"]
    d_y: Float[Array, " d"]
    d_w: Float[Array, " m"]

    def particular(self, q):
        b = lifted_rhs(self.d_r_eq, self.d_w, q)
        u = jax.scipy.linalg.solve_triangular(self.R, b, trans="T", lower=False)
        return self.Q @ u

    def project(self, s, part):
        return s - _times_transpose(s @ self.Q, self.Q) + part


@dataclasses.dataclass(frozen=True)
class FactorisationInfo:
    """What the host-side factorisation found, kept in float64 for host checks."""

    dropped_rows: np.ndarray
    P_y: np.ndarray
    d_y: np.ndarray

    def particular_solution(self, q: np.ndarray) -> np.ndarray:
        """The point of $\\{E y = q\\}$ nearest the origin (scaled metric), in user
        coordinates."""
        return self.d_y * (q @ self.P_y)

    def check_consistent(self, E: np.ndarray, q: np.ndarray) -> None:
        """Raise if the fixed system $E y = q$ is inconsistent: its dependent rows
        (dropped) do not agree with the others."""
        y0 = self.particular_solution(q)
        res = np.abs(E @ y0 - q)
        scale = 1.0 + np.max(np.abs(q)) + np.max(np.abs(E)) * np.max(np.abs(y0))
        bad = np.flatnonzero(res > 1e-9 * scale * max(E.shape))
        if bad.size:
            raise ValueError(
                INCONSISTENT_EQUALITY.format(
                    dropped=self.dropped_rows.size,
                    rows=bad[:10].tolist(),
                    residual=float(res.max()),
                )
            )


def independent_rows(E: np.ndarray) -> np.ndarray:
    """Indices of a maximal set of linearly independent rows of `E`, sorted."""
    if E.shape[0] == 0:
        return np.arange(0)
    sv = np.linalg.svd(E, compute_uv=False)
    if sv[0] == 0:
        return np.arange(0)
    rank = int(np.sum(sv > sv[0] * max(E.shape) * np.finfo(np.float64).eps * 10))
    # Column pivoting on E^T picks the most independent rows first.
    # scipy-stubs types `qr` as a union over all its modes.
    _, _, piv = cast(
        "tuple[np.ndarray, np.ndarray, np.ndarray]",
        scipy.linalg.qr(E.T, mode="economic", pivoting=True),
    )
    return np.sort(piv[:rank])


def build_affine_projection(
    E: np.ndarray,
    C: np.ndarray,
    *,
    equilibration: Equilibration | None,
    form: str = "auto",
    column_groups: np.ndarray | None = None,
) -> tuple[AbstractAffineProjection, FactorisationInfo]:
    """Equilibrate and factorise the lifted affine set in float64 on the host.

    Uses Householder QR of the transposed lifted matrix (backward stable), never an
    explicit pseudo-inverse of it. Linearly dependent equality rows are dropped
    (pivoted QR); the caller checks that fixed right-hand sides are consistent.

    **Arguments:**

    - `E`: equality matrix, shape `(m_eq, d)`.
    - `C`: inequality matrix, shape `(m, d)`.
    - `equilibration`: the settings of the modified Ruiz equilibration (paper
        App. H.1) of the lifted matrix $[E\\ 0;\\ C\\ -I]$, whose column scaling
        is used; `None` for none.
    - `form`: `"nullspace"`, `"eliminated"`, `"dense"`, or `"auto"` (fewest
        flops: one of the first two).
    - `column_groups`: group labels for the lifted columns that must share one
        scale (the auxiliary variables of one cone block).

    **Returns:** the projection Module and a `FactorisationInfo`.
    """
    m_eq, d = E.shape
    m = C.shape[0]
    d_r_eq, d_y, d_w = _scalings(E, C, equilibration, column_groups)
    # The row scaling does not change the affine set, only the conditioning of the
    # factorisation below; the column scaling changes the metric of the iteration.
    E_s = d_r_eq[:, None] * E * d_y[None, :]
    C_t = C * d_y[None, :] / d_w[:, None]
    keep = independent_rows(E_s)
    r = keep.size
    M = np.block([[E_s[keep], np.zeros((r, m))], [C_t, -np.eye(m)]])
    n = d + m

    Q, R = cast("tuple[np.ndarray, np.ndarray]", scipy.linalg.qr(M.T, mode="full"))
    rank = r + m
    # Particular solution Q_1 R^{-T} b for b = [D_r q_keep; 0], as a map from q.
    if rank:
        # trans=1, i.e. "T": solve R^T x = b.
        R_inv_T = scipy.linalg.solve_triangular(R[:rank], np.eye(rank), trans=1)
        G = Q[:, :rank] @ R_inv_T[:, :r]  # (n, r)
    else:
        G = np.zeros((n, 0))
    P = np.zeros((m_eq, n))
    P[keep] = (G * d_r_eq[keep][None, :]).T

    op = _form(form, Q, rank, P, C_t, d_y, d_w)
    dropped = np.setdiff1d(np.arange(m_eq), keep)
    info = FactorisationInfo(dropped_rows=dropped, P_y=P[:, :d], d_y=d_y)
    return op, info


def _scalings(E, C, equilibration, column_groups):
    """The equilibration's row scaling of $E$ and column scalings of $y$ and
    $w$, `(d_r_eq, d_y, d_w)` (ones without equilibration)."""
    m_eq, d = E.shape
    m = C.shape[0]
    if equilibration is not None and m_eq + m > 0:
        lifted = np.block([[E, np.zeros((m_eq, m))], [C, -np.eye(m)]])
        groups, n_groups = group_labels(column_groups, d + m)
        d_r, d_c = equilibrate_lifted(
            np, lifted, C, m_eq, d, groups, n_groups, equilibration
        )
        d_r_eq, d_y, d_w = d_r[:m_eq], d_c[:d], d_c[d:]
    else:
        d_r_eq, d_y, d_w = np.ones(m_eq), np.ones(d), np.ones(m)
    return d_r_eq, d_y, d_w


def _form(form, Q, rank, P, C_t, d_y, d_w) -> AbstractAffineProjection:
    """The projection Module of `form`, from the QR factor `Q` of the lifted
    matrix (of rank `rank`) and the particular-solution map `P`."""
    d, m = d_y.shape[0], d_w.shape[0]
    n, k = d + m, d - (rank - m)
    if form == "auto":
        form = "nullspace" if 2 * k * n < d * d + 2 * m * d else "eliminated"
    common = dict(d_y=jnp.asarray(d_y), d_w=jnp.asarray(d_w))
    if form == "nullspace":
        N = Q[:, rank:]
        op = NullspaceProjection(N=jnp.asarray(N), P=jnp.asarray(P), **common)
    elif form == "dense":
        N = Q[:, rank:]
        # Symmetric in exact arithmetic; symmetrise so `s @ P_s` is `P_s @ s`.
        P_s = N @ N.T
        P_s = 0.5 * (P_s + P_s.T)
        op = DenseProjection(P_s=jnp.asarray(P_s), P=jnp.asarray(P), **common)
    elif form == "eliminated":
        Q_y = Q[:d, :rank]
        K = np.eye(d) - Q_y @ Q_y.T
        # Symmetric in exact arithmetic; symmetrise so `s @ K` is also `K @ s`.
        K = 0.5 * (K + K.T)
        op = EliminatedProjection(
            K=jnp.asarray(K),
            C_tilde=jnp.asarray(C_t),
            P_y=jnp.asarray(P[:, :d]),
            **common,
        )
    else:
        raise ValueError(
            f"Projector(affine_form={form!r}): must be 'auto', 'nullspace', "
            "'eliminated' or 'dense'."
        )
    return op


def build_affine_projection_traced(
    E: Float[Array, "m_eq d"],
    C: Float[Array, "m d"],
    *,
    equilibration: Equilibration | None,
    column_groups: Int[Array, " n"] | None,
    n_groups: int,
) -> tuple[RangeProjection, Float[Array, ""]]:
    """Equilibrate and factorise one instance's lifted affine set, inside jit.

    Same lifted matrix and Ruiz scaling as `build_affine_projection`, then a
    reduced Householder QR of its transpose (differentiable; under `jax.vmap` one
    batched factorisation per call). Equality rows must be linearly independent.

    **Returns:** the projection and $\\min_i |R_{ii}| / \\max_i |R_{ii}|$, which is
    about zero when the rows are dependent.
    """
    m_eq, d = E.shape
    m = C.shape[0]
    dtype = E.dtype
    lifted = jnp.block(
        [[E, jnp.zeros((m_eq, m), dtype)], [C, -jnp.eye(m, dtype=dtype)]]
    )
    if equilibration is not None:
        d_r, d_c = equilibrate_lifted(
            jnp, lifted, C, m_eq, d, column_groups, n_groups, equilibration
        )
    else:
        d_r, d_c = jnp.ones(m_eq + m, dtype), jnp.ones(d + m, dtype)
    Q, R = jnp.linalg.qr((d_r[:, None] * lifted * d_c[None, :]).T)
    diag = jnp.abs(jnp.diagonal(R))
    conditioning = jax.lax.stop_gradient(jnp.min(diag) / jnp.max(diag))
    op = RangeProjection(Q=Q, R=R, d_r_eq=d_r[:m_eq], d_y=d_c[:d], d_w=d_c[d:])
    return op, conditioning
