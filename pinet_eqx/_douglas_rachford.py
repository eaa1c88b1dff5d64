"""The Douglas-Rachford iteration of paper Algorithm 1, in equilibrated coordinates.

One step maps the governing sequence $s_k \\in \\mathbb{R}^{d + m}$ to

$$z = \\Pi_{\\tilde{\\mathcal{A}}}(s_k),\\quad
t = \\mathrm{prox}_{\\sigma \\tilde h}(2z - s_k),\\quad
s_{k+1} = s_k + \\omega (t - z),$$

where the $y$-block of the prox is the box projection of
$(2\\sigma d_i y_{raw,i} + 2 z_i - s_i) / (1 + 2\\sigma d_i^2)$ (paper App. H.1) and the
$w$-block is the box projection of $2 z_w - s_w$. Both blocks are written as one
clip, $t = \\mathrm{clip}(a + c \\odot (2z - s), \\ell, u)$ with $a_w = 0$, $c_w = 1$,
so that each iteration is two matrix products and one fused elementwise pass.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._affine import AbstractAffineProjection

CHECK_EVERY = 5


class Prepared(eqx.Module):
    """Per-instance quantities hoisted out of the loop, of length $d + m$ except
    `part`, the affine projection's particular term (its length depends on the
    factorisation form)."""

    a: Float[Array, " n"]
    c: Float[Array, " n"]
    part: Float[Array, " p"]
    lower: Float[Array, " n"]
    upper: Float[Array, " n"]
    scale: Float[Array, " n"]


class Config(NamedTuple):
    """Hashable backward-pass settings passed as a static argument."""

    bwd_rtol: float
    bwd_atol: float
    n_iter_bwd: int
    bwd_failure: str


def prepare(theta: dict, op: AbstractAffineProjection, sigma) -> Prepared:
    """Scale the per-instance data into the equilibrated coordinates.

    `theta` holds `y_raw`, `q` and the bounds `lb_y, ub_y, lb_w, ub_w` in the user's
    coordinates.
    """
    d_y, d_w = op.d_y, op.d_w
    denom = 1 + 2 * sigma * d_y**2
    dtype = theta["y_raw"].dtype
    return Prepared(
        a=jnp.concatenate(
            [2 * sigma * d_y * theta["y_raw"] / denom, jnp.zeros(d_w.shape, dtype)]
        ),
        c=jnp.concatenate([1 / denom, jnp.ones(d_w.shape, dtype)]),
        part=op.particular(theta["q"]),
        lower=jnp.concatenate([theta["lb_y"] / d_y, theta["lb_w"] / d_w]),
        upper=jnp.concatenate([theta["ub_y"] / d_y, theta["ub_w"] / d_w]),
        scale=jnp.concatenate([d_y, d_w]),
    )


def z_and_t(s, P: Prepared, op: AbstractAffineProjection):
    """$z = \\Pi_{\\tilde{\\mathcal{A}}}(s)$ and $t = \\mathrm{prox}_{\\sigma
    \\tilde h}(2z - s)$."""
    z = op.project(s, P.part)
    t = jnp.clip(P.a + P.c * (2 * z - s), P.lower, P.upper)
    return z, t


def phi(s, P: Prepared, op: AbstractAffineProjection, omega):
    """The fixed-point map $s \\mapsto \\Phi(s) = s + \\omega (t - z)$."""
    z, t = z_and_t(s, P, op)
    return s + omega * (t - z)


def residuals(z, t, P: Prepared):
    """(violation of $z$ w.r.t. $\\mathcal{K}$, $\\max|t - z|$), in user units."""
    viol = jnp.max(jnp.abs(P.scale * (z - jnp.clip(z, P.lower, P.upper))))
    fp = jnp.max(jnp.abs(P.scale * (t - z)))
    return viol, fp


def max_abs(x):
    """$\\|x\\|_\\infty$, with 0 for an empty vector."""
    if x.size == 0:
        return jnp.zeros((), x.dtype)
    return jnp.max(jnp.abs(x))


def iterate(s0, P: Prepared, op: AbstractAffineProjection, omega, n_max: int, tol):
    """Run the iteration from `s0`.

    With `tol=None` it runs exactly `n_max` steps (a `fori_loop`, which reverse-mode
    AD can unroll). Otherwise it stops once both residuals are at most `tol`, checked
    every `CHECK_EVERY` steps inside jit, in a `while_loop` capped at `n_max`
    rounded up to a multiple of `CHECK_EVERY`; under `jax.vmap` each instance
    freezes once it has converged.

    **Returns:** `(s_K, n_steps, fixed_point_residual)`.
    """
    if tol is None:
        s = jax.lax.fori_loop(1, n_max, lambda _, s: phi(s, P, op, omega), s0)
        z, t = z_and_t(s, P, op)
        fp = jax.lax.stop_gradient(residuals(z, t, P)[1])
        return s + omega * (t - z), jnp.asarray(n_max), fp

    # The carry holds s together with z = Pi_A(s) and t, so the residuals checked
    # by `cond` belong to the very s that is returned (and hence to the output).
    # Residuals are checked every `CHECK_EVERY` steps: under vmap, each check is a
    # batch-wide select and reduction that costs about as much as a whole step.
    def cond(carry):
        _, _, _, k, viol, fp = carry
        return (k < n_max) & ((viol > tol) | (fp > tol))

    def body_w(carry):
        s, z, t, k, _, _ = carry
        s = s + omega * (t - z)
        s = jax.lax.fori_loop(1, CHECK_EVERY, lambda _, s: phi(s, P, op, omega), s)
        z, t = z_and_t(s, P, op)
        viol, fp = residuals(z, t, P)
        return s, z, t, k + CHECK_EVERY, viol, fp

    z0, t0 = z_and_t(s0, P, op)
    viol0, fp0 = residuals(z0, t0, P)
    s, _, _, k, _, fp = jax.lax.while_loop(
        cond, body_w, (s0, z0, t0, jnp.asarray(0), viol0, fp0)
    )
    return s, k, fp


def output(s, P: Prepared, op: AbstractAffineProjection):
    """$y = D_y [\\Pi_{\\tilde{\\mathcal{A}}}(s)]_y$, the layer's output."""
    d = op.d_y.shape[0]
    return op.d_y * op.project(s, P.part)[:d]
