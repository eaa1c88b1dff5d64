"""The proxy benchmark's report, from the raw records of `python -m
benchmarks.dcopf proxy` in `OUT/proxy/` (large, not committed): the committed
record `dcopf/records/proxy.json` (per grid and variant, each method's and
solver's gaps, overloads, residual and time) and the figures in
`figures/dcopf/`: `proxy_gaps_{case}-{variant}.png` (the test gaps),
`proxy_week_{case}-{variant}.png` (the held-out week with the most feasible
hours: cost and largest line loading, hour by hour) and `proxy_time.png` (time
per instance against the number of buses).
"""

from __future__ import annotations

import pathlib

import numpy as np

from .._common import plots, provenance, records as committed
from ._activsg import SCENARIO_CASES
from ._report import _records

FIGURES = committed.ROOT / "figures" / "dcopf"
TIME_FIGURE = "![time per instance](../figures/dcopf/proxy_time.png)"

ORDER = ("ours", "ours-dist", "ours-sup", "e2elr", "mlp")
LABELS = {
    "ours": "ours (paper's recipe)",
    "ours-dist": "ours (+ distance)",
    "ours-sup": "ours (supervised)",
    "e2elr": "E2ELR",
    "mlp": "MLP + penalties",
}
SOLVERS = {
    "clarabel_default": "Clarabel (default)",
    "clarabel_1e-08": "Clarabel (1e-8)",
    "highs_default": "HiGHS (default)",
    "highs_1e-08": "HiGHS (1e-8)",
}


def _groups(records: list[dict]) -> dict[tuple, dict[str, dict]]:
    """`{(case, variant): {method: record}}`."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        key = r["method"] + (f"-{r['tag']}" if r.get("tag") else "")
        groups.setdefault((r["case"], r["variant"]), {})[key] = r
    return groups


def _label(key: str) -> str:
    """A method's label; a tagged run's tag in parentheses."""
    for method in sorted(LABELS, key=len, reverse=True):
        if key == method:
            return LABELS[method]
        if key.startswith(method + "-") and key[len(method) + 1 :] not in LABELS:
            return f"{LABELS[method]} ({key[len(method) + 1 :]})"
    return key


def _rank(key: str) -> tuple:
    base = key if key in ORDER else key.rsplit("-", 1)[0]
    return (ORDER.index(base) if base in ORDER else 99, key)


def _pct(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:.3g} %"


def table(group: dict[str, dict]) -> str:
    """One grid and variant's methods and solvers as a Markdown table."""
    rows = []
    for method in sorted(set(group) - {"solvers"}, key=_rank):
        r, t = group[method], group[method]["test"]
        resid = t.get("residual_over_eps32", {}).get("max")
        rows.append([
            _label(method), t["n_hours"], _pct(t["gap_mean"]), _pct(t["gap"]["p99"]),
            _pct(t["overloaded_share"]), f"{t['overload_mw']['max']:.3g}",
            _pct(t["successful"]) if "successful" in t else "-",
            "-" if resid is None else f"{resid:.3g}",
            f"{t['timing']['per_instance_ms']:.3g}" if "timing" in t else "-",
            f"{r['train_s']:.0f}",
        ])  # fmt: skip
    solvers = group.get("solvers") or {}
    for key, label in SOLVERS.items():
        if s := solvers.get(key):
            # The gap column: the largest |cost difference| to the reference.
            diff = s["rel_cost_diff_max"]
            rows.append([
                label, s["n_hours"], "-" if diff is None else f"{diff:.1e}", "", 0, 0,
                f"{s['n_hours'] - s['failed']}/{s['n_hours']} solved", "",
                "-" if s["ms"] is None else f"{s['ms']['median']:.3g}", "",
            ])  # fmt: skip
    header = (
        "method|test hours|mean gap|p99 gap|hours overloaded|max overload MW|"
        "successful|max norm. residual / eps32|ms / instance (batch 256)|training s"
    )
    note = (
        "\nSolvers: per instance, one thread, `solve()`/`run()` only; their gap "
        "column is the largest relative cost difference to Clarabel at 1e-8 (the "
        "cached optimum); failed solves are left out of their time.\n"
    )
    return committed.table(header.split("|"), rows) + "\n" + (note if solvers else "")


def _infeasible_lines(group: dict[str, dict]) -> list[str]:
    lines = []
    for method, r in group.items():
        failed = r.get("failed_steps")
        if failed:
            stop = r.get("stopped_at")
            lines.append(
                f"- {_label(method)}: {len(failed)} training steps failed in the "
                f"library's host factorisation ({'; '.join(r['failed_messages'])})"
                + (f"; training stopped at step {stop}" if stop else "")
                + f"; the best network is from step {r['best_step']}."
            )
        inf = r.get("test", {}).get("infeasible_hours")
        if inf and inf.get("n_hours"):
            lines.append(
                f"- {_label(method)}: of the {inf['n_hours']} test hours Clarabel "
                f"finds infeasible ({inf['below_total_pmin']} below the total PMIN), "
                f"{inf.get('n_run', inf['n_hours'])} evenly spaced ones were run "
                f"through the layer: it flags {_pct(inf['flagged_infeasible'])} "
                f"`infeasible`, {_pct(inf['flagged_max_steps'])} `max_steps_reached`"
                f" and {_pct(inf['successful'])} `successful`; outputs finite: "
                f"{inf['finite']}."
            )
        # What a record says of itself (`*_note` keys): how it was made.
        notes = sorted(k for k in r if k.endswith("_note"))
        lines += [f"- {_label(method)}: {r[k]}." for k in notes]
    return lines


def gaps_figure(group: dict[str, dict], path: pathlib.Path) -> pathlib.Path:
    """Histograms of the test gaps (log scale; gaps below 1e-6, including the
    negative ones of outputs that are not feasible, are drawn at 1e-6)."""
    fig, axes = plots.new(6, 3.8)
    ax = axes[0, 0]
    bins = np.logspace(-6, 0, 49)
    for method in sorted(group, key=_rank):
        gaps = np.asarray(group[method]["test"]["per_hour"]["gap"])
        ax.hist(np.clip(gaps, 1e-6, 1), bins=bins, histtype="step", lw=1.5,
                label=_label(method))  # fmt: skip
    first = next(iter(group.values()))
    return plots.finish(fig, ax, path, log="x", ylabel="hours",
        xlabel="optimality gap vs Clarabel at 1e-8 (test hours; < 1e-6 at 1e-6)",
        title=f"{first['case']} ({first['variant']})")  # fmt: skip


def _week(per_hour: dict) -> np.ndarray:
    """The solved test hours of the 168-hour window holding the most of them."""
    hours = np.asarray(per_hour["hour"])
    best, start = 0, hours[0]
    for h in hours:
        n = np.count_nonzero((hours >= h) & (hours < h + 168))
        if n > best:
            best, start = n, h
    return np.flatnonzero((hours >= start) & (hours < start + 168))


def week_figure(group: dict[str, dict], path: pathlib.Path) -> pathlib.Path | None:
    """One held-out week hour by hour: total cost and largest line loading of
    the solver, ours and E2ELR (hours the solver finds infeasible are gaps)."""
    ref = group.get("ours") or group.get("e2elr")
    if ref is None:
        return None
    fig, axes = plots.new(8, 5, nrows=2)
    ax_cost, ax_load = axes[0, 0], axes[1, 0]
    rows = _week(ref["test"]["per_hour"])
    hours = np.asarray(ref["test"]["per_hour"]["hour"])[rows]
    first = hours[0]

    def draw(ax, x, values, **style):
        # Break the line where hours are missing (infeasible hours).
        v = np.full(168, np.nan)
        v[x - first] = values
        ax.plot(np.arange(168), v, **style)

    opt = ref["test"]["per_hour"]
    draw(ax_cost, hours, np.asarray(opt["opt_cost"])[rows], color="k", label="Clarabel")
    draw(ax_load, hours, np.asarray(opt["opt_loading"])[rows], color="k")
    drawn = (("ours", "C0"), ("ours-dist", "C2"), ("ours-sup", "C1"), ("e2elr", "C3"))
    for method, color in drawn:
        if method not in group:
            continue
        ph = group[method]["test"]["per_hour"]
        idx = np.flatnonzero(np.isin(ph["hour"], hours))
        h = np.asarray(ph["hour"])[idx]
        draw(ax_cost, h, np.asarray(ph["cost"])[idx], color=color, ls="--",
             label=_label(method))  # fmt: skip
        draw(ax_load, h, np.asarray(ph["loading"])[idx], color=color, ls="--")
    ax_load.axhline(1.0, color="grey", lw=0.8)
    ax_load.set_ylabel("largest |flow| / rating")
    ax_load.set_xlabel(f"hours from {ref['test']['per_hour']['time'][rows[0]]}")
    return plots.finish(fig, ax_cost, path, xlabel="",
        ylabel="cost (per-unit coefficients)",
        title=f"{ref['case']} ({ref['variant']}), held-out week")  # fmt: skip


def time_figure(records: list[dict], path: pathlib.Path) -> pathlib.Path:
    """Time per instance against the number of buses, every method and solver
    (runs of the `pmin0` variant labelled as such)."""
    import matplotlib

    fig, axes = plots.new(8.5, 4)
    ax = axes[0, 0]
    ax.set_prop_cycle(color=[matplotlib.colormaps["tab20"](i) for i in range(20)])
    series: dict[str, dict[int, float]] = {}
    for r in records:
        if "n_bus" not in r:  # records written before they named their size
            continue
        suffix = "" if r["variant"] == "real" else f" [{r['variant']}]"
        if r["method"] == "solvers":
            for key, label in SOLVERS.items():
                if r.get(key) and r[key]["ms"]:
                    series.setdefault(label + suffix, {}).setdefault(
                        r["n_bus"], r[key]["ms"]["median"]
                    )
        elif "timing" in r["test"]:
            label = _label(r["method"] + (f"-{r['tag']}" if r.get("tag") else ""))
            series.setdefault(label + suffix, {}).setdefault(
                r["n_bus"], r["test"]["timing"]["per_instance_ms"]
            )
    for label, points in series.items():
        n = sorted(points)
        solver = label.split(" [")[0] in SOLVERS.values()
        ax.plot(n, [points[k] for k in n], marker="^" if solver else "o",
                ls="--" if solver else "-", label=label)  # fmt: skip
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return plots.finish(fig, ax, path, log="xy", xlabel="buses", legend=None,
        ylabel="ms per instance (proxies: batch 256)")  # fmt: skip


def _command(r: dict) -> str:
    """The `proxy` command that wrote a raw record (its non-default settings)."""
    words = ["python -m benchmarks.dcopf proxy", f"--case {r['case']}",
             f"--variant {r['variant']}", f"--method {r['method']}"]  # fmt: skip
    settings = r.get("settings") or {}
    for key in ("steps", "batch", "every", "n_test"):
        if settings.get(key) is not None:
            words.append(f"--{key.replace('_', '-')} {settings[key]}")
    return " ".join(words + ([f"--tag {r['tag']}"] if r.get("tag") else []))


def _headline(groups: dict[tuple, dict[str, dict]]) -> list[dict]:
    """The headline rows: the best proxy of each grid's real variant against
    E2ELR and Clarabel."""
    rows = []
    for (case, variant), group in sorted(groups.items(), reverse=True):
        ours = group.get("ours-sup") or group.get("ours")
        solver = (group.get("solvers") or {}).get("clarabel_1e-08")
        if variant != "real" or ours is None or solver is None:
            continue
        t, e2elr = ours["test"], group.get("e2elr")
        ms = t["timing"]["per_instance_ms"] if "timing" in t else None
        ref = solver["ms"]["median"]
        base = f"Clarabel {ref:.3g} ms"
        if e2elr:
            base += (
                f"; E2ELR gap {_pct(e2elr['test']['gap_mean'])}, "
                f"{_pct(e2elr['test']['overloaded_share'])} of hours overloaded"
            )
        rows.append({
            "label": "DC-OPF proxy",
            "measure": f"{case} ({t['n_hours']} feasible test hours): "
            f"{_label(ours['method'])}, mean gap (p99), ms per instance",
            "ours": f"{_pct(t['gap_mean'])} ({_pct(t['gap']['p99'])}), "
            + ("not timed" if ms is None else f"{ms:.3g} ms"),
            "baseline": base,
            "ratio": "-" if ms is None else f"{ms / ref:.2f} (time vs Clarabel)",
            "command": _command(ours),
        })  # fmt: skip
    return rows


def record(raw: list[dict], figures: dict[tuple, list[str]]) -> dict:
    """The committed summary of the raw records: one table per grid and
    variant (with its figures), and the headline rows."""
    groups = _groups(raw)
    body = [
        "Self-supervised and supervised proxies of the DC-OPF on MATPOWER's "
        "ACTIVSg grids with their hourly loads of a year (`_proxy_data`): trained "
        "on January to September, validated on October, tested on "
        "November and December; gaps against Clarabel at 1e-8 on the hours it "
        "finds feasible. The grids without a time series (case_ACTIVSg10k) use "
        "2,000 loads of E2ELR's sampler split 80/10/10 at random instead "
        "(their 'hours' are samples). `ours-sup` is the supervised recipe, "
        "`e2elr` the E2ELR baseline in JAX, `mlp` a penalised MLP "
        "(`_proxy_models`); `pmin0` sets "
        "every PMIN to 0. The raw records (per hour) and checkpoints stay in "
        "`results/dcopf/proxy/`.",
    ]
    for (case, variant), group in sorted(groups.items()):
        machine = next(iter(group.values()))["machine"]
        body.append(f"### {case}, {variant}\n\n" + table(group))
        body.extend(_infeasible_lines(group))
        commands = sorted({_command(r) for r in group.values()})
        body.append(
            f"{provenance.describe(machine)}, {machine['date']}. Commands: "
            + "; ".join(f"`{c}`" for c in commands)
            + "."
        )
        body += [
            f"![{name}](../figures/dcopf/{name})"
            for name in figures.get((case, variant), [])
        ]
    dates = sorted(r["machine"]["date"][:10] for r in raw)
    return {
        "suite": "dcopf", "name": "proxy", "order": 5,
        "title": "DC-OPF proxies on the ACTIVSg hours",
        "command": "python -m benchmarks.dcopf proxy-report",
        "machine": provenance.describe(raw[0]["machine"]).split(", Linux")[0],
        "date": dates[-1] if dates else "", "source": "run",
        "commit": ", ".join(sorted({r["machine"].get("git", "?") for r in raw})),
        "headline": _headline(groups),
        "blocks": committed.blocks("\n\n".join([*body, TIME_FIGURE])),
    }  # fmt: skip


def report(out: pathlib.Path, figures: pathlib.Path = FIGURES) -> list[pathlib.Path]:
    """Writes the figures (into `figures`), the committed record and the pages;
    returns their paths."""
    raw = _records(out, "proxy")
    groups = _groups(raw)
    paths, names = [], {}
    figures.mkdir(parents=True, exist_ok=True)
    for (case, variant), group in sorted(groups.items()):
        trained = {m: r for m, r in group.items() if m != "solvers"}
        if trained:
            stem = f"{case}-{variant}"
            drawn = [gaps_figure(trained, figures / f"proxy_gaps_{stem}.png")]
            if case in SCENARIO_CASES:  # sampled loads have no week
                drawn.append(week_figure(trained, figures / f"proxy_week_{stem}.png"))
            drawn = [p for p in drawn if p is not None]
            names[(case, variant)] = [p.name for p in drawn]
            paths += drawn
    if raw:
        paths.append(time_figure(raw, figures / "proxy_time.png"))
        paths.append(committed.write(record(raw, names)))
        paths += committed.render(["dcopf"])
    return paths
