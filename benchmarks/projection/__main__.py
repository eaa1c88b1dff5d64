"""Command line of the projection benchmark; see the package docstring."""

from __future__ import annotations

import argparse
import json

from .._common import records
from .._common.provenance import log
from . import _dc3, _families, _measure


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.projection",
        description="Time the pinet_eqx projector against the reference pinet-hcnn.",
    )
    parser.add_argument(
        "--family",
        choices=["dc3", "soc", "ax"],
        default="dc3",
        help="dc3: the DC3 polytopes (projection/_dc3.py); soc: the second-order "
        "cone of the paper's App. B.4; ax: a per-instance equality matrix E(x) "
        "with a box (both in projection/_families.py)",
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        choices=list(_dc3.SIZES),
        help="default: both for dc3 and soc, small for ax",
    )
    add = parser.add_argument
    add("--precision", nargs="+", choices=["f32", "f64"], default=["f32", "f64"])
    batch = "default: 1024, except soc large (128) and ax large (64)"
    add("--batch", type=int, help=batch)
    add("--repeats", type=int, default=10)
    parser.add_argument(
        "--repeats-large-f64",
        type=int,
        default=5,
        help="repeats for the large problem in float64 (the reference is slow); "
        "for soc and ax, for the large problem in both precisions",
    )
    parser.add_argument(
        "--sigma",
        type=float,
        help="soc and ax only: the reference's sigma, also used by our 'ours-same' "
        "variant (default: per family, see benchmarks/projection/_families.py)",
    )
    add("--quick", action="store_true", help="small problem only, 3 repeats")
    no_write = "do not write the record (benchmarks/projection/records/)"
    add("--no-write", action="store_true", help=no_write)
    add("--worker", action="store_true", help=argparse.SUPPRESS)
    add("--json", help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = ["small"], 3
    if args.family == "dc3":
        if args.sigma is not None:
            parser.error("--sigma applies to --family soc and ax only")
        args.sizes = args.sizes or list(_dc3.SIZES)
        args.batch = args.batch or 1024
        suite = _dc3
    else:
        args.sizes = args.sizes or _families.DEFAULT_SIZES[args.family]
        if args.sigma is None:
            args.sigma = _families.SIGMA[args.family]
        suite = _families
    if args.worker:
        _worker(suite, args)
    else:
        _run(suite, args, argv)


def _worker(suite, args) -> None:
    """Measure every size in one precision; the results go to `args.json` after
    each size, so that a crash keeps the sizes done."""
    _measure.worker_setup(args)
    results = []
    for size in args.sizes:
        results.append(suite.measure(size, args))
        with open(args.json, "w") as f:
            json.dump(results, f)


def _run(suite, args, argv) -> None:
    """Measure in one worker process per precision (`jax_enable_x64` is global),
    then print the tables and write them as its record (`benchmarks/projection/`)."""
    command, provenance = _measure.start(argv)
    worker_args = ["--family", args.family, "--repeats", str(args.repeats)]
    worker_args += ["--repeats-large-f64", str(args.repeats_large_f64)]
    if args.batch:
        worker_args += ["--batch", str(args.batch)]
    if args.sigma is not None:
        worker_args += ["--sigma", str(args.sigma)]
    worker_args += ["--sizes", *args.sizes]
    results = _measure.run_workers(args.precision, worker_args, list(_dc3.SIZES))
    head = _measure.header(command, provenance, suite.details(args, results))
    body = head + "\n" + suite.tables(results)
    print()
    print(body)
    if not args.no_write:
        title, order = suite.TITLES[args.family]
        records.write_run("projection", args.family, title, order, body)
        log("\nwrote benchmarks/projection/RESULTS.md")


if __name__ == "__main__":
    main()
