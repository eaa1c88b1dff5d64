"""End-to-end check of the DC3 benchmark suite on the tiny problem.

Every method that installs with the `test` extras trains for two epochs (the
reference only where `pinet-hcnn` is installed: it cannot be a pip extra, see
`benchmarks/_common/reference.py`), then the report renders. The heavy paper-scale runs
are benchmarks (`python -m benchmarks.dc3`), not tests.
"""

import json

import numpy as np
import pytest
from helpers import needs_reference

from benchmarks._common.provenance import machine
from benchmarks._common.report import report
from benchmarks._common.timing import TIMING_STATS
from benchmarks.dc3 import _data, _methods
from benchmarks.dc3._train import train

EPOCHS = {"epochs": 2, "validate_every": 1}
METHODS = [
    ("pinet", EPOCHS),
    ("soft", EPOCHS),
    ("dc3", EPOCHS),
    ("jaxopt", EPOCHS),
    ("cvxpylayers", {"epochs": 1, "validate_every": 1}),
    ("solver", {}),
    pytest.param(
        "reference",
        EPOCHS,
        marks=needs_reference,
    ),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("dc3_cache")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("dc3_results")


@pytest.fixture(scope="module")
def instances(tmp_path_factory, cache):
    """The tiny problem's validation and test sets written in the DC3 file layout
    (keys Q p A G h X Ystar), as the paper's files are."""
    folder = tmp_path_factory.mktemp("instances")
    data = _data.load("convex", "tiny", cache_dir=cache, verbose=False)
    P = data.problem
    for label, X, Y in (
        ("valid", data.X_valid, data.Y_valid),
        ("test", data.X_test, data.Y_test),
    ):
        np.savez(
            folder / f"dc3_random_simple_dataset_var20_ineq10_eq10_ex600{label}.npz",
            Q=P.Q[None],
            p=P.p[None, :, None],
            A=P.A[None],
            G=P.G[None],
            h=P.h[None, :, None],
            X=X[..., None],
            Ystar=Y[..., None],
        )
    return folder


def _train(problem, method, overrides, results, cache, instances=None):
    """`train` on the tiny problem, quietly, into `results`."""
    return train(
        problem,
        "tiny",
        method,
        overrides=overrides,
        out=results,
        repeats=2,
        quiet=True,
        cache_dir=cache,
        instances=instances,
    )


@pytest.mark.parametrize("method, overrides", METHODS)
def test_method_end_to_end(method, overrides, results, cache, instances):
    record, folder, _ = _train(
        "convex",
        method,
        overrides,
        results,
        cache,
        instances=instances if method == "pinet" else None,
    )
    saved = json.loads((folder / "results.json").read_text())
    assert saved["config"] == record["config"]
    assert set(_data.METRICS) <= set(saved["metrics"])
    assert all(np.isfinite(v) for v in saved["metrics"].values())
    inference = saved["timing"]["inference"]
    for kind in ("single", "batch"):
        assert set(TIMING_STATS) <= set(inference[kind])
        stats = inference[kind]
        assert 0 < stats["min"] <= stats["lq"] <= stats["median"] <= stats["uq"]
        assert stats["uq"] <= stats["max"]
    assert saved["timing"]["train_s"] > 0
    assert saved["machine"]["jax"] and saved["command"].startswith("python -m")
    if method != "solver":
        assert len(saved["curve"]) == overrides["epochs"]
        times = [point["time_s"] for point in saved["curve"]]
        assert times == sorted(times) and times[0] > 0
    table = np.loadtxt(folder / "per_instance.csv", delimiter=",", skiprows=1)
    assert table.shape == (100, 3)
    np.testing.assert_allclose(table[:, 2].max(), saved["metrics"]["cv_max"], rtol=1e-5)
    if method in ("pinet", "soft"):
        # Feasible by construction: our projection.
        assert saved["metrics"]["cv_max"] <= 1e-5
    if method == "solver":
        # OSQP at its benchmark tolerance (eps 1e-5), well within "optimal".
        assert saved["metrics"]["cv_max"] <= 1e-3
        assert saved["metrics"]["rs_max"] <= 1e-3
    if method == "pinet":
        # The instance files hold the same test contexts: the same metrics.
        paper = saved["metrics_paper_instances"]
        for key, value in saved["metrics"].items():
            np.testing.assert_allclose(paper[key], value, rtol=1e-9, atol=1e-12)


def test_nonconvex_pinet_feasible(results, cache):
    # The non-convex optima come from IPOPT (casadi), independently of us.
    record, _, _ = _train("nonconvex", "pinet", EPOCHS, results, cache)
    assert record["metrics"]["cv_max"] <= 1e-5
    assert 0 <= record["metrics"]["rs_mean"] < 1


# The runs the report is checked on: (problem, method, overrides).
REPORTED = [
    ("convex", "pinet", EPOCHS),
    ("convex", "dc3", EPOCHS),
    ("convex", "jaxopt", EPOCHS),
    ("convex", "solver", {}),
    ("nonconvex", "pinet", EPOCHS),
]


def test_report_renders(results, cache):
    # pytest keeps file order, so in one process the trainings above have made
    # these runs. Under pytest-xdist they may have run in another worker (each
    # has its own `results`); the missing ones are then made here.
    for problem, method, overrides in REPORTED:
        if not (results / f"{problem}-tiny" / method).is_dir():
            _train(problem, method, overrides, results, cache)
    written = report(results, None, _methods.SUITE)
    pngs = [p for p in written if p.suffix == ".png"]
    assert {p.name for p in pngs} >= {
        "scatter_convex-tiny.png",
        "curves_convex-tiny.png",
        "scatter_nonconvex-tiny.png",
        "curves_nonconvex-tiny.png",
    }
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tables = (results / "tables.md").read_text()
    for method in ("pinet", "dc3", "jaxopt", "solver"):
        assert f"`{method}`" in tables


def test_unknown_hyperparameter_is_an_error(results, cache):
    with pytest.raises(ValueError, match="no hyperparameter"):
        train(
            "convex",
            "tiny",
            "pinet",
            overrides={"n_iters": 3},
            out=results,
            quiet=True,
            cache_dir=cache,
        )


def test_methods_registry_is_complete():
    for name in _methods.METHODS:
        module = _methods.get(name)
        assert callable(module.default_config) and callable(module.fit)


def test_mechanisms_ablation(cache):
    """The `mechanisms` study trains one network at the library defaults and
    evaluates it with each default inference mechanism off in turn: the rows
    say what each costs in violation, suboptimality and iterations."""
    import argparse

    from benchmarks.dc3 import _ablations

    data = _data.load("nonconvex", "tiny", cache_dir=cache, verbose=False)
    args = argparse.Namespace(problem="nonconvex", size="tiny", quick=True, epochs=2)
    out = _ablations.study_mechanisms(args, data, cache / "ablations")
    rows = {r["label"]: r for r in out["rows"]}
    assert set(rows) == set(_ablations.MECHANISMS)
    defaults = rows["defaults"]
    # This process runs in float64 (conftest): the float64 target holds.
    assert defaults["cv_max"] <= 1e-9 and defaults["successful_pct"] == 100.0
    assert rows["tol_test=None, refine=False"]["n_iter_max"] == 50
    assert defaults["n_iter_max"] >= 50
    for r in rows.values():
        assert np.isfinite(r["rs_mean"]) and r["batch_s"] > 0
        # The mechanisms move the outputs by at most their violations.
        assert abs(r["rs_mean"] - defaults["rs_mean"]) <= 1e-3 * defaults["rs_mean"]
    args.precision = 64
    markdown = _ablations._markdown({"mechanisms": out}, args, machine())
    assert "| polish=False |" in markdown


def test_train_iterations_ablation(cache, monkeypatch):
    """The `train_iterations` study trains at the library defaults but for the
    training iteration count: inference still reaches its tolerance, and the
    training-mode outputs are as accurate as their iteration count allows."""
    import argparse

    from benchmarks.dc3 import _ablations

    settings = ((10, "auto"), (50, "auto"), (10, True))
    monkeypatch.setattr(_ablations, "TRAIN_SETTINGS", settings)
    data = _data.load("nonconvex", "tiny", cache_dir=cache, verbose=False)
    args = argparse.Namespace(problem="nonconvex", size="tiny", quick=True, epochs=2)
    out = _ablations.study_train_iterations(args, data, cache / "ablations")
    rows = {(r["n_iter"], r["polish"]): r for r in out["rows"]}
    assert set(rows) == set(settings)
    assert rows[10, "auto"]["info"]["n_iter_used"] == 10
    assert rows[50, "auto"]["info"]["n_iter_used"] == 50
    for r in rows.values():
        # This process runs in float64 (conftest): inference's target holds.
        assert r["cv_max"] <= 1e-9 and np.isfinite(r["rs_mean"]) and r["train_s"] > 0
    assert rows[10, "auto"]["train_cv"] > rows[50, "auto"]["train_cv"]
    # The polish makes the training-mode outputs exact where it certifies them.
    polished, plain = rows[10, True], rows[10, "auto"]
    assert polished["train_successful_pct"] > plain["train_successful_pct"]
    assert polished["train_cv_median"] < plain["train_cv_median"]
    args.precision = 64
    markdown = _ablations._markdown({"train_iterations": out}, args, machine())
    assert "## Training iterations" in markdown and "| 10 |" in markdown
