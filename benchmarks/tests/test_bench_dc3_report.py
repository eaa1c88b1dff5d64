"""Tests of the DC3 benchmark report: figures and tables from a results folder."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from benchmarks._common import harness as _harness, report as _report
from benchmarks._common.metrics import CV_OPTIMAL, RS_OPTIMAL, Metrics
from benchmarks.dc3._methods import SUITE

DATASETS = {
    "convex-tiny": {
        "problem": "convex",
        "size": "tiny",
        "n_var": 20,
        "n_eq": 10,
        "n_ineq": 10,
    },
    "nonconvex-small": {
        "problem": "nonconvex",
        "size": "small",
        "n_var": 100,
        "n_eq": 50,
        "n_ineq": 50,
    },
}
LABELS = ("pinet", "dc3", "solver")
SEEDS = (0, 1)
N_TEST = 40
EXTRAPOLATED_FROM = 64


def _timing_stats(rng, scale: float, repeats: int) -> dict:
    """Plausible `time_calls` output around `scale` seconds."""
    t = np.sort(scale * rng.lognormal(0.0, 0.2, size=repeats))
    lq, median, uq = np.percentile(t, [25, 50, 75])
    return {
        "median": float(median),
        "lq": float(lq),
        "uq": float(uq),
        "min": float(t[0]),
        "max": float(t[-1]),
        "repeats": repeats,
    }


def _fabricate_run(root: pathlib.Path, dataset: str, label: str, seed: int, rng):
    """Write one plausible run with `_harness.write_results`; return its record."""
    if label == "solver":  # exact up to solver tolerance, slow inference
        rs = rng.uniform(0, 1e-7, N_TEST)
        cv = rng.uniform(0, 1e-9, N_TEST)
    else:
        rs = rng.lognormal(np.log(1e-2 if label == "pinet" else 3e-2), 1.0, N_TEST)
        cv = rng.lognormal(np.log(1e-7 if label == "pinet" else 1e-3), 1.0, N_TEST)
    rs[0] = 0.0  # RS is clipped at 0 and CV can be exactly 0: log axes must cope
    cv[1] = 0.0
    metrics = Metrics(rs, cv, {"eq": cv, "ineq": cv / 2}).summary()
    curve = []
    if label != "solver":
        # Seeds cover different time spans, so averaging needs a common grid.
        times = np.geomspace(0.3 + 0.2 * seed, 40 + 15 * seed, 12)
        cv_scale = 1e-5 if label == "pinet" else 1e-2
        for epoch, t in enumerate(times):
            curve.append(
                {
                    "time_s": float(t),
                    "epoch": epoch,
                    "step": 10 * epoch,
                    "rs_mean": float(0.5 / (1 + t) * rng.uniform(0.8, 1.2)),
                    "rs_median": float(0.4 / (1 + t)),
                    "cv_max": float(cv_scale / (1 + t) ** 2),
                    "cv_mean": float(cv_scale / 10 / (1 + t)),
                }
            )
    single_scale = 1e-2 if label == "solver" else 2e-4
    inference = {
        "single": _timing_stats(rng, single_scale, 100),
        "batch": _timing_stats(rng, 1024 * single_scale / 20, 20),
        "batch_size": 1024,
    }
    if label == "solver":
        inference["batch_extrapolated_from"] = EXTRAPOLATED_FROM
    train_s = {"pinet": 12.3 + 0.2 * seed, "dc3": 250.0 + 10 * seed, "solver": 0.0}
    record = {
        "method": label,
        "label": label,
        "dataset": {"name": dataset, **DATASETS[dataset], "source": {"seed": 17}},
        "seed": seed,
        "precision": 32,
        "config": {"epochs": 3},
        "info": {},
        "metrics": metrics,
        "timing": {
            "train_s": train_s[label],
            "total_s": train_s[label] + 5.0,
            "inference": inference,
        },
        "curve": curve,
        "machine": {
            "cpu": "Test CPU 9000",
            "cpu_count": 2,
            "platform": "Linux",
            "python": "3.11",
            "jax": "0.4.99",
            "jax_backend": "cpu",
            "git": "abc1234",
            "date": "2025-01-01T00:00:00+00:00",
        },
        "command": f"python -m benchmarks.dc3 train {label} {dataset} --seed {seed}",
    }
    _harness.write_results(root / dataset / label / f"seed{seed}", record, rs, cv)
    return record


def _fabricate(
    root: pathlib.Path, datasets=tuple(DATASETS), labels=LABELS, seeds=SEEDS
) -> dict:
    """A results folder; returns the records by (dataset, label, seed)."""
    rng = np.random.default_rng(0)
    return {
        (d, label, s): _fabricate_run(root, d, label, s, rng)
        for d in datasets
        for label in labels
        for s in seeds
    }


def _assert_png(path: pathlib.Path) -> None:
    import matplotlib.image

    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 300
    assert image.std() > 0  # something was drawn


def test_report_writes_figures_and_tables(tmp_path):
    records = _fabricate(tmp_path / "results")
    out = tmp_path / "report"
    written = _report.report(tmp_path / "results", out, SUITE)

    expected = {out / "tables.md"}
    for dataset in DATASETS:
        expected |= {out / f"scatter_{dataset}.png", out / f"curves_{dataset}.png"}
    assert set(written) == expected
    for path in written:
        assert path.exists() and path.stat().st_size > 0
        if path.suffix == ".png":
            _assert_png(path)

    text = (out / "tables.md").read_text()
    for dataset in DATASETS:
        assert f"## {dataset}" in text
        for label in LABELS:
            runs = [records[dataset, label, s] for s in SEEDS]
            assert f"`{label}`" in text
            # mean ± std over seeds of each accuracy column
            for key in ("rs_mean", "cv_max", "optimal_pct"):
                values = [r["metrics"][key] for r in runs]
                stat = f"{_report._fmt(np.mean(values))} ± "
                stat += _report._fmt(np.std(values))
                assert stat in text, (dataset, label, key, stat)
            # the inference table: the lowest seed's medians
            timing = runs[0]["timing"]["inference"]
            assert _report._fmt(timing["single"]["median"]) in text
            assert _report._fmt(timing["batch"]["median"]) in text
            for s in SEEDS:
                assert records[dataset, label, s]["command"] in text
    assert "12.4 ± 0.100" in text  # pinet's training time, 12.3 s and 12.5 s
    assert "Batch (1024) median [s]" in text
    assert f"extrapolated from a batch of {EXTRAPOLATED_FROM}" in text
    assert "Test CPU 9000, 2 CPUs, JAX 0.4.99, backend cpu" in text
    assert "float32" in text


def test_report_defaults_to_results_dir_and_one_seed(tmp_path):
    _fabricate(tmp_path, datasets=("convex-tiny",), labels=("pinet",), seeds=(3,))
    written = _report.report(tmp_path, None, SUITE)
    assert {p.name for p in written} == {
        "scatter_convex-tiny.png",
        "curves_convex-tiny.png",
        "tables.md",
    }
    assert all(p.parent == tmp_path for p in written)
    text = (tmp_path / "tables.md").read_text()
    assert "±" not in text.split("### Accuracy")[1].split("###")[0]


def test_report_skips_broken_runs(tmp_path):
    records = _fabricate(tmp_path, datasets=("convex-tiny",), labels=("pinet",))
    # a truncated results.json, a run without per_instance.csv, a truncated CSV
    broken = tmp_path / "convex-tiny" / "dc3" / "seed0"
    broken.mkdir(parents=True)
    (broken / "results.json").write_text('{"method": "dc3", "metrics": {"rs_')
    _harness.write_results(
        tmp_path / "convex-tiny" / "soft" / "seed0",
        {**records["convex-tiny", "pinet", 0], "label": "soft", "method": "soft"},
        np.zeros(3),
        np.zeros(3),
    )
    (tmp_path / "convex-tiny" / "soft" / "seed0" / "per_instance.csv").unlink()
    csv_cut = tmp_path / "convex-tiny" / "jaxopt" / "seed0"
    _harness.write_results(
        csv_cut,
        {**records["convex-tiny", "pinet", 0], "label": "jaxopt", "method": "jaxopt"},
        np.zeros(3),
        np.zeros(3),
    )
    (csv_cut / "per_instance.csv").write_text("index,rs,cv\n0,1.0")
    # a copy of a run nested deeper must not count as another seed
    copy = tmp_path / "backup" / "convex-tiny" / "pinet" / "seed0"
    copy.mkdir(parents=True)
    for name in ("results.json", "per_instance.csv"):
        source = tmp_path / "convex-tiny" / "pinet" / "seed0" / name
        (copy / name).write_bytes(source.read_bytes())

    # load_runs is what report() reads with; calling it alone skips the drawing
    with pytest.warns(UserWarning, match="Skipping") as caught:
        runs = _report.load_runs(tmp_path, SUITE.prog)
    messages = " ".join(str(w.message) for w in caught)
    assert "dc3" in messages and "per_instance.csv" in messages
    assert "jaxopt" in messages and "same data set" in messages
    assert sorted((r.label, r.seed) for r in runs) == [("pinet", 0), ("pinet", 1)]
    assert all("backup" not in str(r.path) for r in runs)
    text = _report.markdown(_report._group(runs, SUITE.methods), tmp_path, SUITE)
    assert "`pinet`" in text
    assert "`dc3`" not in text and "`soft`" not in text and "`jaxopt`" not in text


def test_report_empty_or_unreadable_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="empty-results"):
        _report.report(tmp_path / "empty-results", None, SUITE)  # does not exist
    (tmp_path / "empty-results").mkdir()
    with pytest.raises(FileNotFoundError, match="empty-results"):
        _report.report(tmp_path / "empty-results", None, SUITE)
    bad = tmp_path / "empty-results" / "x" / "y" / "seed0"
    bad.mkdir(parents=True)
    (bad / "results.json").write_text(json.dumps({"metrics": {}}))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="empty-results"):
        _report.report(tmp_path / "empty-results", None, SUITE)


@pytest.mark.parametrize(
    "x, text",
    [
        (0, "0"),
        (0.0123456, "0.0123"),
        (0.05, "0.0500"),
        (1.5e-5, "1.50e-5"),
        (-2.5e-7, "-2.50e-7"),
        (9.996, "10.0"),
        (12.345, "12.3"),
        (99.7, "99.7"),
        (100.0, "100"),
        (1234.5, "1234"),
        (2.5e6, "2.50e6"),
        (float("nan"), "nan"),
        (None, "–"),
    ],
)
def test_fmt(x, text):
    assert _report._fmt(x) == text


def test_thresholds_match_harness():
    assert _report.CV_OPTIMAL == CV_OPTIMAL
    assert _report.RS_OPTIMAL == RS_OPTIMAL


def test_seed_band_uses_the_common_time_span():
    t0, t1 = np.array([1.0, 10.0, 100.0]), np.array([2.0, 20.0, 50.0])
    y0, y1 = 1 / t0, 4 / t1
    grid, mean, std = _report._seed_band([(t0, y0), (t1, y1)])
    assert grid[0] == pytest.approx(2.0) and grid[-1] == pytest.approx(50.0)
    # log-log interpolation of a power law is exact: log10(y) = log10(c) - log10(t)
    expected = np.log10(np.sqrt(4.0)) - np.log10(grid)
    np.testing.assert_allclose(mean, expected, atol=1e-12)
    np.testing.assert_allclose(std, np.log10(2.0), atol=1e-12)
    assert _report._seed_band([(t0[:1], y0[:1]), (t1[1:], y1[1:])]) is None
