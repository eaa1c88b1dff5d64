"""Command line of the DC3 benchmark suite.

    python -m benchmarks.dc3 data --problem nonconvex --size small
    python -m benchmarks.dc3 train --problem nonconvex --size small \\
        --method pinet --seed 0
    python -m benchmarks.dc3 train ... --autotune          # pinet: run autotune first
    python -m benchmarks.dc3 train ... --set n_iter_test=50 --set epochs=10
    python -m benchmarks.dc3 train ... --instances ../shared/data/dc3
    python -m benchmarks.dc3 report results/dc3
    python -m benchmarks.dc3 ablations --size small

`train` writes `OUT/{problem}-{size}/{label}/seed{seed}/results.json` (every
metric, the exact configuration, the learning curve, the machine and the command)
and `per_instance.csv` (test RS and CV of every instance). OUT defaults to
`results/dc3`. Methods: see `benchmarks/dc3/_methods.py`.
"""

from __future__ import annotations

import pathlib
import sys

from .._common import cli
from ._methods import METHODS, SUITE

DEFAULT_OUT = pathlib.Path("results") / "dc3"


def _add_data_arguments(parser, data_seed: bool = True):
    parser.add_argument(
        "--problem", choices=("convex", "nonconvex"), default="nonconvex"
    )
    parser.add_argument("--size", choices=("tiny", "small", "large"), default="small")
    if data_seed:
        help = "seed of the DC3 generator (17: the published data)"
        parser.add_argument("--data-seed", type=int, default=17, help=help)


def _parser():
    parser, sub = cli.suite_parser("python -m benchmarks.dc3", __doc__)
    data = sub.add_parser("data", help="generate a problem and cache its solutions")
    _add_data_arguments(data)
    train = sub.add_parser("train", help="train and evaluate one method")
    _add_data_arguments(train)
    cli.add_train_arguments(train, tuple(METHODS), DEFAULT_OUT)
    train.add_argument(
        "--autotune",
        action="store_true",
        help="pinet/soft: run pinet_eqx.autotune before training",
    )
    train.add_argument(
        "--instances",
        type=pathlib.Path,
        help="also evaluate on the paper's DC3 .npz test instances "
        "in this folder (small problem only)",
    )
    cli.add_report_command(sub)
    ablations = sub.add_parser("ablations", help="the paper's ablation studies")
    _add_data_arguments(ablations, data_seed=False)
    ablations.add_argument(
        "--which", action="append", help="run only these studies (repeatable)"
    )
    ablations.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path("results") / "dc3-ablations"
    )
    ablations.add_argument("--precision", type=int, choices=(32, 64), default=32)
    ablations.add_argument("--quick", action="store_true", help="fewer epochs/points")
    ablations.add_argument(
        "--epochs", type=int, help="epochs of the studies that train a network"
    )
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = cli.parse(parser, argv)
    if args.command == "data":
        from . import _data

        data = _data.load(args.problem, args.size, seed=args.data_seed)
        print(
            f"{data.name}: {len(data.X_train)}/{len(data.X_valid)}/"
            f"{len(data.X_test)} contexts, solutions cached."
        )
    elif args.command == "train":
        from ._train import train

        if args.autotune:
            args.set.append("autotune=true")
        where = (args.problem, args.size)
        data = {"data_seed": args.data_seed, "instances": args.instances}
        cli.train(parser, args, train, *where, **data)
    elif args.command == "report":
        cli.report(args, SUITE)
    elif args.command == "ablations":
        from ._ablations import run_ablations

        run_ablations(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
