"""Command line of the projection benchmark; see the package docstring."""

from __future__ import annotations

import argparse

from . import _dc3, _families


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
        default=None,
        help="default: both for dc3 and soc, small for ax",
    )
    parser.add_argument(
        "--precision", nargs="+", choices=["f32", "f64"], default=["f32", "f64"]
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="default: 1024, except soc large (128) and ax large (64)",
    )
    parser.add_argument("--repeats", type=int, default=10)
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
        default=None,
        help="soc and ax only: the reference's sigma, also used by our 'ours-same' "
        "variant (default: per family, see benchmarks/projection/_families.py)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small problem only, 3 repeats"
    )
    parser.add_argument(
        "--no-write", action="store_true", help="do not update benchmarks/RESULTS.md"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
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
        suite.worker(args)
    else:
        suite.run(args, argv)


if __name__ == "__main__":
    main()
