r"""The exact projection onto a DC-OPF set, certified by its KKT conditions.

Interior-point answers on the PEGASE grids stop some 1e-5 (relative) from the
projection, above the 1e-6 the accuracy targets ask, so Clarabel's point is
sharpened into a ground truth independent of this library: the rows within
`tol` of their limits form a face, projected onto by its KKT system; rows it
violates join the face, rows whose multiplier has the wrong sign leave it,
until it settles. Certified: feasible to 1e-10, every multiplier of its bound's
sign, stationary to rounding (sufficient for a convex problem). Where the
multipliers are not unique only the ones found are checked, so a true
projection can go uncertified (never the other way round).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from ._fixture import GridCase

_SHIFT = 1e-10  # relative to the identity block, whose entries are 1
_FEASIBLE = 1e-10  # relative violation that still counts as feasible


def face_projection(
    y_raw: np.ndarray, A: sp.csr_matrix, h: np.ndarray, *, steps: int = 30
) -> tuple[np.ndarray, np.ndarray, float]:
    r"""`(y, lam, residual)`: the projection of `y_raw` onto $\{y : A y = h\}$,
    its multipliers (one solution where the rows are dependent) and the largest
    componentwise backward error of $y + A^\top \lambda = y_{raw}$, $A y = h$,
    by iterative refinement on the shifted system $[I\ A^\top; A\ {-\delta} I]$
    (one sparse LU, nonsingular for any `A`)."""
    n, m = A.shape[1], A.shape[0]
    kkt = sp.bmat([[sp.identity(n), A.T], [A, -_SHIFT * sp.identity(m)]], format="csc")
    lu = spla.splu(kkt)
    A_abs = abs(A)
    y, lam = np.zeros(n), np.zeros(m)
    residual = np.inf
    for _ in range(steps):
        r = np.concatenate([y_raw - y - A.T @ lam, h - A @ y])
        # The last terms keep an equation like theta_ref = 0 from dividing
        # by its own residual (as the normalised residual does).
        typical = np.mean(np.abs(y)) + np.mean(np.abs(y_raw))
        size = np.concatenate([
            np.abs(y_raw) + np.abs(y) + A_abs.T @ np.abs(lam) + typical,
            A_abs @ (np.abs(y) + typical) + np.abs(h),
        ])  # fmt: skip
        residual = np.max(np.abs(r) / size)
        if residual <= 1e-14:
            break
        step = lu.solve(r)
        y, lam = y + step[:n], lam + step[n:]
    return y, lam, residual


def certify_projection(case: GridCase, y_raw, p_d, y, *, tol=1e-6, rounds=10):
    """`(y_exact, certified)`: the approximate projection `y` of `y_raw` (loads
    `p_d`) sharpened from its active set (rows within `tol` of their limit) and
    certified, the face changing at most `rounds` times; `y` if not certified."""
    y_raw = np.asarray(y_raw, np.float64)
    eye = sp.identity(case.dim, format="csr")
    q = case.q(p_d)
    bounds = ((case.C, case.flow_lower, case.flow_upper), (eye, case.lower, case.upper))
    # Per block: +1 at an upper limit, -1 at a lower one, 0 off the face.
    sides = []
    for M, lo, up in bounds:
        v = M @ y
        near = tol * (1 + np.abs(v))
        side = np.where(np.isfinite(up) & (v >= up - near), 1, 0)
        side[(side == 0) & np.isfinite(lo) & (v <= lo + near)] = -1
        sides.append(side)
    for _ in range(rounds):
        on = [s != 0 for s in sides]
        rows, limits = [case.E], [q]
        for (M, lo, up), side, o in zip(bounds, sides, on):
            rows.append(M[o])
            limits.append(np.where(side > 0, up, lo)[o])
        A, h = sp.vstack(rows, "csr"), np.concatenate(limits)
        y_face, lam, residual = face_projection(y_raw, A, h)
        if residual > 1e-12:
            return y, False
        changed = False
        start = q.shape[0]
        for (M, lo, up), side, o in zip(bounds, sides, on):
            v = M @ y_face
            slack = _FEASIBLE * (1 + np.abs(v))
            # The multiplier of an upper limit is >= 0, of a lower one <= 0.
            lam_block = lam[start : start + int(o.sum())]
            start += int(o.sum())
            sign = side[o] * lam_block
            wrong = np.flatnonzero(o)[sign < -1e-9 * (1 + np.abs(lam).max())]
            side[wrong] = 0
            over = (side == 0) & (v > up + slack)
            under = (side == 0) & (v < lo - slack)
            side[over], side[under] = 1, -1
            changed |= bool(wrong.size or over.any() or under.any())
        if not changed:
            return y_face, True
    return y, False
