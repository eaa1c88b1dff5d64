from ._base import (
    AbstractConstraint as AbstractConstraint,
    LiftedPieces as LiftedPieces,
)
from .box import Box as Box
from .equality import Equality as Equality
from .inequality import AffineInequality as AffineInequality
