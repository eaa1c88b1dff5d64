"""`examples/data_parallel.py` on four virtual CPU devices and on one.

Each run is a subprocess, since the number of virtual devices is fixed when JAX
starts. The four-device run must train to the same losses as the one-device run
(float32, so up to the order of the sums) and keep its outputs sharded.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # two short trainings, in float32, with OSQP

ROOT = pathlib.Path(__file__).parent.parent
SCRIPT = ROOT / "examples" / "data_parallel.py"


def _run(n_devices: int, out: pathlib.Path) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n_devices}"
    env["JAX_PLATFORMS"] = "cpu"
    argv = ["--epochs=1", "--n-train=512", "--n-test=64", f"--out={out}"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_example_four_devices_trains_like_one(tmp_path):
    four = _run(4, tmp_path / "four.json")
    one = _run(1, tmp_path / "one.json")
    assert four["devices"] == 4 and one["devices"] == 1
    assert four["output_sharding"] == "P('data',)"
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=1e-4)
    np.testing.assert_allclose(four["rs_mean"], one["rs_mean"], rtol=1e-3)
    for run in (four, one):
        assert run["cv_max_float64"] <= 1e-4, run
