r"""The exact projection onto a DC-OPF set, certified by its KKT conditions.

Interior-point answers on the PEGASE grids stop some 1e-5 (relative) from the
projection, above the 1e-6 the accuracy targets ask, so the suite sharpens
Clarabel's point into a ground truth that does not depend on this library:

1. the rows and bounds within `tol` (relative) of their limits at Clarabel's
   point are the working face;
2. the projection onto that face, $\min \|y - y_{raw}\|^2$ subject to $A y = h$,
   is solved from its KKT system $[I\ A^\top; A\ {-\delta} I]$ by a sparse LU,
   refined against the unshifted system. The small shift $\delta$ keeps the LU
   defined where the face's rows are dependent (a bus whose lines are all at
   their limits, common on these grids), and the refinement converges to the
   face's projection, with multipliers that are one solution of many there;
3. rows the face's projection violates join the face, rows whose multiplier
   has the wrong sign leave it, and step 2 repeats;
4. the result is certified when it is feasible to 1e-10 (relative), every
   multiplier has the sign of its bound, and the stationarity residual
   $y_{raw} - y - A^\top\lambda$ is at rounding. Those are the KKT conditions of
   the projection, sufficient for a convex problem.

Where the multipliers are not unique, step 4 checks the ones step 2 found, so a
true projection can go uncertified (never the other way round).
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
    r"""The projection of `y_raw` onto $\{y : A y = h\}$ and its multipliers.

    Solves $y + A^\top \lambda = y_{raw}$, $A y = h$ by iterative refinement on
    the shifted system $[I\ A^\top; A\ {-\delta} I]$ (one sparse LU), which is
    nonsingular for any `A`. Where the rows are dependent (and consistent), $y$
    is still unique and $\lambda$ is one of the solutions.

    **Returns:** `(y, lam, residual)`, the last the unshifted system's largest
    componentwise backward error: each equation's residual over the sum of
    the magnitudes of its terms (each entry of $y$ counted at least at the
    mean magnitude), so that rounding counts alike in rows with entries of 1
    and of 1e4.
    """
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
        size = np.concatenate(
            [
                np.abs(y_raw) + np.abs(y) + A_abs.T @ np.abs(lam) + typical,
                A_abs @ (np.abs(y) + typical) + np.abs(h),
            ]
        )
        residual = np.max(np.abs(r) / size)
        if residual <= 1e-14:
            break
        step = lu.solve(r)
        y, lam = y + step[:n], lam + step[n:]
    return y, lam, residual


def certify_projection(
    case: GridCase,
    y_raw: np.ndarray,
    p_d: np.ndarray,
    y: np.ndarray,
    *,
    tol: float = 1e-6,
    rounds: int = 10,
) -> tuple[np.ndarray, bool]:
    """Sharpen an approximate projection `y` of `y_raw` (loads `p_d`; only `y`'s
    active set is used, rows within `tol` relative of their limit) into the exact
    one and certify it (see the module docstring), letting the face change at most
    `rounds` times: `(y_exact, certified)`, `y` unchanged when not certified.
    """
    y_raw = np.asarray(y_raw, np.float64)
    eye = sp.identity(case.dim, format="csr")
    q = case.q(p_d)
    bounds = (
        (case.C, case.flow_lower, case.flow_upper),
        (eye, case.lower, case.upper),
    )
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
