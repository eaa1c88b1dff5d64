"""The paper's ablation studies, run with our library (App. H.3, H.4, I.3, F.3).

    python -m benchmarks.dc3 ablations --size small [--which config ...] [--quick]

Studies (`--which`, repeatable; all by default): `config`, Default / Auto /
Auto+equilibration trained end to end (App. H.3), and `inf`, soft-penalty training
with the projection only at inference (App. H.4), both into `OUT/runs` for
`report`; `n_iter_test`, one network evaluated with other test-time iteration
counts; `sigma_omega`, the projection's violation and suboptimality after 50
iterations over the sigma grid for several omega; `vjp`, the fixed-point VJP's
error against float64 central differences as `max_steps` grows (App. I.3), beside
the default active-set VJP's; `cv_iters`, the violation against forward iterations
(App. F.3); `mechanisms`, one network at the library defaults evaluated with each
inference mechanism switched off in turn; `train_iterations`, the library
defaults trained with fewer iterations, and with the training polish.

Each study writes `OUT/{study}.json` (and a figure, `OUT/{study}.png`), and
`OUT/ablations.md` collects their tables.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import pinet_eqx as pe

from .._common import plots, records
from .._common.provenance import command_line, describe, machine
from .._common.timing import time_calls
from . import _data, _pinet
from ._train import PROG, train

STUDIES = ("config", "inf", "n_iter_test", "sigma_omega", "vjp", "cv_iters")
STUDIES += ("mechanisms", "train_iterations")
CONFIGS = {
    "pinet-default": {
        "sigma": 1.0,
        "n_iter": 100,
        "n_iter_test": 100,
        "equilibrate": False,
    },
    "pinet-auto": {"equilibrate": False, "autotune": True},
    "pinet-auto-eq": {"equilibrate": True, "autotune": True},
}


def _figure(ncols=1):
    fig, axes = plots.new(5.0 * ncols, 3.8, ncols=ncols)
    return fig, axes[0]


def _points(data: _data.Dataset, n: int, seed: int, dtype):
    """The App. H.2 tuning points: validation contexts and standard-normal y."""
    X = jnp.asarray(data.X_valid[:n], dtype)
    Y = jax.random.normal(jax.random.key(seed), (X.shape[0], data.problem.n_var), dtype)
    return X, Y


def _train(args, out, label, overrides, method="pinet", repeats=5):
    """`train` `method` into `OUT/runs` with `overrides` and the studies' epochs."""
    overrides = {**overrides, **_epochs(args)}
    where = dict(label=label, out=out / "runs", repeats=repeats)
    return train(args.problem, args.size, method, overrides=overrides, **where)


def _train_rows(args, out, runs) -> dict:
    """Train `(label, method, overrides)` each into `OUT/runs`; one `_row` each."""
    repeats, rows = 5 if args.quick else 20, []
    for label, method, overrides in runs:
        record, _, _ = _train(args, out, label, overrides, method, repeats)
        rows.append(_row(label or method, record))
    return {"rows": rows}


def study_config(args, data, out):
    return _train_rows(args, out, [(k, "pinet", v) for k, v in CONFIGS.items()])


def study_inf(args, data, out):
    return _train_rows(args, out, [(None, m, {}) for m in ("pinet", "soft")])


def _epochs(args) -> dict:
    """The epochs override of the training studies (`--epochs`, `--quick`)."""
    if getattr(args, "epochs", None):
        return {"epochs": args.epochs}
    return {"epochs": 5} if args.quick else {}


def _row(label, record):
    m, t = record["metrics"], record["timing"]
    row = {"label": label, **{k: m[k] for k in ("rs_mean", "cv_max", "optimal_pct")}}
    row.update(train_s=t["train_s"], batch_s=t["inference"]["batch"]["median"])
    return {**row, "info": record["info"]}


def study_n_iter_test(args, data, out):
    overrides = {"n_iter": 50, "n_iter_test": 50}
    _, _, trained = _train(args, out, "pinet-n-iter-50", overrides)
    net = trained.model
    dtype = jnp.result_type(float)
    X = jnp.asarray(data.X_test, dtype)
    predict = eqx.filter_jit(lambda m, X: jax.vmap(lambda x: m(x, b=x))(X))
    rows = []
    for k in (10, 20, 30, 40, 50, 75, 100, 200):
        model = eqx.tree_at(
            lambda n: n.projector, net, net.projector.with_settings(n_iter_test=k)
        )
        Y = predict(model, X)
        metrics = data.test_metrics(Y).summary()
        timing = time_calls(lambda: predict(model, X), 5 if args.quick else 20)
        rows.append({"n_iter_test": k, **metrics, "batch_s": timing["median"]})
    fig, (ax1, ax2) = _figure(2)
    ks = [r["n_iter_test"] for r in rows]
    ax1.semilogy(ks, [r["rs_mean"] for r in rows], "o-")
    ax1.set(xlabel="n_iter_test (trained with 50)", ylabel="test mean RS")
    ax2.semilogy(ks, [r["cv_max"] for r in rows], "o-", color="C1")
    ax2.set(xlabel="n_iter_test (trained with 50)", ylabel="test max CV")
    plots.save(fig, out / "n_iter_test.png")
    return {"rows": rows}


# The inference settings of the `mechanisms` study: the defaults, then each
# default mechanism switched off (`with_settings` keywords).
MECHANISMS = {
    "defaults": {},
    "polish=False": {"polish": False},
    "refine=False (no polish either)": {"refine": False},
    "tol_test=None": {"tol_test": None},
    "tol_test=None, refine=False": {"tol_test": None, "refine": False},
}


@eqx.filter_jit
def _solve_test(model, X):
    """The `ProjectionSolution`s of a DC3 network on `X`, in the model's mode."""
    y_raw = jax.vmap(model.backbone)(X)
    return jax.vmap(lambda y, x: model.projector.solve(y, b=x))(y_raw, X)


def _successful_pct(sol) -> float:
    """The share of `sol`'s instances reported `RESULTS.successful`, in %."""
    return 100 * float(np.mean(np.asarray(sol.result == pe.RESULTS.successful)))


def study_mechanisms(args, data, out):
    overrides = {"library_defaults": True, "batch_size": 2048}
    _, _, trained = _train(args, out, "pinet-library-defaults", overrides)
    net = eqx.nn.inference_mode(trained.model)
    dtype = jnp.result_type(float)
    X = jnp.asarray(data.X_test, dtype)

    rows = []
    for label, settings in MECHANISMS.items():
        model = eqx.tree_at(
            lambda n: n.projector, net, net.projector.with_settings(**settings)
        )
        sol = _solve_test(model, X)
        metrics = data.test_metrics(sol.y).summary()
        timing = time_calls(lambda: _solve_test(model, X), 5 if args.quick else 20)
        n_iter_max = int(np.max(np.asarray(sol.n_iter)))
        row = {"label": label, **metrics, "successful_pct": _successful_pct(sol)}
        rows.append({**row, "n_iter_max": n_iter_max, "batch_s": timing["median"]})
    return {"rows": rows}


# The (training iterations, polish) of the `train_iterations` study; (50,
# "auto") is the library's default, and 50 the paper's.
TRAIN_SETTINGS = (*((k, "auto") for k in (10, 20, 30, 50)), (10, True), (20, True))


def study_train_iterations(args, data, out):
    dtype = jnp.result_type(float)
    X = jnp.asarray(data.X_test, dtype)
    rows = []
    for k, polish in TRAIN_SETTINGS:
        tag = "" if polish == "auto" else "-polish"
        overrides = {"library_defaults": True, "batch_size": 2048}
        overrides.update(library_n_iter=k, library_polish=polish)
        label = f"pinet-library-defaults-n-iter-{k}{tag}"
        record, _, trained = _train(args, out, label, overrides)
        # The outputs the loss saw: training mode, k iterations.
        sol = _solve_test(eqx.nn.inference_mode(trained.model, False), X)
        cv = data.test_metrics(sol.y).cv
        row = {
            **_row(f"n_iter={k}, polish={polish!r}", record),
            "train_cv": float(np.max(cv)),
            "train_cv_median": float(np.median(cv)),
            "train_successful_pct": _successful_pct(sol),
        }
        rows.append({"n_iter": k, "polish": polish, **row})
    return {"rows": rows}


def study_sigma_omega(args, data, out):
    dtype = jnp.result_type(float)
    X, Y = _points(data, 150, 0, dtype)
    config = _pinet.default_config(data)
    base = _pinet.make_projector(data, config)
    grid = np.geomspace(1e-3, 5.05, 25 if args.quick else 50)
    rows = []
    fig, (ax1, ax2) = _figure(2)
    for i, omega in enumerate((1.0, 1.3, 1.5, 1.7, 1.9)):
        sweep = dict(sigmas=grid, n_iters=(50,), tune_iter=50)
        result = pe.autotune(base.with_settings(omega=omega), Y, {"b": X}, **sweep)
        rows.append({
            "omega": omega,
            "sigma": grid.tolist(),
            "violation": result.sigma_violation.tolist(),
            "suboptimality": result.sigma_suboptimality.tolist(),
            "chosen_sigma": result.sigma,
            "seconds": result.seconds,
        })  # fmt: skip
        ax1.loglog(grid, result.sigma_violation, color=f"C{i}", label=f"ω={omega}")
        ax2.loglog(grid, result.sigma_suboptimality, color=f"C{i}")
    ax1.set(xlabel="σ", ylabel="max CV after 50 iterations")
    ax2.set(xlabel="σ", ylabel="mean |dist/dist* − 1| after 50 iterations")
    ax1.legend(fontsize=8)
    plots.save(fig, out / "sigma_omega.png")
    return {"rows": rows, "points": 150, "n_iter": 50}


def study_vjp(args, data, out):
    if not jax.config.jax_enable_x64:
        # x64 is global in JAX; run this study in a float64 process of its own.
        command = [sys.executable, "-m", "benchmarks.dc3", "ablations", "--which"]
        command += ["vjp", "--precision", "64", "--size", args.size, "--problem"]
        command += [args.problem, "--out", str(out)] + ["--quick"] * args.quick
        subprocess.run(command, check=True)
        return json.loads((out / "vjp.json").read_text())
    config = _pinet.default_config(data)
    x = jnp.asarray(data.X_valid[0])
    y_raw = jax.random.normal(jax.random.key(1), (data.problem.n_var,)) * 2
    v = jax.random.normal(jax.random.key(2), (data.problem.n_var,))
    exact = _pinet.make_projector(data, config).with_settings(
        tol=1e-13, n_iter=20000, n_iter_test=20000
    )
    # Central differences of <v, Pi(y)> along each coordinate, on the converged map.
    f = jax.jit(lambda y: jnp.dot(v, exact(y, b=x)))
    eps = 1e-6
    eye = jnp.eye(data.problem.n_var)
    n_dirs = 20 if args.quick else data.problem.n_var
    fd = [(f(y_raw + eps * e) - f(y_raw - eps * e)) / (2 * eps) for e in eye[:n_dirs]]
    fd = np.array(fd)

    def rel_error(proj):
        g = jax.grad(lambda y: jnp.dot(v, proj(y, b=x)))(y_raw)
        g = np.asarray(g)[:n_dirs]
        return float(np.linalg.norm(g - fd) / np.linalg.norm(fd))

    rows = []
    for k in (1, 2, 5, 10, 25, 50, 100, 200):
        adjoint = pe.ImplicitAdjoint(
            method="fixed_point", max_steps=k, on_failure="ignore", rtol=1e-12
        )
        error = rel_error(exact.with_settings(adjoint=adjoint))
        rows.append({"max_steps": k, "rel_error": error})
    # The default adjoint: the exact active-set derivative.
    active_set = rel_error(exact.with_settings(adjoint=pe.ImplicitAdjoint()))
    fig, (ax,) = _figure(1)
    steps, errors = [r["max_steps"] for r in rows], [r["rel_error"] for r in rows]
    ax.loglog(steps, errors, "o-", label="fixed point (BiCGStab)")
    ax.axhline(active_set, color="k", ls="--", label="active set (default)")
    ax.set(
        xlabel="max_steps (BiCGStab steps on the fixed point)",
        ylabel="‖VJP − FD‖ / ‖FD‖ (float64)",
    )
    ax.legend()
    plots.save(fig, out / "vjp.png")
    result = {"rows": rows, "active_set_rel_error": active_set}
    result.update(fd_step=eps, directions=n_dirs)
    (out / "vjp.json").write_text(json.dumps(result, indent=2))
    return result


def study_cv_iters(args, data, out):
    dtype = jnp.result_type(float)
    X, Y = _points(data, 150, 0, dtype)
    config = _pinet.default_config(data)
    ks = (1, 2, 5, 10, 20, 50, 100, 200, 500)
    rows = []
    fig, (ax,) = _figure(1)
    settings = {
        "equilibrated, paper sigma": {},
        "not equilibrated, sigma 1": {"equilibrate": False, "sigma": 1.0},
    }
    for i, (name, overrides) in enumerate(settings.items()):
        proj = _pinet.make_projector(data, config.replace(**overrides))
        project = eqx.filter_jit(lambda p, Y, X: jax.vmap(lambda y, x: p(y, b=x))(Y, X))
        cv = []
        for k in ks:
            Yk = project(proj.with_settings(n_iter=k, n_iter_test=k), Y, X)
            cv.append(float(data.violation(Yk, np.asarray(X, np.float64)).max()))
        rows.append({"setting": name, "n_iter": list(ks), "cv_max": cv})
        ax.loglog(ks, cv, "o-", color=f"C{i}", label=name)
    ax.set(xlabel="forward iterations", ylabel="max CV (150 points)")
    ax.legend(fontsize=8)
    plots.save(fig, out / "cv_iters.png")
    return {"rows": rows}


def _section(title: str, columns: list[str], rows: list[list]) -> list[str]:
    """A Markdown section `title` holding one table, and a blank line after."""
    return [f"## {title}", "", records.table(columns, rows), ""]


def _tuned(info: dict) -> str:
    if "sigma_used" not in info:
        return ""
    return f"{info['sigma_used']:.4g} / {info.get('n_iter_used', '')}"


def _markdown(results: dict, args, provenance: dict) -> str:
    where = f"{describe(provenance)}, float{args.precision}"
    lines = [f"# Ablations on DC3 {args.problem}-{args.size}", ""]
    lines += [f"`{command_line(PROG)}` on {where}.", ""]
    get = {k: v["rows"] for k, v in results.items()}.get
    for study in ("config", "inf"):
        if study in results:
            lines += _section(
                study,
                ["Label", "Mean RS", "Max CV", "Optimal [%]", "Training [s]",
                 "Batch-1024 [s]", "sigma / n_iter"],
                [[f"`{r['label']}`", f"{r['rs_mean']:.2e}", f"{r['cv_max']:.1e}",
                  f"{r['optimal_pct']:.1f}", f"{r['train_s']:.1f}",
                  f"{r['batch_s']:.4f}", _tuned(r["info"])] for r in get(study)],
            )  # fmt: skip
    if "n_iter_test" in results:
        lines += _section(
            "n_iter_test (trained with 50)",
            ["n_iter_test", "Mean RS", "Max CV", "Optimal [%]", "Batch-1024 [s]"],
            [
                [r["n_iter_test"], f"{r['rs_mean']:.2e}", f"{r['cv_max']:.1e}",
                 f"{r['optimal_pct']:.1f}", f"{r['batch_s']:.4f}"]
                for r in get("n_iter_test")
            ],
        )  # fmt: skip
    if "mechanisms" in results:
        lines += _section(
            "Inference mechanisms (one network, library defaults)",
            ["inference settings", "Mean RS", "Max CV", "successful [%]",
             "max iterations", "test set [s]"],
            [
                [r["label"], f"{r['rs_mean']:.5e}", f"{r['cv_max']:.1e}",
                 f"{r['successful_pct']:.1f}", r["n_iter_max"], f"{r['batch_s']:.4f}"]
                for r in get("mechanisms")
            ],
        )  # fmt: skip
    if "train_iterations" in results:
        lines += _section(
            "Training iterations (library defaults otherwise; inference unchanged)",
            ["n_iter (training)", "polish", "Mean RS", "Max CV (inference)",
             "Optimal [%]", "training mode: max / median CV, successful [%]",
             "Training [s]"],
            [
                [r["n_iter"], repr(r["polish"]), f"{r['rs_mean']:.4e}",
                 f"{r['cv_max']:.1e}", f"{r['optimal_pct']:.1f}",
                 f"{r['train_cv']:.1e} / {r['train_cv_median']:.1e}, "
                 f"{r['train_successful_pct']:.1f}",
                 f"{r['train_s']:.1f}"]
                for r in get("train_iterations")
            ],
        )  # fmt: skip
    if "sigma_omega" in results:
        best = [(r, int(np.argmin(r["violation"]))) for r in get("sigma_omega")]
        lines += _section(
            "sigma and omega (projection only, 50 iterations)",
            ["omega", "best sigma", "its max CV", "sweep time [s]"],
            [[r["omega"], f"{r['sigma'][i]:.3g}", f"{r['violation'][i]:.1e}",
              f"{r['seconds']:.1f}"] for r, i in best],
        )  # fmt: skip
    if "vjp" in results:
        active_set = ["active set (default)"]
        active_set.append(f"{results['vjp']['active_set_rel_error']:.1e}")
        lines += _section(
            "VJP error against float64 central differences",
            ["adjoint", "relative error"],
            [[f"fixed point, max_steps = {r['max_steps']}", f"{r['rel_error']:.1e}"]
             for r in get("vjp")] + [active_set],
        )  # fmt: skip
    if "cv_iters" in results:
        rows = get("cv_iters")
        lines += _section(
            "Max CV against forward iterations",
            ["iterations", *(r["setting"] for r in rows)],
            [[k, *(f"{r['cv_max'][j]:.1e}" for r in rows)]
             for j, k in enumerate(rows[0]["n_iter"])],
        )  # fmt: skip
    return "\n".join(lines)


def run_ablations(args) -> dict:
    """Run the studies named in `args.which` (all by default); see the module doc."""
    studies = args.which or list(STUDIES)
    unknown = set(studies) - set(STUDIES)
    if unknown:
        raise SystemExit(
            f"Unknown ablation(s) {sorted(unknown)}; choose from {STUDIES}."
        )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = _data.load(args.problem, args.size)
    results = {}
    for study in studies:
        start = time.perf_counter()
        print(f"== ablation {study} on {data.name}")
        results[study] = globals()[f"study_{study}"](args, data, out)
        results[study]["seconds"] = time.perf_counter() - start
        (out / f"{study}.json").write_text(json.dumps(results[study], indent=2))
    # Studies run earlier into the same folder stay in the summary.
    for study in STUDIES:
        path = out / f"{study}.json"
        if study not in results and path.exists():
            results[study] = json.loads(path.read_text())
    (out / "ablations.md").write_text(_markdown(results, args, machine()))
    print(f"-> {out / 'ablations.md'}")
    return results
