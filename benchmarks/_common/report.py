"""Figures and Markdown tables from a folder of a training suite's results
(`harness.write_results`): per data set `scatter_{dataset}.png` (per-instance
test CV against RS, the paper's scatter) and `curves_{dataset}.png` (validation
mean RS and max CV against training time), and one `tables.md`."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import pathlib
import re
import warnings

import numpy as np

from . import plots, records
from .metrics import CV_OPTIMAL, RS_OPTIMAL
from .timing import TIMING_STATS

LOG_FLOOR = 1e-10  # zeros are drawn here on log axes
TIMING_COLUMNS = TIMING_STATS[:5]
_REQUIRED_METRICS = ("rs_mean", "cv_max", "optimal_pct")
_CURVE_POINTS = 200  # common time grid on which seeds are averaged
_THRESHOLD = {"color": "red", "linestyle": "--", "linewidth": 1}


@dataclasses.dataclass(frozen=True)
class Suite:
    """What a report is about: its `title`, the command `prog` that makes its runs
    (for messages) and the order of its `methods` in figures and tables (methods
    not listed come last)."""

    title: str
    prog: str
    methods: tuple[str, ...]
    folder: str = ""  # the suite's folder in benchmarks/, for its record


@dataclasses.dataclass
class _Run:
    """One training run: its record and its per-instance test RS and CV."""

    path: pathlib.Path
    record: dict
    dataset: str
    label: str
    method: str
    precision: int | None
    seed: int
    rs: np.ndarray
    cv: np.ndarray

    @property
    def key(self) -> tuple[str, int | None]:
        """The series this run belongs to within its data set."""
        return (self.label, self.precision)


def report(results_dir, out_dir, suite: Suite, record=False) -> list[pathlib.Path]:
    """Write the figures and tables of every run below `results_dir` to `out_dir`
    (default `results_dir`), with `record` also the suite's record `tables` and
    its page; returns the paths written (see `load_runs` for errors)."""
    results_dir = pathlib.Path(results_dir)
    out_dir = results_dir if out_dir is None else pathlib.Path(out_dir)
    runs = load_runs(results_dir, suite.prog)
    datasets = _group(runs, suite.methods)
    styles = _styles(runs, suite.methods)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, series in datasets.items():
        stem = _file_stem(name)
        written.append(_scatter(name, series, styles, out_dir / f"scatter_{stem}.png"))
        curves = _curves(name, series, styles, out_dir / f"curves_{stem}.png")
        if curves is not None:
            written.append(curves)
    tables = out_dir / "tables.md"
    tables.write_text(markdown(datasets, results_dir, suite))
    written.append(tables)
    if record:
        written += write_record(tables.read_text(), suite, results_dir)
    return written


def write_record(text: str, suite: Suite, results_dir) -> list[pathlib.Path]:
    """The tables (`markdown`'s text) as the suite's committed record `tables`,
    one heading level down (they sit under the record's title); then its page."""
    from . import provenance

    body = re.sub(r"^#", "##", text.split("\n", 1)[1], flags=re.M)
    fields = dict(command=f"{suite.prog} report {results_dir} --record")
    fields.update(
        machine="per run, in the tables", date=datetime.date.today().isoformat()
    )
    fields["commit"] = provenance.git_commit()
    return records.write_run(suite.folder, "tables", "Full tables", 2, body, **fields)


def load_runs(results_dir: pathlib.Path, prog: str) -> list[_Run]:
    """Every readable run below `results_dir`; unreadable ones are warned about.
    Raises `FileNotFoundError` if there is no `results.json` (naming `prog`), and
    `ValueError` if none can be read."""
    if not results_dir.is_dir():
        raise FileNotFoundError(f"Results folder {str(results_dir)!r} does not exist.")
    # Shallowest first, so that of two copies of a run the one in the standard
    # layout `{dataset}/{label}/seed{seed}` is kept.
    paths = sorted(results_dir.rglob("results.json"), key=lambda p: (len(p.parts), p))
    if not paths:
        raise FileNotFoundError(
            f"No results.json found under {str(results_dir)!r}: run "
            f"`{prog} train ...` first, or point at its output."
        )
    runs: list[_Run] = []
    seen: dict[tuple, pathlib.Path] = {}
    for path in paths:
        try:
            run = _read_run(path)
        except (OSError, ValueError, KeyError, TypeError) as error:
            warnings.warn(f"Skipping {path.parent}: {error}", stacklevel=3)
            continue
        ident = (run.dataset, run.label, run.precision, run.seed)
        if ident in seen:
            # Copies of a run (a folder copied inside the results tree, say) would
            # otherwise count twice in the statistics over seeds.
            warnings.warn(
                f"Skipping {path.parent}: same data set, label, precision and seed "
                f"as {seen[ident].parent}",
                stacklevel=3,
            )
            continue
        seen[ident] = path
        runs.append(run)
    if not runs:
        raise ValueError(
            f"None of the {len(paths)} results.json files under {str(results_dir)!r} "
            "could be read (see the warnings)."
        )
    return runs


def _read_run(path: pathlib.Path) -> _Run:
    """Read one run folder; raise on anything missing or malformed."""
    with open(path) as f:
        record = json.load(f)  # a truncated file raises ValueError here
    if not isinstance(record, dict):
        raise ValueError("results.json does not hold an object")
    metrics = record["metrics"]
    for key in _REQUIRED_METRICS:
        if key not in metrics:
            raise KeyError(f"metrics has no {key!r}")
    csv = path.parent / "per_instance.csv"
    if not csv.exists():
        raise FileNotFoundError(f"no {csv.name}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy warns on an empty file; we raise
        table = np.loadtxt(csv, delimiter=",", skiprows=1, ndmin=2)
    if table.shape[0] == 0 or table.shape[1] != 3:
        raise ValueError(
            f"{csv.name} is empty or does not have the columns index,rs,cv"
        )
    method = record.get("method") or record["label"]
    precision = record.get("precision")
    precision = None if precision is None else int(precision)
    names = str(record["dataset"]["name"]), str(record.get("label") or method)
    seed, rs, cv = int(record["seed"]), table[:, 1], table[:, 2]
    return _Run(path, record, *names, str(method), precision, seed, rs, cv)


def _group(
    runs: list[_Run], methods: tuple[str, ...]
) -> dict[str, dict[tuple, list[_Run]]]:
    """Runs by data set, then by series (label, precision), each sorted by seed."""
    datasets: dict[str, dict[tuple, list[_Run]]] = {}
    for run in sorted(runs, key=lambda run: _order(run, methods)):
        datasets.setdefault(run.dataset, {}).setdefault(run.key, []).append(run)
    return dict(sorted(datasets.items()))


def _order(run: _Run, methods: tuple[str, ...]) -> tuple:
    """Sort key: methods in `methods` order, then label, precision and seed."""
    rank = methods.index(run.method) if run.method in methods else len(methods)
    return (rank, run.method, run.label, run.precision or 0, run.seed)


def _display(key: tuple[str, int | None], series: dict[tuple, list[_Run]]) -> str:
    """The label, with the precision when the label runs at several in one table."""
    label, precision = key
    precisions = {p for (other, p) in series if other == label}
    if len(precisions) > 1 and precision is not None:
        return f"{label} (float{precision})"
    return label


def _file_stem(name: str) -> str:
    """`name` made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _styles(runs: list[_Run], methods: tuple[str, ...]) -> dict:
    """A colour and marker per series, the same in every data set's figures."""
    import matplotlib

    colours = matplotlib.colormaps["tab10"].colors
    markers = "o^sDv<>ph*"
    ordered = sorted(runs, key=lambda run: _order(run, methods))
    keys = list(dict.fromkeys(run.key for run in ordered))
    return {
        key: {"color": colours[i % len(colours)], "marker": markers[i % len(markers)]}
        for i, key in enumerate(keys)
    }


def _scatter(name, series, styles, path: pathlib.Path) -> pathlib.Path:
    """The per-instance CV/RS scatter of the lowest seed of each series."""
    from matplotlib.ticker import NullLocator

    fig, ((ax,),) = plots.new(6.4, 5.2, dpi=150, layout="constrained")
    for key, runs in series.items():
        run = runs[0]  # the lowest seed
        pct = run.record["metrics"]["optimal_pct"]
        ax.scatter(
            np.maximum(run.cv, LOG_FLOOR),
            np.maximum(run.rs, LOG_FLOOR),
            s=9,
            alpha=0.55,
            linewidths=0,
            label=f"{_display(key, series)}: {_fmt(pct)}% optimal (seed {run.seed})",
            **styles[key],
        )
    ax.axvline(CV_OPTIMAL, **_THRESHOLD)
    optimal = f"optimal: CV ≤ {CV_OPTIMAL:g}, RS ≤ {RS_OPTIMAL:.0%}"
    ax.axhline(RS_OPTIMAL, label=optimal, **_THRESHOLD)
    where = f"(values < {LOG_FLOOR:g} drawn there)"
    ax.set(
        xscale="log",
        yscale="log",
        xlabel=f"test constraint violation CV {where}",
        ylabel=f"test relative suboptimality RS {where}",
        title=f"{name}: per-instance test RS and CV",
    )
    # The axes span many decades, where minor ticks add nothing visible but cost
    # most of the drawing time.
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_locator(NullLocator())
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small", markerscale=2)
    fig.savefig(path)
    return path


def _curve(run: _Run, key: str) -> tuple[np.ndarray, np.ndarray]:
    """The finite, positive-time points `(time_s, key)` of a run's curve, by time."""
    points = []
    for point in run.record.get("curve") or []:
        try:
            t, y = float(point["time_s"]), float(point[key])
        except (KeyError, TypeError, ValueError):
            continue
        if t > 0 and math.isfinite(t) and math.isfinite(y):
            points.append((t, y))
    points.sort()
    t, y = np.array(points, dtype=float).reshape(-1, 2).T
    return t, np.maximum(y, LOG_FLOOR)


def _seed_band(curves: list[tuple[np.ndarray, np.ndarray]]):
    """Mean and std over seeds of log10(y) on a common log-spaced grid over the
    span every seed covers (`None` if there is none)."""
    lo = max(t[0] for t, _ in curves)
    hi = min(t[-1] for t, _ in curves)
    if hi < lo:
        return None
    grid = np.geomspace(lo, hi, _CURVE_POINTS) if hi > lo else np.array([lo])
    # Interpolate in log-log coordinates: the axes are logarithmic, so this is the
    # straight segment drawn between two points of a single seed.
    logs = np.stack(
        [np.interp(np.log(grid), np.log(t), np.log10(y)) for t, y in curves]
    )
    return grid, logs.mean(axis=0), logs.std(axis=0)


def _curves(name, series, styles, path: pathlib.Path) -> pathlib.Path | None:
    """Validation mean RS and max CV against training time, or `None` if no curve."""
    panels = (("rs_mean", "validation mean RS"), ("cv_max", "validation max CV"))
    fig, (axes,) = plots.new(11.5, 4.6, ncols=2, dpi=150, layout="constrained")
    drawn = False
    for ax, (key, title) in zip(axes, panels):
        for series_key, runs in series.items():
            curves = [c for c in (_curve(run, key) for run in runs) if len(c[0])]
            if not curves:
                continue
            drawn = True
            style = {"color": styles[series_key]["color"]}
            seeds = f"{len(curves)} seed" + ("s" if len(curves) > 1 else "")
            label = f"{_display(series_key, series)} ({seeds})"
            band = _seed_band(curves) if len(curves) > 1 else None
            if band is None:
                # One seed, or seeds whose time spans do not overlap: each as is.
                for i, (t, y) in enumerate(curves):
                    ax.plot(t, y, label=None if i else label, **style)
                continue
            grid, mean, std = band
            ax.plot(grid, 10**mean, label=label, **style)
            band = 10 ** (mean - std), 10 ** (mean + std)
            ax.fill_between(grid, *band, alpha=0.2, linewidth=0, **style)
        xlabel = "training wall-clock time [s] (validation excluded)"
        ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=title)
        ax.grid(True, which="major", alpha=0.3)
    if not drawn:
        return None
    axes[0].axhline(RS_OPTIMAL, **_THRESHOLD)
    axes[1].axhline(CV_OPTIMAL, **_THRESHOLD)
    axes[0].legend(fontsize="small")
    fig.suptitle(
        f"{name}: learning curves (several seeds: geometric mean, band ×/÷ one "
        f"geometric std; values < {LOG_FLOOR:g} drawn there)",
        fontsize="medium",
    )
    fig.savefig(path)
    return path


def _fmt(x) -> str:
    """A compact number: 3 significant digits, scientific when tiny or huge."""
    if x is None:
        return "–"
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    a = abs(x)
    if a < 1e-3 or a >= 1e5:
        mantissa, exponent = f"{x:.2e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    if a >= 100:
        return f"{x:.0f}"  # whole seconds or percent: no false trailing zeros
    rounded = float(f"{x:.3g}")  # round first, so 9.996 gives 10.0, not 10.00
    decimals = max(0, 2 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:.{decimals}f}"


def _stat(values: list) -> str:
    """One value, or mean ± std (population) over seeds."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return _fmt(values[0])
    return f"{_fmt(np.mean(values))} ± {_fmt(np.std(values))}"


def _describe(record: dict) -> str:
    """'100 variables, 50 equalities, 50 inequalities', or what the record holds."""
    ds = record.get("dataset", {})
    words = {"n_var": "variables", "n_eq": "equalities", "n_ineq": "inequalities"}
    parts = [f"{ds[k]} {word}" for k, word in words.items() if k in ds]
    kind = ", ".join(f"{k} {ds[k]}" for k in ("problem", "size") if k in ds)
    return "; ".join(p for p in (kind, ", ".join(parts)) if p)


def _accuracy_table(series: dict[tuple, list[_Run]]) -> list[str]:
    rows = []
    for key, runs in series.items():
        metrics = [run.record["metrics"] for run in runs]
        timing = [run.record.get("timing") or {} for run in runs]
        precision = runs[0].precision
        rows.append([
            f"`{_display(key, series)}`",
            "–" if precision is None else f"float{precision}",
            len(runs),
            *(_stat([m[k] for m in metrics]) for k in _REQUIRED_METRICS),
            _stat([t.get("train_s") for t in timing]),
        ])  # fmt: skip
    header = "Method|Precision|Seeds|Mean RS|Max CV|Optimal [%]|Training time [s]"
    return [records.table(header.split("|"), rows, "llrrrrr")]


def _inference_table(series: dict[tuple, list[_Run]]) -> list[str]:
    rows, notes, sizes = [], [], set()
    for key, runs in series.items():
        run = runs[0]  # the lowest seed
        inference = (run.record.get("timing") or {}).get("inference") or {}
        single = inference.get("single") or {}
        batch = inference.get("batch") or {}
        name = f"`{_display(key, series)}`"
        if "batch_extrapolated_from" in inference:
            notes.append((name, inference["batch_extrapolated_from"]))
            name += f" [{len(notes)}]"
        sizes.add(inference.get("batch_size"))
        repeats = f"{single.get('repeats', '–')} / {batch.get('repeats', '–')}"
        times = [_fmt(t.get(c)) for t in (single, batch) for c in TIMING_COLUMNS]
        rows.append([name, run.seed, repeats, *times])
    sizes.discard(None)
    batch = f"Batch ({sizes.pop()})" if len(sizes) == 1 else "Batch"
    quartiles = ["LQ", "UQ", "Min", "Max"]
    header = ["Method", "Seed", "Repeats (single / batch)", "Single median [s]"]
    header += [*quartiles, f"{batch} median [s]", *quartiles]
    lines = [records.table(header, rows, "lrr" + "r" * 10)]
    if len(sizes) > 1:
        lines += ["", "The batch sizes differ between methods; see each results.json."]
    for i, (name, rows) in enumerate(notes, 1):
        lines += ["", f"[{i}] {name}: batch times extrapolated from a batch of {rows}."]
    return lines


def _provenance(series: dict[tuple, list[_Run]]) -> list[str]:
    """The machines and commands behind a data set's numbers."""
    machines: dict[tuple, list[str]] = {}
    commands = []
    for key, runs in series.items():
        for run in runs:
            m = run.record.get("machine") or {}
            ident = tuple(
                m.get(k, "?") for k in ("cpu", "cpu_count", "jax", "jax_backend")
            )
            names = machines.setdefault(ident, [])
            name = _display(key, series)
            if name not in names:
                names.append(name)
            when = [f"{k} {m[k]}" for k in ("git", "date") if m.get(k) is not None]
            when = f" ({', '.join(when)})" if when else ""
            command = run.record.get("command") or "(not recorded)"
            commands.append(f"- `{name}` seed {run.seed}{when}: `{command}`")
    lines = ["Machines:", ""]
    for (cpu, count, jax, backend), names in machines.items():
        lines.append(
            f"- {cpu}, {count} CPUs, JAX {jax}, backend {backend}: "
            + ", ".join(f"`{n}`" for n in names)
        )
    return lines + ["", "Commands:", "", *commands]


def _time_to_reach(run: _Run, rs: float, cv: float) -> float | None:
    """Training seconds until the validation mean RS is at most `rs` and the
    validation max CV at most `cv` (the first such curve point), or None."""
    for point in run.record.get("curve") or []:
        if point["rs_mean"] <= rs and point["cv_max"] <= cv:
            return float(point["time_s"])
    return None


def _head_to_head_table(series: dict[tuple, list[_Run]]) -> list[str]:
    """Each network's training time to reach the reference's final validation
    RS and CV, against the reference's whole training time, seed by seed."""
    references = {
        r.seed: r for k, runs in series.items() for r in runs if r.method == "reference"
    }
    rows = []
    for key, runs in series.items():
        for run in runs:
            ref = references.get(run.seed)
            if ref is None or run is ref or not run.record.get("curve"):
                continue
            if run.precision != ref.precision:
                continue
            final = ref.record["curve"][-1]
            reached = _time_to_reach(run, final["rs_mean"], final["cv_max"])
            ref_time = ref.record["timing"]["train_s"]
            rows.append([
                f"`{_display(key, series)}`",
                run.seed,
                f"{_fmt(final['rs_mean'])} / {_fmt(final['cv_max'])}",
                "not reached" if reached is None else _fmt(reached),
                _fmt(ref_time),
                "" if reached is None else f"{reached / ref_time:.2f}",
            ])  # fmt: skip
    if not rows:
        return []
    header = "Method|Seed|Reference's final val RS / CV|Time to reach it [s]|"
    header += "Reference's training [s]|Ratio"
    return [records.table(header.split("|"), rows, "lrrrrr")]


def markdown(
    datasets: dict[str, dict[tuple, list[_Run]]], results_dir, suite: Suite
) -> str:
    """The Markdown tables of every data set, with their provenance."""
    lines = [
        f"# {suite.title}",
        "",
        f"From `{results_dir}` by `{suite.prog} report`. RS: relative "
        "suboptimality of the test predictions; CV: their largest constraint "
        f"violation; an instance is optimal when CV ≤ {CV_OPTIMAL:g} and RS ≤ "
        f"{RS_OPTIMAL:.0%}. With several seeds, an accuracy entry is the mean ± "
        "(population) std of the per-seed values; inference times are those of "
        "the lowest seed.",
    ]
    for name, series in datasets.items():
        record = next(iter(series.values()))[0].record
        description = _describe(record)
        lines += ["", f"## {name}", ""]
        if description:
            lines += [description, ""]
        lines += ["### Accuracy (test set)", "", *_accuracy_table(series)]
        head_to_head = _head_to_head_table(series)
        if head_to_head:
            lines += [
                "",
                "### Training time to reach the reference's accuracy",
                "",
                "Validation curves, training time with setup and JIT "
                "(validation excluded).",
                "",
                *head_to_head,
            ]
        lines += ["", "### Inference time", "", *_inference_table(series)]
        lines += ["", "### Produced by", "", *_provenance(series)]
    return "\n".join(lines) + "\n"
