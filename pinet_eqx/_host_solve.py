"""Direct sparse solves with the Gram matrix of constraint rows, on the host.

Badly scaled sparse sets (power grids: susceptances of $10^4$ beside line
limits of 1) defeat conjugate gradients on their row systems, where a sparse
LU factorisation of $K = M M^\\top$ in float64 (SuperLU, with a minimum-degree
ordering of $K$) is cheap: a few times the rows' nonzeros. Three users share it:
the factorisation of the sparse affine projection (`_sparse_affine`), the
polish of sparse polyhedral sets (`_host_polish`), and the active-set
derivative of those sets (`masked_solve`), whose faces change with the
instance and are factorised per call.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

# Regularisation of a face's M M^T (rows of unit length), removed again by
# refinement steps: nearly dependent active rows then still give a usable solve.
_REGULARISATION = 1e-12
# Refinement steps against the unshifted K (see `GramSolver.solve`).
_REFINE_STEPS = 3
# The shift of `SaddleSolver`'s quasi-definite matrix: its factor's accuracy is
# M's, not K's, so it can be far smaller than K's (see `SaddleSolver`).
_SADDLE_SHIFT = 1e-16


def row_norms(M: Any) -> np.ndarray:
    """The Euclidean norm of each row of the sparse `M`."""
    return np.sqrt(np.asarray(M.multiply(M).sum(axis=1)).ravel())


def unit_rows(M: Any) -> tuple[Any, np.ndarray]:
    """`(M_s, norms)`: the rows of the sparse `M` scaled to unit length, and
    their norms (1 for a zero row, which stays zero)."""
    norms = row_norms(M)
    norms = np.where(norms > 0, norms, 1.0)
    return sp.csr_matrix(sp.diags(1 / norms) @ M), norms


def gram_lu(M: Any) -> Any:
    """SuperLU of $M M^\\top$ (`scipy.sparse.linalg.splu`); raises SuperLU's
    `RuntimeError` where it is exactly singular."""
    return _splu(M @ M.T)


def _splu(K: Any) -> Any:
    return spla.splu(
        sp.csc_matrix(K),
        permc_spec="MMD_AT_PLUS_A",
        diag_pivot_thresh=0.0,
        options=dict(SymmetricMode=True),
    )


class GramSolver:
    """Solves with $K = M M^\\top$ for rows $M$ of unit length (float64, host),
    through the LU of $K + 10^{-12} I$ and `_REFINE_STEPS` steps of iterative
    refinement against $K$ itself, which remove the shift's error.

    `lu_solve` applies the shifted factor alone; `ok` is `False` where even
    the shifted $K$ is singular (`solve` then returns NaN)."""

    def __init__(self, M: Any):
        self.K: Any = sp.csr_matrix(M @ M.T)
        try:
            shift = _REGULARISATION * sp.identity(M.shape[0], format="csr")
            self._lu = _splu(self.K + shift)
        except RuntimeError:
            self._lu = None

    @property
    def ok(self) -> bool:
        return self._lu is not None

    def lu_solve(self, rhs: np.ndarray) -> np.ndarray:
        if self._lu is None:
            return np.full_like(rhs, np.nan)
        return self._lu.solve(rhs)

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        x = self.lu_solve(rhs)
        for _ in range(_REFINE_STEPS):
            x = x + self.lu_solve(rhs - self.K @ x)
        return x


class SaddleSolver:
    """Solves with $K = M M^\\top$ for rows $M$ of unit length (float64,
    host) through the LU of the quasi-definite matrix
    $\\begin{bmatrix} I & M^\\top \\\\ M & -\\delta I \\end{bmatrix}$,
    $\\delta = 10^{-16}$, whose solution with right-hand side $(0, -b)$ has
    $\\zeta = (K + \\delta I)^{-1} b$, and `_REFINE_STEPS` steps of iterative
    refinement against $K$.

    Its conditioning is that of $M$, not of $K$ (its square), so rows that are
    nearly, but not exactly, dependent (a bus whose lines are all active, its
    generators' share of its row small) are still resolved, where
    `GramSolver`'s shifted $K$ leaves the projection $r - M^\\top \\zeta$
    visibly off. Exactly dependent rows keep a component of size $\\delta$
    that $M^\\top$ maps to nothing. Its factor is larger than $K$'s, so it
    serves where that projection is the result, the derivative, and only in
    float64: in float32 the rounding of the rows and of the products around
    the solve is as large as what it removes (see `masked_solve`).
    """

    def __init__(self, M: Any):
        k, n = M.shape
        self._M = sp.csr_matrix(M)
        self._n = n
        saddle = sp.bmat(
            [[sp.identity(n), self._M.T], [self._M, -_SADDLE_SHIFT * sp.identity(k)]]
        )
        # Partial pivoting (SuperLU's default, unlike `_splu`): without it the
        # tiny shift's pivots cost the accuracy this solver exists for.
        self._lu = spla.splu(sp.csc_matrix(saddle))

    def _shifted(self, rhs: np.ndarray) -> np.ndarray:
        zeros = np.zeros(self._n, rhs.dtype)
        return self._lu.solve(np.concatenate([zeros, -rhs]))[self._n :]

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        x = self._shifted(rhs)
        for _ in range(_REFINE_STEPS):
            x = x + self._shifted(rhs - self._M @ (self._M.T @ x))
        return x


def masked_solve(M, free, active, b):
    """$x$ with $x_a = (M_s M_s^\\top)^{-1} b_a$ on the `active` rows and $x = b$
    on the others, $M_s$ the active rows of `M` over the `free` coordinates,
    scaled to unit length: the masked active-row system of `_rowsolve`, solved
    directly on the host, one factorisation per instance and call: a
    `SaddleSolver` for float64 `b`, a `GramSolver` (cheaper, and as accurate
    as the float32 rows and products around it) otherwise.

    **Arguments:**

    - `M`: the stacked rows, a `SparseMatrix` (fixed: not batched).
    - `free`: 1 on the free coordinates of $y$, 0 on the pinned ones.
    - `active`: the rows in the system (boolean).
    - `b`: the right-hand side, zero on the inactive rows.

    **Returns:** $x$, in the dtype of `b`. It runs through `jax.pure_callback`
    (one call per batch), so it works under `jit` and `vmap` on every backend;
    it is meant as the `solve` of a `jax.lax.custom_linear_solve`, which
    supplies its derivatives.
    """
    out = jax.ShapeDtypeStruct(b.shape, b.dtype)
    return jax.pure_callback(
        lambda *a: _host_masked(M.shape, *a),
        out,
        M.rows,
        M.cols,
        M.values,
        free,
        active,
        b,
        vmap_method="expand_dims",
    )


def _host_masked(shape, rows, cols, values, free, active, b):
    m, d = shape
    M = sp.csr_matrix(
        (np.asarray(values, np.float64).ravel(), (rows.ravel(), cols.ravel())), shape
    )
    batch = np.broadcast_shapes(b.shape[:-1], free.shape[:-1], active.shape[:-1])
    n = int(np.prod(batch)) if batch else 1

    def per_instance(a, size):
        return np.broadcast_to(np.asarray(a), batch + (size,)).reshape(n, size)

    frees = per_instance(free, d) > 0
    actives = per_instance(active, m)
    bs = per_instance(b, m).astype(np.float64)
    x = bs.copy()
    solver = SaddleSolver if b.dtype == np.float64 else GramSolver
    for i in range(n):
        rows_i = np.flatnonzero(actives[i])
        A = M[rows_i][:, np.flatnonzero(frees[i])]
        norms = row_norms(A)
        used = rows_i[norms > 0]
        A = sp.diags(1 / norms[norms > 0]) @ A[np.flatnonzero(norms > 0)]
        if used.size:
            x[i, used] = solver(A).solve(bs[i, used])
    return x.reshape(batch + (m,)).astype(b.dtype)
