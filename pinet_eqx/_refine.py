"""Iterative refinement of the equality constraints with compensated residuals.

In float32 the projection's output satisfies $E y = q$ only to about
$\\sqrt{d}\\,\\varepsilon \\|E\\|\\,|y|$: each entry of $y$ carries the rounding of
the matrix products that made it, and $E$ sums those errors. Storing $y$ itself
costs only $\\varepsilon |y|$ per entry. One step of iterative refinement,
$y \\leftarrow y - E^+ (E y - q)$, closes the gap when the residual is computed
far more accurately than $y$: here with error-free transformations (Dekker's
product and Knuth's sum, Ogita-Rump-Oishi "Dot2") and the rounding error of $E$
itself ($E = E_{hi} + E_{lo}$, both in the working precision).
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float


def _two_sum(a, b):
    """$(s, e)$ with $s = \\mathrm{fl}(a + b)$ and $s + e = a + b$ exactly."""
    s = a + b
    b_virtual = s - a
    return s, (a - (s - b_virtual)) + (b - b_virtual)


def _split(a):
    """Veltkamp's split $a = hi + lo$ into halves of the significand."""
    bits = jnp.finfo(a.dtype).nmant + 1
    c = (2.0 ** ((bits + 1) // 2) + 1.0) * a
    hi = c - (c - a)
    return hi, a - hi


def _two_product(a, b):
    """$(p, e)$ with $p = \\mathrm{fl}(a b)$ and $p + e = a b$ exactly."""
    p = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    return p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def compensated_residual(M_hi, M_lo, y, rhs):
    """$(M_{hi} + M_{lo}) y - \\mathrm{rhs}$, as if computed in twice the precision.

    The products $M_{hi} y$ are split exactly into values and errors, the values
    are summed pairwise with exact error terms, and the errors (and the small
    $M_{lo} y$) are added at the end in the working precision.

    **Arguments:**

    - `M_hi`, `M_lo`: the matrix and its rounding error, shape `(m, d)`.
    - `y`: the point, shape `(d,)`.
    - `rhs`: the right-hand side, shape `(m,)`.

    **Returns:** the residual, shape `(m,)`.
    """
    products, errors = _two_product(M_hi, y[None, :])
    terms = jnp.concatenate([products, -rhs[:, None]], axis=1)
    error_terms = [errors.sum(axis=1), M_lo @ y]
    while terms.shape[1] > 1:
        if terms.shape[1] % 2:
            terms = jnp.concatenate([terms, jnp.zeros_like(terms[:, :1])], axis=1)
        terms, e = _two_sum(terms[:, 0::2], terms[:, 1::2])
        error_terms.append(e.sum(axis=1))
    return terms[:, 0] + sum(error_terms)


class EqualityRefinement(eqx.Module):
    """One refinement step $y \\leftarrow y - E^+ (E y - q)$ for fixed $E$.

    **Fields:**

    - `E_lo`: the rounding error of $E$ in the working precision,
        $E - \\mathrm{fl}(E)$ (zero when $E$ is stored in float64).
    - `pinv`: the pseudo-inverse $E^+$, shape `(d, m)`.
    """

    E_lo: Float[Array, "m d"]
    pinv: Float[Array, "d m"]

    @classmethod
    def build(cls, E: np.ndarray) -> EqualityRefinement:
        """From the float64 matrix $E$, on the host."""
        E = np.asarray(E, np.float64)
        stored = np.asarray(jnp.asarray(E), np.float64)
        return cls(E_lo=jnp.asarray(E - stored), pinv=jnp.asarray(np.linalg.pinv(E)))

    def __call__(self, y, E, q):
        """The refined $y$, given $E$ and $q$ as the projector holds them."""
        dtype = y.dtype
        r = compensated_residual(E.astype(dtype), self.E_lo.astype(dtype), y, q)
        return y - self.pinv.astype(dtype) @ r
