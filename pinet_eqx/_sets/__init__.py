"""The user's constraint sets, one final class per file.

Each set derives from `AbstractConstraint` (`base`) and lowers itself to the
lifted problem's pieces in its `lift` (a `LiftedPieces` of equality rows,
inequality rows, boxes and cone blocks); a new set is one new file here. It may
import `_linalg` and `_problem`.
"""

from .base import AbstractConstraint as AbstractConstraint
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
