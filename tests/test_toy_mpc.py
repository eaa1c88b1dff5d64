"""The toy MPC example (`examples/toy_mpc.py`, paper App. A), at a small size.

Its constraint matrices are checked against a plain simulation of the dynamics, its
OSQP optima against cvxpy + Clarabel on a formulation written from the problem
statement, and the plans of a short training run against a rollout of their own
inputs.
"""

import json

import equinox as eqx
import jax
import numpy as np
import pytest
from helpers import assert_close, clarabel_solve

from examples import toy_mpc

N = toy_mpc.HORIZON


def rollout(x0, inputs):
    """States x_0..x_N of x_{k+1} = x_k + u_k, by simulation; `(n, N + 1, 2)`."""
    states = [np.asarray(x0, np.float64)]
    for k in range(N):
        states.append(states[-1] + inputs[:, k])
    return np.stack(states, axis=1)


def plan_of(states, inputs):
    return np.concatenate(
        [states.reshape(len(states), -1), inputs.reshape(len(inputs), -1)], axis=1
    )


def check_plans(Y, X0, tol):
    """Each plan starts at its initial state, follows the dynamics (its states are
    the rollout of its inputs) and stays in the boxes, to `tol`."""
    states = Y[:, : 2 * (N + 1)].reshape(-1, N + 1, 2)
    inputs = Y[:, 2 * (N + 1) :].reshape(-1, N, 2)
    assert_close(states, rollout(X0, inputs), tol, what="rollout")
    assert np.abs(states).max() <= 10.0 + tol
    assert np.abs(inputs).max() <= 1.0 + tol


def test_matrices_match_simulation():
    rng = np.random.default_rng(0)
    X0 = rng.uniform(-5, 5, size=(16, 2))
    inputs = rng.uniform(-1, 1, size=(16, N, 2))
    Y = plan_of(rollout(X0, inputs), inputs)
    E0, E_dyn, lower, upper = toy_mpc.problem_data()
    assert Y.shape[1] == toy_mpc.N_VAR == 82
    assert_close(Y @ E0.T, X0, 1e-12, what="x_0 = E0 y")
    assert_close(Y @ E_dyn.T, 0.0, 1e-12, what="E_dyn y = 0")
    assert (Y >= lower).all() and (Y <= upper).all()
    # The projector's own check and the example's statement-based check agree.
    proj = toy_mpc.make_projector()
    viol = jax.vmap(lambda y, x0: proj.violation(y, x0=x0))(Y, X0)
    assert float(viol.max()) <= 1e-12
    eq, ineq = toy_mpc.violations(Y, X0)
    assert eq.max() <= 1e-12 and ineq.max() == 0.0
    # The cost: states k = 0..N (or 0..N-1, the paper's sum), inputs k = 0..N-1.
    states, ins = toy_mpc.split(Y)
    J = sum(
        ((states[:, k] - toy_mpc.TARGET) ** 2).sum(-1) + (ins[:, k] ** 2).sum(-1)
        for k in range(N)
    )
    assert_close(toy_mpc.cost(Y, terminal=False), J, 1e-9, what="paper's sum")
    J = J + ((states[:, N] - toy_mpc.TARGET) ** 2).sum(-1)
    assert_close(toy_mpc.cost(Y), J, 1e-9, what="with x_N")
    # Breaking the dynamics at one step, or leaving the box, is caught.
    bad = Y.copy()
    bad[:, 2 * 7] += 0.1  # x_7, first coordinate
    assert np.abs(bad @ E_dyn.T).max() > 0.09
    assert toy_mpc.violations(bad, X0)[0].min() > 0.09
    bad = Y.copy()
    bad[:, -1] = 1.5  # u_{N-1} outside [-1, 1]; x_N no longer follows
    assert toy_mpc.violations(bad, X0)[1].min() >= 0.5


@pytest.mark.parametrize("terminal", [True, False])
def test_osqp_matches_clarabel(terminal):
    """OSQP's optimal plans (the example's ground truth) against cvxpy + Clarabel
    on the problem written out state by state."""
    import cvxpy as cp

    rng = np.random.default_rng(1)
    X0 = toy_mpc.sample_states(rng, 4)
    Y, _ = toy_mpc.solve_osqp(X0, terminal)
    check_plans(Y, X0, 1e-7)
    for x0, y in zip(X0, Y):
        x = cp.Variable((N + 1, 2))
        u = cp.Variable((N, 2))
        cons = [x[0] == x0, cp.abs(x) <= 10, cp.abs(u) <= 1]
        cons += [x[k + 1] == x[k] + u[k] for k in range(N)]
        J = sum(
            cp.sum_squares(x[k] - toy_mpc.TARGET) + cp.sum_squares(u[k])
            for k in range(N)
        )
        if terminal:
            J = J + cp.sum_squares(x[N] - toy_mpc.TARGET)
        prob = cp.Problem(cp.Minimize(J), cons)
        assert clarabel_solve(prob) == "optimal"
        J_osqp = toy_mpc.cost(y, terminal)
        assert_close(J_osqp, prob.value, 1e-7 * prob.value, what="J*")
        assert_close(y[: 2 * (N + 1)], x.value.ravel(), 1e-4, what="states")


def test_small_run(tmp_path):
    args = ["--epochs", "6", "--n-train", "1024", "--batch-size", "64"]
    args += ["--lr", "3e-3", "--n-test", "50", "--out", str(tmp_path)]
    out = toy_mpc.main(args)
    summary = json.loads((tmp_path / "toy_mpc.json").read_text())
    assert summary == json.loads(json.dumps(out["summary"]))
    png = tmp_path / "toy_mpc.png"
    assert png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    methods = ["Solver (OSQP)", "Ours (projection)", "Soft, λ = 1", "Soft, λ = 0.001"]
    assert sorted(summary["results"]) == sorted(methods)
    keys = {"rs_mean", "rs_median", "rs_max", "rs_signed_mean", "cv_max", "cv_mean"}
    keys |= {"eqcv_max", "ineqcv_max", "pct_cv_le_1e-3"}
    for label in methods:
        assert keys <= set(summary["results"][label]), label
        assert all(np.isfinite(v) for v in summary["results"][label].values())
    assert "solve_s" in summary["results"]["Solver (OSQP)"]
    for label in methods[1:]:
        assert {"train_s", "skipped_steps", "batch_inference_s"} <= set(
            summary["results"][label]
        )

    X0 = out["X_test"]
    J_star = toy_mpc.cost(out["plans"]["Solver (OSQP)"])
    check_plans(out["plans"]["Solver (OSQP)"], X0, 1e-7)
    # Ours is feasible, checked by simulating its own inputs, not by the projector.
    assert summary["dtype"] == "float64"  # conftest enables x64
    check_plans(out["plans"]["Ours (projection)"], X0, 1e-5)
    assert summary["results"]["Ours (projection)"]["cv_max"] <= 1e-5
    assert summary["results"]["Ours (projection)"]["pct_cv_le_1e-3"] == 100.0
    # Training helped: ours beats the same projected network untrained.
    rs = summary["results"]["Ours (projection)"]["rs_mean"]
    untrained = eqx.nn.inference_mode(toy_mpc.hard_net(jax.random.key(0)))
    Y0 = np.asarray(eqx.filter_jit(toy_mpc.predict)(untrained, X0))
    rs_untrained = toy_mpc.score(Y0, X0, J_star)["rs_mean"]
    print(f"RS {rs:.3e}, untrained {rs_untrained:.3e}")
    assert 0.0 <= rs < min(1e-2, 0.01 * rs_untrained)
