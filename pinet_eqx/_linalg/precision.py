"""Full-precision matrix products inside the projection."""

from __future__ import annotations

import functools
from typing import Any

import jax
import lineax as lx


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


class FullPrecisionSolver(lx.AbstractLinearSolver):
    """A lineax solver whose solve is traced with full-precision products.

    `lineax.linear_solve` binds the solve as a primitive whose body (the Krylov
    loop, with the operator's products and the inner products) is traced only
    when the program is lowered, after `full_precision` has exited; that body
    would then run at XLA's default precision, TensorFloat-32 on NVIDIA GPUs,
    and the gradient would be accurate to 1e-4 instead of 1e-7 in float32.

    **Arguments:**

    - `solver`: the lineax solver to run.
    """

    solver: lx.AbstractLinearSolver

    @full_precision
    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        return self.solver.init(operator, options)

    @full_precision
    def compute(self, state, vector, options):
        return self.solver.compute(state, vector, options)

    def transpose(self, state, options):
        return self.solver.transpose(state, options)

    def conj(self, state, options):
        return self.solver.conj(state, options)

    def assume_full_rank(self):
        return self.solver.assume_full_rank()
