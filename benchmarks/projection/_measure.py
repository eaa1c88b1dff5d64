"""What every family of the projection benchmark measures the same way: shared
settings, timing, the search for the iterations to a tolerance, the backward pass
and the worker processes."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import warnings

import numpy as np

from .._common import records
from .._common.problems import PAPER_N_ITER, PAPER_N_ITER_BWD, PAPER_OMEGA
from .._common.provenance import command_line, describe, log, machine
from .._common.timing import fmt, time_interleaved

PROG = "python -m benchmarks.projection"
TOLERANCE = {"f32": 1e-4, "f64": 1e-6}
N_ITER = PAPER_N_ITER
# The reference's backward pass: 25 BiCGStab steps on the fixed point, tol 1e-5.
N_ITER_BWD = PAPER_N_ITER_BWD
BWD_RTOL = 1e-5
OMEGA = PAPER_OMEGA
ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def ms(stats: dict) -> float:
    """The median of timing `stats`, in milliseconds."""
    return 1e3 * stats["median"]


def fmt_t(s: dict) -> str:
    """Timing `stats` as 'median [lq, uq] (min–max)', in milliseconds."""
    return fmt(s, ".1f", "{median} [{lq}, {uq}] ({min}–{max})", 1e3)


def bwd_table(results: list[dict]) -> str:
    """Table c), forward + VJP (with the errors from the exact Jacobian where
    there is a ground truth)."""
    exact = "grad_exact_ours" in results[0]["bwd"]
    columns = ["size", "prec", "ours ms", "reference ms", "ratio"]
    columns += ["ours BiCGStab all converged"]
    if exact:
        columns += ["grad error vs unrolled, ours / ref", "vs exact, ours / ref"]
        columns += ["ours, default: ms, vs unrolled, vs exact", "load"]
    else:
        columns += ["grad error ours / ref", "ours, default: ms, grad error", "load"]
    rows = []
    for r in results:
        t = r["bwd"]
        errors = [f"{t['grad_err_ours']:.1e} / {t['grad_err_ref']:.1e}"]
        default = f"{fmt_t(t['ours_default'])}, {t['grad_err_ours_default']:.1e}"
        if exact:
            errors.append(f"{t['grad_exact_ours']:.1e} / {t['grad_exact_ref']:.1e}")
            default += f", {t['grad_exact_ours_default']:.1e}"
        converged = "yes" if t["bwd_converged"] else "no"
        cells = [r["size"], r["precision"], fmt_t(t["ours"]), fmt_t(t["ref"])]
        ratio = f"{t['ref']['median'] / t['ours']['median']:.2f}x"
        cells += [ratio, converged, *errors, default, f"{t['load']:.1f}"]
        rows.append(cells)
    return records.table(columns, rows)


def timed(calls: dict, repeats: int) -> dict:
    """`time_interleaved` of `name: (fn, args)`: each `fn(*args)` warmed up, then
    timed in turns."""
    return time_interleaved(
        {name: functools.partial(fn, *args) for name, (fn, args) in calls.items()},
        repeats,
    )


def ours_forward(projector):
    """Our batched forward pass, jitted: `(Y, P) -> Y_proj`, `P` a dict of the
    per-instance parameters."""
    import jax

    return jax.jit(jax.vmap(lambda y, P: projector(y, **P)))


def ours_advancer(base, Y, P):
    """`advance(state, k) -> (Y_proj, state)`: `k` more iterations of `base` from
    `state` (`None`: the projector's own start), for `search`."""
    import jax

    steps = {}

    def advance(state, k):
        if k not in steps:
            p = base.with_settings(n_iter=k)

            def one(y, P, s=None):
                sol = p.solve(y, **P) if s is None else p.solve(y, s0=s, **P)
                return sol.y, sol.s

            steps[k] = jax.jit(jax.vmap(one))
        return steps[k](Y, P) if state is None else steps[k](Y, P, state)

    return advance


def n_steps(projector, Y, P):
    """The iterations each instance of the batch takes (in-jit stopping)."""
    import jax

    return jax.jit(jax.vmap(lambda y, P: projector.solve(y, **P).n_iter))(Y, P)


def ref_advancer(ref, Y, P):
    """`advance(state, k)` for the reference (see `ours_advancer`)."""
    steps = {}

    def advance(state, k):
        if k not in steps:
            steps[k] = ref.make_continuation(k)
        return steps[k](Y, P, state)

    return advance


def search(step_fn, state, cv_fn, tol: float, cap: int) -> dict:
    """The first iteration count of `step_fn(state, k) -> (y, state)` whose CV is
    at most `tol`, within 5% (steps of 5% of the count); stops at `cap` or on a
    plateau (no 5% gain over the last half of the iterations, at least 100)."""
    k, best, best_k, history = 0, np.inf, 0, []
    while k < cap:
        # Few distinct chunk sizes, since each one is compiled.
        chunk = max(c for c in (1, 2, 5, 10, 20, 50) if c <= max(1, k // 20))
        y, state = step_fn(state, chunk)
        k += chunk
        cv = cv_fn(y)
        history.append((k, cv))
        if cv <= tol:
            return dict(reached=True, n_iter=k, cv=cv, best_cv=cv)
        if cv < 0.95 * best:
            best, best_k = cv, k
        if k >= 100 and k - best_k > max(100, k // 2):
            break
    best_cv = min(c for _, c in history)
    return dict(reached=False, n_iter=k, cv=history[-1][1], best_cv=best_cv)


def matched_adjoint(pe, max_steps: int = N_ITER_BWD):
    """Our implicit adjoint at the reference's settings: BiCGStab on the same
    fixed-point system, with its step limit and tolerance (`pe` is `pinet_eqx`)."""
    return pe.ImplicitAdjoint(
        method="fixed_point", max_steps=max_steps, rtol=BWD_RTOL, on_failure="ignore"
    )


def rel_err(g, g_ref) -> float:
    """Largest per-instance relative error, in float64."""
    g = np.asarray(g, np.float64)
    g_ref = np.asarray(g_ref, np.float64)
    num = np.linalg.norm(g - g_ref, axis=1)
    return float((num / np.maximum(np.linalg.norm(g_ref, axis=1), 1e-30)).max())


def ours_grad(projector):
    """Our jitted VJP `(Y, P, V) -> V^T dPi/dY` on a batch."""
    import jax
    import jax.numpy as jnp

    def loss(Yb, Pb, Vb):
        return jnp.sum(Vb * jax.vmap(lambda y, P: projector(y, **P))(Yb, Pb))

    return jax.jit(jax.grad(loss))


def backward_stats(proj, ref_grad, args, repeats: int):
    """Time our implicit VJP (matched and default adjoints) against `ref_grad`
    on `args`, check the matched one's convergence and measure the errors from
    ours unrolled. Returns the measurements and our two gradient functions."""
    import jax

    import pinet_eqx as pe

    go = ours_grad(proj)
    # Also our default adjoint: the exact active-set derivative for polyhedral
    # sets, BiCGStab on the fixed point (dtype tolerance, 100 steps) otherwise.
    go_default = ours_grad(proj.with_settings(adjoint=pe.ImplicitAdjoint()))
    grads = {"ours": go, "ref": ref_grad, "ours_default": go_default}
    t = timed({name: (g, args) for name, g in grads.items()}, repeats)
    # Did every instance's BiCGStab converge within its step limit? Our "warn"
    # mode warns once per call if any instance did not.
    warn = dataclasses.replace(proj.adjoint, on_failure="warn")
    g_warn = ours_grad(proj.with_settings(adjoint=warn))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.block_until_ready(g_warn(*args))
        jax.effects_barrier()
    t["bwd_converged"] = not any(
        issubclass(w.category, pe.BackwardNotConvergedWarning) for w in caught
    )
    # Accuracy of both implicit gradients against an independent adjoint: ours
    # unrolled through the same iterations, in the same precision.
    unrolled = proj.with_settings(adjoint=pe.UnrolledAdjoint())
    g_unroll = np.asarray(ours_grad(unrolled)(*args))
    t["grad_err_ours"] = rel_err(go(*args), g_unroll)
    t["grad_err_ref"] = rel_err(ref_grad(*args), g_unroll)
    t["grad_err_ours_default"] = rel_err(go_default(*args), g_unroll)
    return t, go, go_default


def start(argv) -> tuple[str, dict]:
    """The command line and the provenance record of this run, both logged."""
    command = command_line(PROG, argv)
    log(f"command: {command.strip()}")
    log(f"load average at start: {os.getloadavg()}")
    provenance = machine()
    log(f"machine: {describe(provenance)}")
    return command, provenance


def header(command: str, provenance: dict, details: str) -> str:
    """The lines above a section's tables: the command, the date, the machine,
    the load at the end and the section's `details`."""
    load_end = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return (
        f"Command: `{command.strip()}`\n\nDate: {date}. Machine: "
        f"{describe(provenance)}. Load average at the end (1, 5, 15 min): "
        f"{load_end}. {details}\n"
    )


def run_workers(precisions, worker_args: list[str], sizes: list[str]) -> list[dict]:
    """Run one worker process per precision with `worker_args` and collect their
    results in (size, precision) order."""
    results = []
    for precision in precisions:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.json")
            cmd = [sys.executable, "-m", "benchmarks.projection", "--worker"]
            cmd += ["--json", path, "--precision", precision, *worker_args]
            proc = subprocess.run(cmd, cwd=ROOT)
            if os.path.exists(path):
                with open(path) as f:
                    results += json.load(f)
            if proc.returncode != 0:
                log(f"worker for {precision} failed with code {proc.returncode}")
    if not results:
        raise SystemExit("no results")
    return sorted(results, key=lambda r: (sizes.index(r["size"]), r["precision"]))


def worker_setup(args) -> None:
    """In a worker: float64 if asked (before any array), and the reference."""
    import jax

    from .._common.reference import REFERENCE_MISSING, reference_available

    if args.precision[0] == "f64":
        jax.config.update("jax_enable_x64", True)
    if not reference_available():
        raise SystemExit(REFERENCE_MISSING)
