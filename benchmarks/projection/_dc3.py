"""The DC3 polytopes of the projection benchmark (`--family dc3`, the default).

Both layers project a batch of points $y_{raw} \\sim N(0, I)$ onto
$\\{y : A y = x,\\ G y \\le h\\}$, where the context $x$ changes per instance (for
us it is `pe.Parameter("b")`), with the paper's configurations (see the package
docstring). The constraint violation (CV) is computed here, in float64 NumPy and
in the original coordinates: the largest over instances of
$\\max(\\|A y - x\\|_\\infty, \\|\\max(G y - h, 0)\\|_\\infty)$.
"""

from __future__ import annotations

import time

import numpy as np

from pinet_eqx.problems import dc3_violation

from .._common.problems import PAPER_SIGMA
from . import _measure
from ._measure import N_ITER, N_ITER_BWD, OMEGA, TOLERANCE

SIZES = {
    # name: (n_var, n_eq, n_ineq, sigma), sigma from the paper's tuned configs.
    "small": (100, 50, 50, PAPER_SIGMA["small"]),
    "large": (1000, 500, 500, PAPER_SIGMA["large"]),
}
TITLE = "Projection layer vs reference (pinet-hcnn 0.2.0), DC3 polytopes"


def run_size(size: str, precision: str, batch: int, repeats: int, search_cap: int):
    """All measurements for one size and precision (see the package docstring)."""
    import jax.numpy as jnp

    import pinet_eqx as pe
    from pinet_eqx.problems import make_dc3

    from .._common.reference import ReferenceDC3Projector

    n_var, n_eq, n_ineq, sigma = SIZES[size]
    tol = TOLERANCE[precision]
    dtype = jnp.float64 if precision == "f64" else jnp.float32
    problem = make_dc3(n_var, n_eq, n_ineq, n_examples=batch, seed=17)
    A, G, h, X = problem.A, problem.G, problem.h, problem.X
    Y = np.random.RandomState(0).normal(size=(batch, n_var))
    V = np.random.RandomState(1).normal(size=(batch, n_var))
    Yj, Xj, Vj = (jnp.asarray(a, dtype) for a in (Y, X, V))
    # Ours takes the context as the parameter "b"; the reference takes it as is.
    Pj = {"b": Xj}

    def cv(Yp) -> float:
        return float(dc3_violation(np.asarray(Yp, np.float64), X, A, G, h).max())

    res = dict(size=size, precision=precision, batch=batch, tolerance=tol, sigma=sigma)
    tag = f"[{size} {precision}]"

    _measure.log(f"{tag} building projectors (host set-up, equilibration)")
    t0 = time.perf_counter()
    proj = pe.Projector(
        [pe.Equality(A, pe.Parameter("b")), pe.AffineInequality(G, upper=h)],
        sigma=sigma,
        omega=OMEGA,
        n_iter=N_ITER,
        adjoint=_measure.matched_adjoint(pe),
    )
    setup_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = ReferenceDC3Projector(A, G, h, sigma=sigma, omega=OMEGA, dtype=dtype)
    setup_ref = time.perf_counter() - t0
    res["setup"] = dict(ours=setup_ours, ref=setup_ref, form=type(proj.op).__name__)
    res["bwd_tols"] = (proj.adjoint.rtol, proj.adjoint.atol or 0.0)

    # a) Fixed iteration count.
    _measure.log(f"{tag} a) forward, n_iter={N_ITER}, {repeats} interleaved repeats")
    fo, fr = _measure.ours_forward(proj), ref.make_forward(N_ITER)
    t = _measure.timed({"ours": (fo, (Yj, Pj)), "ref": (fr, (Yj, Xj))}, repeats)
    t["cv_ours"], t["cv_ref"] = cv(fo(Yj, Pj)), cv(fr(Yj, Xj))
    res["fixed"] = t
    _measure.log(
        f"{tag}    ours {_measure.ms(t['ours']):.1f} ms (CV {t['cv_ours']:.1e}), "
        f"ref {_measure.ms(t['ref']):.1f} ms (CV {t['cv_ref']:.1e}), "
        f"load {t['load']:.2f}"
    )

    # b) Time to tolerance. First the smallest fixed counts, by resuming runs.
    _measure.log(f"{tag} b) searching the smallest n_iter with CV <= {tol:g}")
    advance_ref = _measure.ref_advancer(ref, Yj, Xj)
    search_ref = _measure.search(
        advance_ref, ref.initial_state(Yj, Xj), cv, tol, search_cap
    )
    _measure.log(f"{tag}    reference: {search_ref}")
    search_ours = _measure.search(
        _measure.ours_advancer(proj, Yj, Pj), None, cv, tol, search_cap
    )
    _measure.log(f"{tag}    ours (fixed): {search_ours}")

    # The tol-stopping version, capped well above what the fixed search needed.
    cap = search_cap
    if search_ours["reached"]:
        cap = max(200, 4 * search_ours["n_iter"])
    p_tol = proj.with_settings(tol=tol, n_iter=cap)
    f_tol = _measure.ours_forward(p_tol)
    steps = np.asarray(_measure.n_steps(p_tol, Yj, Pj))
    tolres = dict(cap=cap, steps_max=int(steps.max()), steps_mean=float(steps.mean()))

    calls = {"ours_tol": (f_tol, (Yj, Pj))}
    if search_ours["reached"]:
        f_ours_k = _measure.ours_forward(
            proj.with_settings(n_iter=search_ours["n_iter"])
        )
        calls["ours_fixed"] = (f_ours_k, (Yj, Pj))
    if search_ref["reached"]:
        f_ref_k = ref.make_forward(search_ref["n_iter"])
        calls["ref"] = (f_ref_k, (Yj, Xj))
    _measure.log(f"{tag}    timing {', '.join(calls)}, {repeats} interleaved repeats")
    t = _measure.timed(calls, repeats)
    t["search_ref"], t["search_ours"], t["ours_tol_info"] = (
        search_ref,
        search_ours,
        tolres,
    )
    # The CV of the very calls that were timed (a one-shot run can round
    # differently from the resumed runs of the search).
    tolres["cv"] = cv(f_tol(Yj, Pj))
    if "ours_fixed" in calls:
        search_ours["cv_timed"] = cv(f_ours_k(Yj, Pj))
    if "ref" in calls:
        search_ref["cv_timed"] = cv(f_ref_k(Yj, Xj))
    res["tol"] = t
    _measure.log(
        f"{tag}    "
        + ", ".join(f"{k} {_measure.ms(t[k]):.1f} ms" for k in calls)
        + f"; ours tol steps max {tolres['steps_max']}, CV {tolres['cv']:.1e}"
    )

    # c) Forward plus implicit VJP.
    _measure.log(f"{tag} c) forward + VJP, n_iter={N_ITER}, bwd max_steps={N_ITER_BWD}")
    gr = ref.make_vjp(N_ITER, N_ITER_BWD)
    ref_grad = _as_dict_call(gr)
    t, _, _ = _measure.backward_stats(proj, ref_grad, (Yj, Pj, Vj), repeats)
    res["bwd"] = t
    _measure.log(
        f"{tag}    ours {_measure.ms(t['ours']):.1f} ms, "
        f"ref {_measure.ms(t['ref']):.1f} ms, ours backward converged: "
        f"{t['bwd_converged']}, gradient errors "
        f"ours/ref {t.get('grad_err_ours', np.nan):.1e}/"
        f"{t.get('grad_err_ref', np.nan):.1e}, load {t['load']:.2f}"
    )
    return res


def _as_dict_call(fn):
    """`fn(Y, X, ...)` of the reference as a function of `(Y, {"b": X}, ...)`,
    the arguments of ours."""
    return lambda Y, P, *rest: fn(Y, P["b"], *rest)


def _search_cell(search: dict, stats: dict | None, tol: float, missed: str) -> str:
    """A search's table cell: its count, time and CV (flagged above `tol`), or
    `missed` where it did not reach the tolerance."""
    if not search["reached"]:
        return missed
    flag = " (> tol)" if search["cv_timed"] > tol else ""
    return (
        f"{search['n_iter']}, {_measure.fmt_t(stats)}, {search['cv_timed']:.2e}{flag}"
    )


def tables(results: list[dict]) -> str:
    """The Markdown tables of `results`."""
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
            f"| {r['size']} | {r['precision']} | {t['ours']['repeats']} | "
            f"{_measure.fmt_t(t['ours'])} | {_measure.fmt_t(t['ref'])} | "
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
        ref_cell = _search_cell(
            sr,
            t.get("ref"),
            r["tolerance"],
            f"not reached by n_iter {sr['n_iter']}: plateau {sr['best_cv']:.1e}",
        )
        ours_cell = _search_cell(
            so,
            t.get("ours_fixed"),
            r["tolerance"],
            f"not reached by {so['n_iter']}: best {so['best_cv']:.1e}",
        )
        over = " (> tol)" if ti["cv"] > r["tolerance"] else ""
        tol_cell = (
            f"{ti['steps_max']}/{ti['steps_mean']:.0f} (cap {ti['cap']}), "
            f"{_measure.fmt_t(t['ours_tol'])}, {ti['cv']:.2e}{over}"
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
            f"| {r['size']} | {r['precision']} | {_measure.fmt_t(t['ours'])} | "
            f"{_measure.fmt_t(t['ref'])} | "
            f"{t['ref']['median'] / t['ours']['median']:.2f}x | "
            f"{'yes' if t['bwd_converged'] else 'no'} | {err} | "
            f"{_measure.fmt_t(t['ours_default'])}, {t['grad_err_ours_default']:.1e} | "
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


def measure(size: str, args) -> dict:
    """In a worker process: every measurement for one size in its precision."""
    repeats = args.repeats
    if size == "large" and args.precision[0] == "f64":
        repeats = min(repeats, args.repeats_large_f64)
    cap = 2000 if size == "small" else 1000
    return run_size(size, args.precision[0], args.batch, repeats, cap)


def details(args, results: list[dict]) -> str:
    """The data and settings, for the section's header."""
    return (
        f"Batch {args.batch}, DC3 data `make_dc3(..., seed=17)`, y_raw ~ N(0, I) "
        f"(seed 0), ω = {OMEGA}, Ruiz equilibration (25 iterations) on both sides."
    )


def write(args, body: str) -> None:
    """Write this benchmark's record (`benchmarks/projection/records/dc3.json`)."""
    _measure.write_record("dc3", TITLE, body, 1)
