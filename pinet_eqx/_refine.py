"""Residuals computed nearly exactly, for iterative refinement of the output.

In float32 the projection's output satisfies its active constraints, say
$E y = q$, only to about $\\sqrt{d}\\,\\varepsilon \\|E\\|\\,|y|$: each entry of $y$
carries the rounding of the matrix products that made it, and $E$ sums those
errors. Storing $y$ itself costs only $\\varepsilon |y|$ per entry. A step of
iterative refinement, $y \\leftarrow y - E^+ (E y - q)$, closes the gap when the
residual is computed far more accurately than $y$ (see `_active_set.refine` and
`_polish`).

The residual is computed with Ozaki's error-free splitting: $E$ (on the host from
its float64 values, or traced for per-instance data) and $y$ (per call) are cut
into slices of $b$ significant bits on a common scale per row, with
$2b + \\log_2 d \\le$ the working precision's significand, so that every slice
product $E_a y_c$ is computed exactly by an ordinary matrix-vector product, in any
summation order. The few exact partial products are then added with compensated
(Knuth two-sum) arithmetic. The cost is about ten matrix-vector products.
"""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

# Slices are kept while a + c < _N_SLICES (a, c: slice indices of E and y), which
# leaves the residual's relative error near 2^-(_N_SLICES * b).
_N_SLICES = 4


def slice_bits(d: int, dtype) -> int:
    """Bits per slice so that a length-`d` sum of slice products is exact."""
    significand = jnp.finfo(dtype).nmant + 1
    return (significand - math.ceil(math.log2(max(d, 2)))) // 2


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


def split_rows(E, bits: int, n_slices: int = _N_SLICES, xp=np):
    """Slices $E = \\sum_a E_a$ + a tiny remainder, each with `bits` bits on the
    scale of its row's largest entry, stacked.

    On the host (`xp=np`) from the float64 values, or traced (`xp=jax.numpy`) in
    the working precision; either way every slice is exact in float32.
    """
    _, exponent = xp.frexp(xp.abs(E).max(axis=1, keepdims=True))
    return xp.stack(_split(xp, E, exponent, bits, n_slices))


def _two_sum(a, b):
    """$(s, e)$ with $s = \\mathrm{fl}(a + b)$ and $s + e = a + b$ exactly."""
    s = a + b
    b_virtual = s - a
    return s, (a - (s - b_virtual)) + (b - b_virtual)


def accurate_sum(x: Float[Array, "count n"]) -> Float[Array, " count"]:
    """The sums of the rows of `x`, compensated (Kahan-Babuska-Neumaier): about
    as accurate as if computed in twice the precision, then rounded."""
    total, compensation = jnp.zeros_like(x[:, 0]), jnp.zeros_like(x[:, 0])
    for j in range(x.shape[1]):
        total, error = _two_sum(total, x[:, j])
        compensation = compensation + error
    return total + compensation


def exact_residual(E_slices, y, rhs, bits: int, low=None):
    """$E y - \\mathrm{rhs}$ for $E = \\sum_a E_a$, nearly exactly.

    **Arguments:**

    - `E_slices`: the slices of $E$ from `split_rows`, shape `(k, m, d)`.
    - `y`: the point, shape `(d,)`.
    - `rhs`: the right-hand side, shape `(m,)`.
    - `bits`: the slices' width, from `slice_bits`.
    - `low`: what the right-hand side lost to rounding, if known (it is then
        `rhs + low`), shape `(m,)`.

    **Returns:** the residual, shape `(m,)`.
    """
    n = E_slices.shape[0]
    _, exponent = jnp.frexp(jnp.max(jnp.abs(y)))
    y_slices = _split(jnp, y, exponent, bits, n)
    total = -rhs
    compensation = jnp.zeros_like(rhs) if low is None else -low
    for a in range(n):
        for c in range(n - a):
            # Exact: each product has at most 2 * bits bits on a common scale.
            total, error = _two_sum(total, E_slices[a] @ y_slices[c])
            compensation = compensation + error
    return total + compensation


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
    - `bits`: the slices' width.
    """

    slices: Float[Array, "k m d"]
    matrix: Float[Array, "m d"]
    low: Float[Array, " m"] | None
    total_low: Float[Array, " n_total"] | None
    per_instance: Bool[Array, " m"] | None
    bits: int = eqx.field(static=True)

    @classmethod
    def build(
        cls, M: np.ndarray, low=None, total_low=None, per_instance=None
    ) -> RowResidual:
        """From the float64 matrix $M$, on the host: the slices keep its float64
        digits, which float32 storage of $M$ would lose. Rows flagged
        `per_instance` are filled per call (`with_matrix`)."""
        M = np.asarray(M, np.float64)
        bits = slice_bits(M.shape[1], jnp.float32)

        def array(x):
            return None if x is None else jnp.asarray(x)

        return cls(
            slices=jnp.asarray(split_rows(M, bits)),
            matrix=jnp.asarray(M),
            low=array(low),
            total_low=array(total_low),
            per_instance=array(per_instance),
            bits=bits,
        )

    def with_matrix(self, M: Float[Array, "m d"]) -> RowResidual:
        """This residual for the whole (possibly traced) matrix $M$ of one
        instance: its `per_instance` rows are sliced from $M$, in float32."""
        assert self.per_instance is not None  # built with per-instance rows
        traced = split_rows(M.astype(jnp.float32), self.bits, xp=jnp)
        slices = jnp.where(self.per_instance[None, :, None], traced, self.slices)
        return dataclasses.replace(self, slices=slices, matrix=M)

    def totals_low(self, dtype):
        """What float32 rounding took from the simplex totals, or `None` (other
        precisions, or unknown)."""
        if self.total_low is None or dtype != jnp.float32:
            return None
        return self.total_low.astype(dtype)

    def __call__(self, y, rhs):
        """$M y - \\mathrm{rhs}$ at the stored (rounded) $y$."""
        rhs = rhs.astype(y.dtype)
        if y.dtype != jnp.float32:
            return self.matrix.astype(y.dtype) @ y - rhs
        # The slices must add up to the stored y: without the barrier XLA may
        # fuse the computation of y into them, unrounded (fused multiply-adds).
        y = jax.lax.optimization_barrier(y)
        low = None if self.low is None else self.low.astype(y.dtype)
        return exact_residual(self.slices.astype(y.dtype), y, rhs, self.bits, low)
