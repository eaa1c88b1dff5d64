"""The affine projection for sparse constraint matrices, factorised on the host.

With $\\tilde M$ the equilibrated lifted matrix $[\\tilde E\\ 0;\\ \\tilde C\\ -I]$
(see `_affine`), the projection onto $\\{\\tilde M s = b\\}$ is

$$\\Pi(s) = s - \\tilde M^\\top K^{-1} (\\tilde M s - b),\\qquad K = \\tilde M
\\tilde M^\\top.$$

$K$ is sparse, symmetric positive definite when the rows are independent, and
its LU factors with a fill-reducing ordering (SuperLU, minimum degree on
$K$, no pivoting, in float64 on the host) stay sparse: their size, not
$(d + m)^2$, sets the cost of an iteration. Inside `jit` each triangular solve
is level-scheduled: the unknowns whose rows depend only on earlier levels are
solved together, one gather and one segment sum per level, and consecutive
levels of similar size are stacked into one `lax.scan` (padding a level costs
at most half again its work). Everything is XLA-native, so the same code runs
batched under `jax.vmap` on CPU and GPU. $K^{-1}$ enters through
`jax.lax.custom_linear_solve` with `symmetric=True`, so derivatives in both
modes reuse the same two solves rather than differentiating the schedule.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from jaxtyping import Array, Float, Int

from .._linalg.host_solve import gram_lu
from .._linalg.sparse import SparseMatrix
from .affine import AbstractAffineProjection, lifted_rhs

# A level joins the current scan while the padded work stays within this factor
# of the real work (plus `_LEVEL_SLACK` entries per level, about what one
# level's fixed cost buys).
_PAD_FACTOR = 1.5
_LEVEL_SLACK = 64


class _LevelChunk(eqx.Module):
    """Consecutive levels of a triangular solve, padded to one size.

    Per level: the unknowns it solves (`rows`, padded with the dummy index
    $n$), their inverse diagonal, and the off-diagonal entries of their rows
    (`nz_slot`: the position of the entry's row within the level, `nz_col`:
    the unknown it multiplies, `nz_val`: the value; padded with zeros that
    multiply the dummy).
    """

    rows: Int[Array, "levels width"]
    inv_diag: Float[Array, "levels width"]
    nz_slot: Int[Array, "levels nnz"]
    nz_col: Int[Array, "levels nnz"]
    nz_val: Float[Array, "levels nnz"]


class TriangularSolve(eqx.Module):
    """A level-scheduled sparse triangular solve $T x = b$."""

    chunks: tuple[_LevelChunk, ...]
    n: int = eqx.field(static=True)

    @staticmethod
    def build(factor: sp.sparray | sp.spmatrix, lower: bool) -> TriangularSolve:
        """Schedule the solve with the triangular matrix `factor` (float64, on
        the host)."""
        T: Any = sp.csr_matrix(factor)
        n = T.shape[0]
        indptr, indices = T.indptr, T.indices
        diag = T.diagonal()
        if np.any(diag == 0):
            raise np.linalg.LinAlgError("zero on the diagonal of a triangular factor")
        level = np.zeros(n, np.int64)
        order = range(n) if lower else range(n - 1, -1, -1)
        for i in order:
            cols = indices[indptr[i] : indptr[i + 1]]
            cols = cols[cols != i]
            if cols.size:
                level[i] = level[cols].max() + 1
        by_level = np.argsort(level, kind="stable")
        counts = np.bincount(level)
        starts = np.concatenate([[0], np.cumsum(counts)])
        row_nnz = np.diff(indptr) - 1  # off-diagonal entries per row
        levels = []
        for lv in range(counts.size):
            rows = by_level[starts[lv] : starts[lv + 1]]
            levels.append((rows, int(row_nnz[rows].sum())))
        chunks, current = [], []
        for rows, nnz in levels:
            trial = current + [(rows, nnz)]
            width = max(r.size for r, _ in trial)
            k = max(z for _, z in trial)
            padded = len(trial) * (width + k)
            real = sum(r.size + z for r, z in trial)
            if current and padded > _PAD_FACTOR * real + _LEVEL_SLACK * len(trial):
                chunks.append(current)
                trial = [(rows, nnz)]
            current = trial
        chunks.append(current)
        return TriangularSolve(chunks=tuple(_chunk(T, diag, c, n) for c in chunks), n=n)

    def solve(self, b: Float[Array, " n"]) -> Float[Array, " n"]:
        """$x = T^{-1} b$ (batched by `jax.vmap` as one solve with many
        right-hand sides: see `_solve`)."""
        return _solve(self.chunks, b)


@jax.custom_batching.custom_vmap
def _solve(chunks, b):
    return _solve_one(chunks, b)


@_solve.def_vmap
def _solve_vmap(axis_size, in_batched, chunks, b):
    # Under `vmap` the right-hand sides become the columns of one matrix, so
    # that each level gathers and scatters whole rows: on a CPU about twice as
    # fast as the batched gathers of the default rule (see RESULTS).
    chunks_batched, b_batched = in_batched
    if any(jax.tree.leaves(chunks_batched)):  # batched factors: no shortcut
        axes = jax.tree.map(lambda batched: 0 if batched else None, chunks_batched)
        plain = jax.vmap(_solve_one, in_axes=(axes, 0 if b_batched else None))
        return plain(chunks, b), True
    if not b_batched:
        return _solve_one(chunks, b), False
    return _solve_columns(chunks, b.T).T, True


def _solve_one(chunks, b):
    return _solve_columns(chunks, b[:, None])[:, 0]


def _solve_columns(chunks, b):
    """$T^{-1} B$ for the right-hand sides that are the columns of `b`."""
    b = jnp.concatenate([b, jnp.zeros((1, b.shape[1]), b.dtype)])
    x = jnp.zeros_like(b)

    def level(x, lv):
        acc = jax.ops.segment_sum(
            lv.nz_val.astype(b.dtype)[:, None] * x[lv.nz_col],
            lv.nz_slot,
            num_segments=lv.rows.shape[0],
        )
        new = (b[lv.rows] - acc) * lv.inv_diag.astype(b.dtype)[:, None]
        return x.at[lv.rows].set(new), None

    for chunk in chunks:
        x, _ = jax.lax.scan(level, x, chunk)
    return x[:-1]


def _chunk(T: sp.csr_matrix, diag, levels, n: int) -> _LevelChunk:
    """Stack `levels`, a list of `(rows, off-diagonal nnz)`, padded to one size."""
    width = max(r.size for r, _ in levels)
    k = max(max(z for _, z in levels), 1)
    L = len(levels)
    rows = np.full((L, width), n, np.int32)
    inv_diag = np.ones((L, width))
    nz_slot = np.zeros((L, k), np.int32)
    nz_col = np.full((L, k), n, np.int32)
    nz_val = np.zeros((L, k))
    for j, (r, _) in enumerate(levels):
        rows[j, : r.size] = r
        inv_diag[j, : r.size] = 1 / diag[r]
        sub = T[r].tocoo()
        off = sub.col != r[sub.row]
        z = int(off.sum())
        nz_slot[j, :z] = sub.row[off]
        nz_col[j, :z] = sub.col[off]
        nz_val[j, :z] = sub.data[off]
    return _LevelChunk(
        rows=jnp.asarray(rows),
        inv_diag=jnp.asarray(inv_diag),
        nz_slot=jnp.asarray(nz_slot),
        nz_col=jnp.asarray(nz_col),
        nz_val=jnp.asarray(nz_val),
    )


class SparseProjection(AbstractAffineProjection):
    """$\\Pi(s) = s - \\tilde M^\\top K^{-1} (\\tilde M s - b)$ with $K = P_r^\\top
    L U P_c^\\top$ factorised once; the particular term is $b = (D_r q, 0)$."""

    M: SparseMatrix
    L: TriangularSolve
    U: TriangularSolve
    perm_r: Int[Array, " r"]
    perm_c: Int[Array, " r"]
    d_r_eq: Float[Array, " m_eq"]
    d_y: Float[Array, " d"]
    d_w: Float[Array, " m"]

    def particular(self, q):
        return lifted_rhs(self.d_r_eq, self.d_w, q)

    def _lu_solve(self, b):
        # P_r K P_c = L U, so K^{-1} b = P_c U^{-1} L^{-1} P_r b.
        x = self.U.solve(self.L.solve(jnp.zeros_like(b).at[self.perm_r].set(b)))
        return x[self.perm_c]

    def _gram(self, v):
        return self.M.mv(self.M.rmv(v))

    def solve_gram(self, b: Float[Array, " r"]) -> Float[Array, " r"]:
        """$K^{-1} b$, differentiable (its transpose is itself)."""
        return jax.lax.custom_linear_solve(
            self._gram, b, lambda _, r: self._lu_solve(r), symmetric=True
        )

    def project(self, s, part):
        M = self.M.astype(s.dtype)
        return s - M.rmv(self.solve_gram(M.mv(s) - part))


def lifted_sparse(E: Any, C: Any) -> Any:
    """The lifted matrix $[E\\ 0;\\ C\\ -I]$, sparse."""
    m_eq, m = E.shape[0], C.shape[0]
    top = sp.hstack([E, sp.csr_matrix((m_eq, m))])
    bottom = sp.hstack([C, -sp.identity(m, format="csr")])
    return sp.csr_matrix(sp.vstack([top, bottom]))


def factorise(M: Any, owner: str):
    """SuperLU of $K = M M^\\top$: `(L, U, perm_r, perm_c)`, or a `ValueError`
    explaining a singular $K$ (dependent rows)."""
    try:
        lu = gram_lu(M)
    except RuntimeError as e:  # "Factor is exactly singular"
        raise ValueError(_singular(owner)) from e
    d = np.abs(lu.U.diagonal())
    if d.size and d.min() <= 1e-13 * d.max():
        raise ValueError(_singular(owner))
    return lu.L, lu.U, lu.perm_r, lu.perm_c


def _singular(owner: str) -> str:
    return (
        f"{owner}: the sparse equality rows are linearly dependent (for example a "
        "duplicated row), so the sparse factorisation of the lifted Gram matrix "
        "is singular. Remove the dependent rows, or pass the matrices dense "
        "(affine_form='nullspace' or 'eliminated'), which drop consistent "
        "dependent rows themselves."
    )


def build_sparse_projection(
    E: Any,
    C: Any,
    d_r: np.ndarray,
    d_c: np.ndarray,
) -> SparseProjection:
    """Scale the lifted matrix by the equilibration's `d_r`, `d_c` and factorise.

    As in `_affine.build_affine_projection`, the inequality rows are scaled so
    that their auxiliary block stays $-I$: $\\tilde C = D_w^{-1} C D_y$.
    """
    m_eq, d = E.shape
    d_r_eq, d_y, d_w = d_r[:m_eq], d_c[:d], d_c[d:]
    E_s = sp.diags(d_r_eq) @ E @ sp.diags(d_y)
    C_t = sp.diags(1 / d_w) @ C @ sp.diags(d_y)
    M = lifted_sparse(sp.csr_matrix(E_s), sp.csr_matrix(C_t))
    L, U, perm_r, perm_c = factorise(M, "Projector(constraints)")
    return SparseProjection(
        M=SparseMatrix.from_scipy(M),
        L=TriangularSolve.build(L, lower=True),
        U=TriangularSolve.build(U, lower=False),
        perm_r=jnp.asarray(perm_r, jnp.int32),
        perm_c=jnp.asarray(perm_c, jnp.int32),
        d_r_eq=jnp.asarray(d_r_eq),
        d_y=jnp.asarray(d_y),
        d_w=jnp.asarray(d_w),
    )
