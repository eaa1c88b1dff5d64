"""The working set of the sparse polish's dual active-set method
(`_host_dual`), on one factorisation bordered by its changes.

A working set's Gram matrix $N_W N_W^\\top$ is the starting face's,
factorised once (QDLDL), bordered by one column per change: a joining row
$n$ by $N_0 n$, a starting row that leaves by the unit vector that pins its
multiplier to zero. A solve is one with the factor and one with the dense
Schur complement of the borders (block LU), refined against $N_W N_W^\\top$
itself, so a change costs a few solves, each about a fortieth of a
factorisation on ACTIVSg2000. The borders are folded into a new factor once
they are `_BORDERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import qdldl
import scipy.sparse as sp

from .._linalg.host_solve import FACTORISATIONS, GramSolver

# The most borders on one factor: each solve costs dense products with all of
# them, and each border a product with the Schur complement's inverse.
_BORDERS = 120
# ... and the most wrongly signed starting rows released by borders (more are
# released by factorising again: a border per row on a face that far off
# lost the accuracy that a trained case1354pegase raw output needed).
_RELEASE_BORDERS = 10
# ... and the room made for them at first (it doubles as they come).
_FIRST_ROOM = 16
# The shift of the factorised Gram matrix, removed by the refinement.
_SHIFT = 1e-12
# The relative residual of a starting face's solve beyond which its factor is
# not bordered (a singular face).
_SOUND = 1e-8
# Refinement steps of each solve against the bordered Gram matrix: the Gram
# matrix squares the rows' conditioning (nearly dependent balance rows).
_REFINE = 2
# ... stopped once the residual is this small against the right-hand side.
_REFINE_TOL = 1e-10


# A step direction or multiplier change below this is zero (rows have unit length).
TINY = 1e-12


class WorkingSet:
    """The working set, its multipliers and the bordered factor of its Gram
    matrix: base rows (equalities, then signed rows of $G$) factorised, and
    borders (`k` of them) for the rows that joined since and the base rows that
    left. `u0` holds the base rows' multipliers (zero where a row left) and
    `ub` the borders' (a joined row's multiplier, or nothing for a left row)."""

    # The borders' arrays (`_room`): columns against the base rows, their
    # solves with the factor, the Schur complement's inverse, the joined rows;
    # per border its row of $G$ (or left base row), kind, bound and sign.
    cols: np.ndarray
    V: np.ndarray
    Si: np.ndarray
    RA: np.ndarray
    b_row: np.ndarray
    b_add: np.ndarray
    b_rhs: np.ndarray
    b_sign: np.ndarray

    def __init__(self, P, r, q, lower, upper, hi, lo):
        self.P, self.r = P, r
        scale = np.concatenate([np.ones(P.d), P.c_norms])
        self.lo_n, self.up_n = lower / scale, upper / scale
        self.fixed = fixed = lower == upper
        self.beq = np.concatenate([q / P.e_norms, self.up_n[fixed]])
        self.Eq: Any = sp.vstack([P.E, P.G[np.flatnonzero(fixed)]]).tocsr()
        self.m_e = self.Eq.shape[0]
        hi = hi & np.isfinite(upper) & ~fixed
        lo = lo & np.isfinite(lower) & ~hi & ~fixed
        rows = np.flatnonzero(hi | lo)
        self.ok = self._factor(rows, np.where(hi[rows], 1.0, -1.0), None)

    def _projection_rhs(self):
        """The right-hand sides of the projection onto the working face:
        $N r - b$, for the base rows and the borders."""
        k = self.k
        return self.N0 @ self.r - self.b0, self.RA[:k] @ self.r - self.b_rhs[:k]

    def _allocate(self) -> None:
        """The right-hand side of the base rows, and room for the borders."""
        rows, signs = self.rows, self.signs
        bound = np.where(signs > 0, self.up_n[rows], -self.lo_n[rows])
        self.b0 = np.concatenate([self.beq, bound])
        self.k = 0
        self._room(_FIRST_ROOM)

    def _room(self, cap: int) -> None:
        """Room for `cap` borders, the present ones kept: the arrays grow as
        the borders come (a face's arrays are `cap` rows of its length)."""
        n0, k = self.N0.shape[0], self.k
        arrays = (("cols", (cap, n0), float), ("V", (cap, n0), float),
                  ("Si", (cap, cap), float), ("RA", (cap, self.P.d), float),
                  ("b_row", (cap,), int), ("b_add", (cap,), bool),
                  ("b_rhs", (cap,), float), ("b_sign", (cap,), float))  # fmt: skip
        for name, shape, dtype in arrays:
            new = np.zeros(shape, dtype)
            if k:
                kept = (slice(k), slice(k)) if name == "Si" else slice(k)
                new[kept] = getattr(self, name)[kept]
            setattr(self, name, new)

    def _factor(self, rows, signs, u) -> bool:
        """Factorises the face of the signed `rows` (besides the equalities),
        with multipliers `u` (solved for where `None`), and drops the borders."""
        P = self.P
        self.rows, self.signs = rows, signs
        self.N0: Any = sp.vstack([self.Eq, sp.diags(signs) @ P.G[rows]]).tocsr()
        self.N0T: Any = self.N0.T.tocsr()
        self._allocate()
        self.alive = np.ones(self.N0.shape[0], bool)
        self.in_work = self.fixed.copy()
        self.in_work[rows] = True
        solve = _factorise(self.N0)
        if solve is None:
            return False
        self._solve = solve
        self._sound = True
        if u is None:
            rhs, none = self._projection_rhs()  # no borders yet
            u = self.solve(rhs, none, 2)[0]
            # Dependent rows (more of them than coordinates, say): the shifted
            # factor's solves are not the Gram matrix's, and borders on it
            # would be further off; wrong signs are then released by
            # refactorising.
            residual = np.abs(self.N0 @ (self.N0T @ u) - rhs).max(initial=0.0)
            self._sound = residual <= _SOUND * (1.0 + np.abs(rhs).max(initial=0.0))
        self.u0, self.ub = u, np.zeros(0)
        return True

    def release(self) -> bool:
        """Drops the starting rows whose multipliers have the wrong sign, until
        none has; `False` where a face is singular."""
        while self.ok:
            wrong = (self.u0[self.m_e :] < 0) & self.alive[self.m_e :]
            if not wrong.any():
                return True
            if self.k + wrong.sum() > _RELEASE_BORDERS or not self._sound:
                keep = ~wrong & self.alive[self.m_e :]
                self.ok = self._factor(self.rows[keep], self.signs[keep], None)
                continue
            for i in self.m_e + np.flatnonzero(wrong):
                self._remove(int(i))
            self.u0, self.ub, _ = self.solve(*self._projection_rhs())
        return False

    def _raw(self, rhs0, rhsb):
        """One solve with the bordered factor (block LU): `(u0, ub, z)`, `z`
        the factor's own solve."""
        k = self.k
        z = self._solve(rhs0 * self.alive)
        if k == 0:
            return z, np.zeros(0), z
        rhsb = np.where(self.b_add[:k], rhsb, 0.0)
        ub = self.Si[:k, :k] @ (rhsb - self.cols[:k] @ z)
        u0 = z - ub @ self.V[:k]
        u0[~self.alive] = 0.0
        return u0, ub, z

    def solve(self, rhs0, rhsb, steps: int | None = None):
        """`(u0, ub, z)`: the working set's Gram solve of the right-hand sides
        of the base rows and the borders, refined against $N_W N_W^\\top$
        (at most `steps` times, `_REFINE` by default) until its residual is
        `_REFINE_TOL` of the right-hand side; `z` is the factor's solve of
        `rhs0` alone."""
        u0, ub, first = self._raw(rhs0, rhsb)
        k = self.k
        size = max(np.abs(rhs0).max(initial=0.0), np.abs(rhsb).max(initial=0.0))
        for _ in range(_REFINE if steps is None else steps):
            x = self.transpose_times(u0, ub)
            res0 = (rhs0 - self.N0 @ x) * self.alive
            resb = (rhsb - self.RA[:k] @ x) * self.b_add[:k]
            largest = max(np.abs(res0).max(initial=0.0), np.abs(resb).max(initial=0.0))
            if largest <= _REFINE_TOL * size:
                break
            d0, db, _ = self._raw(res0, resb)
            u0, ub = u0 + d0, ub + db
        return u0, ub, first

    def transpose_times(self, u0, ub) -> np.ndarray:
        """$N_W^\\top u$ (a left base row's multiplier is zero, and so is a
        left row's border's row)."""
        return self.N0T @ (u0 * self.alive) + ub @ self.RA[: self.k]

    def point(self) -> np.ndarray:
        return self.r - self.transpose_times(self.u0, self.ub)

    def ratio_test(self, w0, wb):
        """The step at which the first working multiplier reaches zero along
        `-w`, and which one: `(partial, index)`, the index over the base
        inequality rows, then the borders."""
        m_e = self.m_e
        w_base = np.where(self.alive[m_e:], w0[m_e:], 0.0)
        w = np.concatenate([w_base, wb * self.b_add[: self.k]])
        u = np.concatenate([self.u0[m_e:], self.ub])
        leaving = np.flatnonzero(w > TINY)
        if not leaving.size:
            return np.inf, -1
        ratios = np.maximum(u[leaving], 0.0) / w[leaving]
        best = int(np.argmin(ratios))
        return float(ratios[best]), int(leaving[best])

    def _border(self, col, row, v=None) -> int:
        """Adds a border: `col` against the base rows, `row` its row of $G$
        (zero for a left base row), `v` the factor's solve of `col` if known."""
        k = self.k
        if k == self.Si.shape[0]:
            self._room(min(2 * k, _BORDERS + 1))
        if v is None:
            v = self._solve(col)
        # The Schur complement S gains a row and a column; its inverse, kept
        # instead (a product per solve), by the bordering formula.
        cross = self.RA[:k] @ row - self.V[:k] @ col
        a = self.Si[:k, :k] @ cross
        pivot = row @ row - col @ v - cross @ a
        self.Si[:k, :k] += np.outer(a, a / pivot)
        self.Si[k, :k] = self.Si[:k, k] = -a / pivot
        self.Si[k, k] = 1.0 / pivot
        self.cols[k], self.V[k], self.RA[k] = col, v, row
        self.k += 1
        return k

    def _remove(self, i: int) -> None:
        col = np.zeros(self.N0.shape[0])
        col[i] = 1.0
        j = self._border(col, np.zeros(self.P.d))
        self.b_add[j], self.b_row[j], self.b_rhs[j] = False, i, 0.0
        self.alive[i] = False
        self.in_work[self.rows[i - self.m_e]] = False
        self.ub = np.append(self.ub, 0.0)

    def enter(self, p, s_p, n_p, u_p, first) -> bool:
        """Row `p` of $G$ joins with sign `s_p`, row `n_p` and multiplier `u_p`;
        `first` is the factor's solve of its column (from its direction)."""
        if self.k >= _BORDERS:
            rows, signs, u = self._current()
            return self._factor(
                np.append(rows, p), np.append(signs, s_p), np.append(u, u_p)
            )
        j = self._border(self.N0 @ n_p * self.alive, n_p, first)
        self.b_add[j], self.b_row[j], self.b_sign[j] = True, p, s_p
        self.b_rhs[j] = self.up_n[p] if s_p > 0 else -self.lo_n[p]
        self.ub = np.append(self.ub, u_p)
        self.in_work[p] = True
        return True

    def leave(self, index: int) -> bool:
        """The working row `index` (over the base inequality rows, then the
        borders: `ratio_test`'s) leaves."""
        base = self.N0.shape[0] - self.m_e
        if index < base:
            if self.k >= _BORDERS:
                rows, signs, u = self._current(drop=index)
                return self._factor(rows, signs, u)
            self._remove(self.m_e + index)
            self.u0[self.m_e + index] = 0.0
            return True
        j, last = index - base, self.k - 1
        self.in_work[self.b_row[j]] = False
        # The last border takes the leaving one's place.
        for a in (
            self.cols, self.V, self.RA, self.b_row, self.b_add, self.b_rhs,
            self.b_sign,
        ):  # fmt: skip
            a[j] = a[last]
        Si = self.Si[: last + 1, : last + 1]
        Si -= np.outer(Si[:, j], Si[j, :] / Si[j, j])  # S less row and column j
        Si[j, :], Si[:, j] = Si[last, :], Si[:, last]
        Si[j, j] = Si[last, last]
        self.ub[j] = self.ub[last]
        self.ub, self.k = self.ub[:last], last
        return True

    def restart(self, x: np.ndarray) -> np.ndarray:
        """The point and multipliers solved afresh on the working face where
        that keeps every multiplier's sign (else `x` as it is): the steps
        accumulate rounding, more so on nearly dependent faces, and a point
        off the face sends the method after constraints it has met."""
        u0, ub, _ = self.solve(*self._projection_rhs())
        alive = self.alive[self.m_e :]
        signs = np.concatenate([u0[self.m_e :][alive], ub[self.b_add[: self.k]]])
        if signs.min(initial=0.0) < 0:
            return x
        self.u0, self.ub = u0, ub
        return self.point()

    def fold(self) -> bool:
        """Factorises the working set afresh, its borders folded in: where the
        bordered solves have lost their accuracy (a nearly singular face after
        many changes)."""
        if not self.k:
            return False
        return self._factor(*self._current())

    def _current(self, drop: int = -1):
        """The working set as base rows: `(rows, signs, multipliers)`, less
        the base inequality row `drop`."""
        m_e, k = self.m_e, self.k
        keep = self.alive[m_e:].copy()
        if drop >= 0:
            keep[drop] = False
        added = self.b_add[:k]
        rows = np.concatenate([self.rows[keep], self.b_row[:k][added]])
        signs = np.concatenate([self.signs[keep], self.b_sign[:k][added]])
        u = np.concatenate([self.u0[:m_e], self.u0[m_e:][keep], self.ub[added]])
        return rows, signs, u

    def flags(self) -> tuple[np.ndarray, np.ndarray]:
        """The flags of the working set, in `working_face`'s layout."""
        hi = self.fixed.copy()
        lo = np.zeros_like(hi)
        alive = self.alive[self.m_e :]
        hi[self.rows[alive & (self.signs > 0)]] = True
        lo[self.rows[alive & (self.signs < 0)]] = True
        added = self.b_add[: self.k]
        rows, signs = self.b_row[: self.k][added], self.b_sign[: self.k][added]
        hi[rows[signs > 0]] = True
        lo[rows[signs < 0]] = True
        return hi, lo


def _factorise(N: Any) -> Callable | None:
    """A solve with $N N^\\top$ shifted by `_SHIFT` (QDLDL's $L D L^\\top$;
    SuperLU where that meets a zero pivot), or `None` where it is singular even
    so."""
    K = N @ N.T + _SHIFT * sp.identity(N.shape[0], format="csr")
    try:
        solve = qdldl.Solver(sp.triu(K, format="csc"), upper=True).solve
    except RuntimeError:  # not quasi-definite to its rounding
        gram = GramSolver(N)  # SuperLU, with its own shift
        return gram.lu_solve if gram.ok else None
    FACTORISATIONS.add()
    return solve
