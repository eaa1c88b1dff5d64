"""The cone and simplex blocks of $\\mathcal{K}$, laid out in groups.

Blocks of one set and size are stored contiguously in the auxiliary vector $w$, so
each group is one reshape and one call of its `AbstractCone`. All functions here
work in the user's units: a block's value is $u = M y + o$ and its set is the
group's cone (with the simplex total $r$ for simplices).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .cones import AbstractCone, AbstractPolishableCone


class Group(NamedTuple):
    """`count` consecutive blocks of one `cone`, each of length `size`."""

    cone: AbstractCone
    # Shadows `tuple.count`, which nothing calls on a Group.
    count: int  # pyright: ignore[reportIncompatibleMethodOverride]
    size: int


def layout(blocks: list) -> tuple[list, tuple[Group, ...]]:
    """Order blocks (anything with `cone` and `size`) so that blocks of one set and
    size are adjacent: each group is then projected by one vmapped call.

    **Returns:** the reordered blocks and their groups, in order.
    """
    blocks = sorted(blocks, key=lambda b: (type(b.cone).__name__, b.size))
    groups: list[Group] = []
    for b in blocks:
        if groups and (groups[-1].cone, groups[-1].size) == (b.cone, b.size):
            groups[-1] = groups[-1]._replace(count=groups[-1].count + 1)
        else:
            groups.append(Group(b.cone, 1, b.size))
    return blocks, tuple(groups)


def _split(u, groups):
    start = 0
    for g in groups:
        n = g.count * g.size
        yield u[start : start + n].reshape(g.count, g.size, *u.shape[1:])
        start += n


def _totals(totals, groups):
    j = 0
    for g in groups:
        if g.cone.has_total:
            yield totals[j : j + g.count]
            j += g.count
        else:
            yield None


def project(u, groups: tuple[Group, ...], totals):
    """Project each block of `u` onto its set.

    **Arguments:**

    - `u`: the stacked block values, shape `(sum(count * size),)`.
    - `groups`: the static block layout.
    - `totals`: one total per block whose set has one, in layout order.

    **Returns:** the projection, shaped like `u`.
    """
    parts = zip(groups, _split(u, groups), _totals(totals, groups))
    return jnp.concatenate([g.cone.project(b, r).reshape(-1) for g, b, r in parts])


def violation(u, groups: tuple[Group, ...], totals):
    """The largest violation over the blocks, in each set's own terms."""
    worst = [jnp.zeros((), u.dtype)]
    for g, b, r in zip(groups, _split(u, groups), _totals(totals, groups)):
        worst.append(jnp.max(jnp.maximum(g.cone.excess(b, r), 0)))
    return jnp.max(jnp.stack(worst))


def support(v, groups: tuple[Group, ...], scale, offset, totals):
    """$\\inf_{k} \\langle v, k \\rangle$ over the scaled blocks $k \\in
    (\\mathcal{K} - o) / \\delta$, for an infeasibility certificate.

    **Returns:** `(infimum, distance)`: the infimum over the blocks, and the
    largest distance of a block's $v$ from where its infimum is finite (zero when
    the infimum is exact).
    """
    total = jnp.zeros((), v.dtype)
    distance = jnp.zeros((), v.dtype)
    parts = zip(
        groups,
        _split(v, groups),
        _split(scale, groups),
        _split(offset, groups),
        _totals(totals, groups),
    )
    for g, vb, sb, ob, r in parts:
        infimum, dist = g.cone.support(vb, ob, r)
        total += jnp.sum(infimum / sb[:, 0])
        distance = jnp.maximum(distance, jnp.max(dist))
    return total, distance


def face(pre, u, groups: tuple[Group, ...], totals, rows, totals_low=None, u_low=None):
    """The blocks' active constraints (see `AbstractPolishableCone.face`), as rows
    over $y$.

    **Arguments:**

    - `pre`: the blocks' prox arguments, whose projections define the faces.
    - `u`: the blocks' values $M y + o$ at which the faces are linearised.
    - `groups`, `totals`: the layout, as for `project`.
    - `rows`: the blocks' matrix $M$, shape `(n_cone, d)`.
    - `totals_low`: what rounding took from `totals`, if known: the values are
        then corrected to first order in it.
    - `u_low`: likewise, what rounding took from `u`, if known.

    **Returns:** `(F, values, active)`: the gradients $\\nabla g_j(u)^\\top M$,
    shape `(n_cone, d)`, their values $g_j(u)$ and which are active. A set that
    is not an `AbstractPolishableCone` contributes no active row.
    """
    out_rows, out_values, out_active = [], [], []
    none = [None] * len(groups)
    parts = zip(
        groups,
        _split(pre, groups),
        _split(u, groups),
        _split(rows, groups),
        _totals(totals, groups),
        none if totals_low is None else _totals(totals_low, groups),
        none if u_low is None else _split(u_low, groups),
    )
    for g, pb, ub, Mb, r, low, ub_low in parts:
        if isinstance(g.cone, AbstractPolishableCone):
            if low is None:
                R, values, active = g.cone.face(pb, ub, r)
            else:
                # The values' derivative in the total (minus one on a sum row).
                def face_values(r, g=g, pb=pb, ub=ub):
                    R, values, active = g.cone.face(pb, ub, r)
                    return values, (R, active)

                values, shift, (R, active) = jax.jvp(
                    face_values, (r,), (low,), has_aux=True
                )
                values = values + shift
            if ub_low is not None:
                # R holds the values' gradients in u: the first-order term.
                values = values + jnp.einsum("kij,kj->ki", R, ub_low)
            Mb = jnp.einsum("kij,kjd->kid", R, Mb)
        else:
            values, active = jnp.zeros_like(ub), jnp.zeros(ub.shape, bool)
        out_rows.append(Mb.reshape(g.count * g.size, -1))
        out_values.append(values.reshape(-1))
        out_active.append(active.reshape(-1))
    return (
        jnp.concatenate(out_rows),
        jnp.concatenate(out_values),
        jnp.concatenate(out_active),
    )
