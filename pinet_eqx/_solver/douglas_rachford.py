"""The Douglas-Rachford iteration of paper Algorithm 1, in equilibrated coordinates.

One step maps the governing sequence $s_k \\in \\mathbb{R}^{d + m}$ to

$$z = \\Pi_{\\tilde{\\mathcal{A}}}(s_k),\\quad
t = \\mathrm{prox}_{\\sigma \\tilde h}(2z - s_k),\\quad
s_{k+1} = s_k + \\omega (t - z),$$

where the $y$-block of the prox is the box projection of
$(2\\sigma d_i y_{raw,i} + 2 z_i - s_i) / (1 + 2\\sigma d_i^2)$ (paper App. H.1) and the
$w$-block is the projection of $2 z_w - s_w$ onto $\\mathcal{K}$. The box parts are
written as one clip, $t = \\mathrm{clip}(a + c \\odot (2z - s), \\ell, u)$ with
$a_w = 0$, $c_w = 1$, so that a polyhedral iteration is two matrix products and one
fused elementwise pass. Cone and simplex blocks follow the box rows of $w$; each
block shares one scale $\\delta$, so its scaled set is $(\\mathcal{K} - o)/\\delta$
and its projection is $(\\Pi_{\\mathcal{K}}(\\delta v + o) - o) / \\delta$.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._problem import blocks
from .._problem.lifting import InstanceData, max_abs
from .affine import AbstractAffineProjection

CHECK_EVERY = 5
# A tolerance is raised to this many roundings of the lifted point, the lowest
# residual the dtype can resolve there (see `reachable_tol`).
_ROUNDING_MARGIN = 10.0


class Prepared(eqx.Module):
    """Per-instance quantities hoisted out of the loop.

    `a, c, lower, upper` cover the clipped coordinates ($y$ and the box rows of
    $w$); `part` is the affine projection's particular term; `scale` is the
    equilibration's column scaling of all $n$ lifted coordinates; `cone_scale`,
    `cone_offset` and `totals` describe the cone and simplex blocks laid out by
    `groups`.
    """

    a: Float[Array, " n_clip"]
    c: Float[Array, " n_clip"]
    part: Float[Array, " p"]
    lower: Float[Array, " n_clip"]
    upper: Float[Array, " n_clip"]
    scale: Float[Array, " n"]
    cone_scale: Float[Array, " m_cone"]
    cone_offset: Float[Array, " m_cone"]
    totals: Float[Array, " n_simplex"]
    groups: tuple[blocks.Group, ...] = eqx.field(static=True)


def prepare(
    y_raw: Float[Array, " d"],
    data: InstanceData,
    op: AbstractAffineProjection,
    sigma,
    groups: tuple = (),
) -> Prepared:
    """Scale one instance's data (user coordinates) into the equilibrated ones.

    `y_raw` may be shorter than $y$: the coordinates after it are auxiliary
    (`Projector(n_aux=...)`), which the objective ignores, so their prox is the
    plain projection, as for $w$ ($a = 0$, $c = 1$).
    """
    d_y = op.d_y
    d_out = y_raw.shape[0]
    m_box = data.lb_w.shape[0]
    d_w, d_cone = op.d_w[:m_box], op.d_w[m_box:]
    n_free = d_y.shape[0] - d_out + m_box  # auxiliary y, then the box rows of w
    denom = 1 + 2 * sigma * d_y[:d_out] ** 2
    d_clip = jnp.concatenate([d_y, d_w])
    return Prepared(
        a=jnp.concatenate(
            [2 * sigma * d_y[:d_out] * y_raw / denom, jnp.zeros(n_free, y_raw.dtype)]
        ),
        c=jnp.concatenate([1 / denom, jnp.ones(n_free, y_raw.dtype)]),
        part=op.particular(data.q),
        lower=_scale_bound(jnp.concatenate([data.lb_y, data.lb_w]), d_clip),
        upper=_scale_bound(jnp.concatenate([data.ub_y, data.ub_w]), d_clip),
        scale=jnp.concatenate([d_y, op.d_w]),
        cone_scale=d_cone,
        cone_offset=data.cone_offset,
        totals=data.totals,
        groups=groups,
    )


def _scale_bound(bound, scale):
    """`bound / scale`, with infinite bounds passed through untouched.

    Per-instance scalings carry derivatives, and inf / scale would turn a zero
    tangent into NaN (inf * 0); the double `where` keeps them out of both modes.
    """
    finite = jnp.isfinite(bound)
    return jnp.where(finite, jnp.where(finite, bound, 0) / scale, bound)


def cone_argument(s, z, P: Prepared):
    """The cone blocks' prox argument $2z - s$ in the user's units, $u = \\delta
    v + o$: its projection is the blocks' part of the iteration's output."""
    n_clip = P.a.shape[0]
    return P.cone_scale * (2 * z - s)[n_clip:] + P.cone_offset


def project_k(v, P: Prepared):
    """$\\Pi_{\\tilde{\\mathcal{K}}}$ of the cone part of `v` (the part after the
    clipped coordinates), in the equilibrated coordinates."""
    u = P.cone_scale * v + P.cone_offset
    return (blocks.project(u, P.groups, P.totals) - P.cone_offset) / P.cone_scale


def z_and_t(s, P: Prepared, op: AbstractAffineProjection):
    """$z = \\Pi_{\\tilde{\\mathcal{A}}}(s)$ and $t = \\mathrm{prox}_{\\sigma
    \\tilde h}(2z - s)$."""
    z = op.project(s, P.part)
    v = 2 * z - s
    n_clip = P.a.shape[0]
    t = jnp.clip(P.a + P.c * v[:n_clip], P.lower, P.upper)
    if P.groups:
        t = jnp.concatenate([t, project_k(v[n_clip:], P)])
    return z, t


def phi(s, P: Prepared, op: AbstractAffineProjection, omega):
    """The fixed-point map $s \\mapsto \\Phi(s) = s + \\omega (t - z)$."""
    z, t = z_and_t(s, P, op)
    return s + omega * (t - z)


def reachable_tol(tol, z, P: Prepared):
    """`tol`, raised where needed to $10\\,\\varepsilon \\max(1, \\|z\\|_\\infty)$
    (user units, $\\varepsilon$ the dtype's machine epsilon).

    The residuals' own rounding is about $\\varepsilon \\|z\\|_\\infty$, so a
    smaller tolerance cannot be met, however many iterations run: in float32, far
    from the set of a large problem, a fixed `tol` would keep every instance
    iterating to the cap.
    """
    return resolvable_tol(tol, jnp.max(jnp.abs(P.scale * z)))


def resolvable_tol(tol, magnitude):
    """`tol` raised to $10\\,\\varepsilon \\max(1, m)$ for values of
    magnitude $m$ (a JAX scalar, whose dtype gives $\\varepsilon$)."""
    eps = jnp.finfo(magnitude.dtype).eps
    return jnp.maximum(tol, _ROUNDING_MARGIN * eps * jnp.maximum(1.0, magnitude))


def residuals(z, t, P: Prepared):
    """(violation of $z$ w.r.t. $\\mathcal{K}$, $\\max|t - z|$), in user units.

    The violation is measured as `Projector.violation` measures it (for a cone
    $\\|x\\| - t$, not the distance to the cone), so that stopping at `tol`
    and the reported `result` agree.
    """
    n_clip = P.a.shape[0]
    z_clip = z[:n_clip]
    gap = z_clip - jnp.clip(z_clip, P.lower, P.upper)
    viol = jnp.max(jnp.abs(P.scale[:n_clip] * gap))
    if P.groups:
        u = P.cone_scale * z[n_clip:] + P.cone_offset
        viol = jnp.maximum(viol, blocks.violation(u, P.groups, P.totals))
    fp = jnp.max(jnp.abs(P.scale * (t - z)))
    return viol, fp


def certifies_infeasibility(z, t, P: Prepared, op: AbstractAffineProjection):
    """Whether $v = t - z$ separates $\\tilde{\\mathcal{A}}$ from
    $\\operatorname{dom} \\tilde h$, proving that the constraint set is empty.

    When the set is empty, $s_k$ diverges and $t_k - z_k$ tends to the gap vector
    $v = k^\\star - a^\\star$ between the two sets (Bauschke and Moursi 2017;
    Banjac et al. 2019). Such a $v$ is orthogonal to the direction of
    $\\tilde{\\mathcal{A}}$ and satisfies $\\inf_{k \\in \\operatorname{dom}
    \\tilde h} \\langle v, k \\rangle - \\langle v, a \\rangle = \\|v\\|^2 > 0$ for
    every $a \\in \\tilde{\\mathcal{A}}$; both are checked with a relative margin.
    """
    v = t - z
    v_max = max_abs(v)
    eps = _CERTIFICATE_RTOL * v_max
    orthogonal = max_abs(op.project(v, jnp.zeros_like(P.part))) <= eps
    n_clip = P.a.shape[0]
    v_clip = v[:n_clip]
    # Entries of v that are zero up to the margin see no bound (an unbounded
    # direction would otherwise give -inf for a rounding error).
    inf_clip = jnp.where(
        v_clip > eps,
        v_clip * P.lower,
        jnp.where(v_clip < -eps, v_clip * P.upper, 0.0),
    )
    infimum = jnp.sum(inf_clip)
    in_dual = True
    if P.groups:
        inf_cone, distance = blocks.support(
            v[n_clip:], P.groups, P.cone_scale, P.cone_offset, P.totals
        )
        infimum = infimum + inf_cone
        in_dual = distance <= eps
    gap = infimum - jnp.dot(v, z)
    return (v_max > 0) & orthogonal & in_dual & (gap >= 0.5 * jnp.dot(v, v))


# Relative margin of the infeasibility certificate, as a fraction of max |v|.
_CERTIFICATE_RTOL = 1e-3


def iterate(
    s0,
    P: Prepared,
    op: AbstractAffineProjection,
    omega,
    n_max: int,
    tol,
    n_min: int = 0,
):
    """Run the iteration from `s0`.

    With `tol=None` it runs exactly `n_max` steps (a `fori_loop`, which reverse-mode
    AD can unroll). Otherwise it runs `n_min` steps, then stops once both residuals
    are at most `tol` (raised to the dtype's resolution, see `reachable_tol`),
    checked every `CHECK_EVERY` steps inside jit, in a `while_loop` capped at
    `n_max` (the steps after `n_min` rounded up to a multiple of
    `CHECK_EVERY`); under `jax.vmap` each instance freezes once it
    has converged. On polyhedral sets a drift's steps are taken at once (see
    `drift_steps`), and not counted.

    **Returns:** `(s_K, n_iter, fixed_point_residual)`.
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
        _, z, _, k, viol, fp = carry
        bound = reachable_tol(tol, z, P)
        return (k < n_max) & ((viol > bound) | (fp > bound))

    def body_w(carry):
        s, z_prev, t_prev, k, _, _ = carry
        s = s + omega * (t_prev - z_prev)
        s = jax.lax.fori_loop(1, CHECK_EVERY, lambda _, s: phi(s, P, op, omega), s)
        z, t = z_and_t(s, P, op)
        viol, fp = residuals(z, t, P)
        if not P.groups:
            # Not once converged, nor on the last check: the state returned is
            # the one checked.
            jump = drift_steps(s, z, t, z_prev, t_prev, P, omega)
            bound = reachable_tol(tol, z, P)
            go_on = (k + 2 * CHECK_EVERY <= n_max) & ((viol > bound) | (fp > bound))
            s = s + jnp.where(go_on, jump, 0) * omega * (t - z)
        return s, z, t, k + CHECK_EVERY, viol, fp

    if n_min:
        s0 = jax.lax.fori_loop(0, n_min, lambda _, s: phi(s, P, op, omega), s0)
    z0, t0 = z_and_t(s0, P, op)
    viol0, fp0 = residuals(z0, t0, P)
    carry = (s0, z0, t0, jnp.asarray(n_min), viol0, fp0)
    s, _, _, k, _, fp = jax.lax.while_loop(cond, body_w, carry)
    return s, k, fp


# A drift is detected when z and t - z change by at most this fraction of
# max |t - z| between two checks. In float32 the rounding of s alone moves
# t - z by about 1e-7 |s|, so a tighter fraction would miss most drifts there;
# a linear convergence this slow (a contraction above 0.999 per check) would
# take tens of thousands of steps anyway, and Douglas-Rachford converges from
# wherever a mistaken skip puts it.
_DRIFT_RTOL = 1e-3
# ... or by at most this many roundings of s (eps max |s|): when t - z is
# within a few thousand roundings of s (far from the set, in float32), rounding
# alone changes it by more than the fraction above between checks. A larger
# factor mistakes slow convergence for a drift (16 made the float32 motion
# planning benchmark's far outputs worse; see benchmarks/RESULTS.md).
_DRIFT_ROUNDINGS = 4.0


def drift_steps(s, z, t, z_prev, t_prev, P: Prepared, omega):
    """The number of steps of a drift that can be taken at once, or 0.

    Far from the set, or near a vertex where a constraint is nearly but not
    exactly active, the iteration can hold a wrong active set for thousands of
    steps: while no clipped coordinate changes side of its bounds, the step is
    affine, and when $d = t - z$ is a fixed point of it with $z$ unchanged,
    every step only translates $s$ by $\\omega d$. That drift is detected from
    two checks `CHECK_EVERY` steps apart (`z_prev`, `t_prev` the earlier one's
    $z$ and $t$), where $z$ and $d$ changed by at most $10^{-3} \\|d\\|_\\infty$
    or 4 roundings of $s$ ($4\\,\\varepsilon \\|s\\|_\\infty$). It lasts
    until a clip argument $a + c \\odot (2z - s)$, which changes by
    $-\\omega c \\odot d$ per step, reaches a bound; the steps up to
    one short of that are returned, and `s + steps * omega * d` is then the
    state the iteration would reach after them (up to the rounding of $d$
    times the steps), so the iteration itself crosses the breakpoint.
    Polyhedral sets only (a cone's projection is not piecewise affine).
    """
    d = t - z
    eps = jnp.finfo(d.dtype).eps
    size = max_abs(d)
    noise = jnp.maximum(_DRIFT_RTOL * size, _DRIFT_ROUNDINGS * eps * max_abs(s))
    change = jnp.maximum(max_abs(d - (t_prev - z_prev)), max_abs(z - z_prev))
    steady = change <= noise
    n_clip = P.a.shape[0]
    arg = P.a + P.c * (2 * z - s)[:n_clip]
    rate = -omega * P.c * d[:n_clip]
    moving = rate != 0
    safe = jnp.where(moving, rate, 1.0)

    def steps_to(bound):
        steps = (bound - arg) / safe
        return jnp.where(moving & (steps > 0), steps, jnp.inf)

    steps = jnp.floor(jnp.min(jnp.minimum(steps_to(P.lower), steps_to(P.upper)))) - 1
    worth = steady & jnp.isfinite(steps) & (steps >= CHECK_EVERY)
    return jnp.where(worth, steps, 0)
