"""Norm-cone constraints $\\|A y + a\\| \\le f^\\top y + b$ (paper App. G)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from jaxtyping import Float

from .._problem.cones import AbstractCone, L1Cone, L2Cone, LInfCone
from .._problem.parameter import Parameter, shape_of
from .._problem.pieces import ConeBlock, LiftedPieces
from .base import (
    AbstractConstraint,
    MatrixData,
    VectorData,
    as_float64,
    as_matrix,
    as_vector,
)


def as_scalar(value, argname: str, owner: str) -> VectorData:
    """Validate a finite scalar datum (or a scalar `Parameter`); stored as `(1,)`."""
    if isinstance(value, Parameter):
        if value.shape not in (None, ()):
            raise ValueError(
                f"{owner}: `{argname}` is Parameter({value.name!r}) declared with "
                f"shape {value.shape}, but it is a scalar; use shape=() or None."
            )
        return Parameter(value.name, shape=())
    arr = as_float64(value, argname, owner, "a number or a pinet_eqx.Parameter")
    if arr.ndim != 0 or not np.isfinite(arr):
        raise ValueError(
            f"{owner}: `{argname}` must be a finite scalar, got {value!r}."
        )
    return arr.reshape(1)


class AbstractNormCone(AbstractConstraint):
    """The set $\\{y : \\|A y + a\\| \\le f^\\top y + b\\}$ for a fixed norm.

    The projector lifts it with $w = (f^\\top y, A y)$ and the cone block
    $w + (b, a) \\in \\{(t, x) : \\|x\\| \\le t\\}$ (paper App. G).
    """

    A: Float[np.ndarray, "k d"] | MatrixData
    a: VectorData
    f: VectorData | None
    b: VectorData
    cone: ClassVar[AbstractCone]

    def __init__(self, A, a=None, f=None, b=0.0):
        owner = f"{type(self).__name__}(A, a, f, b)"
        self.A = as_matrix(A, "A", owner)
        k, d = shape_of(self.A)
        self.a = as_vector(a, "a", owner, k, fill=0.0)
        self.f = None if f is None else as_vector(f, "f", owner, d)
        self.b = as_scalar(b, "b", owner)

    def dim(self) -> int | None:
        return shape_of(self.A)[1]

    def lift(self, dim: int) -> LiftedPieces:
        k = shape_of(self.A)[0]
        f, a = self.f, self.a
        if f is None:
            f = np.zeros((1, dim))
        elif isinstance(f, Parameter):
            f = Parameter(f.name, shape=(dim,))
        else:
            f = f.reshape(1, dim)
        if isinstance(a, Parameter):
            a = Parameter(a.name, shape=(k,))
        block = ConeBlock(
            cone=self.cone, rows=(f, self.A), offset=(self.b, a), size=1 + k
        )
        return LiftedPieces(cones=(block,))


class SecondOrderCone(AbstractNormCone):
    """The second-order cone constraint $\\{y : \\|A y + a\\|_2 \\le f^\\top y + b\\}$.

    **Arguments:**

    - `A`: matrix of shape `(k, d)`, or `Parameter(name, shape=(k, d))`.
    - `a`: vector of shape `(k,)`, a `Parameter`, or `None` for zero.
    - `f`: vector of shape `(d,)`, a `Parameter`, or `None` for zero.
    - `b`: scalar or scalar `Parameter` (default 0).
    """

    cone: ClassVar[AbstractCone] = L2Cone()


class L1NormCone(AbstractNormCone):
    """The $\\ell_1$ norm cone constraint
    $\\{y : \\|A y + a\\|_1 \\le f^\\top y + b\\}$.

    **Arguments:**

    - `A`: matrix of shape `(k, d)`, or `Parameter(name, shape=(k, d))`.
    - `a`: vector of shape `(k,)`, a `Parameter`, or `None` for zero.
    - `f`: vector of shape `(d,)`, a `Parameter`, or `None` for zero.
    - `b`: scalar or scalar `Parameter` (default 0).
    """

    cone: ClassVar[AbstractCone] = L1Cone()


class LInfNormCone(AbstractNormCone):
    """The $\\ell_\\infty$ norm cone constraint
    $\\{y : \\|A y + a\\|_\\infty \\le f^\\top y + b\\}$.

    **Arguments:**

    - `A`: matrix of shape `(k, d)`, or `Parameter(name, shape=(k, d))`.
    - `a`: vector of shape `(k,)`, a `Parameter`, or `None` for zero.
    - `f`: vector of shape `(d,)`, a `Parameter`, or `None` for zero.
    - `b`: scalar or scalar `Parameter` (default 0).
    """

    cone: ClassVar[AbstractCone] = LInfCone()
