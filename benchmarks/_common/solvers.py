"""The plumbing of the solver baselines, which solve one instance at a time (their
"training" is the set-up), and Clarabel's solve."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from .config import SolverConfig
from .harness import Run, Trained
from .timing import InferenceTiming


def clarabel(problem, tol: float, quiet: bool = False, **settings) -> str:
    """Solves the cvxpy `problem` with Clarabel at tolerances `tol`; `quiet`
    silences cvxpy's "inaccurate" warning. Returns the problem's status."""
    import cvxpy as cp

    tols = dict(tol_gap_abs=tol, tol_gap_rel=tol, tol_feas=tol)
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore", UserWarning)
        problem.solve(solver=cp.CLARABEL, **tols, **settings)
    return problem.status


class SolverStats:
    """Running per-instance solver statistics, written into `info`."""

    def __init__(self, info: dict):
        self.info, self.statuses = info, {}
        self.n, self.iterations, self.seconds, self.failures = 0, 0, 0.0, 0

    def add(self, iterations: int, seconds: float, status: str, ok: bool) -> None:
        """Count one solve: its iterations, seconds, status and success."""
        self.n += 1
        self.iterations += iterations
        self.seconds += seconds
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.failures += not ok
        self.info.update(
            instances_solved=self.n,
            iterations_mean=self.iterations / self.n,
            solve_s_mean=self.seconds / self.n,
            statuses=dict(self.statuses),
            failures=self.failures,
        )


def fit_solver(
    make_solve: Callable, config: SolverConfig, run: Run, info: dict, n_var: int
) -> Trained:
    """Set a solver up (`make_solve(stats) -> solve(x, warm_start=True)`) and
    return its predictors: `predict` warm-starts each row from the previous,
    `predict_single` solves cold (not from its own solution)."""
    run.set_total(1)
    info["config"] = config.as_dict()
    solve = make_solve(SolverStats(info))
    run.step()

    def predict(X):
        X = np.asarray(X, np.float64)
        return np.stack([solve(x) for x in X]) if len(X) else np.zeros((0, n_var))

    def predict_single(x):
        return solve(np.asarray(x, np.float64), warm_start=False)

    # Solving 1024 contexts many times is slow: a few repeats, on as many rows as
    # the config says, scaled to the batch.
    rows = (config.timing_batch_rows, config.timing_budget_s)
    timing = InferenceTiming(config.timing_repeats, 1, *rows)
    return Trained(predict, predict_single, info, timing=timing)
