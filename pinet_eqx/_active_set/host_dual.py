"""Goldfarb and Idnani's dual active-set method for the sparse polish, on one
factorisation bordered by the working set's changes.

For the projection $\\min_y \\tfrac12 \\|y - r\\|^2$ subject to $E y = q$ and
bounds on the rows of $G = [I; C]$ (each bound a constraint of its own), it
starts at the projection onto a face where every multiplier has its sign (the
face given, less the constraints whose multipliers have the wrong sign) and
adds violated constraints one at a time, the most violated first. Each is
approached along the direction that keeps the working set's constraints
tight, with a step that stops where a working multiplier reaches zero (that
constraint leaves, and the step goes on) or where the new constraint becomes
tight (it joins). Every multiplier stays non-negative, so each point is the
projection onto the set of its working constraints, and the objective rises
strictly with each addition: the method ends after finitely many changes
(Goldfarb and Idnani, 1983, for a positive definite Hessian, here the
identity). Units with equal bounds stay equalities throughout: their
multipliers may take either sign.

Each working set is solved on the starting face's factorisation bordered by
the changes since (`_host_working.WorkingSet`): a change costs a few solves
with that factor (each about a fortieth of a factorisation on ACTIVSg2000).

It returns the flags of its final working set, whose face the polish's rounds
(`_host_polish`) then solve and certify.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .host_working import TINY, WorkingSet

# Changes of the working set before giving up. Not less: the two trained
# case1354pegase raw outputs of `tests/test_grids.py` need about 1,630 from
# the interior-point method's face, while some instances fail after 1,000-3,000
# (ACTIVSg2000 proxies, case9241pegase at 100 times the spread).
MAX_CHANGES = 3000
# ... and from a neighbour's face (`_host_neighbours`), before the polish
# goes on to its interior-point method: 90 % of a trained ACTIVSg2000 proxy's
# test hours take fewer from the nearest earlier hour's face, at about 1 ms a
# change there, where the interior-point method takes some 60 ms.
WARM_CHANGES = 100
# ... and not at all where the neighbour's face leaves more than this many
# constraints violated: on those hours it took 100-160 changes (median).
WARM_VIOLATED = 40
# Every this many joined rows, the point is solved afresh on the working face
# (`WorkingSet.restart`): the steps' rounding had sent a trained
# case1354pegase raw output's point off, in its 1,500th change.
_RESTART = 8


def working_face(
    pattern: Any,
    r,
    q,
    lower,
    upper,
    hi,
    lo,
    max_changes: int = MAX_CHANGES,
    max_violated: int | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The flags `(hi, lo)` of the constraints binding at the projection of `r`
    (coordinates of $y$, then the rows of `C`: `_host_polish`'s layout), or
    `None` where the method fails (an infeasible set, a singular face or
    `max_changes`).

    **Arguments:**

    - `pattern`: the set's `_host_kkt.KKTPattern` (its unit rows).
    - `r`: the point projected; `q` the equality right-hand side.
    - `lower`, `upper`: the bounds of $[y; C y]$, infinite where absent.
    - `hi`, `lo`: the starting flags (upper and lower bounds); the closer
        their face is to the projection's, the fewer changes.
    - `max_changes`: the most working-set changes.
    - `max_violated`: the most constraints that the starting face's projection
        may violate (each costs a change or more; `None`: any number);
        `None` is returned if it violates more.
    """
    work = WorkingSet(pattern, r, q, lower, upper, hi, lo)
    if not work.release():
        return None
    changes = added = 0
    x = work.point()
    while True:
        violated = _most_violated(work, x, None if changes else max_violated)
        if violated is None:
            return work.flags()
        if violated is False:
            return None
        p, s_p, slack = violated  # slack: how far it is violated
        n_p = s_p * _row(pattern.G, p)
        u_p = 0.0
        while True:
            changes += 1
            if changes > max_changes:
                return None
            w0, wb, first = work.solve(work.N0 @ n_p, work.RA[: work.k] @ n_p)
            z = n_p - work.transpose_times(w0, wb)
            curvature = float(n_p @ z)
            full = slack / curvature if curvature > TINY else np.inf
            partial, leaving = work.ratio_test(w0, wb)
            if not (np.isfinite(full) or np.isfinite(partial)):
                # Infeasible (nothing moves the violated constraint), unless
                # the bordered solves lost their accuracy: then once more on
                # a fresh factor.
                if work.fold():
                    changes -= 1
                    continue
                return None
            t = min(full, partial)
            x = x - t * z
            work.u0, work.ub = work.u0 - t * w0, work.ub - t * wb
            u_p += t
            slack -= t * curvature
            if full <= partial:
                if not work.enter(p, s_p, n_p, u_p, first):
                    return None
                break
            if not work.leave(leaving):
                return None
        added += 1
        if not added % _RESTART:
            x = work.restart(x)


def _most_violated(work: WorkingSet, x, most: int | None = None):
    """The constraint outside the working set that `x` violates most, as
    `(row, sign, violation)`; `None` where none is violated (to 1e-9
    relative), or `False` where more than `most` are."""
    value = work.P.G @ x
    tol = 1e-9 * (1.0 + np.abs(value))
    over = np.where(np.isfinite(work.up_n), value - work.up_n, -np.inf)
    under = np.where(np.isfinite(work.lo_n), work.lo_n - value, -np.inf)
    over[work.in_work] = under[work.in_work] = -np.inf
    excess = np.maximum(over, under)
    if most is not None and np.count_nonzero(excess > tol) > most:
        return False
    p = int(np.argmax(excess))
    if excess[p] <= tol[p]:
        return None
    return p, 1.0 if over[p] >= under[p] else -1.0, float(excess[p])


def _row(G: Any, p: int) -> np.ndarray:
    """Row `p` of the CSR `G`, dense (without scipy's indexing, which costs a
    quarter of a change)."""
    out = np.zeros(G.shape[1])
    start, stop = G.indptr[p], G.indptr[p + 1]
    out[G.indices[start:stop]] = G.data[start:stop]
    return out
