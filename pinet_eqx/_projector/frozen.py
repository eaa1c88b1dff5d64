"""Frozen arrays: data that optimisers cannot see, and so cannot change.

The projector's factorisations, scalings and fixed constraint data are computed
once, at construction. A plain Equinox training loop partitions a model with
`eqx.is_inexact_array` and hands every floating array to the optimiser, whose
weight decay would then shrink them (and turn infinite bounds into NaN). So they
are stored as their bit patterns, in unsigned integer arrays of the same width:
invisible to `eqx.is_inexact_array`, not differentiated, yet still ordinary pytree
leaves, which `jax.jit` passes as arguments (not constants), and which
`eqx.tree_serialise_leaves` and `pickle` save exactly.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PyTree, UInt

_FLOAT_OF_BITS = {16: jnp.float16, 32: jnp.float32, 64: jnp.float64}


class Frozen(eqx.Module):
    """A floating array stored as its bits; `value` gives the array back."""

    bits: UInt[Array, ...]

    @property
    def value(self) -> Array:
        """The stored floating array."""
        width = jnp.iinfo(self.bits.dtype).bits
        return jax.lax.bitcast_convert_type(self.bits, _FLOAT_OF_BITS[width])


def _freeze_leaf(x):
    if not eqx.is_inexact_array(x):
        return x
    if jnp.iscomplexobj(x) or x.dtype.itemsize * 8 not in _FLOAT_OF_BITS:
        raise TypeError(f"cannot freeze an array of dtype {x.dtype}")
    if isinstance(x, (np.ndarray, np.generic)):
        # In JAX's default precision (float32 unless x64 is on), as `jnp.asarray`
        # would store it, so that thawing gives back what JAX would have held.
        x = np.asarray(x, jax.dtypes.canonicalize_dtype(x.dtype))
        return Frozen(jnp.asarray(x.view(f"uint{x.dtype.itemsize * 8}")))
    # A JAX array (possibly traced, as under `eqx.filter_eval_shape`).
    uint = jnp.dtype(f"uint{x.dtype.itemsize * 8}")
    return Frozen(jax.lax.bitcast_convert_type(x, uint))


def freeze(tree: PyTree) -> PyTree:
    """Replace every floating array leaf of `tree` with a `Frozen` one."""
    return jax.tree.map(_freeze_leaf, tree)


def thaw(tree: PyTree) -> PyTree:
    """Replace every `Frozen` node of `tree` with its floating array."""
    return jax.tree.map(
        lambda x: x.value if isinstance(x, Frozen) else x,
        tree,
        is_leaf=lambda x: isinstance(x, Frozen),
    )
