"""End-to-end check of the inference-feasibility benchmark (issue 15) on its
smallest case: instances, exact projections and floor, one worker process per
dtype, timing and the record. The full run is a benchmark
(`python -m benchmarks.feasibility`), not a test."""

import dataclasses
import json
import math

import numpy as np
import pytest

from benchmarks import feasibility
from benchmarks.feasibility._data import CaseData
from benchmarks.feasibility._exact import ClarabelProjection, polish

pytestmark = pytest.mark.slow

CASE = "dc3-tiny-convex"


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    out = tmp_path_factory.mktemp("feasibility") / "record.json"
    argv = ["--cases", CASE, "--n", "32", "--repeat-scale", "0.1", "--out", str(out)]
    returned = feasibility.main(argv)
    assert json.loads(out.read_text()) == json.loads(json.dumps(returned))
    return returned


def test_record_structure(record):
    assert record["command"].startswith(feasibility.PROG)
    assert {"cpu", "cpu_count", "git", "date", "jax"} <= set(record["machine"])
    case = record["cases"][CASE]
    assert case["n"] == 32 and case["dim"] == 20
    for dtype in ("float32", "float64"):
        assert {"target", "near", "far", "met", "worker"} <= set(case[dtype])
        assert case[dtype]["worker"]["defaults"]["n_iter_test"] >= 1
        for kind in ("near", "far"):
            entry = case[dtype][kind]
            assert 0.0 <= entry["successful"] <= 1.0
            assert isinstance(entry["met"], bool)
    timing = case["timing"]
    variants = {"ours near, refine=False", "ours near, polish=False"}
    assert {"ours near", "ours far", *variants} <= set(timing["batch"])
    assert timing["batch"]["ours near"]["median"] > 0
    assert {"ours", "ours, as argument", "ours, polish=False"} <= set(timing["single"])
    assert timing["single"]["ours, as argument"]["median"] > 0


def test_floor_and_cv_are_finite(record):
    case = record["cases"][CASE]
    for kind in ("near", "far"):
        floor = case["floor"][kind]
        assert floor["failed"] == 0
        assert math.isfinite(floor["floor"]) and 0 < floor["floor"] < 1e-4
        # The exact projection is feasible to float64 rounding, and agrees with
        # Clarabel.
        assert floor["exact_cv_max"] < 1e-12
        assert floor["clarabel_check"]["max_abs_diff"] < 1e-7
        for dtype in ("float32", "float64"):
            cv = case[dtype][kind]["cv_max"]
            assert math.isfinite(cv) and cv >= 0
        assert case["float32"][kind]["ratio_to_floor"] is not None


def test_markdown_names_command_and_machine(record):
    table = feasibility.markdown(record)
    assert record["command"] in table and record["machine"]["cpu"] in table
    assert f"| {CASE} |" in table


def test_cache_holds_the_instances_and_their_floor(tmp_path, monkeypatch):
    """`--prepare-only --cache` writes a case's instances and exact projections;
    a later run with the same settings reads them instead of solving again,
    and one with other settings does not."""
    argv = ["--cases", CASE, "--n", "8", "--cache", str(tmp_path)]
    assert feasibility.main([*argv, "--prepare-only"]) is None
    args = feasibility.parser().parse_args(argv)
    data, floor = feasibility._instances_and_floor(CASE, args)

    def unavailable():
        raise AssertionError("the cached case was built again")

    case = dataclasses.replace(feasibility.CASES[CASE], make=unavailable)
    monkeypatch.setitem(feasibility.CASES, CASE, case)
    cached, cached_floor = feasibility._instances_and_floor(CASE, args)
    assert cached_floor == floor and floor["near"]["failed"] == 0
    np.testing.assert_array_equal(cached.far, data.far)
    np.testing.assert_array_equal(cached.q, data.q)
    other = feasibility.parser().parse_args([*argv, "--seed", "1"])
    with pytest.raises(AssertionError, match="built again"):
        feasibility._instances_and_floor(CASE, other)


def test_polish_makes_a_cone_projection_exact():
    """The KKT polish turns a rough projection onto an affine set intersected
    with a second-order cone into one feasible to float64 rounding, on the
    cone's boundary where the exact projection lies."""
    d = 6
    rng = np.random.default_rng(0)
    E = rng.normal(size=(2, d))
    y_in = np.concatenate([rng.normal(size=d - 1) * 0.1, [2.0]])
    q = E @ y_in
    S, f = np.eye(d)[: d - 1], np.eye(d)[d - 1]
    data = CaseData(
        "toy", E, q[None], np.zeros((0, d)), np.zeros(0), np.zeros(0), S, f,
        {}, np.zeros((1, d)), np.zeros((1, d)), {}, {},
    )  # fmt: skip
    r = y_in + np.concatenate([3 * np.ones(d - 1), [-1.0]])
    z = ClarabelProjection(data).project(q, r)[0]
    y, stats = polish(data, q, r, z)
    assert stats["polished"] and stats["cone_active"]
    assert data.violation(y[None])[0] < 1e-13
    assert abs(np.linalg.norm(S @ y) - f @ y) < 1e-13
    assert np.abs(y - z).max() < 1e-3
