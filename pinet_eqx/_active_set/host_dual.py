"""The last resort of the sparse polish: Goldfarb and Idnani's dual active-set
method, which cannot cycle.

For the projection $\\min_y \\tfrac12 \\|y - r\\|^2$ subject to $E y = q$ and
bounds on the rows of $B = [I; C]$ (each bound a constraint of its own), it
starts at the projection onto a face where every multiplier has its sign (the
equalities alone, or, here, the iterate's bounded coordinates less those with
the wrong sign) and adds violated constraints one at a time, the most violated
first. Each is approached along the direction
that keeps the working set's constraints tight, with a step that stops where
a working multiplier reaches zero (that constraint leaves, and the step goes
on) or where the new constraint becomes tight (it joins). Every multiplier
stays non-negative, so each point is the projection onto the set of its
working constraints, and the objective rises strictly with each addition: the
method ends after finitely many changes (Goldfarb and Idnani, 1983, for a
positive definite Hessian, here the identity).

Each change refactorises the working set's Gram matrix (`GramSolver`), a
sparse LU, so it costs a factorisation per change: it runs only where the
polish's rounds (`_host_polish`), which move many rows at once, cycle (raw
outputs far from the set). It returns the flags of its final working set,
whose face the rounds then solve and certify.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .._linalg.host_solve import GramSolver, unit_rows

# Changes of the working set before giving up (each one sparse LU). Not less:
# the two trained case1354pegase raw outputs of `tests/test_grids.py` need
# about 1,630 (a cap of 100 failed them), while some instances fail after
# 1,000-3,000 (ACTIVSg2000 proxies, case9241pegase at 100 times the spread).
_MAX_CHANGES = 3000
# A step direction or multiplier change below this is zero (rows have unit length).
_TINY = 1e-12


def working_face(
    E: Any, C: Any, r, q, lower, upper, hi, lo, max_changes: int = _MAX_CHANGES
) -> tuple[np.ndarray, np.ndarray] | None:
    """The flags `(hi, lo)` of the constraints binding at the projection of `r`
    (coordinates of $y$, then the rows of `C`: `_host_polish`'s layout), or
    `None` where the method fails (an infeasible set, or `max_changes`).

    It starts from the face of the flags `hi`, `lo` given, less the
    constraints whose multipliers have the wrong sign there (released until
    none has): a face where every multiplier has its sign, as the method
    requires, and one that already holds most of the binding constraints when
    the flags come from a nearby point.

    **Arguments:**

    - `E`, `C`: the equality and inequality rows (`scipy.sparse`, float64).
    - `r`: the point projected; `q` the equality right-hand side.
    - `lower`, `upper`: the bounds of $[y; C y]$, infinite where absent.
    - `hi`, `lo`: the starting flags (upper and lower bounds).
    - `max_changes`: the most working-set changes.
    """
    d = r.shape[0]
    B: Any = sp.vstack([sp.identity(d, format="csr"), sp.csr_matrix(C)]).tocsr()
    Bn, nb = unit_rows(B)
    En, ne = unit_rows(E)
    qn = q / ne
    lo_n, up_n = lower / nb, upper / nb
    m_eq = En.shape[0]
    # The working set: rows of B, with +1 for an upper bound and -1 a lower.
    hi = hi & np.isfinite(upper)
    lo = lo & np.isfinite(lower) & ~hi
    work = np.flatnonzero(hi | lo)
    sign = np.where(hi[work], 1.0, -1.0)

    def face(work, sign):
        """The working rows, their factorisation and right-hand side."""
        N = sp.vstack([En, sp.diags(sign) @ Bn[work]]).tocsr()
        bound = np.where(sign > 0, up_n[work], -lo_n[work])
        return N, GramSolver(N), np.concatenate([qn, bound])

    start = _release(face, work, sign, r, m_eq)
    if start is None:
        return None
    work, sign, N, gram, b, u = start
    x = r - N.T @ u
    changes = 0
    while True:
        violated = _most_violated(Bn, x, lo_n, up_n, work)
        if violated is None:
            break
        p, s_p, slack = violated  # slack: how far it is violated
        n_p = s_p * Bn[p].toarray().ravel()
        u_p = 0.0
        while True:
            changes += 1
            if changes > max_changes:
                return None
            w, z, curvature, full, partial, leaving, ratios = _ratio_test(
                gram, N, n_p, u, slack, m_eq
            )
            if not (np.isfinite(full) or np.isfinite(partial)):
                return None  # infeasible: nothing moves the violated constraint
            t = min(full, partial)
            x = x - t * z
            u = u - t * w
            u_p += t
            slack -= t * curvature
            entering = (p, s_p, u_p) if full <= partial else None
            work, sign, u = _changed(work, sign, u, entering, leaving, ratios, m_eq)
            N, gram, b = face(work, sign)
            if not gram.ok:
                return None
            if full <= partial:
                break
        x, u = _restarted(gram, N, r, b, x, u, m_eq)
    out_hi, out_lo = np.zeros(B.shape[0], bool), np.zeros(B.shape[0], bool)
    out_hi[work[sign > 0]] = True
    out_lo[work[sign < 0]] = True
    return out_hi, out_lo


def _release(face, work, sign, r, m_eq):
    """The starting face: the working set less its wrongly signed constraints,
    released until none is left; `(work, sign, N, gram, b, u)`, with `u` the
    multipliers (equalities first), or `None` where a face is singular."""
    while True:
        N, gram, b = face(work, sign)
        if not gram.ok:
            return None
        u = gram.solve(N @ r - b)
        wrong = u[m_eq:] < 0
        if not wrong.any():
            return work, sign, N, gram, b, u
        work, sign = work[~wrong], sign[~wrong]


def _most_violated(Bn, x, lo_n, up_n, work):
    """The constraint outside the working set that `x` violates most, as
    `(row, sign, violation)`, or `None` where none is violated (to 1e-9
    relative)."""
    value = Bn @ x
    tol = 1e-9 * (1.0 + np.abs(value))
    over = np.where(np.isfinite(up_n), value - up_n, -np.inf)
    under = np.where(np.isfinite(lo_n), lo_n - value, -np.inf)
    over[work] = under[work] = -np.inf
    excess = np.maximum(over, under)
    p = int(np.argmax(excess))
    if excess[p] <= tol[p]:
        return None
    return p, 1.0 if over[p] >= under[p] else -1.0, float(excess[p])


def _ratio_test(gram, N, n_p, u, slack, m_eq):
    """The step direction that moves the violated row `n_p` towards its bound
    on the current face: `(w, z, curvature, full, partial, leaving, ratios)`,
    `full` the step that reaches the bound and `partial` the one at which the
    first working constraint (`leaving`, with `ratios`) loses its sign."""
    w = gram.solve(N @ n_p)
    z = n_p - N.T @ w
    curvature = float(n_p @ z)
    full = slack / curvature if curvature > _TINY else np.inf
    w_in, u_in = w[m_eq:], u[m_eq:]
    leaving = np.flatnonzero(w_in > _TINY)
    ratios = np.maximum(u_in[leaving], 0.0) / w_in[leaving]
    partial = ratios.min(initial=np.inf)
    return w, z, curvature, full, partial, leaving, ratios


def _restarted(gram, N, r, b, x, u, m_eq):
    """`(x, u)` restarted from the face's own projection, where that keeps every
    multiplier's sign.

    The steps accumulate rounding, and on badly conditioned faces more; a
    restart with a multiplier of the wrong sign (nearly dependent working rows,
    whose multipliers the solve no longer pins down) would make the method drop
    rows with zero steps and cycle, so the steps' point is kept then.
    """
    restart = gram.solve(N @ r - b)
    if restart[m_eq:].min(initial=0.0) >= 0:
        return r - N.T @ restart, restart
    return x, u


def _changed(work, sign, u, entering, leaving, ratios, m_eq):
    """The working set after one change: the violated constraint `entering`
    `(row, sign, multiplier)` added, or (`None`) the first to lose its sign
    dropped."""
    if entering is not None:
        p, s_p, u_p = entering
        return np.append(work, p), np.append(sign, s_p), np.append(u, u_p)
    k = int(leaving[np.argmin(ratios)])
    return np.delete(work, k), np.delete(sign, k), np.delete(u, m_eq + k)
