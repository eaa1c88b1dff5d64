r"""Euclidean projections onto simple convex sets: the "K blocks" of the
Douglas-Rachford projection layer.

Each function projects ONE vector of shape `(n,)` and returns a vector of the same
shape and dtype; batch with `jax.vmap`. Everything is written with `jnp.where` and
`jax.lax`-friendly array operations only (no Python control flow on values), so the
functions can be `jax.jit`-ed, `jax.vmap`-ed and differentiated. Their derivatives
are finite everywhere, including at the kinks (cone apexes, boundaries, ties, zero
vectors), where they are the derivative of one of the adjacent smooth pieces, hence an
element of the (Clarke) generalised Jacobian.

Cones are stored "t first": a vector $v = (t, x)$ has $t = v_0$ and $x = v_{1:}$.

- `project_box`: $\{x : \ell \le x \le u\}$.
- `project_second_order_cone`: $\{(t, x) : \|x\|_2 \le t\}$.
- `project_l1_norm_cone`: $\{(t, x) : \|x\|_1 \le t\}$.
- `project_linf_norm_cone`: $\{(t, x) : \|x\|_\infty \le t\}$.
- `project_simplex`: $\{x : x \ge 0,\ \sum_i x_i = s\}$.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, ScalarLike


def project_box(
    v: Float[Array, " n"],
    lower: Float[ArrayLike, "#n"] | Float[ArrayLike, ""] | float,
    upper: Float[ArrayLike, "#n"] | Float[ArrayLike, ""] | float,
) -> Float[Array, " n"]:
    r"""Euclidean projection onto a box.

    The box $\{x : \ell \le x \le u\}$ is a product of intervals, so its projection is
    the elementwise clip $\min(\max(v, \ell), u)$.

    **Arguments:**

    - `v`: the point to project, shape `(n,)`.
    - `lower`: the lower bounds $\ell$, broadcastable to `(n,)`; entries may be
        $-\infty$.
    - `upper`: the upper bounds $u$, broadcastable to `(n,)`; entries may be
        $+\infty$. Must satisfy $\ell \le u$.

    **Returns:**

    The projection, with the shape and dtype of `v`.
    """
    # Cast and broadcast explicitly: float64 bounds must not promote a float32 `v`, and
    # the tests run with implicit rank promotion turned into an error.
    lower = jnp.broadcast_to(jnp.asarray(lower, dtype=v.dtype), v.shape)
    upper = jnp.broadcast_to(jnp.asarray(upper, dtype=v.dtype), v.shape)
    # `where` rather than min/max: on a bound, min/max split the derivative 1/2-1/2,
    # while this returns the one-sided (identity) derivative of the interior piece.
    return jnp.where(v < lower, lower, jnp.where(v > upper, upper, v))


def _safe_norm(x: Float[Array, " n"]) -> Float[Array, ""]:
    # The double `where` keeps the unselected branch away from sqrt'(0) = inf: with a
    # single `where` the backward pass would compute 0 * inf = NaN at x = 0.
    sq = jnp.sum(x * x)
    positive = sq > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1)), 0)


def project_second_order_cone(v: Float[Array, " n"]) -> Float[Array, " n"]:
    r"""Euclidean projection onto the second-order (Lorentz) cone.

    For $v = (t, x)$ and $K = \{(t, x) : \|x\|_2 \le t\}$ the projection has the closed
    form (Bauschke 1996; Fukushima, Luo and Tseng 2002): $v$ itself if
    $\|x\|_2 \le t$; $0$ if $\|x\|_2 \le -t$ (the polar cone); otherwise
    $\tfrac{t + \|x\|_2}{2}\,(1,\ x / \|x\|_2)$.

    **Arguments:**

    - `v`: the point $(t, x)$ to project, shape `(n,)` with `n >= 1`; $t$ = `v[0]`.

    **Returns:**

    The projection, with the shape and dtype of `v`.
    """
    t, x = v[0], v[1:]
    r = _safe_norm(x)
    # r = 0 only selects the first two branches, but the third is still evaluated (and
    # differentiated), so it must not divide by zero either.
    r_safe = jnp.where(r > 0, r, 1)
    a = 0.5 * (t + r)
    boundary = jnp.concatenate([a[None], (a / r_safe) * x])
    return jnp.where(r <= t, v, jnp.where(r <= -t, jnp.zeros_like(v), boundary))


def _l1_cone_threshold(t: Float[Array, ""], a: Float[Array, " m"]) -> Float[Array, ""]:
    r"""The multiplier $\lambda \ge 0$ of the l1-norm-cone projection of $(t, x)$,
    given $a = |x|$.

    Optimality gives $x^\star = \operatorname{soft}(x, \lambda)$, $t^\star = t +
    \lambda$ and, unless $\lambda = 0$, $\sum_i \max(a_i - \lambda, 0) = t + \lambda$.
    With $a$ sorted in decreasing order and $k$ entries above $\lambda$ this is
    $\lambda_k = (\sum_{i \le k} a_i - t) / (k + 1)$, and the right $k$ is the largest
    one with $a_k > \lambda_k$. $k = 0$ ($\lambda_0 = -t$) is the polar case.
    """
    m = a.shape[0]
    a_desc = jnp.flip(jnp.sort(a))
    k = jnp.arange(1, m + 1)
    lam_k = (jnp.cumsum(a_desc) - t) / (k + 1).astype(a.dtype)
    lam = jnp.concatenate([(-t)[None], lam_k])
    # The valid k form a prefix {1, ..., k*} in exact arithmetic; taking the largest
    # index with the test true is the conventional, rounding-robust choice.
    k_star = jnp.max(jnp.where(a_desc > lam_k, k, 0), initial=0)
    lam_star = jnp.take_along_axis(lam, k_star[None], axis=0)[0]
    # A non-positive multiplier means v is already in the cone. `where`, not `maximum`,
    # so that on the boundary the derivative is that of one piece, not their average.
    return jnp.where(lam_star > 0, lam_star, 0)


def project_l1_norm_cone(v: Float[Array, " n"]) -> Float[Array, " n"]:
    r"""Euclidean projection onto the l1-norm cone.

    For $v = (t, x)$ and $K = \{(t, x) : \|x\|_1 \le t\}$ the projection is
    $(t + \lambda,\ \operatorname{soft}(x, \lambda))$, with
    $\operatorname{soft}(x, \lambda)_i = \operatorname{sign}(x_i)\max(|x_i| - \lambda,
    0)$ and $\lambda \ge 0$ found exactly by sorting $|x|$. This gives $v$ inside
    $K$ ($\lambda = 0$) and $0$ on the polar cone $\|x\|_\infty \le -t$
    ($\lambda = -t$).

    **Arguments:**

    - `v`: the point $(t, x)$ to project, shape `(n,)` with `n >= 1`; $t$ = `v[0]`.

    **Returns:**

    The projection, with the shape and dtype of `v`.
    """
    t, x = v[0], v[1:]
    a = jnp.abs(x)
    lam = _l1_cone_threshold(t, a)
    # Soft thresholding. The strict test matches the one that chose k*, so at a tie
    # |x_i| = lambda the derivative is consistently that of the active set without i.
    # Inside the cone (lambda = 0) every entry, zeros included, must pass through with
    # derivative 1: sign(x) * (|x| - lambda) would give derivative 0 at x_i = 0.
    keep = (a > lam) | (lam <= 0)
    x_proj = jnp.where(keep, x - jnp.sign(x) * lam, 0)
    return jnp.concatenate([(t + lam)[None], x_proj])


def project_linf_norm_cone(v: Float[Array, " n"]) -> Float[Array, " n"]:
    r"""Euclidean projection onto the l-infinity-norm cone.

    For $K = \{(t, x) : \|x\|_\infty \le t\}$ the dual cone is the l1-norm cone
    $K^* = \{(t, x) : \|x\|_1 \le t\}$, so Moreau's decomposition
    $v = \Pi_K(v) + \Pi_{-K^*}(v)$ with $\Pi_{-K^*}(v) = -\Pi_{K^*}(-v)$ gives
    $\Pi_K(v) = v + \Pi_{K^*}(-v)$.

    **Arguments:**

    - `v`: the point $(t, x)$ to project, shape `(n,)` with `n >= 1`; $t$ = `v[0]`.

    **Returns:**

    The projection, with the shape and dtype of `v`.
    """
    return v + project_l1_norm_cone(-v)


def project_simplex(
    v: Float[Array, " n"], total: ScalarLike = 1.0
) -> Float[Array, " n"]:
    r"""Euclidean projection onto the scaled probability simplex.

    For $\Delta_s = \{x : x \ge 0,\ \sum_i x_i = s\}$ the projection is
    $\max(v - \theta, 0)$, where $\theta$ solves $\sum_i \max(v_i - \theta, 0) = s$.
    With $v$ sorted in decreasing order, $\theta = (\sum_{i \le k} v_i - s) / k$ for the
    largest $k$ with $v_k > (\sum_{i \le k} v_i - s) / k$.

    **Arguments:**

    - `v`: the point to project, shape `(n,)` with `n >= 1`.
    - `total`: the sum $s \ge 0$; a Python number or a (possibly traced) JAX scalar.
        $s = 0$ gives the zero vector.

    **Returns:**

    The projection, with the shape and dtype of `v`.
    """
    n = v.shape[0]
    total = jnp.asarray(total, dtype=v.dtype)
    v_desc = jnp.flip(jnp.sort(v))
    k = jnp.arange(1, n + 1)
    theta_k = (jnp.cumsum(v_desc) - total) / k.astype(v.dtype)
    # k = 1 is valid whenever s > 0. At s = 0 no k is valid, and falling back to k = 1
    # gives theta = max(v), hence exactly zero, without dividing by zero.
    k_star = jnp.max(jnp.where(v_desc > theta_k, k, 1))
    theta = jnp.take_along_axis(theta_k, (k_star - 1)[None], axis=0)[0]
    # The strict test matches the one that chose k*: at a tie v_i = theta (and at
    # s = 0) the derivative is that of a single active set, not an average of two.
    return jnp.where(v > theta, v - theta, 0)
