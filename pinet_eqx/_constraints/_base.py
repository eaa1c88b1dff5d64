"""The constraint-set interface and the validation shared by every set."""

from __future__ import annotations

import abc
import dataclasses

import equinox as eqx
import numpy as np

from .._parameter import Parameter

# A vector datum is either fixed (kept in float64 so the host-side factorisation
# sees the user's full precision even when `jax_enable_x64` is off) or a named
# per-instance parameter.
VectorData = np.ndarray | Parameter
# A matrix datum: fixed float64, or a per-instance `Parameter` with a declared shape.
MatrixData = np.ndarray | Parameter

CONE_KINDS = ("soc", "l1", "linf", "simplex")


@dataclasses.dataclass(frozen=True)
class LiftedPieces:
    """What one constraint contributes to the lifted problem $A z = b,\\ z \\in K$.

    Rows are split by kind (paper Sec. 2.1): equality rows $E y = q$; lifted rows
    $w = C y$ with $\\ell \\le w \\le u$; and box bounds acting directly on $y$.

    **Arguments:**

    - `eq`: tuple of `(E, q)` with `E` of shape `(k, d)` and `q` a `VectorData` of
        length `k`.
    - `ineq`: tuple of `(C, lower, upper)` with `C` of shape `(k, d)`.
    - `box`: tuple of `(indices, lower, upper)` with integer `indices` into `y`.
    - `cones`: tuple of `ConeBlock`s, rows $w = M y$ with $w + o \\in \\mathcal{K}$.

    Matrices (`E`, `C`) may be `Parameter`s with a declared shape.
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


@dataclasses.dataclass(frozen=True)
class ConeBlock:
    """One non-separable block of $\\mathcal{K}$: $M y + o \\in \\mathcal{K}_{kind}$.

    **Arguments:**

    - `kind`: `"soc"`, `"l1"`, `"linf"` (the cones $\\{(t, x) : \\|x\\| \\le t\\}$,
        $t$ first) or `"simplex"` ($\\{x \\ge 0 : \\sum x = r\\}$).
    - `rows`: matrix pieces stacked into $M$, each a `MatrixData` of shape
        `(r, d)` or a `Parameter` of shape `(d,)` (one row).
    - `offset`: vector pieces stacked into $o$ (scalar `Parameter`s count as
        length 1).
    - `total`: for a simplex, $r$ as a length-1 array or a scalar `Parameter`.
    - `size`: the block length, `sum(r)`.
    """

    kind: str
    rows: tuple
    offset: tuple
    size: int
    total: VectorData | None = None


class AbstractConstraint(eqx.Module):
    """A convex set $\\mathcal{C} \\subseteq \\mathbb{R}^d$ that the projector can lift.

    Concrete sets describe themselves through `lift`, which returns the rows and
    bounds they add to the lifted representation $\\mathcal{C} = \\Pi_d(\\mathcal{A}
    \\cap \\mathcal{K})$ of paper Sec. 2.1.
    """

    @abc.abstractmethod
    def dim(self) -> int | None:
        """The dimension $d$ of the vectors this set constrains, if it is known."""

    @abc.abstractmethod
    def lift(self, dim: int) -> LiftedPieces:
        """The rows and bounds this set contributes, for vectors of size `dim`."""


def as_matrix(value, argname: str, owner: str) -> MatrixData:
    """Validate a matrix: a fixed one (two axes, finite entries, returned as
    float64) or a `Parameter` with a declared 2-D shape."""
    if isinstance(value, Parameter):
        if value.shape is None or len(value.shape) != 2:
            raise ValueError(
                f"{owner}: `{argname}` is Parameter({value.name!r}) used as a "
                "per-instance matrix, so it needs its shape: "
                f"Parameter({value.name!r}, shape=(rows, d)); got shape="
                f"{value.shape}."
            )
        return value
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{owner}: `{argname}` must be a 2-D array of numbers, got "
            f"{type(value).__name__}."
        ) from e
    if arr.ndim != 2:
        raise ValueError(
            f"{owner}: `{argname}` must have shape (rows, d), got shape {arr.shape}."
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(
            f"{owner}: `{argname}` contains NaN or inf entries; every matrix entry "
            "must be finite."
        )
    return arr


def as_vector(
    value,
    argname: str,
    owner: str,
    size: int | None,
    *,
    allow_inf: int = 0,
    fill: float | None = None,
) -> VectorData:
    """Validate a vector datum of length `size` (scalars broadcast).

    `allow_inf` is +1 for upper bounds (may be $+\\infty$), -1 for lower bounds
    (may be $-\\infty$) and 0 for data that must be finite. `None` becomes `fill`.
    """
    if isinstance(value, Parameter):
        expected = () if size is None else (size,)
        if value.shape is not None and value.shape != expected and size is not None:
            raise ValueError(
                f"{owner}: `{argname}` is Parameter({value.name!r}) declared with "
                f"shape {value.shape}, but this datum has shape {expected}."
            )
        return value
    if value is None:
        if fill is None:
            raise ValueError(f"{owner}: `{argname}` is required.")
        value = fill
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{owner}: `{argname}` must be an array of numbers or a "
            f"pinet_eqx.Parameter, got {type(value).__name__}."
        ) from e
    if arr.ndim == 0:
        if size is None:
            return arr
        arr = np.full((size,), float(arr))
    if arr.ndim != 1:
        raise ValueError(
            f"{owner}: `{argname}` must be a vector of shape ({size},), got shape "
            f"{arr.shape}. Batch over instances with jax.vmap and a Parameter, "
            "not by adding axes to fixed data."
        )
    if size is not None and arr.shape[0] != size:
        raise ValueError(
            f"{owner}: `{argname}` must have shape ({size},), got shape {arr.shape}."
        )
    if np.any(np.isnan(arr)):
        raise ValueError(f"{owner}: `{argname}` contains NaN entries.")
    bad = np.isinf(arr)
    if allow_inf > 0:
        bad &= arr < 0
    elif allow_inf < 0:
        bad &= arr > 0
    if np.any(bad):
        allowed = {1: "+inf", -1: "-inf", 0: "no infinite values"}[allow_inf]
        raise ValueError(
            f"{owner}: `{argname}` has an infinite entry at index "
            f"{int(np.flatnonzero(bad)[0])}; it allows {allowed}."
        )
    return arr


def check_bounds_order(lower: VectorData, upper: VectorData, owner: str) -> None:
    """Raise if fixed bounds have `lower > upper` anywhere (the set would be empty)."""
    if isinstance(lower, Parameter) or isinstance(upper, Parameter):
        return
    lower, upper = np.broadcast_arrays(np.atleast_1d(lower), np.atleast_1d(upper))
    crossed = np.flatnonzero(lower > upper)
    if crossed.size:
        i = int(crossed[0])
        raise ValueError(
            f"{owner}: lower > upper at index {i} (lower={lower[i]}, upper="
            f"{upper[i]}), so the set is empty ({crossed.size} crossed entries in "
            "all). Swap or fix the bounds."
        )


def shape_of(value) -> tuple[int, ...]:
    """The (declared) shape of a fixed array or a `Parameter`."""
    if isinstance(value, Parameter):
        return value.shape
    return np.shape(value)
