"""The masked active-row system of the active-set derivative, solved by
conjugate gradients through lineax.

With rows $B$ scaled to unit length (`unit_rows`, Jacobi preconditioning) and
an activity mask $a$, the system is $a \\odot G (a \\odot v) + (1 - a) \\odot v$
with $G = B B^\\top$: the Gram matrix of the active rows, the identity on the
others. Both the exact derivative (`_active_set`, `_face`) and the refinement
(`_refine`) solve it.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

from .._linalg.precision import FullPrecisionSolver


def row_gram(rows, v):
    """$B B^\\top v$ by two thin products."""
    return rows @ (v @ rows)


def _masked_mv(apply_gram, a, v):
    return a * apply_gram(a * v) + (1 - a) * v


def _masked_operator(apply_gram, active, structure):
    """$A v = a \\odot G (a \\odot v) + (1 - a) \\odot v$: the Gram matrix of the
    active rows, with the identity on the inactive ones (SPD where $G_{aa}$ is)."""
    a = active.astype(structure.dtype)
    # A pytree `Partial` of module-level functions, not a closure: lineax then
    # need not closure-convert it, a conversion that rejects the vectors without
    # sharding that lineax's abstract evaluation passes inside `shard_map`.
    mv = eqx.Partial(_masked_mv, apply_gram, a)
    tags = (lx.symmetric_tag, lx.positive_semidefinite_tag)
    return lx.FunctionLinearOperator(mv, structure, tags, closure_convert=False)


def solve_masked(apply_gram, active, rhs, solver):
    """$x = A^{-1} b$ for the masked active-row system, solved by lineax with
    `solver`.

    The system is symmetric, so its transpose is itself: `custom_linear_solve`
    says so to JAX, which then reuses the traced solve for reverse mode. Left to
    lineax's own transposition rule, reverse mode re-traces the solver four times
    (JVP, batching, transposition and its batching) and adds a checked
    (`throw=True`) transposed solve, a large share of the training step's
    tracing time (see `benchmarks/RESULTS.md`).
    """
    if rhs.size == 0:
        return rhs
    structure = jax.eval_shape(lambda: rhs)
    operator = _masked_operator(apply_gram, active, structure)

    solver = FullPrecisionSolver(solver)

    def solve(_, b):
        return lx.linear_solve(operator, b, solver, throw=False).value

    return jax.lax.custom_linear_solve(operator.mv, rhs, solve, symmetric=True)


def unit_rows(M):
    """`(Ms, scale, usable)`: the rows of `M` scaled to unit length (Jacobi
    preconditioning of their Gram matrix), the scales, and which rows are
    non-zero (a zero row keeps scale 0 and must be left out of the system)."""
    norms = jnp.linalg.norm(M, axis=1)
    usable = norms > 0
    scale = jnp.where(usable, 1 / jnp.where(usable, norms, 1), 0)
    return scale[:, None] * M, scale, usable


def solve_rows(Ms, active, rhs, solver):
    """$\\zeta$ with $(M_s M_s^\\top)_{aa} \\zeta_a = \\mathrm{rhs}_a$ on the active
    rows $a$ (and $\\zeta = \\mathrm{rhs}$, zero, on the others)."""
    return solve_masked(eqx.Partial(row_gram, Ms), active, rhs, solver)


# Up to this many rows the active system is solved directly (a Cholesky
# factorisation of their Gram matrix, regularised): cheaper than conjugate
# gradients, whose step count under `vmap` is the batch's worst, and unaffected
# by dependent active rows (a cone's apex next to equality rows).
_DIRECT_ROWS = 512
# The regularisation, relative to the unit diagonal of the scaled rows' Gram
# matrix: it bounds the condition number of the factorised matrix, and leaves
# a correction's error at about this fraction on its weakest directions.
_RIDGE = 1e-6


def solve_active(Ms, active, rhs, solver):
    """$\\zeta$ of the masked active-row system of the unit rows `Ms`: a direct
    solve up to `_DIRECT_ROWS` rows, else `solver` (see `solve_rows`)."""
    if Ms.shape[0] <= _DIRECT_ROWS:
        return _direct_solve(Ms, active, rhs)
    return solve_rows(Ms, active, rhs, solver)


def _direct_solve(Ms, active, rhs):
    """$\\zeta$ with $(G_{aa} + \\lambda I) \\zeta_a = \\mathrm{rhs}_a$,
    $G = M_s M_s^\\top$, and $\\zeta = 0$ on the inactive rows."""
    a = active.astype(Ms.dtype)
    G = (Ms @ Ms.T) * (a[:, None] * a[None, :])
    G = G + jnp.diag(jnp.where(active, _RIDGE, 1.0).astype(Ms.dtype))
    factor = jax.scipy.linalg.cho_factor(G)
    return a * jax.scipy.linalg.cho_solve(factor, rhs)
