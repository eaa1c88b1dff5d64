"""Residuals computed nearly exactly, for iterative refinement of the output.

In float32 the projection's output satisfies its active constraints, say
$E y = q$, only to about $\\sqrt{d}\\,\\varepsilon \\|E\\|\\,|y|$: each entry of $y$
carries the rounding of the matrix products that made it, and $E$ sums those
errors. Storing $y$ itself costs only $\\varepsilon |y|$ per entry. A step of
iterative refinement, $y \\leftarrow y - E^+ (E y - q)$, closes the gap when the
residual is computed far more accurately than $y$ (see `_refine`).

The residual is computed with Ozaki's error-free splitting: $E$ (on the host from
its float64 values, or traced for per-instance data) is cut into slices of $b_E$
significant bits on a common scale per row, and $y$ (per call) into slices of
$b_y$ bits, with $b_E + b_y + \\log_2 d \\le$ the working precision's significand,
so that every slice product $E_a y_c$ is computed exactly by an ordinary
matrix-vector product, in any summation order. The exact partial products are then
added with compensated (Knuth two-sum) arithmetic. A single instance's residual is
memory-bound, so the plan (`SlicePlan`) takes as few slices of $E$ as it can, and
many narrow ones of the cheap $y$.
"""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

# The residual's relative accuracy, in bits beyond the working precision's
# significand: slice products below 2^-(significand + _EXTRA_BITS) of the
# largest are left out, 16x below the rounding of a stored y.
_EXTRA_BITS = 4


@dataclasses.dataclass(frozen=True)
class SlicePlan:
    """How a matrix and a vector are cut into Ozaki slices for exact products.

    The matrix gets `n_matrix` slices of `matrix_bits` bits, the vector
    `n_vector` slices of `vector_bits` bits, with `matrix_bits + vector_bits +
    log2(d)` within the working precision's significand, so that every product
    of two slices is exact. The products kept are those above $2^{-T}$ of the
    largest, $T$ the significand plus `_EXTRA_BITS`: slice $a$ of the matrix
    meets the vector's first `columns(a)` slices.
    """

    matrix_bits: int
    n_matrix: int
    vector_bits: int
    n_vector: int
    target_bits: int

    @classmethod
    def for_length(cls, d: int, dtype=jnp.float32) -> SlicePlan:
        """The plan for products of length `d` in `dtype`, of least cost.

        A single instance's residual is memory-bound (each slice of the matrix
        is read once per call); a batch's is compute-bound (a cost per slice
        product). The cost counts a slice of the matrix as eight products.
        """
        significand = jnp.finfo(dtype).nmant + 1
        target = significand + _EXTRA_BITS
        free = significand - math.ceil(math.log2(max(d, 2)))

        def plan(matrix_bits):
            vector_bits = free - matrix_bits
            return cls(
                matrix_bits,
                -(-target // matrix_bits),
                vector_bits,
                -(-target // vector_bits),
                target,
            )

        plans = [plan(b) for b in range(1, free)]
        return min(plans, key=lambda p: 8 * p.n_matrix + p.n_products)

    def columns(self, a: int) -> int:
        """How many slices of the vector meet slice `a` of the matrix."""
        left = self.target_bits - a * self.matrix_bits
        return max(0, min(self.n_vector, -(-left // self.vector_bits)))

    @property
    def n_products(self) -> int:
        """The number of exact slice products."""
        return sum(self.columns(a) for a in range(self.n_matrix))


def _split(xp, x, exponent, bits: int, n_slices: int):
    """Slices $x = \\sum_a x_a$ + a tiny remainder, slice $a$ rounded to the unit
    $2^{e - (a + 1) b}$ (`exponent` $e$, broadcast against `x`), with `xp` NumPy
    (on the host, in float64) or `jax.numpy` (traced)."""
    remainder = x
    slices = []
    for a in range(n_slices):
        unit = xp.ldexp(xp.ones((), x.dtype), exponent - (a + 1) * bits)
        piece = xp.round(remainder / unit) * unit
        slices.append(piece)
        remainder = remainder - piece
    return slices


def split_rows(E, plan: SlicePlan, xp=np):
    """Slices $E = \\sum_a E_a$ + a tiny remainder, as `plan` cuts a matrix, on
    the scale of each row's largest entry, stacked.

    On the host (`xp=np`) from the float64 values, or traced (`xp=jax.numpy`) in
    the working precision; either way every slice is exact in float32.
    """
    _, exponent = xp.frexp(xp.abs(E).max(axis=1, keepdims=True))
    return xp.stack(_split(xp, E, exponent, plan.matrix_bits, plan.n_matrix))


def two_sum(a, b):
    """$(s, e)$ with $s = \\mathrm{fl}(a + b)$ and $s + e = a + b$ exactly."""
    s = a + b
    b_virtual = s - a
    return s, (a - (s - b_virtual)) + (b - b_virtual)


def pairwise_sum(x: Float[Array, "count n"]) -> Float[Array, " count"]:
    """The sums of the rows of `x`, in about twice the working precision: a
    pairwise reduction whose partial sums carry their rounding errors (Knuth's
    two-sum), vectorised over the $\\log_2 n$ levels."""
    high, low = x, jnp.zeros_like(x)
    while high.shape[1] > 1:
        if high.shape[1] % 2:
            pad = ((0, 0), (0, 1))
            high, low = jnp.pad(high, pad), jnp.pad(low, pad)
        high, error = two_sum(high[:, 0::2], high[:, 1::2])
        low = low[:, 0::2] + low[:, 1::2] + error
    return high[:, 0] + low[:, 0]


def stored(y):
    """`y` rounded to its dtype, as every consumer the compiler fuses it into
    sees it.

    XLA recomputes a cheap elementwise result such as $y = d \\odot z$ inside
    each of its consumers, and may contract its product with a consumer's
    addition into a fused multiply-add, which does not round the product: the
    consumer then sees a slightly different $y$ than the one stored, and a
    residual or a correction computed from it misses the stored point by the
    rounding it is meant to remove. (`jax.lax.optimization_barrier` does not
    prevent this: XLA removes it before fusion.) Adding a zero known only at run
    time rounds the value first, since a contraction of the product with it is
    $\\mathrm{fl}(d z + 0) = \\mathrm{fl}(d z)$, and subtracting it changes
    nothing.
    """
    zero = jnp.minimum(jnp.abs(y), 0)
    return (y + zero) - zero


def exact_residual(E_slices, y, rhs, plan: SlicePlan, low=None):
    """$E y - \\mathrm{rhs}$ for $E = \\sum_a E_a$, nearly exactly.

    **Arguments:**

    - `E_slices`: the slices of $E$ from `split_rows`, shape `(k, m, d)`.
    - `y`: the point, shape `(d,)`.
    - `rhs`: the right-hand side, shape `(m,)`.
    - `plan`: the `SlicePlan` that cut $E$.
    - `low`: what the right-hand side lost to rounding, if known (it is then
        `rhs + low`), shape `(m,)`.

    **Returns:** the residual $r$ rounded to the working precision, and what
    that rounding took from it, $r_{low}$ (so $r + r_{low}$ is the residual to
    about twice the working precision), each of shape `(m,)`.
    """
    _, exponent = jnp.frexp(jnp.max(jnp.abs(y)))
    pieces = _split(jnp, y, exponent, plan.vector_bits, plan.n_vector)
    y_slices = jnp.stack(pieces, axis=1)
    # One product per slice of E, with all the slices of y it meets: it reads
    # each slice of E once (a single instance's residual is memory-bound) and
    # computes no product that the sum skips (a batch's is compute-bound).
    total = -rhs
    compensation = jnp.zeros_like(rhs) if low is None else -low
    for a in range(plan.n_matrix):
        products = E_slices[a] @ y_slices[:, : plan.columns(a)]
        for c in range(plan.columns(a)):
            # Exact: each product has at most matrix_bits + vector_bits bits
            # on a common scale.
            total, error = two_sum(total, products[:, c])
            compensation = compensation + error
    return two_sum(total, compensation)


class RowResidual(eqx.Module):
    """$M y - r$ for a fixed matrix $M$, computed nearly exactly.

    In float32 the residual is computed from Ozaki slices; in wider precisions
    an ordinary product is already far more accurate than the targets (and the
    float32 slices would truncate $y$).

    **Fields:**

    - `slices`: float32 Ozaki slices of $M$ (see `split_rows`), shape
        `(k, m, d)`.
    - `matrix`: $M$ itself, for the other precisions.
    - `low`: what the fixed right-hand sides lose to float32 rounding (zero
        where they are `Parameter`s, which arrive in the working precision), so
        that a float32 residual is taken against the float64 data; `None` when
        unknown.
    - `total_low`: the same for the simplex totals, or `None`.
    - `per_instance`: which rows are per-instance data (sliced per call by
        `with_matrix`), or `None`.
    - `plan`: how the slices are cut.
    """

    slices: Float[Array, "k m d"]
    matrix: Float[Array, "m d"]
    low: Float[Array, " m"] | None
    total_low: Float[Array, " n_total"] | None
    per_instance: Bool[Array, " m"] | None
    plan: SlicePlan = eqx.field(static=True)

    @classmethod
    def build(
        cls, M: np.ndarray, low=None, total_low=None, per_instance=None
    ) -> RowResidual:
        """From the float64 matrix $M$, on the host: the slices keep its float64
        digits, which float32 storage of $M$ would lose. Rows flagged
        `per_instance` are filled per call (`with_matrix`)."""
        M = np.asarray(M, np.float64)
        plan = SlicePlan.for_length(M.shape[1])

        def array(x):
            return None if x is None else jnp.asarray(x)

        return cls(
            slices=jnp.asarray(split_rows(M, plan)),
            matrix=jnp.asarray(M),
            low=array(low),
            total_low=array(total_low),
            per_instance=array(per_instance),
            plan=plan,
        )

    def with_matrix(self, M: Float[Array, "m d"]) -> RowResidual:
        """This residual for the whole (possibly traced) matrix $M$ of one
        instance: its `per_instance` rows are sliced from $M$, in float32."""
        assert self.per_instance is not None  # built with per-instance rows
        traced = split_rows(M.astype(jnp.float32), self.plan, xp=jnp)
        slices = jnp.where(self.per_instance[None, :, None], traced, self.slices)
        return dataclasses.replace(self, slices=slices, matrix=M)

    def totals_low(self, dtype):
        """What float32 rounding took from the simplex totals, or `None` (other
        precisions, or unknown)."""
        if self.total_low is None or dtype != jnp.float32:
            return None
        return self.total_low.astype(dtype)

    def __call__(self, y, rhs):
        """$M y - \\mathrm{rhs}$ at the stored (rounded) $y$, and what its
        rounding to the working precision took from it (zero outside float32)."""
        rhs = rhs.astype(y.dtype)
        if y.dtype != jnp.float32:
            r = self.matrix.astype(y.dtype) @ y - rhs
            return r, jnp.zeros_like(r)
        # The slices must add up to the stored y (see `stored`).
        y = stored(y)
        low = None if self.low is None else self.low.astype(y.dtype)
        return exact_residual(self.slices.astype(y.dtype), y, rhs, self.plan, low)


# The smallest magnitude a weight sees, relative to the largest: it bounds the
# weights' spread (and the weighted system's conditioning) to 1 / _WEIGHT_FLOOR.
_WEIGHT_FLOOR = 1e-2


def rounding_weights(y):
    """Weights $w_j \\propto \\max(|y_j|, 10^{-2} \\|y\\|_\\infty)$, the
    coordinates' grid spacing, that put a correction where the floating-point
    grid is fine.

    Once the residuals are at the rounding of $y$, the minimum-norm correction
    is below half a unit in the last place of most coordinates and rounds away.
    Minimising $\\|w \\odot \\delta\\|$ instead moves the small coordinates,
    whose grid is fine enough to represent the correction, so the rounded point
    meets its active constraints more closely than a rounding of the exact
    projection does. The move stays at rounding level.
    """
    size = jnp.max(jnp.abs(y))
    scale = jnp.where(size > 0, size, 1)
    return jnp.maximum(jnp.abs(y), _WEIGHT_FLOOR * scale) / scale
