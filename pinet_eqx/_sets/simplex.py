"""Simplex constraints on a subset of coordinates."""

from __future__ import annotations

import numpy as np
from jaxtyping import Int

from .._problem.cones import ScaledSimplex
from .._problem.parameter import Parameter
from .._problem.pieces import ConeBlock, LiftedPieces
from .base import AbstractConstraint, VectorData
from .cones import as_scalar


class Simplex(AbstractConstraint):
    """The scaled simplex $\\{y : y_S \\ge 0,\\ \\sum_{i \\in S} y_i = r\\}$.

    The projector lifts it with $w = y_S$ and projects $w$ onto the simplex exactly
    (sort-based), rather than splitting it into an equality and a box.

    **Arguments:**

    - `indices`: distinct integer indices $S$ into $y$ (or a boolean mask of shape
        `(d,)`).
    - `total`: $r \\ge 0$, a scalar or a scalar `Parameter` (default 1).
    """

    indices: Int[np.ndarray, " k"]
    total: VectorData
    size: int | None

    def __init__(self, indices, total=1.0):
        owner = "Simplex(indices, total)"
        idx = np.asarray(indices)
        self.size = None
        if idx.dtype == np.bool_:
            if idx.ndim != 1:
                raise ValueError(f"{owner}: a boolean `indices` mask must be 1-D.")
            self.size = int(idx.shape[0])
            idx = np.flatnonzero(idx)
        if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(
                f"{owner}: `indices` must be a non-empty 1-D array of integer indices "
                f"(or a boolean mask), got dtype {idx.dtype} and shape {idx.shape}."
            )
        if np.any(idx < 0):
            raise ValueError(
                f"{owner}: `indices` must be non-negative, got {int(idx.min())}."
            )
        if np.unique(idx).size != idx.size:
            raise ValueError(
                f"{owner}: `indices` contains duplicates; each coordinate may appear "
                "once."
            )
        self.indices = idx.astype(np.int64)
        self.total = as_scalar(total, "total", owner)
        if not isinstance(self.total, Parameter) and self.total[0] < 0:
            raise ValueError(
                f"{owner}: `total` must be >= 0 (got {float(self.total[0])}); the "
                "simplex would be empty."
            )

    def dim(self) -> int | None:
        return self.size

    def lift(self, dim: int) -> LiftedPieces:
        if int(self.indices.max()) >= dim:
            raise ValueError(
                f"Simplex(indices, total): index {int(self.indices.max())} is out of "
                f"range for vectors of size {dim}."
            )
        k = self.indices.size
        selector = np.zeros((k, dim))
        selector[np.arange(k), self.indices] = 1.0
        block = ConeBlock(
            cone=ScaledSimplex(),
            rows=(selector,),
            offset=(np.zeros(k),),
            size=k,
            total=self.total,
        )
        return LiftedPieces(cones=(block,))
