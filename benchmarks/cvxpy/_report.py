"""The Markdown tables of a `python -m benchmarks.cvxpy` record.

Times are milliseconds: the steady-state median with its interquartile range
in parentheses and its min-max in brackets; first calls (compilation included
for ours) are seconds.
"""

from __future__ import annotations

from .._common.provenance import describe
from .._common.records import table
from .._common.timing import fmt
from ._measure import TARGET_A, TARGET_B

KINDS = ("forward", "forward_backward")
LAYER_NAMES = {
    "ours_train": "ours, training mode (defaults)",
    "ours_inference": "ours, inference mode",
    "cvxpylayers": "cvxpylayers (defaults: diffcp + SCS)",
    "cvxpylayers_clarabel": "cvxpylayers (diffcp + Clarabel)",
}


def _ms(s: dict) -> str:
    return fmt(s, ".2f", "{median} ({lq}-{uq}) [{min}-{max}]", 1e3)


def _build(s: dict) -> str:
    return f"{s['cold']:.2f} / {s['warm']:.3f}"


def _met(ratio: float, target: float) -> str:
    return f"{ratio:.3f} ({'met' if ratio <= target else 'NOT met'})"


def markdown(record: dict) -> str:
    """All tables of `record` (the parts it holds)."""
    m = record["machine"]
    lines = [
        f"`{record['command']}`",
        "",
        f"Machine: {describe(m)} (pinet_eqx sources "
        f"{record['pinet_eqx_source']}). Load average (1 min) at start "
        f"{m['load_avg'][0]:.2f}, at end {record['machine_after']['load_avg'][0]:.2f}. "
        f"All timings in {record['dtype']} (`jax_enable_x64`). Times: median "
        "(IQR) [min-max] in ms over the repeats after one warm-up call; first "
        "call in s (ours: tracing and compilation included).",
        "",
    ]
    if "speed" in record:
        lines += _speed(record["speed"])
    if "overhead" in record:
        lines += _pairs(
            record["overhead"],
            "Target B: from_cvxpy vs hand-built, DC3 "
            + record["overhead"]["problem"]["size"],
            TARGET_B,
        )
    if "native_sets" in record:
        lines += _pairs(
            record["native_sets"],
            "native_sets=False (rows and auxiliary coordinates as cvxpy gives "
            "them) vs default (Box bounds, norm cones), target A's problem",
            None,
        )
    if "partial_sums" in record:
        lines += _partial_sums(record["partial_sums"])
    if "accuracy" in record:
        lines += _accuracy_table(record["accuracy"])
    return "\n".join(lines) + "\n"


def _accuracy_table(rows: list[dict]) -> list[str]:
    """The accuracy target's table (`_accuracy.run`)."""
    lines = [
        "### Accuracy: from_cvxpy at the defaults (inference, float64) against "
        "Clarabel (1e-12) and central differences",
        "",
        "Projection error: relative infinity norm against Clarabel, half the "
        "points near the set and half far (target 1e-6); where Clarabel stops "
        "at 'optimal_inaccurate', ours counts as exact when it is feasible "
        "(cvxpy's residuals, 1e-9) and no farther from y_raw (column 'Clarabel "
        "inaccurate'). Derivative error: relative, directional derivatives of "
        "w.y along y_raw and each parameter, against central differences of our "
        "forward pass iterated to 1e-13 (step 1e-6) and of Clarabel's projection "
        "(step 1e-4; its own error limits it) (target 1e-4).",
        "",
    ]
    columns = "family|d|aux|instances|successful|max error|median error|Clarabel "
    columns += "inaccurate|derivative vs FD (ours)|vs FD (Clarabel), median / max"
    body = [
        [r["family"], r["dim"], r["n_aux"], r["instances"], f"{r['successful']:.0%}",
         f"{r['max_error']:.1e}", f"{r['median_error']:.1e}",
         r["clarabel_inaccurate"], f"{r['gradient_error_vs_ours']:.1e}",
         f"{r['gradient_error_vs_clarabel_median']:.1e} / "
         f"{r['gradient_error_vs_clarabel']:.1e}"]
        for r in rows
    ]  # fmt: skip
    return [*lines, table(columns.split("|"), body), ""]


def _speed(r: dict) -> list[str]:
    t, p = r["timing"], r["problem"]
    active = ", ".join(f"{k} {v:.0%}" for k, v in p["active_share"].items())
    lines = [
        f"### Target A: from_cvxpy vs cvxpylayers (batch {r['batch']}, "
        f"{r['repeats']} repeats)",
        "",
        f"Problem: {p['n_var']} variables; partial sum {p['partial']}. Our "
        f"projector: {p['n_aux']} auxiliary coordinates, {p['n_eq']} equality rows, "
        f"{p['n_ineq']} inequality rows, {p['n_cone']} cone coordinates, "
        f"{p['n_boxed']} boxed coordinates, {p['affine_form']}, "
        f"{p['n_iter']} training iterations. Active at the projection: {active}.",
        "",
    ]
    columns = "layer|build s (cold / warm)|fwd first s|fwd ms|fwd+bwd first s|"
    columns += "fwd+bwd ms|fwd+bwd / cvxpylayers|max abs diff. to Clarabel 1e-10|"
    columns += "obj. - Clarabel's (max)|max viol.|grad rel. err vs "
    columns += f"{r['gradient_error_vs']} (max / median)"
    base = t["cvxpylayers/forward_backward"]["median"]
    setup, rows = r["setup_s"], []
    for name, label in LAYER_NAMES.items():
        if f"{name}/forward" not in t:
            continue
        f, fb = t[f"{name}/forward"], t[f"{name}/forward_backward"]
        g = r["gradient_error"].get(name)
        rows.append([
            label, _build(setup.get(name, setup["ours"])), f"{f['first_s']:.2f}",
            _ms(f), f"{fb['first_s']:.2f}", _ms(fb), f"{fb['median'] / base:.3f}",
            _accuracy(r["accuracy_vs_clarabel_1e-10"][name]),
            f"{g['max']:.1e} / {g['median']:.1e}" if g else "(reference)",
        ])  # fmt: skip
    lines.append(table(columns.split("|"), rows, "l" + "r" * 10))
    ratio = r["ratio"]["ours_train/cvxpylayers/forward_backward"]
    it = r["inference_iterations"]
    lines += [
        "",
        f"Target A (ours in training mode / cvxpylayers at defaults, fwd+bwd, "
        f"<= {TARGET_A}): {_met(ratio, TARGET_A)}. Inference mode: "
        f"{r['ratio']['ours_inference/cvxpylayers/forward_backward']:.3f}. "
        f"Sanity: max abs difference of ours (inference) and cvxpylayers "
        f"(defaults): {r['sanity_max_abs_ours_inference_vs_cvxpylayers']:.1e}. "
        "Clarabel's own solutions at tolerances 1e-8 and 1e-10 differ by up to "
        f"{r['clarabel_1e-8_vs_1e-10']:.1e} (its violation at 1e-10: "
        f"{r['accuracy_vs_clarabel_1e-10']['ours_train']['ref_violation']:.1e}). "
        f"Inference iterations: median {it['median']:.0f}, max {it['max']}, "
        f"{it['successful']}/{r['batch']} successful.",
        "",
    ]
    return lines


def _accuracy(a: dict) -> str:
    return f"{a['max_abs']:.1e} | {a['objective_excess']:.1e} | {a['violation']:.1e}"


def _pairs(r: dict, title: str, target: float | None) -> list[str]:
    t, base, cand = r["timing"], r["baseline"], r["candidate"]
    columns = "projector|mode|build s (cold / warm)|fwd first s|fwd ms|fwd+bwd "
    columns += "first s|fwd+bwd ms|inference iterations (median / max, successful)"
    rows = []
    for name in (base, cand):
        s = r["structure"][name]
        it = r["inference_iterations"][name]
        for mode in ("train", "inference"):
            f = t[f"{name}/{mode}/forward"]
            fb = t[f"{name}/{mode}/forward_backward"]
            iters = f"{s['n_iter']} (fixed)"
            if mode == "inference":
                iters = f"{it['median']:.0f} / {it['max']} ({it['successful']} ok)"
            rows.append([
                name, mode, _build(r["setup_s"][name]), f"{f['first_s']:.2f}",
                _ms(f), f"{fb['first_s']:.2f}", _ms(fb), iters,
            ])  # fmt: skip
    ratios = []
    for mode in ("train", "inference"):
        cells = [mode]
        for kind in KINDS:
            ratio = r["ratio"][f"{mode}/{kind}"]
            cells.append(_met(ratio, target) if target else f"{ratio:.3f}")
        ratios.append([*cells, f"{r['max_abs_difference'][mode]:.1e}"])
    columns2 = ["mode", f"fwd {cand} / {base}", f"fwd+bwd {cand} / {base}"]
    lines = [
        f"### {title} (batch {r['batch']}, {r['repeats']} repeats)",
        "",
        table(columns.split("|"), rows, "llrrrrrr"),
        "",
        table([*columns2, "max abs difference of outputs"], ratios, "lrrr"),
    ]
    structure = "; ".join(
        f"{name}: {s['n_eq']} eq. rows, {s['n_ineq']} ineq. rows, {s['n_cone']} cone "
        f"coords, {s['n_boxed']} boxed, {s['n_aux']} aux., {s['affine_form']}"
        for name, s in r["structure"].items()
    )
    lines += ["", f"Built as: {structure}.", ""]
    return lines


def _partial_sums(r: dict) -> list[str]:
    columns = ["form", "aux. coords", "training: max abs diff. / obj. - Clarabel's "
               "/ max viol.", "inference: the same",
               "inference iterations (median / max)", "successful"]  # fmt: skip
    rows = []
    for s in r.values():
        it = s["inference_iterations"]
        rows.append([
            s["description"], s["structure"]["n_aux"],
            _accuracy(s["train"]).replace(" |", " /"),
            _accuracy(s["inference"]).replace(" |", " /"),
            f"{it['median']:.0f} / {it['max']}", f"{it['successful']}/{s['batch']}",
        ])  # fmt: skip
    title = "### Partial-sum forms: accuracy of from_cvxpy at defaults (no timing)"
    return [title, "", table(columns, rows, "lrrrrr"), ""]
