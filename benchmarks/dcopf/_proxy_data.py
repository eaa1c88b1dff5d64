r"""The data of the DC-OPF proxies: ACTIVSg hours, their time split, and cached optima.

An `HourlyData` holds one grid in one variant, its hourly loads split by month
(`_activsg.split_by_month`) and Clarabel's verdict on each hour at 1e-8:
solved (with its optimum), infeasible or failed. The variant `"real"` is the
case as MATPOWER ships it: on case_ACTIVSg2000 every unit has a positive
`PMIN` (32.6 GW in all), so the light hours have no feasible dispatch; they are
kept out of training and of the gaps, and counted. `"pmin0"` sets every `PMIN`
to 0 (every hour feasible). A year of hours takes minutes to solve, so the
answers are cached in `OUT/optima/{case}-{variant}.npz`, solved test hours
first, then validation, then training (`fill_cache`: it can stop and resume).

`time_solvers` times Clarabel and HiGHS on test hours one at a time (one
thread, at their default tolerances and at 1e-8; only `solve()`/`run()`).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time

import numpy as np
import scipy.sparse as sp
from tqdm.auto import tqdm

from .._common import provenance, timing
from . import _activsg
from ._fixture import GridCase, load_saved

VARIANTS = ("real", "pmin0")
PARTS = ("train", "val", "test")
SOLVER_TOL = 1e-8
# The grids without a time series (case_ACTIVSg10k, 25k, 70k): this many loads
# from E2ELR's sampler (`_activsg.sample_e2elr`), split 80/10/10 at random. E2ELR
# used 50,000 per grid; the solver's cost per sample on this CPU sets ours.
N_SAMPLES, SAMPLE_SEED = 2000, 0
# `status` codes: not solved yet, infeasible (the solver's certificate), the
# solver stopped without an answer either way, solved.
UNSOLVED, INFEASIBLE, FAILED, SOLVED = -1, 0, 2, 1
STATUSES = dict(solved=SOLVED, infeasible=INFEASIBLE, failed=FAILED, unsolved=UNSOLVED)


@dataclasses.dataclass(frozen=True, eq=False)
class HourlyData:
    """One grid in one `variant`, its per-unit `loads` at `hours`, the `train`,
    `val`, `test` indices, and per hour the solver's `status`, optimum `y_opt`
    (float32) and `cost_opt` (NaN unless solved) and `solver_s`."""

    case: GridCase
    variant: str
    loads: np.ndarray
    hours: np.ndarray
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    status: np.ndarray
    y_opt: np.ndarray
    cost_opt: np.ndarray
    solver_s: np.ndarray

    def solved(self, part: np.ndarray) -> np.ndarray:
        """The hours of `part` that the solver solved (feasible, with an optimum)."""
        return part[self.status[part] == SOLVED]

    def stem(self, method: str, tag: str | None = None) -> str:
        """A run's file name without suffix: `{case}-{variant}-{method}[-{tag}]`."""
        return f"{self.case.name}-{self.variant}-{method}" + (f"-{tag}" if tag else "")

    def counts(self, part: np.ndarray) -> dict:
        """How many hours of `part` are solved, infeasible, failed or unsolved."""
        status = self.status[part]
        out = {name: int(np.sum(status == code)) for name, code in STATUSES.items()}
        return dict(out, hours=int(part.size))


def variant_case(case: GridCase, variant: str) -> GridCase:
    """`case` in the given variant (`"real"`: as it is; `"pmin0"`: `p_min` = 0)."""
    if variant not in VARIANTS:
        raise ValueError(f"`variant` must be one of {VARIANTS}, not {variant!r}.")
    if variant == "real":
        return case
    return dataclasses.replace(case, p_min=np.zeros_like(case.p_min))


def fixture_split(n_hours: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A one-week fixture's split in time: five days, one day, the last day."""
    days = np.arange(n_hours) // 24
    parts = (days < 5, days == 5, days >= 6)
    return tuple(np.flatnonzero(part) for part in parts)  # type: ignore[return-value]


def load_hours(name: str, variant="real", *, fixture=None, saved=None) -> tuple:
    """`(case, loads, hours, (train, val, test))` of an ACTIVSg grid: from a
    `fixture` (`_activsg.save_fixture`, split by `fixture_split`), the hourly
    loads of the `SCENARIO_CASES` (`split_by_month`), or `N_SAMPLES` loads of
    E2ELR's sampler, numbered (`split_indices`). `saved`: the grid as `save`
    wrote it, for a machine without matpower (grids without a time series)."""
    if fixture is not None:
        data, loads, hours = _activsg.load_fixture(fixture)
        return variant_case(data.case, variant), loads, hours, fixture_split(len(hours))
    if saved is not None:
        if name in _activsg.SCENARIO_CASES:
            raise ValueError(
                f"--saved serves the grids without a time series; {name}'s hours "
                "come from MATPOWER's scenario file: drop --saved."
            )
        grid = load_saved(saved)
        if grid.name != name:
            raise ValueError(f"--saved {saved} holds {grid.name}, not {name}.")
    else:
        grid = _activsg.load_activsg(name).case
    case = variant_case(grid, variant)
    if name not in _activsg.SCENARIO_CASES:
        # No time series: E2ELR's sampler, numbered samples, a random split.
        loads = _activsg.sample_e2elr(case, N_SAMPLES, seed=SAMPLE_SEED)
        parts = _activsg.split_indices(N_SAMPLES, SAMPLE_SEED)
        return case, loads, np.arange(N_SAMPLES), parts
    loads, hours = _activsg.hourly_loads(name)
    return case, loads, hours, _activsg.split_by_month(hours)


def _solve_hour(case: GridCase, p_d: np.ndarray):
    """`(status, y, cost, seconds)` of Clarabel's DC-OPF of one hour."""
    from ._data import dcopf_clarabel

    start = time.perf_counter()
    try:
        y, cost, seconds = dcopf_clarabel(case, p_d, tol=SOLVER_TOL)
    except RuntimeError as error:
        # `dcopf_clarabel` raises with Clarabel's status in the message.
        status = INFEASIBLE if "Infeasible" in str(error) else FAILED
        return status, None, np.nan, time.perf_counter() - start
    return SOLVED, y, cost, seconds


def fill_cache(case: GridCase, loads, parts, path, *, budget_s=None, hours=None):
    """`HourlyData`'s `status`, `y_opt`, `cost_opt` and `solver_s`: the hours not
    yet in the cache `path` (`None`: none) solved test first (`parts`), or only
    `hours` if given, saved every 200 hours and at the end, stopping after
    about `budget_s`."""
    n = loads.shape[0]
    arrays = _read_cache(path, n, case.dim)
    order = np.concatenate([parts[2], parts[1], parts[0]]) if hours is None else hours
    todo = order[arrays["status"][order] == UNSOLVED]
    start = time.perf_counter()
    for count, hour in enumerate(tqdm(todo, desc=f"{case.name} optima", unit="h"), 1):
        status, y, cost, seconds = _solve_hour(case, loads[hour])
        arrays["status"][hour], arrays["cost_opt"][hour] = status, cost
        arrays["solver_s"][hour] = seconds
        if y is not None:
            arrays["y_opt"][hour] = y
        if path is not None and count % 200 == 0:
            _write_cache(path, arrays)
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    if path is not None and todo.size:
        _write_cache(path, arrays)
    return arrays


def _read_cache(path: pathlib.Path | None, n: int, dim: int) -> dict:
    """The cache at `path`, or empty arrays for `n` hours of `dim` variables."""
    if path is not None and path.exists():
        with np.load(path) as saved:
            arrays = {key: saved[key].copy() for key in saved.files}
        if arrays["y_opt"].shape == (n, dim):
            return arrays
        raise ValueError(f"{path} holds {arrays['y_opt'].shape}, not {(n, dim)}.")
    y_opt = np.full((n, dim), np.nan, np.float32)
    return dict(
        status=np.full(n, UNSOLVED, np.int8), y_opt=y_opt, cost_opt=np.full(n, np.nan),
        solver_s=np.full(n, np.nan),
    )  # fmt: skip


def _write_cache(path: pathlib.Path, arrays: dict) -> None:
    """Writes `arrays` to `path` through a temporary file (never half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part.npz")
    # Compressed: a cache of the scored hours only (`scored_hours`) is mostly
    # NaN rows, which a large grid's offline machine receives.
    np.savez_compressed(partial, **arrays)
    os.replace(partial, path)


def hourly_data(
    name: str, variant: str = "real", *, out=None, fixture=None, budget_s=None,
    stride: int = 1, saved=None, scored: tuple[int, int | None] | None = None,
) -> HourlyData:  # fmt: skip
    """The hours of `load_hours` with Clarabel's optima cached under `out`
    (`fill_cache`); `stride` keeps every `stride`-th hour (not cached);
    `scored = (n_val, n_test[, n_train])` solves only the hours a run with
    those counts scores and trains on (`scored_hours`: a self-supervised
    proxy needs no training optima)."""
    case, loads, hours, parts = load_hours(name, variant, fixture=fixture, saved=saved)
    if stride > 1:
        kept = np.arange(0, len(hours), stride)
        loads, hours = loads[kept], hours[kept]
        parts = tuple(np.flatnonzero(np.isin(kept, part)) for part in parts)
    path = None
    if out is not None and fixture is None and stride == 1:
        path = pathlib.Path(out) / "optima" / f"{case.name}-{variant}.npz"
    only = None if scored is None else scored_hours(parts, *scored)
    arrays = fill_cache(case, loads, parts, path, budget_s=budget_s, hours=only)
    return HourlyData(case, variant, loads, hours, *parts, **arrays)


def evenly(part: np.ndarray, n: int | None) -> np.ndarray:
    """`n` evenly spaced hours of `part` (all where `n` is `None` or not fewer)."""
    if n is None or n >= part.size:
        return part
    return part[np.linspace(0, part.size - 1, n).astype(int)]


def scored_hours(
    parts: tuple, n_val: int, n_test: int | None, n_train: int = 0
) -> np.ndarray:
    """The hours a proxy run scores, test first: its `n_test` test hours
    (`evenly`) and `n_val` validation hours, evenly spaced (where all of them
    are solved, `_proxy._validation_hours` takes exactly these); then
    `n_train` evenly spaced training hours, for a supervised proxy on a grid
    whose every training optimum would cost too much solver time."""
    test, val, train = parts[2], parts[1], parts[0]
    return np.concatenate(
        [evenly(test, n_test), evenly(val, n_val), evenly(train, n_train)]
    )


SETTINGS = {"default": None, "1e-08": 1e-8}  # by their names in the record


def clarabel_dcopf(case: GridCase, p_d: np.ndarray, tol=None):
    """`(p_g, seconds)`: Clarabel's DC-OPF of the loads `p_d`, with its default
    settings (`tol=None`) or gap and feasibility tolerances `tol`; one thread."""
    import clarabel

    from ._data import clarabel_solver, dcopf_objective

    settings = clarabel.DefaultSettings()
    settings.verbose, settings.max_threads = False, 1
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
    """`(p_g, seconds)`: HiGHS's DC-OPF (a QP) of the loads `p_d`, one thread, at
    its default tolerances or primal and dual feasibility tolerances `tol`."""
    import highspy

    from ._data import dcopf_objective

    q = case.q(p_d)
    A = sp.vstack([case.E, case.C], format="csc")
    P, c = dcopf_objective(case)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_, lp.col_cost_ = case.dim, A.shape[0], c
    lp.col_lower_, lp.col_upper_ = case.lower, case.upper
    lp.row_lower_ = np.concatenate([q, case.flow_lower])
    lp.row_upper_ = np.concatenate([q, case.flow_upper])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_ = A.indptr, A.indices
    lp.a_matrix_.value_ = A.data
    hessian = sp.triu(P, format="csc")
    hessian.eliminate_zeros()
    model = highspy.HighsModel()
    model.lp_ = lp
    model.hessian_.dim_ = case.dim
    model.hessian_.format_ = highspy.HessianFormat.kTriangular
    model.hessian_.start_, model.hessian_.index_ = hessian.indptr, hessian.indices
    model.hessian_.value_ = hessian.data
    h = highspy.Highs()
    options = dict(output_flag=False, threads=1)
    if tol is not None:
        options |= dict(
            primal_feasibility_tolerance=tol, dual_feasibility_tolerance=tol
        )
    for key, value in options.items():
        h.setOptionValue(key, value)
    h.passModel(model)
    start = time.perf_counter()
    h.run()
    seconds = time.perf_counter() - start
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"HiGHS: {h.modelStatusToString(status)}")
    return np.asarray(h.getSolution().col_value)[: case.n_gen], seconds


def time_solvers(data: HourlyData, *, n_hours: int = 32) -> dict:
    """Times Clarabel and HiGHS at each of `SETTINGS` on `n_hours` test hours: `ms`,
    the largest cost difference to the cache's optimum, failures; the cache's ms."""
    case = data.case
    solved = data.solved(data.test)
    hours = solved[np.linspace(0, solved.size - 1, n_hours).astype(int)]
    record: dict = dict(case=case.name, variant=data.variant, method="solvers")
    record["n_bus"] = case.n_bus
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
                failed=failed, n_hours=int(hours.size),
            )  # fmt: skip
    record["clarabel_cache_ms"] = timing.stats(1e3 * data.solver_s[solved])
    record["hours"] = dict(test=data.counts(data.test))
    record["machine"] = provenance.machine()
    return record
