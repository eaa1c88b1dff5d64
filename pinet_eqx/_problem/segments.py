"""Segments: a vector or matrix of the lifted problem, kept as its fixed pieces
and named `Parameter`s, and assembled per instance at call time."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array

from .._linalg.sparse import SparseMatrix
from .parameter import Parameter, shape_of
from .pieces import dense_piece

# A vector or matrix assembled at call time: fixed pieces and named parameters.
Segments = tuple  # tuple[Float[Array, "..."] | Parameter, ...]


class Registry:
    """Turns pieces into segments: arrays, or `Parameter`s registered by name with
    one shape each."""

    def __init__(self, params: dict, dim: int):
        self.params = params
        self.dim = dim

    def _register(self, p: Parameter, shape: tuple[int, ...]) -> Parameter:
        if self.params.setdefault(p.name, shape) != shape:
            raise ValueError(
                f"Projector(constraints): Parameter({p.name!r}) is used for data of "
                f"shape {self.params[p.name]} and {shape}; one name must always "
                "have one shape."
            )
        return p

    def matrices(self, items) -> Segments:
        out = []
        for M in items:
            if not isinstance(M, Parameter):
                out.append(jnp.asarray(dense_piece(M)))
                continue
            shape = shape_of(M)
            if shape[-1] != self.dim:
                raise ValueError(
                    f"Projector(constraints): matrix Parameter({M.name!r}) has shape "
                    f"{shape}, but the projector's vectors have size {self.dim}."
                )
            out.append(self._register(M, shape))
        return tuple(out)

    def vectors(self, items) -> Segments:
        out = []
        for v, size in items:
            if isinstance(v, Parameter):
                # Scalars keep their declared shape `()`; vectors are `(size,)`.
                shape = () if v.shape == () else (size,)
                out.append(self._register(v, shape))
            else:
                out.append(jnp.asarray(v))
        return tuple(out)


def assemble(segments, values, dtype, cols=None) -> Array:
    """Fixed pieces and `Parameter` values, in `dtype`, stacked: a vector, or
    a matrix of `cols` columns."""
    shape = (-1,) if cols is None else (-1, cols)
    parts = [
        (values[s.name] if isinstance(s, Parameter) else s.astype(dtype)).reshape(shape)
        for s in segments
    ]
    if not parts:
        return jnp.zeros((0,) if cols is None else (0, cols), dtype)
    return jnp.concatenate(parts)


def assemble_matrix(segments, values, dtype, cols: int) -> Array | SparseMatrix:
    """`assemble` for a matrix, which may be one `SparseMatrix`."""
    if len(segments) == 1 and isinstance(segments[0], SparseMatrix):
        return segments[0].astype(dtype)
    return assemble(segments, values, dtype, cols)
