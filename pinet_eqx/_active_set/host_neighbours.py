"""Starting faces for the sparse polish from the batch's own solved instances.

Instances of one batch that share a set of rows differ in their parameters
(loads) and raw outputs, and where their parameters are close, so are their
projections' faces: a trained proxy's hours differ by a few flags. An
instance's dual active-set method (`_host_dual`) from the face of its nearest
solved neighbour, by the Euclidean distance of their parameters, changes a few
rows where the interior-point method would take its ~20 factorisations.

The neighbour of instance $i$ is the nearest among instances $0, \\ldots, i - t$,
$t$ the host pool's threads, which take the instances in order: by the time
$i$ starts, its neighbour has started, and it is usually done. Choosing by
index, not by what has finished, keeps the result independent of timing.

A neighbour's face is only taken where the raw outputs are closer to each
other than the neighbour's raw output is to its projection. The projection
moves no further than the raw output, so a face further away would be a
guess: raw outputs with independent noise (a plain projector's users) sit
$\\sqrt 2$ times their distance apart, where a trained proxy's neighbouring
hours sit a tenth of it (median, ACTIVSg2000).
"""

from __future__ import annotations

import threading

import numpy as np


class NeighbourFaces:
    """The certified faces of one batch's instances, each waited for by the
    instance that starts from it.

    **Arguments:**

    - `keys`: one row of parameters per instance (infinite entries are
        ignored).
    - `raw`: the raw outputs, one row per instance.
    - `lag`: the host pool's threads (see the module docstring).
    """

    def __init__(self, keys: np.ndarray, raw: np.ndarray, lag: int):
        n = keys.shape[0]
        keys = np.where(np.isfinite(keys), keys, 0.0)
        keys = keys[:, np.ptp(keys, axis=0) > 0] if n > 1 else keys
        square = np.einsum("ij,ij->i", keys, keys)
        # Squared distances by the Gram matrix: one product for the batch.
        dist = square[:, None] + square[None, :] - 2.0 * keys @ keys.T
        earlier = np.arange(n)[None, :] <= np.arange(n)[:, None] - lag
        dist = np.where(earlier, dist, np.inf)
        self.neighbour = np.where(
            np.isfinite(dist).any(axis=1), np.argmin(dist, axis=1), -1
        )
        self._raw = raw
        self._faces: list = [None] * n
        self._reach = np.zeros(n)
        self._done = [threading.Event() for _ in range(n)]

    def ready(self, i: int) -> bool:
        """Whether instance `i`'s neighbour (if any) is done."""
        j = self.neighbour[i]
        return bool(j < 0 or self._done[j].is_set())

    def take(self, i: int):
        """The face `(hi, lo)` that instance `i` starts from, waiting for its
        neighbour; `None` where it has none, that one failed, or it is too far
        (see the module docstring)."""
        j = self.neighbour[i]
        if j < 0:
            return None
        self._done[j].wait()
        if not np.linalg.norm(self._raw[i] - self._raw[j]) < self._reach[j]:
            return None
        return self._faces[j]

    def put(self, i: int, solved) -> None:
        """Instance `i`'s certified face and point, `(hi, lo, y)` (`None`
        where it failed)."""
        if solved is not None:
            self._faces[i] = solved[:2]
            self._reach[i] = np.linalg.norm(self._raw[i] - solved[2])
        self._done[i].set()
