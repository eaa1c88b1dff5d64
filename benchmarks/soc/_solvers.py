r"""The solver baselines: SCS through CVXPY, and SCS called directly.

Both solve one instance at a time in float64 at tolerances `eps` (default 1e-5),
each row of a batch warm-started from the previous, a single instance cold:

- `cvxpy`, as most users would call it: one DPP-parametrised problem, each
    instance setting $b$, $c$ and calling `problem.solve(solver=cp.SCS)`;
- `scs`, as an expert would: the cone program in SCS's form, set up (and
    factorised) once, each instance calling `solver.update(b=..., c=...)`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import numpy as np

from .._common.config import SolverConfig
from .._common.harness import Run, Trained
from .._common.solvers import SolverStats, fit_solver
from ._data import SocData


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(SolverConfig):
    """SCS's tolerances `eps_abs = eps_rel = eps`, and how to time and score it."""

    eps: float = 1e-5


def _cvxpy_solver(data: SocData, config: Config, stats: SolverStats):
    import cvxpy as cp

    d1, d2 = data.d1, data.d2
    y1, y2 = cp.Variable(d1), cp.Variable(d2)
    b, c = cp.Parameter(d2), cp.Parameter(d1)
    problem = cp.Problem(
        cp.Minimize(c @ y1), [data.A @ y1 + y2 == b, cp.SOC(y2[-1], y2[:-1])]
    )
    assert problem.is_dpp()
    settings = {"eps_abs": config.eps, "eps_rel": config.eps}

    def solve(x, warm_start=True):
        start = time.perf_counter()
        b.value, c.value = x[:d2], x[d2:]
        try:
            problem.solve(solver=cp.SCS, warm_start=warm_start, **settings)
            status = problem.status
        except cp.error.SolverError:
            status = "solver_error"
        ok = status == "optimal"
        iters = (problem.solver_stats.num_iters or 0) if ok else 0
        stats.add(iters, time.perf_counter() - start, status, ok)
        if y1.value is None:
            return np.full(d1 + d2, np.nan)
        return np.concatenate([y1.value, y2.value])

    return solve


def scs_data(A: np.ndarray):
    """SCS's `(A, cone)` for the problem with matrix `A` (b and c set per solve)."""
    import scipy.sparse as sp

    d2, d1 = A.shape
    # y2 reordered as (t, u) = (y2[-1], y2[:-1]), SCS's second-order-cone order.
    order = np.r_[d2 - 1, 0 : d2 - 1]
    cone_rows = -sp.eye(d2, format="csc")[order]
    M = sp.vstack(
        [
            sp.hstack([sp.csc_matrix(A), sp.eye(d2)]),
            sp.hstack([sp.csc_matrix((d2, d1)), cone_rows]),
        ],
        format="csc",
    )
    return M, {"z": d2, "q": [d2]}


def _scs_solver(data: SocData, config: Config, stats: SolverStats):
    import scs

    d1, d2 = data.d1, data.d2
    M, cone = scs_data(data.A)
    b_full, c_full = np.zeros(2 * d2), np.zeros(d1 + d2)
    solver = scs.SCS(
        {"A": M, "b": b_full, "c": c_full},
        cone,
        eps_abs=config.eps,
        eps_rel=config.eps,
        verbose=False,
    )

    def solve(x, warm_start=True):
        start = time.perf_counter()
        b_full[:d2] = x[:d2]
        c_full[:d1] = x[d2:]
        solver.update(b=b_full, c=c_full)
        sol = solver.solve(warm_start=warm_start)
        status = sol["info"]["status"]
        ok = status == "solved"
        stats.add(sol["info"]["iter"], time.perf_counter() - start, status, ok)
        return np.asarray(sol["x"], np.float64)

    return solve


@dataclasses.dataclass(frozen=True)
class _Method:
    """One solver baseline as a method; on the large size only the first
    `large_test_rows` test instances are scored (`None`: all)."""

    description: str
    make_solver: Callable
    large_test_rows: int | None

    def default_config(self, data: SocData) -> Config:
        return Config(test_rows=None if data.d1 < 500 else self.large_test_rows)

    def fit(self, data: SocData, config: Config, seed: int, run: Run) -> Trained:
        """Set the solver up and return its predictors (`fit_solver`)."""
        del seed  # deterministic
        # SCS computes in float64, whatever JAX's setting.
        info = {"solver": self.description, "precision": 64}
        make_solve = functools.partial(self.make_solver, data, config)
        return fit_solver(make_solve, config, run, info, data.d1 + data.d2)


# A large CVXPY solve takes about a second here: score the first 256 instances.
CVXPY = _Method("SCS through CVXPY (DPP parameters b, c)", _cvxpy_solver, 256)
SCS = _Method("SCS directly (one factorisation, update(b, c))", _scs_solver, None)
