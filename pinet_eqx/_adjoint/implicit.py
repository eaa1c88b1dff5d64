"""Implicit differentiation of the Douglas-Rachford fixed point (paper eq. 8-9).

At a fixed point $s^\\star = \\Phi(s^\\star, \\theta)$ the implicit function theorem
gives the tangent $\\dot s = (I - \\partial_s \\Phi)^{-1} \\partial_\\theta \\Phi\\,
\\dot\\theta$. It is written as a `jax.custom_jvp` around one `lineax.linear_solve`
(the optimistix way): forward mode uses it as it is, and reverse mode transposes
it, solving $(I - \\partial_s \\Phi)^\\top \\xi = \\bar s$ with the same solver.
The Jacobian products come from one `jax.linearize` of the step at $s^\\star$.
This is the general path (cones, simplices); polyhedral sets use the closed form
of `_active_set`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx

from .._linalg.precision import FullPrecisionSolver
from .._solver import douglas_rachford as dr


def _prepare(theta, op, sigma, groups):
    # A per-instance affine projection travels in theta so that derivatives reach
    # the matrices it was factorised from; a fixed one is a non-differentiable
    # argument.
    y_raw, data, theta_op = theta
    op = op if theta_op is None else theta_op
    return dr.prepare(y_raw, data, op, sigma, groups), op


def _phi(s, theta, op, hyper, groups):
    sigma, omega = hyper
    P, op = _prepare(theta, op, sigma, groups)
    return dr.phi(s, P, op, omega)


@eqx.filter_custom_jvp
def fixed_point(
    theta, s0, op, hyper, *, groups, n_max: int, tol, solver, n_min: int = 0
):
    """$s^\\star(\\theta)$ by Douglas-Rachford, differentiated implicitly.

    **Arguments:**

    - `theta`: the differentiated data `(y_raw, data, op)`: the point, the
        `InstanceData` (without its matrices) and, for per-instance matrices, the
        affine projection factorised from them (else `None`).
    - `s0`: the start (not differentiated).
    - `op`: the fixed affine projection, or `None`.
    - `hyper`: `(sigma, omega)`.
    - `groups`: the static cone layout.
    - `n_max`, `tol`, `n_min`: the iteration's cap, tolerance and fixed first
        steps (see `_douglas_rachford.iterate`).
    - `solver`: the `lineax` solver of the tangent system.

    **Returns:** `(s_K, n_iter, fixed_point_residual)`.
    """
    sigma, omega = hyper
    P, op = _prepare(theta, op, sigma, groups)
    return dr.iterate(s0, P, op, omega, n_max, tol, n_min)


@fixed_point.def_jvp
def _fixed_point_jvp(primals, tangents, *, groups, n_max, tol, solver, n_min=0):
    theta, s0, op, hyper = primals
    t_theta = tangents[0]
    out = fixed_point(
        theta,
        s0,
        op,
        hyper,
        groups=groups,
        n_max=n_max,
        tol=tol,
        solver=solver,
        n_min=n_min,
    )
    s_star = out[0]
    if t_theta is None:
        return out, (None, None, None)
    # Symbolic zeros (data that is not differentiated) become real zeros.
    t_theta = jax.tree.map(
        lambda t, x: t if t is not None or x is None else jnp.zeros_like(x),
        t_theta,
        theta,
        is_leaf=lambda x: x is None,
    )
    _, rhs = jax.jvp(
        lambda th: _phi(s_star, th, op, hyper, groups), (theta,), (t_theta,)
    )
    _, lin = jax.linearize(lambda s: _phi(s, theta, op, hyper, groups), s_star)
    operator = lx.FunctionLinearOperator(
        lambda v: v - lin(v), jax.eval_shape(lambda: s_star)
    )
    transposed = operator.transpose()

    # `custom_linear_solve` gives JAX the transposed solve directly, so reverse
    # mode traces each solve once; left to lineax's own transposition rule it
    # re-traces the solver in every abstract evaluation (JVP, batching,
    # transposition) and adds a checked (`throw=True`) transposed solve.
    solver = FullPrecisionSolver(solver)

    def solve(_, b):
        return lx.linear_solve(operator, b, solver, throw=False).value

    def transpose_solve(_, b):
        return lx.linear_solve(transposed, b, solver, throw=False).value

    ds = jax.lax.custom_linear_solve(operator.mv, rhs, solve, transpose_solve)
    return out, (ds, None, None)
