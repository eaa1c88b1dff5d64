"""Data parallelism: a mesh over all devices and a batch split across it.

A projection works on one instance and a batch is a `jax.vmap` over instances,
each solved on its own, forward and backward. So the natural way to use several
devices, or several hosts, is to split the batch and replicate the network: with
the batch's leading axis sharded, `jax.jit` runs each device's share of the
instances where they live, and the only communication of a training step is the
all-reduce of the backbone's gradient (the projector holds no trainable state).

Nothing here is specific to `pinet_eqx`: these are the few lines of
`jax.sharding` that every data-parallel program writes, with errors that say
what to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from jaxtyping import PyTree

_NOT_DIVISIBLE = (
    "pinet_eqx.shard_batch(mesh, *batches): argument {arg} has a leaf of shape "
    "{shape}, whose leading (batch) axis of {batch}{where} does not divide evenly "
    "across the {n} devices of mesh axis {axis!r}. Pad or trim the batch to a "
    "multiple of {n} (for example drop the last incomplete batch of an epoch), or "
    "build the mesh over fewer devices: "
    "`pinet_eqx.data_mesh(devices=jax.devices()[:k])`."
)

_NO_BATCH_AXIS = (
    "pinet_eqx.shard_batch(mesh, *batches): argument {arg} has a scalar leaf "
    "(shape ()), which has no batch axis to split. Pass only batched arrays, with "
    "the instances along the leading axis; replicate the rest with "
    "`pinet_eqx.replicate(mesh, tree)`."
)


def data_mesh(
    axis_name: str = "data",
    # `jax.Device` is an alias that type checkers reject as an annotation.
    devices: Sequence[Any] | None = None,
    *,
    explicit: bool = False,
) -> Mesh:
    """A one-dimensional device mesh for data parallelism.

    The mesh is $(n,)$ with $n$ the number of devices, every device of every
    process by default, under one axis along which `shard_batch` splits a batch.

    **Arguments:**

    - `axis_name`: the name of the mesh axis (and of the `PartitionSpec` that
        shards along it).
    - `devices`: the devices, in order; default `jax.devices()`, which after
        `jax.distributed.initialize()` are the devices of all processes.
    - `explicit`: `False` (default) for `AxisType.Auto`, where the compiler
        propagates shardings; `True` for `AxisType.Explicit`, where shardings are
        part of the arrays' types. Use an explicit mesh under
        `with jax.set_mesh(mesh):`.

    **Returns:** a `jax.sharding.Mesh` with the single axis `axis_name`.
    """
    devices = jax.devices() if devices is None else list(devices)
    if len(devices) == 0:
        raise ValueError(
            "pinet_eqx.data_mesh(axis_name, devices): `devices` is empty; pass at "
            "least one device, or None for all of `jax.devices()`."
        )
    axis_type = AxisType.Explicit if explicit else AxisType.Auto
    return Mesh(np.asarray(devices), (axis_name,), axis_types=(axis_type,))


def replicate(mesh: Mesh, tree: PyTree) -> PyTree:
    """Place every array of `tree` whole on every device of `mesh`.

    The sharding is $P()$ (no axis split), what data parallelism wants for the
    network: each device applies the same weights to its share of the batch.
    Non-array leaves are returned as they are. With several processes, each must
    pass the same values (for example from the same seed).

    **Arguments:**

    - `mesh`: the mesh, for example from `data_mesh`.
    - `tree`: any PyTree, typically a model or an optimiser state.

    **Returns:** `tree` with its arrays replicated over `mesh`.
    """
    sharding = NamedSharding(mesh, PartitionSpec())

    def place(leaf):
        return _put(leaf, sharding) if eqx.is_array(leaf) else leaf

    return jtu.tree_map(place, tree)


def _put(leaf, sharding: NamedSharding) -> jax.Array:
    """`leaf` placed with `sharding`; with several processes, `leaf` is this
    process's part of the global array."""
    if jax.process_count() > 1:
        return jax.make_array_from_process_local_data(sharding, np.asarray(leaf))
    return jax.device_put(leaf, sharding)


def shard_batch(mesh: Mesh, *batches: PyTree, axis_name: str = "data") -> Any:
    """Split the leading (batch) axis of arrays across the devices of a mesh.

    Every array leaf of shape $(B, \\dots)$ is placed with
    `NamedSharding(mesh, PartitionSpec(axis_name))`: device $i$ of the $n$ along
    `axis_name` holds rows $[iB/n, (i+1)B/n)$. Feed the result to a jitted,
    vmapped model; the outputs come back sharded the same way.

    With several processes (after `jax.distributed.initialize()`), each process
    passes only its local slice of the batch, of $B/p$ rows for $p$ processes,
    and the result is one global array of $B$ rows, through
    `jax.make_array_from_process_local_data`; process $k$'s rows come $k$-th.

    **Arguments:**

    - `mesh`: the mesh, for example from `data_mesh`.
    - `*batches`: arrays, or PyTrees of arrays (such as a dict of parameters),
        with the instances along the leading axis. Non-array leaves (`None`,
        Python numbers) are returned as they are.
    - `axis_name`: the mesh axis to split along.

    **Returns:** the sharded batch, or a tuple of them when several are passed.

    **Raises:** `ValueError` if a batch axis does not divide evenly across the
    devices (of this process, with several processes), or if a leaf is a scalar.
    """
    if axis_name not in mesh.shape:
        raise ValueError(
            f"pinet_eqx.shard_batch(mesh, *batches, axis_name={axis_name!r}): the "
            f"mesh has no axis {axis_name!r}; its axes are {tuple(mesh.shape)}. "
            "Pass the name the mesh was built with."
        )
    sharding = NamedSharding(mesh, PartitionSpec(axis_name))
    n = mesh.shape[axis_name]
    multi_process = jax.process_count() > 1
    if multi_process:
        # The devices of this process along the axis, which its local slice is
        # split across: on a 1-D mesh, those it can address.
        local = len(mesh.local_devices) * n // mesh.size
    else:
        local = n

    def place(arg, leaf):
        if not eqx.is_array(leaf):
            return leaf
        shape = np.shape(leaf)
        if len(shape) == 0:
            raise ValueError(_NO_BATCH_AXIS.format(arg=arg))
        if shape[0] % local != 0:
            where = " (this process's slice)" if multi_process else ""
            raise ValueError(
                _NOT_DIVISIBLE.format(
                    arg=arg,
                    shape=shape,
                    batch=shape[0],
                    where=where,
                    n=local,
                    axis=axis_name,
                )
            )
        return _put(leaf, sharding)

    out = tuple(
        jtu.tree_map(lambda leaf, i=i: place(i, leaf), batch)
        for i, batch in enumerate(batches)
    )
    return out[0] if len(out) == 1 else out
