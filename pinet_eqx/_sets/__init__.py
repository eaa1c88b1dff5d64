from ._base import AbstractConstraint as AbstractConstraint
from .box import Box as Box
from .cones import (
    AbstractNormCone as AbstractNormCone,
    L1NormCone as L1NormCone,
    LInfNormCone as LInfNormCone,
    SecondOrderCone as SecondOrderCone,
)
from .equality import Equality as Equality
from .inequality import AffineInequality as AffineInequality
from .simplex import Simplex as Simplex
