"""The DC-OPF benchmark suite runs end to end (slow tier: it needs the `bench`
extra) on the stored case118 fixture, with tiny sizes."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest
import scipy.sparse as sp

from benchmarks.dcopf import _certify, _projection, _report, _train
from benchmarks.dcopf._fixture import load_saved

CASE = pathlib.Path(__file__).parents[2] / "tests" / "data" / "dcopf_case118.npz"


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
        # Against Clarabel's point sharpened and certified by the KKT conditions.
        assert record[side]["certified"] == 1.0
        assert record[side]["rel_err_certified_max"] < 1e-8
    assert record["batch_successful"] == 1.0
    assert record["per_instance_ms"] > 0 and record["clarabel_ms"]["median"] > 0
    far = record["far_timing"]
    assert far["successful"] == 1.0 and far["per_instance_ms"] > 0
    assert far["ratio_to_clarabel"] > 0
    out = tmp_path / "projection"
    out.mkdir()
    (out / "case118-float64.json").write_text(json.dumps(record))
    md, png = _report.report(tmp_path)
    assert "case118" in md.read_text() and png.stat().st_size > 0
    # The large grids' record, rendered from the same kind of run.
    activsg = _report.activsg_record([dict(record, case="case_ACTIVSg70k")])
    body = json.dumps(activsg["blocks"])
    assert "case_ACTIVSg70k" in body and "certified projection, near and far" in body
    assert ": met; time per instance" in body  # the accuracy target, 1e-8 here
    assert activsg["headline"][0]["ours"].endswith(" ms")


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

    jax.config.update("jax_enable_x64", True)
    case = load_saved(CASE)
    layers = ["cvxpylayers"] + (["reference"] if reference_available() else [])
    for layer in layers:
        record = _train.baseline(case, layer, batch=2, repeats=1)
        assert record["step_s"]["median"] > 0
        assert record["train_300_steps_s_estimate"] > 0
        assert np.isfinite(record["rel_err_max"])
        if layer == "cvxpylayers":
            assert record["rel_err_max"] < 1e-3 and record["violation_max"] < 1e-3


def test_face_projection_with_dependent_rows():
    """The face's projection is the least-squares one (numpy's pseudo-inverse)
    when a row repeats, where the unshifted KKT matrix is singular."""
    rng = np.random.default_rng(0)
    A = rng.normal(size=(4, 9))
    A = np.vstack([A, A[1] + 2 * A[3]])
    h = A @ rng.normal(size=9)
    y_raw = rng.normal(size=9)
    y, lam, residual = _certify.face_projection(y_raw, sp.csr_matrix(A), h)
    expected = y_raw - np.linalg.pinv(A) @ (A @ y_raw - h)
    np.testing.assert_allclose(y, expected, rtol=0, atol=1e-12)
    # The multipliers are not unique here; any with A^T lam = y_raw - y will do.
    np.testing.assert_allclose(A.T @ lam, y_raw - y, rtol=0, atol=1e-12)
    assert residual <= 1e-14


@pytest.mark.parametrize("scale", [_projection.NEAR, _projection.FAR])
def test_certificate_is_exact_or_refused(scale):
    """From Clarabel's point the certificate finds the projection (no point
    closer to the raw output is feasible, and Clarabel's is within its
    tolerance); from the centre of the set, whose active set is wrong for far
    raw outputs, it finds the same point or refuses."""
    from benchmarks.dcopf._data import project_clarabel
    from benchmarks.dcopf._fixture import sample_loads

    case = load_saved(CASE)
    rng = np.random.default_rng(1)
    p_d = sample_loads(case, 2, rng)
    centre = project_clarabel(case, np.zeros(case.dim), p_d[0])[0]
    for y_raw, loads in zip(
        _projection.raw_outputs(case, p_d, rng, scale, centre), p_d
    ):
        ref, _ = project_clarabel(case, y_raw, loads)
        exact, ok = _certify.certify_projection(case, y_raw, loads, ref)
        assert ok
        assert max(case.residuals(exact, loads)) < 1e-10
        assert np.sum((exact - y_raw) ** 2) <= np.sum((ref - y_raw) ** 2) * (1 + 1e-12)
        assert np.abs(exact - ref).max() < 1e-5 * np.abs(ref).max()
        other, ok = _certify.certify_projection(case, y_raw, loads, centre)
        assert not ok or np.abs(other - exact).max() < 1e-10 * np.abs(exact).max()


def test_save_then_throughput_from_the_file(tmp_path):
    """`save` writes a pandapower case that `throughput` (the GPU machine's
    command: no pandapower, Clarabel or OSQP there) reads and projects."""
    from benchmarks.dcopf.__main__ import main

    fixture = tmp_path / "case118.npz"
    assert main(["save", "--case", "case118", "--to", str(fixture)]) == 0
    argv = ["--out", str(tmp_path), "throughput", "--fixture", str(fixture)]
    assert main([*argv, "--dtype", "float64", "--batch", "4", "--repeats", "1"]) == 0
    record = json.loads((tmp_path / "throughput" / "case118-float64.json").read_text())
    assert record["successful"] == 1.0 and record["center_successful"]
    assert record["violation_max"] < 1e-8
    assert record["per_instance_ms"] > 0 and record["batch_s"]["repeats"] == 1


@pytest.mark.parametrize(
    "cores, pinned, command",
    [((1, 1), "pinned to one core", "taskset -c 1 python"),
     ((2, 2), "the machine's 2 cores", "python"),
     ((1, 2), "Cores used per run", "python")],
)  # fmt: skip
def test_distances_setup_names_the_cores_used(cores, pinned, command):
    """The distances section says how its runs used the cores, from each
    record's `cores_used` (pinned runs: `taskset -c 1` in the command)."""
    records = [
        {"case": f"case{i}", "batch": 4, "machine": {"cores_used": n}}
        for i, n in enumerate(cores)
    ]
    sentence, prefix = _report._cores(records)
    assert pinned in sentence
    assert (prefix + "python") == command
