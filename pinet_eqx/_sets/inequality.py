"""Two-sided affine inequality constraints."""

from __future__ import annotations

import numpy as np
from jaxtyping import Float

from .._problem.lifting import check_bounds_order
from .._problem.parameter import shape_of
from .._problem.pieces import LiftedPieces
from .base import AbstractConstraint, MatrixData, VectorData, as_matrix, as_vector


class AffineInequality(AbstractConstraint):
    """The polyhedron $\\{y : \\ell \\le C y \\le u\\}$, one- or two-sided.

    The projector lifts it with an auxiliary $w = C y$ constrained to the box
    $[\\ell, u]$ (paper Sec. 2.1). Entries of `lower` may be $-\\infty$ and entries of
    `upper` may be $+\\infty$.

    **Arguments:**

    - `C`: matrix of shape `(m, d)`, fixed and finite, or a
        `Parameter(name, shape=(m, d))` for a per-instance matrix.
    - `lower`: vector of shape `(m,)`, a scalar, a `Parameter`, or `None` for
        $-\\infty$.
    - `upper`: vector of shape `(m,)`, a scalar, a `Parameter`, or `None` for
        $+\\infty$.
    """

    C: Float[np.ndarray, "m d"] | MatrixData
    lower: VectorData
    upper: VectorData

    def __init__(self, C, lower=None, upper=None):
        owner = "AffineInequality(C, lower, upper)"
        self.C = as_matrix(C, "C", owner, rows_constrain=True)
        if lower is None and upper is None:
            raise ValueError(
                f"{owner}: both `lower` and `upper` are None, so the constraint is "
                "vacuous. Pass at least one bound."
            )
        m = shape_of(self.C)[0]
        self.lower = as_vector(lower, "lower", owner, m, allow_inf=-1, fill=-np.inf)
        self.upper = as_vector(upper, "upper", owner, m, allow_inf=1, fill=np.inf)
        check_bounds_order(self.lower, self.upper, owner)

    def dim(self) -> int | None:
        return shape_of(self.C)[1]

    def lift(self, dim: int) -> LiftedPieces:
        return LiftedPieces(ineq=((self.C, self.lower, self.upper),))
