"""End-to-end check of the second-order-cone benchmark (paper App. B.4) on the
small size: a few epochs of ours, a couple of cvxpylayers steps, both solver
baselines on a few instances, the report, and independent checks of the data
generator and of our projection's sign. The full runs are benchmarks
(`python -m benchmarks.soc`), not tests."""

import json

import jax
import numpy as np
import pytest

import pinet_eqx as pe
from benchmarks._common.problems import soc_projector
from benchmarks._common.report import report
from benchmarks._common.timing import TIMING_STATS
from benchmarks.projection._families import soc_truth
from benchmarks.soc import _data, _methods
from benchmarks.soc._train import train

FEW = {"test_rows": 16, "timing_batch_rows": 8, "timing_repeats": 1}
METHODS = [
    # The default tol path, with a tighter tol and smaller caps for float64.
    (
        "pinet",
        {
            "epochs": 3,
            "validate_every": 1,
            "n_valid": 128,
            "tol": 1e-6,
            "n_iter": 500,
            "n_iter_test": 500,
        },
    ),
    (
        "cvxpylayers",
        {"epochs": 2, "batch_size": 8, "validate_every": 1, "n_valid": 8, **FEW},
    ),
    ("cvxpy", FEW),
    ("scs", FEW),
]


@pytest.fixture(scope="module")
def data():
    return _data.load("small")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("soc_results")


def _train(method, overrides, results):
    return train(
        "small", method, overrides=overrides, out=results, repeats=2, quiet=True
    )


@pytest.mark.parametrize("method, overrides", METHODS)
def test_method_end_to_end(method, overrides, results):
    record, folder, _ = _train(method, overrides, results)
    saved = json.loads((folder / "results.json").read_text())
    assert saved["config"] == record["config"]
    metrics = saved["metrics"]
    assert set(_data.METRICS) <= set(metrics)
    assert all(np.isfinite(v) for v in metrics.values())
    inference = saved["timing"]["inference"]
    assert inference["batch_size"] == 1024
    for kind in ("single", "batch"):
        stats = inference[kind]
        assert set(TIMING_STATS) <= set(stats)
        assert 0 < stats["min"] <= stats["lq"] <= stats["median"] <= stats["uq"]
        assert stats["uq"] <= stats["max"]
    assert len(saved["machine"]["load_avg"]) == 3
    assert saved["command"].startswith("python -m benchmarks.soc")
    n_test = overrides.get("test_rows") or 1024
    table = np.loadtxt(folder / "per_instance.csv", delimiter=",", skiprows=1)
    assert table.shape == (n_test, 3) == (metrics["test_rows"], 3)
    np.testing.assert_allclose(table[:, 2].max(), metrics["cv_max"], rtol=1e-5)
    if method in ("pinet", "cvxpylayers"):
        assert len(saved["curve"]) == overrides["epochs"]
        times = [point["time_s"] for point in saved["curve"]]
        assert times == sorted(times) and times[0] > 0
        # Feasible by construction (ours: Douglas-Rachford; cvxpylayers: Clarabel).
        assert metrics["cv_max"] <= 1e-5
    else:
        assert "batch_extrapolated_from" in inference
        # SCS at eps 1e-5 against the generator's optimum c^T y1*.
        assert metrics["cv_max"] <= 1e-4
        assert metrics["rs_mean"] <= 1e-3
        assert abs(metrics["rs_signed_mean"]) <= 1e-3


def test_report_renders(results):
    # pytest keeps file order, so in one process the trainings above have made
    # these runs. Under pytest-xdist they may have run in another worker (each
    # has its own `results`); the missing ones are then made here.
    for method, overrides in METHODS:
        if not list(results.glob(f"*/{method}/*/results.json")):
            _train(method, overrides, results)
    written = report(results, None, _methods.SUITE)
    pngs = [p for p in written if p.suffix == ".png"]
    assert {p.name for p in pngs} == {"scatter_soc-small.png", "curves_soc-small.png"}
    for png in pngs:
        assert png.stat().st_size > 10_000
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tables = (results / "tables.md").read_text()
    assert tables.startswith("# Second-order-cone benchmark")
    for method in _methods.METHODS:
        assert f"`{method}`" in tables


def test_generated_optimum_matches_clarabel(data):
    """The generator's optimal value c^T y1* is what Clarabel finds."""
    import cvxpy as cp

    d1, d2 = data.d1, data.d2
    for i in range(4):
        b, c = data.split(data.X_test[i])
        y1, y2 = cp.Variable(d1), cp.Variable(d2)
        problem = cp.Problem(
            cp.Minimize(c @ y1), [data.A @ y1 + y2 == b, cp.SOC(y2[-1], y2[:-1])]
        )
        value = problem.solve(solver=cp.CLARABEL)
        assert problem.status == "optimal"
        np.testing.assert_allclose(value, data.J_test[i], rtol=1e-6, atol=1e-8)
    # And the stored optimum is feasible and attains it.
    assert data.violation(data.Y_test, data.X_test).max() <= 1e-12
    np.testing.assert_allclose(
        data.objective(data.Y_test, data.X_test), data.J_test, rtol=1e-12
    )


def test_projection_sign_against_clarabel(data):
    """Ours projects y_raw, not -y_raw (the reference's stand-alone SOC script's
    sign slip): compared with cvxpy + Clarabel (Newton-polished), float64."""
    rng = np.random.default_rng(3)
    proj = soc_projector(data.E, data.d1, n_iter=1000)
    project = jax.jit(lambda y, b: proj(y, b=b))
    for i in range(3):
        y_raw = 3.0 * rng.normal(size=data.d1 + data.d2)
        b = data.split(data.X_test[i])[0]
        ours = np.asarray(project(y_raw, b))
        truth, kkt, _ = soc_truth(data.E, b, y_raw, data.d1)
        flipped, _, _ = soc_truth(data.E, b, -y_raw, data.d1)
        assert kkt <= 1e-9
        np.testing.assert_allclose(ours, truth, atol=1e-6)
        assert np.abs(ours - flipped).max() > 0.1


def test_residual_loss_against_clarabel(data):
    # The residual term of our loss, mu (||y_raw - y|| - m)_+^2, against the same
    # term with y from cvxpy + Clarabel's projection of y_raw.
    margin = 0.5
    from benchmarks._common.training import backbone
    from benchmarks.soc import _pinet

    d1, d2 = data.d1, data.d2
    config = _pinet.default_config(data).replace(
        sigma="auto", tol=1e-10, n_iter=5000, n_iter_test=5000
    )
    net = pe.HardConstrainedNet(
        backbone(d1 + d2, d1 + d2, 0, np.float64), _pinet.make_projector(data, config)
    )
    X = jax.numpy.asarray(data.X_valid[:4])
    mu = 0.3
    with_residual = config.replace(residual_weight=mu, residual_margin=margin)
    added = _pinet.make_loss(with_residual, d1, d2)(net, X) - _pinet.make_loss(
        config, d1, d2
    )(net, X)
    expected = []
    for x in np.asarray(X):
        y_raw = np.asarray(net.raw(jax.numpy.asarray(x)))
        y = soc_truth(data.E, x[:d2], y_raw, d1)[0]
        expected.append(max(np.linalg.norm(y_raw - y) - margin, 0.0) ** 2)
    assert min(expected) > 0
    np.testing.assert_allclose(added, mu * np.mean(expected), rtol=1e-6)
