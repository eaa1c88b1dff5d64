"""Command line of the second-order-cone benchmark (paper App. B.4).

    python -m benchmarks.soc train --size small --method pinet --seed 0
    python -m benchmarks.soc train --size small --method cvxpylayers \\
        --set max_time_s=600
    python -m benchmarks.soc train --size large --method scs
    python -m benchmarks.soc report results/soc

`train` writes `OUT/soc-{size}/{label}/seed{seed}/results.json` and
`per_instance.csv` (OUT defaults to `results/soc`). Methods: `_methods.py`.
"""

from __future__ import annotations

import pathlib
import sys

from .._common import cli
from ._methods import METHODS, SUITE

DEFAULT_OUT = pathlib.Path("results") / "soc"


def _parser():
    parser, sub = cli.suite_parser("python -m benchmarks.soc", __doc__)
    train = sub.add_parser("train", help="train and evaluate one method")
    train.add_argument("--size", choices=("small", "large"), default="small")
    cli.add_train_arguments(train, tuple(METHODS), DEFAULT_OUT)
    train.add_argument(
        "--data-seed", type=int, default=0, help="seed of A and the test instances"
    )
    cli.add_report_command(sub)
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = cli.parse(parser, argv)
    if args.command == "train":
        from ._train import train

        cli.train(parser, args, train, args.size, data_seed=args.data_seed)
    elif args.command == "report":
        cli.report(args, SUITE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
