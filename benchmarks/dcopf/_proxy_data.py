r"""The data of the DC-OPF proxies: ACTIVSg hours, their time split, and cached optima.

An `HourlyData` holds one grid in one *variant*, its hourly loads split by
month (`_activsg.split_by_month`: train January to September, validate on
October, test on November and December), and what Clarabel (at 1e-8, through
`_data.dcopf_clarabel`) says of each hour: solved (with its optimum and cost),
infeasible, or failed. The variants:

- `"real"`: the case as MATPOWER ships it. On case_ACTIVSg2000 every in-service
  unit has a positive `PMIN` (32.6 GW in all), so in the light hours the units
  cannot all run: those hours have no feasible dispatch (and in some heavier
  ones the must-run output cannot leave its area). Infeasible hours are kept
  out of training and of the gap statistics, and counted.
- `"pmin0"`: every `PMIN` set to 0, as if any unit could be decommitted; every
  hour is then feasible. Not the data as shipped: a variant, so labelled.

Solving a year of hours takes minutes (case_ACTIVSg2000: about 60 ms for an
infeasible hour, 130 ms for a feasible one), so the answers are cached in
`OUT/optima/{case}-{variant}.npz` and the solving can be stopped and resumed
(`fill_cache`'s `budget_s`): test hours first, then validation, then training.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time

import numpy as np

from ._activsg import (
    SCENARIO_CASES,
    hourly_loads,
    load_activsg,
    load_fixture,
    sample_e2elr,
    split_by_month,
    split_indices,
)
from ._fixture import GridCase

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
    """One grid (`case`, with `p_min` zero for the `"pmin0"` `variant`), its hourly
    `loads` (per unit) at `hours`, the `train`, `val`, `test` indices, and per hour
    the solver's `status` (`UNSOLVED`, `INFEASIBLE`, `FAILED`, `SOLVED`), the
    float32 optimum `y_opt` and float64 `cost_opt` (NaN unless solved) and
    Clarabel's `solver_s`.
    """

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
    """The split of a one-week fixture: five days to train, one to validate,
    the last to test (a split in time, as `split_by_month` is)."""
    days = np.arange(n_hours) // 24
    parts = (days < 5, days == 5, days >= 6)
    return tuple(np.flatnonzero(part) for part in parts)  # type: ignore[return-value]


def load_hours(
    name: str, variant: str = "real", *, fixture: str | os.PathLike | None = None
) -> tuple[GridCase, np.ndarray, np.ndarray, tuple]:
    """`(case, loads, hours, (train, val, test))` of an ACTIVSg grid.

    With `fixture` (a file of `_activsg.save_fixture`), numpy and scipy only,
    split by `fixture_split`; otherwise from the `matpower` package: the hourly
    loads split by `split_by_month` for `name` in `_activsg.SCENARIO_CASES`, and
    for the other grids `N_SAMPLES` loads of E2ELR's sampler (`hours` then numbers
    them) split by `split_indices`.
    """
    if fixture is not None:
        data, loads, hours = load_fixture(fixture)
        return variant_case(data.case, variant), loads, hours, fixture_split(len(hours))
    case = variant_case(load_activsg(name).case, variant)
    if name not in SCENARIO_CASES:
        # No time series: E2ELR's sampler, numbered samples, a random split.
        loads = sample_e2elr(case, N_SAMPLES, seed=SAMPLE_SEED)
        return case, loads, np.arange(N_SAMPLES), split_indices(N_SAMPLES, SAMPLE_SEED)
    loads, hours = hourly_loads(name)
    return case, loads, hours, split_by_month(hours)


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


def fill_cache(
    case: GridCase,
    loads: np.ndarray,
    parts: tuple,
    path: pathlib.Path | None,
    *,
    budget_s: float | None = None,
    progress: bool = True,
) -> dict:
    """Solves the hours of `loads` not yet in the `.npz` cache `path` (`None`: in
    memory), in the order test, val, train (`parts`), saving every 200 hours and at
    the end, and stopping after about `budget_s`. Returns the `status`, `y_opt`,
    `cost_opt` and `solver_s` arrays of `HourlyData`.
    """
    from tqdm.auto import tqdm

    n = loads.shape[0]
    arrays = _read_cache(path, n, case.dim)
    order = np.concatenate([parts[2], parts[1], parts[0]])
    todo = order[arrays["status"][order] == UNSOLVED]
    start = time.perf_counter()
    bar = tqdm(todo, desc=f"{case.name} optima", unit="h", disable=not progress)
    for count, hour in enumerate(bar, 1):
        status, y, cost, seconds = _solve_hour(case, loads[hour])
        arrays["status"][hour] = status
        arrays["cost_opt"][hour] = cost
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
    return dict(
        status=np.full(n, UNSOLVED, np.int8),
        y_opt=np.full((n, dim), np.nan, np.float32),
        cost_opt=np.full(n, np.nan),
        solver_s=np.full(n, np.nan),
    )


def _write_cache(path: pathlib.Path, arrays: dict) -> None:
    """Writes `arrays` to `path` through a temporary file (never half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part.npz")
    np.savez(partial, **arrays)
    os.replace(partial, path)


def hourly_data(
    name: str,
    variant: str = "real",
    *,
    out: pathlib.Path | None = None,
    fixture: str | os.PathLike | None = None,
    budget_s: float | None = None,
    stride: int = 1,
) -> HourlyData:
    """The hours of the ACTIVSg grid `name` in `variant` (`"real"` or `"pmin0"`),
    with Clarabel's optima cached in `out/optima/{name}-{variant}.npz` (`None`: not
    cached); `fixture` reads the grid and its week from a fixture, `budget_s` goes
    to `fill_cache`, and `stride` keeps every `stride`-th hour (not cached).
    """
    case, loads, hours, parts = load_hours(name, variant, fixture=fixture)
    if stride > 1:
        kept = np.arange(0, len(hours), stride)
        loads, hours = loads[kept], hours[kept]
        parts = tuple(np.flatnonzero(np.isin(kept, part)) for part in parts)
    path = None
    if out is not None and fixture is None and stride == 1:
        path = pathlib.Path(out) / "optima" / f"{case.name}-{variant}.npz"
    arrays = fill_cache(case, loads, parts, path, budget_s=budget_s)
    return HourlyData(case, variant, loads, hours, *parts, **arrays)
