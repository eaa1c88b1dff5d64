"""The DC3 polytopes of the projection benchmark (`--family dc3`, the default);
see the package docstring."""

from __future__ import annotations

import numpy as np

from pinet_eqx.problems import dc3_violation

from .._common.problems import PAPER_SIGMA, dc3_projector
from . import _measure
from ._measure import N_ITER, N_ITER_BWD, OMEGA

SIZES = {
    # name: (n_var, n_eq, n_ineq, sigma), sigma from the paper's tuned configs.
    "small": (100, 50, 50, PAPER_SIGMA["small"]),
    "large": (1000, 500, 500, PAPER_SIGMA["large"]),
}
# The record's title and place on the page.
TITLES = {"dc3": ("Projection layer vs reference (pinet-hcnn 0.2.0), DC3 polytopes", 1)}


class DC3Family:
    """The DC3 polytope of `size` with `batch` contexts and raw points, in the
    interface of `_families` (without a ground truth or an `ours_same` variant):
    ours at the paper's sigma, as the reference."""

    name = "dc3"
    params = ("b",)
    same = False

    def __init__(self, size: str, batch: int):
        from pinet_eqx.problems import make_dc3

        n_var, n_eq, n_ineq, self.sigma = SIZES[size]
        self.size, self.batch, self.dims = size, batch, f"{n_var}/{n_eq}/{n_ineq}"
        problem = make_dc3(n_var, n_eq, n_ineq, n_examples=batch, seed=17)
        self.A, self.G, self.h = problem.A, problem.G, problem.h
        # Ours takes the context as the parameter "b", and so does the reference.
        self.P = {"b": problem.X}
        self.Y = np.random.RandomState(0).normal(size=(batch, n_var))
        self.V = np.random.RandomState(1).normal(size=(batch, n_var))

    def cv(self, Y, per_instance=False):
        """The CV of each row of `Y` (see the module docstring), or the largest."""
        X = self.P["b"][: len(Y)]
        v = dc3_violation(np.asarray(Y, np.float64), X, self.A, self.G, self.h)
        return v if per_instance else float(v.max())

    def ours(self, **settings):
        return dc3_projector(self.A, self.G, self.h, sigma=self.sigma, **settings)

    def reference(self, sigma, omega, dtype):
        from .._common.reference import ReferenceDC3Projector

        return ReferenceDC3Projector(
            self.A, self.G, self.h, sigma=sigma, omega=omega, dtype=dtype
        )


def _search_cell(search: dict, stats: dict | None, tol: float, missed: str) -> str:
    """A search's table cell: its count, time and CV (flagged above `tol`), or
    `missed` where it did not reach the tolerance."""
    if not search["reached"]:
        return missed
    flag = " (> tol)" if search["cv"] > tol else ""
    return f"{search['n_iter']}, {_measure.fmt_t(stats)}, {search['cv']:.2e}{flag}"


def tables(results: list[dict]) -> str:
    """The Markdown tables of `results`."""
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
            f"{t['acc']['ours']['cv']:.1e} | {t['acc']['ref']['cv']:.1e} | "
            f"{t['load']:.1f} |"
        )
    return "\n".join(lines + _tol_table(results) + _backward_tables(results))


def _tol_table(results: list[dict]) -> list[str]:
    """Table b), the time to the tolerance."""
    lines = [
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
        t, tol = r["tol"], r["tolerance"]
        sr, so, ti = t["searches"]["ref"], t["searches"]["ours"], t["ours_tol_info"]
        missed = f"not reached by n_iter {sr['n_iter']}: plateau {sr['best_cv']:.1e}"
        ref_cell = _search_cell(sr, t.get("ref"), tol, missed)
        missed = f"not reached by {so['n_iter']}: best {so['best_cv']:.1e}"
        ours_cell = _search_cell(so, t.get("ours"), tol, missed)
        over = " (> tol)" if ti["cv"] > r["tolerance"] else ""
        tol_cell = (
            f"{ti['steps_max']}/{ti['steps_mean']:.0f} (cap {ti['cap']}), "
            f"{_measure.fmt_t(t['ours_tol'])}, {ti['cv']:.2e}{over}"
        )
        # Only variants that actually reached the tolerance count.
        ours_ok = [t["ours_tol"]["median"]] if not over else []
        if "ours" in t and so["cv"] <= r["tolerance"]:
            ours_ok.append(t["ours"]["median"])
        if sr["reached"] and ours_ok:
            ratio = f"{t['ref']['median'] / min(ours_ok):.2f}x"
        else:
            ratio = "n/a"
        lines.append(
            f"| {r['size']} | {r['precision']} | {r['tolerance']:g} | {ref_cell} | "
            f"{ours_cell} | {tol_cell} | {ratio} | {t['load']:.1f} |"
        )
    return lines


def _backward_tables(results: list[dict]) -> list[str]:
    """Table c), the backward pass, and the set-up times."""
    rtol, atol = results[0]["bwd_tols"]
    lines = [
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
        _measure.bwd_table(results),
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
    return lines


def measure(size: str, args) -> dict:
    """In a worker process: every measurement for one size in its precision."""
    repeats = args.repeats
    if size == "large" and args.precision[0] == "f64":
        repeats = min(repeats, args.repeats_large_f64)
    fam = DC3Family(size, args.batch)
    return _measure.run(fam, args.precision[0], repeats, fam.sigma)


def details(args, results: list[dict]) -> str:
    """The data and settings, for the section's header."""
    return (
        f"Batch {args.batch}, DC3 data `make_dc3(..., seed=17)`, y_raw ~ N(0, I) "
        f"(seed 0), ω = {OMEGA}, Ruiz equilibration (25 iterations) on both sides."
    )
