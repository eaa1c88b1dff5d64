"""The last resort of the sparse polish: Goldfarb and Idnani's dual active-set
method, which cannot cycle.

For the projection $\\min_y \\tfrac12 \\|y - r\\|^2$ subject to $E y = q$ and
bounds on the rows of $B = [I; C]$ (each bound a constraint of its own), it
starts at the projection onto $\\{E y = q\\}$ and adds violated constraints one
at a time, the most violated first. Each is approached along the direction
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

from ._host_solve import GramSolver

# Changes of the working set before giving up (each one sparse LU).
_MAX_CHANGES = 3000
# A step direction or multiplier change below this is zero (rows have unit length).
_TINY = 1e-12


def working_face(
    E: Any, C: Any, r, q, lower, upper, max_changes: int = _MAX_CHANGES
) -> tuple[np.ndarray, np.ndarray] | None:
    """The flags `(hi, lo)` of the constraints binding at the projection of `r`
    (coordinates of $y$, then the rows of `C`: `_host_polish`'s layout), or
    `None` where the method fails (an infeasible set, or `max_changes`).

    **Arguments:**

    - `E`, `C`: the equality and inequality rows (`scipy.sparse`, float64).
    - `r`: the point projected; `q` the equality right-hand side.
    - `lower`, `upper`: the bounds of $[y; C y]$, infinite where absent.
    - `max_changes`: the most working-set changes.
    """
    d = r.shape[0]
    B: Any = sp.vstack([sp.identity(d, format="csr"), sp.csr_matrix(C)]).tocsr()
    nb = np.sqrt(np.asarray(B.multiply(B).sum(axis=1)).ravel())
    nb = np.where(nb > 0, nb, 1.0)
    Bn: Any = sp.diags(1 / nb) @ B  # rows of unit length
    ne = np.sqrt(np.asarray(E.multiply(E).sum(axis=1)).ravel())
    En: Any = sp.diags(1 / np.where(ne > 0, ne, 1.0)) @ E
    qn = q / np.where(ne > 0, ne, 1.0)
    lo_n, up_n = lower / nb, upper / nb
    m_eq = En.shape[0]
    gram = GramSolver(En)
    if not gram.ok:
        return None
    u = gram.solve(En @ r - qn)  # the equalities' multipliers, then the working set's
    x = r - En.T @ u
    work: list[tuple[int, int]] = []  # (row of B, +1 for its upper bound, -1 lower)

    def rows() -> Any:
        signed = [s * Bn[i] for i, s in work]
        return sp.vstack([En, *signed]).tocsr() if signed else En

    N = En
    changes = 0
    while True:
        value = Bn @ x
        tol = 1e-9 * (1.0 + np.abs(value))
        over = np.where(np.isfinite(up_n), value - up_n, -np.inf)
        under = np.where(np.isfinite(lo_n), lo_n - value, -np.inf)
        for i, _ in work:
            over[i] = under[i] = -np.inf
        excess = np.maximum(over, under)
        p = int(np.argmax(excess))
        if excess[p] <= tol[p]:
            break
        sign = 1 if over[p] >= under[p] else -1
        n_p = sign * Bn[p].toarray().ravel()
        slack = float(excess[p])  # how far the new constraint is violated
        u_p = 0.0
        while True:
            changes += 1
            if changes > max_changes or not gram.ok:
                return None
            w = gram.solve(N @ n_p)
            z = n_p - N.T @ w
            curvature = float(n_p @ z)
            full = slack / curvature if curvature > _TINY else np.inf
            w_in, u_in = w[m_eq:], u[m_eq:]
            leaving = np.flatnonzero(w_in > _TINY)
            ratios = np.maximum(u_in[leaving], 0.0) / w_in[leaving]
            partial = ratios.min(initial=np.inf)
            if not (np.isfinite(full) or np.isfinite(partial)):
                return None  # infeasible: nothing moves the violated constraint
            t = min(full, partial)
            x = x - t * z
            u = u - t * w
            u_p += t
            slack -= t * curvature
            if full <= partial:
                work.append((p, sign))
                u = np.append(u, u_p)
            else:
                k = int(leaving[np.argmin(ratios)])
                del work[k]
                u = np.delete(u, m_eq + k)
            N = rows()
            gram = GramSolver(N)
            if full <= partial:
                break
    hi, lo = np.zeros(B.shape[0], bool), np.zeros(B.shape[0], bool)
    for i, s in work:
        (hi if s > 0 else lo)[i] = True
    return hi, lo
