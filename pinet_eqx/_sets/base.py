"""The constraint-set interface and the validation shared by every set."""

from __future__ import annotations

import abc

import equinox as eqx
import numpy as np
import scipy.sparse as sp

from .._linalg.sparse import as_csr, check_no_zero_rows, is_sparse
from .._problem.parameter import Parameter
from .._problem.pieces import LiftedPieces

# A vector datum is either fixed (kept in float64 so the host-side factorisation
# sees the user's full precision even when `jax_enable_x64` is off) or a named
# per-instance parameter.
VectorData = np.ndarray | Parameter
# A matrix datum: fixed float64 (dense, or sparse in CSR form), or a per-instance
# `Parameter` with a declared shape.
MatrixData = np.ndarray | sp.csr_matrix | Parameter


class AbstractConstraint(eqx.Module):
    """A convex set $\\mathcal{C} \\subseteq \\mathbb{R}^d$ that the projector can lift.

    Sets describe themselves through `lift`, which returns the rows, bounds and
    cone blocks they add to the lifted representation $\\mathcal{C} =
    \\Pi_d(\\mathcal{A} \\cap \\mathcal{K})$ of paper Sec. 2.1, as a
    `pinet_eqx.LiftedPieces`. To define your own set, subclass this with a final
    class that implements `dim` and `lift`; its cone blocks may use any
    `pinet_eqx.AbstractCone`, including your own.
    """

    @abc.abstractmethod
    def dim(self) -> int | None:
        """The dimension $d$ of the vectors this set constrains, if it is known."""

    @abc.abstractmethod
    def lift(self, dim: int) -> LiftedPieces:
        """The rows and bounds this set contributes, for vectors of size `dim`."""


def as_float64(value, argname: str, owner: str, expected: str) -> np.ndarray:
    """`value` as a float64 NumPy array, or a `TypeError` saying what was
    `expected`."""
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{owner}: `{argname}` must be {expected}, got {type(value).__name__}."
        ) from e


def as_matrix(
    value, argname: str, owner: str, *, rows_constrain: bool = False
) -> MatrixData:
    """Validate a matrix: a fixed one (two axes, finite entries, returned as
    float64; a `scipy.sparse` matrix or JAX `BCOO` stays sparse, as CSR) or a
    `Parameter` with a declared 2-D shape.

    With `rows_constrain` (each row is a constraint of its own, as in an
    equality or inequality), a sparse matrix may not have an all-zero row.
    """
    if is_sparse(value):
        csr = as_csr(value, argname, owner)
        if rows_constrain:
            check_no_zero_rows(csr, argname, owner)
        return csr
    if isinstance(value, Parameter):
        if value.shape is None or len(value.shape) != 2:
            raise ValueError(
                f"{owner}: `{argname}` is Parameter({value.name!r}) used as a "
                "per-instance matrix, so it needs its shape: "
                f"Parameter({value.name!r}, shape=(rows, d)); got shape="
                f"{value.shape}."
            )
        return value
    arr = as_float64(value, argname, owner, "a 2-D array of numbers")
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
    arr = as_float64(value, argname, owner, "an array of numbers or a Parameter")
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
