"""The DC3 baseline of the benchmark suite: completion, correction and a short fit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks._common.harness import Run
from benchmarks.dc3 import _data, _dc3net


@pytest.fixture(scope="module")
def data():
    return _data.load("convex", "tiny", verbose=False)


@pytest.fixture(scope="module")
def completion(data):
    comp, info = _dc3net.make_completion(
        data.problem, np.random.default_rng(0), jnp.float64
    )
    return comp, info


def _violation(data, Y):
    P = data.problem
    return np.sum(np.maximum(np.asarray(Y) @ P.G.T - P.h, 0.0) ** 2, axis=1)


def test_completion_satisfies_equalities(data, completion):
    comp, info = completion
    P = data.problem
    n_part = P.n_var - P.n_eq
    assert info["n_partial"] == n_part
    assert len(set(info["dependent_columns"])) == P.n_eq
    assert info["completion_cond"] <= 100 * P.n_eq
    X = jnp.asarray(data.X_test)
    Z = jnp.asarray(10 * np.random.default_rng(0).normal(size=(len(X), n_part)))
    Y = np.asarray(_dc3net.complete(comp, X, Z))
    np.testing.assert_allclose(Y @ P.A.T, data.X_test, rtol=0, atol=1e-10)
    # The partial variables are the given z, in their original columns.
    part = np.setdiff1d(np.arange(P.n_var), info["dependent_columns"])
    np.testing.assert_array_equal(Y[:, part], np.asarray(Z))
    # The precomputed slack is G y - h of the completed point.
    np.testing.assert_allclose(
        np.asarray(_dc3net.slack(comp, X, Z)), Y @ P.G.T - P.h, atol=1e-10
    )


def test_completion_redraws_for_a_stable_correction(data):
    comp, info = _dc3net.make_completion(
        data.problem,
        np.random.default_rng(0),
        jnp.float64,
        corr_lr=1e-3,
        corr_momentum=0.5,
    )
    norm = np.linalg.norm(np.asarray(comp.G_z), 2)
    assert info["correction_stability"] == pytest.approx(1e-3 * norm**2 / 1.5)
    assert info["correction_stability"] < 1
    with pytest.raises(ValueError, match="stable correction"):
        _dc3net.make_completion(
            data.problem,
            np.random.default_rng(0),
            jnp.float64,
            max_tries=3,
            corr_lr=1.0,
        )


def test_correction_is_gradient_descent_through_the_completion(data, completion):
    comp, _ = completion
    X = jnp.asarray(data.X_test[:1])
    Z = jnp.asarray(10 * np.random.default_rng(1).normal(size=(1, 10)))

    def violation(Z):
        Y = _dc3net.complete(comp, X, Z)
        G, h = jnp.asarray(data.problem.G), jnp.asarray(data.problem.h)
        return jnp.sum(jax.nn.relu(Y @ G.T - h[None, :]) ** 2)

    lr = 1e-3
    stepped = _dc3net.correct(comp, X, Z, steps=1, lr=lr, momentum=0.5)
    np.testing.assert_allclose(stepped, Z - lr * jax.grad(violation)(Z), rtol=1e-12)


def test_correction_reduces_violation_and_keeps_equalities(data, completion):
    comp, _ = completion
    P = data.problem
    X = jnp.asarray(data.X_test)
    Z = jnp.asarray(10 * np.random.default_rng(2).normal(size=(len(X), 10)))
    before = _violation(data, _dc3net.complete(comp, X, Z))
    assert before.min() > 0  # every point starts infeasible
    # A step below 1/L (L = 2 ||G_z||^2 bounds the gradient's Lipschitz constant).
    lr = 0.25 / np.linalg.norm(np.asarray(comp.G_z), 2) ** 2
    for eps in (None, 0.0):  # the training (scan) and test (while) loops agree
        Zc = _dc3net.correct(comp, X, Z, steps=10, lr=lr, momentum=0.5, eps=eps)
        Y = _dc3net.complete(comp, X, Zc)
        after = _violation(data, Y)
        assert np.all(after < 0.9 * before)
        np.testing.assert_allclose(np.asarray(Y) @ P.A.T, data.X_test, atol=1e-10)
    # Once the whole batch is within eps, the test-time correction stops.
    same = _dc3net.correct(comp, X, Z, steps=10, lr=lr, momentum=0.5, eps=1e9)
    np.testing.assert_array_equal(same, Z)


def test_short_fit(data):
    config = _dc3net.default_config(data)
    assert config.corr_lr == 1e-7 and config.validate_every == 20
    config = config.replace(epochs=3, batch_size=100, validate_every=1)
    run = Run(data, disable=True)
    trained = _dc3net.fit(data, config, seed=0, run=run)
    Y = trained.predict(data.X_test)
    assert Y.shape == (len(data.X_test), data.problem.n_var)
    assert Y.dtype == jnp.float64
    residual = np.abs(np.asarray(Y) @ data.problem.A.T - data.X_test).max()
    assert residual < 1e-8
    assert [point["epoch"] for point in run.curve] == [1, 2, 3]
    assert run.steps == 3 * 4  # 400 training contexts, batches of 100
    assert np.isfinite([point["rs_mean"] for point in run.curve]).all()
    # Inference is deterministic (eval mode: running statistics, no dropout).
    np.testing.assert_array_equal(trained.predict(data.X_test), Y)
