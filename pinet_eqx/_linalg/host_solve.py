"""Direct sparse solves with the Gram matrix of constraint rows, on the host.

Badly scaled sparse sets (power grids: susceptances of $10^4$ beside line
limits of 1) defeat conjugate gradients on their row systems, where a sparse
LU factorisation of $K = M M^\\top$ in float64 (SuperLU, with a minimum-degree
ordering of $K$) is cheap: a few times the rows' nonzeros. Two users share it:
the factorisation of the sparse affine projection (`_sparse_affine`) and the
polish of sparse polyhedral sets (`_host_polish`). The active-set derivative
of those sets solves its faces' saddle-point systems instead
(`SaddleSolver`, called per instance by `host_saddle`), whose conditioning
is the rows', not their Gram matrix's.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

# Regularisation of a face's M M^T (rows of unit length), removed again by
# refinement steps: nearly dependent active rows then still give a usable solve.
_REGULARISATION = 1e-12
# Refinement steps against the unshifted K (see `GramSolver.solve`).
_REFINE_STEPS = 3
# The shift of `SaddleSolver`'s quasi-definite matrix: its factor's accuracy is
# M's, not K's, so it can be far smaller than K's (see `SaddleSolver`).
_SADDLE_SHIFT = 1e-16
# The shifts tried in turn, relative to the largest squared row norm, where
# exactly dependent rows (more active rows than free coordinates) leave the tiny
# one lost in rounding and SuperLU meets a zero pivot: each must stay above the
# rounding of the Schur complement's entries (eps times them), and refinement
# removes it again, at a rate of about shift / sigma^2 for M's smallest nonzero
# singular value sigma, so the smallest that factorises is best.
_DEPENDENT_SHIFTS = (1e-13, 1e-11, 1e-9)
# The most refinement steps with such a shift; they stop once the corrections
# of x no longer halve.
_DEPENDENT_REFINE_STEPS = 30


class Counter:
    """A count of host factorisations, for tests and benchmarks that bound
    the work of a finish by a count rather than a time (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0

    def add(self, n: int = 1) -> None:
        with self._lock:
            self.count += n

    def reset(self) -> int:
        """Sets the count to zero; returns what it was."""
        with self._lock:
            count, self.count = self.count, 0
        return count


# Every sparse factorisation of the host's finishes (`GramSolver`,
# `SaddleSolver`, `_host_ipm`), summed over instances.
FACTORISATIONS = Counter()


class Stages:
    """How many times each named stage of a host finish settled it, for
    tests and benchmarks that attribute a finish's work (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: collections.Counter = collections.Counter()

    def add(self, stage: str) -> None:
        with self._lock:
            self._counts[stage] += 1

    def reset(self) -> dict[str, int]:
        """Clears the counts; returns what they were."""
        with self._lock:
            counts, self._counts = dict(self._counts), collections.Counter()
        return counts


class ByContent:
    """Host forms of fixed matrices, built once per set of their arrays' contents
    (a training run passes the same matrices at every step); the last `kept`."""

    def __init__(self, kept: int = 4):
        self._store: dict[bytes, Any] = {}
        self._kept = kept

    def get(self, shapes: Any, arrays: Any, build: Callable[..., Any]) -> tuple:
        """`(key, value)`: a digest of `shapes` and the arrays' dtypes and
        entries, and `build(*arrays)` (contiguous) or its stored value for
        equal inputs."""
        arrays = [np.ascontiguousarray(a) for a in arrays]
        digest = hashlib.blake2b(repr(shapes).encode(), digest_size=16)
        for a in arrays:
            digest.update(a.dtype.str.encode())
            digest.update(a.tobytes())
        key = digest.digest()
        if key not in self._store:
            if len(self._store) >= self._kept:
                self._store.pop(next(iter(self._store)))
            self._store[key] = build(*arrays)
        return key, self._store[key]


def instances(*arrays) -> tuple[tuple[int, ...], int, Callable]:
    """`(batch, n, rows)` for a callback's per-instance arguments, each with one
    trailing axis: their broadcast batch shape, its size, and `rows(a, size)`,
    which broadcasts `a` to that batch and flattens it to `(n, size)`."""
    batch = np.broadcast_shapes(*(np.shape(a)[:-1] for a in arrays))
    n = int(np.prod(batch))

    def rows(a, size: int) -> np.ndarray:
        return np.broadcast_to(np.asarray(a), batch + (size,)).reshape(n, size)

    return batch, n, rows


def row_norms(M: Any) -> np.ndarray:
    """The Euclidean norm of each row of the sparse `M`."""
    return np.sqrt(np.asarray(M.multiply(M).sum(axis=1)).ravel())


def unit_rows(M: Any) -> tuple[Any, np.ndarray]:
    """`(M_s, norms)`: the rows of the sparse `M` scaled to unit length, and
    their norms (1 for a zero row, which stays zero)."""
    norms = row_norms(M)
    norms = np.where(norms > 0, norms, 1.0)
    return sp.csr_matrix(sp.diags(1 / norms) @ M), norms


def gram_lu(M: Any) -> Any:
    """SuperLU of $M M^\\top$ (`scipy.sparse.linalg.splu`); raises SuperLU's
    `RuntimeError` where it is exactly singular."""
    return _splu(M @ M.T)


def _splu(K: Any) -> Any:
    return spla.splu(
        sp.csc_matrix(K),
        permc_spec="MMD_AT_PLUS_A",
        diag_pivot_thresh=0.0,
        options=dict(SymmetricMode=True),
    )


class GramSolver:
    """Solves with $K = M M^\\top$ for rows $M$ of unit length (float64, host),
    through the LU of $K + 10^{-12} I$ and `_REFINE_STEPS` steps of iterative
    refinement against $K$ itself, which remove the shift's error.

    `lu_solve` applies the shifted factor alone; `ok` is `False` where even
    the shifted $K$ is singular (`solve` then returns NaN)."""

    def __init__(self, M: Any):
        self.K: Any = sp.csr_matrix(M @ M.T)
        FACTORISATIONS.add()
        try:
            shift = _REGULARISATION * sp.identity(M.shape[0], format="csr")
            self._lu = _splu(self.K + shift)
        except RuntimeError:
            self._lu = None

    @property
    def ok(self) -> bool:
        return self._lu is not None

    def lu_solve(self, rhs: np.ndarray) -> np.ndarray:
        if self._lu is None:
            return np.full_like(rhs, np.nan)
        return self._lu.solve(rhs)

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        x = self.lu_solve(rhs)
        for _ in range(_REFINE_STEPS):
            x = x + self.lu_solve(rhs - self.K @ x)
        return x


class SaddleSolver:
    """Solves the saddle-point system of rows $M$ (float64, host),

    $$\\begin{bmatrix} I & M^\\top \\\\ M & 0 \\end{bmatrix}
    \\begin{bmatrix} x \\\\ \\zeta \\end{bmatrix} =
    \\begin{bmatrix} r \\\\ s \\end{bmatrix},\\qquad
    x = r - M^\\top \\zeta,\\quad M M^\\top \\zeta = M r - s,$$

    the projection of $r$ onto $\\{x : M x = s\\}$ and its multipliers,
    through the LU of the quasi-definite matrix with $-\\delta I$,
    $\\delta = 10^{-16}$, in its lower block, and `_REFINE_STEPS` steps of
    iterative refinement against the system itself.

    Its conditioning is that of $M$, not of $M M^\\top$ (its square), so rows
    that are nearly, but not exactly, dependent (a bus whose lines are all
    active, its generators' share of its row small) are still resolved, where
    `GramSolver`'s shifted $M M^\\top$ leaves $x$ visibly off; exactly
    dependent rows keep a component of $\\zeta$ of size $\\delta$, which
    $M^\\top$ maps to nothing. Its factor is larger than the Gram matrix's,
    so it serves where $x$ itself is the result: the derivative.

    Where many rows are exactly dependent (a degenerate face: more active rows
    than free coordinates) the shift of $10^{-16}$ is lost in the rounding of
    the Schur complement, and SuperLU meets an exactly zero pivot. The system
    is then factorised once more with the smallest of
    $\\delta = (10^{-13}, 10^{-11}, 10^{-9}) \\max_i \\|M_i\\|^2$ that
    factorises, and refined against the unshifted system while the corrections
    of $x$ shrink: for a consistent right-hand side $x$ is still the
    projection, the shift only choosing among the $\\zeta$ that give it.
    """

    def __init__(self, M: Any, rank: np.ndarray | None = None, dependent: bool = False):
        """Factorise for the rows `M`. `rank` places its $n + k$ unknowns ($x$,
        then $\\zeta$) in an elimination order, such as the one `saddle_rank`
        computes for a larger system that this one is a part of; its columns
        are factorised in that order, with no ordering of their own (a large
        share of a factorisation's time). Without it, SuperLU orders them
        (COLAMD). `dependent` takes the larger shifts at once (rows known to
        be numerically dependent; so do more rows than columns)."""
        k, n = M.shape
        self._M = sp.csr_matrix(M)
        self._n = n
        if rank is None:
            self._order, self._ordering = np.arange(n + k), "COLAMD"
        else:
            self._order, self._ordering = np.argsort(rank, kind="stable"), "NATURAL"
        self._steps = _REFINE_STEPS
        self._lu: Any = None
        # More rows than unknowns are dependent: the small shift cannot factorise.
        if not dependent and k <= n:
            try:
                self._lu = self._factorise(_SADDLE_SHIFT)
            except RuntimeError:  # "Factor is exactly singular"
                pass
        if self._lu is None:
            largest = row_norms(self._M).max(initial=1.0) ** 2
            self._steps = _DEPENDENT_REFINE_STEPS
            for shift in _DEPENDENT_SHIFTS:
                try:
                    self._lu = self._factorise(shift * largest)
                    break
                except RuntimeError:
                    if shift == _DEPENDENT_SHIFTS[-1]:
                        raise

    def _factorise(self, shift: float) -> Any:
        saddle = sp.csc_matrix(_saddle(self._M, shift))[:, self._order]
        FACTORISATIONS.add()
        # Partial pivoting (SuperLU's default, unlike `_splu`): without it the
        # tiny shift's pivots cost the accuracy this solver exists for.
        return spla.splu(saddle, permc_spec=self._ordering)

    def _solve(self, rhs: np.ndarray) -> np.ndarray:
        out = np.empty_like(rhs)
        out[self._order] = self._lu.solve(rhs)
        return out

    def solve(self, r: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(x, zeta)` of the system above."""
        rhs = np.concatenate([r, s])
        xz = self._solve(rhs)
        last = np.inf
        for _ in range(self._steps):
            x, z = xz[: self._n], xz[self._n :]
            res = rhs - np.concatenate([x + self._M.T @ z, self._M @ x])
            step = self._solve(res)
            xz = xz + step
            if self._steps > _REFINE_STEPS:
                # A larger shift: x's corrections shrink geometrically (the
                # residual reaches its floor first, x's error being amplified
                # by 1 / sigma^2), until they are rounding, which does not.
                size = np.abs(step[: self._n]).max(initial=0.0)
                if size > 0.5 * last:
                    break
                last = size
        return xz[: self._n], xz[self._n :]


def _saddle(M: Any, shift: float = _SADDLE_SHIFT) -> Any:
    k, n = M.shape
    return sp.bmat([[sp.identity(n), M.T], [M, -shift * sp.identity(k)]])


def saddle_rank(M: Any) -> np.ndarray:
    """The position of each unknown of `M`'s saddle-point system ($x$, then
    $\\zeta$) in SuperLU's column ordering of it (COLAMD): restricted to the
    unknowns of a face (some coordinates and rows), an elimination order for
    that face's system, computed once for all of them. COLAMD orders by the
    pattern alone, so the system factorised for it is shifted by the identity:
    quasi-definite, it factorises where all the rows together are dependent
    (case_ACTIVSg25k's, at the tiny shift: "Factor is exactly singular", which
    failed every training step)."""
    return spla.splu(sp.csc_matrix(_saddle(unit_rows(M)[0], 1.0))).perm_c


@functools.cache
def pool() -> ThreadPoolExecutor:
    """The host solves' threads (shared: their tasks run in the order given)."""
    return ThreadPoolExecutor(pool_size())


def usable_cores() -> int:
    """The cores this process may run on (its affinity: `taskset`, containers)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def pool_size() -> int:
    """The host's threads or worker processes: `usable_cores()`, at most 8."""
    return max(1, min(8, usable_cores()))
