"""Adjoints of the projection: `ImplicitAdjoint` (active-set and fixed-point) and
`UnrolledAdjoint`.

The implicit adjoint is a `custom_jvp`, so forward mode, reverse mode and second
derivatives all work. Covered, in float64 with converged forward passes: `jax.jvp`,
`jacfwd`, `jacrev` and Hessian-vector products against central finite differences for
every set kind; derivatives with respect to per-instance vector and matrix
parameters; degenerate points (a weakly active inequality, a second-order cone's
apex); agreement between the adjoints; batch independence under `jax.vmap`;
reporting of an unconverged backward solve; and float32 against float64 on DC3.
"""

import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    ConeSpec,
    EqualitySpec,
    InequalitySpec,
    assert_close,
    central_difference,
    random_set_spec,
    slow_except,
    spec_violation,
    to_pinet,
    values_of,
)
from jax.flatten_util import ravel_pytree

import pinet_eqx as pe
from pinet_eqx.problems import make_dc3

# Forward passes converged to ~1e-12, so that a central difference with step 1e-6
# carries an error of ~1e-6 at most (1e-12 / 1e-6, plus O(eps^2) truncation).
CONVERGED = dict(n_iter=20_000, tol=1e-12)
EPS = 1e-6
RTOL = 1e-5
_POLYHEDRAL = {"eq", "ineq", "box"}


def _adjoint(kinds, method="auto", on_failure="raise"):
    """An implicit adjoint whose backward solve converges far below `RTOL`."""
    fixed_point = method == "fixed_point" or not set(kinds) <= _POLYHEDRAL
    # The Krylov solve of the fixed-point system may need more steps than the
    # default (system size + 10) on cones; the active-set solve keeps its default.
    solver = pe.BiCGStab(rtol=1e-11, max_steps=500) if fixed_point else None
    return pe.ImplicitAdjoint(
        method=method, linear_solver=solver, on_failure=on_failure
    )


def _assert_rel(actual, expected, rtol=RTOL, what=""):
    """Max error at most `rtol * max(1, max|expected|)`."""
    assert_close(actual, expected, atol=rtol, rtol=rtol, what=what)


def _outside_point(rng, spec, d, scale=2.0):
    """A generic raw point well outside the set, so that some constraint is active."""
    y_raw = scale * rng.normal(size=d)
    assert spec_violation(y_raw, spec) > 0.1, "the raw point is (nearly) feasible"
    return y_raw


# ---------------------------------------------- 1. every set kind, w.r.t. y_raw

# name: (d, kinds, options for random_set_spec)
SET_CASES = {
    "eq": (6, ["eq"], dict(m_eq=3)),
    "ineq": (6, ["ineq"], dict(m_ineq=6)),
    "box": (6, ["box"], dict(infs=False)),
    "soc": (6, ["soc"], dict(cone_rows=4)),
    "l1": (6, ["l1"], dict(cone_rows=3)),
    "linf": (6, ["linf"], dict(cone_rows=4)),
    "simplex": (6, ["simplex"], dict(simplex_size=4)),
    "polytope": (8, ["eq", "ineq", "box"], dict(m_eq=2, m_ineq=4)),
    "cone_mixture": (
        9,
        ["soc", "l1", "simplex", "eq"],
        dict(cone_rows=3, m_eq=1, simplex_size=3),
    ),
}


def _set_case(case):
    d, kinds, opts = SET_CASES[case]
    rng = np.random.default_rng(600 + list(SET_CASES).index(case))
    spec, _ = random_set_spec(rng, d, kinds, **opts)
    proj = pe.Projector(to_pinet(spec), dim=d, adjoint=_adjoint(kinds), **CONVERGED)
    y_raw = jnp.asarray(_outside_point(rng, spec, d))
    v = jnp.asarray(rng.normal(size=d))
    return rng, proj, y_raw, v


@pytest.mark.parametrize("case", slow_except(SET_CASES, "box", "polytope"))
def test_jvp_and_jacobians_match_finite_differences(case):
    _, proj, y_raw, v = _set_case(case)
    d = y_raw.shape[0]

    # One program, compiled once: the finite-difference Jacobian (one column per
    # unit vector), the jvp and both Jacobians.
    @jax.jit
    def derivatives(y, v):
        fd_jac = jax.vmap(lambda e: central_difference(proj, y, e, EPS), out_axes=1)(
            jnp.eye(d)
        )
        tangent = jax.jvp(proj, (y,), (v,))[1]
        return fd_jac, tangent, jax.jacfwd(proj)(y), jax.jacrev(proj)(y)

    fd_jac, tangent, jac_fwd, jac_rev = derivatives(y_raw, v)
    _assert_rel(tangent, fd_jac @ v, what="jvp")
    _assert_rel(jac_fwd, fd_jac, what="jacfwd")
    _assert_rel(jac_rev, fd_jac, what="jacrev")
    assert_close(jac_fwd, jac_rev, atol=1e-8, what="jacfwd vs jacrev")
    # The projection onto a convex set is the gradient of a convex function (of
    # |y|^2/2 minus the Moreau envelope), so its Jacobian is symmetric.
    assert_close(jac_fwd, jac_fwd.T, atol=1e-8, what="symmetry")
    # The test is not vacuous: some constraint is active.
    assert float(jnp.max(jnp.abs(jac_fwd - jnp.eye(d)))) > 1e-2


@pytest.mark.parametrize("case", slow_except(SET_CASES, "box", "polytope"))
def test_hessian_vector_product_matches_finite_differences(case):
    # sin makes the loss curved even where the projection is piecewise affine; on
    # the cones the projection's own curvature enters too.
    _, proj, y_raw, v = _set_case(case)

    def loss(y):
        return jnp.sum(jnp.sin(proj(y)))

    @jax.jit
    def second_derivatives(y, v):
        fd = central_difference(jax.grad(loss), y, v, EPS)
        hvp = jax.jvp(jax.grad(loss), (y,), (v,))[1]
        return fd, hvp, jax.hessian(loss)(y)

    fd, hvp, hess = second_derivatives(y_raw, v)
    _assert_rel(hvp, fd, what="jvp of grad")
    _assert_rel(hess @ v, fd, what="hessian")
    assert_close(hess, hess.T, atol=1e-8, what="hessian symmetry")


# ------------------------------------------------- 2. per-instance parameters

# name: (d, kinds, {parameter name: (item index, field)}, options for
# random_set_spec)
PARAM_CASES = {
    "eq_b": (6, ["eq", "box"], {"b": (0, "b")}, dict(m_eq=2)),
    "ineq_bounds": (
        6,
        ["ineq"],
        {"lower": (0, "lower"), "upper": (0, "upper")},
        dict(m_ineq=5),
    ),
    # With an equality, so that the projection is not a plain clip.
    "box_bounds": (6, ["eq", "box"], {"lb": (1, "lb"), "ub": (1, "ub")}, dict(m_eq=1)),
    "soc_offsets": (
        6,
        ["soc", "eq"],
        {"a": (0, "a"), "b": (0, "b")},
        dict(cone_rows=4, m_eq=1),
    ),
    "l1_b_simplex_total": (
        8,
        ["simplex", "l1"],
        {"total": (0, "total"), "b": (1, "b")},
        dict(cone_rows=3, simplex_size=4),
    ),
    "polytope_matrices": (
        7,
        ["eq", "ineq", "box"],
        {"E": (0, "E"), "C": (1, "C")},
        dict(m_eq=2, m_ineq=3),
    ),
    "soc_matrix": (6, ["soc", "box"], {"A": (0, "A")}, dict(cone_rows=4)),
}


def _param_case(case):
    """`(proj, y_raw, flat, unravel, v)`: the parameters as one flat vector `flat`
    (`unravel(flat)` gives the keyword arguments) and a tangent `v` that is zero on
    infinite bounds, which have no derivative."""
    d, kinds, parameters, opts = PARAM_CASES[case]
    rng = np.random.default_rng(700 + list(PARAM_CASES).index(case))
    spec, _ = random_set_spec(rng, d, kinds, **opts)
    proj = pe.Projector(
        to_pinet(spec, parameters), dim=d, adjoint=_adjoint(kinds), **CONVERGED
    )
    values = {k: jnp.asarray(x) for k, x in values_of(spec, parameters).items()}
    flat, unravel = ravel_pytree(values)
    v = jnp.asarray(rng.normal(size=flat.shape)) * jnp.isfinite(flat)
    y_raw = jnp.asarray(_outside_point(rng, spec, d))
    return rng, proj, y_raw, flat, unravel, v


@pytest.mark.parametrize(
    "case",
    slow_except(
        PARAM_CASES,
        "ineq_bounds",
        "box_bounds",
        "polytope_matrices",
        "soc_offsets",
    ),
)
def test_parameter_derivatives_match_finite_differences(case):
    rng, proj, y_raw, flat, unravel, v = _param_case(case)
    cot = jnp.asarray(rng.normal(size=y_raw.shape))

    def f(x):
        return proj(y_raw, **unravel(x))

    @jax.jit
    def derivatives(x, v):
        grad = jax.grad(lambda x: jnp.dot(cot, f(x)))(x)
        return central_difference(f, x, v, EPS), jax.jvp(f, (x,), (v,))[1], grad

    fd, tangent, grad = derivatives(flat, v)
    _assert_rel(tangent, fd, what="jvp")
    finite = jnp.isfinite(flat)
    assert bool(jnp.all(jnp.isfinite(jnp.where(finite, grad, 0.0))))
    directional = jnp.sum(jnp.where(finite, grad, 0.0) * v)
    _assert_rel(directional, jnp.dot(cot, fd), what="grad")
    # The parameters genuinely matter at this point.
    assert float(jnp.max(jnp.abs(fd))) > 1e-3


@pytest.mark.slow
def test_matrix_parameter_hessian_vector_product():
    # A linear loss, so the check is on the projection's own second derivative in
    # (E, C), which is non-zero: the projection onto {E y = b, C_A y = u_A} involves
    # the pseudo-inverse of the active rows.
    rng, proj, y_raw, flat, unravel, v = _param_case("polytope_matrices")
    cot = jnp.asarray(rng.normal(size=y_raw.shape))

    def loss(x):
        return jnp.dot(cot, proj(y_raw, **unravel(x)))

    @jax.jit
    def second_derivatives(x, v):
        fd = central_difference(jax.grad(loss), x, v, EPS)
        return fd, jax.jvp(jax.grad(loss), (x,), (v,))[1]

    fd, hvp = second_derivatives(flat, v)
    _assert_rel(hvp, fd, what="hvp in (E, C)")
    assert float(jnp.max(jnp.abs(fd))) > 1e-3


# ------------------------------------------------------- 3. degenerate points


def _weakly_active_problem(seed):
    """`(spec, y_star, y_raw)` with Pi(y_raw) = y_star, where inequality row 0 is
    active with multiplier 0.8 and row 1 is active with multiplier zero.

    KKT: y_raw - y_star = 0.8 C_0 + E^T mu lies in the normal cone of the set at
    y_star, which is on both rows' upper bounds; row 2 and all lower bounds are
    inactive. (The KKT conditions hold by construction, so no solver is needed to
    certify the projection.)
    """
    rng = np.random.default_rng(seed)
    d = 6
    y_star = rng.uniform(-0.5, 0.5, size=d)
    E = rng.normal(size=(2, d))
    C = rng.normal(size=(3, d))
    w = C @ y_star
    upper = w + np.array([0.0, 0.0, 0.5])
    spec = [EqualitySpec(E, E @ y_star), InequalitySpec(C, w - 0.5, upper)]
    y_raw = y_star + 0.8 * C[0] + E.T @ rng.normal(size=2)
    return spec, y_star, y_raw


@pytest.mark.parametrize("method", slow_except(["auto", "fixed_point"], "auto"))
def test_weakly_active_inequality(method):
    # The map is not differentiable here: the one-sided directional derivatives
    # differ (with and without row 1 in the active set). Any consistent choice of
    # active set gives one of them.
    spec, y_star, y_raw = _weakly_active_problem(800)
    proj = pe.Projector(
        to_pinet(spec), adjoint=_adjoint(["eq", "ineq"], method), **CONVERGED
    )
    rng = np.random.default_rng(801)
    y_raw = jnp.asarray(y_raw)
    cot = jnp.asarray(rng.normal(size=6))
    v = jnp.asarray(rng.normal(size=6))

    @jax.jit
    def loss(y):
        return jnp.dot(cot, proj(y))

    assert_close(
        jax.jit(lambda y: proj(y))(y_raw), y_star, atol=1e-10, what="projection"
    )
    f0 = loss(y_raw)
    forward = float((loss(y_raw + EPS * v) - f0) / EPS)
    backward = float((f0 - loss(y_raw - EPS * v)) / EPS)
    assert abs(forward - backward) > 1e-3, "the point is not degenerate"

    grad = jax.jit(jax.grad(loss))(y_raw)
    assert bool(jnp.all(jnp.isfinite(grad)))
    tangent = jax.jit(lambda y, v: jax.jvp(loss, (y,), (v,))[1])(y_raw, v)
    for what, value in (("grad", float(jnp.dot(grad, v))), ("jvp", float(tangent))):
        err = min(abs(value - forward), abs(value - backward))
        assert err <= RTOL * max(1.0, abs(forward), abs(backward)), (
            what,
            value,
            forward,
            backward,
        )


def _apex_problem(kind, seed=810):
    """`(spec, apex, y_raw)`: a second-order cone {y : M (y - apex) in SOC} with
    M = [f^T; A] invertible, and y_raw = apex + M^T u with u in the interior of
    the polar cone -SOC, i.e. in the interior of the normal cone at the apex."""
    rng = np.random.default_rng(seed)
    d = 4
    if kind == "standard":  # {(t, x) : ||x|| <= t}
        M = np.eye(d)
        apex = np.zeros(d)
    else:
        M = rng.normal(size=(d, d))
        apex = rng.uniform(-0.5, 0.5, size=d)
    f, A = M[0], M[1:]
    spec = [ConeSpec("soc", A, -A @ apex, f, np.asarray(-f @ apex))]
    x0 = rng.normal(size=d - 1)
    u = np.concatenate([[-1.5 * np.linalg.norm(x0)], x0])  # ||x0|| < -t
    return spec, apex, apex + M.T @ u


@pytest.mark.parametrize("kind", slow_except(["standard", "general"], "general"))
def test_second_order_cone_apex(kind):
    # The projection is the apex on a neighbourhood of y_raw: the Jacobian is zero.
    spec, apex, y_raw = _apex_problem(kind)
    proj = pe.Projector(to_pinet(spec), adjoint=_adjoint(["soc"]), **CONVERGED)
    rng = np.random.default_rng(811)
    y_raw = jnp.asarray(y_raw)
    cot = jnp.asarray(rng.normal(size=4))
    v = jnp.asarray(rng.normal(size=4))

    @jax.jit
    def loss(y):
        return jnp.dot(cot, proj(y))

    assert_close(jax.jit(lambda y: proj(y))(y_raw), apex, atol=1e-10, what="projection")
    grad = jax.jit(jax.grad(loss))(y_raw)
    assert bool(jnp.all(jnp.isfinite(grad)))
    fd = float(central_difference(loss, y_raw, v, EPS))
    assert abs(fd) <= 1e-6
    assert abs(float(jnp.dot(grad, v)) - fd) <= 1e-6
    jac = jax.jit(jax.jacfwd(proj))(y_raw)
    assert bool(jnp.all(jnp.isfinite(jac)))
    assert_close(jac, np.zeros((4, 4)), atol=1e-6, what="jacfwd")


# ------------------------------------------------- 4. agreement between adjoints

# name: (d, kinds, parameters, forward iterations for the unrolled adjoint)
AGREEMENT_CASES = {
    "polytope": (7, ["eq", "ineq", "box"], {"b": (0, "b")}, 3000),
    "cones": (7, ["soc", "l1", "eq"], {"a": (0, "a")}, 5000),
}


def _agreement_case(case):
    d, kinds, parameters, n_unrolled = AGREEMENT_CASES[case]
    rng = np.random.default_rng(900 + list(AGREEMENT_CASES).index(case))
    spec, _ = random_set_spec(rng, d, kinds, cone_rows=3, m_eq=2, m_ineq=3)
    constraints = to_pinet(spec, parameters)
    values = {k: jnp.asarray(x) for k, x in values_of(spec, parameters).items()}
    y_raw = jnp.asarray(_outside_point(rng, spec, d))
    cot = jnp.asarray(rng.normal(size=d))

    def grads(proj):
        def loss(y, values):
            return jnp.dot(cot, proj(y, **values))

        return jax.jit(jax.grad(loss, argnums=(0, 1)))(y_raw, values)

    return kinds, constraints, n_unrolled, grads


@pytest.mark.parametrize("case", slow_except(AGREEMENT_CASES, "polytope"))
def test_unrolled_adjoint_agrees_with_implicit(case):
    kinds, constraints, n_unrolled, grads = _agreement_case(case)
    implicit = pe.Projector(constraints, adjoint=_adjoint(kinds), **CONVERGED)
    unrolled = pe.Projector(
        constraints, n_iter=n_unrolled, tol=None, adjoint=pe.UnrolledAdjoint()
    )
    g_implicit, g_unrolled = grads(implicit), grads(unrolled)
    for a, b in zip(jax.tree.leaves(g_implicit), jax.tree.leaves(g_unrolled)):
        assert_close(a, b, atol=1e-6, what=case)
    assert float(jnp.max(jnp.abs(g_implicit[0]))) > 1e-2


def test_fixed_point_method_agrees_with_active_set():
    kinds, constraints, _, grads = _agreement_case("polytope")
    g = {
        method: grads(
            pe.Projector(constraints, adjoint=_adjoint(kinds, method), **CONVERGED)
        )
        for method in ("active_set", "fixed_point")
    }
    for a, b in zip(
        jax.tree.leaves(g["active_set"]), jax.tree.leaves(g["fixed_point"])
    ):
        assert_close(a, b, atol=1e-8, what="active_set vs fixed_point")


def test_deprecated_unroll_alias():
    # `unroll=True` is kept for one release as an alias of
    # `adjoint=pe.UnrolledAdjoint()`, with a DeprecationWarning.
    kinds, constraints, _, grads = _agreement_case("polytope")
    with pytest.warns(DeprecationWarning):
        old = pe.Projector(constraints, n_iter=500, unroll=True)
    new = pe.Projector(constraints, n_iter=500, adjoint=pe.UnrolledAdjoint())
    for a, b in zip(jax.tree.leaves(grads(old)), jax.tree.leaves(grads(new))):
        np.testing.assert_array_equal(a, b)


def test_with_settings_accepts_adjoint():
    kinds, constraints, _, grads = _agreement_case("polytope")
    proj = pe.Projector(constraints, adjoint=_adjoint(kinds, "active_set"), **CONVERGED)
    fixed = proj.with_settings(adjoint=_adjoint(kinds, "fixed_point"))
    assert isinstance(fixed.adjoint, pe.ImplicitAdjoint)
    assert fixed.adjoint.method == "fixed_point"
    for a, b in zip(jax.tree.leaves(grads(proj)), jax.tree.leaves(grads(fixed))):
        assert_close(a, b, atol=1e-8)


# --------------------------------------------------- 5. batch independence


@pytest.mark.parametrize(
    "method", slow_except(["active_set", "fixed_point"], "active_set")
)
def test_batch_independence(method):
    rng = np.random.default_rng(1000)
    d, kinds = 8, ["eq", "ineq", "box"]
    spec, _ = random_set_spec(rng, d, kinds, m_eq=2, m_ineq=4)
    # Few steps everywhere: independence must hold for unconverged solves too.
    solver = pe.BiCGStab(max_steps=30) if method == "fixed_point" else None
    proj = pe.Projector(
        to_pinet(spec, {"b": (0, "b")}),
        n_iter=300,
        adjoint=pe.ImplicitAdjoint(
            method=method, linear_solver=solver, on_failure="ignore"
        ),
    )
    B = 8
    Y = jnp.asarray(2.0 * rng.normal(size=(B, d)))
    bs = jnp.asarray(np.tile(spec[0].b, (B, 1)))
    V = rng.normal(size=(B, d))
    V_big = V.copy()
    V_big[3] *= 1e6

    @jax.jit
    def grad(V):
        def batched(Y):
            return jnp.sum(V * jax.vmap(lambda y, b: proj(y, b=b))(Y, bs))

        return jax.grad(batched)(Y)

    g_small, g_big = np.asarray(grad(V)), np.asarray(grad(V_big))
    assert np.all(np.isfinite(g_big))
    others = np.arange(B) != 3
    np.testing.assert_array_equal(g_big[others], g_small[others])
    # Each instance matches its own single-instance solve, up to matmul-vs-matvec
    # rounding amplified by the unconverged solves.
    g_alone = jax.jit(jax.grad(lambda y: jnp.dot(V[0], proj(y, b=bs[0]))))(Y[0])
    np.testing.assert_allclose(g_big[0], g_alone, rtol=1e-4, atol=1e-5)


# ------------------------------------------------ 6. non-convergence reporting


@pytest.mark.parametrize("on_failure", slow_except(["warn", "raise", "ignore"], "warn"))
def test_backward_non_convergence_is_reported(on_failure):
    # A cone problem, so the fixed-point (Krylov) path is taken.
    rng = np.random.default_rng(1100)
    d, kinds = 6, ["soc", "eq"]
    spec, _ = random_set_spec(rng, d, kinds, cone_rows=4, m_eq=1)
    # The deprecated aliases (kept for one release, with a DeprecationWarning) must
    # still reach the adjoint: `n_iter_bwd` is the linear solver's `max_steps`.
    with pytest.warns(DeprecationWarning):
        old = pe.Projector(
            to_pinet(spec),
            n_iter=500,
            n_iter_bwd=1,
            bwd_rtol=1e-12,
            bwd_failure=on_failure,
        )
    assert isinstance(old.adjoint, pe.ImplicitAdjoint)
    assert old.adjoint.on_failure == on_failure
    new = pe.Projector(
        to_pinet(spec),
        n_iter=500,
        adjoint=pe.ImplicitAdjoint(
            method="fixed_point",
            linear_solver=pe.BiCGStab(rtol=1e-12, max_steps=1),
            on_failure=on_failure,
        ),
    )
    y_raw = jnp.asarray(_outside_point(rng, spec, d))
    v = jnp.asarray(rng.normal(size=d))

    # Both modes of differentiation report: reverse mode transposes the solve.
    for proj in (old, new):
        runs = (
            jax.jit(jax.grad(lambda y: jnp.sum(jnp.sin(proj(y))))),
            jax.jit(lambda y: jax.jvp(proj, (y,), (v,))[1]),
        )
        for run in runs:
            if on_failure == "warn":
                with pytest.warns(pe.BackwardNotConvergedWarning):
                    jax.block_until_ready(run(y_raw))
            elif on_failure == "raise":
                with pytest.raises(Exception, match="did not converge"):
                    jax.block_until_ready(run(y_raw))
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", pe.BackwardNotConvergedWarning)
                    out = jax.block_until_ready(run(y_raw))
                assert bool(jnp.all(jnp.isfinite(out)))


# -------------------------------------------- 7. float32 against float64, DC3

_FLOAT32_GRADIENT = """
import sys, jax, jax.numpy as jnp, numpy as np
import pinet_eqx as pe
from pinet_eqx.problems import make_dc3
assert not jax.config.jax_enable_x64
prob = make_dc3(n_examples=64)
proj = pe.Projector(
    [pe.Equality(prob.A, pe.Parameter("b")), pe.AffineInequality(prob.G, upper=prob.h)]
)
Y, V, X = (jnp.asarray(np.load(p), jnp.float32) for p in sys.argv[1:4])
f = lambda Y: jnp.sum(V * jax.vmap(lambda y, b: proj(y, b=b))(Y, X))
np.save(sys.argv[4], np.asarray(jax.grad(f)(Y), np.float64))
"""


@pytest.mark.slow
def test_float32_gradient_at_default_settings_matches_float64(tmp_path):
    # The float32 run happens in a subprocess where x64 is really off; its inputs
    # are rounded to float32 here, so both runs see the same numbers.
    prob = make_dc3(n_examples=64)
    rng = np.random.default_rng(1200)
    X = np.asarray(prob.X, np.float32)
    Y = X @ np.linalg.pinv(prob.A).T + 0.5 * rng.normal(size=(64, prob.n_var))
    V = rng.normal(size=Y.shape)
    arrays = {"Y": Y, "V": V, "X": X}
    paths = []
    for name, a in arrays.items():
        arrays[name] = np.asarray(np.float32(a), np.float64)
        paths.append(str(tmp_path / f"{name}.npy"))
        np.save(paths[-1], arrays[name])
    out = tmp_path / "g32.npy"
    env = {**os.environ, "JAX_ENABLE_X64": "0"}
    subprocess.run(
        [sys.executable, "-c", _FLOAT32_GRADIENT, *paths, str(out)],
        check=True,
        env=env,
    )
    g32 = np.load(out)

    constraints = [
        pe.Equality(prob.A, pe.Parameter("b")),
        pe.AffineInequality(prob.G, upper=prob.h),
    ]
    proj = pe.Projector(
        constraints, adjoint=_adjoint(["eq", "ineq"]), n_iter=5_000, tol=1e-12
    )
    V = jnp.asarray(arrays["V"])

    def f(Y):
        return jnp.sum(V * jax.vmap(lambda y, b: proj(y, b=b))(Y, arrays["X"]))

    g64 = np.asarray(jax.jit(jax.grad(f))(jnp.asarray(arrays["Y"])))
    err = np.linalg.norm(g32 - g64, axis=1) / np.linalg.norm(g64, axis=1)
    assert err.max() <= 1e-4, err
