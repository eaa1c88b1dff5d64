"""Affine maps from a caller's parameters to the constraints' `Parameter`s.

`from_cvxpy` builds one from cvxpy's parametrised cone program: every piece of
cone data that depends on cvxpy `Parameter`s is an affine function of them,
$v_k = T_k\\,[p;\\ 1]$, with $p$ the parameters flattened (column-major, as
cvxpy flattens) and stacked. Evaluating that map in JAX keeps the parameters
differentiable through the projection.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from jaxtyping import Array

from .._linalg.sparse import SparseMatrix
from .parameter import check_values


class AffineParameterMap(eqx.Module):
    """$v_k = T_k\\,[p;\\ 1]$ for each target `Parameter` $v_k$.

    **Arguments:**

    - `sources`: the caller's parameters, as `(name, shape, offset)`: the value
        of `name`, flattened column-major, occupies `p[offset:offset + size]`
        (an offset of -1: accepted, and unused).
    - `targets`: the constraints' parameters, as `(name, shape)` pairs.
    - `maps`: one `scipy.sparse` matrix $T_k$ per target, of shape
        `(size_k, len(p) + 1)` (the last column is the constant term).
    """

    sources: tuple[tuple[str, tuple[int, ...], int], ...] = eqx.field(static=True)
    targets: tuple[tuple[str, tuple[int, ...]], ...] = eqx.field(static=True)
    maps: tuple[SparseMatrix, ...]
    n_params: int = eqx.field(static=True)

    def __init__(self, sources, targets, maps):
        self.sources = tuple((str(n), tuple(s), int(o)) for n, s, o in sources)
        self.targets = tuple((str(n), tuple(s)) for n, s in targets)
        self.n_params = sum(int(np.prod(s)) for _, s, o in self.sources if o >= 0)
        if len(maps) != len(self.targets):
            raise ValueError("AffineParameterMap: one map per target is needed.")
        self.maps = tuple(SparseMatrix.from_scipy(sp.csr_matrix(T)) for T in maps)

    @property
    def parameters(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The caller's parameters, as sorted `(name, shape)` pairs."""
        return tuple(sorted((n, s) for n, s, _ in self.sources))

    def __call__(self, values: dict) -> dict[str, Array]:
        """The targets' values from the caller's `values` (checked by name and
        shape, one instance)."""
        values = check_values(
            self.parameters, values, " (the names of its cvxpy Parameters)"
        )
        flat: dict[int, Array] = {}
        dtype = jnp.result_type(float, *values.values())
        for i, (name, _, _) in enumerate(self.sources):
            v = values[name]
            # Column-major, as cvxpy flattens parameters.
            flat[i] = jnp.transpose(v).reshape(-1).astype(dtype)
        used = [i for i, (_, _, o) in enumerate(self.sources) if o >= 0]
        used.sort(key=lambda i: self.sources[i][2])
        p = jnp.concatenate([flat[i] for i in used] + [jnp.ones(1, dtype)])
        out = {}
        for (name, shape), T in zip(self.targets, self.maps):
            v = T.astype(dtype) @ p
            if len(shape) == 2:
                # Column-major, as cvxpy lays out matrices.
                v = v.reshape(shape[::-1]).T
            out[name] = v.reshape(shape)
        return out
