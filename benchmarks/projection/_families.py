r"""Two more problem families for the projection benchmark, against the reference.

- `soc`: the App. B.4 cone, $\{y : A y_1 + y_2 = b,\ \|y_{2,:-1}\|_2 \le y_{2,-1}\}$,
  $A \sim U[-1, 1]^{d_2 \times d_1}$ fixed, $b$ per instance as in O'Donoghue et
  al. (2016, §6.6) (`soc_batch`); $(d_1, d_2) = (25, 25)$ and $(500, 500)$.
- `ax`: $\{y : E(x) y = b(x),\ -1 \le y \le 1\}$, $E(x) = E_0 + 0.1 N(0, 1)$ and
  $b(x) = E(x) y_f$, $y_f \sim U[-0.5, 0.5]^d$; $(d, m) = (100, 50)$ and
  $(1000, 500)$.

The reference runs its non-linear `SOCType` path and its `var_a_mat=True` path,
neither of which equilibrates, so ours runs at its defaults and as "ours-same",
the reference's own iteration (its sigma, `equilibrate=False`). Beside the DC3
section's timings, each is checked against cvxpy + Clarabel on the first
`N_TRUTH` instances, polished by Newton's method on the KKT system of the active
constraints (Clarabel alone stops near 1e-7 on the cone).
"""

from __future__ import annotations

import pathlib
import time

import numpy as np

from .._common.problems import soc_batch, soc_projector
from .._common.solvers import clarabel
from ._measure import (
    N_ITER,
    N_ITER_BWD,
    N_ITER_CONVERGED,
    N_TRUTH,
    N_TRUTH_NEG,
    OMEGA,
    bwd_table,
    fmt_t,
    run,
)

DATA_SEED = 17
CACHE_DIR = pathlib.Path(__file__).resolve().parent.parent / "_out"

FAMILIES = {
    # family: {size: (dims, default batch)}
    "soc": {"small": ((25, 25), 1024), "large": ((500, 500), 128)},
    "ax": {"small": ((100, 50), 1024), "large": ((1000, 500), 64)},
}
DEFAULT_SIZES = {"soc": ["small", "large"], "ax": ["small"]}
# The reference's Douglas-Rachford sigma (omega = 1.7 as for DC3), also used by
# our "ours_same" variant: the best of {0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 1, 3} for
# the reference's iterations to CV and error <= 1e-6 (float64, small size, the 8
# ground-truth instances). `--sigma` overrides it. Ours proper uses its default.
SIGMA = {"soc": 0.5, "ax": 0.3}


def soc_truth(E, b, y, d1: int):
    """The projection of `y` onto $\\{z : E z = b,\\ \\|z_{d_1:-1}\\| \\le z_{-1}\\}$
    by Clarabel and Newton's method: the point, its KKT residual and its VJP."""
    import cvxpy as cp

    d = E.shape[1]
    z = cp.Variable(d)
    prob = cp.Problem(
        cp.Minimize(cp.sum_squares(z - y)),
        [E @ z == b, cp.SOC(z[d - 1], z[d1 : d - 1])],
    )
    clarabel(prob, 1e-10, quiet=True)  # inaccurate: polished below
    return _polish_soc(E, b, y, z.value, d1)


def _ground_truth(fam) -> dict:
    """Truths for the first N_TRUTH instances (and -y_raw for N_TRUTH_NEG)."""
    CACHE_DIR.mkdir(exist_ok=True)
    path = CACHE_DIR / f"truth_v4_{fam.name}_{fam.size}_{DATA_SEED}_{N_TRUTH}.npz"
    if path.exists():
        f = np.load(path)
        return {k: f[k] for k in f.files}
    start = time.perf_counter()
    T, kkt, G, Tneg = [], [], [], []
    for i in range(N_TRUTH):
        z, r, vjp = fam.truth(fam.Y[i], i)
        T.append(z)
        kkt.append(r)
        G.append(vjp(fam.V[i]))
    for i in range(N_TRUTH_NEG):
        Tneg.append(fam.truth(-fam.Y[i], i)[0])
    out = dict(
        T=np.stack(T),
        kkt=np.asarray(kkt),
        G=np.stack(G),
        Tneg=np.stack(Tneg),
        seconds=np.asarray(time.perf_counter() - start),
    )
    np.savez(path, **out)
    return out


class SocFamily:
    """The App. B.4 SOC set, data and checks; see the module docstring."""

    name = "soc"
    params = ("b",)
    same = True  # also time ours at the reference's own iteration (`ours_same`)

    def __init__(self, size: str, batch: int, seed: int = DATA_SEED):
        (d1, d2), _ = FAMILIES["soc"][size]
        self.size, self.batch, self.d1, self.d2, self.d = size, batch, d1, d2, d1 + d2
        self.A, b = soc_batch(d1, d2, batch, seed)
        self.E = np.hstack([self.A, np.eye(d2)])
        self.P = {"b": b}
        self.Y = np.random.RandomState(0).normal(size=(batch, self.d))
        self.V = np.random.RandomState(1).normal(size=(batch, self.d))
        self.dims = f"d1 = {d1}, d2 = {d2}"

    def cv(self, Y, per_instance=False):
        """max(||[A I] y - b||_inf, (||y2[:-1]|| - y2[-1])_+), float64."""
        Y = np.asarray(Y, np.float64)
        b = self.P["b"][: len(Y)]
        eq = np.abs(Y @ self.E.T - b).max(axis=1)
        cone = np.maximum(np.linalg.norm(Y[:, self.d1 : -1], axis=1) - Y[:, -1], 0)
        v = np.maximum(eq, cone)
        return v if per_instance else float(v.max())

    def ours(self, **settings):
        return soc_projector(self.E, self.d1, **settings)

    def reference(self, sigma, omega, dtype):
        from .._common.reference import ReferenceSOCProjector

        return ReferenceSOCProjector(self.A, sigma=sigma, omega=omega, dtype=dtype)

    ground_truth = _ground_truth

    def truth(self, y, i):
        """The projection of `y` for instance `i`: Clarabel, then Newton polish."""
        return soc_truth(self.E, self.P["b"][i], y, self.d1)


class AxFamily:
    """Per-instance E(x) with a box; see the module docstring."""

    name = "ax"
    params = ("E", "b")
    same = True

    def __init__(self, size: str, batch: int, seed: int = DATA_SEED):
        (d, m), _ = FAMILIES["ax"][size]
        self.size, self.batch, self.d, self.m = size, batch, d, m
        # One stream per array, so that instance i does not depend on the batch.
        E0 = np.random.RandomState(seed).normal(size=(m, d))
        E = E0 + 0.1 * np.random.RandomState(seed + 1).normal(size=(batch, m, d))
        y_feasible = np.random.RandomState(seed + 2).uniform(-0.5, 0.5, (batch, d))
        self.P = {"E": E, "b": np.einsum("bij,bj->bi", E, y_feasible)}
        self.Y = np.random.RandomState(0).normal(size=(batch, d))
        self.V = np.random.RandomState(1).normal(size=(batch, d))
        self.dims = f"d = {d}, m = {m}"

    def cv(self, Y, per_instance=False):
        """max(||E y - b||_inf, box violation), float64."""
        Y = np.asarray(Y, np.float64)
        n = len(Y)
        r = np.einsum("bij,bj->bi", self.P["E"][:n], Y) - self.P["b"][:n]
        v = np.maximum(np.abs(r).max(axis=1), np.maximum(np.abs(Y) - 1, 0).max(axis=1))
        return v if per_instance else float(v.max())

    def ours(self, **settings):
        import pinet_eqx as pe

        E = pe.Parameter("E", shape=(self.m, self.d))
        return pe.Projector(
            [
                pe.Equality(E, pe.Parameter("b")),
                pe.Box(-np.ones(self.d), np.ones(self.d)),
            ],
            **settings,
        )

    def reference(self, sigma, omega, dtype):
        from .._common.reference import ReferenceAxProjector

        return ReferenceAxProjector(
            self.m, self.d, -1.0, 1.0, sigma=sigma, omega=omega, dtype=dtype
        )

    ground_truth = _ground_truth

    def truth(self, y, i):
        import cvxpy as cp

        E, b = self.P["E"][i], self.P["b"][i]
        z = cp.Variable(self.d)
        prob = cp.Problem(
            cp.Minimize(cp.sum_squares(z - y)), [E @ z == b, z >= -1, z <= 1]
        )
        clarabel(prob, 1e-10, quiet=True)  # inaccurate: polished below
        return _polish_box(E, b, y, z.value)


def _polish_box(E, b, y, z):
    """Exact projection by a primal-dual active-set method on the bounds from
    Clarabel's z: z, the KKT residual and the VJP."""
    upper, lower = z > 1 - 1e-6, z < -1 + 1e-6
    for _ in range(100):
        active = upper | lower
        F = ~active
        z = np.where(upper, 1.0, np.where(lower, -1.0, 0.0))
        EF = E[:, F]
        lam = np.linalg.solve(EF @ EF.T, EF @ y[F] - (b - E[:, active] @ z[active]))
        z[F] = y[F] - EF.T @ lam
        # KKT: y - z - E^T lam = nu, nu >= 0 on upper bounds and <= 0 on lower.
        nu = y - z - E.T @ lam
        wrong_upper, wrong_lower = upper & (nu < 0), lower & (nu > 0)
        over, under = F & (z > 1), F & (z < -1)
        if not (wrong_upper.any() or wrong_lower.any() or over.any() or under.any()):
            break
        upper = (upper & ~wrong_upper) | over
        lower = (lower & ~wrong_lower) | under
    kkt = max(
        np.abs(E @ z - b).max(),
        np.maximum(np.abs(z) - 1, 0).max(),
        np.abs(nu[F]).max(initial=0),
        np.maximum(-nu[active] * z[active], 0).max(initial=0),
    )

    def vjp(v):
        # The active bounds are fixed; the free part is an affine projection.
        g = np.zeros_like(v)
        g[F] = v[F] - EF.T @ np.linalg.solve(EF @ EF.T, EF @ v[F])
        return g

    return z, float(kkt), vjp


def _polish_soc(E, b, y, z, d1):
    """Newton's method on the KKT system of the projection, from Clarabel's z."""
    d, m = E.shape[1], E.shape[0]
    u_idx = np.arange(d1, d - 1)

    def affine(y):
        return y - E.T @ np.linalg.solve(E @ E.T, E @ y - b)

    def g_grad_hess(z):
        u, t = z[u_idx], z[-1]
        nu = np.linalg.norm(u)
        grad = np.zeros(d)
        grad[u_idx], grad[-1] = u / nu, -1.0
        H = np.zeros((d, d))
        H[np.ix_(u_idx, u_idx)] = (np.eye(u.size) - np.outer(u, u) / nu**2) / nu
        return nu - t, grad, H

    zc = affine(y)
    if np.linalg.norm(zc[u_idx]) <= zc[-1]:  # the cone is inactive

        def vjp(v):
            return v - E.T @ np.linalg.solve(E @ E.T, E @ v)

        return zc, float(np.abs(E @ zc - b).max()), vjp

    def kkt_system(z, lam, mu):
        """The KKT residual F and its Jacobian J (symmetric) at (z, lam, mu)."""
        g, grad, H = g_grad_hess(z)
        F = np.concatenate([z - y + E.T @ lam + mu * grad, E @ z - b, [g]])
        J = np.zeros((d + m + 1, d + m + 1))
        J[:d, :d] = np.eye(d) + mu * H
        J[:d, d : d + m] = E.T
        J[:d, -1] = grad
        J[d : d + m, :d] = E
        J[-1, :d] = grad
        return F, J

    _, grad, _ = g_grad_hess(z)
    M = np.column_stack([E.T, grad])
    lm = np.linalg.lstsq(M, y - z, rcond=None)[0]
    lam, mu = lm[:m], lm[m]
    for _ in range(50):
        F, J = kkt_system(z, lam, mu)
        if np.abs(F).max() < 1e-13 * max(1.0, np.abs(y).max()):
            break
        step = np.linalg.solve(J, -F)
        z, lam, mu = z + step[:d], lam + step[d : d + m], mu + step[-1]
    F, J = kkt_system(z, lam, mu)
    kkt = max(float(np.abs(F).max()), max(-mu, 0.0))
    # Implicit differentiation of the (symmetric) KKT system: dz = [J^-1]_zz dy.

    def vjp(v):
        return np.linalg.solve(J, np.concatenate([v, np.zeros(m + 1)]))[:d]

    return z, kkt, vjp


def tables(results: list[dict]) -> str:
    """The Markdown tables of `results`."""
    sigma = results[0]["sigma"]
    lines = [
        "Times in ms: median [lower quartile, upper quartile] (min–max) over the "
        "timed repeats (n). Ratio = reference median / ours median. CV = largest "
        "violation over the batch (float64, original data). err = largest "
        f"|y − y*|∞ over the first {N_TRUTH} instances, y* = cvxpy + Clarabel "
        "polished by Newton's method on the KKT system (its KKT residual is in the "
        "last table). Load = 1-minute load average during the measurement. "
        'Variants: **ours** = `pe.Projector` with its defaults (σ = "auto", Ruiz '
        f"equilibration); **ours-same** = ours running the reference's iteration "
        f"(σ = {sigma:g}, `equilibrate=False`), to compare the cost of one "
        f"iteration; **ref** = the reference, σ = {sigma:g} (the best of a sweep "
        "of its iterations to 1e-6, float64, small size), no equilibration.",
        "",
        f"**a) Forward, n_iter = {N_ITER} for all**",
        "",
        "| size | prec | batch | n | ours ms | ours-same ms | ref ms | ratio ref / "
        "ours, ref / ours-same | CV, err: ours | ours-same | ref | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t, variants = r["fixed"], ("ours", "ours_same", "ref")
        acc = " | ".join(
            f"{t['acc'][k]['cv']:.1e}, {t['acc'][k]['err']:.1e}" for k in variants
        )
        ref, n = t["ref"]["median"], t["ours"]["repeats"]
        ratios = (
            f"{ref / t['ours']['median']:.2f}x, {ref / t['ours_same']['median']:.2f}x"
        )
        lines.append(
            f"| {r['size']} | {r['precision']} | {r['batch']} | {n} | "
            f"{fmt_t(t['ours'])} | {fmt_t(t['ours_same'])} | {fmt_t(t['ref'])} | "
            f"{ratios} | {acc} | {t['load']:.1f} |"
        )
    return "\n".join(lines + _tol_table(results) + _backward_tables(results))


def _tol_table(results: list[dict]) -> list[str]:
    """Table b), the time to the tolerance."""
    lines = [
        "",
        "**b) Time to CV ≤ tol and err ≤ tol** (1e-4 in f32, 1e-6 in f64): the "
        "smallest fixed n_iter that reaches both (searched to within 5%), for each "
        "variant; and ours with in-jit stopping (`tol=`, its own test: violation "
        "and fixed-point residual ≤ tol, per instance; it does not know err). "
        "Ratio = reference / the faster of ours and ours tol-stop, counting only "
        "calls whose CV and err are ≤ tol; ratio same = reference / ours-same.",
        "",
        "| size | prec | tol | ref: n_iter, ms, CV, err | ours: n_iter, ms, CV, err "
        "| ours tol-stop: steps max/mean, ms, CV, err | ours-same: n_iter, ms, CV, "
        "err | ratio | ratio same | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = r["tol"]
        tol = r["tolerance"]
        sr, ti = t["searches"], t["ours_tol_info"]

        def ok(a):
            return max(a["cv"], a["err"]) <= tol

        def cell(k):
            s = sr[k]
            if not s["reached"]:
                return f"not reached by n_iter {s['n_iter']}: best {s['best_cv']:.1e}"
            flag = "" if ok(s) else " (> tol)"
            return f"{s['n_iter']}, {fmt_t(t[k])}, {s['cv']:.1e}, {s['err']:.1e}{flag}"

        flag = "" if ok(ti) else " (> tol)"
        tol_cell = (
            f"{ti['steps_max']}/{ti['steps_mean']:.0f} (cap {ti['cap']}), "
            f"{fmt_t(t['ours_tol'])}, {ti['cv']:.1e}, {ti['err']:.1e}{flag}"
        )
        ours_ok = [t["ours_tol"]["median"]] if ok(ti) else []
        if "ours" in t and ok(sr["ours"]):
            ours_ok.append(t["ours"]["median"])
        ratio = ratio_same = "n/a"
        if "ref" in t and ok(sr["ref"]):
            if ours_ok:
                ratio = f"{t['ref']['median'] / min(ours_ok):.2f}x"
            if "ours_same" in t and ok(sr["ours_same"]):
                ratio_same = f"{t['ref']['median'] / t['ours_same']['median']:.2f}x"
        lines.append(
            f"| {r['size']} | {r['precision']} | {tol:g} | {cell('ref')} | "
            f"{cell('ours')} | {tol_cell} | {cell('ours_same')} | {ratio} | "
            f"{ratio_same} | {t['load']:.1f} |"
        )
    return lines


def _backward_tables(results: list[dict]) -> list[str]:
    """Tables c), the backward pass, and d), the accuracy of the converged runs."""
    rtol, atol = results[0]["bwd_tols"]
    lines = [
        "",
        f"**c) Forward + implicit VJP, n_iter = {N_ITER}, at most {N_ITER_BWD} "
        "BiCGStab steps on the fixed point** (ours: "
        '`ImplicitAdjoint(method="fixed_point")`, per-instance BiCGStab, '
        f"rtol {rtol:g}, atol {atol:g}; reference: batched `jax.scipy` BiCGStab). "
        "Gradient error = largest per-instance "
        "relative 2-norm difference from our unrolled gradient (autodiff through "
        f"the same {N_ITER} iterations, same precision) and, on the first "
        f"{N_TRUTH} instances, from the exact Jacobian of the true projection "
        "(implicit differentiation of the KKT system at y*). Ours, default: "
        "`ImplicitAdjoint()` (the active-set derivative for polyhedral sets, "
        "BiCGStab on the fixed point with its own tolerance and step limit "
        "otherwise).",
        "",
        bwd_table(results),
        "",
        f"**d) Accuracy after {N_ITER_CONVERGED} iterations** (first {N_TRUTH} "
        "instances; gradients with 200 BiCGStab steps, relative error from the "
        "exact Jacobian), and the sign check: max distance of the reference's "
        f"output for the first {N_TRUTH_NEG} instances from Π(−y_raw) and Π(y_raw) "
        "(a correct projector is far from the first and at ≈ err from the second).",
        "",
        "| size | prec | err ours | err ref | CV ours | CV ref | grad ours | grad ref "
        "| ref vs Π(−y_raw) | ref vs Π(y_raw) | truth KKT residual | set-up s: ours "
        "(form) / ref |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c, s = r["converged"], r["setup"]
        lines.append(
            f"| {r['size']} | {r['precision']} | {c['err_ours']:.1e} | "
            f"{c['err_ref']:.1e} | {c['cv_ours']:.1e} | {c['cv_ref']:.1e} | "
            f"{c['grad_ours']:.1e} | {c['grad_ref']:.1e} | "
            f"{c['ref_vs_neg']:.2f} | {c['ref_vs_pos']:.1e} | {r['truth_kkt']:.0e} | "
            f"{s['ours']:.2f} ({s['form']}) / {s['ref']:.2f} |"
        )
    return lines


TITLES = {  # each family's record: title and place on the page
    "soc": ("Second-order cone (paper App. B.4), `--family soc`", 3),
    "ax": ("Per-instance equality matrix E(x) with a box, `--family ax`", 4),
}


def measure(size: str, args) -> dict:
    """In a worker process: every measurement of `args.family` for one size in
    its precision."""
    cls = SocFamily if args.family == "soc" else AxFamily
    fam = cls(size, args.batch or FAMILIES[args.family][size][1])
    repeats = args.repeats
    if size == "large":
        repeats = min(repeats, args.repeats_large_f64)
    return run(fam, args.precision[0], repeats, args.sigma)


def details(args, results: list[dict]) -> str:
    """The data and settings, for the subsection's header."""
    dims = "; ".join(
        f"{r['size']}: {r['dims']}, batch {r['batch']}"
        for r in results
        if r["precision"] == results[0]["precision"]
    )
    return (
        f"Sizes: {dims}. Data seed {DATA_SEED}, y_raw ~ N(0, I) (seed 0), "
        f"ω = {OMEGA} everywhere."
    )
