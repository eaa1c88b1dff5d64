"""The command line: `train`, `baseline`, `figures`, `suite` (all of them), and
`context` and `construction` for contextual coverage."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import platform
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import pinet_eqx as pe

from ._baseline import relative_suboptimality, solve_effort_qp
from ._context_map import (
    CENTERS,
    make_map_planner,
    make_map_table,
    map_cost,
    map_inputs,
    sample_map_contexts,
)
from ._figures import (
    plot_context_maps,
    plot_coverage,
    plot_preference,
    plot_trajectories,
)
from ._model import make_planner
from ._objectives import coverage, effort, fleet_objective, preference
from ._problem import (
    Problem,
    context_features,
    feasible_trajectory,
    make_projector,
    sample_contexts,
    split,
    violations,
)
from ._train import predict, train

WEIGHTINGS = ((0.0, 0.0), (1.0, 0.0), (1.0, 1.0))
PROJECTOR = {
    "sigma": 0.02,
    "n_iter": 100,
    "n_iter_test": 1000,
    # Step limit of the implicit backward solve; None: the adjoint's default.
    "bwd_max_steps": None,
    "refine": True,
}


def _settings(args) -> tuple[dict, dict]:
    """The projector's (as stored in a model file's header: see
    `projector_settings`) and the MLP's settings from the command line."""
    projector = {
        **PROJECTOR,
        "sigma": args.sigma,
        "n_iter": args.n_iter,
        "n_iter_test": args.n_iter_test,
        "bwd_max_steps": args.bwd_max_steps,
    }
    return projector, {"width": args.width, "depth": args.depth}


def projector_settings(stored: dict) -> dict:
    """The `pe.Projector` keywords of the settings a header stores (plain JSON):
    `bwd_max_steps` becomes `adjoint=pe.ImplicitAdjoint(max_steps=...)`. The
    adjoint holds no arrays, so its settings do not change the stored leaves."""
    settings = dict(stored)
    max_steps = settings.pop("bwd_max_steps", None)
    if max_steps is not None:
        settings["adjoint"] = pe.ImplicitAdjoint(max_steps=max_steps)
    return settings


def _schedule(args) -> dict:
    """The keyword arguments of `train` that come from `_training_options`."""
    return {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "residual_weight": args.residual_weight,
        "seed": args.seed,
        "time_budget": args.time_budget,
    }


def run_name(problem: Problem, lam: float, nu: float) -> str:
    return f"n{problem.n_vehicles}_T{problem.horizon}_lam{lam:g}_nu{nu:g}"


def contexts(problem: Problem, n: int, data_seed: int, split: int):
    """Contexts of one split (0 training, 1 test): the same for every weighting."""
    rng = np.random.default_rng([data_seed, split])
    return sample_contexts(rng, n, problem)


def _machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "x64": bool(jax.config.jax_enable_x64),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def save_planner(path, model, header: dict) -> None:
    """`pe.save` the planner, with `header` (`"problem"`, `"mlp"`, `"projector"`
    and, for a contextual-coverage planner, `"map"`) as its hyperparameters: what
    `planner_skeleton` rebuilds it from (see `docs/concepts/save-load.md`)."""
    pe.save(path, model, header)


def _save_run(out, args, model, header, setup, info, metrics, **extra) -> dict:
    """Write a run's `model.eqx` (`save_planner`) and `metrics.json`: the
    command, its arguments, `extra`, the header, the set-up time, the training
    record and the test metrics. Returns the `metrics.json` content."""
    save_planner(os.path.join(out, "model.eqx"), model, header)
    summary = {
        "command": "python -m examples.motion_planning " + " ".join(args.argv),
        "args": {
            k: v for k, v in vars(args).items() if k not in ("func", "argv", "extra")
        },
        **extra,
        **header,
        "setup_s": setup,
        "train": {k: v for k, v in info.items() if k != "history"},
        "history": info["history"],
        "test": metrics,
        "machine": _machine(),
    }
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _cv_metrics(cv: dict) -> dict:
    """The test record of `violations`: each part's maximum, the mean CV and the
    share of trajectories with CV <= 1e-5."""
    return {
        **{f"cv_{k}_max": float(v.max()) for k, v in cv.items()},
        "cv_mean": float(cv["cv"].mean()),
        "pct_cv_le_1e-5": float(100 * (cv["cv"] <= 1e-5).mean()),
    }


def planner_skeleton(*, problem: dict, mlp: dict, projector: dict, map=None):
    """The planner a run's header describes, to load into (`pe.load` passes the
    header's entries as keywords): a fleet planner, or a contextual-coverage one
    when there is a `map` entry. Its weights are random; `pe.load` overwrites
    them."""
    problem = Problem(**problem)
    settings = projector_settings(projector)
    if map is not None:
        return make_map_planner(problem, **map, **mlp, **settings)
    return make_planner(problem, key=jax.random.key(0), **mlp, **settings)


def load_planner(path):
    """The planner saved by `save_planner`, and its header.

    **Raises:** `ValueError` (from `pe.load`) if the file is not a `pe.save` file,
    was saved with the other setting of `jax_enable_x64` (a `--float64` run needs
    it on), or holds other arrays than the planner its header describes.
    """
    header = {}

    def make(**stored):
        header.update(stored)
        return planner_skeleton(**stored)

    return pe.load(path, make), header


def evaluate(model, problem: Problem, starts, goals, lam: float, nu: float) -> dict:
    """Test metrics and trajectories of a trained planner.

    The trajectories come from inference mode (`n_iter_test` iterations); the CV
    is `violations` (float64, from the definitions), and the objective terms are
    means over the test contexts.
    """
    S = jnp.asarray(starts, jnp.result_type(float))
    G = jnp.asarray(goals, S.dtype)
    X = context_features(S, G, problem)
    tic = time.perf_counter()
    Y = predict(model, X, S, G)
    first = time.perf_counter() - tic
    tic = time.perf_counter()
    predict(model, X, S, G)
    infer = time.perf_counter() - tic
    cv = violations(Y, starts, goals, problem)
    terms = {
        "effort": jax.vmap(lambda y: effort(y, problem)),
        "preference": jax.vmap(lambda y: preference(y, problem)),
        "coverage": jax.vmap(lambda y: coverage(y, problem)),
        "objective": jax.vmap(fleet_objective(problem, lam, nu)),
    }
    Yj = jnp.asarray(Y, S.dtype)
    metrics = {k: float(jnp.mean(f(Yj))) for k, f in terms.items()}
    metrics.update(_cv_metrics(cv))
    metrics["inference_s"] = infer
    metrics["inference_first_call_s"] = first
    return metrics, Y


def cmd_train(args) -> dict:
    """Train one planner and score it on the test contexts."""
    if args.float64:
        jax.config.update("jax_enable_x64", True)
    problem = Problem(n_vehicles=args.vehicles, horizon=args.horizon, h=args.h)
    name = run_name(problem, args.lam, args.nu)
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    S_tr, G_tr = contexts(problem, args.n_train, args.data_seed, 0)
    S_te, G_te = contexts(problem, args.n_test, args.data_seed, 1)
    dtype = jnp.result_type(float)
    S, G = jnp.asarray(S_tr, dtype), jnp.asarray(G_tr, dtype)
    projector, mlp = _settings(args)
    tic = time.perf_counter()
    model = make_planner(
        problem,
        key=jax.random.key(args.seed),
        **mlp,
        **projector_settings(projector),
    )
    setup = time.perf_counter() - tic
    model, info = train(
        model,
        (context_features(S, G, problem), S, G),
        fleet_objective(problem, args.lam, args.nu),
        **_schedule(args),
        desc=name,
    )
    metrics, Y = evaluate(model, problem, S_te, G_te, args.lam, args.nu)
    header = {
        "problem": dataclasses.asdict(problem),
        "mlp": mlp,
        "projector": projector,
    }
    np.savez_compressed(os.path.join(out, "test.npz"), starts=S_te, goals=G_te, Y=Y)
    summary = _save_run(
        out, args, model, header, setup, info, metrics, lam=args.lam, nu=args.nu
    )
    print(
        f"{name}: trained {info['steps']} steps in {info['seconds']:.0f} s; test "
        f"objective {metrics['objective']:.4g} (effort {metrics['effort']:.4g}, "
        f"preference {metrics['preference']:.4g}, coverage {metrics['coverage']:.3f});"
        f" CV max {metrics['cv_cv_max']:.1e} (float64, from the definitions)"
    )
    return {"summary": summary, "Y": Y, "starts": S_te, "goals": G_te, "out": out}


def _load_run(run):
    with open(os.path.join(run, "metrics.json")) as f:
        summary = json.load(f)
    data = np.load(os.path.join(run, "test.npz"))
    problem = Problem(**summary["problem"])
    return summary, problem, data["starts"], data["goals"], data["Y"]


def cmd_baseline(args) -> dict:
    """Effort-optimal trajectories by OSQP for a run's test contexts, and the RS of
    the run's trajectories against them."""
    summary, problem, starts, goals, Y = _load_run(args.run)
    if summary["lam"] or summary["nu"]:
        print(
            f"note: {args.run} was trained with lambda = {summary['lam']}, nu = "
            f"{summary['nu']}; the RS below is of its effort only."
        )
    Y_star, seconds = solve_effort_qp(starts, goals, problem, eps=args.eps)
    result = relative_suboptimality(Y, Y_star, problem)
    cv_star = violations(Y_star, starts, goals, problem)["cv"]
    result.update(
        {
            "osqp_s": seconds,
            "n_contexts": len(starts),
            "qp_cv_max": float(cv_star.max()),
            "cv_max": float(violations(Y, starts, goals, problem)["cv"].max()),
            "command": "python -m examples.motion_planning " + " ".join(args.argv),
            "machine": _machine(),
        }
    )
    with open(os.path.join(args.run, "baseline.json"), "w") as f:
        json.dump(result, f, indent=2)
    np.savez_compressed(os.path.join(args.run, "qp.npz"), Y=Y_star)
    print(
        f"RS of the effort against OSQP on {len(starts)} test contexts: mean "
        f"{result['rs_mean']:.2e}, max {result['rs_max']:.2e} (OSQP {seconds:.1f} s)"
    )
    return result


def cmd_figures(args) -> list[str]:
    """The trajectory, preference and coverage figures from trained runs."""
    os.makedirs(args.out, exist_ok=True)
    runs = {}
    problem = starts = goals = None
    for run in args.runs:
        summary, problem, starts, goals, Y = _load_run(run)
        runs[f"λ = {summary['lam']:g}, ν = {summary['nu']:g}"] = Y
    tag = args.tag or f"n{problem.n_vehicles}"
    written = []
    path = os.path.join(args.out, f"trajectories_{tag}.png")
    plot_trajectories(path, problem, starts, goals, runs, contexts=args.contexts)
    written.append(path)
    last = list(runs.values())[-1]
    i = args.contexts[0]
    path = os.path.join(args.out, f"preference_{tag}.png")
    plot_preference(path, problem, last[i], starts[i], goals[i])
    written.append(path)
    path = os.path.join(args.out, f"coverage_{tag}.png")
    plot_coverage(path, problem, last[i], starts[i], goals[i])
    written.append(path)
    print("wrote " + ", ".join(written))
    return written


def cmd_suite(args) -> None:
    """Every weighting for each fleet size, the baseline of the effort-only run and
    the figures."""
    for n in args.vehicles:
        dirs = []
        for lam, nu in WEIGHTINGS:
            train_argv = [
                "train", "--vehicles", str(n), "--lam", str(lam), "--nu", str(nu),
                "--epochs", str(args.epochs), "--out", args.out,
            ] + args.extra  # fmt: skip
            dirs.append(main(train_argv)["out"])
        main(["baseline", "--run", dirs[0]])
        main(
            ["figures", "--runs", *dirs, "--out", args.figures, "--contexts", "0", "1"]
        )


def _projector_cost(horizon: int, h: float, per_axis: bool) -> dict:
    """Build one projector in this (fresh) process: its time and peak memory."""
    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    problem = Problem(n_vehicles=1, horizon=horizon, h=h)
    tic = time.perf_counter()
    projector = make_projector(problem, per_axis=per_axis)
    seconds = time.perf_counter() - tic
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Its arrays, the constraint data and factorisation (stored frozen, as bit
    # patterns of the same size), and the lifted problem's row counts.
    arrays = [x for x in jax.tree.leaves(projector) if isinstance(x, jax.Array)]
    n_eq, n_ineq = projector.problem.n_eq, projector.problem.n_ineq
    return {
        "horizon": horizon,
        "per_axis": per_axis,
        "projections_per_vehicle": 2 if per_axis else 1,
        "variables": projector.dim,
        "equalities": n_eq,
        "inequalities_lifted": n_ineq,
        "lifted_matrix": [n_eq + n_ineq, projector.dim + n_ineq],
        "construction_s": seconds,
        "peak_rss_increase_mib": (peak_kib - baseline_kib) / 1024,
        "projector_arrays_mib": sum(x.nbytes for x in arrays) / 2**20,
        "affine_form": type(projector.op).__name__,
    }


def cmd_construction(args) -> list[dict]:
    """Time and memory of building the vehicle projector, joint and per axis.

    Each build runs in a fresh process, so its peak resident memory is its own
    (the increase over the process after importing JAX is reported).
    """
    rows = []
    spawn = multiprocessing.get_context("spawn")
    for horizon in args.horizons:
        for per_axis in (True, False):
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
                row = pool.submit(_projector_cost, horizon, args.h, per_axis).result()
            rows.append(row)
            print(
                f"T = {horizon}, {'per axis' if per_axis else 'joint'}: "
                f"{row['variables']} variables, lifted matrix "
                f"{row['lifted_matrix'][0]} x {row['lifted_matrix'][1]}, built in "
                f"{row['construction_s']:.2f} s, peak memory +"
                f"{row['peak_rss_increase_mib']:.0f} MiB, arrays "
                f"{row['projector_arrays_mib']:.1f} MiB"
            )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "machine": _machine()}, f, indent=2)
    return rows


def _closest_approach(Y, centers, problem: Problem) -> np.ndarray:
    """The smallest distance of each trajectory to its map's centre, `(n,)`."""
    p, _, _ = split(np.asarray(Y), problem)
    return np.linalg.norm(p[:, 0] - centers[:, None], axis=-1).min(-1)


def cmd_context(args) -> dict:
    """Train a contextual-coverage planner and score it on test contexts."""
    if args.float64:
        jax.config.update("jax_enable_x64", True)
    problem = Problem(n_vehicles=1, horizon=args.horizon, h=args.h)
    name = f"context_H{args.horizon}_res{args.res}_D{args.downsample}"
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    rng_tr = np.random.default_rng([args.data_seed, 0])
    rng_te = np.random.default_rng([args.data_seed, 1])
    ids_tr, S_tr, G_tr = sample_map_contexts(rng_tr, args.n_train, problem)
    ids_te, S_te, G_te = sample_map_contexts(rng_te, args.n_test, problem)
    dtype = jnp.result_type(float)
    table = make_map_table(args.res, problem)
    projector, mlp = _settings(args)
    cnn = {"res": args.res, "downsample": args.downsample, "seed": args.seed}
    tic = time.perf_counter()
    model = make_map_planner(
        problem,
        per_axis=not args.joint,
        raw_from=args.raw,
        **cnn,
        **mlp,
        **projector_settings(projector),
    )
    setup = time.perf_counter() - tic

    def objective(Y, x):
        return map_cost(Y, x, problem)

    S, G = jnp.asarray(S_tr, dtype), jnp.asarray(G_tr, dtype)
    model, info = train(
        model,
        (map_inputs(ids_tr, S, G, problem), S, G),
        objective,
        **_schedule(args),
        lookup=table,
        desc=name,
    )
    S, G = jnp.asarray(S_te, dtype), jnp.asarray(G_te, dtype)
    X = map_inputs(ids_te, S, G, problem)
    Y = predict(model, X, S, G, lookup=table)
    tic = time.perf_counter()
    predict(model, X, S, G, lookup=table)
    infer = time.perf_counter() - tic
    # The effort-optimal path ignores the map: what the CNN has to beat.
    Y_ref = np.stack(
        [feasible_trajectory(s[0], g[0], problem) for s, g in zip(S_te, G_te)]
    )[:, None]
    inputs = table(X)
    cost = np.asarray(jax.vmap(objective)(jnp.asarray(Y, dtype), inputs))
    cost_ref = np.asarray(jax.vmap(objective)(jnp.asarray(Y_ref, dtype), inputs))
    cv = violations(Y, S_te, G_te, problem)
    centers = CENTERS[ids_te]
    near = _closest_approach(Y, centers, problem)
    near_ref = _closest_approach(Y_ref, centers, problem)
    weights = np.asarray(jax.vmap(model.backbone.weights)(table.maps))
    metrics = {
        "map_value_mean": float(-cost.mean()),
        "map_value_mean_straight": float(-cost_ref.mean()),
        "pct_better_than_straight": float(100 * (cost < cost_ref).mean()),
        "closest_approach_mean": float(near.mean()),
        "closest_approach_max": float(near.max()),
        "closest_approach_mean_straight": float(near_ref.mean()),
        "cnn_softmax_per_map": weights.tolist(),
        **_cv_metrics(cv),
        "inference_s": infer,
        "n_test": args.n_test,
    }
    header = {
        "problem": dataclasses.asdict(problem),
        "map": {**cnn, "per_axis": not args.joint, "raw_from": args.raw},
        "mlp": mlp,
        "projector": projector,
    }
    np.savez_compressed(
        os.path.join(out, "test.npz"), starts=S_te, goals=G_te, map_ids=ids_te, Y=Y
    )
    figure = os.path.join(args.figures, f"{name}.png")
    os.makedirs(args.figures, exist_ok=True)
    plot_context_maps(
        figure, problem, table.maps, Y, S_te, G_te, ids_te, reference=Y_ref
    )
    summary = _save_run(out, args, model, header, setup, info, metrics, figure=figure)
    print(
        f"{name}: model built in {setup:.1f} s; trained {info['steps']} steps in "
        f"{info['seconds']:.0f} s; test map value {metrics['map_value_mean']:.3f} "
        f"(straight paths {metrics['map_value_mean_straight']:.3f}, better on "
        f"{metrics['pct_better_than_straight']:.0f}%); closest approach to the "
        f"centre {metrics['closest_approach_mean']:.2f} (straight "
        f"{metrics['closest_approach_mean_straight']:.2f}); CV max "
        f"{metrics['cv_cv_max']:.1e} (float64); figure {figure}"
    )
    return {"summary": summary, "Y": Y, "out": out}


def _training_options(p, *, epochs, n_train, batch_size, lr, residual_weight):
    """The options `train` and `context` share, with their own defaults."""
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--n-train", type=int, default=n_train, help="training contexts")
    p.add_argument("--n-test", type=int, default=256, help="test contexts")
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--lr", type=float, default=lr, help="Adam learning rate")
    p.add_argument(
        "--residual-weight",
        type=float,
        default=residual_weight,
        help="weight of |y_raw - y|^2 in the loss (0: the paper's loss)",
    )
    p.add_argument("--width", type=int, default=256, help="MLP hidden width")
    p.add_argument("--depth", type=int, default=2, help="MLP hidden layers")
    p.add_argument("--n-iter", type=int, default=PROJECTOR["n_iter"])
    p.add_argument("--n-iter-test", type=int, default=PROJECTOR["n_iter_test"])
    p.add_argument(
        "--bwd-max-steps",
        type=int,
        default=PROJECTOR["bwd_max_steps"],
        help="step limit of the implicit backward solve (default: the adjoint's)",
    )
    p.add_argument("--sigma", type=float, default=PROJECTOR["sigma"])
    p.add_argument("--time-budget", type=float, help="stop training after (s)")
    p.add_argument("--seed", type=int, default=0, help="initialisation, shuffling")
    p.add_argument("--data-seed", type=int, default=0, help="the contexts")
    p.add_argument("--float64", action="store_true", help="train in float64")
    p.add_argument("--out", default="results/motion_planning")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m examples.motion_planning",
        description="Multi-vehicle motion planning with hard constraints (paper "
        "Sec. 3.2, App. B.3).",
    )
    sub = p.add_subparsers(required=True, metavar="command")

    t = sub.add_parser("train", help="train a planner for one weighting")
    t.add_argument("--vehicles", type=int, default=5, help="N")
    t.add_argument("--horizon", type=int, default=25, help="T")
    t.add_argument("--h", type=float, default=0.25, help="step length")
    t.add_argument("--lam", type=float, default=0.0, help="preference weight λ")
    t.add_argument("--nu", type=float, default=0.0, help="coverage weight ν")
    _training_options(
        t, epochs=30, n_train=2048, batch_size=64, lr=3e-3, residual_weight=0.1
    )
    t.set_defaults(func=cmd_train)

    b = sub.add_parser("baseline", help="RS of a run's effort against OSQP")
    b.add_argument("--run", required=True, help="a folder written by `train`")
    b.add_argument("--eps", type=float, default=1e-9, help="OSQP tolerance")
    b.set_defaults(func=cmd_baseline)

    f = sub.add_parser("figures", help="trajectory, preference and coverage PNGs")
    f.add_argument("--runs", nargs="+", required=True, help="`train` folders")
    f.add_argument("--out", default="results/motion_planning/figures")
    f.add_argument("--contexts", type=int, nargs="+", default=[0, 1])
    f.add_argument("--tag", help="file-name suffix (default n<N>)")
    f.set_defaults(func=cmd_figures)

    s = sub.add_parser(
        "suite",
        help="all weightings, the baseline and figures; other options go to `train`",
    )
    s.add_argument("--vehicles", type=int, nargs="+", default=[5, 15])
    s.add_argument("--epochs", type=int, default=30)
    s.add_argument("--out", default="results/motion_planning")
    s.add_argument("--figures", default="results/motion_planning/figures")
    s.set_defaults(func=cmd_suite)

    c = sub.add_parser(
        "context",
        help="contextual coverage: one vehicle, a map seen by a CNN (App. B.3)",
    )
    c.add_argument("--horizon", type=int, default=100, help="H (750: long case)")
    c.add_argument("--h", type=float, default=0.25, help="step length")
    c.add_argument("--res", type=int, default=1024, help="map side (pixels)")
    c.add_argument("--downsample", type=int, default=4, help="CNN stride D")
    _training_options(
        c, epochs=10, n_train=1024, batch_size=32, lr=1e-3, residual_weight=1e-3
    )
    c.add_argument("--figures", default="results/motion_planning/figures")
    c.add_argument(
        "--joint",
        action="store_true",
        help="project both coordinates together (default: per axis, same result)",
    )
    c.add_argument(
        "--raw",
        choices=("acceleration", "trajectory"),
        default="acceleration",
        help="the MLP predicts accelerations, rolled out (the paper's), or the "
        "whole raw trajectory (better conditioned for long horizons)",
    )
    c.set_defaults(func=cmd_context)

    k = sub.add_parser(
        "construction",
        help="time and memory of building the projector, joint and per axis",
    )
    k.add_argument("--horizons", type=int, nargs="+", default=[25, 100, 750])
    k.add_argument("--h", type=float, default=0.25, help="step length")
    k.add_argument("--out", default="results/motion_planning/construction.json")
    k.set_defaults(func=cmd_construction)
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    # `suite` passes the options it does not know to `train`.
    args, extra = parser().parse_known_args(argv)
    if extra and args.func is not cmd_suite:
        parser().error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    args.argv = argv
    return args.func(args)
