r"""The solvers a proxy is measured against: Clarabel and HiGHS, one hour at a time.

Each solves the DC-OPF of a test hour, single-threaded, at its default
tolerances and at 1e-8 (Clarabel: its gap and feasibility tolerances; HiGHS:
its primal and dual feasibility tolerances, its QP solver's own test being on
those). Only the solve is timed (`solve()`, `run()`), not building the model,
as in `_data`. Each answer's cost is compared with the cached Clarabel optimum
at 1e-8 (`_proxy_data`), so the record also says how exact each setting is.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from .._common import provenance, timing
from ._data import clarabel_solver, dcopf_objective
from ._fixture import GridCase
from ._proxy_data import HourlyData

SETTINGS = {"default": None, "1e-08": 1e-8}  # by their names in the record


def clarabel_dcopf(case: GridCase, p_d: np.ndarray, tol=None):
    """`(p_g, seconds)`: Clarabel's DC-OPF of the loads `p_d`, with its default
    settings (`tol=None`) or gap and feasibility tolerances `tol`; one thread."""
    import clarabel

    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.max_threads = 1
    if tol is not None:
        settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = tol
    solver = clarabel_solver(case, *dcopf_objective(case), p_d, settings)
    start = time.perf_counter()
    solution = solver.solve()
    seconds = time.perf_counter() - start
    if solution.status != clarabel.SolverStatus.Solved:
        raise RuntimeError(f"Clarabel: {solution.status}")
    return np.asarray(solution.x)[: case.n_gen], seconds


def highs_dcopf(case: GridCase, p_d: np.ndarray, tol=None):
    """`(p_g, seconds)`: HiGHS's DC-OPF (a QP) of the loads `p_d`, one thread,
    at its default tolerances (`tol=None`) or primal and dual feasibility
    tolerances `tol`."""
    import highspy

    q = case.q(p_d)
    A = sp.vstack([case.E, case.C], format="csc")
    lower = np.concatenate([q, case.flow_lower])
    upper = np.concatenate([q, case.flow_upper])
    P, c = dcopf_objective(case)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = case.dim, A.shape[0]
    lp.col_cost_ = c
    lp.col_lower_, lp.col_upper_ = case.lower, case.upper
    lp.row_lower_, lp.row_upper_ = lower, upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_ = A.indptr, A.indices
    lp.a_matrix_.value_ = A.data
    hessian = sp.triu(P, format="csc")
    hessian.eliminate_zeros()
    model = highspy.HighsModel()
    model.lp_ = lp
    model.hessian_.dim_ = case.dim
    model.hessian_.format_ = highspy.HessianFormat.kTriangular
    model.hessian_.start_ = hessian.indptr
    model.hessian_.index_ = hessian.indices
    model.hessian_.value_ = hessian.data
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    if tol is not None:
        h.setOptionValue("primal_feasibility_tolerance", tol)
        h.setOptionValue("dual_feasibility_tolerance", tol)
    h.passModel(model)
    start = time.perf_counter()
    h.run()
    seconds = time.perf_counter() - start
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"HiGHS: {h.modelStatusToString(status)}")
    return np.asarray(h.getSolution().col_value)[: case.n_gen], seconds


def run(data: HourlyData, *, n_hours: int = 32) -> dict:
    """Times Clarabel and HiGHS on `n_hours` solved test hours (evenly spaced),
    at each of `SETTINGS`; a JSON-able record with, per solver and setting,
    `ms` (`timing.stats` of the solve times), the largest relative cost
    difference to the cached optimum and the number of failed solves, plus
    Clarabel's 1e-8 times over every solved test hour (from the cache)."""
    case = data.case
    solved = data.solved(data.test)
    hours = solved[np.linspace(0, solved.size - 1, n_hours).astype(int)]
    record: dict = dict(
        case=case.name, variant=data.variant, method="solvers", n_bus=case.n_bus
    )
    for name, solve in (("clarabel", clarabel_dcopf), ("highs", highs_dcopf)):
        for setting, tol in SETTINGS.items():
            seconds, gaps, failed = [], [], 0
            for hour in hours:
                try:
                    p, s = solve(case, data.loads[hour], tol)
                except RuntimeError:
                    failed += 1
                    continue
                optimum = data.cost_opt[hour]
                gaps.append((case.cost(p) - optimum) / abs(optimum))
                seconds.append(1e3 * s)
            record[f"{name}_{setting}"] = dict(
                ms=timing.stats(seconds) if seconds else None,
                rel_cost_diff_max=float(np.max(np.abs(gaps))) if gaps else None,
                failed=failed,
                n_hours=int(hours.size),
            )
    record["clarabel_cache_ms"] = timing.stats(1e3 * data.solver_s[solved])
    record["hours"] = dict(test=data.counts(data.test))
    record["machine"] = provenance.machine()
    return record
