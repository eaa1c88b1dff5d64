"""The third phase of one instance's forward pass: the finish onto the active set.

At inference (and in training mode with `refine=True` or `polish=True`) the
iterate is finished on the face that Douglas-Rachford identified: polished to
that face's projection (polyhedral sets), refined against its rows' exact
residuals (dense sets, `refine`), or polished on the host (sparse sets,
`host_polish`). The derivative stays the unfinished map's: the correction is at
rounding level, and a polished point's own derivative is its face's.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._linalg.residual import stored
from .._solver import douglas_rachford as dr
from .._solver.instance import Instance, Iterated
from . import derivative as active_set
from .face import SparseRows
from .polish import polish as _polish
from .refine import refine


def finish(
    instance: Instance, it: Iterated
) -> tuple[
    Float[Array, " d"],
    Float[Array, ""] | None,
    Bool[Array, ""] | bool,
    Bool[Array, ""] | bool,
]:
    """Phase three: the finished point `y` of `instance`, with its constraint
    violation where the refinement measured it (else `None`), whether the
    polish found the projection, and whether it proved the set empty (the
    host's polish of sparse sets).

    **Returns:** `(y, violation, polished, empty)`.
    """
    problem, rows, data = instance.problem, instance.rows, instance.data
    y, flags = it.y, it.flags
    polished = empty = False
    viol = None
    if not (instance.refining or (instance.finishing and instance.polish)):
        return y, viol, polished, empty
    # The derivative of the unrefined map is kept (stop_gradient): the
    # refinement's correction is at rounding level, and a polished point's
    # own derivative is its face's (`on_face` below). y is as stored so that
    # y - y_plain below is exactly zero (see `_residual.stored`).
    y = stored(y)
    y_plain = jax.lax.stop_gradient(y)
    pre = None
    if flags is None:
        # Off the active-set path (every set with cones), P and z were
        # computed by the iteration's read-out.
        flags = active_set.activity(it.s, it.P, instance.op, it.z)
        if problem.groups:
            pre = dr.cone_argument(it.s, it.z, it.P)
    y_raw = instance.y_raw
    # (Called only where the polish's rounds run: off the common path.)
    dense = instance.polish and not isinstance(rows, SparseRows)
    strength = partial(_strength, instance, it) if dense else None
    if instance.refining:
        # Polyhedral sets are first polished (see `refine`).
        fix, viol, polished, face = refine(
            problem, rows, instance.refinement, y_plain, data, flags, pre,
            y_raw if instance.polish else None, it.status_tol, strength,
        )  # fmt: skip
    else:
        # Without the refinement (sparse sets; training mode with
        # `polish=True`): the polished point where it is the projection.
        candidate, polished, _, face, empty = _polish(
            problem, rows, y_raw, data, flags, it.status_tol, 1.0, strength
        )
        fix = jnp.where(polished, candidate, y_plain)
        face = jax.tree.map(partial(jnp.where, polished), face, tuple(flags))
    if it.inputs is not None and instance.polish:
        # A polished point's derivative is its face's, which the polish's
        # rounds (or the host's, `_host_polish`) may have moved off the
        # iterate's.
        y_plain = y = active_set.on_face(
            it.inputs,
            value=fix,
            flags=jax.lax.stop_gradient(tuple(face)),
            fixed=rows,
            cfg=it.cfg,
        )
    # y - y is exactly zero, so the value is exactly `fix`.
    y = (y - jax.lax.stop_gradient(y_plain)) + jax.lax.stop_gradient(fix)
    return y, viol, polished, empty


def _strength(instance: Instance, it: Iterated):
    """How firmly the iterate holds each activity flag (`_active_set.strength`),
    for the polish's rounds on dense rows (sparse rows' polish runs its own
    active-set method on the host)."""
    P = it.P
    if P is None:  # (the active-set path reads out no P without diagnostics)
        P = dr.prepare(
            instance.y_raw, instance.data, instance.op, instance.sigma,
            instance.problem.groups,
        )  # fmt: skip
    return active_set.strength(it.s, P, instance.op, it.z)
