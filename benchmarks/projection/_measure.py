"""What every family of the projection benchmark measures the same way (`run`):
shared settings, timing, the search for the iterations to a tolerance, the
backward pass, and the worker processes."""

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
import time
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
N_TRUTH = 8  # instances with a ground truth (the first of the batch)
N_TRUTH_NEG = 4  # of which, instances also solved for -y_raw (sign check)
N_ITER_CONVERGED = 1000  # the "converged" accuracy check, on the truth subset only
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


def run(fam, precision: str, repeats: int, sigma: float) -> dict:
    """All measurements for one family, size and precision at the reference's
    `sigma` (also `ours_same`'s); a family with a `truth` is checked against it."""
    run = _Measurement(fam, precision, repeats, sigma)
    run.fixed()
    run.to_tolerance()
    run.backward()
    if run.gt is not None:
        run.converged()
    return run.res


class _Measurement:
    """One family, size and precision: its batch `(Y, P, V)` on the device, our
    projectors (`ours` at its defaults and, for a family with `same`, `ours_same`
    at the reference's iteration), the reference, and the record `res` that each
    step (a to d) adds to."""

    def __init__(self, fam, precision: str, repeats: int, sigma: float):
        import jax.numpy as jnp

        import pinet_eqx as pe

        self.fam, self.repeats, self.tol = fam, repeats, TOLERANCE[precision]
        self.search_cap = 2000 if fam.size == "small" else 1000
        dtype = jnp.float64 if precision == "f64" else jnp.float32
        self.tag = tag = f"[{fam.name} {fam.size} {precision}]"
        res = dict(family=fam.name, size=fam.size, dims=fam.dims, precision=precision)
        self.res = res = dict(res, batch=fam.batch, tolerance=self.tol, sigma=sigma)
        self.gt = None
        if hasattr(fam, "ground_truth"):
            log(f"{tag} ground truth (cvxpy + Clarabel + Newton polish, {N_TRUTH})")
            self.gt = gt = fam.ground_truth()
            res.update(truth_kkt=float(gt["kkt"].max()))
            res.update(truth_seconds=float(gt["seconds"]))
        P = {k: jnp.asarray(v, dtype) for k, v in fam.P.items()}
        self.Y, self.P, self.V = jnp.asarray(fam.Y, dtype), P, jnp.asarray(fam.V, dtype)
        log(f"{tag} building projectors")
        settings = dict(omega=OMEGA, n_iter=N_ITER, adjoint=matched_adjoint(pe))
        t0 = time.perf_counter()
        self.proj = fam.ours(**settings)  # its defaults: sigma="auto", equilibrated
        setup_ours = time.perf_counter() - t0
        self.variants = {"ours": self.proj}
        if fam.same:
            # The reference's own iteration: its sigma, no equilibration.
            same = fam.ours(sigma=sigma, equilibrate=False, **settings)
            self.variants["ours_same"] = same
        t0 = time.perf_counter()
        self.ref = fam.reference(sigma, OMEGA, dtype)
        setup_ref = time.perf_counter() - t0
        # With per-instance matrices the affine projection is factorised in each call.
        form = "per call" if self.proj.op is None else type(self.proj.op).__name__
        res["setup"] = dict(ours=setup_ours, ref=setup_ref, form=form)
        res["bwd_tols"] = (self.proj.adjoint.rtol, self.proj.adjoint.atol or 0.0)

    def err(self, Yp, truth=None) -> float:
        """The largest error of `Yp` from the truth (its first rows)."""
        truth = self.gt["T"] if truth is None else truth
        return float(np.abs(np.asarray(Yp, np.float64)[: len(truth)] - truth).max())

    def accuracy(self, y) -> dict:
        cv = self.fam.cv(y)
        return dict(cv=cv) if self.gt is None else dict(cv=cv, err=self.err(y))

    def timed(self, fns: dict) -> dict:
        """`timed` of the batched forward passes `fns`, interleaved."""
        return timed({k: (f, (self.Y, self.P)) for k, f in fns.items()}, self.repeats)

    def fixed(self) -> None:
        """a) Fixed iteration count, with the accuracy of the very calls timed."""
        tag, repeats = self.tag, self.repeats
        log(f"{tag} a) forward, n_iter={N_ITER}, {repeats} interleaved repeats")
        fns = {k: ours_forward(p) for k, p in self.variants.items()}
        fns["ref"] = self.ref.make_forward(N_ITER)
        t = self.res["fixed"] = self.timed(fns)
        t["acc"] = {k: self.accuracy(f(self.Y, self.P)) for k, f in fns.items()}
        times = ", ".join(f"{k} {ms(t[k]):.1f} ms {t['acc'][k]}" for k in fns)
        log(f"{tag}    {times}, load {t['load']:.2f}")

    def to_tolerance(self) -> None:
        """b) Time to CV <= tol (and error <= tol, with a truth)."""
        tag, tol, Y, P = self.tag, self.tol, self.Y, self.P
        log(f"{tag} b) searching the smallest n_iter with CV (and error) <= {tol:g}")

        def find(advance, state):
            cv_err = lambda Yp: max(self.accuracy(Yp).values())  # noqa: E731
            return search(advance, state, cv_err, tol, self.search_cap)

        searches = {
            "ref": find(ref_advancer(self.ref, Y, P), self.ref.initial_state(Y, P))
        }
        for k, base in self.variants.items():
            searches[k] = find(ours_advancer(base, Y, P), None)
        for k, v in searches.items():
            log(f"{tag}    {k}: {v}")
        so = searches["ours"]
        # The tol-stopping version, capped well above what the fixed search needed.
        cap = max(200, 4 * so["n_iter"]) if so["reached"] else self.search_cap
        p_tol = self.proj.with_settings(tol=tol, n_iter=cap)
        steps = np.asarray(n_steps(p_tol, Y, P))
        tolres = dict(
            cap=cap, steps_max=int(steps.max()), steps_mean=float(steps.mean())
        )
        fns = {"ours_tol": ours_forward(p_tol)}
        for k, base in self.variants.items():
            if searches[k]["reached"]:
                fns[k] = ours_forward(base.with_settings(n_iter=searches[k]["n_iter"]))
        if searches["ref"]["reached"]:
            fns["ref"] = self.ref.make_forward(searches["ref"]["n_iter"])
        log(f"{tag}    timing {', '.join(fns)}, {self.repeats} interleaved repeats")
        t = self.timed(fns)
        # The accuracy of the very calls timed (a one-shot run can round differently
        # from the resumed runs of the search).
        tolres.update(self.accuracy(fns["ours_tol"](Y, P)))
        for k in fns:
            if k in searches:
                searches[k].update(self.accuracy(fns[k](Y, P)))
        t.update(searches=searches, ours_tol_info=tolres)
        self.res["tol"] = t
        times = ", ".join(f"{k} {ms(t[k]):.1f} ms" for k in fns)
        log(f"{tag}    {times}; ours tol-stop {tolres}")

    def backward(self) -> None:
        """c) Forward plus implicit VJP."""
        log(f"{self.tag} c) forward + VJP, n_iter={N_ITER}, bwd max_steps={N_ITER_BWD}")
        args = (self.Y, self.P, self.V)
        gr = self.ref.make_vjp(N_ITER, N_ITER_BWD)
        t, go, go_default = backward_stats(self.proj, gr, args, self.repeats)
        if self.gt is not None:
            # And against the exact Jacobian of the true projection (first N_TRUTH).
            for k, g in (("ours", go), ("ref", gr), ("ours_default", go_default)):
                G = np.asarray(g(*args))[:N_TRUTH]
                t[f"grad_exact_{k}"] = rel_err(G, self.gt["G"])
        self.res["bwd"] = t
        log(
            f"{self.tag}    ours {ms(t['ours']):.1f} ms, ref {ms(t['ref']):.1f} "
            f"ms, ours backward converged: {t['bwd_converged']}, gradient errors "
            f"ours/ref {t['grad_err_ours']:.1e}/{t['grad_err_ref']:.1e}, "
            f"load {t['load']:.2f}"
        )

    def converged(self) -> None:
        """d) Converged accuracy on the ground-truth subset, and the sign check."""
        import pinet_eqx as pe

        n, nn, gt, proj = N_ITER_CONVERGED, N_TRUTH_NEG, self.gt, self.proj
        log(f"{self.tag} d) accuracy at n_iter={n} on {N_TRUTH} instances")
        Ys, vs = self.Y[:N_TRUTH], self.V[:N_TRUTH]
        Ps = {k: v[:N_TRUTH] for k, v in self.P.items()}
        yo = ours_forward(proj.with_settings(n_iter=n))(Ys, Ps)
        yr = self.ref.make_forward(n)(Ys, Ps)
        adjoint = matched_adjoint(pe, 200)
        go_c = ours_grad(proj.with_settings(n_iter=n, adjoint=adjoint))
        gr_c = self.ref.make_vjp(n, 200)
        self.res["converged"] = dict(
            grad_ours=rel_err(go_c(Ys, Ps, vs), gt["G"]),
            grad_ref=rel_err(gr_c(Ys, Ps, vs), gt["G"]),
            err_ours=self.err(yo),
            err_ref=self.err(yr),
            cv_ours=self.fam.cv(yo),
            cv_ref=self.fam.cv(yr),
            ref_vs_neg=self.err(np.asarray(yr)[:nn], gt["Tneg"]),
            ref_vs_pos=self.err(np.asarray(yr)[:nn], gt["T"][:nn]),
            ours_vs_neg=self.err(np.asarray(yo)[:nn], gt["Tneg"]),
        )
        log(f"{self.tag}    {self.res['converged']}")
