"""The DC3 suite's projection-layer baselines: jaxopt.OSQP and cvxpylayers.

Each layer's projection and its vector-Jacobian product with respect to the raw
point are checked against an independent projection (cvxpy with Clarabel, to high
accuracy) and central finite differences of it; then one epoch of training runs
through the harness.
"""

import dataclasses

import cvxpy as cp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks._common.harness import Run
from benchmarks._common.timing import time_inference
from benchmarks.dc3 import _cvxpylayers, _data, _jaxopt
from pinet_eqx.problems import make_dc3

_N = 3  # instances checked per layer
_FD_STEP = 1e-4


@pytest.fixture(scope="module")
def data():
    return _data.load("convex", "tiny", verbose=False)


@pytest.fixture(scope="module")
def reference(data):
    """An independent projection `(r, x) -> y` by cvxpy and Clarabel."""
    P = data.problem
    y = cp.Variable(P.n_var)
    r = cp.Parameter(P.n_var)
    x = cp.Parameter(P.n_eq)
    problem = cp.Problem(
        cp.Minimize(0.5 * cp.sum_squares(y - r)), [P.A @ y == x, P.G @ y <= P.h]
    )

    def project(r_value, x_value):
        r.value, x.value = r_value, x_value
        problem.solve(cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
        return y.value

    return project


@pytest.fixture(scope="module")
def points(data):
    """Raw points far enough outside the set that some inequalities are active."""
    rng = np.random.default_rng(0)
    R = 2.0 * rng.standard_normal((_N, data.problem.n_var))
    V = rng.standard_normal((_N, data.problem.n_var))  # cotangents for the VJP
    return R, data.X_test[:_N], V


def _reference_vjp(reference, r, x, v):
    # Central differences of the reference projection, one coordinate of r at a
    # time, contracted with the cotangent v: the i-th entry is v . dy/dr_i.
    out = np.empty_like(r)
    for i in range(len(r)):
        e = np.zeros_like(r)
        e[i] = _FD_STEP
        dy = reference(r + e, x) - reference(r - e, x)
        out[i] = v @ dy / (2 * _FD_STEP)
    return out


def _jaxopt_layer(data):
    P = data.problem
    A, G, h = (jnp.asarray(M) for M in (P.A, P.G, P.h))
    project = jax.vmap(_jaxopt.make_projection(A, G, h))

    @jax.jit
    def value_and_vjp(R, X, V):
        Y, pullback = jax.vjp(lambda R: project(R, X), R)
        return Y, pullback(V)[0]

    return lambda R, X, V: value_and_vjp(jnp.asarray(R), jnp.asarray(X), V)


def _cvxpylayers_layer(data):
    P = data.problem
    project = _cvxpylayers.make_projection(P.A, P.G, P.h)

    def value_and_vjp(R, X, V):
        X = jnp.asarray(X)
        Y, pullback = jax.vjp(lambda R: project(R, X), jnp.asarray(R))
        return Y, pullback(jnp.asarray(V))[0]

    return value_and_vjp


# layer, tolerance on the projection, relative tolerance on the VJP. jaxopt stops
# at OSQP's tolerance 1e-3 and differentiates at that inexact point.
_LAYERS = {
    "jaxopt": (_jaxopt_layer, 1e-2, 5e-2),
    "cvxpylayers": (_cvxpylayers_layer, 5e-4, 2e-3),
}


@pytest.mark.parametrize("name", list(_LAYERS))
def test_projection_and_vjp_match_reference(name, data, reference, points):
    make_layer, tol, vjp_rtol = _LAYERS[name]
    R, X, V = points
    Y, G = (np.asarray(a) for a in make_layer(data)(R, X, V))
    Y_ref = np.stack([reference(r, x) for r, x in zip(R, X)])
    assert np.abs(Y - Y_ref).max() < tol
    # The points must exercise the inequalities, or the VJP check is too easy.
    active = (Y_ref @ data.problem.G.T - data.problem.h) > -1e-6
    assert active.sum(axis=1).min() >= 1
    for r, x, v, g in zip(R, X, V, G):
        g_ref = _reference_vjp(reference, r, x, v)
        assert np.linalg.norm(g - g_ref) <= vjp_rtol * np.linalg.norm(g_ref)


@pytest.mark.parametrize(
    "module, cv_tol",
    [(_jaxopt, 2e-3), (_cvxpylayers, 1e-5)],
    ids=["jaxopt", "cvxpylayers"],
)
def test_one_epoch_fit(module, cv_tol, data):
    # One batch of training contexts, all splits of one shape: JAX compiles (and
    # cvxpylayers' eager JAX glue recompiles) for every new batch shape.
    n = len(data.X_valid)
    data = dataclasses.replace(data, X_train=data.X_train[:n], X_test=data.X_test[:n])
    config = module.default_config(data).replace(epochs=1)
    run = Run(data, disable=True)
    trained = module.fit(data, config, 0, run)
    assert run.steps == 1
    assert [point["epoch"] for point in run.curve] == [1]
    assert trained.info["epochs_done"] == 1
    Y = np.asarray(trained.predict(data.X_test))
    assert Y.shape == (len(data.X_test), data.problem.n_var)
    assert np.all(np.isfinite(Y))
    assert data.violation(Y, data.X_test).max() < cv_tol
    if module is _cvxpylayers:  # jaxopt's would compile again for a batch of one
        y = np.asarray(trained.predict_single(data.X_test[0]))
        np.testing.assert_allclose(y, Y[0], atol=cv_tol)
        timing = time_inference(trained, data, batch_size=n, single_repeats=2)
        assert timing["batch"]["repeats"] == config.timing_repeats


def test_cvxpylayers_refuses_large_problems(data):
    big = dataclasses.replace(data, problem=make_dc3(201, 10, 10, 30, seed=0))
    config = _cvxpylayers.default_config(big)
    with pytest.raises(ValueError, match="at most 200 variables"):
        _cvxpylayers.fit(big, config, 0, Run(big, disable=True))
