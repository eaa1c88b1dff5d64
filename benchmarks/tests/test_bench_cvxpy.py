"""Smoke test of the cvxpy front-end benchmark (`python -m benchmarks.cvxpy`).

Runs `--quick` (batch 4, two repeats, target A without the Clarabel variant of
cvxpylayers, target B on DC3 tiny) in its own process, since the suite turns
on `jax_enable_x64` itself, and checks what it writes: the JSON record with
every timing, the tables, and that our inference-mode outputs agree with
cvxpylayers' and with Clarabel's.
"""

import json
import subprocess
import sys

import pytest

from benchmarks.cvxpy import _report


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    out = tmp_path_factory.mktemp("cvxpy")
    subprocess.run(
        [sys.executable, "-m", "benchmarks.cvxpy", "--quick", "--out", str(out)],
        check=True,
        timeout=300,
    )
    assert (out / "results.md").read_text().startswith("`python -m benchmarks.cvxpy")
    return json.loads((out / "results.json").read_text())


def test_every_call_is_timed(record):
    speed, overhead = record["speed"], record["overhead"]
    assert record["dtype"] == "float64" and speed["batch"] == 4
    for layer in ("ours_train", "ours_inference", "cvxpylayers"):
        for kind in ("forward", "forward_backward"):
            stats = speed["timing"][f"{layer}/{kind}"]
            assert stats["repeats"] == 2 and 0 < stats["min"] <= stats["median"]
            assert stats["first_s"] > 0
    for name in ("hand_built", "from_cvxpy"):
        for mode in ("train", "inference"):
            assert overhead["timing"][f"{name}/{mode}/forward"]["median"] > 0
    assert set(overhead["ratio"]) == {
        f"{mode}/{kind}"
        for mode in ("train", "inference")
        for kind in ("forward", "forward_backward")
    }


def test_outputs_agree(record):
    speed = record["speed"]
    # cvxpylayers' default solver, SCS, stops at about 1e-4.
    assert speed["sanity_max_abs_ours_inference_vs_cvxpylayers"] < 1e-2
    ours = speed["accuracy_vs_clarabel_1e-10"]["ours_inference"]
    assert ours["max_abs"] < 1e-4 and ours["violation"] < 1e-8
    # The same polytope, whichever way it was built.
    assert max(record["overhead"]["max_abs_difference"].values()) < 1e-8
    assert speed["gradient_error"]["ours_inference"]["max"] < 0.1


def test_tables(record):
    table = _report.markdown(record)
    assert "| ours, training mode (defaults) |" in table
    assert "Target B: from_cvxpy vs hand-built, DC3 tiny" in table
