r"""Data-parallel scaling: the projection forward and forward+backward with the
batch sharded over 1, 2, 4 and 8 devices.

    python -m benchmarks.scaling                        # 1, 2, 4, 8 virtual CPU devices
    python -m benchmarks.scaling --devices 1 2 --per-device 64 --repeats 10
    python -m benchmarks.scaling --quick                # tiny problem (smoke test)
    python -m benchmarks.scaling --platform gpu --devices 1   # a GPU baseline

Weak scaling: each device holds `--per-device` instances of the DC3 projection
of `benchmarks.training_step` at the library's defaults, placed with
`pe.shard_batch` on a `pe.data_mesh()`; timed are `fwd` and `fwd+bwd` as there,
reported as the median step time and the throughput per device. Each device count
runs in a fresh process (`--xla_force_host_platform_device_count=N`); virtual CPU
devices share the host's cores, so on a CPU this measures the overhead of
sharding, not the speed-up of real devices. Writes a Markdown table to stdout and
a JSON record (default `benchmarks/_out/scaling.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

from ._common.provenance import command_line, describe, log, now, run_worker, save
from ._common.records import table as markdown_table
from ._common.timing import fmt

PROG = "python -m benchmarks.scaling"
DEFAULT_OUT = pathlib.Path(__file__).parent / "_out" / "scaling.json"


def measure(size: str, per_device: int, repeats: int, dtype: str) -> dict:
    """Compile and step times of `fwd` and `fwd+bwd` on all devices, and the
    peak memory."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import pinet_eqx as pe

    from ._common.problems import dc3_projector
    from ._common.provenance import machine, peak_rss_gb
    from ._common.timing import time_first
    from .training_step import make_case

    n = jax.device_count()
    mesh = pe.data_mesh()
    case = make_case(size, batch=per_device * n)
    proj = dc3_projector(case.problem.A, case.problem.G, case.problem.h)
    Y, X, V = pe.shard_batch(
        mesh, *(jnp.asarray(a, dtype) for a in (case.Y, case.X, case.V))
    )

    @jax.jit
    def fwd(Y, X):
        return jax.vmap(proj)(Y, b=X)

    @jax.jit
    def fwd_bwd(Y, X, V):
        return jax.value_and_grad(lambda Y: jnp.sum(V * jax.vmap(proj)(Y, b=X)))(Y)

    calls = {"fwd": lambda: fwd(Y, X), "fwd+bwd": lambda: fwd_bwd(Y, X, V)}
    timed = time_first(calls, repeats, warmup=2)
    record = dict(devices=n, batch=per_device * n, per_device=per_device)
    record.update(output_sharding=str(fwd(Y, X).sharding.spec), load=timed.pop("load"))
    record.update(peak_rss_gb=peak_rss_gb(), machine=machine(devices=True))
    for name, t in timed.items():
        t["compile"] = t.pop("first_s")
        record[name] = {**t, "throughput_per_device": per_device / t["median"]}
    record["max_abs_output"] = float(np.max(np.abs(np.asarray(fwd(Y, X)))))
    return record


def _child(n: int, args) -> dict:
    env = {}
    if args.platform == "cpu":
        flags = f" --xla_force_host_platform_device_count={n}"
        env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + flags).strip()
        env["JAX_PLATFORMS"] = "cpu"
    elif args.platform == "gpu":
        # The first n GPUs.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(n))
    command = ["--child", f"--size={args.size}", f"--per-device={args.per_device}"]
    command += [f"--repeats={args.repeats}", f"--dtype={args.dtype}"]
    return run_worker("benchmarks.scaling", command, env, timeout=args.timeout)


def table(records: list[dict]) -> str:
    """The markdown table of `records`, one row per device count."""
    columns = ["devices", "batch"]
    for name in ("fwd", "fwd+bwd"):
        columns += [f"{name} median (IQR), ms", f"{name} per device, inst/s"]
    columns += ["compile fwd / fwd+bwd, s", "peak RSS, GiB"]
    rows = []
    for r in records:
        f, b = r["fwd"], r["fwd+bwd"]
        cells = [r["devices"], r["batch"]]
        for t in (f, b):
            cells += [fmt(t, ".1f", "{median} ({lq}-{uq})", 1e3)]
            cells += [f"{t['throughput_per_device']:.0f}"]
        cells += [f"{f['compile']:.1f} / {b['compile']:.1f}", f"{r['peak_rss_gb']:.2f}"]
        rows.append(cells)
    return markdown_table(columns, rows, "r" * len(columns))


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    add("--size", choices=("tiny", "small", "large"), default="small")
    add("--per-device", type=int, default=256, help="instances per device")
    add("--repeats", type=int, default=20)
    add("--dtype", choices=("float32", "float64"), default="float32")
    add("--platform", choices=("cpu", "gpu"), default="cpu")
    add("--timeout", type=float, default=900, help="per device count")
    add("--quick", action="store_true", help="tiny, 2 repeats")
    add("--out", type=pathlib.Path, default=DEFAULT_OUT)
    add("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.per_device, args.repeats = "tiny", 16, 2

    if args.child:
        import jax

        if args.dtype == "float64":
            jax.config.update("jax_enable_x64", True)
        record = measure(args.size, args.per_device, args.repeats, args.dtype)
        print(json.dumps(record))
        return None

    command = command_line(PROG, argv)
    records = []
    for n in args.devices:
        log(f"{n} device(s)...")
        records.append(_child(n, args))
    settings = dict(size=args.size, per_device=args.per_device, repeats=args.repeats)
    settings.update(dtype=args.dtype, platform=args.platform)
    result = {"command": command, "settings": settings, "records": records}
    result["finished"] = now()
    m = records[0]["machine"]
    print(f"{command}\n{describe(m)}, {m['device_kind']}\n")
    print(table(records))
    save(args.out, result, indent=2)
    return result


if __name__ == "__main__":
    main()
