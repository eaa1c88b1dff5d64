"""The provenance record of a benchmark result: machine, software and command.

Every suite records where its numbers come from through `machine()` (a dict, for
JSON records), `command_line()` and `describe()` (one line of prose, for Markdown
output), so that the fields and their names are the same everywhere.
"""

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
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            cwd=pathlib.Path(__file__).parent,
        ).stdout.strip()
    except OSError:
        commit = ""
    return commit or "unknown"


def command_line(prog: str, argv: list[str] | None = None) -> str:
    """The command that is running: `prog` and its arguments (`argv`, default
    `sys.argv[1:]`)."""
    return " ".join([prog, *(sys.argv[1:] if argv is None else argv)])


def log(message: str) -> None:
    """Progress on standard error, flushed at once (runs take minutes)."""
    print(message, file=sys.stderr, flush=True)


def run_worker(module: str, args: list[str], env: dict | None = None, **kwargs):
    """Runs `python -m module args` in a fresh process from the repository root,
    with `env` added to the environment (JAX reads its flags when it starts),
    and returns the JSON object on the last line of its standard output; raises
    `SystemExit` with the end of its standard error if it fails. `kwargs` go to
    `subprocess.run` (`timeout`, say)."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=pathlib.Path(__file__).resolve().parents[2],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        **kwargs,
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
    """The machine and software that produced a result, and how busy it was:
    `cpu`, `cpu_count`, `platform`, `python`, `jax`, `jax_backend`, `git`, `date`
    (UTC) and `load_avg` (other jobs inflate every time). With `devices`, also
    `device_kind`, `device_count` and `matmul_precision` (on a GPU, whether float32
    products run as TF32).
    """
    import jax

    record = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "git": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_avg": list(os.getloadavg()),
    }
    if devices:
        record.update(
            device_kind=jax.devices()[0].device_kind,
            device_count=jax.device_count(),
            matmul_precision=str(jax.config.jax_default_matmul_precision),
        )
    return record


def describe(m: dict) -> str:
    """One line of prose for Markdown output from a `machine()` record."""
    return (
        f"{m['cpu']}, {m['cpu_count']} CPUs, {m['platform']}, Python {m['python']}, "
        f"jax {m['jax']} ({m['jax_backend']}), pinet_eqx at git {m['git']}"
    )
