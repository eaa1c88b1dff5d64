"""The record's measurements and its Markdown tables."""

from __future__ import annotations

import numpy as np

from .._common.provenance import describe
from .._common.timing import fmt
from ._data import (
    F32_REL_TARGET,
    F64_TARGET,
    FLOOR_FACTOR,
    KINDS,
    TIMING_BATCH,
    CaseData,
)


def measure(data: CaseData, floor: dict, arrays: dict, dtype: str) -> dict:
    """The measured CVs, flags and iteration counts of one dtype's outputs."""
    target = F32_REL_TARGET * max(1.0, data.data_norm())
    if dtype == "float64":
        target = F64_TARGET
    rows = np.asarray(floor["rows"])
    out = {"target": target}
    for kind in KINDS:
        cv = data.violation(arrays[f"{kind}:y"])
        ok = arrays[f"{kind}:successful"]
        entry = {
            "cv_max": float(cv.max()),
            "cv_median": float(np.median(cv)),
            "cv_max_floor_rows": float(cv[rows].max()),
            "over_target": int((cv > target).sum()),
            "successful": float(ok.mean()),
            "max_steps_reached": float(arrays[f"{kind}:max_steps_reached"].mean()),
            "infeasible": float(arrays[f"{kind}:infeasible"].mean()),
            # The flag against the measured CV.
            "successful_but_over_target": int((ok & (cv > target)).sum()),
            "not_successful_but_within_target": int((~ok & (cv <= target)).sum()),
            "reported_primal_residual_max": float(
                arrays[f"{kind}:primal_residual"].max()
            ),
            "n_iter_max": int(arrays[f"{kind}:n_iter"].max()),
        }
        if dtype == "float32":
            f = floor[kind]["floor"]
            entry["ratio_to_floor"] = entry["cv_max_floor_rows"] / f if f > 0 else None
            entry["met"] = bool(
                entry["cv_max"] <= target
                and entry["cv_max_floor_rows"] <= FLOOR_FACTOR * f
            )
        else:
            entry["met"] = bool(entry["cv_max"] <= target)
        if f"{kind}:reference_y" in arrays:
            entry["reference_cv_max"] = float(
                data.violation(arrays[f"{kind}:reference_y"]).max()
            )
        out[kind] = entry
    out["met"] = all(out[kind]["met"] for kind in KINDS)
    return out


def _e(x) -> str:
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.1e}"


def _ms(stats: dict | None) -> str:
    if stats is None:
        return "–"
    return fmt(stats, ".2f" if 1e3 * stats["median"] < 10 else ".0f", scale=1e3)


def _accuracy_row(name: str, c: dict) -> str:
    r32, r64, floor = c.get("float32"), c.get("float64"), c["floor"]

    def f32(kind):
        if r32 is None:
            return "–"
        k = r32[kind]
        ratio = k.get("ratio_to_floor")
        ratio = "–" if ratio is None else f"{ratio:.3g}"
        over = f", {k['over_target']} over" if k["over_target"] else ""
        return f"{_e(k['cv_max'])} / {_e(floor[kind]['floor'])} ({ratio}{over})"

    def f64(kind):
        if r64 is None:
            return "–"
        k = r64[kind]
        over = f" ({k['over_target']} over)" if k["over_target"] else ""
        return f"{_e(k['cv_max'])}{over}"

    def met(r):
        return "–" if r is None else ("yes" if r["met"] else "**no**")

    def share(r):
        if r is None:
            return "–"
        return f"{r['near']['successful']:.0%} / {r['far']['successful']:.0%}"

    return (
        f"| {name} | {c['n']} ({len(floor['rows'])}) | {c['data_norm']:.3g} "
        f"| {_e(c['f32_target'])} | {f32('near')} | {f32('far')} | {met(r32)} "
        f"| {f64('near')} / {f64('far')} | {met(r64)} | {share(r32)} "
        f"| {share(r64)} |"
    )


def _latency_row(name: str, c: dict) -> str:
    batch, single = c["timing"]["batch"], c["timing"]["single"]
    near = c.get("float32", {}).get("near", {})
    far = c.get("float32", {}).get("far", {})
    ref_cv = "–"
    if "reference_cv_max" in near:
        ref_cv = f"{_e(near['reference_cv_max'])} / {_e(far['reference_cv_max'])}"
    cells = [
        batch["ours near"],
        batch.get("ours far"),
        batch.get("ours near, polish=False"),
        batch.get("ours near, refine=False"),
        batch.get("reference"),
        single["ours"],
        single.get("ours, as argument"),
        single.get("ours, polish=False"),
        single.get("ours, refine=False"),
        single.get("reference"),
    ]
    return f"| {name} | " + " | ".join(_ms(x) for x in cells) + f" | {ref_cv} |"


def markdown(record: dict) -> str:
    """The record's tables: accuracy and flags, then latency."""
    m = record["machine"]
    lines = [
        f"Command: `{record['command']}`. Machine: {describe(m)}; date "
        f"{m['date']}, load average {m['load_avg'][0]:.1f} at the start.",
        "",
        "Max CV of the outputs (float64 arithmetic on the float64 data). Float32: "
        "CV / float32 rounding floor of the exact projection (ratio: the max CV "
        "over the floor's instances divided by the floor; 'over': instances above "
        f"the target); target ≤ {F32_REL_TARGET:g}·max(1, ‖data‖∞) and ≤ "
        f"{FLOOR_FACTOR}× floor. Float64 target ≤ {F64_TARGET:g}. `successful`: "
        "share of instances whose `ProjectionSolution.result` is "
        "`RESULTS.successful`.",
        "",
        "| Case | n (floor) | ‖data‖∞ | f32 target | f32 near | f32 far | f32 met "
        "| f64 near / far | f64 met | `successful` f32 near / far "
        "| f64 near / far |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_accuracy_row(name, c) for name, c in record["cases"].items()]
    timed = {n: c for n, c in record["cases"].items() if c.get("timing")}
    if timed:
        lines += [
            "",
            "Latency of the jitted forward pass, float32, median [quartiles] in ms, "
            "all calls of a row interleaved: the library defaults on the near and "
            "far batches, the defaults but `polish=False` (what the polish costs, "
            "polyhedral sets) and `refine=False` (what the refinement and polish "
            "cost), and the reference (`pinet-hcnn` at the paper's configuration) "
            "where there is one, with its max CV on the same raw outputs. Each "
            "layer is jitted as a closure, its arrays constants; 'as argument' is "
            "ours under `eqx.filter_jit` with the projector as an argument, as "
            "Equinox code calls a model.",
            "",
            f"| Case | batch {TIMING_BATCH} near | far | near, polish=False "
            "| near, refine=False | reference | single | single, as argument "
            "| single, polish=False | single, refine=False | single reference "
            "| reference f32 CV near / far |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [_latency_row(name, c) for name, c in timed.items()]
    return "\n".join(lines)
