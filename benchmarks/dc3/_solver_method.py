r"""The `solver` baseline: a classical solver, one context at a time, no training.

Convex problem: OSQP (Stellato et al., 2020) on
$\min_y \tfrac12 y^\top Q y + p^\top y$ s.t. $A y = x$, $G y \le h$, in one of two
modes (config `"mode"`):

- `"normal"` (the paper's "Solver"): a fresh OSQP setup, factorisation included,
    and a cold solve for every context.
- `"parametric"` (the paper's "Solver†"): one setup during "training"; each
    context only updates the bounds of $A y = x$ and is warm-started from the
    previous solution.

Both use OSQP's defaults except the tolerances `eps_abs = eps_rel = eps` (default
1e-5, OSQP's own default being 1e-3) and no polishing.

Non-convex problem: IPOPT through casadi with its default tolerance (1e-8) and
the exact Hessian, built once with the context as the NLP's parameter and started
from $A^+ x$ (see `benchmarks.dc3._solvers.NonconvexIpopt`; the `"slack"`
formulation by default).

Solving 1024 contexts many times is slow, so the module has its own
`time_inference`, which times the batch a few times, on a subset of the contexts
where the config says so, and scales the times to the full batch.
"""

from __future__ import annotations

import time

import numpy as np

from ._data import Dataset
from ._harness import Run, Trained, time_calls, timing_batch
from ._solvers import NonconvexIpopt

MODES = ("normal", "parametric")


def default_config(data: Dataset) -> dict:
    """The solver's settings and how to time it on `data`.

    Timing solves `timing_batch_rows` contexts of the batch (`None`: as many as
    take about `timing_budget_s` seconds at the average solve time seen so far,
    at least 8) and scales the time to the batch; `timing_repeats` caps the timed
    repeats of the batch. `test_rows` limits the test metrics to the first rows
    of the test set (`None`: all).
    """
    timing = {"timing_batch_rows": None, "timing_budget_s": 20.0, "timing_repeats": 3}
    # A large instance takes 0.5-3.5 s: the test metrics use the first 128.
    timing["test_rows"] = 128 if data.problem.n_var >= 1000 else None
    if data.nonconvex:
        return {"tol": 1e-8, "formulation": "auto", **timing}
    return {"mode": "normal", "eps": 1e-5, **timing}


class _Stats:
    """Running per-instance solver statistics, written into `Trained.info`."""

    def __init__(self, info: dict):
        self.info = info
        self.n = 0
        self.iterations = 0
        self.seconds = 0.0
        self.statuses: dict[str, int] = {}
        self.failures = 0

    def add(self, iterations: int, seconds: float, status: str, ok: bool) -> None:
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


def _osqp_predictors(data: Dataset, config: dict, info: dict):
    import osqp
    import scipy.sparse as sp

    mode = config["mode"]
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
    P = data.problem
    n_eq = P.n_eq
    Q = sp.csc_matrix(np.triu(P.Q))
    C = sp.csc_matrix(np.concatenate([P.A, P.G], axis=0))
    lower = np.concatenate([np.zeros(n_eq), np.full(P.n_ineq, -np.inf)])
    upper = np.concatenate([np.zeros(n_eq), P.h])
    settings = {
        "eps_abs": config["eps"],
        "eps_rel": config["eps"],
        "polishing": False,
        "verbose": False,
    }
    stats = _Stats(info)

    def setup(x):
        lower[:n_eq] = x
        upper[:n_eq] = x
        qp = osqp.OSQP()
        qp.setup(Q, P.p, C, lower, upper, **settings)
        return qp

    parametric = setup(np.zeros(n_eq)) if mode == "parametric" else None

    def solve(x):
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

    return solve


def _ipopt_predictor(data: Dataset, config: dict, info: dict):
    solver = NonconvexIpopt(
        data.problem,
        tol=config["tol"],
        formulation=config["formulation"],
        exact_bounds=False,  # IPOPT's default bound relaxation
    )
    info["formulation"] = solver.formulation
    stats = _Stats(info)

    def solve(x):
        result = solver.solve(x)
        stats.add(result.iterations, result.seconds, result.status, result.success)
        return result.y

    return solve


def fit(data: Dataset, config: dict, seed: int, run: Run) -> Trained:
    """Build the solver (the "training" time) and return its predictors.

    `predict(X)` solves each row of `X` in turn; `predict_single(x)` solves one.
    Both take and return float64 NumPy arrays. `info` holds the mode and running
    statistics: average iterations and seconds per solve, statuses, failures.
    """
    del seed  # deterministic
    run.set_total(1)
    info: dict = {"config": dict(config)}
    if data.nonconvex:
        info["solver"] = "ipopt (casadi)"
        solve = _ipopt_predictor(data, config, info)
    else:
        info["solver"] = "osqp"
        info["mode"] = config["mode"]
        solve = _osqp_predictors(data, config, info)
    run.step()

    n_var = data.problem.n_var

    def predict(X):
        X = np.asarray(X, dtype=np.float64)
        return np.stack([solve(x) for x in X]) if len(X) else np.zeros((0, n_var))

    def predict_single(x):
        return solve(np.asarray(x, dtype=np.float64))

    return Trained(predict=predict, predict_single=predict_single, info=info)


def time_inference(
    trained: Trained,
    data: Dataset,
    repeats: int = 3,
    batch_size: int = 1024,
    single_repeats: int | None = None,
) -> dict:
    """Single-instance and batch inference times, as `_harness.time_inference`.

    The batch is timed `min(repeats, timing_repeats)` times after one warm-up. If
    fewer rows than `batch_size` are solved (see `default_config`), the times are
    scaled by `batch_size / rows` (the solves are independent and sequential),
    and the result records `batch_extrapolated_from: rows`.
    """
    config = trained.info["config"]
    repeats = min(repeats, config["timing_repeats"])
    X = timing_batch(data, batch_size)
    rows = config["timing_batch_rows"]
    if rows is None:
        if "solve_s_mean" not in trained.info:
            trained.predict_single(X[0])
        rows = max(8, int(config["timing_budget_s"] / trained.info["solve_s_mean"]))
    rows = min(rows, batch_size)
    subset = X[:rows]
    batch = time_calls(lambda: trained.predict(subset), repeats, warmup=1)
    if rows < batch_size:
        scale = batch_size / rows
        for key in ("median", "lq", "uq", "min", "max"):
            batch[key] *= scale
    x = data.X_test[0]
    result = {
        "single": time_calls(
            lambda: trained.predict_single(x), single_repeats or 5 * repeats
        ),
        "batch": batch,
        "batch_size": batch_size,
    }
    if rows < batch_size:
        result["batch_extrapolated_from"] = rows
    return result
