r"""DC-OPF grids from pandapower, and reference solvers for the DC-OPF and projection.

`load_case` reads MATPOWER's DC model off pandapower's internal PYPOWER case
(`net._ppc`, after its DC power flow; `makeBdc`): in-service generators and
branches, isolated buses dropped, the first type-3 bus as the reference. A
branch without a rating gets 1e4 MVA, and every limit is raised to 1.2 times
the base-case flow. The conventions and checks are in `NOTES_data.md`.

`project_clarabel` and `dcopf_clarabel` are the high-accuracy references
(Clarabel at 1e-10, loosened 10x at a time up to 1e-8 where it does not report
`Solved`); `project_osqp` is the first-order comparison. The projection is
ill-conditioned on the PEGASE grids (branch susceptances from 1e-2 to 6e3 per
unit), so Clarabel's solutions at 1e-8 and 1e-10 differ by up to ~6e-5 there.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import clarabel
import numpy as np
import osqp
import scipy.sparse as sp

from ._fixture import GridCase, dc_case

CASES = ("case30", "case118", "case1354pegase", "case2869pegase", "case9241pegase")
UNRATED_MVA = 1e4  # the rating given to branches without one
_RATING_PLACEHOLDER_MVA = 1e6  # ratings at or above this are pandapower placeholders
FLOW_MARGIN = 1.2  # each limit is at least this times the base-case flow
MAX_TOL = 1e-8  # the loosest tolerance a Clarabel solve falls back to


def load_case(name: str, *, slack_limits: Literal["opf", "ppc"] = "opf") -> GridCase:
    """The DC-OPF data of the pandapower network `name` (one of `CASES`), the
    external grid's limits `"opf"` (`net.ext_grid`'s, as pandapower's DC-OPF) or
    `"ppc"` (the power flow's 1e9 MW placeholders: `p_max = 1e7` per unit)."""
    if name not in CASES:
        raise ValueError(f"Unknown DC-OPF case '{name}'; expected one of {CASES}.")
    if slack_limits not in ("opf", "ppc"):
        raise ValueError(f"`slack_limits` must be 'opf' or 'ppc', not {slack_limits!r}")
    import pandapower
    import pandapower.networks
    from pandapower.pypower import idx_brch, idx_bus, idx_gen
    from pandapower.pypower.makeBdc import makeBdc

    net = getattr(pandapower.networks, name)()
    pandapower.rundcpp(net)  # for `net._ppc`
    ppc = net._ppc
    base = float(ppc["baseMVA"])
    bus, gen, branch = (
        np.real(np.asarray(ppc[k])).astype(np.float64) for k in ("bus", "gen", "branch")
    )
    # Drop isolated buses and out-of-service branches/generators; renumber buses.
    bus_kept = bus[:, idx_bus.BUS_TYPE] != idx_bus.NONE
    new_index = np.full(bus.shape[0], -1, dtype=np.int64)
    new_index[bus_kept] = np.arange(np.count_nonzero(bus_kept))
    f_old = branch[:, idx_brch.F_BUS].astype(np.int64)
    t_old = branch[:, idx_brch.T_BUS].astype(np.int64)
    branch_kept = (
        (branch[:, idx_brch.BR_STATUS] > 0) & bus_kept[f_old] & bus_kept[t_old]
    )
    gen_bus_old = gen[:, idx_gen.GEN_BUS].astype(np.int64)
    gen_kept = (gen[:, idx_gen.GEN_STATUS] > 0) & bus_kept[gen_bus_old]
    gen_rows = np.flatnonzero(gen_kept)
    bus, branch, gen = bus[bus_kept], branch[branch_kept], gen[gen_rows]
    bus[:, idx_bus.BUS_I] = np.arange(bus.shape[0])
    branch_from = new_index[f_old[branch_kept]]
    branch_to = new_index[t_old[branch_kept]]
    branch[:, idx_brch.F_BUS], branch[:, idx_brch.T_BUS] = branch_from, branch_to
    n_bus, n_branch = bus.shape[0], branch.shape[0]
    gen_bus = new_index[gen_bus_old[gen_kept]]
    refs = np.flatnonzero(bus[:, idx_bus.BUS_TYPE] == idx_bus.REF)
    if refs.size == 0:
        raise ValueError(f"Case '{name}' has no reference (type-3) bus.")
    ref_bus = int(refs[0])

    B_bus, B_f, p_bus_inj, p_f_inj, *_ = makeBdc(bus, branch)
    B_bus, B_f = (sp.csr_matrix(B, dtype=np.float64) for B in (B_bus, B_f))
    p_bus_inj = np.asarray(p_bus_inj, dtype=np.float64).reshape(-1)[:n_bus]
    p_f_inj = np.asarray(p_f_inj, dtype=np.float64).reshape(-1)[:n_branch]
    # The base-case DC power flow (angles relative to the reference bus).
    theta_pf = np.deg2rad(bus[:, idx_bus.VA])
    theta_pf = theta_pf - theta_pf[ref_bus]
    flow_pf = B_f @ theta_pf + p_f_inj

    rating = branch[:, idx_brch.RATE_A].copy()
    unrated = (rating <= 0) | (rating >= _RATING_PLACEHOLDER_MVA)
    rating[unrated] = UNRATED_MVA
    f_max = np.maximum(rating / base, FLOW_MARGIN * np.abs(flow_pf))
    p_limits = (gen[:, idx_gen.PMIN] / base, gen[:, idx_gen.PMAX] / base)
    row_of = np.full(np.asarray(ppc["gen"]).shape[0], -1, dtype=np.int64)
    row_of[gen_rows] = np.arange(gen_rows.size)
    case = dc_case(
        gen_bus, ref_bus, B_bus, B_f, name=name, base_mva=base, f_max=f_max,
        f_shift=p_f_inj, p_d=bus[:, idx_bus.PD] / base,
        p_fixed=bus[:, idx_bus.GS] / base + p_bus_inj, branch_from=branch_from,
        branch_to=branch_to, **_generators(net, row_of, base, *p_limits, slack_limits),
    )  # fmt: skip
    case.E.eliminate_zeros()
    case.C.eliminate_zeros()
    return case


def _generators(net, row_of, base: float, p_min, p_max, slack_limits: str) -> dict:
    """The generators' `p_min`, `p_max` (the external grid's from `net.ext_grid`
    with `slack_limits="opf"`) and costs (`net.poly_cost`), per unit."""
    slack_rows = _element_rows(net, "ext_grid", row_of)
    if slack_limits == "opf":
        for idx, row in slack_rows.items():
            for column, target in (("max_p_mw", p_max), ("min_p_mw", p_min)):
                value = net.ext_grid.at[idx, column] if column in net.ext_grid else None
                if value is not None and np.isfinite(value):
                    target[row] = float(value) / base
    p_min = np.minimum(np.maximum(p_min, 0.0), p_max)
    cost_quad, cost_lin = np.zeros(p_max.size), np.zeros(p_max.size)
    rows = {"gen": _element_rows(net, "gen", row_of), "ext_grid": slack_rows}
    for _, cost in net.poly_cost.iterrows():
        row = rows.get(cost["et"], {}).get(cost["element"])
        if row is not None:  # the costs of other elements are left out
            cost_quad[row] = float(cost["cp2_eur_per_mw2"]) * base**2
            cost_lin[row] = float(cost["cp1_eur_per_mw"]) * base
    return dict(p_min=p_min, p_max=p_max, cost_quad=cost_quad, cost_lin=cost_lin)


def _element_rows(net: Any, element: str, row_of: np.ndarray) -> dict[Any, int]:
    """The `GridCase` generator of each in-service element of `net[element]`
    (`"gen"` or `"ext_grid"`), by index; `row_of`: each ppc gen row's (-1: none)."""
    lookup = net._pd2ppc_lookups.get(element)
    if lookup is None or len(net[element]) == 0:
        return {}
    lookup = np.asarray(lookup)
    rows = {}
    for idx in net[element].index:
        if 0 <= idx < lookup.size and 0 <= lookup[idx] < row_of.size:
            row = int(row_of[lookup[idx]])
            if row >= 0:
                rows[idx] = row
    return rows


def _inequalities(case: GridCase) -> tuple[sp.csr_matrix, np.ndarray]:
    """The finite rows `G y <= h` of the flow limits and generator bounds."""
    eye = sp.eye(case.n_gen, case.dim, format="csr")
    blocks = [(case.C, case.flow_upper), (-case.C, -case.flow_lower)]
    blocks += [(eye, case.p_max), (-eye, -case.p_min)]
    G = sp.vstack([M[np.isfinite(h)] for M, h in blocks], format="csr")
    return G, np.concatenate([h[np.isfinite(h)] for _, h in blocks])


def dcopf_objective(case: GridCase) -> tuple[sp.dia_matrix, np.ndarray]:
    """The DC-OPF's cost $\frac12 y^\top P y + c^\top y$ as `(P, c)`."""
    zeros = np.zeros(case.n_bus)
    quad = np.concatenate([2.0 * case.cost_quad, zeros])
    return sp.diags(quad), np.concatenate([case.cost_lin, zeros])


def clarabel_solver(case: GridCase, P, c, p_d: np.ndarray, settings) -> Any:
    """A Clarabel solver of `min 1/2 y'Py + c'y` over the set of the loads `p_d`."""
    G, h = _inequalities(case)
    A = sp.vstack([case.E, G], format="csc")
    b = np.concatenate([case.q(p_d), h])
    P = sp.triu(sp.csc_matrix(P, dtype=np.float64), format="csc")
    cones = [clarabel.ZeroConeT(case.E.shape[0]), clarabel.NonnegativeConeT(G.shape[0])]
    return clarabel.DefaultSolver(P, np.asarray(c, np.float64), A, b, cones, settings)


# A projection gets tighter refinement and less regularisation (else
# `InsufficientProgress` on case2869pegase and case9241pegase at 1e-10); the
# DC-OPF does better without.
_PROJECTION_SETTINGS = dict(
    iterative_refinement_reltol=1e-15, iterative_refinement_abstol=1e-15,
    iterative_refinement_max_iter=30, static_regularization_constant=1e-10,
)  # fmt: skip


def _clarabel_solve(case: GridCase, P, c, p_d, tol: float, *, projection: bool):
    """`(y, seconds)`: Clarabel's `min 1/2 y'Py + c'y` over the feasible set of the
    loads `p_d` and the time of its `solve()` calls. Unless it reports `Solved`,
    it is rerun 10x looser up to `max(tol, MAX_TOL)`; then `RuntimeError`."""
    seconds, attempts, current = 0.0, 0, tol
    while True:
        values = dict(verbose=False, equilibrate_enable=True, presolve_enable=True)
        values |= dict(tol_gap_abs=current, tol_gap_rel=current, tol_feas=current)
        values |= dict(tol_ktratio=1e-6, max_iter=500)
        values |= _PROJECTION_SETTINGS if projection else {}
        settings = clarabel.DefaultSettings()
        for key, value in values.items():
            setattr(settings, key, value)
        solver = clarabel_solver(case, P, c, p_d, settings)
        start = time.perf_counter()
        solution = solver.solve()
        seconds += time.perf_counter() - start
        attempts += 1
        if solution.status == clarabel.SolverStatus.Solved:
            return np.array(solution.x, dtype=np.float64), seconds
        if current * 10 > max(tol, MAX_TOL) * (1 + 1e-9):
            raise RuntimeError(
                f"Clarabel stopped with status {solution.status} on case "
                f"'{case.name}' after {solution.iterations} iterations (tolerances "
                f"{tol:g} to {current:g}, {attempts} solves)."
            )
        current *= 10


def project_clarabel(case: GridCase, y_raw, p_d, *, tol=1e-10):
    """`(y, seconds)`: Clarabel's projection of `y_raw` onto the feasible set of
    the loads `p_d`, loosened up to `MAX_TOL` as in `_clarabel_solve`."""
    y_raw = np.asarray(y_raw, dtype=np.float64)
    eye = sp.eye(case.dim, format="csc")
    return _clarabel_solve(case, eye, -y_raw, p_d, tol, projection=True)


def dcopf_clarabel(case: GridCase, p_d, *, tol=1e-10):
    """`(y, objective, seconds)`: Clarabel's DC-OPF optimum for the loads `p_d`
    (with linear costs only, a point inside the optimal face)."""
    P, c = dcopf_objective(case)
    y, seconds = _clarabel_solve(case, P, c, p_d, tol, projection=False)
    return y, float(case.cost(y[: case.n_gen])), seconds


def project_osqp(case: GridCase, y_raw, p_d, *, eps=1e-6, max_iter=200_000):
    """`(y, seconds)`: OSQP's polished projection of `y_raw` for the loads `p_d`
    and the time of its `solve()`; `RuntimeError` unless it reports `solved`."""
    y_raw = np.asarray(y_raw, dtype=np.float64)
    eye = sp.eye(case.n_gen, case.dim, format="csr")
    A = sp.vstack([case.E, case.C, eye], format="csc")
    q = case.q(p_d)
    lower = np.concatenate([q, case.flow_lower, case.p_min])
    upper = np.concatenate([q, case.flow_upper, case.p_max])
    solver = osqp.OSQP()
    solver.setup(
        sp.eye(case.dim, format="csc"), -y_raw, A, lower, upper, eps_abs=eps,
        eps_rel=eps, max_iter=max_iter, polishing=True, verbose=False,
    )  # fmt: skip
    start = time.perf_counter()
    result = solver.solve(raise_error=False)
    seconds = time.perf_counter() - start
    if result.info.status != "solved":
        raise RuntimeError(
            f"OSQP stopped with status '{result.info.status}' on case "
            f"'{case.name}' after {result.info.iter} iterations (eps={eps:g})."
        )
    return np.array(result.x, dtype=np.float64), seconds
