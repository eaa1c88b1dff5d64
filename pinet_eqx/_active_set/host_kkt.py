"""The fixed KKT pattern of a sparse polyhedral set, on the host: the one
factorisation structure that the polish's face solves and its interior-point
method (`_host_ipm`) share.

For $\\min_y \\tfrac12\\|y - r\\|^2$ subject to $E y = q$ and bounds on the rows
of $G = [I; C]$ (rows of $E$ and $C$ scaled to unit length), every system
either of them solves is

$$K(D) = \\begin{bmatrix} I + G^\\top D G & E^\\top \\\\ E & -\\delta I
\\end{bmatrix}$$

for some non-negative diagonal weights $D$: the barrier's $Z S^{-1}$ in the
interior-point method, a penalty on a face's rows in `face_projection`. Its
sparsity never changes, so its pattern and QDLDL's ordering are built once per
set of matrices, and each system costs one numeric $L D L^\\top$ with iterative
refinement against the unregularised $K$.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import qdldl
import scipy.sparse as sp

from .._linalg.host_solve import (
    FACTORISATIONS,
    GramSolver,
    SaddleSolver,
    gram_lu,
    row_norms,
    unit_rows,
)

# The static regularisation of K's diagonal (both blocks), removed by refinement.
_DELTA = 1e-11
# ... and a smaller one, for the interior-point method once its residuals
# stall. The grids' balance rows, scaled to unit length, are nearly
# dependent, so their multipliers reach 1e6 and more, and the shift's error in
# those rows (about delta times the multipliers) is removed slowly by
# refinement: at `_DELTA` it can hold the interior-point method's equality
# residual near 1e-5, where an iterate is still far from the projection along
# the rows' weak directions (identical units at one bus) and names a wrong
# face. Not the default from the start: late in the method the smaller shift
# makes other solves noisier (on case1354pegase at 100 times the spread, 2 of
# 16 faces went wrong).
FINE_DELTA = 1e-13
# ... and a smaller one still, for the polish's second run, where the first
# one's face did not settle. Proxies' raw outputs on ACTIVSg2000 met faces
# with 2005 rows on 2008 free coordinates (smallest singular value 1e-6 of the
# unit rows): at `FINE_DELTA` the iterate stayed 2-3 units off the projection
# along the weak direction and named a wrong face; at this shift it ends
# within 1e-4 of it (measured: see benchmarks/dcopf/RESULTS.md).
FINEST_DELTA = 1e-15
# The most refinement steps of each solve against the unregularised K: the
# bus-balance rows of a grid are nearly dependent (a Laplacian's rows sum to
# almost nothing), so their multipliers grow large and the shift's error with
# them.
_REFINE_STEPS = 4
# ... stopped once the residual is this small against the right-hand side.
_REFINE_TOL = 1e-10
# The face projections: the penalty weight of the face's rows, the most
# multiplier steps, the residual of those rows (relative to their bounds) that
# ends them, and the refinement steps of each.
_FACE_PENALTY = 1e10
_FACE_STEPS = 16
# ... and from the third step on, a step that leaves the largest residual above
# this share of the last one's ends them: the face is inconsistent or singular
# to the solves, and its Gram matrix decides. Converging faces shrink it by 0.1
# to 0.5 per step (ACTIVSg2000 proxy faces), stalled ones not at all, and
# each step a stalled face spends costs a few per cent of that Gram solve.
_FACE_STALL = 0.8
_FACE_STALL_AFTER = 2
_FACE_TOL = 1e-13
_FACE_REFINE = 1
# The last refinement step's move of the face's point, relative, above which
# its Gram solve is taken as lost to conditioning.
_GRAM_TOL = 1e-10


class KKTPattern:
    """The fixed part of the interior-point systems of one set: the rows
    scaled to unit length, and the sparsity pattern of $K$ with, for each of
    its entries, where the diagonal weights $D$ enter.

    **Arguments:**

    - `E`: the equality rows (`scipy.sparse`, float64).
    - `C`: the inequality rows (`scipy.sparse`, float64); every coordinate of
        $y$ and every row of `C` may carry bounds.
    """

    def __init__(self, E: Any, C: Any):
        self.E, self.e_norms = unit_rows(sp.csr_matrix(E))
        Cn, self.c_norms = unit_rows(sp.csr_matrix(C))
        d = self.E.shape[1]
        self.d, self.m_eq, self.k = d, self.E.shape[0], Cn.shape[0]
        self.G: Any = sp.vstack([sp.identity(d, format="csr"), Cn]).tocsr()
        self.GT: Any = self.G.T.tocsr()
        self.ET: Any = self.E.T.tocsr()
        # For the rounding margins of `_host_ipm`'s Farkas check.
        self.GT_abs: Any = abs(self.GT)
        self.ET_abs: Any = abs(self.ET)
        n = d + self.m_eq
        # Every contribution to K: (row, column, constant value, weight index);
        # a weight index of -1 marks a constant entry.
        E_coo = self.E.tocoo()
        C_coo = Cn.tocoo()
        a, b, pair_row, c_col, c_val = _row_pairs(C_coo, self.k)
        diag = np.arange(d)
        rows = np.concatenate(
            [diag, diag, c_col[a], d + E_coo.row, E_coo.col, d + np.arange(self.m_eq)]
        )
        cols = np.concatenate(
            [diag, diag, c_col[b], E_coo.col, d + E_coo.row, d + np.arange(self.m_eq)]
        )
        const = np.concatenate(
            [
                np.ones(d),
                np.zeros(d),
                np.zeros(a.size),
                E_coo.data,
                E_coo.data,
                np.zeros(self.m_eq),
            ]
        )
        coef = np.concatenate(
            [np.zeros(d), np.ones(d), c_val[a] * c_val[b], np.zeros(2 * E_coo.nnz)]
        )
        coef = np.concatenate([coef, np.zeros(self.m_eq)])
        weight = np.concatenate(
            [
                np.full(d, -1),
                diag,
                d + pair_row,
                np.full(2 * E_coo.nnz + self.m_eq, -1),
            ]
        )
        # The regularisation: +delta on the first block, -delta on the second.
        sign = np.concatenate([np.ones(d), -np.ones(self.m_eq)])
        # Keep the upper triangle (QDLDL's input), in CSC order of (column, row).
        upper = rows <= cols
        keys = cols[upper].astype(np.int64) * n + rows[upper]
        uniq, self._slot = np.unique(keys, return_inverse=True)
        self._const = np.bincount(self._slot, const[upper], uniq.size)
        # Only the weighted contributions change with D.
        weighted = weight[upper] >= 0
        self._w_slot = self._slot[weighted]
        self._w_coef = coef[upper][weighted]
        self._w_index = weight[upper][weighted]
        diag_keys = np.arange(n, dtype=np.int64) * (n + 1)
        self._diag_slot = np.searchsorted(uniq, diag_keys)
        self._sign = sign
        self._indices = (uniq % n).astype(np.int32)
        self._indptr = np.searchsorted(uniq // n, np.arange(n + 1)).astype(np.int32)
        # The whole symmetric K as CSR, its entries taken from the upper
        # triangle's: one product per refinement step.
        row_u, col_u = uniq % n, uniq // n
        off = np.flatnonzero(row_u != col_u)
        full_row = np.concatenate([row_u, col_u[off]])
        full_col = np.concatenate([col_u, row_u[off]])
        order = np.argsort(full_row * n + full_col, kind="stable")
        self._full_source = np.concatenate([np.arange(uniq.size), off])[order]
        self._full_indices = full_col[order].astype(np.int32)
        self._full_indptr = np.searchsorted(full_row[order], np.arange(n + 1)).astype(
            np.int32
        )
        self.n = n
        # QDLDL's symbolic analysis, kept per thread (a solver is stateful).
        self._local = threading.local()
        self._free_lu: dict[bytes, Any] = {}

    def free_lu(self, free: np.ndarray) -> tuple[Any, Any]:
        """`(E_F, lu)`: $E_F$, the unit equality rows' columns `free`, and the
        SuperLU of $E_F^\\top E_F$ (`gram_lu`; `None` where those columns are
        dependent), kept per set of columns."""
        key = free.tobytes()
        if key not in self._free_lu:
            E_free = self.E[:, free].tocsr()
            FACTORISATIONS.add()
            try:
                self._free_lu[key] = (E_free, gram_lu(E_free.T))
            except RuntimeError:  # singular
                self._free_lu[key] = (E_free, None)
        return self._free_lu[key]

    def values(self, D: np.ndarray) -> np.ndarray:
        """The entries of the unregularised $K$'s upper triangle for the
        weights `D` (one per row of $G$)."""
        w = self._w_coef * D[self._w_index]
        return self._const + np.bincount(self._w_slot, w, self._const.size)

    def factorise(self, D: np.ndarray, delta: float | None = None) -> Any:
        """A solver with $K(D)$: `solve(rhs)`, refined against the unregularised
        matrix (see the module docstring; `solve(rhs, refine=False)` is one
        solve with the regularised factor); `delta` is the regularisation
        (default `_DELTA`). The solver holds until this thread's next
        factorisation."""
        data = self.values(D)
        # The whole K for the refinement (CSR) and the shifted upper triangle
        # to factorise (CSC): this thread's two matrices with their entries
        # replaced (their constructors' checks cost a tenth of a
        # factorisation). Like the solver, they hold the latest factorisation's.
        exact = getattr(self._local, "exact", None)
        if exact is None:
            shape = (self.n, self.n)
            exact = self._local.exact = sp.csr_matrix(
                (data[self._full_source], self._full_indices, self._full_indptr), shape
            )
            self._local.upper = sp.csc_matrix(
                (data, self._indices, self._indptr), shape
            )
        exact.data = data[self._full_source]
        upper = self._local.upper
        upper.data = data
        upper.data[self._diag_slot] += (_DELTA if delta is None else delta) * self._sign
        solver = getattr(self._local, "solver", None)
        if solver is None:
            solver = self._local.solver = qdldl.Solver(upper, upper=True)
        else:
            solver.update(upper, upper=True)
        FACTORISATIONS.add()

        def solve(rhs: np.ndarray, refine: bool = True) -> np.ndarray:
            x = solver.solve(rhs)
            if not refine:
                return x
            size = np.abs(rhs).max()
            for _ in range(_REFINE_STEPS):
                res = rhs - exact @ x
                # Converged (to what the next iterate needs), or not finite.
                if not np.abs(res).max() > _REFINE_TOL * size:
                    break
                x = x + solver.solve(res)
            return x

        solve.matrix = exact  # type: ignore[attr-defined]
        return solve


def _row_pairs(C_coo: Any, k: int):
    """Each row's pairs of nonzeros: row $j$ of $C$ adds $D_j c_{ja} c_{jb}$
    at $(a, b)$ of $G^\\top D G$. Returns `(a, b, row, col, val)`: the pairs'
    positions in `(col, val)`, the nonzeros sorted by row, and their row."""
    order = np.argsort(C_coo.row, kind="stable")
    c_row, c_col, c_val = C_coo.row[order], C_coo.col[order], C_coo.data[order]
    starts = np.searchsorted(c_row, np.arange(k + 1))
    counts = np.diff(starts)
    squares = counts**2
    pair_row = np.repeat(np.arange(k), squares)
    first = np.repeat(starts[:-1], squares)
    within = np.arange(pair_row.size) - np.repeat(np.cumsum(squares) - squares, squares)
    per_row = np.repeat(counts, squares)
    return first + within // per_row, first + within % per_row, pair_row, c_col, c_val


def face_projection(
    pattern: KKTPattern,
    r: np.ndarray,
    q: np.ndarray,
    hi: np.ndarray,
    lo: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, bool] | tuple[None, None, bool]:
    """The projection of `r` onto the face of the flags `hi`, `lo`, on the
    fixed pattern: $\\min \\frac12\\|y - r\\|^2$ subject to $E y = q$ and
    $g_i^\\top y = u_i$ ($\\ell_i$) for the rows $i$ flagged `hi` (`lo`).

    The face's rows enter $K$ as the weights $D = \\rho$ (zero elsewhere), and
    the method of multipliers removes the penalty's error: each step is one
    solve with the same factor, and the error along each direction of the
    face's rows shrinks by $1 / (1 + \\rho \\sigma^2)$ per step. So a face
    costs one numeric refactorisation of the fixed pattern, where a sparse LU
    of its own Gram matrix would redo the ordering and the symbolic work.

    **Returns:** `(y, mult, met)`: the point and each flagged coordinate's
    and row's multiplier (positive pushes $y$ down), in the layout of the
    flags and the units of the rows given, as `gram_face_projection`; and
    whether the steps met the face's rows to `_FACE_TOL`. Where they did not
    (a singular or inconsistent face), `y` and `mult` are the last step's,
    close to the face's projection but not certified by it: the caller's own
    solve decides. `(None, None, False)` where a flagged bound is infinite or
    the steps diverged.
    """
    P = pattern
    d = P.d
    scale = np.concatenate([np.ones(d), P.c_norms])
    flagged = hi | lo
    rows = np.flatnonzero(flagged)
    target = np.where(hi, upper, lower)[rows] / scale[rows]
    if not np.all(np.isfinite(target)):
        return None, None, False
    D = np.zeros(P.G.shape[0])
    D[rows] = _FACE_PENALTY
    solve = P.factorise(D)
    # The face's rows act through products with the whole G and its
    # transpose (`pull` is zero off the face; the gap takes the face's rows
    # of G y): slicing G by rows cost more than a solve.
    pull = np.zeros(P.G.shape[0])
    mu = np.zeros(rows.size)
    rhs_eq = q / P.e_norms
    K = solve.matrix
    x = np.zeros(P.n)
    size = 1.0 + np.abs(target).max(initial=0.0)
    previous = np.inf
    y, met = x[:d], False
    for step in range(_FACE_STEPS):
        pull[rows] = mu - _FACE_PENALTY * target
        rhs = np.concatenate([r - P.GT @ pull, rhs_eq])
        # In correction form: each solve's right-hand side is the residual,
        # so its relative accuracy is the point's, not the penalty's 1e8.
        for _ in range(_FACE_REFINE):
            x = x + solve(rhs - K @ x)
        y = x[:d]
        gap = (P.G @ y)[rows] - target
        mu = mu + _FACE_PENALTY * gap
        largest = np.abs(gap).max(initial=0.0)
        met = bool(largest <= _FACE_TOL * size)
        if met:
            break
        if step >= _FACE_STALL_AFTER and largest > _FACE_STALL * previous:
            break  # stalled: an inconsistent or singular face
        previous = largest
    if not np.all(np.isfinite(y)):
        return None, None, False
    mult = np.zeros(flagged.shape)
    mult[rows] = mu / scale[rows]
    return y, mult, met


def gram_face_projection(
    E: Any, C: Any, r, q, hi, lo, upper, lower, d, saddle: bool = False
) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """The projection of `r` onto the face of the flags, and each flagged
    coordinate's and row's multiplier (positive pushes $y$ down: the sign of
    an upper bound), in the layout of the flags; `(None, None)` if singular.

    It solves with the Gram matrix $M M^\\top$ of the face's free columns,
    refined twice. With `saddle`, where the refinement still moves the point
    (nearly dependent rows), the point is solved again by the saddle-point
    system (`SaddleSolver`), whose conditioning is that of $M$, not its
    square."""
    pinned = (hi | lo)[:d]
    active = (hi | lo)[d:]
    bound = np.where(hi, upper, np.where(lo, lower, 0.0))
    y_pin = np.where(pinned, bound[:d], 0.0)
    free = np.flatnonzero(~pinned)
    A: Any = sp.vstack([E, C[np.flatnonzero(active)]]).tocsc()
    h = np.concatenate([q, bound[d:][active]]) - A @ y_pin
    M = A[:, free].tocsr()
    # Rows scaled to unit length (Jacobi): grid rows span four orders of
    # magnitude, whose squares M M^T would otherwise carry.
    norms = row_norms(M)
    # A row on pinned coordinates only is fixed by them: it leaves the solve
    # (multiplier 0), and the rounds release or satisfy it.
    used = np.flatnonzero(norms > 0)
    M, h, norms = M[used], h[used], norms[used]
    M = sp.diags(1 / norms) @ M
    gram = GramSolver(M)
    if not gram.ok:
        return None, None
    lam = gram.solve(M @ r[free] - h / norms)
    y_free = r[free] - M.T @ lam
    for _ in range(2):  # refinement on the point, against the rows' residual
        step = gram.solve(M @ y_free - h / norms)
        move = M.T @ step
        y_free = y_free - move
        lam = lam + step
    settled = np.abs(move).max(initial=0.0) <= _GRAM_TOL * (1 + np.abs(y_free).max())
    if saddle and not settled:
        # Still moving: nearly dependent rows (a bus whose lines and units are
        # all on the face), whose M M^T squares a condition number the
        # saddle-point system keeps as it is.
        y_free, lam = SaddleSolver(M).solve(r[free], h / norms)
    lam = _scatter(A.shape[0], used, lam / norms)
    y = y_pin.copy()
    y[free] = y_free
    if not np.all(np.isfinite(y)):
        return None, None
    # Stationarity: r - y = A^T lam_all + mu on the pinned coordinates.
    mult = np.zeros(hi.shape)
    mu = r - y - A.T @ lam
    mult[:d] = np.where(pinned, mu, 0.0)
    mult[d:][active] = lam[E.shape[0] :]
    return y, mult


def _scatter(n: int, index, values) -> np.ndarray:
    """A length-`n` vector with `values` at `index`, zero elsewhere."""
    out = np.zeros(n)
    out[index] = values
    return out
