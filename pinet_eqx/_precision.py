"""Full-precision matrix products inside the projection."""

from __future__ import annotations

import functools

import jax


def full_precision(fn):
    """Trace `fn` with every matrix product at the full precision of its dtype.

    On NVIDIA GPUs since Ampere, XLA computes float32 products in TensorFloat-32
    by default (10-bit mantissa, relative error about 1e-3). The projection
    multiplies by its null-space basis hundreds of times, so that error becomes
    a constraint violation of about 1e-2, where float32 allows 1e-6. JAX reads
    the precision when it traces a product, so this wraps the functions that
    trace the forward iteration, the violation and the implicit backward pass.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return wrapper
