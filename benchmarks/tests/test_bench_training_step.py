"""Smoke test of the training-step benchmark (`benchmarks/training_step.py`).

Runs its `--quick` path in-process on the tiny DC3 problem (20/10/10), checks the
record's structure and that our float64 gradients match the exact VJP, and checks
that exact VJP itself against finite differences. The reference part runs only
where `pinet-hcnn` is installed. The `--quick` run compiles eight jitted
functions (about 30 s on a 2-core CPU), hence `slow`.
"""

import json

import numpy as np
import pytest
from helpers import needs_reference

from benchmarks import training_step


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("training_step") / "quick.json"
    record = training_step.main(
        ["--quick", "--quiet", "--variants", "cholesky", "--out", str(out)]
    )
    return record, out


@pytest.mark.slow
def test_record_structure(quick, capsys):
    record, out = quick
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    for key in ("cpu", "device_kind", "jax", "git", "command", "matmul_precision"):
        assert key in record["machine"]
    assert record["settings"]["sizes"] == ["tiny"]
    truth = record["ground_truth"]["tiny"]
    assert truth["n_well_defined"] > 0
    assert truth["kkt_residual_max"] < 1e-10
    assert truth["clarabel_max_abs_diff"] < 1e-7
    assert [(e["size"], e["dtype"]) for e in record["results"]] == [
        ("tiny", "float32"),
        ("tiny", "float64"),
    ]
    for entry in record["results"]:
        for part in ("fwd", "fwd_bwd"):
            timing = entry["ours"][part]
            assert timing["compile_s"] > 0
            assert 0 < timing["min"] <= timing["median"] <= timing["max"]
    table = training_step.markdown(record)
    assert table.count("| tiny |") >= 4
    # A timing row per dtype, and a ratio row per dtype when the reference ran.
    with_ref = record["settings"]["reference"]
    assert table.count("| ours[cholesky] |") == 2 * (1 + with_ref)


@pytest.mark.slow
def test_our_gradients_float64(quick):
    record, _ = quick
    (entry,) = [e for e in record["results"] if e["dtype"] == "float64"]
    for name in ("ours", "ours[cholesky]"):
        ours = entry[name]
        assert np.isfinite(ours["grad_rel_err_worst"])
        assert ours["grad_rel_err_worst"] < 1e-4
        assert ours["cv_max"] < 1e-4
    assert "Cholesky" in entry["ours[cholesky]"]["settings"]["note"]


@pytest.mark.slow
@needs_reference
def test_reference_side(quick):
    record, _ = quick
    for entry in record["results"]:
        ref = entry["reference"]
        assert ref is not None
        assert np.isfinite(ref["grad_rel_err_worst"])
        assert np.isfinite(entry["ratio"]["fwd"]) and entry["ratio"]["fwd_bwd"] > 0


def test_exact_vjp_against_finite_differences():
    case = training_step.make_case("tiny", batch=4)
    truth = training_step.exact_vjp(case, 4, clarabel=False, progress=False)
    P = case.problem
    exact = training_step.ExactProjection(P.A, P.G, P.h)
    rng = np.random.RandomState(3)
    eps = 1e-6
    for i in np.flatnonzero(truth["well_defined"]):
        direction = rng.normal(size=P.n_var)

        def loss(y, i=i):
            return case.V[i] @ exact.project(y, case.X[i])[0]

        fd = (loss(case.Y[i] + eps * direction) - loss(case.Y[i] - eps * direction)) / (
            2 * eps
        )
        assert abs(fd - truth["vjp"][i] @ direction) < 1e-6
