"""What one constraint contributes to the lifted problem: its pieces.

Paper Sec. 2.1 lifts a set to $\\{(y, w) : E y = q,\\ w = C y\\} \\cap
\\mathcal{K}$. A constraint's `lift` returns its rows of $E$ and $C$, its bounds and
its cone blocks as `LiftedPieces` (NumPy arrays in float64, or `Parameter`s); the
host data (`host_data`) and the stacked `LiftedProblem` (`lifting`) are both built
from them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._linalg.sparse import is_sparse
from .cones import AbstractCone
from .parameter import Parameter, shape_of


@dataclasses.dataclass(frozen=True)
class ConeBlock:
    """One block of $\\mathcal{K}$: $M y + o \\in \\mathcal{K}_i$.

    **Arguments:**

    - `cone`: the set $\\mathcal{K}_i$, a `pinet_eqx.AbstractCone` such as
        `pinet_eqx.L2Cone()`.
    - `rows`: matrix pieces stacked into $M$: arrays of shape `(r, d)`, or
        `Parameter`s of shape `(d,)` (one row) or `(r, d)`.
    - `offset`: vector pieces stacked into $o$ (a scalar `Parameter` counts as
        length 1).
    - `size`: the block length, the total number of rows.
    - `total`: for a set with `has_total` (the simplex), its $r$ as a length-1
        array or a scalar `Parameter`.
    """

    cone: AbstractCone
    rows: tuple
    offset: tuple
    size: int
    total: np.ndarray | Parameter | None = None


@dataclasses.dataclass(frozen=True)
class LiftedPieces:
    """What one constraint contributes to the lifted problem (paper Sec. 2.1).

    **Arguments:**

    - `eq`: tuple of `(E, q)`: rows $E y = q$, `E` of shape `(k, d)` and `q` of
        length `k`.
    - `ineq`: tuple of `(C, lower, upper)`: rows $w = C y$ with
        $\\ell \\le w \\le u$, `C` of shape `(k, d)` (bounds may be infinite).
    - `box`: tuple of `(indices, lower, upper)`: bounds on the coordinates
        `indices` of $y$.
    - `cones`: tuple of `ConeBlock`s.

    Vectors are float64 NumPy arrays or `Parameter`s; matrices too, with a declared
    shape when they are `Parameter`s.
    """

    eq: tuple = ()
    ineq: tuple = ()
    box: tuple = ()
    cones: tuple = ()

    @classmethod
    def merge(cls, pieces: list[LiftedPieces]) -> LiftedPieces:
        """Concatenate the pieces of several constraints, kind by kind."""
        fields = [f.name for f in dataclasses.fields(cls)]
        return cls(**{f: sum((getattr(p, f) for p in pieces), ()) for f in fields})


def rows_of(M) -> int:
    """Rows a matrix piece contributes (a vector `Parameter` is one row)."""
    return M.shape[0] if len(M.shape) == 2 else 1


def size_of(v) -> int:
    """The length of a vector piece (a scalar counts as 1)."""
    return int(np.prod(shape_of(v)))


def dense_piece(M) -> np.ndarray:
    """A fixed matrix piece as a dense float64 array (sparse ones densified)."""
    return M.toarray() if is_sparse(M) else np.asarray(M, np.float64)
