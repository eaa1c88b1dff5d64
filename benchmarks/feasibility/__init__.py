r"""Inference feasibility at the library's defaults (issue 15).

For each case the projector is `pe.Projector(constraints)`, with no keyword but
the constraints, switched to inference with `eqx.nn.inference_mode`. It projects
two batches of raw outputs: *near* ($y^\star + 0.01\,\mathcal{N}(0, I)$, about
where a trained network puts them) and *far* ($y^\star + 5\,\mathcal{N}(0, I)$,
as an untrained backbone gives), with $y^\star$ an optimum of the case's problem.
Measured, per case:

- the largest constraint violation (CV) of the outputs, in float64 from the
  constraint data, in float32 and in float64 (one worker process per dtype, so
  that JAX's x64 flag is set before it starts);
- the float32 rounding floor: the CV of the exact projection, computed in
  float64 independently of `pinet_eqx` and rounded to float32. For DC3 it is a
  primal-dual active-set solve in the slack variables $w = G y$ (checked against
  cvxpy + Clarabel on a few instances of the smaller sizes); elsewhere cvxpy +
  Clarabel at tight tolerances, polished by Newton's method on the KKT
  conditions of the active set (`polish`). The record holds their float64 CV
  and KKT residuals;
- the share of instances whose `ProjectionSolution.result` is
  `RESULTS.successful`, and whether that flag agrees with the measured CV;
- batch-1024 and single-instance latency of the jitted forward pass (float32),
  interleaved with the same at `polish=False` and at `refine=False` (what the
  default polish and refinement cost), with the projector as a jit argument
  (single instance), and, on DC3, with the reference (`pinet-hcnn` at the
  paper's configuration: its tuned $\sigma$, Ruiz equilibration, 50
  iterations).

The raw outputs and the per-instance data are rounded to float32 before anything
else, so that both precisions and the exact projection see the same instances.
The targets are the issue's: float32 max CV at most
$10^{-6} \max(1, \|\text{data}\|_\infty)$ and at most 1.5 times the floor (on the
instances the floor was computed for); float64 max CV at most $10^{-9}$.

    python -m benchmarks.feasibility [--cases ...] [--dtypes float32 float64]
        [--instances DIR] [--n N] [--no-timing] [--out PATH] [--markdown PATH]
        [--cache DIR [--prepare-only]]

`--instances` points at the folder of the paper's DC3 files
(`dc3_random_{simple,nonconvex}_dataset_*{valid,test}.npz`); without it the DC3
instances are generated with `pinet_eqx.problems.make_dc3` (the same data) and
their optima solved here. The record (JSON) holds every number; the Markdown
tables go to standard output (and to `--markdown`). `--cache DIR` keeps the
instances and their exact projections in `DIR`, and `--prepare-only` stops
after making them: `benchmarks/gpu.sh` runs every case on a GPU machine that
lacks the solvers (cvxpy, OSQP, IPOPT) from a cache prepared on a CPU.

The package: `_data` (a case's instances, `CaseData`, and the targets),
`_exact` (the floors: the exact projections in float64), `_cases` (each case's
instances, our projector and the reference's), `_worker` (the per-dtype
processes that project and time) and `_report` (the measurements and the
tables); this module holds the command line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import tempfile
import time

import numpy as np

from .._common.provenance import command_line, log, machine, save
from ._cases import CASES, DEFAULT_CASES, Case
from ._data import (
    DTYPES,
    F32_REL_TARGET,
    F64_TARGET,
    FAR_SCALE,
    FLOOR_FACTOR,
    NEAR_SCALE,
    ROOT,
    CaseData,
)
from ._exact import ClarabelProjection, exact_projections, polish
from ._report import markdown, measure
from ._worker import run_worker, worker

__all__ = [
    "CASES",
    "Case",
    "CaseData",
    "ClarabelProjection",
    "exact_projections",
    "main",
    "markdown",
    "parser",
    "polish",
    "run",
]

PROG = "python -m benchmarks.feasibility"
DEFAULT_OUT = ROOT / "benchmarks" / "_out" / "feasibility.json"


# ------------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", choices=tuple(CASES), default=DEFAULT_CASES)
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=DTYPES)
    p.add_argument(
        "--instances", type=pathlib.Path, help="folder of the DC3 .npz files"
    )
    p.add_argument("--n", type=int, help="instances per case (default: the case's)")
    p.add_argument(
        "--n-floor", type=int, help="instances for the floor (default: the case's)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-timing", action="store_true", help="skip the latency")
    p.add_argument(
        "--repeat-scale",
        type=float,
        default=1.0,
        help="multiply every case's timed repeats (at least 2)",
    )
    p.add_argument(
        "--cache",
        type=pathlib.Path,
        help="folder for the instances and their exact projections: read from it "
        "where an earlier run with the same settings wrote them, written otherwise "
        "(a GPU machine without cvxpy, OSQP or IPOPT can then run every case)",
    )
    p.add_argument(
        "--prepare-only",
        action="store_true",
        help="with --cache: fill it, and stop before the workers",
    )
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="JSON record")
    p.add_argument("--markdown", type=pathlib.Path, help="also write the tables here")
    p.add_argument("--worker", choices=DTYPES, help=argparse.SUPPRESS)
    p.add_argument("--folder", type=pathlib.Path, help=argparse.SUPPRESS)
    return p


def _instances_and_floor(name: str, args) -> tuple[CaseData, dict]:
    """A case's instances and their exact projections: built and solved here,
    or read from `args.cache` where an earlier run with the same case, `--n`,
    `--n-floor`, `--seed` and `--instances` left them (and written there
    otherwise)."""
    case = CASES[name]
    n = args.n or case.n
    n_floor = args.n_floor or case.n_floor or n
    # The folder's name, not its path: a GPU machine reads a copy elsewhere.
    instances = None if args.instances is None else args.instances.name
    key = {"case": name, "n": n, "n_floor": n_floor, "seed": args.seed,
           "instances": instances}  # fmt: skip
    stem = f"{name}-n{n}-floor{n_floor}-seed{args.seed}"
    if args.cache is not None:
        meta = args.cache / f"{stem}.floor.json"
        if meta.exists():
            cached = json.loads(meta.read_text())
            if cached["key"] == key:
                log(f"{name}: instances and exact projections from {args.cache}")
                return CaseData.load(args.cache / f"{stem}.npz"), cached["floor"]
    build, _, _ = case.make()
    log(f"{name}: instances and optima")
    data = build(n, args.seed, args.instances)
    rows = np.arange(min(n_floor, data.n))
    log(f"{name}: exact projections of {len(rows)} instances ({case.exact})")
    # The Clarabel cross-check needs cvxpy, which a GPU machine may lack.
    small = case.exact == "slack" and data.dim <= 100
    check = 4 if small and importlib.util.find_spec("cvxpy") else 0
    floor = exact_projections(data, rows, case.exact, check)
    if args.cache is not None:
        args.cache.mkdir(parents=True, exist_ok=True)
        data.save(args.cache / f"{stem}.npz")
        meta.write_text(json.dumps({"key": key, "floor": floor}))
    return data, floor


def run(args, argv=None) -> dict:
    """Build the instances and their floors, run one worker per dtype, and
    return the record."""
    record = {
        "command": command_line(PROG, argv),
        "machine": machine(),
        "protocol": {
            "projector": "pe.Projector(constraints), eqx.nn.inference_mode",
            "near": f"optimum + {NEAR_SCALE} N(0, I)",
            "far": f"optimum + {FAR_SCALE} N(0, I)",
            "f32_target": f"<= {F32_REL_TARGET} max(1, ||data||_inf) and "
            f"<= {FLOOR_FACTOR} x floor",
            "f64_target": F64_TARGET,
            "seed": args.seed,
            "cache": None if args.cache is None else str(args.cache),
        },
        "cases": {},
    }
    datasets = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        for name in args.cases:
            case = CASES[name]
            start = time.perf_counter()
            data, floor = _instances_and_floor(name, args)
            data.save(folder / f"{name}.npz")
            datasets[name] = data
            record["cases"][name] = {
                "description": case.description,
                "info": data.info,
                "n": data.n,
                "dim": data.dim,
                "data_norm": data.data_norm(),
                "f32_target": F32_REL_TARGET * max(1.0, data.data_norm()),
                "build_s": time.perf_counter() - start,
                "floor": floor,
            }
        for i, dtype in enumerate(args.dtypes):
            timing = not args.no_timing and i == 0 and dtype == "float32"
            code = run_worker(dtype, folder, args.cases, timing, args.repeat_scale)
            if code:
                log(f"the {dtype} worker failed with code {code}")
            for name in args.cases:
                path = folder / f"{name}.{dtype}.json"
                if not path.exists():
                    continue
                entry = json.loads(path.read_text())
                with np.load(folder / f"{name}.{dtype}.npz") as z:
                    arrays = {k: z[k] for k in z.files}
                c = record["cases"][name]
                c[dtype] = measure(datasets[name], c["floor"], arrays, dtype)
                c[dtype]["worker"] = {k: v for k, v in entry.items() if k != "timing"}
                if "timing" in entry:
                    c["timing"] = entry["timing"]
    return record


def main(argv=None) -> dict | None:
    args = parser().parse_args(argv)
    if args.worker:
        worker(
            args.worker, args.folder, args.cases, not args.no_timing, args.repeat_scale
        )
        return None
    if args.prepare_only:
        if args.cache is None:
            parser().error("--prepare-only needs --cache DIR")
        for name in args.cases:
            _instances_and_floor(name, args)
        log(f"Instances and exact projections are in {args.cache}.")
        return None
    record = run(args, argv)
    save(args.out, record)
    table = markdown(record)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    print(table)
    log(f"Wrote {args.out}.")
    return record
