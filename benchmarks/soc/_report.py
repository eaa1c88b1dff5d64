"""Figures and Markdown tables from a folder of SOC results: the shared report
(`benchmarks._common.report`) with this suite's title and method order."""

from __future__ import annotations

import pathlib

from .._common import report as _report
from ._methods import METHODS

SUITE = _report.Suite(
    "Second-order-cone benchmark results (paper App. B.4)",
    "python -m benchmarks.soc",
    tuple(METHODS),
    "soc",
)


def report(results_dir, out_dir=None, record=False) -> list[pathlib.Path]:
    """Write the figures and tables of every SOC run in `results_dir`."""
    return _report.report(results_dir, out_dir, SUITE, record)
