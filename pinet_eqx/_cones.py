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
from jaxtyping import Array, Float

from ._primitives import (
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


class AbstractNormCone(AbstractCone):
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


class L1Cone(AbstractNormCone):
    """The $\\ell_1$ norm cone $\\{(t, x) : \\|x\\|_1 \\le t\\}$ (dual:
    $\\ell_\\infty$)."""

    def norm(self, x):
        return jnp.sum(jnp.abs(x), axis=1)

    def project(self, u, total):
        return jax.vmap(project_l1_norm_cone)(u)

    def project_dual(self, u):
        return jax.vmap(project_linf_norm_cone)(u)


class LInfCone(AbstractNormCone):
    """The $\\ell_\\infty$ norm cone $\\{(t, x) : \\|x\\|_\\infty \\le t\\}$ (dual:
    $\\ell_1$)."""

    def norm(self, x):
        return jnp.max(jnp.abs(x), axis=1, initial=0.0)

    def project(self, u, total):
        return jax.vmap(project_linf_norm_cone)(u)

    def project_dual(self, u):
        return jax.vmap(project_l1_norm_cone)(u)


class ScaledSimplex(AbstractCone):
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
