"""Coordinate-wise bounds."""

from __future__ import annotations

import numpy as np
from jaxtyping import Bool, Int

from .._problem.lifting import check_bounds_order
from .._problem.parameter import Parameter
from .._problem.pieces import LiftedPieces
from .base import AbstractConstraint, VectorData, as_vector


class Box(AbstractConstraint):
    """The box $\\{y : \\ell_i \\le y_i \\le u_i\\ \\text{for } i \\in S\\}$.

    By default $S$ is every coordinate. To bound only some coordinates, either set
    the other entries of the bounds to $\\mp\\infty$, or pass `mask` (a boolean vector
    over all $d$ coordinates): then `lower` and `upper` have one entry per selected
    coordinate.

    **Arguments:**

    - `lower`: lower bounds (vector, scalar, `Parameter`, or `None` for $-\\infty$).
    - `upper`: upper bounds (vector, scalar, `Parameter`, or `None` for $+\\infty$).
    - `mask`: optional boolean vector of shape `(d,)` selecting the bounded
        coordinates.
    """

    lower: VectorData
    upper: VectorData
    indices: Int[np.ndarray, " k"] | None
    size: int | None

    def __init__(self, lower=None, upper=None, *, mask=None):
        owner = "Box(lower, upper, mask)"
        if lower is None and upper is None:
            raise ValueError(
                f"{owner}: both `lower` and `upper` are None, so the constraint is "
                "vacuous. Pass at least one bound."
            )
        if mask is not None:
            mask_arr: Bool[np.ndarray, " d"] = np.asarray(mask)
            if mask_arr.dtype != np.bool_ or mask_arr.ndim != 1:
                raise ValueError(
                    f"{owner}: `mask` must be a boolean vector of shape (d,), got "
                    f"dtype {mask_arr.dtype} and shape {mask_arr.shape}."
                )
            self.indices = np.flatnonzero(mask_arr)
            self.size = int(mask_arr.shape[0])
            k = int(self.indices.size)
        else:
            self.indices = None
            k = None
            for v in (lower, upper):
                if v is not None and not isinstance(v, Parameter) and np.ndim(v) == 1:
                    k = int(np.shape(v)[0])
            self.size = k
        self.lower = as_vector(lower, "lower", owner, k, allow_inf=-1, fill=-np.inf)
        self.upper = as_vector(upper, "upper", owner, k, allow_inf=1, fill=np.inf)
        check_bounds_order(self.lower, self.upper, owner)

    def dim(self) -> int | None:
        return self.size

    def lift(self, dim: int) -> LiftedPieces:
        indices = np.arange(dim) if self.indices is None else self.indices
        k = indices.size
        lower, upper = self.lower, self.upper
        if not isinstance(lower, Parameter) and lower.ndim == 0:
            lower = np.full((k,), float(lower))
        if not isinstance(upper, Parameter) and upper.ndim == 0:
            upper = np.full((k,), float(upper))
        return LiftedPieces(box=((indices, lower, upper),))
