r"""IPOPT, the reference solver of the non-convex DC3 problem (the convex one's is
`pinet_eqx.problems.solve_dc3_convex`, OSQP).

IPOPT (through casadi) solves $\min_y \tfrac12 y^\top Q y + p^\top \sin y$ s.t.
$A y = x$, $G y \le h$ with the exact Hessian from $A^+ x$, the NLP built once
with $x$ as its parameter, in one of two equivalent formulations: `"full"` (the
problem as written) or `"slack"`, where $K = [A; G]$ is square and invertible (as
in every DC3 problem): the variables are $w = G y$, $y = K^{-1} [x; w]$, the
inequalities become the bounds $w \le h$ and the dense Hessian $B^\top D B$
($B = K^{-1}[0; I]$, $D = \mathrm{diag}(q - p \odot \sin y)$) comes from a casadi
callback; much faster on the large problem. `"auto"` takes `"slack"` where it
applies.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import scipy.linalg

from pinet_eqx.problems import DC3Problem

# Per large (1000/500/500) instance on a 2-core CPU, "full" took about 8 s and
# "slack" about 0.6 s (30 and 12 ms on the small problem).
FORMULATIONS = ("auto", "full", "slack")
_CASADI_MISSING = (
    "The non-convex DC3 solver needs the optional dependency `casadi` (it ships "
    'IPOPT). Install it with `pip install "pinet_eqx[bench]"` or `pip install '
    "casadi`."
)
# Largest condition number of K = [A; G] for which the "slack" change of variables
# is trusted; the DC3 problems have 5e5 (large), 1.5e3 (small) and 50 (tiny).
_SLACK_MAX_COND = 1e10


def _import_casadi():
    try:
        import casadi
    except ImportError as e:
        raise ImportError(_CASADI_MISSING) from e
    return casadi


def _hessian_callback(casadi, B: np.ndarray, C: np.ndarray, q, p):
    """A casadi `Function` for the upper triangle of the Lagrangian's Hessian in
    the slack variables, $\\sigma B^\\top \\mathrm{diag}(q - p \\odot \\sin y) B$."""
    # Measured on a 2-core CPU: casadi's own Hessian took 4.8 s per large solve,
    # ten times this callback's.
    from scipy.linalg.blas import dsyrk

    k, m = B.shape[1], C.shape[1]
    # casadi stores the upper triangle column by column, which is the lower
    # triangle row by row: a boolean mask over the transposed product.
    lower = np.tril(np.ones((k, k), dtype=bool))

    class _Hessian(casadi.Callback):
        def __init__(self):
            casadi.Callback.__init__(self)
            self.construct("dc3_slack_hessian", {})

        def get_n_in(self):
            return 4

        def get_n_out(self):
            return 1

        def get_name_in(self, i):
            return ("x", "p", "lam_f", "lam_g")[i]

        def get_name_out(self, i):
            return "hess_gamma_x_x"

        def get_sparsity_in(self, i):
            return casadi.Sparsity.dense((k, m, 1, 0)[i], 1)

        def get_sparsity_out(self, i):
            return casadi.Sparsity.upper(k)

        def has_eval_buffer(self):
            # Buffers avoid converting 1e5 Hessian entries to a casadi DM (9 ms).
            return True

        def eval_buffer(self, arg, res):
            w = np.frombuffer(arg[0], dtype=np.float64)
            x = np.frombuffer(arg[1], dtype=np.float64)
            sigma = np.frombuffer(arg[2], dtype=np.float64)[0]
            out = np.frombuffer(res[0], dtype=np.float64)
            d = sigma * (q - p * np.sin(B @ w + C @ x))
            # B^T D B as syrk(positive rows) - syrk(negative rows): half the flops
            # of a general product, and exactly symmetric.
            # (Transposed rows are Fortran-ordered: BLAS reads them without a copy.)
            pos, neg = d > 0, d <= 0
            H = dsyrk(1.0, (B[pos] * np.sqrt(d[pos])[:, None]).T)
            rows = (B[neg] * np.sqrt(-d[neg])[:, None]).T
            H = dsyrk(-1.0, rows, beta=1.0, c=H, overwrite_c=1)
            out[:] = H.T[lower]
            return 0

    return _Hessian()


def pick_formulation(problem: DC3Problem, formulation: str = "auto") -> str:
    """The formulation `NonconvexIpopt` uses: `"auto"` resolved, the others checked."""
    if formulation not in FORMULATIONS:
        raise ValueError(
            f"`formulation` must be one of {FORMULATIONS}, got {formulation!r}."
        )
    if formulation == "full":
        return formulation
    P = problem
    square = P.n_ineq == P.n_var - P.n_eq
    if square and np.linalg.cond(np.concatenate([P.A, P.G])) < _SLACK_MAX_COND:
        return "slack"
    if formulation == "slack":
        raise ValueError(
            f"The 'slack' formulation needs n_ineq = n_var - n_eq and an "
            f"invertible [A; G]; got n_var={P.n_var}, n_eq={P.n_eq}, "
            f"n_ineq={P.n_ineq}. Use formulation='full'."
        )
    return "full"


@dataclasses.dataclass
class IpoptResult:
    r"""One IPOPT solve: `y`, the multipliers with
    $\nabla J(y) + A^\top \lambda + G^\top \mu = 0$ at a KKT point, IPOPT's
    status and the `kkt` residuals (`kkt_residuals`)."""

    y: np.ndarray
    lam_eq: np.ndarray
    lam_ineq: np.ndarray
    success: bool
    status: str
    iterations: int
    seconds: float
    kkt: dict


class NonconvexIpopt:
    """IPOPT for the non-convex DC3 problem (see the module docstring); `tol`
    `None` keeps IPOPT's 1e-8; `exact_bounds` satisfies $G y \\le h$ to rounding
    (IPOPT otherwise relaxes bounds by 1e-8)."""

    def __init__(
        self,
        problem: DC3Problem,
        *,
        tol: float | None = 1e-10,
        formulation: str = "auto",
        exact_bounds: bool = True,
        ipopt_options: dict | None = None,
    ):
        self.formulation = pick_formulation(problem, formulation)
        casadi = _import_casadi()
        self.problem = problem
        P = problem
        self._q = np.ascontiguousarray(np.diag(P.Q))
        self._pinv = np.linalg.pinv(P.A)
        options = {"print_level": 0, "sb": "yes"}
        if tol is not None:
            options["tol"] = tol
        if tol is not None and self.formulation == "slack":
            # In the slack variables IPOPT measures dual infeasibility as
            # B^T grad J + mu, whose rounding floor is about 1e-9 on the large
            # problem (cond K ~ 5e5): with tol 1e-10 it stalls there, and ends
            # "acceptable" only after 15 further iterations. Accept after two
            # iterations at 1e-8 instead, but with complementarity at `tol`; the
            # KKT residuals in y (see `kkt_residuals`) then stay below 1e-9 and
            # the points agree with the "full" formulation to 4e-8 (measured).
            options.update(
                acceptable_tol=max(1e-8, tol),
                acceptable_iter=2,
                acceptable_compl_inf_tol=tol,
            )
        if exact_bounds:
            options["bound_relax_factor"] = 0.0
        options.update(ipopt_options or {})
        self.options = options
        opts = {"print_time": False, "ipopt": options}
        if self.formulation == "full":
            self._build_full(casadi, opts)
        else:
            self._build_slack(casadi, opts, np.concatenate([P.A, P.G], axis=0))

    def _objective(self, casadi, y):
        q, p = casadi.DM(self._q), casadi.DM(self.problem.p)
        return 0.5 * casadi.dot(q, y * y) + casadi.dot(p, casadi.sin(y))

    def _build_full(self, casadi, opts):
        P = self.problem
        # MX with the matrices as constants: one matrix-vector node each, where SX
        # would expand every product into scalar expressions.
        y = casadi.MX.sym("y", P.n_var)
        x = casadi.MX.sym("x", P.n_eq)
        g = casadi.vertcat(
            casadi.mtimes(casadi.DM(P.A), y) - x, casadi.mtimes(casadi.DM(P.G), y)
        )
        nlp = {"x": y, "p": x, "f": self._objective(casadi, y), "g": g}
        self._solver = casadi.nlpsol("dc3_ipopt_full", "ipopt", nlp, opts)
        self._bounds = {
            "lbg": np.concatenate([np.zeros(P.n_eq), np.full(P.n_ineq, -np.inf)]),
            "ubg": np.concatenate([np.zeros(P.n_eq), P.h]),
        }

    def _build_slack(self, casadi, opts, K):
        P = self.problem
        self._lu = scipy.linalg.lu_factor(K)
        inverse = scipy.linalg.lu_solve(self._lu, np.eye(P.n_var))
        C = np.ascontiguousarray(inverse[:, : P.n_eq])  # y = B w + C x
        B = np.ascontiguousarray(inverse[:, P.n_eq :])
        w = casadi.MX.sym("w", P.n_ineq)
        x = casadi.MX.sym("x", P.n_eq)
        y = casadi.mtimes(casadi.DM(B), w) + casadi.mtimes(casadi.DM(C), x)
        # The callback must outlive the solver, which only holds a reference.
        self._hessian = _hessian_callback(casadi, B, C, self._q, P.p)
        nlp = {"x": w, "p": x, "f": self._objective(casadi, y)}
        opts = {**opts, "hess_lag": self._hessian}
        self._solver = casadi.nlpsol("dc3_ipopt_slack", "ipopt", nlp, opts)
        self._bounds = {"lbx": -np.inf, "ubx": P.h}

    def gradient(self, y: np.ndarray) -> np.ndarray:
        """The objective's gradient $Q y + p \\odot \\cos y$."""
        return self._q * y + self.problem.p * np.cos(y)

    def solve(self, x: np.ndarray, y0: np.ndarray | None = None) -> IpoptResult:
        """Solve for context `x` from `y0` (default $A^+ x$); see `IpoptResult`."""
        P = self.problem
        x = np.asarray(x, dtype=np.float64)
        y0 = self._pinv @ x if y0 is None else np.asarray(y0, dtype=np.float64)
        start = time.perf_counter()
        x0 = y0 if self.formulation == "full" else P.G @ y0
        out = self._solver(x0=x0, p=x, **self._bounds)
        seconds = time.perf_counter() - start
        stats = self._solver.stats()
        if self.formulation == "full":
            y = np.asarray(out["x"]).ravel()
            lam = np.asarray(out["lam_g"]).ravel()
            lam_eq, lam_ineq = lam[: P.n_eq], lam[P.n_eq :]
        else:
            w = np.asarray(out["x"]).ravel()
            # A backward-stable solve of [A; G] y = [x; w], rather than B w + C x,
            # keeps A y - x at rounding level whatever the conditioning of K.
            y = scipy.linalg.lu_solve(self._lu, np.concatenate([x, w]))
            lam_ineq = np.asarray(out["lam_x"]).ravel()
            lam_eq = -self._pinv.T @ (self.gradient(y) + P.G.T @ lam_ineq)
        status = (bool(stats["success"]), str(stats["return_status"]))
        kkt = kkt_residuals(P, y, x, lam_eq, lam_ineq)
        return IpoptResult(
            y, lam_eq, lam_ineq, *status, int(stats["iter_count"]), seconds, kkt
        )


def kkt_residuals(problem: DC3Problem, y, x, lam_eq, lam_ineq) -> dict:
    r"""The KKT residuals of one point in the $\infty$-norm: `stationarity`
    $\|\nabla J(y) + A^\top \lambda + G^\top \mu\|$, `primal`, `dual`
    $\|\max(-\mu, 0)\|$ and `complementarity` $\|\mu \odot (G y - h)\|$."""
    P = problem
    y, x = np.asarray(y, np.float64), np.asarray(x, np.float64)
    grad = np.diag(P.Q) * y + P.p * np.cos(y)
    slack = P.G @ y - P.h
    return {
        "stationarity": float(np.abs(grad + P.A.T @ lam_eq + P.G.T @ lam_ineq).max()),
        "primal": float(
            max(np.abs(P.A @ y - x).max(), np.maximum(slack, 0.0).max(initial=0.0))
        ),
        "dual": float(np.maximum(-lam_ineq, 0.0).max(initial=0.0)),
        "complementarity": float(np.abs(lam_ineq * slack).max(initial=0.0)),
    }


def _solved(result: IpoptResult, kkt_tol: float) -> bool:
    return result.success and result.kkt["stationarity"] <= kkt_tol


def solve_nonconvex(
    problem: DC3Problem,
    X: np.ndarray,
    *,
    tol: float = 1e-10,
    progress: bool = True,
    formulation: str = "auto",
    ipopt_options: dict | None = None,
    kkt_tol: float = 1e-6,
) -> np.ndarray:
    """Local optima of the non-convex problem for each row of `X` by IPOPT. A
    solve counts if IPOPT succeeds with stationarity at most `kkt_tol`; a context
    `"slack"` misses is solved again with `"full"`; else `RuntimeError`."""
    from tqdm.auto import tqdm

    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != problem.n_eq:
        raise ValueError(
            f"`solve_nonconvex` got `X` with shape {X.shape}, but expected shape "
            f"(n, {problem.n_eq}): one context per row."
        )
    _import_casadi()
    kwargs = {"tol": tol, "formulation": formulation, "ipopt_options": ipopt_options}
    Y = np.empty((len(X), problem.n_var))
    iterations, statuses, stationarity = [], {}, 0.0
    retried: list[int] = []
    start = time.perf_counter()
    solver, full_solver = NonconvexIpopt(problem, **kwargs), None
    for i, x in enumerate(tqdm(X, desc="IPOPT", unit="ctx", disable=not progress)):
        result = solver.solve(x)
        if not _solved(result, kkt_tol) and solver.formulation != "full":
            full = {**kwargs, "formulation": "full"}
            full_solver = full_solver or NonconvexIpopt(problem, **full)
            retried.append(i)
            result = full_solver.solve(x)
        if not _solved(result, kkt_tol):
            raise RuntimeError(
                f"IPOPT stopped with status '{result.status}' and KKT stationarity "
                f"{result.kkt['stationarity']:.1e} on context {i} (row {i} of `X`) "
                "in `solve_nonconvex`. Try a larger `tol`."
            )
        Y[i] = result.y
        iterations.append(result.iterations)
        statuses[result.status] = statuses.get(result.status, 0) + 1
        stationarity = max(stationarity, result.kkt["stationarity"])
    if progress and len(X):
        again = f", re-solved with the full formulation: {retried}" if retried else ""
        print(
            f"IPOPT ({solver.formulation} formulation, tol {tol:g}): {len(X)} "
            f"contexts in {time.perf_counter() - start:.1f} s, "
            f"{np.mean(iterations):.1f} iterations on average, statuses {statuses}, "
            f"KKT stationarity <= {stationarity:.1e}{again}"
        )
    return Y
