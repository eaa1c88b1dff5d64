"""The DC3 benchmark's reference solvers (IPOPT via casadi, OSQP) and the `solver`
baseline method, on tiny problems."""

import numpy as np
import pytest
import scipy.optimize

from benchmarks._common.harness import Run
from benchmarks._common.timing import TIMING_STATS, time_inference
from benchmarks.dc3 import _data, _solver_method
from benchmarks.dc3._solvers import NonconvexIpopt, kkt_residuals, solve_nonconvex
from pinet_eqx.problems import dc3_violation, make_dc3, solve_dc3_convex

FORMULATIONS = ("full", "slack")
N_KKT = 10  # contexts checked against KKT and SLSQP


@pytest.fixture(scope="module")
def tiny():
    return make_dc3(20, 10, 10, n_examples=50)


@pytest.fixture(scope="module")
def solvers(tiny):
    return {f: NonconvexIpopt(tiny, formulation=f) for f in FORMULATIONS}


def _slsqp(problem, x):
    # An independent local solver from the same start A^+ x, with exact
    # derivatives, to compare IPOPT's point against.
    q, p, A, G, h = np.diag(problem.Q), problem.p, problem.A, problem.G, problem.h
    result = scipy.optimize.minimize(
        lambda y: 0.5 * q @ (y * y) + p @ np.sin(y),
        np.linalg.pinv(A) @ x,
        jac=lambda y: q * y + p * np.cos(y),
        method="SLSQP",
        constraints=[
            {"type": "eq", "fun": lambda y: A @ y - x, "jac": lambda y: A},
            {"type": "ineq", "fun": lambda y: h - G @ y, "jac": lambda y: -G},
        ],
        options={"ftol": 1e-12, "maxiter": 200},
    )
    assert result.success, result.message
    return result.x


@pytest.fixture(scope="module")
def slsqp_points(tiny):
    return [_slsqp(tiny, x) for x in tiny.X[:N_KKT]]


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_ipopt_feasible_kkt_and_matches_slsqp(tiny, solvers, slsqp_points, formulation):
    solver = solvers[formulation]
    for x, y_slsqp in zip(tiny.X[:N_KKT], slsqp_points, strict=True):
        result = solver.solve(x)
        assert result.success, result.status
        cv = dc3_violation(result.y[None], x[None], tiny.A, tiny.G, tiny.h)[0]
        assert cv < 1e-8
        # Recomputed here from the multipliers, rather than trusting `result.kkt`.
        kkt = kkt_residuals(tiny, result.y, x, result.lam_eq, result.lam_ineq)
        assert kkt == result.kkt
        assert kkt["stationarity"] < 1e-6
        assert kkt["complementarity"] < 1e-6
        assert kkt["dual"] == 0.0
        np.testing.assert_allclose(result.y, y_slsqp, rtol=0, atol=1e-5)


def test_formulations_agree(tiny, solvers):
    for x in tiny.X[10:20]:
        full, slack = (solvers[f].solve(x).y for f in FORMULATIONS)
        np.testing.assert_allclose(slack, full, rtol=0, atol=1e-6)


def test_solve_nonconvex(tiny, solvers):
    X = tiny.X[:5]
    Y = solve_nonconvex(tiny, X, progress=False)
    expected = np.stack([solvers["slack"].solve(x).y for x in X])
    np.testing.assert_allclose(Y, expected, rtol=0, atol=1e-12)
    with pytest.raises(RuntimeError, match="context 0"):
        solve_nonconvex(tiny, X, progress=False, ipopt_options={"max_iter": 1})
    with pytest.raises(ValueError, match="formulation"):
        NonconvexIpopt(make_dc3(20, 10, 5, n_examples=5), formulation="slack")


@pytest.fixture(scope="module")
def datasets(tiny):
    # Like `_data.load`, on 10 validation and 20 test contexts only (fast).
    splits = tiny.split(n_valid=10, n_test=20)
    solvers = {
        "convex": lambda X: solve_dc3_convex(tiny, X),
        "nonconvex": lambda X: solve_nonconvex(tiny, X, progress=False),
    }
    return {
        p: _data._dataset(
            p, tiny, p == "nonconvex", splits, (solve(splits[1]), solve(splits[2])), {}
        )
        for p, solve in solvers.items()
    }


def _fit(data, **overrides):
    config = _solver_method.default_config(data).replace(**overrides)
    run = Run(data, disable=True)
    trained = _solver_method.fit(data, config, 0, run)
    run.close()
    return trained


@pytest.mark.parametrize("mode", _solver_method.MODES)
def test_convex_solver_method(datasets, mode):
    data = datasets["convex"]
    trained = _fit(data, mode=mode)
    X = data.X_test[:20]
    Y = trained.predict(X)
    np.testing.assert_allclose(Y, solve_dc3_convex(data.problem, X), atol=1e-4)
    np.testing.assert_allclose(trained.predict_single(X[3]), Y[3], atol=1e-4)
    info = trained.info
    assert info["mode"] == mode and info["instances_solved"] == 21
    assert info["failures"] == 0 and info["iterations_mean"] > 0


def test_nonconvex_solver_method_and_timing(datasets):
    data = datasets["nonconvex"]
    trained = _fit(data, timing_batch_rows=4)
    Y = trained.predict(data.X_test[:10])
    np.testing.assert_allclose(Y, data.Y_test[:10], rtol=0, atol=1e-5)
    assert data.violation(Y, data.X_test[:10]).max() < 1e-6
    assert trained.info["failures"] == 0
    timing = time_inference(trained, data, repeats=20, batch_size=16)
    assert timing["batch_size"] == 16 and timing["batch_extrapolated_from"] == 4
    assert timing["batch"]["repeats"] == 3  # capped by the config
    assert set(timing["single"]) == set(TIMING_STATS)
    assert set(timing["batch"]) == set(TIMING_STATS)


def test_solve_nonconvex_falls_back_to_full(tiny, monkeypatch):
    # A context the slack formulation does not solve is re-solved in full.
    import dataclasses

    from benchmarks.dc3 import _solvers

    solve = _solvers.NonconvexIpopt.solve

    def failing_slack(self, x, y0=None):
        result = solve(self, x, y0)
        if self.formulation == "slack":
            return dataclasses.replace(result, success=False, y=result.y + 1.0)
        return result

    monkeypatch.setattr(_solvers.NonconvexIpopt, "solve", failing_slack)
    X = tiny.X[:3]
    Y = solve_nonconvex(tiny, X, progress=False)
    expected = solve_nonconvex(tiny, X, progress=False, formulation="full")
    np.testing.assert_allclose(Y, expected, rtol=0, atol=1e-12)


def test_solver_timing_picks_rows_from_budget(datasets):
    data = datasets["convex"]
    trained = _fit(data, mode="parametric", timing_budget_s=1e-9)
    timing = time_inference(trained, data, repeats=2, batch_size=16)
    assert timing["batch_extrapolated_from"] == 8  # the minimum
    assert timing["batch"]["repeats"] == 2
    trained = _fit(data, mode="parametric", timing_budget_s=1e9)
    timing = time_inference(trained, data, repeats=2, batch_size=16)
    assert "batch_extrapolated_from" not in timing
