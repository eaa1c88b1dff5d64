"""DC-OPF projection benchmark: construction, accuracy and inference throughput.

For one grid and one precision, at the library's defaults (inference mode):
the `Projector`'s build time and peak memory; the accuracy on raw outputs near
the set (the DC-OPF optimum plus noise of 0.1 times the spread of its entries)
and far from it (10 times that) against Clarabel's projection at 1e-10 and
against that point certified by the KKT conditions (`_certify`), with the
issue's normalised row residual $|a_i^\\top y - b_i| / (|a_i|^\\top |y| + |b_i| +
\\|a_i\\|_1 \\overline{|y|})$; and a jitted batch timed against Clarabel and OSQP.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import pinet_eqx as pe
from pinet_eqx._linalg.host_solve import FACTORISATIONS

from .._common import provenance, timing
from ._certify import certify_projection
from ._fixture import GridCase, sample_loads

NEAR, FAR = 0.1, 1.0
EPS32 = float(np.finfo(np.float32).eps)


def projector(case: GridCase, **settings) -> pe.Projector:
    """The DC-OPF feasible set as a `Projector`, its loads the `Parameter` `q`."""
    balance = pe.Equality(case.E, pe.Parameter("q"))
    flows = pe.AffineInequality(case.C, case.flow_lower, case.flow_upper)
    return pe.Projector([balance, flows, pe.Box(case.lower, case.upper)], **settings)


def raw_outputs(case: GridCase, loads, rng, scale: float, y_center) -> np.ndarray:
    """Raw outputs: `y_center` plus Gaussian noise of `scale` times its spread."""
    spread = np.std(y_center)
    return y_center + scale * spread * rng.normal(size=(loads.shape[0], case.dim))


def row_residuals(case: GridCase, y, p_d) -> np.ndarray:
    """The issue's normalised residual of every row (equalities, then the line
    limits they violate and the generator bounds they violate), in float64."""
    y = np.asarray(y, np.float64)
    q = case.q(p_d)
    a = abs(case.E)
    mean = np.mean(np.abs(y))
    norm1 = np.asarray(a.sum(axis=1)).ravel()
    eq = np.abs(case.E @ y - q) / (a @ np.abs(y) + np.abs(q) + norm1 * mean)
    w = case.C @ y
    c = abs(case.C)
    denom = c @ np.abs(y) + np.asarray(c.sum(axis=1)).ravel() * mean
    over = np.maximum(w - case.flow_upper, 0) + np.maximum(case.flow_lower - w, 0)
    flows = over / (denom + np.abs(np.where(over > 0, case.flow_upper, 0)))
    box = np.maximum(y - case.upper, 0) + np.maximum(case.lower - y, 0)
    return np.concatenate([eq, flows, box / (np.abs(y) + mean)])


def max_residuals(case: GridCase, ys, loads) -> np.ndarray:
    """The largest `row_residuals` of each output of `ys` (loads `loads`)."""
    return np.array([row_residuals(case, y, p_d).max() for y, p_d in zip(ys, loads)])


def _solver(case: GridCase, **settings):
    """`(projector, solve, build_s)`: the projector in inference mode, its jitted
    batch `solve(Y, Q)` and its build time."""
    start = time.perf_counter()
    proj = projector(case, inference=True, **settings)
    build_s = time.perf_counter() - start
    return proj, jax.jit(jax.vmap(lambda y, q: proj.solve(y, q=q))), build_s


def run(
    case: GridCase, dtype: str, *, n_accuracy=8, batch=256, n_solver=8, repeats=3,
    seed=0, affine_form="auto",
) -> dict:  # fmt: skip
    """Benchmark one grid in one precision; returns a JSON-able record
    (`affine_form`: a test forces the sparse form on a small grid)."""
    from ._data import project_clarabel, project_osqp

    jdtype = jnp.float64 if dtype == "float64" else jnp.float32
    rng = np.random.default_rng(seed)
    rss0 = provenance.peak_rss_gb()
    proj, solve, build_s = _solver(case, affine_form=affine_form)
    record: dict = dict(
        case=case.name, dtype=dtype, dim=case.dim, n_eq=case.E.shape[0],
        n_ineq=case.n_branch, nnz=int(case.E.nnz + case.C.nnz),
        affine_form=type(proj.op).__name__, build_s=build_s,
        peak_rss_gb_before=rss0, peak_rss_gb_after_build=provenance.peak_rss_gb(),
    )  # fmt: skip
    loads = sample_loads(case, max(n_accuracy, batch), rng)
    y_center = project_clarabel(case, np.zeros(case.dim), loads[0])[0]
    for label, scale in (("near", NEAR), ("far", FAR)):
        p_d = loads[:n_accuracy]
        Y = raw_outputs(case, p_d, rng, scale, y_center)
        sol = solve(jnp.asarray(Y, jdtype), jnp.asarray(case.q(p_d), jdtype))
        record[label] = _accuracy(case, Y, p_d, sol)

    # Inference throughput at `batch`, near the set ...
    Y = jnp.asarray(raw_outputs(case, loads[:batch], rng, NEAR, y_center), jdtype)
    Q = jnp.asarray(case.q(loads[:batch]), jdtype)
    sol, timed = timed_batch(lambda: solve(Y, Q), batch, repeats, warmup=1)
    record.update(timed, batch_successful=share_successful(sol))
    # ... and far from it, against Clarabel's times on the far instances.
    Y_far = jnp.asarray(raw_outputs(case, loads[:batch], rng, FAR, y_center), jdtype)
    sol, timed = timed_batch(lambda: solve(Y_far, Q), batch, repeats, warmup=0)
    ratio = timed["per_instance_ms"] / (1e3 * record["far"]["clarabel_s_median"])
    successful = share_successful(sol)
    record["far_timing"] = dict(timed, successful=successful, ratio_to_clarabel=ratio)
    Yn = np.asarray(Y, np.float64)
    record["clarabel_ms"] = timing.stats(
        [1e3 * project_clarabel(case, Yn[i], loads[i])[1] for i in range(n_solver)]
    )
    osqp_ms = []
    for i in range(n_solver):
        try:
            osqp_ms.append(1e3 * project_osqp(case, Yn[i], loads[i])[1])
        except RuntimeError:  # its iteration cap, on the larger grids
            pass
    record["osqp_ms"] = timing.stats(osqp_ms) if osqp_ms else None
    record["osqp_failed"] = n_solver - len(osqp_ms)
    ratio = record["per_instance_ms"] / record["clarabel_ms"]["median"]
    record["ratio_to_clarabel"] = ratio
    record["peak_rss_gb_end"] = provenance.peak_rss_gb()
    record["machine"] = provenance.machine()
    return record


def _accuracy(case: GridCase, Y: np.ndarray, p_d: np.ndarray, sol) -> dict:
    """The outputs `sol` of the raw outputs `Y` (loads `p_d`) against Clarabel's
    projection and that point certified (`_certify`)."""
    from ._data import project_clarabel

    ys = np.asarray(sol.y, np.float64)
    errs, exact_errs, certified, obj_gap, viol, clarabel_s = [], [], [], [], [], []
    for i in range(len(Y)):
        ref, seconds = project_clarabel(case, Y[i], p_d[i])
        clarabel_s.append(seconds)
        errs.append(np.abs(ys[i] - ref).max() / np.abs(ref).max())
        exact, ok = certify_projection(case, Y[i], p_d[i], ref)
        certified.append(ok)
        exact_errs.append(np.abs(ys[i] - exact).max() / np.abs(exact).max())
        obj_gap.append(np.sum((ys[i] - Y[i]) ** 2) - np.sum((ref - Y[i]) ** 2))
        viol.append(max(case.residuals(ys[i], p_d[i])))
    resid = max_residuals(case, ys, p_d)
    # Over the instances whose ground truth is certified only.
    exact_max = (
        np.max(np.where(certified, exact_errs, 0.0)) if any(certified) else np.nan
    )
    return dict(
        rel_err_max=float(np.max(errs)), rel_err_median=float(np.median(errs)),
        certified=float(np.mean(certified)), rel_err_certified_max=float(exact_max),
        objective_minus_clarabel_max=float(np.max(obj_gap)),
        violation_max=float(np.max(viol)),
        normalised_residual_max=float(np.max(resid)),
        normalised_residual_over_eps32=float(np.max(resid) / EPS32),
        successful=share_successful(sol),
        clarabel_s_median=float(np.median(clarabel_s)),
    )  # fmt: skip


def _own_centre(solve, Q, dim: int):
    """Our projection of zero for the first loads of `Q`: `(y, solution)`."""
    centre = solve(jnp.zeros((1, dim), Q.dtype), Q[:1])
    return np.asarray(centre.y[0], np.float64), centre


def throughput(case: GridCase, dtype: str, *, batch=256, repeats=5, seed=0) -> dict:
    """Inference throughput alone, for a machine without Clarabel, OSQP and
    pandapower (the GPU one): near raw outputs around our own projection of
    zero, with the share `successful`, the violation and normalised residual."""
    rng = np.random.default_rng(seed)
    proj, solve, build_s = _solver(case)
    loads = sample_loads(case, batch, rng)
    Q = jnp.asarray(case.q(loads), dtype)
    y_center, centre = _own_centre(solve, Q, case.dim)
    Y = jnp.asarray(raw_outputs(case, loads, rng, NEAR, y_center), dtype)
    sol, timed = timed_batch(lambda: solve(Y, Q), batch, repeats, warmup=1)
    ys = np.asarray(sol.y, np.float64)
    resid = max(max_residuals(case, ys, loads))
    return dict(
        case=case.name, dtype=dtype, dim=case.dim,
        affine_form=type(proj.op).__name__, build_s=build_s, **timed,
        successful=share_successful(sol),
        violation_max=max(max(case.residuals(y, p)) for y, p in zip(ys, loads)),
        normalised_residual_over_eps32=float(resid / EPS32),
        center_successful=share_successful(centre) == 1.0,
        machine=provenance.machine(devices=True),
    )  # fmt: skip


def share_successful(sol) -> float:
    """The share of a batch's instances that report `successful`."""
    return float(np.mean(np.asarray(sol.result == pe.RESULTS.successful)))


def timed_batch(call, batch: int, repeats: int, warmup: int) -> tuple:
    """`(result, record)`: `call()` (on a batch of `batch`) once (`first_call_s`,
    compilation included), then timed over `repeats` calls after `warmup` more
    (`batch_s`, and its median per instance, `per_instance_ms`)."""
    start = time.perf_counter()
    result = jax.block_until_ready(call())
    first_call_s = time.perf_counter() - start
    t = timing.time_calls(call, repeats=repeats, warmup=warmup)
    per_instance_ms = 1e3 * t["median"] / batch
    return result, dict(
        first_call_s=first_call_s, batch=batch, batch_s=t,
        per_instance_ms=per_instance_ms,
    )  # fmt: skip


# The distances: multiples of the spread around the optimum, and an
# even dispatch of the total load plus noise of 0.3 of each generator's range
# (angles: 0.09 rad) times the factor.
SCALES = (0.1, 1.0, 10.0, 100.0)
EVEN = (1.0,)


def even_dispatch(case: GridCase, loads, rng, factor: float) -> np.ndarray:
    """Raw outputs that share each total load evenly among the generators,
    plus Gaussian noise of `factor` times 0.3 of each generator's range
    (its finite range, capped at 1e3 per unit) and 0.09 rad on the angles."""
    n = loads.shape[0]
    p_g = np.repeat(loads.sum(axis=1, keepdims=True) / case.n_gen, case.n_gen, 1)
    spread = np.minimum(case.p_max - case.p_min, 1e3)
    p_g = p_g + factor * 0.3 * spread * rng.normal(size=p_g.shape)
    theta = factor * 0.09 * rng.normal(size=(n, case.n_bus))
    return np.concatenate([p_g, theta], axis=1)


def distances(
    case: GridCase, dtype="float32", *, batch=256, n_solver=8, repeats=3, seed=0
) -> dict:
    """Inference time against the distance of the raw outputs from the set: for
    each of `SCALES` and `EVEN`, the batch call (`timed_batch`), the host
    factorisations per instance, the share `successful`, the normalised residual
    and Clarabel's time on `n_solver` instances (0: none, and the centre is our
    own projection of zero)."""
    rng = np.random.default_rng(seed)
    solve = _solver(case)[1]
    loads = sample_loads(case, batch, rng)
    Q = jnp.asarray(case.q(loads), dtype)
    if n_solver:  # (the GPU machine, which runs none, has no Clarabel)
        from ._data import project_clarabel

        y_center = project_clarabel(case, np.zeros(case.dim), loads[0])[0]
    else:
        y_center = _own_centre(solve, Q, case.dim)[0]
    rows = []
    for kind, factor in [("spread", s) for s in SCALES] + [("even", f) for f in EVEN]:
        if kind == "spread":
            Y = raw_outputs(case, loads, rng, factor, y_center)
        else:
            Y = even_dispatch(case, loads, rng, factor)
        FACTORISATIONS.reset()
        Y_j = jnp.asarray(Y, dtype)
        sol, timed = timed_batch(lambda: solve(Y_j, Q), batch, repeats, warmup=1)
        calls = 2 + repeats  # the first call, the warm-up and the timed ones
        resid = max(max_residuals(case, np.asarray(sol.y, np.float64), loads))
        clarabel = []
        for i in range(min(n_solver, batch)):
            try:
                clarabel.append(1e3 * project_clarabel(case, Y[i], loads[i])[1])
            except RuntimeError:  # Clarabel's own early stops
                pass
        row = dict(
            kind=kind, factor=factor, **timed,
            factorisations_per_instance=FACTORISATIONS.reset() / (calls * batch),
            successful=share_successful(sol),
            normalised_residual_over_eps32=float(resid / EPS32),
            clarabel_ms=timing.stats(clarabel) if clarabel else None,
        )  # fmt: skip
        if clarabel:
            row["ratio_to_clarabel"] = row["per_instance_ms"] / np.median(clarabel)
        rows.append(row)
    times = [r["per_instance_ms"] for r in rows]
    return dict(
        case=case.name, dtype=dtype, batch=batch, rows=rows,
        slowest_over_fastest=max(times) / min(times),
        machine=provenance.machine(devices=True),
    )  # fmt: skip
