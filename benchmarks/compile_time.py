"""Compile time of one paper-recipe training step: ours against the reference.

    python -m benchmarks.compile_time [--repeats 5] [--size small] [--batch 2048]

The step is the paper's DC3 recipe (App. H: the 200-200 ReLU MLP, the projection,
the non-convex objective, Adam) in float32, ours at the library's defaults, the
reference at the paper's configuration. Each first call runs in a fresh process,
ours and the reference's taking turns, split into `trace`, `lower`, `compile` and
`run`. Results go to `benchmarks/_out/compile_time.json` and, as a table, stdout.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

from ._common import records
from ._common.provenance import command_line, describe, log, machine, run_worker, save
from ._common.timing import fmt, stats

MODULE = "benchmarks.compile_time"
PROG = f"python -m {MODULE}"
DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "_out" / "compile_time.json"
# "tiny" is for dry runs (benchmarks/gpu.sh on a CPU); the paper has no sigma for it.
SIZES = {"tiny": (20, 10, 10), "small": (100, 50, 50), "large": (1000, 500, 500)}
PARTS = ("trace", "lower", "compile", "run", "total")
SPREAD = "{median} [{min}, {max}]"


def _step(layer: str, size: str, batch: int):
    """The jitted training step and its arguments, for `layer` in
    `("ours", "reference")`."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax

    import pinet_eqx as pe
    from pinet_eqx.problems import dc3_objective, make_dc3

    from ._common.problems import PAPER_SIGMA, dc3_projector
    from ._common.training import backbone

    n_var, n_eq, n_ineq = SIZES[size]
    prob = make_dc3(n_var, n_eq, n_ineq)
    dtype = jnp.float32
    X = jnp.asarray(np.resize(prob.X, (batch, n_eq)), dtype)
    Q, p = jnp.asarray(prob.Q, dtype), jnp.asarray(prob.p, dtype)
    objective = jax.vmap(lambda y: dc3_objective(y, Q, p, nonconvex=True))
    mlp = backbone(n_eq, n_var, 0, dtype)
    if layer == "ours":
        model = pe.HardConstrainedNet(mlp, dc3_projector(prob.A, prob.G, prob.h))

        def loss(model, X):
            return jnp.mean(objective(jax.vmap(model)(X, b=X)))

        spec = pe.trainable_filter(model)
    else:
        from ._common.reference import ReferenceDC3Projector

        sigma = PAPER_SIGMA.get(size, PAPER_SIGMA["small"])
        layer = ReferenceDC3Projector(prob.A, prob.G, prob.h, sigma=sigma, dtype=dtype)
        project, model = layer.projection(50, 25), mlp

        def loss(model, X):
            return jnp.mean(objective(project(jax.vmap(model)(X), X)))

        spec = eqx.is_inexact_array
    params, static = eqx.partition(model, spec)
    optim = optax.adam(1e-2)

    def step(state, X):
        params, opt_state = state
        value, grads = jax.value_and_grad(lambda q: loss(eqx.combine(q, static), X))(
            params
        )
        updates, opt_state = optim.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    state = (params, optim.init(params))
    return jax.jit(step), (state, X)


def _worker(layer: str, size: str, batch: int) -> dict:
    """One first call, split into its parts, in seconds."""
    import jax

    step, args = _step(layer, size, batch)
    jax.block_until_ready(args)
    stages = {
        "trace": lambda step: step.trace(*args),
        "lower": lambda traced: traced.lower(),
        "compile": lambda lowered: lowered.compile(),
        "run": lambda compiled: jax.block_until_ready(compiled(*args)),
    }
    seconds = {}
    for part, stage in stages.items():
        start = time.perf_counter()
        step = stage(step)
        seconds[part] = time.perf_counter() - start
    return {**seconds, "total": sum(seconds.values())}


def run(args, argv) -> dict:
    from ._common.reference import reference_available

    layers = ["ours"] + (["reference"] if reference_available() else [])
    samples = {layer: [] for layer in layers}
    worker = ["--size", args.size, "--batch", str(args.batch), "--worker"]
    for i in range(args.repeats):
        for layer in layers:
            log(f"[{i + 1}/{args.repeats}] {layer}")
            samples[layer].append(run_worker(MODULE, [*worker, layer], timeout=600))
    record = {
        "command": command_line(PROG, argv),
        "machine": machine(),
        "size": args.size,
        "batch": args.batch,
        "samples": samples,
        "stats": {
            layer: {part: stats([s[part] for s in samples[layer]]) for part in PARTS}
            for layer in layers
        },
    }
    if "reference" in layers:
        # Paired by turn: each ratio compares two processes that ran back to back.
        ratios = [
            o["total"] / r["total"]
            for o, r in zip(samples["ours"], samples["reference"], strict=True)
        ]
        record["total_ratio"] = stats(ratios)
    return record


def markdown(record: dict) -> str:
    rows = [
        [layer, *(fmt(parts[p], ".2f", SPREAD) for p in PARTS)]
        for layer, parts in record["stats"].items()
    ]
    lines = [
        f"Command: `{record['command']}`. Machine: {describe(record['machine'])}; "
        f"load average {record['machine']['load_avg'][0]:.1f} at the start. "
        f"DC3 {record['size']}, batch {record['batch']}, float32; seconds, median "
        "[min, max] over fresh processes.",
        "",
        records.table(["layer", *PARTS], rows),
    ]
    if "total_ratio" in record:
        ratio = fmt(record["total_ratio"], ".2f", SPREAD)
        lines += ["", f"First call, ours / reference (paired by turn): median {ratio}."]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per layer")
    p.add_argument("--size", choices=tuple(SIZES), default="small")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    p.add_argument("--worker", choices=("ours", "reference"), help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> dict | None:
    args = parser().parse_args(argv)
    if args.repeats < 1 or args.batch < 1:
        parser().error("--repeats and --batch must be at least 1.")
    if args.worker:
        print(json.dumps(_worker(args.worker, args.size, args.batch)))
        return None
    record = run(args, argv)
    save(args.out, record)
    print(markdown(record))
    return record


if __name__ == "__main__":
    main()
