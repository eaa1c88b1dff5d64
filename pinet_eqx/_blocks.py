"""The non-separable blocks of $\\mathcal{K}$ (cones and simplices), grouped by kind.

Blocks of one kind and size are stored contiguously in the auxiliary vector $w$, so
each group is one reshape and one `jax.vmap` of its primitive projection. All
functions here work in the user's units: a block's value is $u = M y + o$ and its
set is $\\mathcal{K}_{kind}$ (with the simplex total $r$ for simplices).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ._constraints._base import CONE_KINDS, ConeBlock
from ._primitives import (
    project_l1_norm_cone,
    project_linf_norm_cone,
    project_second_order_cone,
    project_simplex,
)


class Group(NamedTuple):
    """`count` consecutive blocks of one `kind`, each of length `size`."""

    kind: str
    count: int
    size: int


def layout(cones: list[ConeBlock]) -> tuple[list[ConeBlock], tuple[Group, ...]]:
    """Order cone blocks so that blocks of one kind and size are adjacent (each
    group is then projected by one vmapped primitive).

    **Returns:** the reordered blocks and their groups, in order.
    """
    cones = sorted(cones, key=lambda b: (CONE_KINDS.index(b.kind), b.size))
    groups: list[Group] = []
    for b in cones:
        if groups and (groups[-1].kind, groups[-1].size) == (b.kind, b.size):
            groups[-1] = groups[-1]._replace(count=groups[-1].count + 1)
        else:
            groups.append(Group(b.kind, 1, b.size))
    return cones, tuple(groups)


_PROJECT = {
    "soc": project_second_order_cone,
    "l1": project_l1_norm_cone,
    "linf": project_linf_norm_cone,
}
# The dual cone of each norm cone: the cone of the dual norm.
_DUAL = {"soc": "soc", "l1": "linf", "linf": "l1"}


def _split(u, groups):
    start = 0
    for g in groups:
        n = g.count * g.size
        yield g, u[start : start + n].reshape(g.count, g.size)
        start += n


def _totals(totals, groups):
    j = 0
    for g in groups:
        if g.kind == "simplex":
            yield totals[j : j + g.count]
            j += g.count
        else:
            yield None


def project(u, groups: tuple[Group, ...], totals):
    """Project each block of `u` onto its set.

    **Arguments:**

    - `u`: the stacked block values, shape `(sum(count * size),)`.
    - `groups`: the static block layout.
    - `totals`: one simplex total per simplex block, in layout order.

    **Returns:** the projection, shaped like `u`.
    """
    out = []
    for (g, blocks), r in zip(_split(u, groups), _totals(totals, groups)):
        if g.kind == "simplex":
            out.append(jax.vmap(project_simplex)(blocks, r))
        else:
            out.append(jax.vmap(_PROJECT[g.kind])(blocks))
    return jnp.concatenate([o.reshape(-1) for o in out])


def violation(u, groups: tuple[Group, ...], totals):
    """The largest violation over the blocks, in the set's own terms.

    For a cone $\\max(\\|x\\| - t, 0)$; for a simplex
    $\\max(\\max_i(-u_i), |\\sum_i u_i - r|)$.
    """
    worst = [jnp.zeros((), u.dtype)]
    for (g, blocks), r in zip(_split(u, groups), _totals(totals, groups)):
        t, x = blocks[:, 0], blocks[:, 1:]
        if g.kind == "soc":
            excess = jnp.sqrt(jnp.sum(x * x, axis=1)) - t
        elif g.kind == "l1":
            excess = jnp.sum(jnp.abs(x), axis=1) - t
        elif g.kind == "linf":
            excess = jnp.max(jnp.abs(x), axis=1, initial=0.0) - t
        else:
            excess = jnp.maximum(
                jnp.max(-blocks, axis=1), jnp.abs(jnp.sum(blocks, axis=1) - r)
            )
        worst.append(jnp.max(jnp.maximum(excess, 0)))
    return jnp.max(jnp.stack(worst))


def support(v, groups: tuple[Group, ...], scale, offset, totals):
    """$\\inf_{k} \\langle v, k \\rangle$ over the scaled blocks $k \\in
    (\\mathcal{K} - o) / \\delta$, for an infeasibility certificate.

    A norm cone's infimum is $-\\langle v, o \\rangle / \\delta$ when $v$ lies in
    the dual cone and $-\\infty$ otherwise; a simplex's is $r \\min_i v_i / \\delta$.

    **Returns:** `(infimum, distance)`: the infimum taking each cone block's $v$ to
    be in its dual cone, and the largest distance of a cone block's $v$ from its
    dual cone (zero when the infimum is exact).
    """
    total = jnp.zeros((), v.dtype)
    distance = jnp.zeros((), v.dtype)
    parts = zip(
        _split(v, groups),
        _split(scale, groups),
        _split(offset, groups),
        _totals(totals, groups),
    )
    for (g, vb), (_, sb), (_, ob), r in parts:
        delta = sb[:, 0]
        if g.kind == "simplex":
            total += jnp.sum(r * jnp.min(vb, axis=1) / delta)
        else:
            dual = jax.vmap(_PROJECT[_DUAL[g.kind]])(vb)
            distance = jnp.maximum(distance, jnp.max(jnp.abs(vb - dual)))
            total -= jnp.sum(jnp.sum(vb * ob, axis=1) / delta)
    return total, distance
