r"""Inference feasibility at the library's defaults (issue 15).

For each case the projector is `pe.Projector(constraints)`, with no keyword but
the constraints, switched to inference with `eqx.nn.inference_mode`. It projects
two batches of raw outputs: *near* ($y^\star + 0.01\,\mathcal{N}(0, I)$, about
where a trained network puts them) and *far* ($y^\star + 5\,\mathcal{N}(0, I)$,
as an untrained backbone gives), with $y^\star$ an optimum of the case's problem.
Measured, per case:

- the largest constraint violation (CV) of the outputs, in float64 from the
  constraint data, in float32 and in float64 (one worker process per dtype, so
  that JAX's x64 flag is set before it starts);
- the float32 rounding floor: the CV of the exact projection, computed in
  float64 independently of `pinet_eqx` and rounded to float32. For DC3 it is a
  primal-dual active-set solve in the slack variables $w = G y$ (checked against
  cvxpy + Clarabel on a few instances of the smaller sizes); elsewhere cvxpy +
  Clarabel at tight tolerances, polished by Newton's method on the KKT
  conditions of the active set (`polish`). The record holds their float64 CV
  and KKT residuals;
- the share of instances whose `ProjectionSolution.result` is
  `RESULTS.successful`, and whether that flag agrees with the measured CV;
- batch-1024 and single-instance latency of the jitted forward pass (float32),
  interleaved with the same at `polish=False` and at `refine=False` (what the
  default polish and refinement cost), with the projector as a jit argument
  (single instance), and, on DC3, with the reference (`pinet-hcnn` at the
  paper's configuration: its tuned $\sigma$, Ruiz equilibration, 50
  iterations).

The raw outputs and the per-instance data are rounded to float32 before anything
else, so that both precisions and the exact projection see the same instances.
The targets are the issue's: float32 max CV at most
$10^{-6} \max(1, \|\text{data}\|_\infty)$ and at most 1.5 times the floor (on the
instances the floor was computed for); float64 max CV at most $10^{-9}$.

    python -m benchmarks.feasibility [--cases ...] [--dtypes float32 float64]
        [--instances DIR] [--n N] [--no-timing] [--out PATH] [--markdown PATH]
        [--cache DIR [--prepare-only]]

`--instances` points at the folder of the paper's DC3 files
(`dc3_random_{simple,nonconvex}_dataset_*{valid,test}.npz`); without it the DC3
instances are generated with `pinet_eqx.problems.make_dc3` (the same data) and
their optima solved here. The record (JSON) holds every number; the Markdown
tables go to standard output (and to `--markdown`). `--cache DIR` keeps the
instances and their exact projections in `DIR`, and `--prepare-only` stops
after making them: `benchmarks/gpu.sh` runs every case on a GPU machine that
lacks the solvers (cvxpy, OSQP, IPOPT) from a cache prepared on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

from ._common.problems import linear_violation
from ._common.provenance import command_line, describe, machine

PROG = "python -m benchmarks.feasibility"
ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "_out" / "feasibility.json"
NEAR_SCALE = 0.01  # standard deviation of the noise around the optimum, near
FAR_SCALE = 5.0  # and far (an untrained backbone's outputs)
F32_REL_TARGET = 1e-6  # float32 max CV <= this * max(1, ||data||_inf)
FLOOR_FACTOR = 1.5  # ... and <= this * the float32 rounding floor
F64_TARGET = 1e-9
KINDS = ("near", "far")
DTYPES = ("float32", "float64")
TIMING_BATCH = 1024


def log(message: str) -> None:
    """Progress on standard error, flushed at once (a run takes minutes)."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the instances


def _f32(a) -> np.ndarray:
    """`a` rounded to float32, held in float64."""
    return np.asarray(a, np.float64).astype(np.float32).astype(np.float64)


@dataclasses.dataclass(frozen=True, eq=False)
class CaseData:
    r"""One case's instances, in float64 NumPy arrays.

    The feasible set of instance $i$ is $\{y : E y = q_i,\ \ell \le C y \le u,\
    \|S y\|_2 \le f^\top y\}$ (rows of $C$ with infinite bounds are one-sided;
    `S` has no rows where there is no cone). This generic form is what the CV
    and the exact projection are computed from; the case's own builder makes the
    `pe.Projector` from `spec`.

    **Fields:**

    - `name`: the case.
    - `E`, `q`: the equality matrix `(m, d)` and right-hand sides `(n, m)`.
    - `C`, `lower`, `upper`: the inequality rows `(k, d)` and bounds `(k,)`.
    - `S`, `f`: the second-order cone, `(s, d)` and `(d,)`.
    - `params`: the projector's per-instance `Parameter`s, each `(n, ...)`.
    - `near`, `far`: the raw outputs, `(n, d)`.
    - `spec`: arrays the case's projector builder needs.
    - `info`: how the instances were made.
    """

    name: str
    E: np.ndarray
    q: np.ndarray
    C: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    S: np.ndarray
    f: np.ndarray
    params: dict
    near: np.ndarray
    far: np.ndarray
    spec: dict
    info: dict

    @property
    def n(self) -> int:
        return len(self.near)

    @property
    def dim(self) -> int:
        return self.E.shape[1]

    def raw(self, kind: str) -> np.ndarray:
        return self.near if kind == "near" else self.far

    def violation(self, Y, q=None) -> np.ndarray:
        """The CV of each row of `Y` for the right-hand sides `q` (default: all
        the instances'), float64: the largest of $|E y - q|$, the bounds' excess
        and the cone's $(\\|S y\\| - f^\\top y)_+$."""
        Y = np.asarray(Y, np.float64)
        q = self.q if q is None else q
        out = linear_violation(Y, self.E, q, self.C, self.lower, self.upper)
        if len(self.S):
            cone = np.linalg.norm(Y @ self.S.T, axis=1) - Y @ self.f
            out = np.maximum(out, cone)
        return np.maximum(out, 0.0)

    def data_norm(self) -> float:
        """$\\|\\text{data}\\|_\\infty$: the largest entry of the constraint data
        (matrices, right-hand sides, finite bounds) over all instances."""
        parts = [self.E, self.q, self.C, self.S, self.f]
        bounds = np.concatenate([self.lower, self.upper])
        parts.append(bounds[np.isfinite(bounds)])
        return float(max(np.abs(p).max(initial=0.0) for p in parts))

    def save(self, path) -> None:
        arrays = {
            k: getattr(self, k)
            for k in ("E", "q", "C", "lower", "upper", "S", "f", "near", "far")
        }
        arrays |= {f"param:{k}": v for k, v in self.params.items()}
        arrays |= {f"spec:{k}": np.asarray(v) for k, v in self.spec.items()}
        np.savez(path, **arrays)
        pathlib.Path(path).with_suffix(".json").write_text(
            json.dumps({"name": self.name, "info": self.info})
        )

    @classmethod
    def load(cls, path) -> CaseData:
        meta = json.loads(pathlib.Path(path).with_suffix(".json").read_text())
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        params = {k[6:]: v for k, v in arrays.items() if k.startswith("param:")}
        spec = {k[5:]: v for k, v in arrays.items() if k.startswith("spec:")}
        plain = {k: v for k, v in arrays.items() if ":" not in k}
        return cls(meta["name"], **plain, params=params, spec=spec, info=meta["info"])


def _case_data(
    name, E, q, C, lower, upper, optimum, params, spec, info, seed, S=None, f=None
):
    """`CaseData` with near and far raw outputs drawn around `optimum`; the raw
    outputs and the per-instance data are rounded to float32."""
    rng = np.random.default_rng([seed, 15])
    d = E.shape[1]
    noise = rng.normal(size=(2, *optimum.shape))
    return CaseData(
        name=name,
        E=np.asarray(E, np.float64),
        q=_f32(q),
        C=np.asarray(C, np.float64),
        lower=np.asarray(lower, np.float64),
        upper=np.asarray(upper, np.float64),
        S=np.zeros((0, d)) if S is None else np.asarray(S, np.float64),
        f=np.zeros(d) if f is None else np.asarray(f, np.float64),
        params={k: _f32(v) for k, v in params.items()},
        near=_f32(optimum + NEAR_SCALE * noise[0]),
        far=_f32(optimum + FAR_SCALE * noise[1]),
        spec=spec,
        info={**info, "near": f"optimum + {NEAR_SCALE} N(0, I)",
              "far": f"optimum + {FAR_SCALE} N(0, I)"},
    )  # fmt: skip


# ------------------------------------------------- exact projection, float64


class SlackSystem:
    r"""The polytope $\{y : A y = x,\ G y \le h\}$ in the slack variables
    $w = G y$, when $K = [A; G]$ is square and invertible (every DC3 problem):
    $y = K^{-1} [x; w]$ is an affine bijection between $w$ and the affine
    subspace, and the inequalities become the bounds $w \le h$.

    A quadratic objective in $y$ is then a bound-constrained quadratic programme
    in $w$, which `minimise` solves by the primal-dual active-set method
    (Hintermüller, Ito and Kunisch, 2003): guess the active bounds, solve the
    linear system on the free variables, update the guess from the multipliers
    and the bound violations, until the guess repeats. Each iterate holds the
    active bounds exactly, and $y$ comes from a backward-stable solve with $K$,
    so the result is feasible to float64 rounding.
    """

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
        r"""$\arg\min_y \tfrac12 y^\top \mathrm{diag}(Q) y + p^\top y$ over the
        polytope of context `x` (`Q_diag` all ones and $p = -y_{raw}$: the
        projection of $y_{raw}$).

        **Returns:** `(y, stats)`, `stats` with the iterations, the number of
        active bounds, the KKT residuals (smallest multiplier of an active bound,
        largest gradient on the free ones, relative) and `converged`; `y` is
        `None` if the active set did not settle within `max_iter`.
        """
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
    """The projection onto a `CaseData`'s set by cvxpy + Clarabel, set up once
    (the raw point and the right-hand side are cvxpy `Parameter`s), then
    polished (`polish`): Clarabel alone stops short of float64 accuracy on the
    cone (points inside it by up to about 1e-5 where the exact projection is on
    its boundary), which would understate the floor."""

    SETTINGS = dict(
        tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, tol_ktratio=1e-10,
        max_iter=500,
    )  # fmt: skip

    def __init__(self, data: CaseData):
        import cvxpy as cp

        self._cp = cp
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
        import warnings

        self.q.value, self.y.value = np.asarray(q), np.asarray(y_raw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "may be inaccurate"
            self.problem.solve(solver=self._cp.CLARABEL, **self.SETTINGS)
        stats = {"status": self.problem.status}
        if self.problem.status not in ("optimal", "optimal_inaccurate"):
            return None, stats
        z = np.asarray(self.z.value)
        y, kkt = polish(self.data, q, y_raw, z)
        stats.update(kkt)
        return (z if y is None else y), stats


def polish(data: CaseData, q, r, z, thresholds=(1e-9, 1e-7, 1e-5, 1e-3)):
    r"""The exact projection of `r` from an approximate one `z`, by Newton's
    method on the KKT conditions of its active constraints.

    The active set is guessed from `z` (inequality rows and the cone within a
    threshold of their bounds, relative to $\max(1, \|r\|_\infty)$). The
    active rows become equalities and the cone $g(y) = \|S y\| - f^\top y = 0$
    a smooth one; Newton's method then solves
    $y - r + A(y)^\top \lambda = 0$ with the active constraints, $A(y)$ their
    Jacobian (one step where they are all affine). A candidate is accepted only
    if it satisfies every KKT condition: feasible to $10^{-12}$ and multipliers
    of the right sign. The thresholds are tried in turn.

    **Returns:** `(y, stats)`; `y` is `None` if no candidate passes.
    """
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
    """`K x = b` by dense LU, or by dense least squares (complete orthogonal
    factorisation) where dependent active rows make `K` singular.

    Dense: the systems are small (at most a few thousand rows), and SuperLU
    (`scipy.sparse.linalg.splu`) crashed the process on some singular ones.
    """
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
    """The exact projections of the near and far raw outputs of instances `rows`
    (float64), their float64 CV, and the CV of their float32 rounding: the floor.

    **Arguments:**

    - `method`: `"slack"` (`SlackSystem`, for DC3) or `"clarabel"`.
    - `check`: with `"slack"`, also solve the first `check` instances with
        Clarabel and record the largest difference.

    **Returns:** per kind: `floor` (max over `rows`), `floor_per_instance`,
    `exact_cv_max` (float64 CV of the exact points), `failed` (instances with no
    exact projection, left out of the floor), and the solver's statistics.
    """
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
        floor[ok] = data.violation(_f32(Y[ok]), q)
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


# --------------------------------------------------------------------- cases


def _dc3_problem(size: str, problem: str, instances):
    """The DC3 problem, test contexts and their optima: from the paper's files
    (`instances`, small only) or generated (`make_dc3`) and solved here."""
    from pinet_eqx.problems import make_dc3

    from ._common.problems import DC3_SIZES, read_paper_instances

    if instances is not None and size == "small":
        paper = read_paper_instances(instances, problem)
        return paper.problem, paper.X_test, paper.Y_test, f"paper files in {instances}"
    n_var, n_eq, n_ineq, n_examples, _, n_test = DC3_SIZES[size]
    dc3 = make_dc3(n_var, n_eq, n_ineq, n_examples)
    X = dc3.split(n_test=n_test, n_valid=0)[2]
    return dc3, X, None, "pinet_eqx.problems.make_dc3, test contexts"


def _dc3_case(size: str, problem: str):
    def build(n: int, seed: int, instances) -> CaseData:
        dc3, X, Y, source = _dc3_problem(size, problem, instances)
        X = _f32(X[:n])
        if Y is not None:
            Y, how = Y[:n], "the files' Ystar"
        elif problem == "nonconvex":
            from .dc3._solvers import solve_nonconvex

            Y, how = solve_nonconvex(dc3, X, progress=False), "IPOPT (local optima)"
        else:
            slack = slack_system(dc3.A, dc3.G, dc3.h)
            Q = np.diag(dc3.Q)
            Y = np.stack([slack.minimise(x, Q, dc3.p)[0] for x in X])
            how = "active-set QP solve in float64"
        info = {"source": source, "optimum": how, "size": size, "problem": problem,
                "n_var": dc3.n_var, "n_eq": dc3.n_eq, "n_ineq": dc3.n_ineq}  # fmt: skip
        return _case_data(
            f"dc3-{size}-{problem}", dc3.A, X, dc3.G, np.full(dc3.n_ineq, -np.inf),
            dc3.h, Y, {"b": X}, {"A": dc3.A, "G": dc3.G, "h": dc3.h}, info, seed,
        )  # fmt: skip

    def projector(data: CaseData, **settings):
        import pinet_eqx as pe

        s = data.spec
        constraints = [
            pe.Equality(s["A"], pe.Parameter("b")),
            pe.AffineInequality(s["G"], upper=s["h"]),
        ]
        return pe.Projector(constraints, **settings)

    def reference(data: CaseData):
        from ._common.problems import PAPER_SIGMA
        from ._common.reference import (
            REFERENCE_MISSING,
            ReferenceDC3Projector,
            reference_available,
        )

        if size not in PAPER_SIGMA:
            return None
        if not reference_available():
            return None, {"skipped": REFERENCE_MISSING}
        s = data.spec
        sigma = PAPER_SIGMA[size]
        ref = ReferenceDC3Projector(s["A"], s["G"], s["h"], sigma=sigma)
        settings = {"sigma": sigma, "n_iter": 50, "omega": ref.omega}
        return ref.make_forward(50), {**settings, "equilibrate": True}

    return build, projector, reference


def _soc_case():
    from ._common.problems import soc_projector

    def build(n: int, seed: int, instances) -> CaseData:
        from .soc._data import load

        data = load("small", seed=seed)
        d1, d2 = data.d1, data.d2
        b, _ = data.split(data.X_test[:n])
        E = data.E
        d = E.shape[1]
        info = {"source": "benchmarks.soc._data.load('small')", "optimum": "analytic",
                "d1": d1, "d2": d2}  # fmt: skip
        return _case_data(
            "soc-small", E, b, np.zeros((0, d)), np.zeros(0), np.zeros(0),
            data.Y_test[:n], {"b": b}, {"E": E, "d1": d1}, info, seed,
            S=np.eye(d)[d1 : d - 1], f=np.eye(d)[d - 1],
        )  # fmt: skip

    def projector(data: CaseData, **settings):
        return soc_projector(data.spec["E"], int(data.spec["d1"]), **settings)

    return build, projector, lambda data: None


def _mpc_case():
    def build(n: int, seed: int, instances) -> CaseData:
        from examples import toy_mpc

        X0 = _f32(toy_mpc.sample_states(np.random.default_rng([seed, 0]), n))
        Y, _ = toy_mpc.solve_osqp(X0)
        E0, E_dyn, lower, upper = toy_mpc.problem_data()
        d = E0.shape[1]
        q = np.hstack([X0, np.zeros((n, len(E_dyn)))])
        info = {"source": "examples/toy_mpc.py: problem_data, sample_states",
                "optimum": "OSQP (polished)", "n_var": d}  # fmt: skip
        return _case_data(
            "toy-mpc", np.vstack([E0, E_dyn]), q, np.eye(d), lower, upper, Y,
            {"x0": X0}, {}, info, seed,
        )  # fmt: skip

    def projector(data: CaseData, **settings):
        import pinet_eqx as pe
        from examples import toy_mpc

        E0, E_dyn, lower, upper = toy_mpc.problem_data()
        return pe.Projector(
            [
                pe.Equality(E0, pe.Parameter("x0")),
                pe.Equality(E_dyn, np.zeros(len(E_dyn))),
                pe.Box(lower, upper),
            ],
            **settings,
        )

    return build, projector, lambda data: None


MOTION_HORIZON = 100


def _motion_case():
    def problem():
        from examples import motion_planning as mp

        return mp.Problem(n_vehicles=1, horizon=MOTION_HORIZON)

    def build(n: int, seed: int, instances) -> CaseData:
        from examples import motion_planning as mp
        from examples.motion_planning._problem import (
            constraint_matrices,
            feasible_trajectory,
            sample_contexts,
            to_axes,
        )

        prob = problem()
        # One instance per coordinate of each context, as the per-axis projector
        # of `python -m examples.motion_planning context` sees them.
        n_ctx = -(-n // 2)
        starts, goals = sample_contexts(np.random.default_rng([seed, 0]), n_ctx, prob)
        starts, goals = _f32(starts[:, 0]), _f32(goals[:, 0])
        Y = np.stack([feasible_trajectory(s, g, prob) for s, g in zip(starts, goals)])
        Y = to_axes(Y).reshape(2 * n_ctx, -1)[:n]
        start = starts.reshape(-1, 1)[:n]
        goal = goals.reshape(-1, 1)[:n]
        c = {k: (v[0::2, 0::2] if v.ndim == 2 else v[0::2])
             for k, v in constraint_matrices(prob).items()}  # fmt: skip
        E = np.vstack([c["dynamics"], c["rest"], c["start"], c["goal"]])
        zeros = np.zeros((n, len(c["dynamics"]) + len(c["rest"])))
        d = E.shape[1]
        j = prob.j_max
        info = {"source": "examples.motion_planning (Problem(1, horizon=100), "
                "make_projector(per_axis=True)), sample_contexts",
                "optimum": "feasible_trajectory (effort-optimal)", "n_var": d,
                "module": mp.__name__}  # fmt: skip
        return _case_data(
            f"motion-h{MOTION_HORIZON}", E, np.hstack([zeros, start, goal]),
            np.vstack([np.eye(d), c["jerk"]]),
            np.concatenate([c["lower"], np.full(len(c["jerk"]), -j)]),
            np.concatenate([c["upper"], np.full(len(c["jerk"]), j)]),
            Y, {"start": start, "goal": goal}, {}, info, seed,
        )  # fmt: skip

    def projector(data: CaseData, **settings):
        from examples.motion_planning._problem import make_projector

        return make_projector(problem(), per_axis=True, **settings)

    return build, projector, lambda data: None


@dataclasses.dataclass(frozen=True)
class Case:
    """A case: what it is, its default sizes and how to build it.

    **Fields:** `description`; `n` (instances) and `n_floor` (instances whose
    exact projection is computed, `None`: all); `exact` (`"slack"` or
    `"clarabel"`); `make` (a function returning `(build, projector,
    reference)`: `build(n, seed, instances) -> CaseData`, `projector(data,
    **settings) -> pe.Projector`, with no settings at the library defaults,
    `reference(data) -> (forward, settings)`, `forward` `None` where the
    reference is not installed, or `None` where it has no configuration);
    `timing_repeats` (batch repeats; single: 10x); `time_far` (also time the
    far batch); `time_unrefined` (also time `refine=False`, to show what the
    default refinement costs).
    """

    description: str
    n: int
    n_floor: int | None
    exact: str
    make: Callable
    timing_repeats: int = 20
    time_far: bool = True
    time_unrefined: bool = True


CASES = {
    "dc3-tiny-convex": Case("DC3 tiny convex, 20/10/10 (generated)", 100, None,
                            "slack", lambda: _dc3_case("tiny", "convex"), 5),
    "dc3-small-convex": Case("DC3 small convex, 100/50/50", 512, None, "slack",
                             lambda: _dc3_case("small", "convex")),
    "dc3-small-nonconvex": Case("DC3 small non-convex, 100/50/50", 512, None, "slack",
                                lambda: _dc3_case("small", "nonconvex")),
    "dc3-large-convex": Case("DC3 large convex, 1000/500/500 (generated)", 64, 32,
                             "slack", lambda: _dc3_case("large", "convex"), 2,
                             time_far=False, time_unrefined=False),
    "soc-small": Case("SOC benchmark (App. B.4), d1 = d2 = 25", 512, 64,
                      "clarabel", _soc_case),
    "toy-mpc": Case("Toy MPC (App. A), 82 variables", 512, 64, "clarabel", _mpc_case),
    "motion-h100": Case("Motion planning H = 100, per axis, 302 variables", 256, 64,
                        "clarabel", _motion_case, 10),
}  # fmt: skip
DEFAULT_CASES = tuple(c for c in CASES if c != "dc3-tiny-convex")


# -------------------------------------------------------------- the workers


def _worker(dtype: str, folder: pathlib.Path, names, timing: bool, scale: float):
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
        entry = {
            "setup_s": time.perf_counter() - start,
            "defaults": {
                "sigma": float(np.asarray(proj.sigma)),
                "omega": proj.omega,
                "n_iter_test": proj.n_iter_test,
                "tol": proj.tol,
                "refinement": type(proj.refinement).__name__
                if proj.refinement is not None
                else None,
                "equilibrated": proj.equilibrated,
            },
        }
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
            arrays[f"{kind}:primal_residual"] = np.asarray(
                sol.primal_residual, np.float64
            )
            for outcome in ("successful", "max_steps_reached", "infeasible"):
                flag = sol.result == getattr(pe.RESULTS, outcome)
                arrays[f"{kind}:{outcome}"] = np.asarray(flag)
        reference = None
        made = make_reference(data)
        if made is not None:
            reference, entry["reference_settings"] = made
        if reference is not None:
            for kind in KINDS:
                R = jnp.asarray(data.raw(kind), dtype)
                Y = reference(R, P["b"])
                arrays[f"{kind}:reference_y"] = np.asarray(Y, np.float64)
        if timing:
            log(f"[{dtype}] {name}: timing")
            entry["timing"] = _time(
                case, data, proj, make_projector, reference, dtype, scale
            )
        np.savez(folder / f"{name}.{dtype}.npz", **arrays)
        (folder / f"{name}.{dtype}.json").write_text(json.dumps(entry))
        log(f"[{dtype}] {name}: done")


def _time(case, data, proj, make_projector, reference, dtype, scale=1.0) -> dict:
    """Batch and single-instance latency of the jitted forward pass, interleaved
    with the reference's and, where asked, with `refine=False`'s and (polyhedral
    sets) `polish=False`'s."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from ._common.timing import time_interleaved, timing_batch

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


def _run_worker(dtype, folder, names, timing: bool, scale: float) -> int:
    """One worker process for `dtype` (so that x64 is set before JAX starts)."""
    cmd = [sys.executable, "-m", "benchmarks.feasibility", "--worker", dtype]
    cmd += ["--folder", str(folder), "--cases", *names, "--repeat-scale", str(scale)]
    if not timing:
        cmd.append("--no-timing")
    env = {**os.environ, "JAX_ENABLE_X64": "1" if dtype == "float64" else "0"}
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


# ------------------------------------------------------------ the record


def _measure(data: CaseData, floor: dict, arrays: dict, dtype: str) -> dict:
    """The measured CVs, flags and iteration counts of one dtype's outputs."""
    target = F32_REL_TARGET * max(1.0, data.data_norm())
    if dtype == "float64":
        target = F64_TARGET
    rows = np.asarray(floor["rows"])
    out = {"target": target}
    for kind in KINDS:
        cv = data.violation(arrays[f"{kind}:y"])
        ok = arrays[f"{kind}:successful"]
        entry = {
            "cv_max": float(cv.max()),
            "cv_median": float(np.median(cv)),
            "cv_max_floor_rows": float(cv[rows].max()),
            "over_target": int((cv > target).sum()),
            "successful": float(ok.mean()),
            "max_steps_reached": float(arrays[f"{kind}:max_steps_reached"].mean()),
            "infeasible": float(arrays[f"{kind}:infeasible"].mean()),
            # The flag against the measured CV.
            "successful_but_over_target": int((ok & (cv > target)).sum()),
            "not_successful_but_within_target": int((~ok & (cv <= target)).sum()),
            "reported_primal_residual_max": float(
                arrays[f"{kind}:primal_residual"].max()
            ),
            "n_iter_max": int(arrays[f"{kind}:n_iter"].max()),
        }
        if dtype == "float32":
            f = floor[kind]["floor"]
            entry["ratio_to_floor"] = entry["cv_max_floor_rows"] / f if f > 0 else None
            entry["met"] = bool(
                entry["cv_max"] <= target
                and entry["cv_max_floor_rows"] <= FLOOR_FACTOR * f
            )
        else:
            entry["met"] = bool(entry["cv_max"] <= target)
        if f"{kind}:reference_y" in arrays:
            entry["reference_cv_max"] = float(
                data.violation(arrays[f"{kind}:reference_y"]).max()
            )
        out[kind] = entry
    out["met"] = all(out[kind]["met"] for kind in KINDS)
    return out


def _e(x) -> str:
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.1e}"


def _ms(stats: dict | None) -> str:
    if stats is None:
        return "–"
    m = {k: 1e3 * stats[k] for k in ("median", "lq", "uq")}
    digits = 2 if m["median"] < 10 else 0
    return f"{m['median']:.{digits}f} [{m['lq']:.{digits}f}, {m['uq']:.{digits}f}]"


def _accuracy_row(name: str, c: dict) -> str:
    r32, r64, floor = c.get("float32"), c.get("float64"), c["floor"]

    def f32(kind):
        if r32 is None:
            return "–"
        k = r32[kind]
        ratio = k.get("ratio_to_floor")
        ratio = "–" if ratio is None else f"{ratio:.3g}"
        over = f", {k['over_target']} over" if k["over_target"] else ""
        return f"{_e(k['cv_max'])} / {_e(floor[kind]['floor'])} ({ratio}{over})"

    def f64(kind):
        if r64 is None:
            return "–"
        k = r64[kind]
        over = f" ({k['over_target']} over)" if k["over_target"] else ""
        return f"{_e(k['cv_max'])}{over}"

    def met(r):
        return "–" if r is None else ("yes" if r["met"] else "**no**")

    def share(r):
        if r is None:
            return "–"
        return f"{r['near']['successful']:.0%} / {r['far']['successful']:.0%}"

    return (
        f"| {name} | {c['n']} ({len(floor['rows'])}) | {c['data_norm']:.3g} "
        f"| {_e(c['f32_target'])} | {f32('near')} | {f32('far')} | {met(r32)} "
        f"| {f64('near')} / {f64('far')} | {met(r64)} | {share(r32)} "
        f"| {share(r64)} |"
    )


def _latency_row(name: str, c: dict) -> str:
    batch, single = c["timing"]["batch"], c["timing"]["single"]
    near = c.get("float32", {}).get("near", {})
    far = c.get("float32", {}).get("far", {})
    ref_cv = "–"
    if "reference_cv_max" in near:
        ref_cv = f"{_e(near['reference_cv_max'])} / {_e(far['reference_cv_max'])}"
    cells = [
        batch["ours near"],
        batch.get("ours far"),
        batch.get("ours near, polish=False"),
        batch.get("ours near, refine=False"),
        batch.get("reference"),
        single["ours"],
        single.get("ours, as argument"),
        single.get("ours, polish=False"),
        single.get("ours, refine=False"),
        single.get("reference"),
    ]
    return f"| {name} | " + " | ".join(_ms(x) for x in cells) + f" | {ref_cv} |"


def markdown(record: dict) -> str:
    """The record's tables: accuracy and flags, then latency."""
    m = record["machine"]
    lines = [
        f"Command: `{record['command']}`. Machine: {describe(m)}; date "
        f"{m['date']}, load average {m['load_avg'][0]:.1f} at the start.",
        "",
        "Max CV of the outputs (float64 arithmetic on the float64 data). Float32: "
        "CV / float32 rounding floor of the exact projection (ratio: the max CV "
        "over the floor's instances divided by the floor; 'over': instances above "
        f"the target); target ≤ {F32_REL_TARGET:g}·max(1, ‖data‖∞) and ≤ "
        f"{FLOOR_FACTOR}× floor. Float64 target ≤ {F64_TARGET:g}. `successful`: "
        "share of instances whose `ProjectionSolution.result` is "
        "`RESULTS.successful`.",
        "",
        "| Case | n (floor) | ‖data‖∞ | f32 target | f32 near | f32 far | f32 met "
        "| f64 near / far | f64 met | `successful` f32 near / far "
        "| f64 near / far |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_accuracy_row(name, c) for name, c in record["cases"].items()]
    timed = {n: c for n, c in record["cases"].items() if c.get("timing")}
    if timed:
        lines += [
            "",
            "Latency of the jitted forward pass, float32, median [quartiles] in ms, "
            "all calls of a row interleaved: the library defaults on the near and "
            "far batches, the defaults but `polish=False` (what the polish costs, "
            "polyhedral sets) and `refine=False` (what the refinement and polish "
            "cost), and the reference (`pinet-hcnn` at the paper's configuration) "
            "where there is one, with its max CV on the same raw outputs. Each "
            "layer is jitted as a closure, its arrays constants; 'as argument' is "
            "ours under `eqx.filter_jit` with the projector as an argument, as "
            "Equinox code calls a model.",
            "",
            f"| Case | batch {TIMING_BATCH} near | far | near, polish=False "
            "| near, refine=False | reference | single | single, as argument "
            "| single, polish=False | single, refine=False | single reference "
            "| reference f32 CV near / far |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [_latency_row(name, c) for name, c in timed.items()]
    return "\n".join(lines)


# ------------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", choices=tuple(CASES), default=DEFAULT_CASES)
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=DTYPES)
    p.add_argument(
        "--instances", type=pathlib.Path, help="folder of the DC3 .npz files"
    )
    p.add_argument("--n", type=int, help="instances per case (default: the case's)")
    p.add_argument(
        "--n-floor", type=int, help="instances for the floor (default: the case's)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-timing", action="store_true", help="skip the latency")
    p.add_argument(
        "--repeat-scale",
        type=float,
        default=1.0,
        help="multiply every case's timed repeats (at least 2)",
    )
    p.add_argument(
        "--cache",
        type=pathlib.Path,
        help="folder for the instances and their exact projections: read from it "
        "where an earlier run with the same settings wrote them, written otherwise "
        "(a GPU machine without cvxpy, OSQP or IPOPT can then run every case)",
    )
    p.add_argument(
        "--prepare-only",
        action="store_true",
        help="with --cache: fill it, and stop before the workers",
    )
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="JSON record")
    p.add_argument("--markdown", type=pathlib.Path, help="also write the tables here")
    p.add_argument("--worker", choices=DTYPES, help=argparse.SUPPRESS)
    p.add_argument("--folder", type=pathlib.Path, help=argparse.SUPPRESS)
    return p


def _instances_and_floor(name: str, args) -> tuple[CaseData, dict]:
    """A case's instances and their exact projections: built and solved here,
    or read from `args.cache` where an earlier run with the same case, `--n`,
    `--n-floor`, `--seed` and `--instances` left them (and written there
    otherwise)."""
    case = CASES[name]
    n = args.n or case.n
    n_floor = args.n_floor or case.n_floor or n
    # The folder's name, not its path: a GPU machine reads a copy elsewhere.
    instances = None if args.instances is None else args.instances.name
    key = {"case": name, "n": n, "n_floor": n_floor, "seed": args.seed,
           "instances": instances}  # fmt: skip
    stem = f"{name}-n{n}-floor{n_floor}-seed{args.seed}"
    if args.cache is not None:
        meta = args.cache / f"{stem}.floor.json"
        if meta.exists():
            cached = json.loads(meta.read_text())
            if cached["key"] == key:
                log(f"{name}: instances and exact projections from {args.cache}")
                return CaseData.load(args.cache / f"{stem}.npz"), cached["floor"]
    build, _, _ = case.make()
    log(f"{name}: instances and optima")
    data = build(n, args.seed, args.instances)
    rows = np.arange(min(n_floor, data.n))
    log(f"{name}: exact projections of {len(rows)} instances ({case.exact})")
    # The Clarabel cross-check needs cvxpy, which a GPU machine may lack.
    small = case.exact == "slack" and data.dim <= 100
    check = 4 if small and importlib.util.find_spec("cvxpy") else 0
    floor = exact_projections(data, rows, case.exact, check)
    if args.cache is not None:
        args.cache.mkdir(parents=True, exist_ok=True)
        data.save(args.cache / f"{stem}.npz")
        meta.write_text(json.dumps({"key": key, "floor": floor}))
    return data, floor


def run(args, argv=None) -> dict:
    """Build the instances and their floors, run one worker per dtype, and
    return the record."""
    record = {
        "command": command_line(PROG, argv),
        "machine": machine(),
        "protocol": {
            "projector": "pe.Projector(constraints), eqx.nn.inference_mode",
            "near": f"optimum + {NEAR_SCALE} N(0, I)",
            "far": f"optimum + {FAR_SCALE} N(0, I)",
            "f32_target": f"<= {F32_REL_TARGET} max(1, ||data||_inf) and "
            f"<= {FLOOR_FACTOR} x floor",
            "f64_target": F64_TARGET,
            "seed": args.seed,
            "cache": None if args.cache is None else str(args.cache),
        },
        "cases": {},
    }
    datasets = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        for name in args.cases:
            case = CASES[name]
            start = time.perf_counter()
            data, floor = _instances_and_floor(name, args)
            data.save(folder / f"{name}.npz")
            datasets[name] = data
            record["cases"][name] = {
                "description": case.description,
                "info": data.info,
                "n": data.n,
                "dim": data.dim,
                "data_norm": data.data_norm(),
                "f32_target": F32_REL_TARGET * max(1.0, data.data_norm()),
                "build_s": time.perf_counter() - start,
                "floor": floor,
            }
        for i, dtype in enumerate(args.dtypes):
            timing = not args.no_timing and i == 0 and dtype == "float32"
            code = _run_worker(dtype, folder, args.cases, timing, args.repeat_scale)
            if code:
                log(f"the {dtype} worker failed with code {code}")
            for name in args.cases:
                path = folder / f"{name}.{dtype}.json"
                if not path.exists():
                    continue
                entry = json.loads(path.read_text())
                with np.load(folder / f"{name}.{dtype}.npz") as z:
                    arrays = {k: z[k] for k in z.files}
                c = record["cases"][name]
                c[dtype] = _measure(datasets[name], c["floor"], arrays, dtype)
                c[dtype]["worker"] = {k: v for k, v in entry.items() if k != "timing"}
                if "timing" in entry:
                    c["timing"] = entry["timing"]
    return record


def main(argv=None) -> dict | None:
    args = parser().parse_args(argv)
    if args.worker:
        _worker(
            args.worker, args.folder, args.cases, not args.no_timing, args.repeat_scale
        )
        return None
    if args.prepare_only:
        if args.cache is None:
            parser().error("--prepare-only needs --cache DIR")
        for name in args.cases:
            _instances_and_floor(name, args)
        log(f"Instances and exact projections are in {args.cache}.")
        return None
    record = run(args, argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    table = markdown(record)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    print(table)
    log(f"Wrote {args.out}.")
    return record


if __name__ == "__main__":
    main()
