"""The Douglas-Rachford iteration of paper Algorithm 1, in equilibrated coordinates.

One step maps the governing sequence $s_k$ to

$$z = \\Pi_{\\tilde{\\mathcal{A}}}(s_k),\\quad
t = \\mathrm{prox}_{\\sigma \\tilde h}(2z - s_k),\\quad
s_{k+1} = s_k + \\omega (t - z),$$

where the $y$-block of the prox is the box projection of
$(2\\sigma d_i y_{raw,i} + 2 z_i - s_i) / (1 + 2\\sigma d_i^2)$ (paper App. H.1) and the
$w$-block is the box projection of $2 z_w - s_w$.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from ._affine import AbstractAffineProjection


class Prepared(eqx.Module):
    """Per-instance quantities hoisted out of the loop."""

    a: Float[Array, " d"]
    inv: Float[Array, " d"]
    part: PyTree[Array]
    lb_y: Float[Array, " d"]
    ub_y: Float[Array, " d"]
    lb_w: Float[Array, " m"]
    ub_w: Float[Array, " m"]


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
    d = op.d_y
    denom = 1 + 2 * sigma * d**2
    return Prepared(
        a=2 * sigma * d * theta["y_raw"] / denom,
        inv=1 / denom,
        part=op.particular(theta["q"]),
        lb_y=theta["lb_y"] / d,
        ub_y=theta["ub_y"] / d,
        lb_w=theta["lb_w"] / op.d_w,
        ub_w=theta["ub_w"] / op.d_w,
    )


def step(s, P: Prepared, op: AbstractAffineProjection, omega):
    """One Douglas-Rachford step on $s = (s_y, s_w)$; returns $(s_{k+1}, z, t)$."""
    z, t = z_and_t(s, P, op)
    s_new = (s[0] + omega * (t[0] - z[0]), s[1] + omega * (t[1] - z[1]))
    return s_new, z, t


def z_and_t(s, P: Prepared, op: AbstractAffineProjection):
    """$z = \\Pi_{\\tilde{\\mathcal{A}}}(s)$ and $t = \\mathrm{prox}_{\\sigma
    \\tilde h}(2z - s)$."""
    s_y, s_w = s
    z_y, z_w = op.project(s_y, s_w, P.part)
    t_y = jnp.clip(P.a + P.inv * (2 * z_y - s_y), P.lb_y, P.ub_y)
    t_w = jnp.clip(2 * z_w - s_w, P.lb_w, P.ub_w)
    return (z_y, z_w), (t_y, t_w)


def phi(s, P: Prepared, op: AbstractAffineProjection, omega):
    """The fixed-point map $s \\mapsto \\Phi(s)$ used by the implicit backward pass."""
    return step(s, P, op, omega)[0]


def residuals(z, t, P: Prepared, op: AbstractAffineProjection):
    """(violation of $z$ w.r.t. $\\mathcal{K}$, $\\max|t - z|$), in user units."""
    z_y, z_w = z
    t_y, t_w = t
    viol = jnp.maximum(
        max_abs(op.d_y * (z_y - jnp.clip(z_y, P.lb_y, P.ub_y))),
        max_abs(op.d_w * (z_w - jnp.clip(z_w, P.lb_w, P.ub_w))),
    )
    fp = jnp.maximum(max_abs(op.d_y * (t_y - z_y)), max_abs(op.d_w * (t_w - z_w)))
    return viol, fp


def max_abs(x):
    """$\\|x\\|_\\infty$, with 0 for an empty vector."""
    if x.size == 0:
        return jnp.zeros((), x.dtype)
    return jnp.max(jnp.abs(x))


def iterate(s0, P: Prepared, op: AbstractAffineProjection, omega, n_max: int, tol):
    """Run the iteration from `s0 = (s_y, s_w)`.

    With `tol=None` it runs exactly `n_max` steps (a `fori_loop`, which reverse-mode
    AD can unroll). Otherwise it stops as soon as both residuals are at most `tol`,
    inside jit, in a `while_loop` capped at `n_max`; under `jax.vmap` each instance
    freezes once it has converged.

    **Returns:** `(s_K, n_steps, fixed_point_residual)`.
    """
    dtype = s0[0].dtype
    inf = jnp.asarray(jnp.inf, dtype)
    if tol is None:

        def body(_, carry):
            s, _ = carry
            s_new, z, t = step(s, P, op, omega)
            return s_new, jax.lax.stop_gradient(residuals(z, t, P, op)[1])

        s, fp = jax.lax.fori_loop(0, n_max, body, (s0, inf))
        return s, jnp.asarray(n_max), fp

    # The carry holds s together with z = Pi_A(s) and t, so the residuals checked
    # by `cond` belong to the very s that is returned (and hence to the output).
    def cond(carry):
        _, _, _, k, viol, fp = carry
        return (k < n_max) & ((viol > tol) | (fp > tol))

    def body_w(carry):
        s, z, t, k, _, _ = carry
        s_new = (s[0] + omega * (t[0] - z[0]), s[1] + omega * (t[1] - z[1]))
        z_new, t_new = z_and_t(s_new, P, op)
        viol, fp = residuals(z_new, t_new, P, op)
        return s_new, z_new, t_new, k + 1, viol, fp

    z0, t0 = z_and_t(s0, P, op)
    viol0, fp0 = residuals(z0, t0, P, op)
    s, _, _, k, _, fp = jax.lax.while_loop(
        cond, body_w, (s0, z0, t0, jnp.asarray(0), viol0, fp0)
    )
    return s, k, fp


def output(s, P: Prepared, op: AbstractAffineProjection):
    """$y = D_y [\\Pi_{\\tilde{\\mathcal{A}}}(s)]_y$, the layer's output."""
    z_y, _ = op.project(s[0], s[1], P.part)
    return op.d_y * z_y
