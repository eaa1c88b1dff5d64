"""The multi-vehicle motion planning example (`examples/motion_planning`, paper
Sec. 3.2 and App. B.3), at a small size: N = 2 vehicles, T = 10 steps, and the
contextual-coverage case with a 64 x 64 map and H = 20.

The constraint matrices are checked against a plain simulation of the dynamics,
the contexts and the OSQP baseline against cvxpy + Clarabel on the problem written
out step by step, the objectives against values computed by hand, and the
trajectories of a short training run against the definitions in float64.
"""

import json
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, clarabel_solve

from examples import motion_planning as mp
from examples.motion_planning._cli import load_planner, main

# h = 0.5: with T = 10 steps of 0.25 a vehicle can only cross 1.9 units from rest
# to rest under the jerk limit (`reach`), less than the start-to-goal distance.
TINY = mp.Problem(n_vehicles=2, horizon=10, h=0.5)


def simulate(start, acc, h):
    """p[0..T], v[0..T] of the double integrator from rest, step by step."""
    p, v = [np.asarray(start, np.float64)], [np.zeros(2)]
    for a in acc:
        p.append(p[-1] + h * v[-1] + h * h / 2 * a)
        v.append(v[-1] + h * a)
    return np.stack(p), np.stack(v)


def test_matrices_match_simulation():
    rng = np.random.default_rng(0)
    T, h = TINY.horizon, TINY.h
    c = mp.constraint_matrices(TINY)
    for _ in range(5):
        start = rng.uniform(-3, 3, 2)
        acc = rng.uniform(-1, 1, (T, 2))
        p, v = simulate(start, acc, h)
        y = np.concatenate([p.ravel(), v.ravel(), acc.ravel()])
        assert y.shape == (TINY.dim,) == (6 * T + 4,)
        assert_close(c["dynamics"] @ y, 0.0, 1e-12, what="A_dyn y")
        assert_close(c["start"] @ y, start, 1e-15, what="p[0]")
        assert_close(c["goal"] @ y, p[T], 1e-15, what="p[T]")
        assert_close(c["rest"] @ y, np.concatenate([v[0], v[T]]), 1e-15, what="v")
        assert_close(c["jerk"] @ y, np.diff(acc, axis=0).ravel() / h, 1e-12)
        assert_close(mp.join(p, v, acc), y, 0.0, what="join")
        # The JAX rollout that makes the raw trajectories is the same simulation.
        pj, vj = mp.rollout(jnp.asarray(start), jnp.asarray(acc), h)
        assert_close(pj, p, 1e-12, what="rollout p")
        assert_close(vj, v, 1e-12, what="rollout v")
        # The independent check agrees, and catches a broken step.
        viol = mp.violations(y, start, p[T], TINY)
        assert viol["dynamics"] <= 1e-12
        # A random rollout does not stop: the boundary violation is |v[T]|.
        assert_close(viol["boundary"], np.abs(v[T]).max(), 1e-15, what="boundary")
        bad = y.copy()
        bad[2 * 4] += 0.1  # p[4], first coordinate
        assert mp.violations(bad, start, p[T], TINY)["dynamics"] >= 0.099
        assert np.abs(c["dynamics"] @ bad).max() >= 0.099
    # The boxes: |p| <= 5, |v| <= 20, |a| <= 5, in that layout.
    p_sl, v_sl, a_sl = TINY.slices
    assert (c["upper"][p_sl] == 5).all() and (c["upper"][v_sl] == 20).all()
    assert (c["upper"][a_sl] == 5).all() and (c["lower"] == -c["upper"]).all()


def _qp_cvxpy(cp, start, goal, problem, objective=True):
    """The effort-optimal (or any feasible) trajectory, from the statement."""
    T, h = problem.horizon, problem.h
    p, v, a = cp.Variable((T + 1, 2)), cp.Variable((T + 1, 2)), cp.Variable((T, 2))
    cons = [p[0] == start, p[T] == goal, v[0] == 0, v[T] == 0]
    cons += [cp.abs(p) <= 5, cp.abs(v) <= 20, cp.abs(a) <= 5]
    cons += [cp.abs(a[1:] - a[:-1]) <= 1.5 * h]
    cons += [v[1:] == v[:-1] + h * a, p[1:] == p[:-1] + h * v[:-1] + h * h / 2 * a]
    prob = cp.Problem(cp.Minimize(cp.sum_squares(a) if objective else 0), cons)
    status = clarabel_solve(prob)
    return status, prob.value, (p.value, v.value, a.value)


@pytest.mark.parametrize("problem", [TINY, mp.Problem(n_vehicles=15)])
def test_contexts_feasible(problem):
    """Every sampled context has a feasible trajectory: the certificate is one
    (checked from the definitions), and Clarabel finds one."""
    cp = pytest.importorskip("cvxpy")
    S, G = mp.sample_contexts(np.random.default_rng(1), 20, problem)
    assert S.shape == G.shape == (20, problem.n_vehicles, 2)
    assert (S[..., 0] < 0).all() and (G[..., 0] > 0).all()  # left to right
    assert np.abs(np.concatenate([S, G])).max() <= 0.9 * problem.p_max
    Y = np.stack(
        [[mp.feasible_trajectory(s, g, problem) for s, g in zip(*c)] for c in zip(S, G)]
    )
    assert mp.violations(Y, S, G, problem)["cv"].max() <= 1e-12
    for s, g in zip(S[:2].reshape(-1, 2), G[:2].reshape(-1, 2)):
        assert _qp_cvxpy(cp, s, g, problem, objective=False)[0] == "optimal"
    # Too short a horizon for the workspace is reported, not looped on.
    with pytest.raises(RuntimeError, match="reach"):
        mp.sample_contexts(
            np.random.default_rng(0), 1, mp.Problem(horizon=4), max_tries=50
        )


def test_qp_baseline_matches_clarabel():
    cp = pytest.importorskip("cvxpy")
    S, G = mp.sample_contexts(np.random.default_rng(2), 2, TINY)
    Y_star, _ = mp.solve_effort_qp(S, G, TINY)
    assert mp.violations(Y_star, S, G, TINY)["cv"].max() <= 1e-7
    for y, s, g in zip(
        Y_star.reshape(-1, TINY.dim), S.reshape(-1, 2), G.reshape(-1, 2)
    ):
        status, value, (p, v, a) = _qp_cvxpy(cp, s, g, TINY)
        assert status == "optimal"
        assert_close(float(mp.effort(y[None], TINY)), value, 1e-7 * value, what="J*")
        assert_close(mp.split(y, TINY)[2], a, 1e-4, what="accelerations")
    # RS of the optimum against itself is 0; of a feasible certificate, positive.
    assert mp.relative_suboptimality(Y_star, Y_star, TINY)["rs_max"] == 0.0
    Y_cert = np.stack(
        [[mp.feasible_trajectory(s, g, TINY) for s, g in zip(*c)] for c in zip(S, G)]
    )
    assert mp.relative_suboptimality(Y_cert, Y_star, TINY)["rs_max"] <= 1e-9
    assert_close(Y_cert, Y_star, 1e-6, what="ramp vs OSQP")


def test_objectives_by_hand():
    problem = mp.Problem(n_vehicles=1, horizon=2, h=1.0)
    # Effort: accelerations (1, 2) and (3, -1): 1 + 4 + 9 + 1.
    y = mp.join(np.zeros((3, 2)), np.zeros((3, 2)), np.array([[1.0, 2.0], [3, -1]]))
    assert_close(mp.effort(y[None], problem), 15.0, 1e-12)
    # Preference: psi(0) = 0; at p = (pi / 2.5, 0), z = (pi / 2, 0).
    assert_close(mp.ishigami(np.zeros(2)), 0.0, 1e-15)
    z1 = np.pi / 2
    expected = 0.05 * (1.0 + 0.1 * (z1 / 2) ** 4)
    assert_close(mp.ishigami(np.array([np.pi / 2.5, 0.0])), expected, 1e-14)
    p = np.tile([np.pi / 2.5, 0.0], (3, 1))
    y = mp.join(p, np.zeros((3, 2)), np.zeros((2, 2)))
    assert_close(mp.preference(y[None], problem), 3 * expected, 1e-14)
    # Coverage: the three positions at the centre of pixel (row 8, column 8):
    # u = 8.5 <=> p_1 = 8.5 / 16 * 10 - 5, v = 8.5 <=> p_2 = 7.5 / 16 * 10 - 5.
    centre = np.array([8.5 / 16 * 10 - 5, 7.5 / 16 * 10 - 5])
    y = mp.join(np.tile(centre, (3, 1)), np.zeros((3, 2)), np.zeros((2, 2)))
    one = mp.Coverage(amplitude=200.0 / 3)  # three footprints add up to one of 200
    image = np.asarray(mp.coverage_image(y[None], problem, one))
    assert image.shape == (16, 16)
    assert np.unravel_index(image.argmax(), image.shape) == (8, 8)
    assert_close(image[8, 8], 200.0, 1e-10)
    assert_close(image[8, 9], 200.0 * np.exp(-0.5), 1e-10)
    k = np.arange(16) - 8
    s1 = np.exp(-(k**2) / 2).sum()  # the footprint is separable
    assert_close(mp.coverage(y[None], problem, one), -200 * s1**2 / 256 / 255, 1e-12)
    # With the paper's amplitude the three footprints sum to 600: clipped at 255.
    assert_close(mp.coverage_image(y[None], problem)[8, 8], 255.0, 0.0)
    # Row 0 is the top of the workspace: a vehicle at the top left lights it.
    y = mp.join(np.tile([-4.7, 4.7], (3, 1)), np.zeros((3, 2)), np.zeros((2, 2)))
    image = np.asarray(mp.coverage_image(y[None], problem))
    assert np.unravel_index(image.argmax(), image.shape) == (0, 0)
    # The weighting: phi = effort + lam * preference + nu * coverage.
    Y = jnp.asarray(np.random.default_rng(0).normal(size=(1, problem.dim)))
    phi = mp.fleet_objective(problem, 0.5, 2.0)(Y)
    parts = (mp.effort(Y, problem), mp.preference(Y, problem), mp.coverage(Y, problem))
    assert_close(phi, parts[0] + 0.5 * parts[1] + 2.0 * parts[2], 1e-12)


def test_small_run(tmp_path):
    """Train for a few steps through the CLI (float64), then score and plot."""
    out = tmp_path / "runs"
    common = ["--vehicles", "2", "--horizon", "10", "--h", "0.5", "--epochs", "1"]
    common += ["--n-train", "64", "--n-test", "8", "--batch-size", "16"]
    common += ["--width", "32", "--float64", "--out", str(out)]
    result = main(["train", "--lam", "1", "--nu", "1", *common])
    run = result["out"]
    assert run == str(out / "n2_T10_lam1_nu1")
    summary = json.loads((out / "n2_T10_lam1_nu1" / "metrics.json").read_text())
    assert summary["train"]["steps"] == 4 and summary["train"]["skipped_steps"] == 0
    assert np.isfinite([h[2] for h in summary["history"]]).all()

    # Every output satisfies the dynamics, boxes, jerk and boundary conditions,
    # checked from the definitions, not by the projector.
    Y, S, G = result["Y"], result["starts"], result["goals"]
    assert Y.dtype == np.float64 and Y.shape == (8, 2, TINY.dim)
    viol = mp.violations(Y, S, G, TINY)
    for key in ("dynamics", "boundary", "box", "jerk"):
        assert viol[key].max() <= 1e-5, (key, viol[key].max())
    assert summary["test"]["cv_cv_max"] == pytest.approx(viol["cv"].max())
    # The saved model (a `pe.save` file) reproduces the trajectories bit for bit,
    # in this process and in a fresh one.
    model, header = load_planner(f"{run}/model.eqx")
    assert header["problem"]["horizon"] == 10 and "map" not in header
    Y2 = mp.predict(model, mp.context_features(S, G, TINY), S, G)
    assert np.asarray(Y2).tobytes() == np.asarray(Y).tobytes()
    _assert_reloads_bit_identically(run, tmp_path)
    _assert_bad_files_are_clear_errors(run, tmp_path)

    base = main(["baseline", "--run", run])
    assert base["qp_cv_max"] <= 1e-7 and np.isfinite(base["rs_mean"])
    assert base["rs_signed_mean"] >= -1e-9  # a feasible plan cannot beat the optimum

    written = main(["figures", "--runs", run, "--out", str(tmp_path / "fig")])
    assert len(written) == 3
    for path in written:
        data = open(path, "rb").read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def _assert_reloads_bit_identically(run, tmp_path):
    """A fresh process loads a fleet planner's `run/model.eqx` and predicts the
    test contexts: the trajectories are those `run/test.npz` recorded, bit for
    bit."""
    script = textwrap.dedent(
        f"""
        import jax
        jax.config.update("jax_enable_x64", True)
        import numpy as np
        from examples import motion_planning as mp
        from examples.motion_planning._cli import load_planner

        model, header = load_planner({str(run)!r} + "/model.eqx")
        problem = mp.Problem(**header["problem"])
        data = np.load({str(run)!r} + "/test.npz")
        S, G = jax.numpy.asarray(data["starts"]), jax.numpy.asarray(data["goals"])
        Y = mp.predict(model, mp.context_features(S, G, problem), S, G)
        np.save({str(tmp_path / "fresh.npy")!r}, Y)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=pathlib.Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, proc.stderr
    fresh = np.load(tmp_path / "fresh.npy")
    recorded = np.load(pathlib.Path(run, "test.npz"))["Y"]
    assert fresh.dtype == recorded.dtype and fresh.tobytes() == recorded.tobytes()


def _assert_bad_files_are_clear_errors(run, tmp_path):
    """A header that describes another planner, a truncated or padded file, or
    the other precision: `load_planner` says so (`pe.load`'s errors)."""
    data = pathlib.Path(run, "model.eqx").read_bytes()
    head, rest = data.split(b"\n", 1)
    wide = json.loads(head)
    wide["hyperparameters"]["mlp"]["width"] += 1
    bad = {
        "wide.eqx": (json.dumps(wide).encode() + b"\n" + rest, "in the skeleton"),
        "short.eqx": (data[: len(data) // 2], "the file holds fewer arrays"),
        "long.eqx": (data + b"\0" * 8, r"the file holds more than \d+ arrays"),
    }
    for name, (content, message) in bad.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(ValueError, match="does not match the saved one") as e:
            load_planner(path)
        assert e.match(message), name
    with jax.enable_x64(False), pytest.raises(ValueError, match="x64', True"):
        load_planner(pathlib.Path(run, "model.eqx"))


def test_command_line_from_repo_root():
    """`python -m examples.motion_planning` resolves from the repository root."""
    proc = subprocess.run(
        [sys.executable, "-m", "examples.motion_planning", "train", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=pathlib.Path(__file__).resolve().parents[1],
    )
    assert "--vehicles" in proc.stdout and "--lam" in proc.stdout


# ------------------------------------------------------- contextual coverage


def test_map_value_is_bilinear_interpolation():
    """`map_value` against SciPy's grid interpolator on the same nodes."""
    from scipy.interpolate import RegularGridInterpolator

    from examples.motion_planning._context_map import gaussian_map, map_value

    rng = np.random.default_rng(0)
    m = rng.uniform(size=(17, 17))  # not smooth, so any slip shows
    grid = np.linspace(-5.0, 5.0, 17)
    # SciPy indexes (x, y) as (axis 0, axis 1); the map's rows run along y.
    truth = RegularGridInterpolator((grid, grid), m.T, method="linear")
    p = rng.uniform(-5.0, 5.0, size=(200, 2))
    p[:4] = [[-5.0, -5.0], [5.0, 5.0], [-5.0, 5.0], [5.0, -5.0]]  # the corners
    assert_close(map_value(jnp.asarray(m), jnp.asarray(p)), truth(p), 1e-12)
    # The Gaussian peaks at its centre (a node for res = 65) with value 1.
    g = gaussian_map(np.array([2.5, -2.5]), 65)
    assert g.shape == (65, 65) and g.max() == pytest.approx(1.0)
    assert float(map_value(jnp.asarray(g), jnp.array([2.5, -2.5]))) == (
        pytest.approx(1.0, abs=1e-6)
    )
    assert float(map_value(jnp.asarray(g), jnp.array([-2.5, 2.5]))) < 0.2


def test_per_axis_projection_equals_joint():
    """The projection splits over the coordinates: per axis equals joint."""
    problem = mp.Problem(n_vehicles=3, horizon=10, h=0.5)
    S, G = mp.sample_contexts(np.random.default_rng(0), 2, problem)
    rng = np.random.default_rng(1)
    Y_raw = 2.0 * rng.normal(size=(2, 3, problem.dim))
    settings = {"n_iter": 3000, "sigma": 0.05}
    Ys = []
    for per_axis in (False, True):
        model = mp.make_planner(
            problem, key=jax.random.key(0), per_axis=per_axis, **settings
        )
        assert model.projector.dim == (problem.axis_dim if per_axis else problem.dim)
        Ys.append(np.asarray(jax.vmap(model.project)(Y_raw, S, G)))
    assert_close(Ys[1], Ys[0], 1e-10, what="per axis vs joint")
    assert mp.violations(Ys[1], S, G, problem)["cv"].max() <= 1e-10
    with pytest.raises(ValueError, match="per_axis=True"):
        mp.FleetPlanner(model.backbone, mp.make_projector(problem), problem, True)


def test_map_backbone_rejects_bad_resolution():
    from examples.motion_planning._context_map import make_map_backbone

    with pytest.raises(ValueError, match="multiple of D\\*\\*3 = 8"):
        make_map_backbone(TINY, 60, 2, key=jax.random.key(0))


def test_context_end_to_end(tmp_path):
    """A 64 x 64 map, H = 20: train briefly, then every output is feasible in
    float64, the figure renders, and the saved model reproduces the outputs."""
    out = tmp_path / "runs"
    args = ["context", "--horizon", "20", "--h", "0.5", "--res", "64"]
    args += ["--downsample", "2", "--epochs", "2", "--n-train", "64"]
    args += ["--n-test", "16", "--batch-size", "16", "--width", "32", "--float64"]
    args += ["--out", str(out), "--figures", str(tmp_path / "fig")]
    result = main(args)
    summary, Y = result["summary"], result["Y"]
    assert summary["train"]["steps"] == 8 and summary["train"]["skipped_steps"] == 0
    data = np.load(pathlib.Path(result["out"]) / "test.npz")
    problem = mp.Problem(n_vehicles=1, horizon=20, h=0.5)
    assert Y.dtype == np.float64 and Y.shape == (16, 1, problem.dim)
    viol = mp.violations(Y, data["starts"], data["goals"], problem)
    for key in ("dynamics", "boundary", "box", "jerk"):
        assert viol[key].max() <= 1e-5, (key, viol[key].max())
    test = summary["test"]
    assert test["cv_cv_max"] == pytest.approx(viol["cv"].max())
    assert 0.0 < test["map_value_mean"] <= 1.0
    assert np.allclose(np.sum(test["cnn_softmax_per_map"], axis=1), 1.0)
    png = open(summary["figure"], "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    model, header = load_planner(f"{result['out']}/model.eqx")
    assert header["map"]["res"] == 64 and model.per_axis
    from examples.motion_planning._context_map import make_map_table, map_inputs

    S, G = jnp.asarray(data["starts"]), jnp.asarray(data["goals"])
    X = map_inputs(data["map_ids"], S, G, problem)
    Y2 = mp.predict(model, X, S, G, lookup=make_map_table(64, problem))
    assert np.asarray(Y2).tobytes() == np.asarray(Y).tobytes()


def test_construction_reports_both_forms(tmp_path):
    rows = main(
        [
            "construction",
            "--horizons",
            "10",
            "--h",
            "0.5",
            "--out",
            str(tmp_path / "c.json"),
        ]
    )
    per_axis, joint = rows
    assert per_axis["variables"] == 32 and joint["variables"] == 64  # 3T+2, 6T+4
    assert joint["lifted_matrix"] == [2 * x for x in per_axis["lifted_matrix"]]
    assert json.loads((tmp_path / "c.json").read_text())["rows"] == rows
