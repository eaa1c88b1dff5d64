"""The active-set rounds of the sparse polish (`_host_polish`): from a face's
flags, the face is solved, rows whose multipliers have the wrong sign leave it
and violated rows join it, until no row moves (a primal-dual active-set
method), which certifies the point as the projection in float64.
"""

from __future__ import annotations

import numpy as np

from .host_kkt import face_projection, gram_face_projection


def face_rounds(
    E,
    C,
    r,
    q,
    bounds,
    hi,
    lo,
    max_rounds,
    max_moves=None,
    *,
    pattern=None,
    exact=False,
    release_one=False,
    saddle=False,
    explore=False,
):
    """Up to `max_rounds` active-set rounds from the flags `hi`, `lo`, where
    `bounds` is `(lb_y, ub_y, lb_w, ub_w)`, given up once a round would move
    more than `max_moves` rows (if given) or return to a face it has left:
    `(y, fail, hi, lo, mult, far)`, the last face's point, flags and
    multipliers (`None` if no face was solved), and whether `max_moves`
    stopped them (the face is far from the projection's); with `release_one`,
    each round releases one row only (`_largest`).

    With the set's `pattern`, each face is solved on that fixed factor
    pattern (`_host_kkt.face_projection`: a numeric refactorisation, where a
    Gram matrix's LU redoes its ordering and symbolic work), and by its own
    Gram matrix (`gram_face_projection`) only where that does not converge
    (inconsistent or nearly dependent rows). The pattern's faces are accurate
    to about 1e-8, enough for float32 outputs; with `exact` (float64) the
    settled face is checked by its Gram matrix. With `saddle` (a second try)
    every face is solved by its Gram matrix, and nearly dependent ones by the
    saddle-point system: on a face with a weakly active bound (a tie: its
    multiplier about zero), the pattern's 1e-8 can flip that multiplier's
    sign, and the rounds then release and add the bound in turn.

    With `explore`, the pattern's steps choose the moves even where they do
    not meet the face (`_face`); only a settled face needs its own solve. Far
    from the set, rounds pass many such faces, whose Gram factorisations cost
    more than the pattern's refactorisations."""
    lb_y, ub_y, lb_w, ub_w = bounds
    hi, lo = hi.copy(), lo.copy()
    upper, lower = np.concatenate([ub_y, ub_w]), np.concatenate([lb_y, lb_w])
    # A flag only counts where its bound is finite. Equal bounds (a unit whose
    # minimum is its maximum) pin their coordinate or row on every face, with a
    # multiplier of either sign (flagged on one side, its sign would release it).
    fixed = lower == upper
    hi = (hi & np.isfinite(upper)) | fixed
    lo &= np.isfinite(lower) & ~hi
    y, mult, pattern = r, None, None if saddle else pattern
    seen = {(hi.tobytes(), lo.tobytes())}
    for _ in range(max_rounds + (exact or explore)):
        y, mult, met = _face(E, C, pattern, r, q, hi, lo, lower, upper, saddle, explore)
        if y is None or mult is None:
            return r, 1.0, hi, lo, None, False
        value = np.concatenate([y, C @ y])
        release, add_hi, add_lo = _misplaced(hi, lo, value, mult, lower, upper, fixed)
        moves = np.count_nonzero(release | add_hi | add_lo)
        if not moves and pattern is not None and (exact or not met):
            pattern = None  # settled: confirm on the face's own solve
            continue
        if not moves:
            return y, 0.0, hi, lo, mult, False
        if max_moves is not None and moves > max_moves:
            return y, 1.0, hi, lo, mult, True
        if release_one:
            release = _largest(release, mult)
        if release.any():
            # Release before adding: adding rows to a face that still holds
            # wrongly signed ones can cycle.
            add_hi[:] = add_lo[:] = False
        hi = (hi & ~release) | add_hi
        lo = (lo & ~release) | add_lo
        face = (hi.tobytes(), lo.tobytes())
        if face in seen:  # a cycle: the rounds would only repeat it
            break
        seen.add(face)
    return y, 1.0, hi, lo, mult, False


def _face(E, C, pattern, r, q, hi, lo, lower, upper, saddle, explore) -> tuple:
    """`(y, mult, met)`: the face's point and multipliers on the `pattern`
    if given, and by its own Gram matrix where the pattern's steps do not
    meet it (`met` false) unless `explore` takes those steps as they are."""
    if pattern is not None:
        y, mult, met = face_projection(pattern, r, q, hi, lo, lower, upper)
        if y is not None and (met or explore):
            return y, mult, met
    d = r.shape[0]
    y, mult = gram_face_projection(E, C, r, q, hi, lo, upper, lower, d, saddle)
    return y, mult, True


def _misplaced(hi, lo, value, mult, lower, upper, fixed) -> tuple:
    """`(release, add_hi, add_lo)` for a face's point `value` (coordinates,
    then rows) and multipliers `mult`: a wrongly signed multiplier, or a
    flagged row off its bound, to release; a violated row, to add."""
    tol = 1e-9 * (1.0 + np.abs(value))
    off = (hi | lo) & (np.abs(value - np.where(hi, upper, lower)) > tol)
    release = ((hi & (mult < -tol)) | (lo & (mult > tol))) & ~fixed
    if not release.any():
        # A row off its bound, with every sign right, is fixed by the others
        # (dependent rows: lines in series, whose flows differ by the loads
        # between them). With wrong signs, those go first: the dependent row
        # that does not bind is among them.
        release = off
    add_hi = ~hi & ~lo & (value > upper + tol)
    add_lo = ~hi & ~lo & (value < lower - tol)
    return release, add_hi, add_lo


def _largest(release, mult) -> np.ndarray:
    """Of the rows `release` flags, the one of the largest multiplier `mult`
    (a primal active-set step). On a face one row too large whose rows are
    dependent (generators pinned at their bounds beside the balance rows), the
    extra row's pull makes many others' multipliers wrongly signed, and
    releasing them all at once leaves the face far behind."""
    out = np.zeros_like(release)
    if release.any():
        out[np.argmax(np.where(release, np.abs(mult), -np.inf))] = True
    return out
