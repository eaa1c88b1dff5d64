"""The DC-OPF benchmark's reports, from the raw JSON records under OUT: `report`
(the `projection`, `train` and `distances` records, and with `record` the
committed records of the distances and of the ACTIVSg grids) and `proxy_report`
(`OUT/proxy/`, large and not committed: the committed record `proxy.json`)."""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np

from .._common import plots, provenance, records as committed
from ._activsg import SCENARIO_CASES

FIGURES = committed.ROOT / "figures" / "dcopf"
TIME_FIGURE = "![time per instance](../figures/dcopf/proxy_time.png)"
_CASE_ORDER = ("case1354pegase", "case2869pegase", "case9241pegase")
_CASE_ORDER += tuple(f"case_ACTIVSg{n}" for n in ("2000", "10k", "25k", "70k"))


def _records(out: pathlib.Path, kind: str) -> list[dict]:
    """The raw records in `out/kind/`, by case (`_CASE_ORDER`) and dtype."""
    records = [json.loads(p.read_text()) for p in sorted((out / kind).glob("*.json"))]
    rank = {c: i for i, c in enumerate(_CASE_ORDER)}
    return sorted(records, key=lambda r: (rank.get(r["case"], 99), r.get("dtype", "")))


def _fmt(x: float) -> str:
    return f"{x:.2g}" if abs(x) < 1e-2 or abs(x) >= 1e3 else f"{x:.3g}"


def _table(header: str, rows: list[list]) -> str:
    """A Markdown table (`header`: the columns, `|`-separated), newline-ended."""
    return committed.table(header.split("|"), rows) + ("\n" if rows else "\n\n")


def table(records: list[dict]) -> str:
    """The projection records as one Markdown table."""
    rows = []
    for r in records:
        near, far = r["near"], r["far"]
        worst = lambda key: _fmt(max(near[key], far[key]))  # noqa: E731
        # OSQP's median, with the solves that hit its iteration cap.
        osqp = "-" if r["osqp_ms"] is None else f"{r['osqp_ms']['median']:.1f}"
        failed = r.get("osqp_failed", 0)
        rows.append([
            r["case"], r["dtype"], r["dim"], f"{r['build_s']:.2f}",
            f"{r['peak_rss_gb_after_build']:.2f}",
            f"{near['successful']:.3g} / {far['successful']:.3g} "
            f"(batch {r['batch_successful']:.3g})",
            f"{_fmt(near['rel_err_max'])} / {_fmt(far['rel_err_max'])}",
            worst("objective_minus_clarabel_max"), worst("violation_max"),
            worst("normalised_residual_over_eps32"), f"{r['per_instance_ms']:.1f}",
            f"{r['clarabel_ms']['median']:.1f}",
            osqp + (f" ({failed} failed)" if failed else ""),
            f"{r['ratio_to_clarabel']:.2f}",
        ])  # fmt: skip
    return _table(
        "case|dtype|n (y)|build s|peak GB|ok near / far|rel. err near / far (vs "
        "Clarabel)|obj. - Clarabel's|max viol. (f64)|max norm. residual / eps32|"
        "ours ms/inst. (batch 256)|Clarabel ms|OSQP ms|ours / Clarabel",
        rows,
    )


def training_table(trains: list[dict]) -> str:
    """The `train` records as one Markdown table."""
    rows = [
        [t["case"], f"{t['steps']} x {t['batch']}", f"{t['total_s']:.0f}",
         f"{_fmt(t['gap_mean'])} / {_fmt(t['gap_max'])}", f"{t['test_successful']:.3g}",
         _fmt(t["normalised_residual_over_eps32_max"]), t["cost_constant_on_set"]]
        for t in trains
    ]  # fmt: skip
    return _table(
        "case|steps x batch|total s (incl. compile)|gap mean / max|test ok|"
        "max norm. residual / eps32|cost constant on set",
        rows,
    )


def figure(records: list[dict], path: pathlib.Path) -> pathlib.Path:
    """Time per instance against the number of variables: ours, Clarabel, OSQP."""
    fig, ((ax,),) = plots.new(5.5, 3.8)
    for dtype, marker in (("float64", "o"), ("float32", "s")):
        rs = [r for r in records if r["dtype"] == dtype]
        x, y = [r["dim"] for r in rs], [r["per_instance_ms"] for r in rs]
        ax.plot(x, y, marker=marker, label=f"pinet_eqx {dtype} (batch 256)")
    for key, label in (("clarabel_ms", "Clarabel"), ("osqp_ms", "OSQP")):
        rs = [r for r in records if r["dtype"] == "float64" and r[key] is not None]
        x, y = [r["dim"] for r in rs], [r[key]["median"] for r in rs]
        ax.plot(x, y, marker="^", linestyle="--", label=label)
    return plots.finish(fig, ax, path, log="xy", xlabel="variables (p_g, theta)",
        ylabel="ms per projection", title="DC-OPF projection, this CPU")  # fmt: skip


def training_figure(trains: list[dict], path: pathlib.Path) -> pathlib.Path:
    """Histograms over the test instances of the trained proxies: the gap to
    Clarabel's optimum and the largest normalised residual (the bound is 10)."""
    fig, ((ax_gap, ax_res),) = plots.new(9, 3.6, ncols=2)
    for t in trains:
        label = t["case"] + (
            f" (distance {t['distance_weight']:g})" if t["distance_weight"] else ""
        )
        ax_gap.hist(t["gaps"], bins=16, alpha=0.6, label=label)
        ax_res.hist(t["normalised_residuals_over_eps32"], bins=16, alpha=0.6)
    ax_gap.set_xlabel("optimality gap (relative)")
    ax_gap.set_ylabel("test instances")
    ax_gap.legend(fontsize=7)
    ax_res.axvline(10, color="k", linestyle="--", label="issue's bound")
    fig.suptitle("DC-OPF proxies, test set (inference mode, float32)")
    return plots.finish(fig, ax_res, path, xlabel="max normalised residual / eps32",
        ylabel="")  # fmt: skip


def distances_table(records: list[dict]) -> str:
    """The `distances` records as one Markdown table: time per instance (median
    and quartiles of the batch calls), Clarabel's, successes, factorisations."""
    rows = []
    for r in records:
        for row in r["rows"]:
            t, n = row["batch_s"], row["batch"]
            clarabel, ratio = row.get("clarabel_ms"), row.get("ratio_to_clarabel")
            kind = "spread" if row["kind"] == "spread" else "even dispatch"
            rows.append([
                r["case"], n, f"{row['factor']:g} x {kind}",
                f"{row['per_instance_ms']:.1f} ({1e3 * t['lq'] / n:.1f}-"
                f"{1e3 * t['uq'] / n:.1f})",
                "-" if not clarabel else f"{clarabel['median']:.1f}",
                "-" if ratio is None else f"{ratio:.2f}", f"{row['successful']:.3g}",
                f"{row['factorisations_per_instance']:.1f}",
                _fmt(row["normalised_residual_over_eps32"]),
            ])  # fmt: skip
    return _table(
        "case|batch|raw outputs|ours ms/inst. (IQR)|Clarabel ms|ours / Clarabel|"
        "successful|factorisations / inst.|max norm. residual / eps32",
        rows,
    )


def distances_figure(records: list[dict], path: pathlib.Path) -> pathlib.Path:
    """Time per instance against the raw outputs' distance (times the spread),
    ours and Clarabel's, one colour per case (batch shown in the legend)."""
    fig, ((ax,),) = plots.new(6, 4)
    for i, r in enumerate(records):
        rows = [row for row in r["rows"] if row["kind"] == "spread"]
        x, y = [row["factor"] for row in rows], [row["per_instance_ms"] for row in rows]
        label = f"{r['case']} ours (batch {r['batch']})"
        ax.plot(x, y, "o-", color=f"C{i}", label=label)
        clarabel = [(row["factor"], row["clarabel_ms"]["median"])
                    for row in rows if row["clarabel_ms"]]  # fmt: skip
        if clarabel:
            ax.plot(*zip(*clarabel), "s--", color=f"C{i}", alpha=0.6,
                    label=f"{r['case']} Clarabel")  # fmt: skip
    return plots.finish(fig, ax, path, log="xy",
        xlabel="distance of the raw outputs (times the spread)",
        ylabel="ms per instance (float32 inference)")  # fmt: skip


DISTANCES_SETUP = """**Setup:** float32, inference mode, the library's defaults, the
PEGASE grids saved by `python -m benchmarks.dcopf save` (the slack generator keeps
its 1e7 per-unit bound). The raw outputs are the DC-OPF optimum plus Gaussian
noise of 0.1 to 100 times the spread of its entries, or an even dispatch of the
total load plus 0.3 of each generator's range (0.09 rad on the angles). Each row
is the whole jitted batch call, timed after a warm-up (median and quartiles);
Clarabel's time is per instance, setup included (tolerance 1e-10), one instance
at a time. {cores}"""

# How the runs used the machine's cores, by `machine["cores_used"]`.
_PINNED = (
    "Ours and Clarabel alike ran pinned to one core (`taskset -c 1`), the other "
    "kept free of timed work."
)
_UNPINNED = (
    "Ours ran as a user runs it, on the machine's {n} cores (a batch's host finish in "
    "worker processes, `_linalg.host_processes`), nothing else running; "
    "Clarabel solves one instance on one core."
)


def _cores(distances: list[dict]) -> tuple[str, str]:
    """`(sentence, command prefix)` for the cores the runs used (records without
    `cores_used` ran pinned)."""
    used = {r["machine"].get("cores_used", 1) for r in distances}
    if used == {1}:
        return _PINNED, "taskset -c 1 "
    if len(used) == 1:
        return _UNPINNED.format(n=used.pop()), ""
    cases = ", ".join(
        f"{r['case']} (batch {r['batch']}): {r['machine'].get('cores_used', 1)}"
        for r in distances
    )
    return f"Cores used per run: {cases}.", ""


def _headline(distances: list[dict]) -> list[dict]:
    """Near (0.1 x spread) and far (100 x): each case's time and Clarabel's."""
    rows = []
    for factor, where in ((0.1, "near the set"), (100, "far from the set")):
        # Batched runs only: a single instance is a row of the suite's table.
        cells = [
            (f"{r['case']} (batch {r['batch']})", row)
            for r in distances
            for row in r["rows"]
            if row["kind"] == "spread" and row["factor"] == factor
            and row.get("clarabel_ms") and r["batch"] > 1
        ]  # fmt: skip
        if not cells:
            continue
        ok = "; ".join(f"{row['successful']:.3g}" for _, row in cells)
        rows.append({
            "label": "DC-OPF projection",
            "measure": f"f32 inference {where} ({factor:g}x spread), ms per "
            f"instance, {' / '.join(c for c, _ in cells)} (share successful {ok})",
            "ours": " / ".join(f"{row['per_instance_ms']:.3g} ms" for _, row in cells),
            "baseline": "Clarabel " + " / ".join(
                f"{row['clarabel_ms']['median']:.3g} ms" for _, row in cells),
            "ratio": " / ".join(f"{row['ratio_to_clarabel']:.2f}" for _, row in cells),
        })  # fmt: skip
    return rows


def _machine(machine: dict) -> str:
    """A committed record's `machine`, from a run record's."""
    return provenance.describe(machine).split(", Linux")[0]


def _provenance(machine: dict) -> dict:
    """A committed record's provenance fields, from a run record's `machine`."""
    return {
        "machine": _machine(machine), "date": machine["date"][:10],
        "commit": machine["git"], "source": "run",
    }  # fmt: skip


def distances_record(distances: list[dict], figure: str) -> dict:
    """The committed record of the `distances` runs."""
    cores, prefix = _cores(distances)
    setup = DISTANCES_SETUP.format(cores=cores)
    body = "\n\n".join([setup, distances_table(distances), figure])
    return {
        "suite": "dcopf", "name": "distances", "order": 1,
        "title": "Inference time against the distance from the set (float32)",
        "command": prefix + "python -m benchmarks.dcopf distances --case C "
        "--fixture C.npz --batch B; "
        "python -m benchmarks.dcopf report --record",
        **_provenance(distances[0]["machine"]),
        "headline": _headline(distances), "blocks": committed.blocks(body),
    }  # fmt: skip


ACTIVSG_SETUP = """**Setup:** DC optimal power flow on MATPOWER's ACTIVSg grids as they
are (`_activsg.load_activsg`: real ratings, unlimited lines unbounded), loads
as in the PEGASE rows (`sample_loads`: U(0.85, 1) overall, +-5 % per bus).
The projector is built at the library's defaults (inference mode); near raw
outputs are the DC-OPF optimum plus 0.1 x its spread of Gaussian noise, far
ones 1.0 x. "Certified" is `_certify.certify_projection`'s KKT certificate of
a face found from Clarabel's point (numpy and scipy only); the error is the
relative infinity norm against it. Our time is the whole jitted batch call, near
and far outputs, after a warm-up (first call: tracing, compilation and the
run); Clarabel's is its `solve()` per instance, setup included, in the same
process (near: the first instances of the timed batch; far: the accuracy
instances). The peak memory is the process's after the build. `cores`: the
cores our run used (a batch's finish runs in worker processes, one per core);
Clarabel solves one instance on one thread."""


def _certified_error(records: list[dict]) -> float:
    """The largest error against the certified projection, near or far."""
    key = "rel_err_certified_max"
    return max(max(r["near"][key], r["far"][key]) for r in records)


def _activsg_targets(records: list[dict]) -> str:
    """Issue 40's targets for the largest grids, met or not, from the records."""
    worst = lambda key: max(r[key] for r in records)  # noqa: E731
    err = _certified_error(records)
    ratio = max(max(r["ratio_to_clarabel"], r["far_timing"]["ratio_to_clarabel"])
                for r in records)  # fmt: skip
    met = lambda ok: "met" if ok else "**not met**"  # noqa: E731
    return (
        f"Against issue 40's targets: construction <= 30 s and <= 8 GB "
        f"({worst('build_s'):.1f} s, {worst('peak_rss_gb_after_build'):.2f} GB): "
        f"{met(worst('build_s') <= 30 and worst('peak_rss_gb_after_build') <= 8)}; "
        f"float64 within 1e-6 of the certified projection, near and far "
        f"({err:.1g}): {met(err <= 1e-6)}; time per instance <= Clarabel's "
        f"(worst {ratio:.2f}x): {met(ratio <= 1)}."
    )


def activsg_table(records: list[dict]) -> str:
    """The `projection` records of the ACTIVSg grids as one Markdown table."""
    rows = []
    for r in records:
        near, far, far_t = r["near"], r["far"], r["far_timing"]
        rows.append([
            r["case"], r["dtype"], f"{r['dim']:,}", f"{r['nnz']:,}",
            f"{r['build_s']:.1f}", f"{r['peak_rss_gb_after_build']:.2f}",
            f"{near['certified']:.3g} / {far['certified']:.3g}",
            f"{_fmt(near['rel_err_certified_max'])} / "
            f"{_fmt(far['rel_err_certified_max'])}",
            f"{_fmt(near['rel_err_max'])} / {_fmt(far['rel_err_max'])}",
            f"{near['successful']:.3g} / {far['successful']:.3g}",
            f"{r['first_call_s']:.0f}",
            f"{r['per_instance_ms']:,.0f} / {far_t['per_instance_ms']:,.0f} "
            f"({r['batch']})",
            f"{r['clarabel_ms']['median']:,.0f} / "
            f"{1e3 * far['clarabel_s_median']:,.0f}",
            f"{r['ratio_to_clarabel']:.2f} / {far_t['ratio_to_clarabel']:.2f}",
            str(r["machine"].get("cores_used", "-")),
        ])  # fmt: skip
    return _table(
        "case|dtype|n (y)|nonzeros|build s|peak GB|certified near / far|ours vs "
        "certified, max near / far|vs Clarabel's point|successful near / far|"
        "first call s|ours ms/inst. near / far (batch)|Clarabel ms near / far|"
        "ours / Clarabel near / far|cores",
        rows,
    )


def activsg_record(records: list[dict]) -> dict:
    """The committed record of the ACTIVSg grids' `projection` runs."""
    largest = max(records, key=lambda r: r["dim"])
    errs = _certified_error(records)
    parts = [ACTIVSG_SETUP, activsg_table(records), _activsg_targets(records)]
    return {
        "suite": "dcopf", "name": "activsg_projection", "order": 4,
        "title": "The projection on the large ACTIVSg grids (float64)",
        "command": "python -m benchmarks.dcopf projection --case C --dtype float64 "
        "--accuracy 4 --batch 8 --solver-instances 4 --repeats 3; "
        "python -m benchmarks.dcopf report --record",
        **_provenance(records[-1]["machine"]),
        "headline": [{
            "label": "DC-OPF projection",
            "measure": f"f64 inference, {largest['case']} ({largest['dim']:,} "
            f"variables), ms per instance (built in {largest['build_s']:.0f} s, "
            f"{largest['peak_rss_gb_after_build']:.1f} GB; every output within "
            f"{errs:.1g} of the certified projection)",
            "ours": f"{largest['per_instance_ms']:,.0f} ms",
            "baseline": f"Clarabel {largest['clarabel_ms']['median']:,.0f} ms",
            "ratio": f"{largest['ratio_to_clarabel']:.2f} (far from the set: "
            f"{largest['far_timing']['ratio_to_clarabel']:.2f})",
        }],
        "blocks": committed.blocks("\n\n".join(parts)),
    }  # fmt: skip


def report(out: pathlib.Path, record: bool = False) -> list[pathlib.Path]:
    """Writes `out/dcopf.md` and its figures; with `record`, the distances figure
    goes to `benchmarks/figures/dcopf/` and the committed records and pages are
    written. Returns the paths."""
    records, trains, distances = (
        _records(out, kind) for kind in ("projection", "train", "distances")
    )
    text = "# DC-OPF projection benchmark\n\n" + table(records)
    if trains:
        text += "\n" + training_table(trains)
    if distances:
        text += "\n## Inference time against the distance\n\n"
        text += distances_table(distances)
    md = out / "dcopf.md"
    md.write_text(text)
    paths = [md]
    if distances:
        figures = FIGURES if record else out
        paths.append(distances_figure(distances, figures / "dcopf_distances.png"))
    activsg = [r for r in records if r["case"].startswith("case_ACTIVSg")]
    if record:
        # Both records are rebuilt from the raw ones alone: a grid rerun by
        # itself would silently drop the others' rows (and mix machines).
        _keeps_every_grid("distances", distances)
        _keeps_every_grid("activsg_projection", activsg)
        link = "![time against distance](../figures/dcopf/dcopf_distances.png)"
        written = [distances_record(distances, link)] if distances else []
        written += [activsg_record(activsg)] if activsg else []
        paths += [committed.write(r) for r in written]
        paths += committed.render(["dcopf"]) if written else []
    if records:
        paths.append(figure(records, out / "dcopf_time.png"))
    # Records written before they listed their instances are left out.
    listed = [t for t in trains if "gaps" in t]
    if listed:
        paths.append(training_figure(listed, out / "dcopf_training.png"))
    return paths


def _keeps_every_grid(name: str, raws: list[dict]) -> None:
    """Raises where the committed record `name` has table rows of a grid that
    no raw record in `raws` gives (nothing to check without raw records)."""
    path = committed.folder("dcopf") / "records" / f"{name}.json"
    if not raws or not path.exists():
        return
    blocks = json.loads(path.read_text())["blocks"]
    old = {row[0] for b in blocks for row in b.get("table", {}).get("rows", [])}
    missing = sorted(old - {r["case"] for r in raws})
    if missing:
        raise SystemExit(
            f"report --record: the committed {name} record has rows of {missing}, "
            "which have no raw record in this run's results; rerun them on this "
            "machine too (the page describes one run), or remove their rows."
        )


LABELS = {
    "ours": "ours (paper's recipe)", "ours-dist": "ours (+ distance)",
    "ours-sup": "ours (supervised)", "e2elr": "E2ELR", "mlp": "MLP + penalties",
}  # fmt: skip
ORDER = tuple(LABELS)
SOLVERS = {
    "clarabel_default": "Clarabel (default)", "clarabel_1e-08": "Clarabel (1e-8)",
    "highs_default": "HiGHS (default)", "highs_1e-08": "HiGHS (1e-8)",
}  # fmt: skip


def _key(r: dict) -> str:
    """A raw record's method, with its tag (`ours-s200`)."""
    return r["method"] + (f"-{r['tag']}" if r.get("tag") else "")


def _groups(records: list[dict]) -> dict[tuple, dict[str, dict]]:
    """`{(case, variant): {method: record}}`."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        groups.setdefault((r["case"], r["variant"]), {})[_key(r)] = r
    return groups


def _name(key: str) -> str:
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


def proxy_table(group: dict[str, dict], carried: list[list[str]] = ()) -> str:
    """One grid and variant's methods and solvers as a Markdown table; the
    `carried` rows (an earlier run's, for methods without a raw record here)
    go after this run's methods, solvers' after its solvers."""
    rows = []
    for method in sorted(set(group) - {"solvers"}, key=_rank):
        r, t = group[method], group[method]["test"]
        resid = t.get("residual_over_eps32", {}).get("max")
        rows.append([
            _name(method), t["n_hours"], _pct(t["gap_mean"]), _pct(t["gap"]["p99"]),
            _pct(t["overloaded_share"]), f"{t['overload_mw']['max']:.3g}",
            _pct(t["successful"]) if "successful" in t else "-",
            "-" if resid is None else f"{resid:.3g}",
            f"{t['timing']['per_instance_ms']:.3g}" if "timing" in t else "-",
            f"{r['train_s']:.0f}",
        ])  # fmt: skip
    rows += [row for row in carried if row[0] not in SOLVERS.values()]
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
    rows += [row for row in carried if row[0] in SOLVERS.values()]
    header = (
        "method|test hours|mean gap|p99 gap|hours overloaded|max overload MW|"
        "successful|max norm. residual / eps32|ms / instance (batch 256)|training s"
    )
    note = (
        "\nSolvers: per instance, one thread, `solve()`/`run()` only; their gap "
        "column is the largest relative cost difference to Clarabel at 1e-8 (the "
        "cached optimum); failed solves are left out of their time.\n"
    )
    solved = solvers or any(row[0] in SOLVERS.values() for row in carried)
    return committed.table(header.split("|"), rows) + "\n" + (note if solved else "")


def _infeasible_lines(group: dict[str, dict]) -> list[str]:
    lines = []
    for method, r in group.items():
        failed = r.get("failed_steps")
        if failed:
            stop = r.get("stopped_at")
            lines.append(
                f"- {_name(method)}: {len(failed)} training steps failed in the "
                f"library's host factorisation ({'; '.join(r['failed_messages'])})"
                + (f"; training stopped at step {stop}" if stop else "")
                + f"; the best network is from step {r['best_step']}."
            )
        inf = r.get("test", {}).get("infeasible_hours")
        if inf and inf.get("n_hours"):
            lines.append(
                f"- {_name(method)}: of the {inf['n_hours']} test hours Clarabel "
                f"finds infeasible ({inf['below_total_pmin']} below the total PMIN), "
                f"{inf.get('n_run', inf['n_hours'])} evenly spaced ones were run "
                f"through the layer: it flags {_pct(inf['flagged_infeasible'])} "
                f"`infeasible`, {_pct(inf['flagged_max_steps'])} `max_steps_reached`"
                f" and {_pct(inf['successful'])} `successful`; outputs finite: "
                f"{inf['finite']}."
            )
        same = r.get("test", {}).get("timing", {}).get("same_run")
        if same:
            lines.append(
                f"- {_name(method)}: timed in the same run as Clarabel's `solve()`"
                f" on {same['clarabel_hours']} of the same hours per turn, "
                f"{same['repeats']} turns: {same['ours_ms']:.3g} against "
                f"{same['clarabel_ms']:.3g} ms per instance, "
                f"**{same['ratio']:.2f}x** Clarabel."
            )
        # What a record says of itself (`*_note` keys): how it was made.
        notes = sorted(k for k in r if k.endswith("_note"))
        lines += [f"- {_name(method)}: {r[k]}." for k in notes]
    return lines


def gaps_figure(group: dict[str, dict], path: pathlib.Path) -> pathlib.Path:
    """Histograms of the test gaps (log scale; gaps below 1e-6, including the
    negative ones of outputs that are not feasible, are drawn at 1e-6)."""
    fig, ((ax,),) = plots.new(6, 3.8)
    bins = np.logspace(-6, 0, 49)
    for method in sorted(group, key=_rank):
        gaps = np.asarray(group[method]["test"]["per_hour"]["gap"])
        ax.hist(np.clip(gaps, 1e-6, 1), bins=bins, histtype="step", lw=1.5,
                label=_name(method))  # fmt: skip
    first = next(iter(group.values()))
    return plots.finish(fig, ax, path, log="x", ylabel="hours",
        xlabel="optimality gap vs Clarabel at 1e-8 (test hours; < 1e-6 at 1e-6)",
        title=f"{first['case']} ({first['variant']})")  # fmt: skip


def week_figure(group: dict[str, dict], path: pathlib.Path) -> pathlib.Path | None:
    """One held-out week hour by hour: total cost and largest line loading of
    the solver, ours and E2ELR (hours the solver finds infeasible are gaps)."""
    ref = group.get("ours") or group.get("e2elr")
    if ref is None:
        return None
    fig, ((ax_cost,), (ax_load,)) = plots.new(8, 5, nrows=2)
    opt = ref["test"]["per_hour"]
    # The solved test hours of the 168-hour window holding the most of them.
    hours = np.asarray(opt["hour"])
    inside = (hours >= hours[:, None]) & (hours < hours[:, None] + 168)
    start = hours[np.argmax(inside.sum(axis=1))]
    rows = np.flatnonzero((hours >= start) & (hours < start + 168))
    hours = hours[rows]
    first = hours[0]

    def draw(ax, x, values, **style):
        # Break the line where hours are missing (infeasible hours).
        v = np.full(168, np.nan)
        v[x - first] = values
        ax.plot(np.arange(168), v, **style)

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
             label=_name(method))  # fmt: skip
        draw(ax_load, h, np.asarray(ph["loading"])[idx], color=color, ls="--")
    ax_load.axhline(1.0, color="grey", lw=0.8)
    ax_load.set_ylabel("largest |flow| / rating")
    ax_load.set_xlabel(f"hours from {opt['time'][rows[0]]}")
    return plots.finish(fig, ax_cost, path, xlabel="",
        ylabel="cost (per-unit coefficients)",
        title=f"{ref['case']} ({ref['variant']}), held-out week")  # fmt: skip


# The column of `proxy_table`'s rows that holds the time per instance.
_MS_COLUMN = 8


def _row_times(head: str, rows: list[list[str]]) -> dict[str, dict[int, float]]:
    """Time per instance by label and buses, from one section's table `rows`
    (`case, variant` its `head`), where timed."""
    case, variant = head.split(", ")
    suffix = "" if variant == "real" else f" [{variant}]"
    series: dict[str, dict[int, float]] = {}
    # The buses an ACTIVSg grid's name gives (`case_ACTIVSg10k`: 10,000).
    match = re.fullmatch(r"case_ACTIVSg(\d+)(k?)", case)
    n_bus = match and int(match[1]) * (1000 if match[2] else 1)
    for row in rows if match else []:
        try:
            ms = float(row[_MS_COLUMN].replace(",", ""))
        except (IndexError, ValueError):  # not timed ("-" or empty)
            continue
        series.setdefault(row[0] + suffix, {})[n_bus] = ms
    return series


def earlier_times(old: dict[str, str], carried: dict) -> dict[str, dict[int, float]]:
    """The times of an earlier record's sections `old` (`_previous_sections`)
    that a run keeps: the rows it carries (`_carried`) of the grids it
    touched, and every row of those it did not."""
    times: dict[str, dict[int, float]] = {}
    for head, text in old.items():
        key = tuple(head.split(", "))
        rows = carried[key][0] if key in carried else _carry(text, set())[0]
        for label, points in _row_times(head, rows).items():
            times.setdefault(label, {}).update(points)
    return times


def time_figure(records: list[dict], path, carried: dict | None = None):
    """Time per instance against the number of buses, every method and solver
    (runs of the `pmin0` variant labelled as such): from the raw `records`,
    and from the `carried` rows of earlier runs (`_row_times`) where no raw
    record gives that method on that grid."""
    import matplotlib

    fig, ((ax,),) = plots.new(8.5, 4)
    ax.set_prop_cycle(color=[matplotlib.colormaps["tab20"](i) for i in range(20)])
    timed = []  # (label, buses, ms): the raw records', then the carried ones
    for r in records:
        if "n_bus" not in r:  # records written before they named their size
            continue
        suffix = "" if r["variant"] == "real" else f" [{r['variant']}]"
        if r["method"] == "solvers":
            for key, label in SOLVERS.items():
                if r.get(key) and r[key]["ms"]:
                    timed.append((label + suffix, r["n_bus"], r[key]["ms"]["median"]))
        elif "timing" in r["test"]:
            ms = r["test"]["timing"]["per_instance_ms"]
            timed.append((_name(_key(r)) + suffix, r["n_bus"], ms))
    timed += [(lb, n, ms) for lb, p in (carried or {}).items() for n, ms in p.items()]
    series: dict[str, dict[int, float]] = {}
    for label, n_bus, ms in timed:
        series.setdefault(label, {}).setdefault(n_bus, ms)
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
    keys = ["steps", "batch", "every", "n_test", "init"]
    if settings.get("scored_only"):  # its --n-val and --n-train chose the solves
        words.append("--scored-only")
        keys += ["n_val", "n_train"] if settings.get("n_train") else ["n_val"]
    for key in keys:
        if settings.get(key) is not None:
            words.append(f"--{key.replace('_', '-')} {settings[key]}")
    return " ".join(words + ([f"--tag {r['tag']}"] if r.get("tag") else []))


def _proxy_headline(groups: dict[tuple, dict[str, dict]], previous=()) -> list[dict]:
    """The headline: each grid's proxies (`_best_runs`) against Clarabel and
    E2ELR; E2ELR's numbers from the `previous` headline rows where this run has
    no record of it."""
    rows = []
    for (case, variant), group in sorted(groups.items(), reverse=True):
        solver = (group.get("solvers") or {}).get("clarabel_1e-08")
        if variant != "real":
            continue
        # Clarabel's time from this run's solvers, where they ran (the proxies
        # timed in the same run as Clarabel need none).
        ref = solver["ms"]["median"] if solver else None
        if e2elr := group.get("e2elr"):
            e2elr_text = (
                f"; E2ELR gap {_pct(e2elr['test']['gap_mean'])}, "
                f"{_pct(e2elr['test']['overloaded_share'])} of hours overloaded"
            )
        else:
            same = [r["baseline"] for r in previous if r["measure"].split()[0] == case]
            e2elr_text = "".join(b[b.index(";") :] for b in same[:1] if ";" in b)
        rows += [_headline_row(case, r, ref, e2elr_text) for r in _best_runs(group)]
    return rows


def _best_runs(group: dict[str, dict]) -> list[dict]:
    """One run per recipe: the paper's, the supervised one, and a fine-tune of
    a checkpoint (`--init`) where one was run; of a recipe's runs (tags), the
    one of the best validation gap, as a user would choose."""
    recipes: dict[tuple, list[dict]] = {}
    for key in sorted(group, key=_rank):
        r = group[key]
        if r.get("method") in ("ours", "ours-sup"):
            init = bool((r.get("settings") or {}).get("init"))
            recipes.setdefault((r["method"], init), []).append(r)
    return [min(runs, key=lambda r: r.get("best_val_gap", np.inf))
            for runs in recipes.values()]  # fmt: skip


def _headline_row(case: str, ours: dict, ref, e2elr_text: str) -> dict:
    """A proxy's headline row; timed in the same run as Clarabel where it was
    (`_same_run`), else against Clarabel's time `ref`."""
    t = ours["test"]
    ms = t["timing"]["per_instance_ms"] if "timing" in t else None
    same = t.get("timing", {}).get("same_run")
    base, how = (same["clarabel_ms"], "same run") if same else (ref, "")
    timed = ms is not None and base is not None
    ratio = same["ratio"] if same else ms / base if timed else None
    return {
        "label": "DC-OPF proxy",
        "measure": f"{case} ({t['n_hours']} feasible test hours): "
        f"{_name(_key(ours))}, mean gap (p99), ms per instance",
        "ours": f"{_pct(t['gap_mean'])} ({_pct(t['gap']['p99'])}), "
        + ("not timed" if ms is None else
           f"{same['ours_ms'] if same else ms:.3g} ms"),
        "baseline": ("Clarabel not timed" if base is None
                     else f"Clarabel {base:.3g} ms")
        + (f" ({how})" if how else "") + e2elr_text,
        "ratio": "-" if ratio is None else f"{ratio:.2f} (time vs Clarabel)",
        "date": ours["machine"]["date"][:10],
        "machine": _machine(ours["machine"]),
        "command": _command(ours),
    }  # fmt: skip


def _recipe(row: dict) -> tuple[str, str, bool]:
    """A headline row's grid and recipe (as `_best_runs` groups runs): its
    case, its method and whether it fine-tunes a checkpoint, by its command.
    A rerun's row replaces the earlier row of its recipe, and only that."""
    method = re.search(r"--method (\S+)", row["command"])
    name = method.group(1) if method else ""
    return row["measure"].split(" (")[0], name, "--init" in row["command"]


_CARRIED = "Rows carried from the earlier run"


def _previous_sections(previous: dict | None) -> dict[str, str]:
    """The committed record's Markdown per `### case, variant` heading."""
    if not previous:
        return {}
    body = committed.section({**previous, "title": ""})
    body = body.replace(TIME_FIGURE, "")
    chunks = re.split(r"^### (.+)$", body, flags=re.M)
    return {head: text.strip() for head, text in zip(chunks[1::2], chunks[2::2])}


def _carry(old: str, labels: set[str]) -> tuple[list[list[str]], list[str]]:
    """From an earlier run's section: its table rows for methods and solvers
    not in `labels` (this run's), the notes of those methods, its provenance
    lines and figures. A section merged before holds its own run's rows and
    notes, then the ones it carried (after `_CARRIED`): the notes of both are
    kept for the methods carried on, and its own run's provenance line where
    any of that run's rows is."""
    lines = old.splitlines()
    table = [line for line in lines if line.startswith("|")][2:]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table]
    rows = [row for row in rows if row[0] not in labels]
    names = {row[0] for row in rows}
    marker = [i for i, line in enumerate(lines) if line.startswith(_CARRIED)]
    split = marker[0] if marker else 0
    before_carried = set()
    if marker:
        listed = lines[split].split("(", 1)[1].rsplit(")", 1)[0]
        before_carried = set(listed.split(", "))
    own = names - before_carried  # the earlier run's own rows carried on

    def kept(part: list[str], provenance: bool) -> list[str]:
        return [
            line
            for line in part
            if ("Commands:" in line and provenance)
            or line.startswith("![")
            or (line.startswith("- ") and line[2:].split(":")[0] in names)
        ]

    return rows, kept(lines[:split], bool(own)) + kept(lines[split:], True)


def _carried(groups, old: dict[str, str]) -> tuple[dict[tuple, tuple], bool]:
    """Per grid and variant of this run, what it carries from the earlier
    record's sections `old` (`_carry`), and whether it carries nothing at all
    (no row, no grid)."""
    carried = {}
    for (case, variant), group in groups.items():
        # The table rows this run's records give (solvers' where they ran).
        labels = {_name(m) for m in group if m != "solvers"}
        labels |= set(SOLVERS.values()) if "solvers" in group else set()
        head = f"{case}, {variant}"
        carried[case, variant] = _carry(old[head], labels) if head in old else ([], [])
    untouched = old.keys() - {f"{case}, {variant}" for case, variant in groups}
    return carried, not untouched and not any(rows for rows, _ in carried.values())


def _group_section(key, group, carry: tuple, figures: list[str]) -> list[str]:
    """One grid and variant: this run's records, with the rows of methods it
    did not run, their notes and figures carried from an earlier run (`carry`,
    from `_carried`; its figures, drawn from every method, then stay)."""
    case, variant = key
    carried, kept = carry
    machine = next(iter(group.values()))["machine"]
    cmds = "; ".join(f"`{c}`" for c in sorted({_command(r) for r in group.values()}))
    out = [f"### {case}, {variant}\n\n" + proxy_table(group, carried)]
    out += _infeasible_lines(group)
    out.append(f"{provenance.describe(machine)}, {machine['date']}. Commands: {cmds}.")
    if carried:
        names = ", ".join(row[0] for row in carried)
        out.append(f"{_CARRIED} ({names}), its notes and figures:")
        out += kept
    else:
        out += [f"![{name}](../figures/dcopf/{name})" for name in figures]
    return out


def proxy_record(raw: list[dict], figures: dict, previous: dict | None = None):
    """The committed record: a table per grid and variant, figures, headline.
    Grids and methods of the `previous` record without a raw record here are
    carried from it as they were (sections, rows, headline rows, commits)."""
    groups = _groups(raw)
    old = _previous_sections(previous)
    carried, whole = _carried(groups, old)
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
    heads = {f"{case}, {variant}": (case, variant) for case, variant in groups}
    for head in sorted(set(heads) | set(old)):
        if head not in heads:  # a grid this run did not touch: as it was
            body.append(f"### {head}\n\n{old[head]}")
            continue
        key = heads[head]
        body += _group_section(key, groups[key], carried[key], figures.get(key, []))
    dates = sorted(r["machine"]["date"][:10] for r in raw)
    earlier = (previous or {}).get("headline", [])
    headline = _proxy_headline(groups, earlier)
    fresh = {_recipe(row) for row in headline}
    if previous:  # other recipes' rows as they were, with their own dates
        headline += [
            {"date": previous.get("date", ""), "machine": previous["machine"], **row}
            for row in earlier
            if _recipe(row) not in fresh
        ]
        dates.append(previous.get("date", ""))
    commits = {r["machine"].get("git", "?") for r in raw}
    if not whole:
        commits |= set(previous.get("commit", "").split(", ")) - {""}
    return {
        "suite": "dcopf", "name": "proxy", "order": 5,
        "title": "DC-OPF proxies on the ACTIVSg hours",
        "command": "python -m benchmarks.dcopf proxy-report",
        "machine": _machine(raw[0]["machine"]),
        "date": max(dates, default=""), "source": "run",
        "commit": ", ".join(sorted(commits)),
        "headline": headline,
        "blocks": committed.blocks("\n\n".join([*body, TIME_FIGURE])),
    }  # fmt: skip


def proxy_report(out: pathlib.Path, figures=FIGURES) -> list[pathlib.Path]:
    """Writes the figures (into `figures`), the record and the pages: their paths.
    Methods and grids of the committed record without a raw record in `out` are
    carried over (`proxy_record`); a grid's figures that would then lose some of
    its methods are not redrawn, and the time figure takes their times from the
    carried rows."""
    raw = _records(out, "proxy")
    groups = _groups(raw)
    path = committed.folder("dcopf") / "records" / "proxy.json"
    previous = json.loads(path.read_text()) if path.exists() else None
    old = _previous_sections(previous)
    carried, _ = _carried(groups, old)
    paths, names = [], {}
    figures.mkdir(parents=True, exist_ok=True)
    for (case, variant), group in sorted(groups.items()):
        trained = {m: r for m, r in group.items() if m != "solvers"}
        if trained and not carried[(case, variant)][0]:
            stem = f"{case}-{variant}"
            drawn = [gaps_figure(trained, figures / f"proxy_gaps_{stem}.png")]
            if case in SCENARIO_CASES:  # sampled loads have no week
                drawn.append(week_figure(trained, figures / f"proxy_week_{stem}.png"))
            drawn = [p for p in drawn if p is not None]
            names[(case, variant)] = [p.name for p in drawn]
            paths += drawn
    if raw:
        times = earlier_times(old, carried)
        paths.append(time_figure(raw, figures / "proxy_time.png", times))
        paths.append(committed.write(proxy_record(raw, names, previous)))
        paths += committed.render(["dcopf"])
    return paths
