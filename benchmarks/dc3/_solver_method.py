"""The `solver` baseline: a classical solver, one context at a time, no training.

Convex: OSQP (tolerances `eps`, no polishing), either `"normal"` (the paper's
"Solver": a fresh setup and cold solve per context) or `"parametric"` ("Solver†":
one setup, each context updating the bounds, warm-started). Non-convex: IPOPT
(`_solvers.NonconvexIpopt`) at its default tolerance 1e-8, from $A^+ x$.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Literal

import numpy as np

from .._common.config import SolverConfig
from .._common.harness import Run, Trained
from .._common.solvers import SolverStats, fit_solver
from ._data import Dataset
from ._solvers import NonconvexIpopt

MODES = ("normal", "parametric")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OsqpConfig(SolverConfig):
    """OSQP's `mode` and tolerances `eps_abs = eps_rel = eps`."""

    mode: Literal["normal", "parametric"] = "normal"
    eps: float = 1e-5


@dataclasses.dataclass(frozen=True, kw_only=True)
class IpoptConfig(SolverConfig):
    """IPOPT's tolerance and formulation (`_solvers.NonconvexIpopt`)."""

    tol: float = 1e-8
    formulation: Literal["auto", "full", "slack"] = "auto"


def default_config(data: Dataset) -> OsqpConfig | IpoptConfig:
    """The solver's settings and how to time and score it on `data`."""
    # A large instance takes 0.5-3.5 s: the test metrics use the first 128.
    test_rows = 128 if data.problem.n_var >= 1000 else None
    if data.nonconvex:
        return IpoptConfig(test_rows=test_rows)
    return OsqpConfig(test_rows=test_rows)


def _osqp_solver(data: Dataset, config: OsqpConfig):
    """`make_solve(stats)` for OSQP (`benchmarks._common.solvers.fit_solver`)."""
    import scipy.sparse as sp

    P = data.problem
    n_eq = P.n_eq
    Q = sp.csc_matrix(np.triu(P.Q))
    C = sp.csc_matrix(np.concatenate([P.A, P.G], axis=0))
    lower = np.concatenate([np.zeros(n_eq), np.full(P.n_ineq, -np.inf)])
    upper = np.concatenate([np.zeros(n_eq), P.h])
    settings = dict(
        eps_abs=config.eps, eps_rel=config.eps, polishing=False, verbose=False
    )

    def setup(x):
        import osqp

        lower[:n_eq] = x
        upper[:n_eq] = x
        qp = osqp.OSQP()
        qp.setup(Q, P.p, C, lower, upper, **settings)
        return qp

    def make_solve(stats: SolverStats):
        parametric = setup(np.zeros(n_eq)) if config.mode == "parametric" else None
        # The start is OSQP's own (a warm start in parametric mode), whatever
        # `warm_start` says: as the paper's "Solver" and "Solver†" ran.
        return lambda x, warm_start=True: solve(x, parametric, stats)

    def solve(x, parametric, stats):
        start = time.perf_counter()
        if parametric is None:
            qp = setup(x)  # normal mode: setup and factorisation every time
        else:
            qp = parametric
            lower[:n_eq] = x
            upper[:n_eq] = x
            qp.update(l=lower, u=upper)
        # A failed solve is returned and counted, not raised: the metrics show it.
        result = qp.solve(raise_error=False)
        status = result.info.status
        ok = status == "solved"
        stats.add(result.info.iter, time.perf_counter() - start, status, ok)
        return result.x if result.x is not None else np.full(P.n_var, np.nan)

    return make_solve


def _ipopt_solver(data: Dataset, config: IpoptConfig, info: dict):
    """`make_solve(stats)` for IPOPT; each solve starts from $A^+ x$."""

    def make_solve(stats: SolverStats):
        solver = NonconvexIpopt(
            data.problem,
            tol=config.tol,
            formulation=config.formulation,
            exact_bounds=False,  # IPOPT's default bound relaxation
        )
        info["formulation"] = solver.formulation

        def solve(x, warm_start=True):
            result = solver.solve(x)
            stats.add(result.iterations, result.seconds, result.status, result.success)
            return result.y

        return solve

    return make_solve


def fit(data: Dataset, config, seed: int, run: Run) -> Trained:
    """Build the solver (the "training" time) and return its predictors."""
    del seed  # deterministic
    if data.nonconvex:
        info = {"solver": "ipopt (casadi)"}
        make_solve = _ipopt_solver(data, config, info)
    else:
        info = {"solver": "osqp", "mode": config.mode}
        make_solve = _osqp_solver(data, config)
    return fit_solver(make_solve, config, run, info, data.problem.n_var)
