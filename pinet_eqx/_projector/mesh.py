"""Per-instance computations under JAX's explicit sharding.

Under `jax.vmap` of a batch that is explicitly sharded over a mesh axis, every
per-instance value carries that mesh in its type while the projector's own data do
not. Parts of the pipeline (lineax's abstract evaluation, which drops shardings, and
`vmap` of ops that mix the two) cannot reconcile the types. An instance is
replicated on the device that owns it, so the projection loses nothing by running
with the mesh's axes switched to automatic (`jax.sharding.auto_axes`), which gives
the compiler the propagation back; the outputs are then replicated per instance,
i.e. sharded like the batch once `vmap` adds the batch axis back.
"""

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import PartitionSpec

NO_MESH_CONTEXT = (
    "pinet_eqx: the inputs are explicitly sharded over the mesh axes {axes}, but no "
    "mesh is set. Call the projector (or the jitted function around it) inside "
    "`with jax.set_mesh(mesh):`, as JAX requires for explicit sharding."
)


VARYING_MANUAL_AXES = (
    "pinet_eqx: the inputs vary over the manual mesh axes {axes} of a "
    "`jax.shard_map` that checks them (`check_vma=True`, its default). Parts of the "
    "projection (equinox's runtime checks and lineax's solves) do not carry that "
    "type yet, so pass `check_vma=False` to `jax.shard_map`; each instance is "
    "still projected on the device that owns it."
)


def _varying_axes(tree) -> tuple:
    axes = set()
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            aval = jax.typeof(leaf)
            # Older JAX: `aval.vma`; newer: `aval.manual_axis_type.varying`.
            manual = getattr(aval, "manual_axis_type", None)
            axes |= set(getattr(manual, "varying", getattr(aval, "vma", ())))
    return tuple(sorted(axes))


def explicit_mesh(tree) -> Any:
    """The mesh of the first array in `tree` whose type carries explicit mesh
    axes, else `None` (automatic axes only, or no mesh)."""
    for leaf in jax.tree.leaves(tree):
        if not isinstance(leaf, jax.Array):
            continue
        mesh = getattr(jax.typeof(leaf).sharding, "mesh", None)
        if mesh is not None and not mesh.empty and mesh.explicit_axes:
            return mesh
    return None


def per_instance(fn: Callable[..., Any], *args) -> Any:
    """`fn(*args)`, run with the mesh's explicit axes switched to automatic when
    the arguments carry any; the outputs are replicated (per instance).

    **Raises:** `ValueError` when explicitly sharded arguments meet no mesh
    context, or inside a `jax.shard_map` that checks varying manual axes.
    """
    varying = _varying_axes(args)
    if varying:
        raise ValueError(VARYING_MANUAL_AXES.format(axes=varying))
    mesh = explicit_mesh(args)
    if mesh is None:
        return fn(*args)
    axes = tuple(mesh.explicit_axes)
    if jax.sharding.get_abstract_mesh().empty:
        raise ValueError(NO_MESH_CONTEXT.format(axes=axes))
    return jax.sharding.auto_axes(fn, axes=axes, out_sharding=PartitionSpec())(*args)
