"""The DC-OPF benchmark suite runs end to end (slow tier: it needs the `bench`
extra) on the stored case118 fixture, with tiny sizes."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from benchmarks.dcopf import _projection, _report, _train
from benchmarks.dcopf._fixture import load_saved

CASE = pathlib.Path(__file__).parent / "data" / "dcopf_case118.npz"


def test_projection_record_and_report(tmp_path):
    jax.config.update("jax_enable_x64", True)
    case = load_saved(CASE)
    record = _projection.run(
        case,
        "float64",
        n_accuracy=2,
        batch=4,
        n_solver=2,
        repeats=1,
        affine_form="sparse",
    )
    assert record["affine_form"] == "SparseProjection"
    for side in ("near", "far"):
        assert record[side]["successful"] == 1.0
        assert record[side]["violation_max"] < 1e-8
        assert record[side]["rel_err_max"] < 1e-5
    assert record["batch_successful"] == 1.0
    assert record["per_instance_ms"] > 0 and record["clarabel_ms"]["median"] > 0
    out = tmp_path / "projection"
    out.mkdir()
    (out / "case118-float64.json").write_text(json.dumps(record))
    md, png = _report.report(tmp_path)
    assert "case118" in md.read_text() and png.stat().st_size > 0


def test_train_record_and_figure(tmp_path):
    case = load_saved(CASE)
    record = _train.train(case, steps=3, batch=4, n_test=2)
    assert record["steps"] == 3 and np.isfinite(record["loss_last"])
    assert record["test_successful"] == 1.0
    assert record["normalised_residual_over_eps32_max"] <= 10
    assert len(record["gaps"]) == len(record["normalised_residuals_over_eps32"]) == 2
    out = tmp_path / "train"
    out.mkdir()
    (out / "case118.json").write_text(json.dumps(record))
    paths = _report.report(tmp_path)
    assert paths[-1].name == "dcopf_training.png" and paths[-1].stat().st_size > 0


def test_baseline_records():
    """cvxpylayers is accurate to its solver's tolerance; the reference's
    record is complete (its accuracy is what the benchmark reports)."""
    from benchmarks._common.reference import reference_available
    from benchmarks.dcopf import _baselines

    jax.config.update("jax_enable_x64", True)
    case = load_saved(CASE)
    layers = ["cvxpylayers"] + (["reference"] if reference_available() else [])
    for layer in layers:
        record = _baselines.run(case, layer, batch=2, repeats=1)
        assert record["step_s"]["median"] > 0
        assert record["train_300_steps_s_estimate"] > 0
        assert np.isfinite(record["rel_err_max"])
        if layer == "cvxpylayers":
            assert record["rel_err_max"] < 1e-3 and record["violation_max"] < 1e-3
