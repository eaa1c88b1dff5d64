"""The non-separable blocks of $\\mathcal{K}$: one final class per kind of set.

A block is a vector $u$ of fixed length that must lie in a closed convex set
$\\mathcal{K}_i$: a norm cone $\\{(t, x) : \\|x\\| \\le t\\}$ (stored "t first") or
the scaled simplex $\\{x \\ge 0 : \\sum_i x_i = r\\}$. Each class knows its set's
projection, its violation, and the support function that the infeasibility
certificate needs. The projector stores blocks of one kind and size contiguously
and hands each class a whole group at once, shape `(count, size)`.

To add a set, subclass `AbstractCone` in one file and return its blocks from a
constraint's `lift` (see `pinet_eqx.ConeBlock`).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from .._linalg.residual import pairwise_sum
from .primitives import (
    project_l1_norm_cone,
    project_linf_norm_cone,
    project_second_order_cone,
    project_simplex,
)


class AbstractCone(eqx.Module):
    """A closed convex set $\\mathcal{K}_i$ for one block of the lifted variable.

    Instances carry no data (the block's offset, scale and simplex total are passed
    in), so they are hashable and serve as static layout keys. All methods act on a
    group of `count` blocks of one `size`, shape `(count, size)`.

    Subclasses set `has_total` (whether the set takes a per-block scalar $r$, as
    the simplex does) and implement `project`, `excess` and `support`.
    """

    has_total: ClassVar[bool] = False

    @abc.abstractmethod
    def project(
        self, u: Float[Array, "count size"], total: Float[Array, " count"] | None
    ) -> Float[Array, "count size"]:
        """The Euclidean projection of each block onto the set."""

    @abc.abstractmethod
    def excess(
        self, u: Float[Array, "count size"], total: Float[Array, " count"] | None
    ) -> Float[Array, " count"]:
        """How far each block is from satisfying its constraint, in the set's own
        terms (for a cone $\\|x\\| - t$; zero or negative when satisfied)."""

    @abc.abstractmethod
    def support(
        self,
        v: Float[Array, "count size"],
        offset: Float[Array, "count size"],
        total: Float[Array, " count"] | None,
    ) -> tuple[Float[Array, " count"], Float[Array, " count"]]:
        """$\\inf_{k \\in \\mathcal{K} - o} \\langle v, k \\rangle$ per block, for an
        infeasibility certificate.

        **Returns:** `(infimum, distance)`: the infimum computed as if $v$ lay in
        the recession directions where it is finite, and how far $v$ is from that
        region (zero when the infimum is exact, for example $v$ in the dual cone).
        """


class AbstractPolishableCone(AbstractCone):
    """A set whose active face at a projection is known in closed form, so that
    inference can polish a block onto it (see `_refine`).

    Subclasses implement `face`.
    """

    @abc.abstractmethod
    def face(
        self,
        pre: Float[Array, "count size"],
        u: Float[Array, "count size"],
        total: Float[Array, " count"] | None,
    ) -> tuple[
        Float[Array, "count size size"],
        Float[Array, "count size"],
        Bool[Array, "count size"],
    ]:
        """The constraints active at the projection of `pre`, linearised at `u`.

        Each active row $j$ is a constraint $g_j(u) = 0$ that holds on the face of
        the set containing $\\Pi(\\mathrm{pre})$; it is returned as its gradient
        $\\nabla g_j(u)$ and its value $g_j(u)$, so that $u - \\delta$ with
        $\\nabla g_j^\\top \\delta = g_j(u)$ satisfies it to first order.

        **Returns:** `(rows, values, active)`: the gradients, shape
        `(count, size, size)` (row $j$ of block $k$ is `rows[k, j]`), the values
        and which rows are active (the others are ignored).
        """


def _coordinate_rows(u, active):
    """The rows $u_j = 0$ of each block, active where `active`."""
    count, size = u.shape
    eye = jnp.broadcast_to(jnp.eye(size, dtype=u.dtype), (count, size, size))
    return eye, u, jnp.broadcast_to(active, u.shape)


def _one_row(row, value, on, rows, values, active):
    """`rows, values, active` with their first row replaced by `row` where `on`."""
    rows = rows.at[:, 0].set(jnp.where(on[:, None], row, rows[:, 0]))
    values = values.at[:, 0].set(jnp.where(on, value, values[:, 0]))
    return rows, values, active.at[:, 0].set(active[:, 0] | on)


class AbstractNormCone(AbstractPolishableCone):
    """$\\{(t, x) : \\|x\\| \\le t\\}$ for some norm; its dual is the dual norm's
    cone, so $\\inf_{k \\in \\mathcal{K} - o} \\langle v, k\\rangle = -\\langle v, o
    \\rangle$ when $v \\in \\mathcal{K}^*$ and $-\\infty$ otherwise."""

    @abc.abstractmethod
    def norm(self, x: Float[Array, "count k"]) -> Float[Array, " count"]:
        """The norm of each row of `x`."""

    @abc.abstractmethod
    def project_dual(self, u: Float[Array, "count size"]) -> Float[Array, "count size"]:
        """The projection of each block onto the dual cone."""

    def excess(self, u, total):
        return self.norm(u[:, 1:]) - u[:, 0]

    def support(self, v, offset, total):
        distance = jnp.max(jnp.abs(v - self.project_dual(v)), axis=1)
        return -jnp.sum(v * offset, axis=1), distance


class L2Cone(AbstractNormCone):
    """The second-order cone $\\{(t, x) : \\|x\\|_2 \\le t\\}$ (self-dual)."""

    def norm(self, x):
        return jnp.sqrt(jnp.sum(x * x, axis=1))

    def project(self, u, total):
        return jax.vmap(project_second_order_cone)(u)

    def project_dual(self, u):
        return self.project(u, None)

    def face(self, pre, u, total):
        # Outside both the cone and its polar, the projection lies on the surface
        # ||x|| = t, one smooth constraint; on the polar it is the apex.
        r_pre = self.norm(pre[:, 1:])
        apex = (r_pre <= -pre[:, 0]) & (r_pre > pre[:, 0])
        surface = (r_pre > pre[:, 0]) & ~apex
        rows, values, active = _coordinate_rows(u, apex[:, None])
        x = u[:, 1:]
        r = self.norm(x)
        # The direction of x at u, or at pre if u's x vanished.
        direction = jnp.where(r[:, None] > 0, x, pre[:, 1:])
        length = self.norm(direction)
        direction = direction / jnp.where(length > 0, length, 1)[:, None]
        row = jnp.concatenate([-jnp.ones_like(r)[:, None], direction], axis=1)
        return _one_row(
            row, _surface_value(x, u[:, 0], r), surface, rows, values, active
        )


def _surface_value(x, t, norm):
    """$\\|x\\|_2 - t$ for each row, `norm` being $\\|x\\|_2$ as computed.

    Near the surface the difference cancels, and the computed norm's own rounding
    (an ulp of $t$ or more) would be all that is left of it. In float32 it is
    computed as $(\\|x\\|^2 - t^2) / (\\|x\\| + t)$ instead, with the squares
    split into exact terms and summed in about twice the precision.
    """
    if x.dtype != jnp.float32:
        return norm - t
    terms = jnp.concatenate(
        [*_exact_square_terms(x), *(-a[:, None] for a in _exact_square_terms(t))],
        axis=1,
    )
    denominator = norm + t
    safe = jnp.where(denominator > 0, denominator, 1)
    return jnp.where(denominator > 0, pairwise_sum(terms) / safe, norm - t)


def _exact_square_terms(a):
    """$(h^2, 2 h l, l^2)$ with $a = h + l$, each exact in float32: $h$ keeps the
    leading 12 bits of $a$'s significand, masked (no arithmetic a compiler could
    contract), and $l = a - h$ the other 12. Differentiable in $a$ through $l$."""
    bits = jax.lax.bitcast_convert_type(a, jnp.uint32) & jnp.uint32(0xFFFFF000)
    h = jax.lax.stop_gradient(jax.lax.bitcast_convert_type(bits, jnp.float32))
    low = a - h
    return h * h, 2 * h * low, low * low


class L1Cone(AbstractNormCone):
    """The $\\ell_1$ norm cone $\\{(t, x) : \\|x\\|_1 \\le t\\}$ (dual:
    $\\ell_\\infty$)."""

    def norm(self, x):
        return jnp.sum(jnp.abs(x), axis=1)

    def project(self, u, total):
        return jax.vmap(project_l1_norm_cone)(u)

    def project_dual(self, u):
        return jax.vmap(project_linf_norm_cone)(u)

    def face(self, pre, u, total):
        # Soft thresholding zeroes some entries of x (rows x_i = 0) and keeps the
        # signs of the others on the facet sum_i sign(x_i) x_i = t.
        p = self.project(pre, None)
        outside = self.excess(pre, None) > 0
        apex = outside & jnp.all(p == 0, axis=1)
        facet = outside & ~apex
        zero = jnp.concatenate([jnp.zeros_like(facet)[:, None], p[:, 1:] == 0], axis=1)
        rows, values, active = _coordinate_rows(
            u, (facet[:, None] & zero) | apex[:, None]
        )
        sign = jnp.sign(p[:, 1:])
        row = jnp.concatenate([-jnp.ones_like(p[:, :1]), sign], axis=1)
        # Compensated: the facet's value cancels to rounding level.
        value = pairwise_sum(jnp.concatenate([sign * u[:, 1:], -u[:, :1]], axis=1))
        return _one_row(row, value, facet, rows, values, active)


class LInfCone(AbstractNormCone):
    """The $\\ell_\\infty$ norm cone $\\{(t, x) : \\|x\\|_\\infty \\le t\\}$ (dual:
    $\\ell_1$)."""

    def norm(self, x):
        return jnp.max(jnp.abs(x), axis=1, initial=0.0)

    def project(self, u, total):
        return jax.vmap(project_linf_norm_cone)(u)

    def project_dual(self, u):
        return jax.vmap(project_l1_norm_cone)(u)

    def face(self, pre, u, total):
        # Moreau: Pi(pre) = pre + Pi_{K*}(-pre), so the entries of x that the dual
        # projection moves are clipped to |x_i| = t (rows sign(x_i) x_i = t).
        q = jax.vmap(project_l1_norm_cone)(-pre)
        outside = jnp.any(q != 0, axis=1)
        apex = outside & jnp.all(pre + q == 0, axis=1)
        clipped = (q[:, 1:] != 0) & (outside & ~apex)[:, None]
        count, size = u.shape
        rows, values, active = _coordinate_rows(u, apex[:, None])
        sign = jnp.sign(pre[:, 1:])
        eye = jnp.eye(size - 1, dtype=u.dtype)
        clip_rows = jnp.concatenate(
            [
                -jnp.ones((count, size - 1, 1), u.dtype),
                sign[:, :, None] * eye[None],
            ],
            axis=2,
        )
        # Row i + 1 of the block carries the clip row of x_i.
        rows = rows.at[:, 1:].set(
            jnp.where(clipped[:, :, None], clip_rows, rows[:, 1:])
        )
        values = values.at[:, 1:].set(
            jnp.where(clipped, sign * u[:, 1:] - u[:, :1], values[:, 1:])
        )
        return rows, values, active.at[:, 1:].set(active[:, 1:] | clipped)


class ScaledSimplex(AbstractPolishableCone):
    """The scaled simplex $\\{x \\ge 0 : \\sum_i x_i = r\\}$, one total $r$ per block.

    It is bounded, so its support function is finite everywhere:
    $r \\min_i v_i - \\langle v, o \\rangle$.
    """

    has_total: ClassVar[bool] = True

    def project(self, u, total):
        assert total is not None  # `has_total`: the blocks always pass one
        return jax.vmap(project_simplex)(u, total)

    def excess(self, u, total):
        assert total is not None
        return jnp.maximum(jnp.max(-u, axis=1), jnp.abs(jnp.sum(u, axis=1) - total))

    def support(self, v, offset, total):
        assert total is not None
        infimum = total * jnp.min(v, axis=1) - jnp.sum(v * offset, axis=1)
        return infimum, jnp.zeros(v.shape[:1], v.dtype)

    def face(self, pre, u, total):
        # The sum row always holds; the entries that the projection zeroes are
        # active (rows x_i = 0). The sum row takes the place of a largest entry's
        # row, which is never zeroed while r > 0.
        assert total is not None
        p = self.project(pre, total)
        rows, values, active = _coordinate_rows(u, p == 0)
        top = jax.nn.one_hot(jnp.argmax(p, axis=1), u.shape[1], dtype=bool)
        rows = jnp.where(top[:, :, None], jnp.ones_like(rows), rows)
        # Compensated: the sum's value cancels to rounding level.
        gap = pairwise_sum(jnp.concatenate([u, -total[:, None]], axis=1))
        values = jnp.where(top, gap[:, None], values)
        return rows, values, active | top
