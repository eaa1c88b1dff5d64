"""The instances of one case, their float32 rounding, the shared settings, and
the record's measurements and Markdown tables."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

from .._common.problems import linear_violation
from .._common.provenance import describe
from .._common.timing import fmt

# The repository's root, where worker processes run.
ROOT = pathlib.Path(__file__).resolve().parents[2]

NEAR_SCALE = 0.01  # standard deviation of the noise around the optimum, near
FAR_SCALE = 5.0  # and far (an untrained backbone's outputs)
F32_REL_TARGET = 1e-6  # float32 max CV <= this * max(1, ||data||_inf)
FLOOR_FACTOR = 1.5  # ... and <= this * the float32 rounding floor
F64_TARGET = 1e-9
KINDS = ("near", "far")
DTYPES = ("float32", "float64")
TIMING_BATCH = 1024
PROTOCOL = {  # the record's, with the run's seed and cache
    "projector": "pe.Projector(constraints), eqx.nn.inference_mode",
    "near": f"optimum + {NEAR_SCALE} N(0, I)",
    "far": f"optimum + {FAR_SCALE} N(0, I)",
    "f32_target": f"<= {F32_REL_TARGET} max(1, ||data||_inf) and "
    f"<= {FLOOR_FACTOR} x floor",
    "f64_target": F64_TARGET,
}


def float32_grid(a) -> np.ndarray:
    """`a` rounded to float32, held in float64."""
    return np.asarray(a, np.float64).astype(np.float32).astype(np.float64)


@dataclasses.dataclass(frozen=True, eq=False)
class CaseData:
    r"""One case's instances in float64: instance $i$'s set is $\{y : E y = q_i,\
    \ell \le C y \le u,\ \|S y\|_2 \le f^\top y\}$ (no rows of `S` without a
    cone), the form of the CV and the exact projection; the projector is built
    from `spec`, with the per-instance `params`. Also the raw outputs `near` and
    `far` and how the instances were made (`info`)."""

    name: str
    E: np.ndarray
    q: np.ndarray
    C: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    S: np.ndarray
    f: np.ndarray
    params: dict
    near: np.ndarray
    far: np.ndarray
    spec: dict
    info: dict

    @property
    def n(self) -> int:
        return len(self.near)

    @property
    def dim(self) -> int:
        return self.E.shape[1]

    def raw(self, kind: str) -> np.ndarray:
        return self.near if kind == "near" else self.far

    def violation(self, Y, q=None) -> np.ndarray:
        """The CV of each row of `Y` for the right-hand sides `q` (default: all
        the instances'), float64: the largest of $|E y - q|$, the bounds' excess
        and the cone's $(\\|S y\\| - f^\\top y)_+$."""
        Y = np.asarray(Y, np.float64)
        q = self.q if q is None else q
        out = linear_violation(Y, self.E, q, self.C, self.lower, self.upper)
        if len(self.S):
            cone = np.linalg.norm(Y @ self.S.T, axis=1) - Y @ self.f
            out = np.maximum(out, cone)
        return np.maximum(out, 0.0)

    def data_norm(self) -> float:
        """$\\|\\text{data}\\|_\\infty$: the largest entry of the constraint data
        (matrices, right-hand sides, finite bounds) over all instances."""
        parts = [self.E, self.q, self.C, self.S, self.f]
        bounds = np.concatenate([self.lower, self.upper])
        parts.append(bounds[np.isfinite(bounds)])
        return float(max(np.abs(p).max(initial=0.0) for p in parts))

    def save(self, path) -> None:
        arrays = {
            k: getattr(self, k)
            for k in ("E", "q", "C", "lower", "upper", "S", "f", "near", "far")
        }
        arrays |= {f"param:{k}": v for k, v in self.params.items()}
        arrays |= {f"spec:{k}": np.asarray(v) for k, v in self.spec.items()}
        np.savez(path, **arrays)
        pathlib.Path(path).with_suffix(".json").write_text(
            json.dumps({"name": self.name, "info": self.info})
        )

    @classmethod
    def load(cls, path) -> CaseData:
        meta = json.loads(pathlib.Path(path).with_suffix(".json").read_text())
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        params = {k[6:]: v for k, v in arrays.items() if k.startswith("param:")}
        spec = {k[5:]: v for k, v in arrays.items() if k.startswith("spec:")}
        plain = {k: v for k, v in arrays.items() if ":" not in k}
        return cls(meta["name"], **plain, params=params, spec=spec, info=meta["info"])


def case_data(
    name, E, q, C, lower, upper, optimum, params, spec, info, seed, S=None, f=None
):
    """`CaseData` with near and far raw outputs drawn around `optimum`; the raw
    outputs and the per-instance data are rounded to float32."""
    rng = np.random.default_rng([seed, 15])
    d = E.shape[1]
    noise = rng.normal(size=(2, *optimum.shape))
    return CaseData(
        name=name,
        E=np.asarray(E, np.float64),
        q=float32_grid(q),
        C=np.asarray(C, np.float64),
        lower=np.asarray(lower, np.float64),
        upper=np.asarray(upper, np.float64),
        S=np.zeros((0, d)) if S is None else np.asarray(S, np.float64),
        f=np.zeros(d) if f is None else np.asarray(f, np.float64),
        params={k: float32_grid(v) for k, v in params.items()},
        near=float32_grid(optimum + NEAR_SCALE * noise[0]),
        far=float32_grid(optimum + FAR_SCALE * noise[1]),
        spec=spec,
        info={**info, "near": PROTOCOL["near"], "far": PROTOCOL["far"]},
    )  # fmt: skip


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
