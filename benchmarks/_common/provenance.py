"""The provenance of a benchmark result (machine, software, command), progress
logging, worker processes and JSON records."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys


def cpu_model() -> str:
    """The CPU's model name from `/proc/cpuinfo` (or `platform.processor()`)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    """`git describe --always --dirty` of this checkout, or `"unknown"`."""
    command, here = ["git", "describe", "--always", "--dirty"], pathlib.Path(__file__)
    try:
        commit = subprocess.run(
            command, capture_output=True, text=True, cwd=here.parent
        )
    except OSError:
        return "unknown"
    return commit.stdout.strip() or "unknown"


def command_line(prog: str, argv: list[str] | None = None) -> str:
    """The command that is running: `prog` and its arguments (`argv`, default
    `sys.argv[1:]`)."""
    return " ".join([prog, *(sys.argv[1:] if argv is None else argv)])


def log(message: str) -> None:
    """Progress on standard error, flushed at once (runs take minutes)."""
    print(message, file=sys.stderr, flush=True)


def run_worker(module: str, args: list[str], env: dict | None = None, **kwargs):
    """Runs `python -m module args` in a fresh process from the repository root,
    with `env` added, and returns the JSON on the last line of its standard output
    (`SystemExit` with its standard error if it fails)."""
    root, env = (
        pathlib.Path(__file__).resolve().parents[2],
        {**os.environ, **(env or {})},
    )
    command = [sys.executable, "-m", module, *args]
    proc = subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, **kwargs
    )
    if proc.returncode != 0:
        raise SystemExit(f"`{module} {' '.join(args)}` failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def save(path: pathlib.Path, record, indent: int = 1) -> pathlib.Path:
    """Writes `record` as JSON to `path`, making its folder; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=indent))
    return path


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far, in GiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def machine(devices: bool = False) -> dict:
    """The machine, software and load behind a result; with `devices`, also the
    device kind and count and the matmul precision (TF32 or not on a GPU)."""
    import jax

    from pinet_eqx._linalg.host_solve import usable_cores

    record = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        # The cores this run may use (fewer under `taskset`).
        "cores_used": usable_cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "git": git_commit(),
        "date": now(),
        "load_avg": list(os.getloadavg()),
    }
    if devices:
        record.update(device_kind=jax.devices()[0].device_kind)
        record.update(device_count=jax.device_count())
        record["matmul_precision"] = str(jax.config.jax_default_matmul_precision)
    return record


def now() -> str:
    """The UTC time now, to the second, in ISO format."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def describe(m: dict) -> str:
    """One line of prose for Markdown output from a `machine()` record."""
    return (
        f"{m['cpu']}, {m['cpu_count']} CPUs, {m['platform']}, Python {m['python']}, "
        f"jax {m['jax']} ({m['jax_backend']}), pinet_eqx at git {m['git']}"
    )
