r"""Time our projection layer against the reference (`pinet-hcnn` 0.2.0).

Both project a batch of points $y_{raw} \sim N(0, I)$ onto the DC3 polytopes
$\{y : A y = x,\ G y \le h\}$, where the context $x$ changes per instance (for us
it is `pe.Parameter("b")`). Both use the paper's configurations: Ruiz equilibration
with 25 iterations, $\omega = 1.7$, $\sigma = 0.068068$ (small, 100/50/50) or
$\sigma = 0.161069$ (large, 1000/500/500). Three measurements:

- a) the forward pass with 50 iterations, and the violation it reaches;
- b) the time to reach a violation tolerance (1e-4 in float32, 1e-6 in float64):
  the reference with the smallest fixed iteration count that reaches it, ours both
  with its in-jit stopping rule (`tol=`) and with the smallest fixed count;
- c) the forward pass with 50 iterations plus the implicit vector-Jacobian product
  with 25 backward iterations.

Every timing is a whole jitted call on the batch, compiled and run once before
timing, then timed with `block_until_ready`. Ours and the reference alternate
repeat by repeat, so that background load hits both alike. The constraint
violation (CV) is computed here, in float64 NumPy and in the original
coordinates: the largest over instances of
$\max(\|A y - x\|_\infty, \|\max(G y - h, 0)\|_\infty)$.

From the repository root:

    python -m benchmarks.projection                     # everything
    python -m benchmarks.projection --quick             # small problem, 3 repeats
    python -m benchmarks.projection --sizes small --precision f32
    python -m benchmarks.projection --family soc        # App. B.4 cone, see _families
    python -m benchmarks.projection --family ax         # per-instance E(x) with a box

Float32 and float64 run in separate subprocesses, since `jax_enable_x64` is global.
The results are printed and written to the section "Projection layer vs reference
(pinet-hcnn 0.2.0)" of `benchmarks/RESULTS.md`; other sections are kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

from benchmarks._machine import cpu_model, git_commit

SIZES = {
    # name: (n_var, n_eq, n_ineq, sigma), sigma from the paper's tuned configs.
    "small": (100, 50, 50, 0.068068),
    "large": (1000, 500, 500, 0.161069),
}
TOLERANCE = {"f32": 1e-4, "f64": 1e-6}
N_ITER = 50
# The reference's backward pass: 25 BiCGStab steps on the fixed point, tol 1e-5.
N_ITER_BWD = 25
BWD_RTOL = 1e-5
OMEGA = 1.7
SECTION = "## Projection layer vs reference (pinet-hcnn 0.2.0)"
RESULTS_PATH = pathlib.Path(__file__).with_name("RESULTS.md")


def _log(message: str) -> None:
    print(message, flush=True)


def _cv(Y, X, A, G, h) -> float:
    """Largest constraint violation over the batch, in float64."""
    Y = np.asarray(Y, dtype=np.float64)
    eq = np.abs(Y @ A.T - X).max(axis=1, initial=0.0)
    ineq = np.maximum(Y @ G.T - h, 0.0).max(axis=1, initial=0.0)
    return float(np.maximum(eq, ineq).max(initial=0.0))


def _stats(times: list[float]) -> dict:
    t = 1e3 * np.asarray(times)
    return dict(
        median=float(np.median(t)),
        lq=float(np.percentile(t, 25)),
        uq=float(np.percentile(t, 75)),
        min=float(t.min()),
        max=float(t.max()),
        n=int(t.size),
    )


def _time_interleaved(calls: dict, repeats: int) -> dict:
    """Median and spread, in ms, of each `name: (fn, args)`, alternating calls.

    Each function is compiled and run once before timing. The order alternates
    between repeats so neither side always runs right after the other.
    """
    import jax

    for fn, args in calls.values():
        jax.block_until_ready(fn(*args))
        jax.block_until_ready(fn(*args))
    times = {name: [] for name in calls}
    names = list(calls)
    load_before = os.getloadavg()[0]
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            fn, args = calls[name]
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    load = max(load_before, os.getloadavg()[0])
    out = {name: _stats(t) for name, t in times.items()}
    out["load"] = load
    return out


def _search(step_fn, state, cv_fn, tol: float, cap: int) -> dict:
    """Follow the CV of a resumable solver and find the first iteration <= tol.

    `step_fn(state, k) -> (y, state)` runs `k` more iterations. Steps are single
    iterations up to 20, then 5% of the count so far, so the count found is at most
    5% above the smallest. Stops at the tolerance, at `cap`, or on a plateau (no 5%
    improvement of the best CV over the last half of the iterations, at least 100).
    """
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


def _run_size(size: str, precision: str, batch: int, repeats: int, search_cap: int):
    import jax
    import jax.numpy as jnp

    import pinet_eqx as pe
    from benchmarks._reference import ReferenceDC3Projector
    from pinet_eqx.problems import make_dc3

    n_var, n_eq, n_ineq, sigma = SIZES[size]
    tol = TOLERANCE[precision]
    dtype = jnp.float64 if precision == "f64" else jnp.float32
    problem = make_dc3(n_var, n_eq, n_ineq, n_examples=batch, seed=17)
    A, G, h, X = problem.A, problem.G, problem.h, problem.X
    Y = np.random.RandomState(0).normal(size=(batch, n_var))
    V = np.random.RandomState(1).normal(size=(batch, n_var))
    Yj, Xj, Vj = (jnp.asarray(a, dtype) for a in (Y, X, V))

    def cv(Yp):
        return _cv(Yp, X, A, G, h)

    res = dict(size=size, precision=precision, batch=batch, tolerance=tol, sigma=sigma)
    tag = f"[{size} {precision}]"

    _log(f"{tag} building projectors (host set-up, equilibration)")
    start = time.perf_counter()
    proj = pe.Projector(
        [pe.Equality(A, pe.Parameter("b")), pe.AffineInequality(G, upper=h)],
        sigma=sigma,
        omega=OMEGA,
        n_iter=N_ITER,
        adjoint=matched_adjoint(pe),
    )
    setup_ours = time.perf_counter() - start
    start = time.perf_counter()
    ref = ReferenceDC3Projector(A, G, h, sigma=sigma, omega=OMEGA, dtype=dtype)
    setup_ref = time.perf_counter() - start
    res["setup"] = dict(ours=setup_ours, ref=setup_ref, form=type(proj.op).__name__)
    res["bwd_tols"] = (proj.adjoint.rtol, proj.adjoint.atol or 0.0)

    def ours_forward(p):
        return jax.jit(jax.vmap(lambda y, b: p(y, b=b)))

    # a) Fixed iteration count.
    _log(f"{tag} a) forward, n_iter={N_ITER}, {repeats} interleaved repeats")
    fo, fr = ours_forward(proj), ref.make_forward(N_ITER)
    t = _time_interleaved({"ours": (fo, (Yj, Xj)), "ref": (fr, (Yj, Xj))}, repeats)
    t["cv_ours"], t["cv_ref"] = cv(fo(Yj, Xj)), cv(fr(Yj, Xj))
    res["fixed"] = t
    _log(
        f"{tag}    ours {t['ours']['median']:.1f} ms (CV {t['cv_ours']:.1e}), "
        f"ref {t['ref']['median']:.1f} ms (CV {t['cv_ref']:.1e}), load {t['load']:.2f}"
    )

    # b) Time to tolerance. First the smallest fixed counts, by resuming runs.
    _log(f"{tag} b) searching the smallest n_iter with CV <= {tol:g}")
    ref_step = {}

    def ref_advance(state, k):
        if k not in ref_step:
            ref_step[k] = ref.make_continuation(k)
        return ref_step[k](Yj, Xj, state)

    ours_step = {}

    def ours_advance(state, k):
        # `state` is None on the first call, so that the search starts from the
        # projector's own default starting point, as the timed one-shot call does.
        key = (k, state is None)
        if key not in ours_step:
            p = proj.with_settings(n_iter=k)

            def one(y, b, s):
                sol = p.solve(y, b=b) if s is None else p.solve(y, s0=s, b=b)
                return sol.y, sol.s

            if state is None:
                ours_step[key] = jax.jit(jax.vmap(lambda y, b: one(y, b, None)))
            else:
                ours_step[key] = jax.jit(jax.vmap(one))
        if state is None:
            return ours_step[key](Yj, Xj)
        return ours_step[key](Yj, Xj, state)

    s_ref = ref.initial_state(Yj, Xj)
    s_ours = None
    search_ref = _search(ref_advance, s_ref, cv, tol, search_cap)
    _log(f"{tag}    reference: {search_ref}")
    search_ours = _search(ours_advance, s_ours, cv, tol, search_cap)
    _log(f"{tag}    ours (fixed): {search_ours}")

    # The tol-stopping version, capped well above what the fixed search needed.
    cap = search_cap
    if search_ours["reached"]:
        cap = max(200, 4 * search_ours["n_iter"])
    p_tol = proj.with_settings(tol=tol, n_iter=cap)
    f_tol = ours_forward(p_tol)
    sol = jax.jit(jax.vmap(lambda y, b: p_tol.solve(y, b=b)))(Yj, Xj)
    steps = np.asarray(sol.n_steps)
    tolres = dict(
        cap=cap,
        steps_max=int(steps.max()),
        steps_mean=float(steps.mean()),
        cv=cv(sol.y),
    )

    calls = {"ours_tol": (f_tol, (Yj, Xj))}
    if search_ours["reached"]:
        f_ours_k = ours_forward(proj.with_settings(n_iter=search_ours["n_iter"]))
        calls["ours_fixed"] = (f_ours_k, (Yj, Xj))
    if search_ref["reached"]:
        f_ref_k = ref.make_forward(search_ref["n_iter"])
        calls["ref"] = (f_ref_k, (Yj, Xj))
    _log(f"{tag}    timing {', '.join(calls)}, {repeats} interleaved repeats")
    t = _time_interleaved(calls, repeats)
    t["search_ref"], t["search_ours"], t["ours_tol_info"] = (
        search_ref,
        search_ours,
        tolres,
    )
    # The CV of the very calls that were timed (a one-shot run can round
    # differently from the resumed runs of the search).
    t["ours_tol_info"]["cv"] = cv(f_tol(Yj, Xj))
    if "ours_fixed" in calls:
        search_ours["cv_timed"] = cv(f_ours_k(Yj, Xj))
    if "ref" in calls:
        search_ref["cv_timed"] = cv(f_ref_k(Yj, Xj))
    res["tol"] = t
    _log(
        f"{tag}    "
        + ", ".join(f"{k} {t[k]['median']:.1f} ms" for k in calls)
        + f"; ours tol steps max {tolres['steps_max']}, CV {tolres['cv']:.1e}"
    )

    # c) Forward plus implicit VJP.
    _log(f"{tag} c) forward + VJP, n_iter={N_ITER}, bwd max_steps={N_ITER_BWD}")

    def ours_grad(p):
        def loss(Yb, Xb, Vb):
            return jnp.sum(Vb * jax.vmap(lambda y, b: p(y, b=b))(Yb, Xb))

        return jax.jit(jax.grad(loss))

    gr = ref.make_vjp(N_ITER, N_ITER_BWD)
    t, _, _ = _backward_stats(ours_grad, proj, gr, (Yj, Xj, Vj), repeats)
    res["bwd"] = t
    _log(
        f"{tag}    ours {t['ours']['median']:.1f} ms, ref {t['ref']['median']:.1f} "
        f"ms, ours backward converged: {t['bwd_converged']}, gradient errors "
        f"ours/ref {t.get('grad_err_ours', np.nan):.1e}/"
        f"{t.get('grad_err_ref', np.nan):.1e}, load {t['load']:.2f}"
    )
    return res


def matched_adjoint(pe, max_steps: int = N_ITER_BWD):
    """Our implicit adjoint at the reference's settings: BiCGStab on the same
    fixed-point system, with its step limit and tolerance (`pe` is `pinet_eqx`)."""
    return pe.ImplicitAdjoint(
        method="fixed_point", max_steps=max_steps, rtol=BWD_RTOL, on_failure="ignore"
    )


def _rel_err(g, g_ref) -> float:
    """Largest per-instance relative error, in float64."""
    g = np.asarray(g, np.float64)
    g_ref = np.asarray(g_ref, np.float64)
    num = np.linalg.norm(g - g_ref, axis=1)
    return float((num / np.maximum(np.linalg.norm(g_ref, axis=1), 1e-30)).max())


def _backward_stats(ours_grad, proj, ref_grad, args, repeats: int) -> dict:
    """Time our implicit VJP (with `proj`'s adjoint, `matched_adjoint`, and with
    the default `pe.ImplicitAdjoint()`) against the reference's, check whether
    every BiCGStab solve of the matched one converged, and measure the gradients'
    relative error from ours unrolled through the same iterations.

    `ours_grad(projector)` returns a jitted gradient function of `args`.

    **Returns:** the measurements, and our jitted gradient functions with the
    matched and the default adjoint.
    """
    import dataclasses

    import jax

    import pinet_eqx as pe

    go = ours_grad(proj)
    # Also our default adjoint: the exact active-set derivative for polyhedral
    # sets, BiCGStab on the fixed point (dtype tolerance, 100 steps) otherwise.
    go_default = ours_grad(proj.with_settings(adjoint=pe.ImplicitAdjoint()))
    t = _time_interleaved(
        {
            "ours": (go, args),
            "ref": (ref_grad, args),
            "ours_default": (go_default, args),
        },
        repeats,
    )
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
    t["grad_err_ours"] = _rel_err(go(*args), g_unroll)
    t["grad_err_ref"] = _rel_err(ref_grad(*args), g_unroll)
    t["grad_err_ours_default"] = _rel_err(go_default(*args), g_unroll)
    return t, go, go_default


def _worker(args) -> None:
    import jax

    if args.precision[0] == "f64":
        jax.config.update("jax_enable_x64", True)
    from benchmarks._reference import _REFERENCE_MISSING, reference_available

    if not reference_available():
        raise SystemExit(_REFERENCE_MISSING)
    results = []
    for size in args.sizes:
        repeats = args.repeats
        if size == "large" and args.precision[0] == "f64":
            repeats = min(repeats, args.repeats_large_f64)
        cap = 2000 if size == "small" else 1000
        results.append(_run_size(size, args.precision[0], args.batch, repeats, cap))
        with open(args.json, "w") as f:
            json.dump(results, f)


# ---------------------------------------------------------------- reporting


def _start(argv) -> tuple[str, dict]:
    """The command line and machine of this run, both logged."""
    command = "python -m benchmarks.projection " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    _log(f"command: {command.strip()}")
    _log(f"load average at start: {os.getloadavg()}")
    return command, _machine()


def _machine() -> dict:
    import jax

    return dict(
        commit=git_commit(),
        platform=platform.platform(),
        cpus=os.cpu_count(),
        cpu=cpu_model(),
        python=platform.python_version(),
        jax=jax.__version__,
        backend=jax.default_backend(),
    )


def _fmt_t(s: dict) -> str:
    return (
        f"{s['median']:.1f} [{s['lq']:.1f}, {s['uq']:.1f}] "
        f"({s['min']:.1f}–{s['max']:.1f})"
    )


def _tables(results: list[dict]) -> str:
    rtol, atol = results[0]["bwd_tols"]
    lines = [
        "Times in ms: median [lower quartile, upper quartile] (min–max) over the "
        "timed repeats (n). Ratio = reference median / ours median. CV = largest "
        "violation over the batch, float64, original coordinates. Load = 1-minute "
        "load average during the measurement (2 cores).",
        "",
        f"**a) Forward, n_iter = {N_ITER} for both**",
        "",
        "| size | prec | n | ours ms | reference ms | ratio | CV ours | CV ref "
        "| load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = r["fixed"]
        lines.append(
            f"| {r['size']} | {r['precision']} | {t['ours']['n']} | "
            f"{_fmt_t(t['ours'])} | {_fmt_t(t['ref'])} | "
            f"{t['ref']['median'] / t['ours']['median']:.2f}x | "
            f"{t['cv_ours']:.1e} | {t['cv_ref']:.1e} | {t['load']:.1f} |"
        )
    lines += [
        "",
        "**b) Time to CV ≤ tol** (1e-4 in f32, 1e-6 in f64). Reference: smallest "
        "fixed n_iter reaching tol (searched to within 5%). Ours: in-jit stopping "
        "(`tol=`, per instance, n_iter cap) and smallest fixed n_iter. Ratio = "
        "reference / faster of the ours variants whose CV ≤ tol.",
        "",
        "| size | prec | tol | reference: n_iter, ms, CV | ours fixed: n_iter, ms, CV "
        "| ours tol-stop: steps max/mean, ms, CV | ratio | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = r["tol"]
        sr, so, ti = t["search_ref"], t["search_ours"], t["ours_tol_info"]
        if sr["reached"]:
            flag = " (> tol)" if sr["cv_timed"] > r["tolerance"] else ""
            ref_cell = f"{sr['n_iter']}, {_fmt_t(t['ref'])}, {sr['cv_timed']:.2e}{flag}"
        else:
            ref_cell = (
                f"not reached by n_iter {sr['n_iter']}: plateau {sr['best_cv']:.1e}"
            )
        if so["reached"]:
            flag = " (> tol)" if so["cv_timed"] > r["tolerance"] else ""
            ours_cell = (
                f"{so['n_iter']}, {_fmt_t(t['ours_fixed'])}, {so['cv_timed']:.2e}{flag}"
            )
        else:
            ours_cell = f"not reached by {so['n_iter']}: best {so['best_cv']:.1e}"
        over = " (> tol)" if ti["cv"] > r["tolerance"] else ""
        tol_cell = (
            f"{ti['steps_max']}/{ti['steps_mean']:.0f} (cap {ti['cap']}), "
            f"{_fmt_t(t['ours_tol'])}, {ti['cv']:.2e}{over}"
        )
        # Only variants that actually reached the tolerance count.
        ours_ok = [t["ours_tol"]["median"]] if not over else []
        if "ours_fixed" in t and so["cv_timed"] <= r["tolerance"]:
            ours_ok.append(t["ours_fixed"]["median"])
        if sr["reached"] and ours_ok:
            ratio = f"{t['ref']['median'] / min(ours_ok):.2f}x"
        else:
            ratio = "n/a"
        lines.append(
            f"| {r['size']} | {r['precision']} | {r['tolerance']:g} | {ref_cell} | "
            f"{ours_cell} | {tol_cell} | {ratio} | {t['load']:.1f} |"
        )
    lines += [
        "",
        f"**c) Forward + implicit VJP, n_iter = {N_ITER}, at most {N_ITER_BWD} "
        "BiCGStab steps on the fixed point** (ours: "
        '`ImplicitAdjoint(method="fixed_point")`, per-instance BiCGStab, '
        f"rtol {rtol:g}, atol {atol:g}; reference: batched "
        "`jax.scipy` BiCGStab, tol 1e-5). Gradient error = largest per-instance "
        "relative 2-norm difference from our unrolled gradient (autodiff through "
        f"the same {N_ITER} iterations, same precision). Ours, default: "
        "`ImplicitAdjoint()`, the exact active-set derivative.",
        "",
        "| size | prec | ours ms | reference ms | ratio | ours BiCGStab all converged "
        "| grad error ours / ref | ours, default: ms, grad error | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = r["bwd"]
        err = f"{t['grad_err_ours']:.1e} / {t['grad_err_ref']:.1e}"
        lines.append(
            f"| {r['size']} | {r['precision']} | {_fmt_t(t['ours'])} | "
            f"{_fmt_t(t['ref'])} | {t['ref']['median'] / t['ours']['median']:.2f}x | "
            f"{'yes' if t['bwd_converged'] else 'no'} | {err} | "
            f"{_fmt_t(t['ours_default'])}, {t['grad_err_ours_default']:.1e} | "
            f"{t['load']:.1f} |"
        )
    lines += [
        "",
        "**Set-up on the host (once per constraint set, not timed above)**",
        "",
        "| size | prec | ours s (affine form) | reference s |",
        "|---|---|---|---|",
    ]
    for r in results:
        s = r["setup"]
        lines.append(
            f"| {r['size']} | {r['precision']} | {s['ours']:.2f} ({s['form']}) | "
            f"{s['ref']:.2f} |"
        )
    return "\n".join(lines)


def _write_results(body: str) -> None:
    text = (
        RESULTS_PATH.read_text() if RESULTS_PATH.exists() else "# Benchmark results\n"
    )
    section = f"{SECTION}\n\n{body}\n"
    start = text.find(SECTION)
    if start == -1:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        rest = "" if end == -1 else text[end + 1 :]
        text = text[:start] + section + ("\n" + rest if rest else "")
    RESULTS_PATH.write_text(text)


def _run_workers(precisions, worker_args: list[str], sizes: list[str]) -> list[dict]:
    """Run one worker process per precision (a fresh process, so that the x64 flag
    is set before JAX starts) with `worker_args`, and collect their results in
    (size, precision) order."""
    results = []
    for precision in precisions:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "results.json")
            cmd = [sys.executable, "-m", "benchmarks.projection", "--worker"]
            cmd += ["--json", path, "--precision", precision, *worker_args]
            proc = subprocess.run(cmd, cwd=pathlib.Path(__file__).parent.parent)
            if os.path.exists(path):
                with open(path) as f:
                    results += json.load(f)
            if proc.returncode != 0:
                _log(f"worker for {precision} failed with code {proc.returncode}")
    if not results:
        raise SystemExit("no results")
    order = {
        (s, p): i
        for i, (s, p) in enumerate((s, p) for s in sizes for p in ("f32", "f64"))
    }
    results.sort(key=lambda r: order[(r["size"], r["precision"])])
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description="Time the pinet_eqx projector against the reference pinet-hcnn."
    )
    parser.add_argument(
        "--family",
        choices=["dc3", "soc", "ax"],
        default="dc3",
        help="dc3: the DC3 polytopes (this module); soc: the second-order cone of "
        "the paper's App. B.4; ax: a per-instance equality matrix E(x) with a box "
        "(both in benchmarks/_families.py)",
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        choices=list(SIZES),
        default=None,
        help="default: both for dc3 and soc, small for ax",
    )
    parser.add_argument(
        "--precision", nargs="+", choices=["f32", "f64"], default=["f32", "f64"]
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="default: 1024, except soc large (128) and ax large (64)",
    )
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--repeats-large-f64",
        type=int,
        default=5,
        help="repeats for the large problem in float64 (the reference is slow); "
        "for soc and ax, for the large problem in both precisions",
    )
    parser.add_argument(
        "--sigma",
        type=float,
        default=None,
        help="soc and ax only: the reference's sigma, also used by our 'ours-same' "
        "variant (default: per family, see benchmarks/_families.py)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small problem only, 3 repeats"
    )
    parser.add_argument(
        "--no-write", action="store_true", help="do not update benchmarks/RESULTS.md"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = ["small"], 3
    if args.family != "dc3":
        from benchmarks import _families

        _families.main(args, argv)
        return
    if args.sigma is not None:
        parser.error("--sigma applies to --family soc and ax only")
    if args.sizes is None:
        args.sizes = list(SIZES)
    if args.batch is None:
        args.batch = 1024
    if args.worker:
        _worker(args)
        return

    command, machine = _start(argv)
    _log(f"machine: {machine}")
    results = _run_workers(
        args.precision,
        [
            "--batch",
            str(args.batch),
            "--repeats",
            str(args.repeats),
            "--repeats-large-f64",
            str(args.repeats_large_f64),
            "--sizes",
            *args.sizes,
        ],
        list(SIZES),
    )

    load_end = os.getloadavg()
    header = [
        f"Command: `{command.strip()}`",
        "",
        f"Date: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}. Machine: "
        f"{machine['cpu']}, {machine['cpus']} CPUs, {machine['platform']}, Python "
        f"{machine['python']}, jax {machine['jax']} ({machine['backend']}), "
        f"pinet_eqx at git {machine['commit']}. Load "
        f"average at the end (1, 5, 15 min): "
        + ", ".join(f"{x:.2f}" for x in load_end)
        + f". Batch {args.batch}, DC3 data `make_dc3(..., seed=17)`, y_raw ~ N(0, I) "
        "(seed 0), ω = 1.7, Ruiz equilibration (25 iterations) on both sides.",
        "",
    ]
    body = "\n".join(header) + _tables(results)
    print()
    print(body)
    if not args.no_write:
        _write_results(body)
        _log(f"\nwrote {RESULTS_PATH}")


if __name__ == "__main__":
    main()
