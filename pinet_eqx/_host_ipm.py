"""An interior-point method for the projection onto a sparse polyhedral set, on
the host: the start of the polish where the raw output lies far from the set.

The polish's active-set rounds (`_host_polish`) cost one factorisation per
change of the face, so their cost grows with the distance from $y_{raw}$ to
the set, while an interior-point method's is set by its number of iterations,
which hardly depends on where it starts. This one solves

$$\\min_y \\tfrac12 \\|y - r\\|^2 \\quad\\text{s.t.}\\quad E y = q,\\quad
\\ell \\le G y \\le u,\\qquad G = [I; C],$$

(rows of $E$ and $C$ scaled to unit length) by Mehrotra's predictor-corrector
method with Gondzio's centrality correctors, from an infeasible start. Each
iteration factorises the quasi-definite matrix

$$K = \\begin{bmatrix} I + G^\\top D G & E^\\top \\\\ E & -\\delta I
\\end{bmatrix},\\qquad D = Z S^{-1},$$

whose sparsity never changes: its pattern is built and ordered once per set of
matrices (`KKTPattern`), and each iteration only refactorises its values
(QDLDL's numeric $L D L^\\top$, with iterative refinement against the
unregularised $K$). The method is stopped at a modest accuracy: it only has
to name the face, whose exact projection the polish's rounds then compute and
certify in float64 (`_host_polish._rounds`).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import qdldl
import scipy.sparse as sp

from ._host_solve import FACTORISATIONS, unit_rows

# The static regularisation of K's diagonal (both blocks), removed by refinement.
_DELTA = 1e-11
# The most refinement steps of each solve against the unregularised K: the
# bus-balance rows of a grid are nearly dependent (a Laplacian's rows sum to
# almost nothing), so their multipliers grow large and the shift's error with
# them.
_REFINE_STEPS = 4
# ... stopped once the residual is this small against the right-hand side.
_REFINE_TOL = 1e-10
# Stop when the residuals (relative to the data) and the complementarity
# (relative to the objective) are below these: enough to name the face.
_RESIDUAL_TOL = 1e-5
_GAP_TOL = 1e-9
# The complementarity at which an interval of width w is resolved: (this w)^2.
_WIDTH_FRACTION = 1e-1
# Stop, keeping the best iterate, where the residuals grow this much past it.
_GROWTH = 100.0
# The ratio z / s above which a bound is taken as binding.
_ACTIVE_RATIO = 100.0
# The face projections on the fixed pattern: the penalty weight of the face's
# rows, the most multiplier steps, and the residual of those rows (relative
# to their bounds) that ends them.
_FACE_PENALTY = 1e10
_FACE_STEPS = 8
_FACE_TOL = 1e-13
_FACE_REFINE = 1
# Gondzio's centrality correctors per iteration (each one solve, no factorisation).
_CORRECTORS = 2
# The fraction of the way to the boundary each step goes.
_STEP_FRACTION = 0.99
# The start's multipliers. From r itself a start of 10 suited far raw outputs
# (large multipliers) best; from the rounds' point, which is nearer the set,
# 1 takes fewer iterations (measured on the PEGASE grids, 10 and 100 times
# the spread).
_DUAL_START = 1.0


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
        n = d + self.m_eq
        # Every contribution to K: (row, column, constant value, weight index);
        # a weight index of -1 marks a constant entry.
        E_coo = self.E.tocoo()
        C_coo = Cn.tocoo()
        # C's rows as pairs of their nonzeros: row j adds D_j c_ja c_jb at (a, b).
        order = np.argsort(C_coo.row, kind="stable")
        c_row, c_col, c_val = C_coo.row[order], C_coo.col[order], C_coo.data[order]
        starts = np.searchsorted(c_row, np.arange(self.k + 1))
        counts = np.diff(starts)
        pair_row = np.repeat(np.arange(self.k), counts**2)
        first = np.repeat(starts[:-1], counts**2)
        within = np.arange(pair_row.size) - np.repeat(
            np.cumsum(counts**2) - counts**2, counts**2
        )
        a = first + within // np.repeat(counts, counts**2)
        b = first + within % np.repeat(counts, counts**2)
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
        self._coef, self._weight = coef[upper], weight[upper]
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

    def values(self, D: np.ndarray, delta: float) -> np.ndarray:
        """The entries of $K$'s upper triangle for the weights `D` (one per row
        of $G$) and the regularisation `delta`."""
        w = np.where(self._weight >= 0, D[np.maximum(self._weight, 0)], 0.0)
        data = self._const + np.bincount(self._slot, self._coef * w, self._const.size)
        if delta:
            data[self._diag_slot] += delta * self._sign
        return data

    def matrix(self, data: np.ndarray) -> Any:
        return sp.csc_matrix((data, self._indices, self._indptr), (self.n, self.n))

    def factorise(self, D: np.ndarray) -> Any:
        """A solver with $K(D)$: `solve(rhs)`, refined against the unregularised
        matrix (see the module docstring)."""
        data = self.values(D, 0.0)
        exact = sp.csr_matrix(
            (data[self._full_source], self._full_indices, self._full_indptr),
            (self.n, self.n),
        )
        data[self._diag_slot] += _DELTA * self._sign
        upper = self.matrix(data)
        solver = getattr(self._local, "solver", None)
        if solver is None:
            solver = self._local.solver = qdldl.Solver(upper, upper=True)
        else:
            solver.update(upper, upper=True)
        FACTORISATIONS.add()

        def solve(rhs: np.ndarray) -> np.ndarray:
            x = solver.solve(rhs)
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


def interior_point(
    pattern: KKTPattern,
    r: np.ndarray,
    q: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    max_iter: int = 60,
    y0: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The projection of `r` onto $\\{y : E y = q,\\ \\ell \\le [y; C y] \\le u\\}$,
    to the accuracy that names its face.

    **Arguments:**

    - `pattern`: the set's `KKTPattern`.
    - `r`: the point projected (float64); `q` the equality right-hand side.
    - `lower`, `upper`: the bounds of $[y; C y]$ in the layout of
        `_host_polish` (coordinates, then rows), infinite where absent.
    - `max_iter`: the most iterations (factorisations).

    **Returns:** `(y, hi, lo, iterations)`: the last iterate, the flags of the
    bounds it finds binding (those whose multiplier exceeds their slack), in
    the layout of `lower`, and the number of factorisations.
    """
    # Far from the set the last iterations can overflow; the method checks
    # its steps for that itself (and stops), so numpy's warnings say nothing.
    with np.errstate(all="ignore"):
        return _iterate(pattern, r, q, lower, upper, max_iter, y0)


def _iterate(pattern, r, q, lower, upper, max_iter, y0):
    """`interior_point`'s iterations."""
    P = pattern
    d, m_eq = P.d, P.m_eq
    scale = np.concatenate([np.ones(d), P.c_norms])
    lo_b, up_b = lower / scale, upper / scale
    L, U = np.flatnonzero(np.isfinite(lo_b)), np.flatnonzero(np.isfinite(up_b))
    q = q / P.e_norms
    G, GT, E = P.G, P.GT, P.E
    n_rows = G.shape[0]
    y = r.copy() if y0 is None else np.array(y0, dtype=np.float64)
    g = G @ y
    # An infeasible start whose slacks are at least the bounds' violation: the
    # steps then shrink every residual at a similar rate.
    sL, sU = np.abs(g[L] - lo_b[L]) + 1.0, np.abs(up_b[U] - g[U]) + 1.0
    zL, zU = np.full(L.size, _DUAL_START), np.full(U.size, _DUAL_START)
    lam = np.zeros(m_eq)
    n_pairs = max(L.size + U.size, 1)
    # Far from the set the objective, and with it the complementarity the gap
    # test allows, is large; a bound whose interval is narrow (an angle
    # difference of 1e-3 rad on a strong line) is only told active from
    # inactive once its products s z are far below its width squared.
    width = (up_b - lo_b)[np.isfinite(up_b - lo_b)]
    mu_floor = (_WIDTH_FRACTION * min(1.0, width.min(initial=1.0))) ** 2
    r_scale, q_scale = 1.0 + np.abs(r).max(initial=0.0), 1.0 + np.abs(q).max()

    def scatter(at_l, at_u):
        out = np.zeros(n_rows)
        out[L] = at_l  # L and U each name a row at most once
        out[U] += at_u
        return out

    it, best = 0, None
    for it in range(max_iter + 1):
        g = G @ y
        rd = y - r + E.T @ lam + GT @ scatter(-zL, zU)
        rp = E @ y - q
        rL, rU = g[L] - lo_b[L] - sL, up_b[U] - g[U] - sU
        mu = (sL @ zL + sU @ zU) / n_pairs
        res = max(
            np.abs(rd).max() / r_scale,
            np.abs(rp).max(initial=0.0) / q_scale,
            np.abs(rL).max(initial=0.0) / (1.0 + np.abs(g).max()),
            np.abs(rU).max(initial=0.0) / (1.0 + np.abs(g).max()),
        )
        gap = n_pairs * mu / (1.0 + 0.5 * np.sum((y - r) ** 2))
        if res < _RESIDUAL_TOL and gap < _GAP_TOL:
            if mu < mu_floor:
                break
            if best is not None and res > _GROWTH * best[0]:
                # Past the solves' accuracy (the weights D span many orders
                # of magnitude near the end): the last good iterate names the
                # face as well as any later one would.
                sL, zL, sU, zU = best[1]
                break
            if best is None or res < best[0]:
                best = (res, (sL, zL, sU, zU))
        elif best is not None:
            sL, zL, sU, zU = best[1]
            break
        if it == max_iter:
            break
        solve = P.factorise(scatter(zL / sL, zU / sU))

        def direction(cL, cU, homogeneous=False):
            """The Newton direction for complementarity targets `cL`, `cU`."""
            if homogeneous:  # a corrector: the residuals are already taken
                tL, tU = cL / sL, cU / sU
                rhs = np.concatenate([GT @ scatter(tL, -tU), np.zeros(m_eq)])
                aL, aU = np.zeros(L.size), np.zeros(U.size)
            else:
                tL, tU = (cL - zL * rL) / sL, (cU - zU * rU) / sU
                rhs = np.concatenate([-rd + GT @ scatter(tL, -tU), -rp])
                aL, aU = rL, rU
            sol = solve(rhs)
            dy, dlam = sol[:d], sol[d:]
            Gdy = G @ dy
            dsL, dsU = Gdy[L] + aL, aU - Gdy[U]
            dzL, dzU = (cL - zL * dsL) / sL, (cU - zU * dsU) / sU
            return [dy, dlam, dsL, dzL, dsU, dzU]

        s_now, z_now = np.concatenate([sL, sU]), np.concatenate([zL, zU])

        def longest(step, parts=False):
            """The longest step in [0, 1] that keeps s (and z) positive; with
            `parts`, the primal and the dual one."""
            out = []
            for v, dv in (
                (s_now, np.concatenate([step[2], step[4]])),
                (z_now, np.concatenate([step[3], step[5]])),
            ):
                neg = dv < 0
                out.append(min(1.0, float(np.min(-v[neg] / dv[neg], initial=np.inf))))
            return tuple(out) if parts else min(out)

        affine = direction(-sL * zL, -sU * zU)
        a = longest(affine)
        mu_affine = (
            (sL + a * affine[2]) @ (zL + a * affine[3])
            + (sU + a * affine[4]) @ (zU + a * affine[5])
        ) / n_pairs
        sigma = (mu_affine / mu) ** 3
        step = direction(
            sigma * mu - sL * zL - affine[2] * affine[3],
            sigma * mu - sU * zU - affine[4] * affine[5],
        )
        step = _gondzio(step, direction, longest, (sL, zL, sU, zU), sigma * mu)
        if not all(np.all(np.isfinite(v)) for v in step):
            break  # the solves have failed: the iterate so far names the face
        # Primal and dual steps of their own lengths: some 15% fewer
        # iterations on the grids than one common step.
        a_p, a_d = (_STEP_FRACTION * a for a in longest(step, parts=True))
        y, lam = y + a_p * step[0], lam + a_d * step[1]
        sL, zL, sU, zU = (
            sL + a_p * step[2],
            zL + a_d * step[3],
            sU + a_p * step[4],
            zU + a_d * step[5],
        )
    # Each side's ratio z / s (a bound binds where it is large); a row is
    # active on the side where it exceeds `_ACTIVE_RATIO`, the larger side
    # where both do. Rows left out join the face in the rounds once violated,
    # which is cheaper than releasing rows wrongly flagged (each release
    # round may free only the wrongly signed among dependent rows).
    ratio_lo, ratio_hi = np.zeros(n_rows), np.zeros(n_rows)
    ratio_lo[L], ratio_hi[U] = zL / sL, zU / sU
    lo = (ratio_lo > _ACTIVE_RATIO) & (ratio_lo >= ratio_hi)
    hi = (ratio_hi > _ACTIVE_RATIO) & (ratio_hi > ratio_lo)
    return y, hi, lo, it


def _gondzio(step, direction, longest, point, target):
    """Gondzio's centrality correctors: push the complementarity products that
    the step would leave far from `target` back towards it, while that
    lengthens the step."""
    sL, zL, sU, zU = point
    length = longest(step)
    for _ in range(_CORRECTORS):
        trial = min(1.0, 1.5 * length + 0.1)
        vL = (sL + trial * step[2]) * (zL + trial * step[3])
        vU = (sU + trial * step[4]) * (zU + trial * step[5])
        fix_l = np.maximum(np.clip(vL, 0.1 * target, 10 * target) - vL, -10 * target)
        fix_u = np.maximum(np.clip(vU, 0.1 * target, 10 * target) - vU, -10 * target)
        extra = direction(fix_l, fix_u, homogeneous=True)
        candidate = [a + b for a, b in zip(step, extra)]
        new_length = longest(candidate)
        if new_length < 1.01 * length:
            break
        step, length = candidate, new_length
    return step


def face_projection(
    pattern: KKTPattern,
    r: np.ndarray,
    q: np.ndarray,
    hi: np.ndarray,
    lo: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """The projection of `r` onto the face of the flags `hi`, `lo`, on the
    fixed pattern: $\\min \\frac12\\|y - r\\|^2$ subject to $E y = q$ and
    $g_i^\\top y = u_i$ ($\\ell_i$) for the rows $i$ flagged `hi` (`lo`).

    The face's rows enter $K$ as the weights $D = \\rho$ (zero elsewhere), and
    the method of multipliers removes the penalty's error: each step is one
    solve with the same factor, and the error along each direction of the
    face's rows shrinks by $1 / (1 + \\rho \\sigma^2)$ per step. So a face
    costs one numeric refactorisation of the fixed pattern, where a sparse LU
    of its own Gram matrix would redo the ordering and the symbolic work.

    **Returns:** `(y, mult)` as `_host_polish._face`: the point and each
    flagged coordinate's and row's multiplier (positive pushes $y$ down), in
    the layout of the flags and the units of the rows given; `(None, None)`
    where the steps do not meet the face's rows to `_FACE_TOL` (a singular
    or inconsistent face: the caller's own solve decides).
    """
    P = pattern
    d = P.d
    scale = np.concatenate([np.ones(d), P.c_norms])
    flagged = hi | lo
    rows = np.flatnonzero(flagged)
    target = np.where(hi, upper, lower)[rows] / scale[rows]
    if not np.all(np.isfinite(target)):
        return None, None
    D = np.zeros(P.G.shape[0])
    D[rows] = _FACE_PENALTY
    solve = P.factorise(D)
    G_A = P.G[rows]
    mu = np.zeros(rows.size)
    rhs_eq = q / P.e_norms
    K = solve.matrix
    x = np.zeros(P.n)
    for _ in range(_FACE_STEPS):
        rhs = np.concatenate([r - G_A.T @ (mu - _FACE_PENALTY * target), rhs_eq])
        # In correction form: each solve's right-hand side is the residual,
        # so its relative accuracy is the point's, not the penalty's 1e8.
        for _ in range(_FACE_REFINE):
            x = x + solve(rhs - K @ x)
        y = x[:d]
        gap = G_A @ y - target
        mu = mu + _FACE_PENALTY * gap
        size = 1.0 + np.abs(target).max(initial=0.0)
        if np.abs(gap).max(initial=0.0) <= _FACE_TOL * size:
            break
    else:
        return None, None
    mult = np.zeros(flagged.shape)
    mult[rows] = mu / scale[rows]
    return y, mult
