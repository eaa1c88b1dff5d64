"""The lifted problem's fixed data on the host, in float64: the stacked matrices
(dense, or sparse CSR) and what the right-hand sides lose in float32.

Computed from the constraints' pieces (`LiftedPieces`) rather than from the
arrays a `LiftedProblem` stores, which are in JAX's default precision.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._linalg.sparse import vstack
from . import blocks
from .parameter import Parameter
from .pieces import LiftedPieces, dense_piece, rows_of, size_of


def host_data(
    pieces: LiftedPieces, dim: int, sparse: bool = False
) -> tuple[Any, Any, np.ndarray | None, np.ndarray]:
    """`(E, C, q, per_instance)`: the matrices in float64, stacked in
    `LiftedProblem`'s row order, with zero rows where they are `Parameter`s; the
    equality right-hand side `q` (`None` if it has a `Parameter`); and which rows
    of $(E; C)$ are `Parameter`s. With `sparse`, `E` and `C` are
    `scipy.sparse.csr_matrix`, and no matrix may be a `Parameter`.

    Computed from the pieces rather than from the stored arrays, which are in
    JAX's default precision.
    """
    cones, _ = blocks.layout(list(pieces.cones))
    E = [E for E, _ in pieces.eq]
    C = [C for C, _, _ in pieces.ineq] + [M for b in cones for M in b.rows]
    per_instance = [np.full(rows_of(M), isinstance(M, Parameter)) for M in E + C]
    if sparse:
        if any(isinstance(M, Parameter) for M in E + C):
            raise ValueError(
                "Projector(affine_form='sparse'): sparse matrices are fixed; a "
                "matrix Parameter (per-instance matrix) cannot be combined with "
                "them yet. Pass the fixed matrices dense, or make every matrix "
                "fixed."
            )
        E = vstack(E) if E else vstack([np.zeros((0, dim))])
        C = vstack(C) if C else vstack([np.zeros((0, dim))])
    rhs = [b for _, b in pieces.eq]
    q = None
    if not any(isinstance(b, Parameter) for b in rhs):
        q = np.concatenate([np.zeros(0)] + [np.asarray(b, np.float64) for b in rhs])
    return (
        E if sparse else _stack(E, dim),
        C if sparse else _stack(C, dim),
        q,
        np.concatenate([np.zeros(0, bool), *per_instance]),
    )


def host_rhs_low(pieces: LiftedPieces) -> tuple[np.ndarray, np.ndarray]:
    """What the fixed right-hand sides $(q, 0, -o)$ of the rows $(E; C)$, and the
    simplex totals, lose when rounded to float32, in `LiftedProblem`'s order
    (zero for the inequality rows, which have none, and for `Parameter`s).

    **Returns:** `(rows, totals)`, each $v - \\mathrm{fl}_{32}(v)$ in float64.
    """
    cones, _ = blocks.layout(list(pieces.cones))

    def low(v, size):
        if isinstance(v, Parameter):
            return np.zeros(size)
        v = np.broadcast_to(np.asarray(v, np.float64).reshape(-1), (size,))
        return v - v.astype(np.float32).astype(np.float64)

    parts = [low(b, rows_of(E)) for E, b in pieces.eq]
    parts += [np.zeros(rows_of(C)) for C, _, _ in pieces.ineq]
    parts += [-low(o, size_of(o)) for b in cones for o in b.offset]
    totals = [low(b.total, 1) for b in cones if b.cone.has_total]
    return np.concatenate([np.zeros(0), *parts]), np.concatenate([np.zeros(0), *totals])


def _stack(matrices, dim: int) -> np.ndarray:
    """Stack matrix pieces in float64, a `Parameter`'s rows as zeros."""
    if not matrices:
        return np.zeros((0, dim))
    return np.concatenate(
        [
            np.zeros((rows_of(M), dim))
            if isinstance(M, Parameter)
            else dense_piece(M).reshape(-1, dim)
            for M in matrices
        ]
    )
