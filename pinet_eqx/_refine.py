"""Iterative refinement of the equality constraints with an exact residual.

In float32 the projection's output satisfies $E y = q$ only to about
$\\sqrt{d}\\,\\varepsilon \\|E\\|\\,|y|$: each entry of $y$ carries the rounding of
the matrix products that made it, and $E$ sums those errors. Storing $y$ itself
costs only $\\varepsilon |y|$ per entry. One step of iterative refinement,
$y \\leftarrow y - E^+ (E y - q)$, closes the gap when the residual is computed
far more accurately than $y$.

The residual is computed with Ozaki's error-free splitting: $E$ (on the host, from
its float64 values) and $y$ (per call) are cut into slices of $b$ significant bits
on a common scale per row, with $2b + \\log_2 d \\le$ the working precision's
significand, so that every slice product $E_a y_c$ is computed exactly by an
ordinary matrix-vector product, in any summation order. The few exact partial
products are then added with compensated (Knuth two-sum) arithmetic. The cost is
about ten matrix-vector products.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

# Slices are kept while a + c < _N_SLICES (a, c: slice indices of E and y), which
# leaves the residual's relative error near 2^-(_N_SLICES * b).
_N_SLICES = 4


def slice_bits(d: int, dtype) -> int:
    """Bits per slice so that a length-`d` sum of slice products is exact."""
    significand = jnp.finfo(dtype).nmant + 1
    return (significand - math.ceil(math.log2(max(d, 2)))) // 2


def split_rows(E: np.ndarray, bits: int, n_slices: int = _N_SLICES) -> np.ndarray:
    """Slices $E = \\sum_a E_a$ + a tiny remainder, each with `bits` bits per row.

    Computed in float64 on the host; every slice is exact in float32.
    """
    _, exponent = np.frexp(np.abs(E).max(axis=1, keepdims=True))
    remainder = np.asarray(E, np.float64)
    slices = []
    for a in range(n_slices):
        unit = np.ldexp(1.0, exponent - (a + 1) * bits)
        piece = np.round(remainder / unit) * unit
        slices.append(piece)
        remainder = remainder - piece
    return np.stack(slices)


def _split_vector(y, bits: int, n_slices: int):
    """Slices $y = \\sum_c y_c$, each with `bits` bits on the scale of $\\max|y|$."""
    _, exponent = jnp.frexp(jnp.max(jnp.abs(y)))
    slices = []
    remainder = y
    for c in range(n_slices):
        unit = jnp.ldexp(jnp.ones((), y.dtype), exponent - (c + 1) * bits)
        piece = jnp.round(remainder / unit) * unit
        slices.append(piece)
        remainder = remainder - piece
    return slices


def _two_sum(a, b):
    """$(s, e)$ with $s = \\mathrm{fl}(a + b)$ and $s + e = a + b$ exactly."""
    s = a + b
    b_virtual = s - a
    return s, (a - (s - b_virtual)) + (b - b_virtual)


def exact_residual(E_slices, y, rhs, bits: int):
    """$E y - \\mathrm{rhs}$ for $E = \\sum_a E_a$, nearly exactly.

    **Arguments:**

    - `E_slices`: the slices of $E$ from `split_rows`, shape `(k, m, d)`.
    - `y`: the point, shape `(d,)`.
    - `rhs`: the right-hand side, shape `(m,)`.
    - `bits`: the slices' width, from `slice_bits`.

    **Returns:** the residual, shape `(m,)`.
    """
    n = E_slices.shape[0]
    y_slices = _split_vector(y, bits, n)
    total, compensation = -rhs, jnp.zeros_like(rhs)
    for a in range(n):
        for c in range(n - a):
            # Exact: each product has at most 2 * bits bits on a common scale.
            total, error = _two_sum(total, E_slices[a] @ y_slices[c])
            compensation = compensation + error
    return total + compensation


class RowResidual(eqx.Module):
    """$M y - r$ for a fixed matrix $M$, computed nearly exactly (Ozaki slices).

    **Fields:**

    - `slices`: Ozaki slices of $M$ (see `split_rows`), shape `(k, m, d)`.
    - `bits`: the slices' width.
    """

    slices: Float[Array, "k m d"]
    bits: int = eqx.field(static=True)

    @classmethod
    def build(cls, M: np.ndarray) -> RowResidual:
        """From the float64 matrix $M$, on the host, for JAX's default float."""
        M = np.asarray(M, np.float64)
        bits = slice_bits(M.shape[1], jnp.result_type(float))
        return cls(slices=jnp.asarray(split_rows(M, bits)), bits=bits)

    def __call__(self, y, rhs):
        """$M y - \\mathrm{rhs}$ at the stored (rounded) $y$."""
        # The slices must add up to the stored y: without the barrier XLA may
        # fuse the computation of y into them, unrounded (fused multiply-adds).
        y = jax.lax.optimization_barrier(y)
        slices = self.slices.astype(y.dtype)
        return exact_residual(slices, y, rhs.astype(y.dtype), self.bits)


class EqualityRefinement(eqx.Module):
    """One refinement step $y \\leftarrow y - E^+ (E y - q)$ for fixed $E$.

    **Fields:**

    - `residual`: the exact residual of $E$.
    - `pinv`: the pseudo-inverse $E^+$, shape `(d, m)`.
    """

    residual: RowResidual
    pinv: Float[Array, "d m"]

    @classmethod
    def build(cls, E: np.ndarray) -> EqualityRefinement:
        """From the float64 matrix $E$, on the host, for JAX's default float."""
        return cls(
            residual=RowResidual.build(E),
            pinv=jnp.asarray(np.linalg.pinv(np.asarray(E, np.float64))),
        )

    def __call__(self, y, q):
        """The refined $y$, for the right-hand side $q$."""
        return y - self.pinv.astype(y.dtype) @ self.residual(y, q)
