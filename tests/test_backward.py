"""Backward accuracy: implicit VJPs against central finite differences (float64) and
against unrolled differentiation; batch independence of the backward solve."""

import os
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest
from helpers import central_difference, constraints_of, random_polytope, slow_except

import pinet_eqx as pe
from pinet_eqx.problems import make_dc3

# Converged forward passes: each instance stops at 1e-12 (some hundreds of
# iterations here), within 6000.
SETTINGS = dict(n_iter=6000, tol=1e-12)


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    poly = random_polytope(rng, 12, 4, 8)
    return rng, poly


@pytest.mark.parametrize("param", slow_except(["y_raw", "b", "upper", "lb"], "y_raw"))
def test_vjp_matches_finite_differences_and_unrolling(param):
    rng, poly = _problem()
    proj = pe.Projector(
        constraints_of(poly, parameters=("b", "upper", "lb")),
        adjoint=pe.ImplicitAdjoint(on_failure="raise"),
        **SETTINGS,
    )
    values = dict(
        y_raw=2.0 * rng.normal(size=12),
        b=poly.b,
        upper=poly.upper,
        lb=poly.lb,
    )
    cot = rng.normal(size=12)

    def loss(p, x):
        vals = {**values, param: x}
        y_raw = vals.pop("y_raw")
        return jnp.dot(cot, p(jnp.asarray(y_raw), **vals))

    x0 = jnp.asarray(values[param])
    # Unrolled through as many iterations as the converged forward pass took.
    data = {k: jnp.asarray(x) for k, x in values.items() if k != "y_raw"}
    n_steps = int(proj.solve(jnp.asarray(values["y_raw"]), **data).n_iter)
    unrolled = proj.with_settings(
        adjoint=pe.UnrolledAdjoint(), tol=None, n_iter=n_steps
    )
    # Perturb only finite entries; infinite bounds have no derivative.
    v = rng.normal(size=x0.shape) * np.isfinite(np.asarray(x0))
    g_implicit = jax.grad(lambda x: loss(proj, x))(x0)
    g_unrolled = jax.grad(lambda x: loss(unrolled, x))(x0)
    fd = central_difference(lambda x: loss(proj, x), x0, v)
    g_finite = jnp.where(jnp.isfinite(g_implicit), g_implicit, 0.0)
    assert np.all(np.isfinite(g_finite))
    directional = float(jnp.dot(jnp.where(jnp.isfinite(x0), g_implicit, 0.0), v))
    assert abs(directional - float(fd)) <= 1e-5 * (1 + abs(float(fd)))
    # The gradient is genuinely non-zero (the reference returns 0 for `b`).
    assert float(jnp.max(jnp.abs(g_finite))) > 1e-3 or param in ("upper", "lb")
    mask = np.isfinite(np.asarray(x0))
    np.testing.assert_allclose(
        np.asarray(g_implicit)[mask], np.asarray(g_unrolled)[mask], atol=1e-6
    )


def test_gradient_wrt_b_is_nonzero_and_exact():
    # Equality only: the projection is affine in b, y = y_raw - E^+(E y_raw - b).
    rng = np.random.default_rng(3)
    E = rng.normal(size=(3, 7))
    proj = pe.Projector([pe.Equality(E, pe.Parameter("b"))], **SETTINGS)
    cot = rng.normal(size=7)
    g = jax.grad(lambda b: jnp.dot(cot, proj(jnp.zeros(7), b=b)))(jnp.ones(3))
    np.testing.assert_allclose(g, np.linalg.pinv(E).T @ cot, atol=1e-8)


@pytest.mark.slow
def test_batch_independence_of_backward_solve():
    rng, poly = _problem(1)
    proj = pe.Projector(
        constraints_of(poly, parameters=("b",)),
        n_iter=300,
        adjoint=pe.ImplicitAdjoint(max_steps=30, on_failure="ignore"),
    )
    B = 8
    Y = jnp.asarray(2.0 * rng.normal(size=(B, 12)))
    bs = jnp.asarray(np.tile(poly.b, (B, 1)))
    V = rng.normal(size=(B, 12))
    V_big = V.copy()
    V_big[3] *= 1e6

    def batched(Y, V):
        return jnp.sum(jnp.asarray(V) * jax.vmap(lambda y, b: proj(y, b=b))(Y, bs))

    g_small = jax.grad(batched)(Y, V)
    g_big = jax.grad(batched)(Y, V_big)
    others = np.arange(B) != 3
    # Same batch, same kernels: the only change is instance 3's cotangent, and no
    # other instance's gradient moves at all (a shared Krylov solve would move
    # them).
    np.testing.assert_array_equal(
        np.asarray(g_big)[others], np.asarray(g_small)[others]
    )
    # And each matches its own single-instance solve (up to matmul-vs-matvec
    # rounding, amplified by a Krylov solve capped at 30 steps).
    alone = jax.jit(jax.grad(lambda y, v, b: jnp.dot(v, proj(y, b=b))))
    for i in np.flatnonzero(others):
        g_alone = alone(Y[i], jnp.asarray(V[i]), bs[i])
        np.testing.assert_allclose(g_big[i], g_alone, rtol=1e-4, atol=1e-5)


def test_backward_non_convergence_is_reported():
    rng, poly = _problem(2)
    proj = pe.Projector(
        constraints_of(poly),
        n_iter=200,
        adjoint=pe.ImplicitAdjoint(max_steps=1, rtol=1e-12),
    )
    y_raw = jnp.asarray(3.0 * rng.normal(size=12))
    f = lambda y: jnp.sum(jnp.sin(proj(y)))  # noqa: E731
    with pytest.warns(pe.BackwardNotConvergedWarning):
        jax.block_until_ready(jax.grad(f)(y_raw))
    raising = proj.with_settings(
        adjoint=pe.ImplicitAdjoint(max_steps=1, rtol=1e-12, on_failure="raise")
    )
    with pytest.raises(Exception, match="did not converge"):
        jax.block_until_ready(jax.grad(lambda y: jnp.sum(jnp.sin(raising(y))))(y_raw))


@pytest.mark.parametrize(
    "ours, plain, tags",
    [
        (pe.BiCGStab, lx.BiCGStab, ()),
        (pe.ConjugateGradient, lx.CG, lx.positive_semidefinite_tag),
    ],
)
def test_backward_solve_never_returns_a_non_finite_iterate(ours, plain, tags):
    # On this "operator" (zero on finite vectors) both Krylov methods divide by a
    # zero curvature in their first step, so the plain lineax solvers return a
    # non-finite iterate; and the operator maps non-finite vectors to a zero
    # residual: ranked by residual alone, that iterate would win. Regression test
    # for NaN gradients met in training.
    rhs = jnp.arange(1.0, 5.0)
    operator = lx.FunctionLinearOperator(
        lambda x: jnp.where(jnp.isfinite(x), 0.0 * x, rhs),
        jax.eval_shape(lambda: rhs),
        tags,
    )
    trap = lx.linear_solve(
        operator, rhs, plain(rtol=1e-8, atol=1e-8, max_steps=10), throw=False
    )
    assert not np.all(np.isfinite(trap.value))  # the trap is armed
    solver = ours(rtol=1e-8, atol=1e-8, max_steps=10, on_failure="ignore")

    def solve(rhs):
        return lx.linear_solve(operator, rhs, solver, throw=False).value

    # Under jit too, where the residual of a non-finite iterate can come out as -inf.
    for x in (solve(rhs), eqx.filter_jit(solve)(rhs)):
        assert np.all(np.isfinite(x))


def test_gradient_under_jit_and_vmap():
    rng, poly = _problem(4)
    proj = pe.Projector(constraints_of(poly, parameters=("b",)), **SETTINGS)
    Y = jnp.asarray(rng.normal(size=(3, 12)))
    bs = jnp.asarray(np.tile(poly.b, (3, 1)))

    @jax.jit
    def loss(Y, bs):
        return jnp.sum(jax.vmap(lambda y, b: proj(y, b=b))(Y, bs) ** 2)

    gY, gb = jax.grad(loss, argnums=(0, 1))(Y, bs)
    v = rng.normal(size=Y.shape)
    fd = central_difference(lambda Y: loss(Y, bs), Y, v)
    assert abs(float(jnp.sum(gY * v)) - float(fd)) <= 1e-5 * (1 + abs(float(fd)))
    assert gb.shape == bs.shape


_FLOAT32_GRADIENT = """
import sys, jax, jax.numpy as jnp, numpy as np
import pinet_eqx as pe
from pinet_eqx.problems import make_dc3
assert not jax.config.jax_enable_x64
prob = make_dc3(n_examples=8)
proj = pe.Projector(
    [pe.Equality(prob.A, pe.Parameter("b")), pe.AffineInequality(prob.G, upper=prob.h)],
    n_iter=100,
)
rng = np.random.default_rng(7)
Y = jnp.asarray(rng.normal(size=(8, prob.n_var)), jnp.float32)
V = jnp.asarray(rng.normal(size=(8, prob.n_var)), jnp.float32)
X = jnp.asarray(prob.X, jnp.float32)
f = lambda Y: jnp.sum(V * jax.vmap(lambda y, b: proj(y, b=b))(Y, X))
np.save(sys.argv[1], np.asarray(jax.grad(f)(Y), np.float64))
"""


@pytest.mark.slow
def test_float32_backward_matches_float64(tmp_path):
    # The default backward pass, in float32 against float64 at the same forward
    # iterations. The float32 run happens in a subprocess where x64 is really off.
    out = tmp_path / "g32.npy"
    env = {**os.environ, "JAX_ENABLE_X64": "0"}
    subprocess.run(
        [sys.executable, "-c", _FLOAT32_GRADIENT, str(out)], check=True, env=env
    )
    g32 = np.load(out)
    prob = make_dc3(n_examples=8)
    proj = pe.Projector(
        [
            pe.Equality(prob.A, pe.Parameter("b")),
            pe.AffineInequality(prob.G, upper=prob.h),
        ],
        n_iter=100,
    )
    rng = np.random.default_rng(7)
    # Same draws as the subprocess, rounded to float32 the same way.
    Y = np.asarray(np.float32(rng.normal(size=(8, prob.n_var))), np.float64)
    V = np.asarray(np.float32(rng.normal(size=(8, prob.n_var))), np.float64)
    X = np.asarray(np.float32(prob.X), np.float64)

    def f(Y):
        return jnp.sum(V * jax.vmap(lambda y, b: proj(y, b=b))(Y, X))

    g64 = np.asarray(jax.grad(f)(jnp.asarray(Y)))
    err = np.linalg.norm(g32 - g64, axis=1) / np.linalg.norm(g64, axis=1)
    assert err.max() <= 1e-4, err
