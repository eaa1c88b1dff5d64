"""Sparse constraint matrices: validation on the host, products inside `jit`.

A fixed matrix given as a `scipy.sparse` matrix or a
`jax.experimental.sparse.BCOO` stays sparse from the constraint set to the
iteration: it is validated and kept in float64 CSR form on the host
(`as_csr`), and carried into `jit` as a `SparseMatrix`, whose products are a
gather and a sorted segment sum (XLA-native on every backend, batched by
`jax.vmap`, linear in the vector and so differentiable in both modes).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from jaxtyping import Array, Float, Int


def is_sparse(value) -> bool:
    """Whether `value` is a `scipy.sparse` matrix/array or a JAX `BCOO`."""
    return sp.issparse(value) or _is_bcoo(value)


def _is_bcoo(value) -> bool:
    # Imported lazily: jax.experimental.sparse is not needed for dense work.
    from jax.experimental import sparse as jsparse

    return isinstance(value, jsparse.BCOO)


def as_csr(value, argname: str, owner: str) -> sp.csr_matrix:
    """A sparse matrix as float64 CSR, checked: two axes, finite entries, no
    explicit zeros or duplicates left in its pattern.

    **Arguments:**

    - `value`: a `scipy.sparse` matrix or array, or a 2-D `BCOO`.
    - `argname`, `owner`: named in error messages.

    **Returns:** a canonical `scipy.sparse.csr_matrix`.
    """
    if _is_bcoo(value):
        if value.ndim != 2 or value.n_batch or value.n_dense:
            raise ValueError(
                f"{owner}: `{argname}` is a BCOO of shape {value.shape} with "
                f"{value.n_batch} batch and {value.n_dense} dense dimensions; pass "
                "a plain 2-D BCOO (n_batch=0, n_dense=0)."
            )
        data = np.asarray(value.data, np.float64)
        idx = np.asarray(value.indices)
        csr = sp.csr_matrix((data, (idx[:, 0], idx[:, 1])), shape=value.shape)
    else:
        if len(value.shape) != 2:
            raise ValueError(
                f"{owner}: `{argname}` must have shape (rows, d), got shape "
                f"{value.shape}."
            )
        try:
            csr = sp.csr_matrix(value, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"{owner}: `{argname}` is a sparse matrix of dtype {value.dtype}; "
                "it must hold real numbers."
            ) from e
    if not np.all(np.isfinite(csr.data)):
        raise ValueError(
            f"{owner}: `{argname}` contains NaN or inf entries; every matrix entry "
            "must be finite."
        )
    csr.sum_duplicates()
    csr.eliminate_zeros()
    csr.sort_indices()
    return csr


def zero_rows(M: sp.csr_matrix) -> np.ndarray:
    """The indices of the rows of `M` with no nonzero entry."""
    return np.flatnonzero(np.diff(M.indptr) == 0)


def check_no_zero_rows(M: sp.csr_matrix, argname: str, owner: str) -> None:
    """Raise if a row of the sparse `M` is all zero: it constrains nothing (or,
    with a nonzero right-hand side, nothing can satisfy it), and it makes the
    sparse factorisation singular."""
    rows = zero_rows(M)
    if rows.size:
        raise ValueError(
            f"{owner}: row(s) {rows[:10].tolist()} of the sparse `{argname}` are all "
            f"zero ({rows.size} in all). Remove them: a zero row constrains "
            "nothing, or nothing at all satisfies it."
        )


class SparseMatrix(eqx.Module):
    """A fixed sparse matrix in coordinate form, rows sorted, usable inside `jit`.

    $M v$ is `segment_sum(values * v[cols], rows)` and $u^\\top M$ is
    `segment_sum(values * u[rows], cols)`: a gather and a scatter-add, linear in
    the vector (so JAX differentiates and transposes them), batched by
    `jax.vmap`, and native to XLA on CPU and GPU.

    `remainder`, where kept, is what the entries lost to JAX's precision (the
    float64 entries minus `values`; zero in float64): host computations add it
    back and so work with the entries to about $2^{-48}$ in
    float32, where identities of the data (a cost in the row space of the
    equality rows) survive that its float32 rounding breaks.
    """

    rows: Int[Array, " nnz"]
    cols: Int[Array, " nnz"]
    values: Float[Array, " nnz"]
    shape: tuple[int, int] = eqx.field(static=True)
    remainder: Float[Array, " nnz"] | None = None

    @staticmethod
    def from_scipy(M, *, remainder: bool = False) -> SparseMatrix:
        """From a `scipy.sparse` matrix (entries kept in JAX's precision, and
        what that loses in `remainder` if asked)."""
        coo = sp.csr_matrix(M).tocoo()
        order = np.lexsort((coo.col, coo.row))
        exact = np.asarray(coo.data[order], np.float64)
        values = jnp.asarray(exact)
        return SparseMatrix(
            rows=jnp.asarray(coo.row[order], jnp.int32),
            cols=jnp.asarray(coo.col[order], jnp.int32),
            values=values,
            shape=(int(M.shape[0]), int(M.shape[1])),
            remainder=jnp.asarray(exact - np.asarray(values, np.float64))
            if remainder
            else None,
        )

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self):
        return self.values.dtype

    def astype(self, dtype) -> SparseMatrix:
        """The same matrix with its entries in `dtype` (and, if kept, what
        they lose in its `remainder`)."""
        values = self.values.astype(dtype)
        rest = self.remainder
        if rest is not None:
            # What a narrower dtype drops joins the remainder.
            rest = (self.values - values.astype(self.values.dtype) + rest).astype(dtype)
        return SparseMatrix(self.rows, self.cols, values, self.shape, rest)

    def squared(self) -> SparseMatrix:
        """The entrywise square $M \\odot M$ (same pattern, no remainder)."""
        return SparseMatrix(self.rows, self.cols, self.values**2, self.shape)

    def mv(self, v: Float[Array, " n"]) -> Float[Array, " m"]:
        """$M v$."""
        return jax.ops.segment_sum(
            self.values * v[self.cols],
            self.rows,
            num_segments=self.shape[0],
            indices_are_sorted=True,
        )

    def rmv(self, u: Float[Array, " m"]) -> Float[Array, " n"]:
        """$M^\\top u$ (equivalently $u^\\top M$)."""
        return jax.ops.segment_sum(
            self.values * u[self.rows], self.cols, num_segments=self.shape[1]
        )

    def __matmul__(self, v):
        return self.mv(v)

    def __rmatmul__(self, u):
        return self.rmv(u)

    def todense(self) -> Float[Array, "m n"]:
        """The dense matrix (for small problems and tests)."""
        out = jnp.zeros(self.shape, self.values.dtype)
        return out.at[self.rows, self.cols].add(self.values)


def vstack(mats) -> sp.csr_matrix:
    """Stack dense and sparse host matrices into one float64 CSR matrix."""
    return sp.csr_matrix(
        sp.vstack(
            [sp.csr_matrix(np.asarray(M) if not sp.issparse(M) else M) for M in mats],
            format="csr",
        ),
        dtype=np.float64,
    )
