"""Linear equality constraints."""

from __future__ import annotations

import numpy as np
from jaxtyping import Float

from .._problem.parameter import shape_of
from .._problem.pieces import LiftedPieces
from .base import AbstractConstraint, MatrixData, VectorData, as_matrix, as_vector


class Equality(AbstractConstraint):
    """The affine set $\\{y \\in \\mathbb{R}^d : A y = b\\}$.

    Dependent rows are allowed when their right-hand sides are consistent; the
    projector keeps a maximal independent subset. A fixed inconsistent system is
    rejected when the projector is built.

    **Arguments:**

    - `A`: matrix of shape `(m, d)`, fixed and finite, or a
        `Parameter(name, shape=(m, d))` for a per-instance matrix $A(x)$ (which
        must then have full row rank).
    - `b`: vector of shape `(m,)`, or a `pinet_eqx.Parameter` whose value is passed
        per instance.
    """

    A: Float[np.ndarray, "m d"] | MatrixData
    b: VectorData

    def __init__(self, A, b):
        self.A = as_matrix(A, "A", "Equality(A, b)", rows_constrain=True)
        self.b = as_vector(b, "b", "Equality(A, b)", shape_of(self.A)[0])

    def dim(self) -> int | None:
        return shape_of(self.A)[1]

    def lift(self, dim: int) -> LiftedPieces:
        return LiftedPieces(eq=((self.A, self.b),))
