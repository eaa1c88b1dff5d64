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

import argparse
import json
import pathlib
import sys

from ._methods import METHODS

DEFAULT_OUT = pathlib.Path("results") / "dc3"


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {pair!r}.")
        out[key] = _value(value)
    return out


def add_train_arguments(train, methods: tuple[str, ...], default_out: pathlib.Path):
    """The `train` options every suite shares: method, seeds, precision,
    overrides, label, output folder, timing repeats, quiet."""
    train.add_argument("--method", choices=methods, default=methods[0])
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--precision", type=int, choices=(32, 64), default=32)
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a hyperparameter (JSON value), repeatable",
    )
    train.add_argument("--epochs", type=int, help="shorthand for --set epochs=N")
    train.add_argument("--label", help="results sub-folder (default: the method)")
    train.add_argument("--out", type=pathlib.Path, default=default_out)
    train.add_argument(
        "--repeats",
        type=int,
        default=20,
        help="timed repeats of batch inference (single: 5x)",
    )
    train.add_argument("--quiet", action="store_true", help="no progress bar")


def train_overrides(args) -> dict:
    """The hyperparameters that `--set` and `--epochs` override."""
    config = _overrides(args.set)
    if args.epochs is not None:
        config["epochs"] = args.epochs
    return config


def _add_data_arguments(parser):
    parser.add_argument(
        "--problem", choices=("convex", "nonconvex"), default="nonconvex"
    )
    parser.add_argument("--size", choices=("tiny", "small", "large"), default="small")
    parser.add_argument(
        "--data-seed",
        type=int,
        default=17,
        help="seed of the DC3 generator (17: the published data)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dc3", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="generate a problem and cache its solutions")
    _add_data_arguments(data)

    train = sub.add_parser("train", help="train and evaluate one method")
    _add_data_arguments(train)
    add_train_arguments(train, tuple(METHODS), DEFAULT_OUT)
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

    report = sub.add_parser("report", help="figures and tables from a results folder")
    report.add_argument("results_dir", type=pathlib.Path)
    report.add_argument("--out", type=pathlib.Path, help="default: results_dir")

    ablations = sub.add_parser("ablations", help="the paper's ablation studies")
    ablations.add_argument(
        "--size", choices=("tiny", "small", "large"), default="small"
    )
    ablations.add_argument(
        "--problem", choices=("convex", "nonconvex"), default="nonconvex"
    )
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
    args = _parser().parse_args(argv)
    if getattr(args, "precision", 32) == 64:
        import jax

        jax.config.update("jax_enable_x64", True)
    if args.command == "data":
        from . import _data

        data = _data.load(args.problem, args.size, seed=args.data_seed)
        print(
            f"{data.name}: {len(data.X_train)}/{len(data.X_valid)}/"
            f"{len(data.X_test)} contexts, solutions cached."
        )
    elif args.command == "train":
        from ._train import train

        config = train_overrides(args)
        if args.autotune:
            config["autotune"] = True
        train(
            args.problem,
            args.size,
            args.method,
            seed=args.seed,
            overrides=config,
            out=args.out,
            label=args.label,
            data_seed=args.data_seed,
            repeats=args.repeats,
            instances=args.instances,
            quiet=args.quiet,
        )
    elif args.command == "report":
        from ._report import report

        for path in report(args.results_dir, args.out):
            print(path)
    elif args.command == "ablations":
        from ._ablations import run_ablations

        run_ablations(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
