"""Parallel rows of the polish's inequality rows, merged: grid lines in
parallel give rows of $C$ equal up to a factor, of which only the tighter
bound can bind. Both on one face make it singular, and the active-set rounds
would swap them for ever; merged, each direction carries its tightest bounds,
which is the same set (`_host_polish`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp


def parallel_rows(C: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """Rows of `C` up to a nonzero factor, merged: `(C_unique, group, factor)`
    with row $i$ of `C` equal to `factor[i]` times row `group[i]` of `C_unique`.

    Parallel lines of a grid give proportional rows with different limits, of
    which only the tighter can bind; both on one face make it singular, and
    the rounds would swap them for ever. Merged, each direction carries its
    tightest bounds (`merge_bounds`): the same set.
    """
    C = sp.csr_matrix(C)
    C.sort_indices()
    keys, group = {}, np.empty(C.shape[0], np.int64)
    factor = np.ones(C.shape[0])
    for i in range(C.shape[0]):
        lo, hi = C.indptr[i], C.indptr[i + 1]
        if hi == lo:
            key = ()
        else:
            factor[i] = C.data[lo]
            values = np.round(C.data[lo:hi] / factor[i], 12)
            key = (C.indices[lo:hi].tobytes(), values.tobytes())
        group[i] = keys.setdefault(key, len(keys))
    first = np.full(len(keys), -1)
    for i in range(C.shape[0] - 1, -1, -1):
        first[group[i]] = i
    C_unique = sp.diags(1 / factor[first]) @ C[first]
    return sp.csr_matrix(C_unique), group, factor


def merge_bounds(lower, upper, group, factor, k):
    """The tightest bounds of each merged direction (see `parallel_rows`), for
    a batch of bound rows: row $i$'s bounds divided by its factor (swapped
    where it is negative)."""
    lo = np.where(factor > 0, lower, upper) / factor
    up = np.where(factor > 0, upper, lower) / factor
    n = lower.shape[0]
    merged_lo = np.full((n, k), -np.inf)
    merged_up = np.full((n, k), np.inf)
    for b in range(n):
        np.maximum.at(merged_lo[b], group, lo[b])
        np.minimum.at(merged_up[b], group, up[b])
    return merged_lo, merged_up


def unmerged_flags(hi, lo, lower, upper, group, factor, merged_lo, merged_up):
    """The flags of the merged rows (see `parallel_rows`) carried back to the
    rows of `C`, one instance: of each merged row's group, the first row whose
    own bound (`lower`, `upper`) is the one that binds carries the flag, on
    the side that `factor`'s sign gives. Its parallel rows stay unflagged:
    flagged too, they would make the face's rows dependent."""
    row_lo = np.where(factor > 0, lower, upper) / factor
    row_up = np.where(factor > 0, upper, lower) / factor
    out_hi, out_lo = np.zeros(group.shape, bool), np.zeros(group.shape, bool)
    for flags, bound, merged, same, other in (
        (hi, row_up, merged_up, out_hi, out_lo),
        (lo, row_lo, merged_lo, out_lo, out_hi),
    ):
        candidates = np.flatnonzero(flags[group] & (bound == merged[group]))
        _, first = np.unique(group[candidates], return_index=True)
        chosen = candidates[first]
        positive = factor[chosen] > 0
        same[chosen[positive]] = True
        other[chosen[~positive]] = True
    return out_hi, out_lo
