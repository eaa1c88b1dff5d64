"""Command line of the second-order-cone benchmark (paper App. B.4).

    python -m benchmarks.soc train --size small --method pinet --seed 0
    python -m benchmarks.soc train --size small --method cvxpylayers \\
        --set max_time_s=600
    python -m benchmarks.soc train --size large --method scs
    python -m benchmarks.soc report results/soc

`train` writes `OUT/soc-{size}/{label}/seed{seed}/results.json` (every metric, the
exact configuration, the validation learning curve, inference times, the machine,
its load average and the command) and `per_instance.csv` (test RS and CV of every
instance), overwriting an earlier run of the same label and seed. OUT defaults to
`results/soc`. Methods: see `benchmarks/soc/_methods.py`.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from ..dc3.__main__ import add_train_arguments, train_overrides
from ._methods import METHODS

DEFAULT_OUT = pathlib.Path("results") / "soc"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soc", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train and evaluate one method")
    train.add_argument("--size", choices=("small", "large"), default="small")
    add_train_arguments(train, tuple(METHODS), DEFAULT_OUT)
    train.add_argument(
        "--data-seed", type=int, default=0, help="seed of A and the test instances"
    )

    report = sub.add_parser("report", help="figures and tables from a results folder")
    report.add_argument("results_dir", type=pathlib.Path)
    report.add_argument("--out", type=pathlib.Path, help="default: results_dir")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "precision", 32) == 64:
        import jax

        jax.config.update("jax_enable_x64", True)
    if args.command == "train":
        from ._train import train

        train(
            args.size,
            args.method,
            seed=args.seed,
            overrides=train_overrides(args),
            out=args.out,
            label=args.label,
            data_seed=args.data_seed,
            repeats=args.repeats,
            quiet=args.quiet,
        )
    elif args.command == "report":
        from ._report import report

        for path in report(args.results_dir, args.out):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
