"""The worker processes: one per dtype, so that JAX's x64 flag is set before it
starts; each projects every case's raw outputs and times the calls."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

from .._common.provenance import log
from ._cases import CASES
from ._data import KINDS, ROOT, TIMING_BATCH, CaseData


def worker(dtype: str, folder: pathlib.Path, names, timing: bool, scale: float):
    """Project every case's raw outputs at the library defaults in `dtype`, time
    the forward pass if asked, and write `{name}.{dtype}.json` and `.npz`."""
    import jax

    jax.config.update("jax_enable_x64", dtype == "float64")
    import equinox as eqx
    import jax.numpy as jnp

    import pinet_eqx as pe

    def solve_all(p, Y, P):
        return jax.vmap(lambda y, q: p.solve(y, **q))(Y, P)

    solve = eqx.filter_jit(solve_all)
    for name in names:
        case = CASES[name]
        data = CaseData.load(folder / f"{name}.npz")
        _, make_projector, make_reference = case.make()
        log(f"[{dtype}] {name}: building the projector")
        start = time.perf_counter()
        proj = eqx.nn.inference_mode(make_projector(data))
        refinement = proj.refinement
        refinement = None if refinement is None else type(refinement).__name__
        defaults = dict(sigma=float(np.asarray(proj.sigma)), omega=proj.omega)
        defaults.update(
            n_iter_test=proj.n_iter_test, tol=proj.tol, refinement=refinement
        )
        defaults["equilibrated"] = proj.equilibrated
        entry = {"setup_s": time.perf_counter() - start, "defaults": defaults}
        P = {k: jnp.asarray(v, dtype) for k, v in data.params.items()}
        arrays = {}
        for kind in KINDS:
            start = time.perf_counter()
            sol = jax.block_until_ready(
                solve(proj, jnp.asarray(data.raw(kind), dtype), P)
            )
            entry[f"{kind}_first_call_s"] = time.perf_counter() - start
            arrays[f"{kind}:y"] = np.asarray(sol.y, np.float64)
            arrays[f"{kind}:n_iter"] = np.asarray(sol.n_iter)
            residual = np.asarray(sol.primal_residual, np.float64)
            arrays[f"{kind}:primal_residual"] = residual
            for outcome in ("successful", "max_steps_reached", "infeasible"):
                flag = sol.result == getattr(pe.RESULTS, outcome)
                arrays[f"{kind}:{outcome}"] = np.asarray(flag)
        reference, made = None, make_reference(data)
        if made is not None:
            reference, entry["reference_settings"] = made
        if reference is not None:
            for kind in KINDS:
                Y = reference(jnp.asarray(data.raw(kind), dtype), P["b"])
                arrays[f"{kind}:reference_y"] = np.asarray(Y, np.float64)
        if timing:
            log(f"[{dtype}] {name}: timing")
            timing = (case, data, proj, make_projector, reference, dtype, scale)
            entry["timing"] = _time(*timing)
        np.savez(folder / f"{name}.{dtype}.npz", **arrays)
        (folder / f"{name}.{dtype}.json").write_text(json.dumps(entry))
        log(f"[{dtype}] {name}: done")


def _time(case, data, proj, make_projector, reference, dtype, scale=1.0) -> dict:
    """Batch and single-instance latency of the jitted forward pass, interleaved
    with the reference's, `refine=False`'s and `polish=False`'s where asked."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from .._common.timing import time_interleaved, timing_batch

    def jitted(p):
        return (
            jax.jit(jax.vmap(lambda y, q: p(y, **q))),
            jax.jit(lambda y, q: p(y, **q)),
        )

    def tiled(a):
        return jnp.asarray(timing_batch(a, TIMING_BATCH), dtype)

    Pb = {k: tiled(v) for k, v in data.params.items()}
    Yn, Yf = tiled(data.near), tiled(data.far)
    y0 = jnp.asarray(data.near[0], dtype)
    p0 = {k: jnp.asarray(v[0], dtype) for k, v in data.params.items()}
    forward, one = jitted(proj)
    # Equinox users jit a function of the model: the projector's arrays are
    # then arguments, not constants folded at compile time.
    as_argument = eqx.filter_jit(lambda p, y, q: p(y, **q))
    batch = {"ours near": lambda: forward(Yn, Pb)}
    single = {
        "ours": lambda: one(y0, p0),
        "ours, as argument": lambda: as_argument(proj, y0, p0),
    }
    if case.time_far:
        batch["ours far"] = lambda: forward(Yf, Pb)
    if case.time_unrefined:
        unrefined = eqx.nn.inference_mode(make_projector(data, refine=False))
        forward_u, one_u = jitted(unrefined)
        batch["ours near, refine=False"] = lambda: forward_u(Yn, Pb)
        single["ours, refine=False"] = lambda: one_u(y0, p0)
        if not proj.problem.groups:  # the polish is for polyhedral sets
            forward_p, one_p = jitted(proj.with_settings(polish=False))
            batch["ours near, polish=False"] = lambda: forward_p(Yn, Pb)
            single["ours, polish=False"] = lambda: one_p(y0, p0)
    if reference is not None:
        batch["reference"] = lambda: reference(Yn, Pb["b"])
        single["reference"] = lambda: reference(y0[None], p0["b"][None])
    repeats = max(2, round(case.timing_repeats * scale))
    return {
        "batch_size": TIMING_BATCH,
        "batch": time_interleaved(batch, repeats, warmup=1),
        "single": time_interleaved(single, 10 * repeats, warmup=2),
    }


def run_worker(dtype, folder, names, timing: bool, scale: float) -> int:
    """One worker process for `dtype` (so that x64 is set before JAX starts)."""
    cmd = [sys.executable, "-m", "benchmarks.feasibility", "--worker", dtype]
    cmd += ["--folder", str(folder), "--cases", *names, "--repeat-scale", str(scale)]
    if not timing:
        cmd.append("--no-timing")
    env = {**os.environ, "JAX_ENABLE_X64": "1" if dtype == "float64" else "0"}
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode
