r"""Inference at the library defaults on random polytopes far from the set.

    python -m benchmarks.random_polytopes [--sets 60] [--per-set 8] [--scale 5]
        [--seed 1] [--dtypes float32 float64] [--out PATH]

Draws `--sets` polytopes (`random_polytope`, shapes drawn from `--seed`; see
`polytopes`) and `--per-set` raw outputs $y_{feas} + \text{scale}\,
\mathcal{N}(0, I)$ for each, projected by
`jax.vmap(eqx.nn.inference_mode(pe.Projector(constraints)).solve)` in each dtype
(one process each). Such sets are degenerate far more often than the paper's
problems, which is where Douglas-Rachford drifts and the polish matters.
Reported: the instances not `successful`, the iterations, and the largest
violation among all outputs and among the successful ones.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from ._common import records
from ._common.problems import constraints_of, random_polytope
from ._common.provenance import command_line, describe, log, machine, run_worker, save

MODULE = "benchmarks.random_polytopes"
PROG = f"python -m {MODULE}"
DTYPES = ("float32", "float64")


def polytopes(n_sets: int, seed: int):
    """The `(polytope, seed)` pairs of the sweep, drawn from `seed`."""
    meta = np.random.default_rng(seed)
    for _ in range(n_sets):
        poly_seed = int(meta.integers(0, 2**31))
        d = int(meta.integers(3, 30))
        m_eq = min(int(meta.integers(0, 6)), d - 1)
        m_ineq = int(meta.integers(0, 20))
        box = bool(meta.random() < 0.5)
        rng = np.random.default_rng(poly_seed)
        yield random_polytope(rng, d, m_eq, m_ineq, box=box), poly_seed


def _worker(args) -> dict:
    """Project every instance in `args.worker`'s dtype; return its totals."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    import pinet_eqx as pe

    dtype = jnp.dtype(args.worker)
    assert jnp.zeros((), dtype).dtype == dtype, "x64 must be set for float64"
    worst, worst_ok, per_set = 0.0, 0.0, []
    for poly, poly_seed in polytopes(args.sets, args.seed):
        rng = np.random.default_rng([poly_seed, 1])
        raw = poly.y_feas + args.scale * rng.normal(size=(args.per_set, poly.d))
        proj = eqx.nn.inference_mode(pe.Projector(constraints_of(poly)))
        sol = jax.vmap(proj.solve)(jnp.asarray(raw, dtype))
        ok = np.asarray(sol.result == pe.RESULTS.successful)
        cv = poly.violation(sol.y)
        worst = max(worst, float(cv.max()))
        worst_ok = max(worst_ok, float(cv[ok].max(initial=0.0)))
        n_iter = int(np.sum(np.asarray(sol.n_iter)))
        per_set.append(
            {"seed": poly_seed, "failed": int((~ok).sum()), "iterations": n_iter}
        )
    return {
        "instances": args.sets * args.per_set,
        "not_successful": sum(s["failed"] for s in per_set),
        "iterations": sum(s["iterations"] for s in per_set),
        "cv_max": worst,
        "cv_max_successful": worst_ok,
        "per_set": per_set,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--sets", type=int, default=60, help="polytopes")
    add("--per-set", type=int, default=8, help="raw outputs per polytope")
    add("--scale", type=float, default=5.0, help="raw output noise")
    add("--seed", type=int, default=1)
    add("--dtypes", nargs="+", choices=DTYPES, default=DTYPES)
    out = pathlib.Path(__file__).resolve().parent / "_out" / "random_polytopes.json"
    add("--out", type=pathlib.Path, default=out)
    add("--worker", choices=DTYPES, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> dict | None:
    args = parser().parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args)))
        return None
    record = {"command": command_line(PROG, argv), "machine": machine()}
    passed = [f"--{k}={v}" for k, v in (("sets", args.sets), ("per-set", args.per_set),
              ("scale", args.scale), ("seed", args.seed))]  # fmt: skip
    for dtype in args.dtypes:
        log(f"{dtype}: projecting")
        x64 = {"JAX_ENABLE_X64": "1" if dtype == "float64" else "0"}
        record[dtype] = run_worker(MODULE, [*passed, "--worker", dtype], x64)
    save(args.out, record)
    print(markdown(record))
    return record


def markdown(record: dict) -> str:
    """The table of a record, with its command and machine."""
    columns = ["dtype", "instances", "not successful", "iterations", "max CV"]
    rows = [
        [dtype, r["instances"], r["not_successful"], r["iterations"]]
        + [f"{r['cv_max']:.1e}", f"{r['cv_max_successful']:.1e}"]
        for dtype in DTYPES
        if dtype in record
        for r in [record[dtype]]
    ]
    return (
        f"Command: `{record['command']}`. Machine: {describe(record['machine'])}.\n\n"
        + records.table([*columns, "max CV of the successful"], rows)
    )


if __name__ == "__main__":
    main()
