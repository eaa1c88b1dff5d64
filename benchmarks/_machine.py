"""Provenance shared by the benchmark scripts: the CPU and the git commit."""

import pathlib
import platform
import subprocess


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
