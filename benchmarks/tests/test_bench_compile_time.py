"""Smoke test of the compile-time benchmark (`benchmarks/compile_time.py`).

One fresh worker process per layer on a batch of 16: the record's parts are
positive and add up to the first call, the paired ratio is consistent with the
samples, and the table names every layer. The reference is timed only where
`pinet-hcnn` is installed.
"""

import json

import numpy as np
import pytest

from benchmarks import compile_time


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    out = tmp_path_factory.mktemp("compile_time") / "record.json"
    return compile_time.main(["--repeats", "1", "--batch", "16", "--out", str(out)])


@pytest.mark.slow
def test_parts_add_up(record):
    for samples in record["samples"].values():
        (s,) = samples
        parts = [s[p] for p in ("trace", "lower", "compile", "run")]
        assert all(t > 0 for t in parts)
        np.testing.assert_allclose(sum(parts), s["total"], rtol=1e-9)
    if "reference" in record["samples"]:
        (ours,), (ref,) = record["samples"]["ours"], record["samples"]["reference"]
        assert record["total_ratio"]["median"] == pytest.approx(
            ours["total"] / ref["total"]
        )


@pytest.mark.slow
def test_table_and_json(record):
    table = compile_time.markdown(record)
    for layer in record["stats"]:
        assert f"| {layer} |" in table
    out = json.loads(json.dumps(record))
    assert out["batch"] == 16 and out["size"] == "small"


def test_rejects_bad_repeats():
    with pytest.raises(SystemExit):
        compile_time.main(["--repeats", "0"])
