"""Figures and Markdown tables from a folder of SOC benchmark results.

The DC3 suite's report (`benchmarks/dc3/_report.py`) with this suite's title and
method order: per-instance RS/CV scatters with the paper's thresholds, learning
curves (with seed bands when there are several seeds) and the accuracy and
inference-time tables, in `tables.md`.
"""

from __future__ import annotations

import pathlib

from ..dc3 import _report
from ._methods import METHODS

SUITE = _report.Suite(
    "Second-order-cone benchmark results (paper App. B.4)",
    "python -m benchmarks.soc",
    tuple(METHODS),
)


def report(
    results_dir: str | pathlib.Path, out_dir: str | pathlib.Path | None = None
) -> list[pathlib.Path]:
    """Write the figures and tables of every SOC run in `results_dir` (see
    `benchmarks.dc3._report.report`); returns the paths written."""
    return _report.report(results_dir, out_dir, SUITE)
