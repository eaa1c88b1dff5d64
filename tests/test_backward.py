"""Backward accuracy: implicit VJPs against central finite differences (float64) and
against unrolled differentiation; batch independence of the backward solve."""

import os
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import central_difference, constraints_of, random_polytope

import pinet_eqx as pe
from pinet_eqx.problems import make_dc3

SETTINGS = dict(n_iter=6000, sigma=0.1, n_iter_bwd=400, bwd_rtol=1e-10, bwd_atol=1e-12)


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    poly = random_polytope(rng, 12, 4, 8)
    return rng, poly


@pytest.mark.parametrize("param", ["y_raw", "b", "upper", "lb"])
def test_vjp_matches_finite_differences_and_unrolling(param):
    rng, poly = _problem()
    proj = pe.Projector(
        constraints_of(poly, parameters=("b", "upper", "lb")),
        bwd_failure="raise",
        **SETTINGS,
    )
    unrolled = proj.with_settings(unroll=True)
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


def test_batch_independence_of_backward_solve():
    rng, poly = _problem(1)
    proj = pe.Projector(
        constraints_of(poly, parameters=("b",)),
        n_iter=300,
        n_iter_bwd=30,
        bwd_failure="ignore",
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
    # other instance's gradient moves at all (a shared BiCGStab would move them).
    np.testing.assert_array_equal(
        np.asarray(g_big)[others], np.asarray(g_small)[others]
    )
    # And each matches its own single-instance solve (up to matmul-vs-matvec
    # rounding, amplified by the unconverged 30-step Krylov solve).
    for i in np.flatnonzero(others):
        g_alone = jax.grad(lambda y: jnp.dot(jnp.asarray(V[i]), proj(y, b=bs[i])))(Y[i])
        np.testing.assert_allclose(g_big[i], g_alone, rtol=1e-4, atol=1e-5)


def test_backward_non_convergence_is_reported():
    rng, poly = _problem(2)
    proj = pe.Projector(constraints_of(poly), n_iter=200, n_iter_bwd=1, bwd_rtol=1e-12)
    y_raw = jnp.asarray(3.0 * rng.normal(size=12))
    f = lambda y: jnp.sum(jnp.sin(proj(y)))  # noqa: E731
    with pytest.warns(pe.BackwardNotConvergedWarning):
        jax.block_until_ready(jax.grad(f)(y_raw))
    raising = proj.with_settings(bwd_failure="raise")
    with pytest.raises(Exception, match="did not converge"):
        jax.block_until_ready(jax.grad(lambda y: jnp.sum(jnp.sin(raising(y))))(y_raw))


def test_backward_solve_never_returns_a_non_finite_iterate():
    # BiCGStab breaks down on this "operator" with a NaN iterate (0/0 in its first
    # step), and the operator maps NaN to a zero residual: ranked by residual alone,
    # the NaN iterate would win. Regression test for NaN gradients met in training.
    import lineax as lx

    from pinet_eqx._douglas_rachford import Config
    from pinet_eqx._implicit import _bicgstab_with_restarts

    rhs = jnp.arange(1.0, 5.0)
    operator = lx.FunctionLinearOperator(
        lambda x: jnp.where(jnp.isfinite(x), x, rhs), jax.eval_shape(lambda: rhs)
    )
    cfg = Config(bwd_rtol=1e-8, bwd_atol=1e-8, n_iter_bwd=10, bwd_failure="ignore")
    plain = lx.linear_solve(
        operator, rhs, lx.BiCGStab(rtol=1e-8, atol=1e-8, max_steps=10), throw=False
    )
    assert not np.all(np.isfinite(plain.value))  # the trap is armed
    # Under jit too, where the residual of a NaN iterate can come out as -inf.
    jitted = eqx.filter_jit(lambda rhs: _bicgstab_with_restarts(operator, rhs, cfg))
    for xi in (_bicgstab_with_restarts(operator, rhs, cfg)[0], jitted(rhs)[0]):
        assert np.all(np.isfinite(xi))


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
    n_iter=100, n_iter_bwd=100, bwd_failure="ignore",
)
rng = np.random.default_rng(7)
Y = jnp.asarray(rng.normal(size=(8, prob.n_var)), jnp.float32)
V = jnp.asarray(rng.normal(size=(8, prob.n_var)), jnp.float32)
X = jnp.asarray(prob.X, jnp.float32)
f = lambda Y: jnp.sum(V * jax.vmap(lambda y, b: proj(y, b=b))(Y, X))
np.save(sys.argv[1], np.asarray(jax.grad(f)(Y), np.float64))
"""


def test_float32_backward_matches_float64(tmp_path):
    # Guards the restart-on-breakdown wrapper. Without x64, lineax's BiCGStab flags
    # a breakdown whenever rho or alpha is negative and stops after a few steps; the
    # float32 run therefore happens in a subprocess where x64 is really off.
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
        n_iter_bwd=100,
        bwd_failure="ignore",
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
    assert err.max() <= 1e-3, err
