"""Renders every suite's page and the headline of `benchmarks/RESULTS.md` from
the committed records (`benchmarks/_common/records.py`).

    python -m benchmarks.report            # every page
    python -m benchmarks.report dcopf      # one suite's page, and the headline

A suite's own `report` command writes its records from its raw results first
(`python -m benchmarks.dcopf proxy-report`, `python -m benchmarks.dc3 report
results/dc3`, ...), then renders the same pages.
"""

from __future__ import annotations

import argparse

from ._common import records


def main(argv=None) -> int:
    names = [s for s in records.SUITES if s]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suites", nargs="*", help=f"of {names}; default: every one")
    suites = parser.parse_args(argv).suites or None
    unknown = sorted(set(suites or ()) - set(names))
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; choose from {names}")
    for path in records.render(suites):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
