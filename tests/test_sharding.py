"""Data parallelism: sharded runs equal single-device runs.

The projector and `HardConstrainedNet` are run with the batch split across four
virtual CPU devices, under each of JAX's parallelism modes (automatic sharding,
explicit sharding under `jax.set_mesh`, and `jax.shard_map` over the batch axis),
for a polytope, a second-order cone and per-instance matrices, with both adjoints.
Forward, VJP, an optax training step, inference mode and `solve` (with its
status) each equal the single-device result to 1e-12 in float64. A second test
trains across two processes with `jax.distributed` on loopback.

Virtual devices must be set up before JAX starts, so these runs happen in
subprocesses (`sharding_worker.py`); this process only compares.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
import sharding_worker as worker

import pinet_eqx as pe

WORKER = pathlib.Path(__file__).with_name("sharding_worker.py")
ROOT = WORKER.parent.parent
TOL = 1e-12
# The fast tier runs one set and one adjoint under automatic sharding and
# `shard_map`; the slow tier the rest of the grid (explicit sharding included).
FAST_CASES = tuple(
    worker.case_id("polytope", "implicit", mode) for mode in ("auto", "shard_map")
)


def _env(n_devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={n_devices}"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def _optimise() -> list[str]:
    # The workers compile as this process does (the fast tier turns XLA's
    # optimisations off, see conftest.py).
    off = jax.config.read("jax_disable_most_optimizations")
    return [] if off else ["--optimise"]


def _run_worker(cases, tmp_path, timeout) -> dict:
    out = tmp_path / f"cases-{cases[0]}.json"
    command = [sys.executable, str(WORKER), "cases", str(out), *_optimise()]
    for cid in cases:
        command += ["--case", cid]
    proc = subprocess.run(
        command, env=_env(4), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results.pop("devices") == 4
    return results


def _group(cid: str) -> tuple[str, ...]:
    """The cases one worker runs together, those of one set and adjoint (they
    share the single-device reference): the fast cases, or the slow ones of the
    same set and adjoint."""
    if cid in FAST_CASES:
        return FAST_CASES
    prefix = cid.rsplit("-", 1)[0]
    return tuple(
        c for c in worker.all_cases() if c.startswith(prefix) and c not in FAST_CASES
    )


@pytest.fixture(scope="session")
def sharded_results(tmp_path_factory):
    """`get(case) -> record`: each group of cases runs once per session, on first
    use, also across pytest-xdist workers (they share the parent of their
    temporary folders, and a lock file)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def get(cid):
        group = _group(cid)
        path = shared / f"sharding-{group[0]}.json"
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not path.exists():
                timeout = 120 * len(group) + 60
                path.write_text(json.dumps(_run_worker(group, base, timeout)))
        return json.loads(path.read_text())[cid]

    return get


def _case_params():
    out = []
    for cid in worker.all_cases():
        marks = () if cid in FAST_CASES else (pytest.mark.slow,)
        out.append(pytest.param(cid, marks=marks, id=cid))
    return out


@pytest.mark.parametrize("cid", _case_params())
def test_sharded_equals_single_device(sharded_results, cid):
    record = sharded_results(cid)
    assert "error" not in record, record.get("traceback", record.get("error"))
    computations = record["computations"]
    expected = {"forward", "vjp", "step"}
    if cid.split("-")[1] == "implicit":
        expected |= {"inference", "solve"}
    assert set(computations) == expected
    failures = {}
    for name, c in computations.items():
        if "error" in c:
            failures[name] = c["error"][:600]
        elif c["max_abs_diff"] > TOL * max(1.0, c["magnitude"]):
            failures[name] = f"differs by {c['max_abs_diff']:.2e}"
    assert not failures, json.dumps(failures, indent=1)


@pytest.mark.parametrize("cid", [c for c in FAST_CASES if not c.endswith("shard_map")])
def test_sharded_forward_stays_on_its_devices(sharded_results, cid):
    """The compiled sharded forward pass moves no instance between devices: each
    instance, with its own factorisation, is solved on the device that holds it.
    The only collectives are the run-time input check's (`check_inputs`, on by
    default): `eqx.error_if` reduces its predicate over the whole batch, so that
    one bad instance anywhere raises; without the check there are none."""
    record = sharded_results(cid)
    assert "error" not in record, record.get("error")
    assert record["collectives_unchecked"] == [], record
    assert record["collectives"] in ([], ["all-reduce"]), record


# ------------------------------------------------------------------ the API


def test_data_mesh_and_shard_batch_one_device():
    """On one device (this process), the mesh has one entry and a sharded batch
    equals its input."""
    mesh = pe.data_mesh()
    assert mesh.axis_names == ("data",) and mesh.size == jax.device_count()
    X = np.arange(12.0).reshape(4, 3)
    tree = {"b": np.ones((4, 2)), "none": None}
    Xs, tree_s = pe.shard_batch(mesh, X, tree)
    np.testing.assert_array_equal(np.asarray(Xs), X)
    assert tree_s["none"] is None
    assert Xs.sharding.spec == jax.sharding.PartitionSpec("data")
    assert pe.shard_batch(mesh, X).shape == X.shape  # one argument: no tuple
    assert pe.data_mesh(explicit=True).axis_types == (jax.sharding.AxisType.Explicit,)
    rep = pe.replicate(mesh, {"w": np.ones(3), "n": 3})
    assert rep["n"] == 3 and rep["w"].sharding.spec == jax.sharding.PartitionSpec()


def test_shard_batch_errors():
    mesh = pe.data_mesh()
    with pytest.raises(ValueError, match="scalar leaf"):
        pe.shard_batch(mesh, np.float64(1.0))
    with pytest.raises(ValueError, match="no axis 'batch'"):
        pe.shard_batch(mesh, np.ones(4), axis_name="batch")
    with pytest.raises(ValueError, match="`devices` is empty"):
        pe.data_mesh(devices=[])


def test_shard_batch_indivisible_names_argument(tmp_path):
    """On four devices a batch of 6 is an error naming the argument, its shape
    and the fix."""
    script = (
        "import numpy as np, pinet_eqx as pe\n"
        "mesh = pe.data_mesh()\n"
        "try:\n"
        "    pe.shard_batch(mesh, np.ones((8, 2)), {'b': np.ones((6, 3))})\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=_env(4),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    message = proc.stdout
    assert "argument 1" in message and "(6, 3)" in message, message
    assert "multiple of 4" in message, message


# ------------------------------------------------------------------ multi-process


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two processes starting JAX: 25 s of the fast tier
def test_two_processes_train_like_one(tmp_path):
    """Two processes on loopback, two virtual CPU devices each, train three
    Adam steps of a `HardConstrainedNet` with the batch split across all four
    devices; the losses, gradients, parameters and outputs equal those of this
    process training on one device, to 1e-6 in float64."""
    out = tmp_path / "process0.npz"
    port = _free_port()
    procs = []
    logs = [tmp_path / f"process{i}.log" for i in range(2)]
    try:
        for i in range(2):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(WORKER),
                        "process",
                        str(out),
                        "--process-id",
                        str(i),
                        "--port",
                        str(port),
                        *_optimise(),
                    ],
                    env=_env(2),
                    stdout=subprocess.DEVNULL,
                    stderr=logs[i].open("w"),
                )
            )
        for p in procs:
            p.wait(timeout=240)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, p in enumerate(procs):
        assert p.returncode == 0, logs[i].read_text()[-4000:]
    distributed = dict(np.load(out))

    problem = worker.make_problem("polytope")
    net = worker.make_net(problem, "implicit")
    history, Y = worker.train(net, problem.X, problem.params)
    single = worker.flatten_history(history, Y)
    assert set(distributed) == set(single)
    for name, value in single.items():
        np.testing.assert_allclose(
            distributed[name], value, rtol=1e-6, atol=1e-6, err_msg=name
        )
