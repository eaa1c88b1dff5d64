"""The saddle-point systems of active faces, batched, on the host.

The exact derivative of a sparse polyhedral projection solves, per instance,
the saddle-point system of its active face's rows (`SaddleSolver`), in float64.
Every instance has a face of its own, so each is factorised afresh; a batch's
instances run in the worker processes where it is large enough
(`host_processes`: much of an instance's work is scipy's Python around the
factorisation, which holds the GIL), else in the host pool's threads.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from . import host_processes
from .host_solve import ByContent, SaddleSolver, instances, pool, saddle_rank


def masked_saddle(M, free, scale, active, r, s):
    """The saddle-point system of a face (`SaddleSolver`), masked: over the
    `free` coordinates, with the `active` rows of `M` there scaled by `scale`
    ($M_s$); the identity on the pinned coordinates and the other rows, so
    $x = r$ and $\\zeta = s$ there.

    **Arguments:**

    - `M`: the stacked rows, a `SparseMatrix` (fixed: not batched); its
        `remainder`, if kept, is added back, so the rows are float64's.
    - `free`: 1 on the free coordinates of $y$, 0 on the pinned ones.
    - `scale`: the rows' scales (any nonzero value on the active rows in the
        system; rows with scale 0 are left out).
    - `active`: the rows in the system (boolean).
    - `r`, `s`: the right-hand side.

    **Returns:** `(x, zeta)`, in the dtype of `r`, computed in float64 and
    rounded once: a cost constant on the set ($r$ in the row space of $M_s$)
    then projects to rounding of its float64, not float32, computation. It
    runs through `jax.pure_callback` (one call per batch), so it works under
    `jit` and `vmap` on every backend; the map is linear and symmetric, meant
    as the `solve` of a `jax.lax.custom_linear_solve`, which supplies its
    derivatives.
    """
    out = (
        jax.ShapeDtypeStruct(r.shape, r.dtype),
        jax.ShapeDtypeStruct(s.shape, r.dtype),
    )
    remainder = jnp.zeros_like(M.values) if M.remainder is None else M.remainder
    return jax.pure_callback(
        lambda *a: _host_saddle(M.shape, *a),
        out,
        M.rows,
        M.cols,
        M.values,
        remainder,
        free,
        scale,
        active,
        r,
        s,
        vmap_method="expand_dims",
    )


def _host_saddle(shape, rows, cols, values, remainder, free, scale, active, r, s):
    m, d = shape
    entries = (rows, cols, values, remainder)
    build = functools.partial(_saddle_rows, shape)
    key, rows_rank = _SADDLE_ROWS.get(shape, entries, build)
    batch, n, per_instance = instances(r, s, free, active)
    frees, scales = per_instance(free, d) > 0, per_instance(scale, m)
    actives = per_instance(active, m) & (scales != 0)
    xs = per_instance(r, d).astype(np.float64)
    zs = per_instance(s, m).astype(np.float64)
    dtype = np.asarray(r).dtype
    # Instances with an active row (the others' x is r and zeta is s).
    faces = [
        (i, np.flatnonzero(actives[i]), np.flatnonzero(frees[i]))
        for i in range(n)
        if actives[i].any()
    ]

    def task(k):
        i, used, cols_i = faces[k]
        face = (used, cols_i, scales[i, used], xs[i, cols_i], zs[i, used], dtype)
        return _face_solve, face

    def done(k, out):
        i, used, cols_i = faces[k]
        xs[i, cols_i], zs[i, used] = out

    def one(k):
        done(k, _face_solve(rows_rank, *task(k)[1]))

    # Worker processes where the batch is large enough, else threads (SuperLU
    # releases the GIL; JAX waits on this callback). Same results either way.
    # As numpy arrays: the callback may pass JAX arrays, which a worker (float64
    # off) would unpickle as such, and `_saddle_rows` would then cast to float32.
    context = (_saddle_rows, (shape, *(np.asarray(a) for a in entries)))
    in_processes = host_processes.wanted(len(faces)) and host_processes.run(
        len(faces), key, context, task, lambda k: True, done
    )
    if not in_processes:
        list(pool().map(one, range(len(faces))))
    return (
        xs.reshape(batch + (d,)).astype(dtype),
        zs.reshape(batch + (m,)).astype(dtype),
    )


def _face_solve(rows_rank, used, cols_i, scales, r, s, dtype) -> tuple:
    """`saddle_solve` of the face of the rows `used` (scaled by `scales`) over
    the coordinates `cols_i`, on the `(M, rank)` of `_saddle_rows`."""
    M, rank = rows_rank
    d = M.shape[1]
    A = sp.diags(scales.astype(np.float64)) @ M[used][:, cols_i]
    order = rank[np.concatenate([cols_i, d + used])]
    return saddle_solve(A, order, r, s, dtype)


def saddle_solve(A: Any, rank: np.ndarray, r, s, dtype) -> tuple[Any, Any]:
    """`SaddleSolver(A, rank).solve(r, s)`, its result representable in
    `dtype`. Rows dependent up to rounding can factorise with the smallest
    shift on pivots of rounding size, and the solve then returns garbage
    (values past 1e45 for a right-hand side below 1e-4, in a proxy's training
    on ACTIVSg2000, whose parameters then became NaN): where a value overflows
    `dtype`, the rows are taken as dependent (the larger shifts)."""
    x, z = SaddleSolver(A, rank).solve(r, s)
    largest = np.finfo(dtype).max
    if not max(np.abs(x).max(initial=0.0), np.abs(z).max(initial=0.0)) < largest:
        x, z = SaddleSolver(A, rank, dependent=True).solve(r, s)
    return x, z


# The derivative's rows and their ordering, by their entries.
_SADDLE_ROWS = ByContent()


def _saddle_rows(shape, rows, cols, values, remainder) -> tuple[Any, np.ndarray]:
    """The float64 CSR rows, `remainder` added back, and their `saddle_rank`."""
    exact = values.astype(np.float64) + remainder.astype(np.float64)
    M = sp.csr_matrix((exact.ravel(), (rows.ravel(), cols.ravel())), shape)
    return M, saddle_rank(M)
