"""The exact projections in float64, independent of `pinet_eqx`: the float32
rounding floor of each case."""

from __future__ import annotations

import time

import numpy as np

from .._common.solvers import clarabel
from ._data import KINDS, CaseData, float32_grid


class SlackSystem:
    r"""The polytope $\{y : A y = x,\ G y \le h\}$ in the slack variables $w =
    G y$, $K = [A; G]$ square and invertible (every DC3 problem): a quadratic
    objective is a bound-constrained QP in $w$, which `minimise` solves by the
    primal-dual active-set method (Hintermüller, Ito and Kunisch, 2003), exact
    on the active bounds: feasible to float64 rounding."""

    def __init__(self, A, G, h):
        import scipy.linalg

        self.A, self.G, self.h = (np.asarray(a, np.float64) for a in (A, G, h))
        m, d = self.A.shape
        if m + len(self.G) != d:
            raise ValueError("SlackSystem needs n_eq + n_ineq == n_var.")
        K = np.vstack([self.A, self.G])
        self._lu = scipy.linalg.lu_factor(K)
        # LAPACK's estimate of the 1-norm condition number, from the LU factors.
        rcond, _ = scipy.linalg.lapack.dgecon(self._lu[0], np.abs(K).sum(0).max())
        self.cond = float(1.0 / rcond)
        self._solve = scipy.linalg.lu_solve
        # y = U x + B w.
        self._H = {}
        self.B = self._solve(
            self._lu, np.vstack([np.zeros((m, len(G))), np.eye(len(G))])
        )

    def point(self, x, w) -> np.ndarray:
        """$y = K^{-1}[x; w]$."""
        return self._solve(self._lu, np.concatenate([x, w]))

    def minimise(self, x, Q_diag, p, max_iter: int = 100):
        r"""`(y, stats)`: $\arg\min_y \tfrac12 y^\top \mathrm{diag}(Q) y + p^\top y$
        over the polytope of context `x`, and the iterations, active bounds, KKT
        residuals and `converged` (`y` `None` unless settled in `max_iter`)."""
        import scipy.linalg

        B, h = self.B, self.h
        y0 = self.point(x, np.zeros_like(h))
        # In w: 1/2 w^T H w - c^T w with H = B^T Q B, c = -B^T (Q y0 + p); H is
        # kept for the next call with the same Q.
        key = np.asarray(Q_diag, np.float64).tobytes()
        if key not in self._H:
            H = B.T @ (Q_diag[:, None] * B)
            self._H = {key: (H, scipy.linalg.cho_factor(H))}
        H, factor = self._H[key]
        c = -B.T @ (Q_diag * y0 + p)
        scale = max(np.abs(c).max(), 1.0)
        w = scipy.linalg.cho_solve(factor, c)
        active = w > h
        for it in range(1, max_iter + 1):
            free = ~active
            w = np.where(active, h, 0.0)
            rhs = c[free] - H[np.ix_(free, active)] @ h[active]
            w[free] = scipy.linalg.solve(H[np.ix_(free, free)], rhs, assume_a="pos")
            mu = c - H @ w  # the multipliers of w <= h (zero on the free set)
            mu[free] = 0.0
            new = mu + (w - h) * scale > 0
            if np.array_equal(new, active):
                grad = np.abs((c - H @ w)[free]).max(initial=0.0) / scale
                stats = {
                    "iterations": it,
                    "active": int(active.sum()),
                    # Negative only where a multiplier has the wrong sign.
                    "min_multiplier": float(mu[active].min(initial=0.0) / scale),
                    "free_gradient": grad,
                    "max_slack_excess": float((w - h).max(initial=-np.inf)),
                    "converged": True,
                }
                return self.point(x, w), stats
            active = new
        return None, {"iterations": max_iter, "converged": False}

    def project(self, x, y_raw):
        """The exact projection of `y_raw` onto the polytope of `x`."""
        return self.minimise(x, np.ones_like(y_raw), -np.asarray(y_raw, np.float64))


_SLACK_SYSTEMS: dict = {}


def slack_system(A, G, h) -> SlackSystem:
    """`SlackSystem(A, G, h)`, built once per problem (the optima and the exact
    projections share it)."""
    key = hash(tuple(np.asarray(a, np.float64).tobytes() for a in (A, G, h)))
    if key not in _SLACK_SYSTEMS:
        _SLACK_SYSTEMS.clear()
        _SLACK_SYSTEMS[key] = SlackSystem(A, G, h)
    return _SLACK_SYSTEMS[key]


class ClarabelProjection:
    """The projection onto a `CaseData`'s set by cvxpy + Clarabel (set up once),
    then `polish`ed: Clarabel alone stops up to about 1e-5 inside the cone where
    the projection is on its boundary, which would understate the floor."""

    def __init__(self, data: CaseData):
        import cvxpy as cp

        self.data = data
        self.z = cp.Variable(data.dim)
        self.y = cp.Parameter(data.dim)
        self.q = cp.Parameter(data.E.shape[0])
        cons = [data.E @ self.z == self.q]
        up, lo = np.isfinite(data.upper), np.isfinite(data.lower)
        if up.any():
            cons.append(data.C[up] @ self.z <= data.upper[up])
        if lo.any():
            cons.append(data.C[lo] @ self.z >= data.lower[lo])
        if len(data.S):
            cons.append(cp.SOC(data.f @ self.z, data.S @ self.z))
        self.problem = cp.Problem(cp.Minimize(cp.sum_squares(self.z - self.y)), cons)

    def project(self, q, y_raw):
        self.q.value, self.y.value = np.asarray(q), np.asarray(y_raw)
        settings = dict(quiet=True, tol_ktratio=1e-10, max_iter=500)
        clarabel(self.problem, 1e-12, **settings)
        stats = {"status": self.problem.status}
        if self.problem.status not in ("optimal", "optimal_inaccurate"):
            return None, stats
        z = np.asarray(self.z.value)
        y, kkt = polish(self.data, q, y_raw, z)
        stats.update(kkt)
        return (z if y is None else y), stats


def polish(data: CaseData, q, r, z, thresholds=(1e-9, 1e-7, 1e-5, 1e-3)):
    r"""`(y, stats)`: the exact projection of `r` from an approximate one `z`, by
    Newton's method on $y - r + A(y)^\top \lambda = 0$ with the constraints
    active at `z` (within each of `thresholds`, relative) as equalities (the
    cone as $\|S y\| = f^\top y$); the first candidate feasible to $10^{-12}$
    with multipliers of the right sign, or `None`."""
    E, C, S, f = data.E, data.C, data.S, data.f
    d = len(r)
    scale = max(1.0, float(np.abs(r).max()), float(np.abs(q).max()))
    Cz = C @ z
    for tau in thresholds:
        upper = np.isfinite(data.upper) & (Cz >= data.upper - tau * scale)
        lower = np.isfinite(data.lower) & (Cz <= data.lower + tau * scale)
        rows = np.flatnonzero(upper | lower)
        rhs = np.concatenate([q, np.where(upper, data.upper, data.lower)[rows]])
        sign = np.where(upper[rows], 1.0, -1.0)  # right sign: nu * sign >= 0
        M = np.vstack([E, C[rows]])
        cone = bool(len(S)) and bool(np.linalg.norm(S @ z) - f @ z >= -tau * scale)
        if cone and np.linalg.norm(S @ z) == 0.0:
            continue  # the apex, where g is not differentiable
        y, lam = z.copy(), np.zeros(len(M) + cone)
        for _ in range(20 if cone else 2):
            A, res, H = M, M @ y - rhs, np.zeros((d, d))
            if cone:
                Sy = S @ y
                norm = np.linalg.norm(Sy)
                A = np.vstack([M, (S.T @ Sy / norm - f)[None]])
                res = np.append(res, norm - f @ y)
                P = np.eye(len(S)) / norm - np.outer(Sy, Sy) / norm**3
                H = lam[-1] * (S.T @ P @ S)
            K = np.block([[np.eye(d) + H, A.T], [A, np.zeros((len(A), len(A)))]])
            sol = _solve_kkt(K, np.concatenate([r - y, -res]))
            y, lam = y + sol[:d], sol[d:]
            if np.abs(sol[:d]).max() <= 1e-14 * scale:
                break
        station = float(np.abs(y - r + A.T @ lam).max())
        nu = lam[len(E) : len(M)] * sign
        cone_mult = float(lam[-1]) if cone else 0.0
        cv = float(data.violation(y[None], q[None])[0])
        if (
            cv <= 1e-12 * scale
            and station <= 1e-10 * scale
            and nu.min(initial=0.0) >= -1e-9 * scale
            and cone_mult >= -1e-9 * scale
        ):
            return y, {
                "polished": True,
                "threshold": tau,
                "active_rows": len(rows),
                "cone_active": cone,
                "stationarity": station,
                "move": float(np.abs(y - z).max()),
            }
    return None, {"polished": False}


def _solve_kkt(K, b):
    """`K x = b` by dense LU, or by dense least squares where dependent active
    rows make `K` singular (SuperLU crashed the process on some of those)."""
    import warnings

    import scipy.linalg

    K = K.toarray() if hasattr(K, "toarray") else np.asarray(K)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
            x = scipy.linalg.solve(K, b, check_finite=False)
        if np.all(np.isfinite(x)) and np.abs(K @ x - b).max() <= 1e-12 * max(
            1.0, np.abs(b).max()
        ):
            return x
    except (np.linalg.LinAlgError, ValueError):
        pass  # exactly singular
    return scipy.linalg.lstsq(K, b, lapack_driver="gelsy", check_finite=False)[0]


def exact_projections(data: CaseData, rows, method: str, check: int = 0) -> dict:
    """The exact projections of the raw outputs of instances `rows` by `method`:
    per kind the `floor` (the CV of their float32 rounding), `exact_cv_max`,
    `failed` and the solver's statistics (`check` of them against Clarabel)."""
    start = time.perf_counter()
    if method == "slack":
        solver = slack_system(data.spec["A"], data.spec["G"], data.spec["h"])
    else:
        solver = ClarabelProjection(data)
    out = {"method": method, "rows": [int(i) for i in rows]}
    for kind in KINDS:
        R = data.raw(kind)
        Y = np.full((len(rows), data.dim), np.nan)
        stats = []
        for j, i in enumerate(rows):
            y, s = solver.project(data.q[i], R[i])
            stats.append(s)
            if y is not None:
                Y[j] = y
        ok = ~np.isnan(Y).any(axis=1)
        q = data.q[np.asarray(rows)[ok]]
        exact_cv = data.violation(Y[ok], q)
        floor = np.full(len(rows), np.nan)
        floor[ok] = data.violation(float32_grid(Y[ok]), q)
        entry = {
            "floor": float(np.nanmax(floor)) if ok.any() else float("nan"),
            "floor_median": float(np.nanmedian(floor)) if ok.any() else float("nan"),
            "floor_per_instance": floor.tolist(),
            "exact_cv_max": float(exact_cv.max(initial=0.0)),
            "failed": int((~ok).sum()),
        }
        if method == "slack":
            done = [s for s in stats if s["converged"]]
            entry["active_set"] = {
                "iterations_max": max((s["iterations"] for s in done), default=0),
                "active_mean": float(np.mean([s["active"] for s in done])),
                "min_multiplier": min(s["min_multiplier"] for s in done),
                "free_gradient_max": max(s["free_gradient"] for s in done),
                "cond1_K": solver.cond,
            }
            if check:
                clarabel = ClarabelProjection(data)
                diff = 0.0
                for j, i in enumerate(rows[:check]):
                    z, _ = clarabel.project(data.q[i], R[i])
                    diff = max(diff, float(np.abs(z - Y[j]).max()))
                entry["clarabel_check"] = {"instances": check, "max_abs_diff": diff}
        else:
            polished = [s for s in stats if s.get("polished")]
            entry["clarabel"] = {
                "statuses": sorted({s["status"] for s in stats}),
                "polished": len(polished),
                "polish_move_max": max((s["move"] for s in polished), default=0.0),
                "stationarity_max": max(
                    (s["stationarity"] for s in polished), default=0.0
                ),
                "cone_active": int(sum(s["cone_active"] for s in polished)),
            }
        out[kind] = entry
    out["seconds"] = time.perf_counter() - start
    return out
