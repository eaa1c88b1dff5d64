"""End-to-end check of the random-polytope sweep (`python -m
benchmarks.random_polytopes`) on two polytopes: one worker process per dtype,
the record and its table."""

import json

import numpy as np

from benchmarks import random_polytopes


def test_sweep_record(tmp_path):
    out = tmp_path / "record.json"
    argv = ["--sets", "2", "--per-set", "3", "--out", str(out)]
    record = random_polytopes.main(argv)
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    for dtype in random_polytopes.DTYPES:
        entry = record[dtype]
        assert entry["instances"] == 6 and len(entry["per_set"]) == 2
        assert 0 <= entry["not_successful"] <= 6
        # Each instance runs at least the inference iterations (50).
        assert entry["iterations"] >= 6 * 50
        assert 0 <= entry["cv_max_successful"] <= entry["cv_max"]
    # float64 certifies to float64 accuracy.
    assert record["float64"]["cv_max_successful"] < 1e-9
    table = random_polytopes.markdown(record)
    assert record["command"] in table and "| float32 | 6 |" in table


def test_violation_counts_every_kind_of_row():
    poly = next(random_polytopes.polytopes(1, 0))[0]
    y = poly.y_feas[None]
    assert poly.violation(y)[0] < 1e-12
    shifted = y + 100.0
    assert poly.violation(shifted)[0] > 1.0
    assert np.all(np.isfinite(poly.violation(shifted)))
