"""Implicit differentiation of the Douglas-Rachford fixed point (paper eq. 8-9).

At a fixed point $s^\\star = \\Phi(s^\\star, \\theta)$ the implicit function theorem
gives $\\bar\\theta = \\xi^\\top \\partial_\\theta \\Phi$ where
$(I - \\partial_s \\Phi)^\\top \\xi = \\bar s$. The linear system is solved matrix-free
with `lineax.BiCGStab`, one instance at a time (under `jax.vmap` every instance has
its own dot products and stopping test, so a large cotangent in one instance cannot
change another's gradient).
"""

from __future__ import annotations

import warnings

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import lineax as lx

from . import _douglas_rachford as dr
from ._errors import BWD_NOT_CONVERGED, BWD_NOT_CONVERGED_RAISE
from ._precision import full_precision


class BackwardNotConvergedWarning(RuntimeWarning):
    """The implicit backward solve stopped at `n_iter_bwd` before its tolerance."""


def _warn_bwd():
    warnings.warn(BWD_NOT_CONVERGED, BackwardNotConvergedWarning, stacklevel=2)


def _bicgstab_with_restarts(operator, rhs, cfg: dr.Config):
    """Solve `operator @ xi = rhs` with `lineax.BiCGStab`, restarting on breakdown.

    Restarting from the current iterate (which resets the shadow residual) is the
    standard remedy for BiCGStab breakdown. It matters in float32: lineax's
    breakdown test without x64 is `rho < 1e-16` (signed), so it stops whenever the
    legitimately signed scalars rho or alpha turn negative, often after 3-4 steps.
    At most `n_iter_bwd` BiCGStab steps are taken in total, and the iterate with the
    smallest residual is returned, so a solve that goes astray (a near-breakdown
    in float32) can never make the gradient worse than `xi = 0`; a non-finite
    iterate is never returned.
    """

    def solve(y0, budget):
        solver = lx.BiCGStab(rtol=cfg.bwd_rtol, atol=cfg.bwd_atol, max_steps=budget)
        # The warm start carries no gradient (optimistix convention).
        options = {"y0": jax.lax.stop_gradient(y0)}
        sol = lx.linear_solve(operator, rhs, solver, options=options, throw=False)
        # A breakdown can leave a NaN iterate. Its residual may come out as -inf
        # rather than NaN inside a fused jitted step (XLA's max-reduction need not
        # propagate NaN), which would make it the "best" iterate; so a non-finite
        # iterate is replaced by zero (also the restart point) and ranked last.
        finite = jnp.all(jnp.isfinite(sol.value))
        value = jnp.where(finite, sol.value, jnp.zeros_like(sol.value))
        residual = jnp.max(jnp.abs(operator.mv(value) - rhs))
        residual = jnp.where(finite & jnp.isfinite(residual), residual, jnp.inf)
        return value, sol.result, sol.stats["num_steps"], residual

    def cond(carry):
        _, result, used, _, _ = carry
        return (result == lx.RESULTS.breakdown) & (used < cfg.n_iter_bwd)

    def body(carry):
        xi, _, used, best, best_residual = carry
        xi, result, steps, residual = solve(xi, cfg.n_iter_bwd - used)
        better = residual < best_residual
        best = jnp.where(better, xi, best)
        best_residual = jnp.where(better, residual, best_residual)
        # A restart that makes no progress cannot loop forever.
        return xi, result, used + jnp.maximum(steps, 1), best, best_residual

    zero = jnp.zeros_like(rhs)
    xi, result, steps, residual = solve(zero, cfg.n_iter_bwd)
    start_residual = jnp.max(jnp.abs(rhs))
    better = residual < start_residual
    carry = (
        xi,
        result,
        steps,
        jnp.where(better, xi, zero),
        jnp.where(better, residual, start_residual),
    )
    _, result, _, best, _ = jax.lax.while_loop(cond, body, carry)
    return best, result


def _operator(theta, op):
    # A per-instance affine projection travels in theta so that gradients reach the
    # matrices it was factorised from; a fixed one is a non-differentiable argument.
    return theta["op"] if "op" in theta else op


@eqx.filter_custom_vjp
def fixed_point(theta, s0, op, hyper, groups, cfg: dr.Config, n_max: int, tol):
    """$s^\\star(\\theta)$ by Douglas-Rachford, differentiated implicitly.

    `theta` (the only differentiated argument) holds `y_raw`, `q`, the bounds, the
    cone data and, for per-instance matrices, the affine projection `op`;
    `hyper` is `(sigma, omega)` and `groups` the static cone layout.
    """
    sigma, omega = hyper
    op = _operator(theta, op)
    P = dr.prepare(theta, op, sigma, groups)
    return dr.iterate(s0, P, op, omega, n_max, tol)


@fixed_point.def_fwd
def _fixed_point_fwd(perturbed, theta, s0, op, hyper, groups, cfg, n_max, tol):
    del perturbed
    out = fixed_point.fn(theta, s0, op, hyper, groups, cfg, n_max, tol)
    return out, out[0]


@fixed_point.def_bwd
@full_precision
def _fixed_point_bwd(
    s_star, grad_obj, perturbed, theta, s0, op, hyper, groups, cfg, n_max, tol
):
    del perturbed, s0, n_max, tol
    sigma, omega = hyper
    s_bar = grad_obj[0]

    def phi(s, th):
        op_th = _operator(th, op)
        return dr.phi(s, dr.prepare(th, op_th, sigma, groups), op_th, omega)

    _, vjp_s = jax.vjp(lambda s: phi(s, theta), s_star)

    def adjoint(xi):
        return xi - vjp_s(xi)[0]

    operator = lx.FunctionLinearOperator(adjoint, jax.eval_shape(lambda: s_star))
    xi, result = _bicgstab_with_restarts(operator, s_bar, cfg)
    failed = result != lx.RESULTS.successful
    if cfg.bwd_failure == "raise":
        xi = eqx.error_if(xi, failed, BWD_NOT_CONVERGED_RAISE)
    elif cfg.bwd_failure == "warn":
        # `unvmap_any` reduces over every vmapped axis, so the callback fires at
        # most once per backward pass instead of once per instance.
        jax.lax.cond(
            eqxi.unvmap_any(failed),
            lambda: jax.debug.callback(_warn_bwd),
            lambda: None,
        )
    _, vjp_theta = jax.vjp(lambda th: phi(s_star, th), theta)
    return vjp_theta(xi)[0]
