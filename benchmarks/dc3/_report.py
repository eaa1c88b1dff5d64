"""Figures and Markdown tables from a folder of DC3 results (see
`benchmarks._common.report`): per-instance RS/CV scatters, learning curves and
the accuracy, time-to-accuracy and inference-time tables."""

from __future__ import annotations

import pathlib

from .._common import report as _report
from ._methods import METHODS

SUITE = _report.Suite(
    "DC3 benchmark results", "python -m benchmarks.dc3", tuple(METHODS), "dc3"
)


def report(results_dir, out_dir=None, record=False) -> list[pathlib.Path]:
    """Write the figures and tables of every DC3 run in `results_dir`."""
    return _report.report(results_dir, out_dir, SUITE, record)
