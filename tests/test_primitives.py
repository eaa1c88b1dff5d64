"""Tests for the cone and simplex projections in `pinet_eqx._problem.primitives`.

Values are checked against cvxpy + Clarabel; derivatives against `jax.jacrev` of
unrolled reference implementations that use a different algorithm (active-set
iterations instead of sorting, spectral decomposition instead of the case formula,
direct clipping instead of Moreau's decomposition).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis.extra import numpy as hnp

from pinet_eqx._problem.primitives import (
    project_box,
    project_l1_norm_cone,
    project_linf_norm_cone,
    project_second_order_cone,
    project_simplex,
)

# ---------------------------------------------------------------------------------
# Reference implementations (for Jacobians only: valid away from kinks)
# ---------------------------------------------------------------------------------


def ref_box(v, lower, upper):
    return jnp.clip(v, lower, upper)


def ref_soc(v):
    # Spectral decomposition w.r.t. the Jordan algebra of the Lorentz cone:
    # v = l1 u1 + l2 u2 with l_{1,2} = t -+ ||x||, u_{1,2} = (1, -+x/||x||) / 2.
    t, x = v[0], v[1:]
    r = jnp.linalg.norm(x)
    w = x / r
    u1 = 0.5 * jnp.concatenate([jnp.ones(1), -w])
    u2 = 0.5 * jnp.concatenate([jnp.ones(1), w])
    return jnp.maximum(t - r, 0) * u1 + jnp.maximum(t + r, 0) * u2


def ref_l1_cone(v):
    # Michelot-style active-set iterations: Newton's method on the convex, decreasing,
    # piecewise-linear sum_i max(|x_i| - lam, 0) - lam - t, started left of the root,
    # so it reaches it after at most n + 1 steps.
    t, x = v[0], v[1:]
    a = jnp.abs(x)
    active = jnp.ones_like(a)
    lam = jnp.zeros_like(t)
    for _ in range(a.shape[0] + 1):
        lam = (jnp.sum(active * a) - t) / (jnp.sum(active) + 1)
        active = active * (a > lam)
    lam = jnp.maximum(lam, 0)
    x_proj = jnp.where(active > 0, x - jnp.sign(x) * lam, 0)
    return jnp.concatenate([(t + lam)[None], x_proj])


def ref_linf_cone(v):
    # No Moreau here: optimality gives x = clip(x0, -t, t) with
    # t = t0 + sum_i max(|x0_i| - t, 0); Newton on this concave increasing equation,
    # started left of the root, with the clipped set as active set.
    t0, x = v[0], v[1:]
    a = jnp.abs(x)
    clipped = jnp.ones_like(a)
    t = jnp.zeros_like(t0)
    for _ in range(a.shape[0] + 1):
        t = (t0 + jnp.sum(clipped * a)) / (1 + jnp.sum(clipped))
        clipped = clipped * (a > t)
    t = jnp.maximum(t, 0)
    return jnp.concatenate([t[None], jnp.where(clipped > 0, jnp.sign(x) * t, x)])


def ref_simplex(v, total):
    # Michelot (1986): shrink the support until the threshold stops moving.
    active = jnp.ones_like(v)
    theta = jnp.zeros_like(total)
    for _ in range(v.shape[0] + 1):
        theta = (jnp.sum(active * v) - total) / jnp.sum(active)
        active = active * (v > theta)
    return active * (v - theta)


# ---------------------------------------------------------------------------------
# One `Case` per primitive: how to project, check feasibility, find kinks
# ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    # (v, params) -> projection; params is a tuple of extra arguments.
    project: Callable
    reference: Callable
    # (p, params) -> amount by which p violates the constraints (>= 0).
    violation: Callable
    # (v, p, params) -> distance of v to the nearest kink, given p = project(v).
    kink_distance: Callable
    # (draw, n) -> params
    draw_params: Callable


def _no_params(draw, n):
    return ()


def _box_params(draw, n):
    lower = draw(hnp.arrays(np.float64, n, elements=st.floats(-3, 0)))
    width = draw(hnp.arrays(np.float64, n, elements=st.floats(0, 3)))
    upper = lower + width
    lower = np.where(draw(hnp.arrays(np.bool_, n)), -np.inf, lower)
    upper = np.where(draw(hnp.arrays(np.bool_, n)), np.inf, upper)
    return (lower, upper)


def _box_kink(v, p, params):
    lower, upper = params
    gaps = np.concatenate([np.abs(v - lower), np.abs(v - upper)])
    return np.min(gaps, initial=np.inf)


def _box_violation(p, params):
    lower, upper = params
    return max(np.max(lower - p), np.max(p - upper), 0.0)


def _soc_kink(v, p, params):
    t, r = v[0], np.linalg.norm(v[1:])
    # The reference divides by ||x||, so stay away from x = 0 too.
    return min(abs(r - t), abs(r + t), r)


def _l1_kink(v, p, params):
    t, a = v[0], np.abs(v[1:])
    lam = p[0] - t
    ties = np.min(np.abs(a - lam), initial=np.inf) if lam > 0 else np.inf
    return min(abs(np.sum(a) - t), abs(np.max(a, initial=0) + t), ties)


def _linf_kink(v, p, params):
    # Kinks of the l1-cone projection at -v, through Moreau.
    q = np.asarray(_jitted(project_l1_norm_cone)(jnp.asarray(-v)))
    return _l1_kink(-v, q, params)


def _simplex_kink(v, p, params):
    # theta = max_i (v_i - p_i): equality on the support, v_i <= theta off it.
    theta = np.max(v - p)
    return np.min(np.abs(v - theta))


def _simplex_violation(p, params):
    (total,) = params
    return max(-np.min(p), abs(np.sum(p) - total))


def _simplex_params(draw, n):
    return (draw(st.floats(0.1, 3.0)),)


def _cone_violation(norm):
    def violation(p, params):
        return max(norm(p[1:]) - p[0], 0.0)

    return violation


CASES = [
    Case("box", project_box, ref_box, _box_violation, _box_kink, _box_params),
    Case(
        "soc",
        project_second_order_cone,
        ref_soc,
        _cone_violation(lambda x: np.linalg.norm(x)),
        _soc_kink,
        _no_params,
    ),
    Case(
        "l1",
        project_l1_norm_cone,
        ref_l1_cone,
        _cone_violation(lambda x: np.sum(np.abs(x))),
        _l1_kink,
        _no_params,
    ),
    Case(
        "linf",
        project_linf_norm_cone,
        ref_linf_cone,
        _cone_violation(lambda x: np.max(np.abs(x), initial=0.0)),
        _linf_kink,
        _no_params,
    ),
    Case(
        "simplex",
        project_simplex,
        ref_simplex,
        _simplex_violation,
        _simplex_kink,
        _simplex_params,
    ),
]
CASE_IDS = [c.name for c in CASES]

SETTINGS = hypothesis.settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)

_elements = st.floats(-4, 4, allow_nan=False, allow_infinity=False)


@st.composite
def instances(draw, case, n_points=1):
    """Problem data for `case` and `n_points` points of the same size."""
    # Few distinct sizes, as each one costs a compilation: 1 (for the cones: t alone),
    # 2 (the smallest nontrivial case) and 5 (generic, with room for ties).
    n = draw(st.sampled_from([1, 2, 5]))
    params = case.draw_params(draw, n)
    points = []
    for _ in range(n_points):
        v = draw(hnp.arrays(np.float64, n, elements=_elements))
        if case.name in ("soc", "l1", "linf"):
            # Scale t over a wide range so that every region (inside, polar cone,
            # in between) is drawn often.
            v[0] *= draw(st.sampled_from([0.1, 1.0, 3.0]))
        points.append(v)
    return params, points


# Everything below runs under `jax.jit`, cached per primitive: op-by-op dispatch would
# compile every small op again for every new shape and make the file slow.
@functools.cache
def _jitted(fn):
    return jax.jit(fn)


def _project(case, v, params):
    return np.asarray(_jitted(case.project)(jnp.asarray(v), *params))


# ---------------------------------------------------------------------------------
# Ground truth: cvxpy + Clarabel
# ---------------------------------------------------------------------------------


def _clarabel(v, build):
    import cvxpy as cp

    y = cp.Variable(v.shape[0])
    prob = cp.Problem(cp.Minimize(cp.sum_squares(y - v)), build(y))
    prob.solve(
        solver="CLARABEL",
        tol_gap_abs=1e-12,
        tol_gap_rel=1e-12,
        tol_feas=1e-12,
        # Without tight iterative refinement Clarabel stalls around 1e-7 on points
        # projected onto the curved boundary of the second-order cone.
        iterative_refinement_reltol=1e-15,
        iterative_refinement_abstol=1e-15,
        iterative_refinement_max_iter=50,
    )
    # Gaps of 1e-12 are not always certified, and Clarabel then reports
    # "optimal_inaccurate"; the 1e-7 comparison with an independent answer is the real
    # check, and an inaccurate oracle can only make it fail, never pass.
    assert prob.status in ("optimal", "optimal_inaccurate"), prob.status
    return y.value


def _cone_point(rng, n, region, inner_norm, polar_norm):
    """A point (t, x) of the given region of the cone {||x|| <= t} whose polar cone is
    {||x||_* <= -t}: `inner_norm` is ||.||, `polar_norm` the dual norm."""
    x = rng.normal(size=n - 1)
    lo, hi = -polar_norm(x), inner_norm(x)
    t = {
        "inside": hi + rng.uniform(0.1, 1.0),
        "polar": lo - rng.uniform(0.1, 1.0),
        "generic": rng.uniform(lo, hi),
    }[region]
    return np.concatenate([[t], x])


def _l1(x):
    return np.sum(np.abs(x))


def _linf(x):
    return np.max(np.abs(x))


def _truth_soc(rng, n, region):
    import cvxpy as cp

    v = _cone_point(rng, n, region, np.linalg.norm, np.linalg.norm)
    return v, (), _clarabel(v, lambda y: [cp.SOC(y[0], y[1:])])


def _truth_l1(rng, n, region):
    import cvxpy as cp

    v = _cone_point(rng, n, region, _l1, _linf)
    return v, (), _clarabel(v, lambda y: [cp.norm1(y[1:]) <= y[0]])


def _truth_linf(rng, n, region):
    import cvxpy as cp

    v = _cone_point(rng, n, region, _linf, _l1)
    return v, (), _clarabel(v, lambda y: [cp.norm_inf(y[1:]) <= y[0]])


def _truth_simplex(rng, n, region):
    total = 0.0 if region == "zero_total" else rng.uniform(0.5, 2.0)
    if region == "inside":
        v = total * rng.dirichlet(np.ones(n))
    elif region == "vertex":
        # One coordinate far above the others: the projection is total * e_i.
        v = rng.normal(size=n)
        v[rng.integers(n)] += total + 10.0
    else:
        v = rng.normal(size=n)
    truth = _clarabel(v, lambda y: [y >= 0, sum(y[i] for i in range(n)) == total])
    return v, (total,), truth


def _truth_box(rng, n, region):
    v = 2 * rng.normal(size=n)
    lower = rng.uniform(-2, 0, size=n)
    upper = lower + rng.uniform(0, 2, size=n)
    lower[rng.random(n) < 0.3] = -np.inf
    upper[rng.random(n) < 0.3] = np.inf

    def build(y):
        cons = []
        for i in range(n):
            if np.isfinite(lower[i]):
                cons.append(y[i] >= lower[i])
            if np.isfinite(upper[i]):
                cons.append(y[i] <= upper[i])
        return cons

    return v, (lower, upper), _clarabel(v, build)


_TRUTH = {
    "box": _truth_box,
    "soc": _truth_soc,
    "l1": _truth_l1,
    "linf": _truth_linf,
    "simplex": _truth_simplex,
}
_CASE_BY_NAME = {c.name: c for c in CASES}
_CONE_REGIONS = ["inside", "polar", "generic"]
TRUTH_PARAMS = (
    [("box", "mixed")]
    + [(name, r) for name in ("soc", "l1", "linf") for r in _CONE_REGIONS]
    + [("simplex", r) for r in ("inside", "vertex", "generic", "zero_total")]
)


# Clarabel may flag a cone solve as "inaccurate" (see the solver settings above);
# an inaccurate answer can only make the comparison fail, so the warning is noise.
@pytest.mark.filterwarnings("ignore:Solution may be inaccurate")
@pytest.mark.parametrize("name,region", TRUTH_PARAMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_clarabel(name, region, seed):
    rng = np.random.default_rng(seed)
    n = 6
    v, params, truth = _TRUTH[name](rng, n, region)
    p = _project(_CASE_BY_NAME[name], v, params)
    np.testing.assert_allclose(p, truth, rtol=0, atol=1e-7)
    if region in ("inside", "polar", "zero_total"):
        # The closed-form cases should be exact, not merely close.
        expected = v if region == "inside" else np.zeros_like(v)
        np.testing.assert_allclose(p, expected, rtol=0, atol=1e-15)


def test_linf_moreau_sign():
    # Moreau: v = Pi_K(v) + Pi_{K polar}(v), and the two parts are orthogonal.
    rng = np.random.default_rng(3)
    for _ in range(5):
        v = _cone_point(rng, 5, "generic", _linf, _l1)
        p = _project(_CASE_BY_NAME["linf"], v, ())
        q = v - p
        assert abs(p @ q) < 1e-12
        # q lies in the polar cone -K_1: ||q_x||_1 <= -q_t.
        assert _l1(q[1:]) <= -q[0] + 1e-12


# ---------------------------------------------------------------------------------
# Hypothesis properties
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@SETTINGS
@hypothesis.given(data=st.data())
def test_idempotent(case, data):
    params, (v,) = data.draw(instances(case))
    p = _project(case, v, params)
    np.testing.assert_allclose(_project(case, p, params), p, rtol=0, atol=1e-9)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@SETTINGS
@hypothesis.given(data=st.data())
def test_non_expansive(case, data):
    params, (u, v) = data.draw(instances(case, n_points=2))
    pu, pv = _project(case, u, params), _project(case, v, params)
    assert np.linalg.norm(pu - pv) <= np.linalg.norm(u - v) + 1e-9


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@SETTINGS
@hypothesis.given(data=st.data())
def test_feasible(case, data):
    params, (v,) = data.draw(instances(case))
    p = _project(case, v, params)
    assert p.dtype == v.dtype and p.shape == v.shape
    assert case.violation(p, params) <= 1e-9


@functools.cache
def _vjp_and_reference(case):
    @jax.jit
    def run(v, params):
        out, vjp_fn = jax.vjp(lambda w: case.project(w, *params), v)
        # Row i of the Jacobian is the VJP with the i-th unit cotangent.
        (jac,) = jax.vmap(vjp_fn)(jnp.eye(out.shape[0], dtype=out.dtype))
        ref_out = case.reference(v, *params)
        ref_jac = jax.jacrev(lambda w: case.reference(w, *params))(v)
        return out, jac, ref_out, ref_jac

    return run


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@SETTINGS
@hypothesis.given(data=st.data())
def test_vjp_matches_reference(case, data):
    params, (v,) = data.draw(instances(case))
    p = _project(case, v, params)
    hypothesis.assume(case.kink_distance(v, p, params) > 1e-6)
    out, jac, ref_out, ref_jac = _vjp_and_reference(case)(jnp.asarray(v), params)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-10)
    np.testing.assert_allclose(jac, ref_jac, rtol=0, atol=1e-9)


# ---------------------------------------------------------------------------------
# Kinks: derivatives stay finite
# ---------------------------------------------------------------------------------


def _a(*xs):
    return jnp.asarray(xs, dtype=jnp.float64)


EDGE_POINTS = [
    ("soc", _a(0.0, 0.0, 0.0), ()),  # apex
    ("soc", _a(0.0), ()),  # apex, empty x
    ("soc", _a(1.5, 0.0, 0.0), ()),  # x = 0 inside
    ("soc", _a(-1.5, 0.0, 0.0), ()),  # x = 0 in the polar cone
    ("soc", _a(5.0, 3.0, 4.0), ()),  # boundary
    ("soc", _a(-5.0, 3.0, 4.0), ()),  # polar boundary
    ("l1", _a(0.0, 0.0, 0.0), ()),
    ("l1", _a(1.5, 0.0, 0.0), ()),
    ("l1", _a(-1.5, 0.0, 0.0), ()),
    ("l1", _a(0.0, 1.0, 1.0, 1.0), ()),  # ties
    ("l1", _a(0.0, 1.0, -1.0, 1.0), ()),  # ties in |x|
    ("l1", _a(3.0, 1.0, -1.0, 1.0), ()),  # boundary with ties
    ("l1", _a(-1.0, 1.0, -1.0, 1.0), ()),  # polar boundary with ties
    ("l1", _a(1.5, 2.0, 1.0, 0.5), ()),  # |x_i| = lambda = 0.5
    ("linf", _a(0.0, 0.0, 0.0), ()),
    ("linf", _a(1.5, 0.0, 0.0), ()),
    ("linf", _a(-1.5, 0.0, 0.0), ()),
    ("linf", _a(0.0, 1.0, 1.0, 1.0), ()),
    ("linf", _a(1.0, 1.0, -1.0, 1.0), ()),  # boundary with ties
    ("linf", _a(-3.0, 1.0, -1.0, 1.0), ()),  # polar boundary with ties
    ("simplex", _a(1.0, 1.0, 1.0), (1.0,)),  # ties
    ("simplex", _a(1.0, 1.0, 1.0), (0.0,)),  # total = 0
    ("simplex", _a(0.3, -0.2, 5.0), (0.0,)),
    ("simplex", _a(0.0, 0.0, 0.0), (1.0,)),  # zero vector
    ("simplex", _a(0.0, 0.0, 0.0), (0.0,)),
    ("simplex", _a(1.0, 0.5, 0.0), (0.5,)),  # v_i = theta
    ("box", _a(0.0, 1.0, -1.0), (_a(0.0, 0.0, -1.0), _a(1.0, 1.0, np.inf))),
    ("box", _a(0.0, 0.0, 0.0), (-np.inf, np.inf)),
]


@functools.cache
def _grads_and_jacobians(case, n_params):
    # Derivatives w.r.t. the point and every parameter (bounds, total).
    argnums = tuple(range(1 + n_params))

    @jax.jit
    def run(c, v, *params):
        def f(v, *params):
            return case.project(v, *params) @ c

        grads = jax.grad(f, argnums=argnums)(v, *params)
        jacs = jax.jacrev(case.project, argnums=argnums)(v, *params)
        return grads, jacs

    return run


@pytest.mark.parametrize(
    "name,v,params", EDGE_POINTS, ids=[f"{e[0]}-{i}" for i, e in enumerate(EDGE_POINTS)]
)
def test_derivatives_finite_at_kinks(name, v, params):
    case = _CASE_BY_NAME[name]
    params = tuple(
        jnp.broadcast_to(
            jnp.asarray(q, dtype=v.dtype), v.shape if name == "box" else ()
        )
        for q in params
    )
    # A random linear functional, so that no derivative entry can hide behind a zero
    # cotangent.
    c = jax.random.normal(jax.random.key(0), v.shape, dtype=v.dtype)
    grads, jacs = _grads_and_jacobians(case, len(params))(c, v, *params)
    for g in (*grads, *jacs):
        assert bool(jnp.all(jnp.isfinite(g))), g
    # The VJP and the Jacobian are the same linear map.
    for g, jac in zip(grads, jacs):
        np.testing.assert_allclose(g, c @ jac, rtol=0, atol=1e-12)


# At a kink the derivative must be that of one adjacent piece: the same as at a point
# pushed slightly into that piece (the `where` tests pick the inactive / interior one).
ONE_SIDED = [
    ("soc", _a(5.0, 3.0, 4.0), _a(1.0, 0.0, 0.0), ()),  # boundary -> inside
    ("soc", _a(-5.0, 3.0, 4.0), _a(-1.0, 0.0, 0.0), ()),  # polar boundary -> polar
    ("l1", _a(1.5, 2.0, 1.0, 0.5), _a(0.0, 0.0, 0.0, -1.0), ()),  # tie -> inactive
    ("l1", _a(3.0, 1.0, -1.0, 1.0), _a(1.0, 0.0, 0.0, 0.0), ()),  # boundary -> inside
    ("simplex", _a(1.0, 0.5, 0.0), _a(0.0, -1.0, 0.0), (0.5,)),  # tie -> inactive
    ("box", _a(0.0, 1.0, -1.0), _a(1.0, -1.0, 1.0), (_a(0.0, 0.0, -1.0), 1.0)),
]


@pytest.mark.parametrize(
    "name,v,d,params", ONE_SIDED, ids=[f"{e[0]}-{i}" for i, e in enumerate(ONE_SIDED)]
)
def test_derivative_at_kink_is_one_sided(name, v, d, params):
    case = _CASE_BY_NAME[name]
    params = tuple(
        jnp.broadcast_to(
            jnp.asarray(q, dtype=v.dtype), v.shape if name == "box" else ()
        )
        for q in params
    )
    run = _grads_and_jacobians(case, len(params))
    c = jnp.ones_like(v)
    _, (jac, *_) = run(c, v, *params)
    _, (jac_side, *_) = run(c, v + 1e-7 * d, *params)
    np.testing.assert_allclose(jac, jac_side, rtol=0, atol=1e-12)


def test_exact_values_at_kinks():
    soc, l1, linf, simplex = map(
        _jitted,
        (
            project_second_order_cone,
            project_l1_norm_cone,
            project_linf_norm_cone,
            project_simplex,
        ),
    )
    np.testing.assert_array_equal(soc(_a(0.0, 0.0, 0.0)), 0.0)
    np.testing.assert_allclose(simplex(_a(1.0, 1.0, 1.0), 1.0), 1 / 3, atol=1e-15)
    np.testing.assert_array_equal(simplex(_a(3.0, -1.0, 3.0), 0.0), 0.0)
    np.testing.assert_allclose(l1(_a(0.0, 1.0, 1.0, 1.0)), [0.75, 0.25, 0.25, 0.25])
    np.testing.assert_allclose(linf(_a(0.0, 1.0, 1.0, 1.0)), [0.75, 0.75, 0.75, 0.75])
    # At total = 0 the projection is the constant zero map, and so is its Jacobian.
    _, (jac, _) = _grads_and_jacobians(_CASE_BY_NAME["simplex"], 1)(
        _a(1.0, 0.0, 0.0), _a(1.0, 1.0, 1.0), _a(0.0)[0]
    )
    np.testing.assert_array_equal(jac, 0.0)


# ---------------------------------------------------------------------------------
# jit + vmap, dtypes
# ---------------------------------------------------------------------------------


def _batched_args(name, rng, batch, n, dtype):
    v = rng.normal(size=(batch, n)).astype(dtype)
    if name == "box":
        lower = rng.uniform(-1, 0, size=(batch, n)).astype(dtype)
        upper = (lower + rng.uniform(0, 1, size=(batch, n))).astype(dtype)
        upper[:, 0] = np.inf
        return (v, lower, upper)
    if name == "simplex":
        total = rng.uniform(0, 2, size=batch).astype(dtype)
        total[0] = 0.0
        return (v, total)
    v[:, 0] *= 2 * rng.uniform(-1, 1, size=batch).astype(dtype)
    return (v,)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_jit_vmap_matches_loop(case, dtype):
    rng = np.random.default_rng(7)
    args = tuple(map(jnp.asarray, _batched_args(case.name, rng, 6, 5, dtype)))
    batched = jax.jit(jax.vmap(case.project))(*args)
    assert batched.dtype == dtype
    for b in range(args[0].shape[0]):
        single = _jitted(case.project)(*(a[b] for a in args))
        assert single.dtype == dtype
        np.testing.assert_allclose(batched[b], single, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_float32_with_float64_parameters(case):
    # Python floats and float64 bounds / totals must not promote a float32 input.
    v = jnp.asarray([0.5, -1.0, 2.0, 0.25], dtype=jnp.float32)
    params = {
        "box": (np.full(4, -0.5), 1.0),
        "simplex": (jnp.asarray(2.0, dtype=jnp.float64),),
    }.get(case.name, ())
    out, g = jax.jit(jax.value_and_grad(lambda w: jnp.sum(case.project(w, *params))))(v)
    assert out.dtype == jnp.float32 and g.dtype == jnp.float32
    # Outside jit too (tracing only, nothing is compiled).
    assert jax.eval_shape(case.project, v, *params).dtype == jnp.float32
