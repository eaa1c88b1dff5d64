"""The command line of the training suites (`dc3`, `soc`): `train`, `report` and
`--set key=value` read the same in every suite."""

from __future__ import annotations

import argparse
import json
import pathlib

from .config import ConfigError


def parse_overrides(pairs: list[str]) -> dict:
    """`["key=value", ...]` as a dict, each value JSON (`3`, `1e-4`, `true`,
    `null`, `"auto"`) or else text; the method's `Config` checks the keys."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {pair!r}.")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def suite_parser(prog: str, doc: str):
    """A suite's parser and its subcommand group (`dest="command"`)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    return parser, parser.add_subparsers(dest="command", required=True)


def add_train_arguments(train, methods: tuple[str, ...], default_out: pathlib.Path):
    """The `train` options every suite shares."""
    train.add_argument("--method", choices=methods, default=methods[0])
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--precision", type=int, choices=(32, 64), default=32)
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a hyperparameter (JSON value), repeatable; an unknown key "
        "is an error",
    )
    train.add_argument("--epochs", type=int, help="shorthand for --set epochs=N")
    train.add_argument("--label", help="results sub-folder (default: the method)")
    train.add_argument("--out", type=pathlib.Path, default=default_out)
    repeats = "timed repeats of batch inference (single: 5x)"
    train.add_argument("--repeats", type=int, default=20, help=repeats)
    train.add_argument("--quiet", action="store_true", help="no progress bar")


def add_report_command(sub) -> None:
    """The `report RESULTS_DIR [--out DIR] [--record]` subcommand."""
    report = sub.add_parser("report", help="figures and tables from a results folder")
    report.add_argument("results_dir", type=pathlib.Path)
    report.add_argument("--out", type=pathlib.Path, help="default: results_dir")
    report.add_argument(
        "--record",
        action="store_true",
        help="also write the committed record of the tables and render the page",
    )


def parse(parser: argparse.ArgumentParser, argv):
    """`parser`'s arguments; JAX's float64 for `--precision 64`, before any array."""
    args = parser.parse_args(argv)
    if getattr(args, "precision", 32) == 64:
        import jax

        jax.config.update("jax_enable_x64", True)
    return args


def train(parser, args, train, *where, **keywords):
    """Runs `train(*where, args.method, **keywords)` with the shared options, a
    `ConfigError` (an unknown or ill-typed hyperparameter) as a usage error."""
    overrides = parse_overrides(args.set)
    if args.epochs is not None:
        overrides["epochs"] = args.epochs
    options = dict(seed=args.seed, overrides=overrides, out=args.out, label=args.label)
    options.update(repeats=args.repeats, quiet=args.quiet)
    try:
        return train(*where, args.method, **keywords, **options)
    except ConfigError as error:
        parser.error(str(error))


def report(args, suite) -> None:
    """Runs the `report` subcommand for `suite` and prints the paths written."""
    from .report import report

    for path in report(args.results_dir, args.out, suite, args.record):
        print(path)
