r"""How the DC-OPF proxies are scored against the solver, hour by hour.

The optimality gap of a dispatch $p$ is $(c(p) - c^\star) / |c^\star|$, with
$c(p) = \sum_g c_{2,g} p_g^2 + c_{1,g} p_g$ (the constant costs $c_0$ left out,
so the gap is not diluted by them) and $c^\star$ Clarabel's optimum at 1e-8.
Line flows are the dispatch's DC flows (`_proxy_models.ptdf`, in float64), so
every method's overloads are measured alike; for our layer the record also has
the issue's normalised residual of every row of $y$ (`_projection.row_residuals`)
and the layer's `result` flag. Infeasible hours of the part scored (the
solver's verdict) are run through the network too, to see what it reports.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import pinet_eqx as pe

from ._fixture import GridCase
from ._projection import EPS32, max_residuals, timed_batch
from ._proxy_data import INFEASIBLE, HourlyData
from ._proxy_models import injections_matrix, ptdf

CHUNK = 256  # the batch: inference runs and is timed at this size


class Grid(eqx.Module):
    """The float32 grid data the losses need, passed to the compiled step as
    arguments (not baked in as constants), and the scales of the losses."""

    c2: jax.Array
    c1: jax.Array
    A_g: jax.Array
    M: jax.Array
    flow_lower: jax.Array
    flow_upper: jax.Array
    p_min: jax.Array
    p_max: jax.Array
    cost_scale: float = eqx.field(static=True)
    penalty_unit: float = eqx.field(static=True)

    @classmethod
    def of(cls, case: GridCase, scaling: dict) -> Grid:
        """The arrays of `case`; the cost scale is the cost of the centre
        dispatch (the mean training load shared in proportion to the ranges),
        the penalty unit the largest marginal cost there over that scale."""
        from ._proxy_models import center

        p_c = center(case, scaling["x_mean"])[: case.n_gen]
        scale = float(case.cost(p_c))
        marginal = float(np.max(2 * case.cost_quad * p_c + case.cost_lin))
        arrays = (case.cost_quad, case.cost_lin, injections_matrix(case), ptdf(case))
        arrays += (case.flow_lower, case.flow_upper, case.p_min, case.p_max)
        f32 = (jnp.asarray(a, jnp.float32) for a in arrays)
        return cls(*f32, abs(scale), marginal / abs(scale))


def cost_of(grid, p):
    """The dispatch cost of each row of `p` (`(batch, n_gen)`)."""
    return jnp.sum(grid.c2[None] * p * p + grid.c1[None] * p, axis=-1)


@eqx.filter_jit
def _predict_ours(model, x, q):
    raw = jax.vmap(model.backbone)(x)
    sol = jax.vmap(lambda r, q: model.projector.solve(r, q=q))(raw, q)
    # `_value`: the flag's integer code, which concatenates across chunks.
    return sol.y[:, : sol.y.shape[1] - x.shape[1]], sol.y, sol.result._value


@eqx.filter_jit
def _predict_plain(model, x, q):
    del q
    return jax.vmap(model)(x), None, None


def predictor(method: str, model):
    """`predict(x, q)` for a batch, jitted, in inference mode: `(p_g, y,
    result)`, `y` and `result` `None` for the methods without our layer.

    The model is an argument of one module-level compiled function, not a
    constant of a new one, so that validating network after network (same
    structure, same batch) compiles once."""
    model = eqx.nn.inference_mode(model)
    predict = _predict_ours if method.startswith("ours") else _predict_plain
    return lambda x, q: predict(model, x, q)


def _run(predict, data: HourlyData, hours: np.ndarray):
    """The outputs of `predict` for `hours`, in chunks of `CHUNK` (float64)."""
    ps, ys, results = [], [], []
    for start in range(0, hours.size, CHUNK):
        idx = hours[start : start + CHUNK]
        x = jnp.asarray(data.loads[idx], jnp.float32)
        q = jnp.asarray(data.case.q(data.loads[idx]), jnp.float32)
        p, y, result = predict(x, q)
        ps.append(np.asarray(p, np.float64))
        if y is not None:
            ys.append(np.asarray(y, np.float64))
            results.append(np.asarray(result))
    cat = lambda a: np.concatenate(a) if a else None  # noqa: E731
    return cat(ps), cat(ys), cat(results)


def _flows(case: GridCase, M: np.ndarray, p: np.ndarray, loads: np.ndarray):
    """`(overload_mw, loading)`: per hour, the largest overload (MW, 0 if none)
    and the largest |flow| / rating, from the dispatch's DC flows."""
    flow = (p @ injections_matrix(case).T - case.q(loads)[:, :-1]) @ M.T
    over = np.maximum(flow - case.flow_upper, 0) + np.maximum(case.flow_lower - flow, 0)
    loading = np.abs(flow + case.f_shift) / case.f_max
    return over.max(axis=1) * case.base_mva, loading.max(axis=1)


def _percentiles(values: np.ndarray) -> dict:
    """Mean, median, 99th percentile and max of `values` (NaN when empty)."""
    if values.size == 0:
        return dict(mean=np.nan, p50=np.nan, p99=np.nan, max=np.nan)
    return dict(
        mean=float(np.mean(values)),
        p50=float(np.median(values)),
        p99=float(np.percentile(values, 99)),
        max=float(np.max(values)),
    )


def evaluate(
    method: str,
    model,
    data: HourlyData,
    part: np.ndarray,
    *,
    timed: bool = False,
    per_hour: bool = False,
    repeats: int = 3,
) -> dict:
    """Scores `model` of `method` on the solved hours `part` of `data`:
    `gap_mean` and `gap` (`_percentiles`), `overload_mw`, the share of hours
    overloaded, the imbalance and bound violations (MW) and, for our layer, the
    share `successful`, the normalised residual over eps32 and
    `infeasible_hours` (what it reported where Clarabel found none). `timed` also
    times `predict` at batch `CHUNK` (`repeats` calls after the compiling one);
    `per_hour` lists each hour's index, gap, cost and largest line loading.
    """
    case = data.case
    hours = data.solved(part)
    predict = predictor(method, model)
    p, y, result = _run(predict, data, hours)
    cost = case.cost(p)
    gaps = (cost - data.cost_opt[hours]) / np.abs(data.cost_opt[hours])
    over, loading = _flows(case, _M(case), p, data.loads[hours])
    demand = case.q(data.loads[hours])[:, :-1].sum(axis=1)
    bounds = np.maximum(p - case.p_max, 0) + np.maximum(case.p_min - p, 0)
    record = dict(
        n_hours=int(hours.size),
        gap_mean=float(np.mean(gaps)) if gaps.size else np.nan,
        gap=_percentiles(gaps),
        overload_mw=_percentiles(over),
        overloaded_share=float(np.mean(over > 1e-3)) if over.size else np.nan,
        imbalance_mw_max=float(np.max(np.abs(p.sum(1) - demand)) * case.base_mva),
        bound_violation_mw_max=float(bounds.max() * case.base_mva),
    )
    if y is not None:
        resid = max_residuals(case, y, data.loads[hours])
        record.update(
            successful=float(np.mean(result == pe.RESULTS.successful._value)),
            residual_over_eps32=_percentiles(resid / EPS32),
            infeasible_hours=_infeasible(predict, data, part),
        )
    if per_hour:
        p_opt = data.y_opt[hours, : case.n_gen].astype(np.float64)
        _, opt_loading = _flows(case, _M(case), p_opt, data.loads[hours])
        record["per_hour"] = dict(
            hour=hours.tolist(), gap=gaps.tolist(), cost=cost.tolist(),
            loading=loading.tolist(), opt_cost=data.cost_opt[hours].tolist(),
            opt_loading=opt_loading.tolist(),
            time=[str(t) for t in data.hours[hours]],
        )  # fmt: skip
    if timed:
        record["timing"] = _timed(predict, data, hours, repeats)
    return record


_PTDF: dict = {}


def _M(case: GridCase) -> np.ndarray:
    """`ptdf(case)`, computed once per grid (by name and size) and kept."""
    key = (case.name, case.n_bus, case.n_branch)
    if key not in _PTDF:
        _PTDF[key] = ptdf(case)
    return _PTDF[key]


def _infeasible(predict, data: HourlyData, part: np.ndarray, most: int = 64) -> dict:
    """What the layer reports on the hours of `part` without a feasible
    dispatch (at most `most` of them, evenly spaced): how many there are, the
    share it flags `infeasible`, the share `successful` (which would be
    wrong), whether its outputs are finite."""
    every = part[data.status[part] == INFEASIBLE]
    if every.size == 0:
        return dict(n_hours=0)
    hours = every[np.linspace(0, every.size - 1, min(most, every.size)).astype(int)]
    _, y, result = _run(predict, data, hours)
    below_pmin = data.loads[every].sum(1) + data.case.p_fixed.sum() < np.sum(
        data.case.p_min
    )
    return dict(
        n_hours=int(every.size),
        n_run=int(hours.size),
        below_total_pmin=int(np.sum(below_pmin)),
        flagged_infeasible=float(np.mean(result == pe.RESULTS.infeasible._value)),
        flagged_max_steps=float(np.mean(result == pe.RESULTS.max_steps_reached._value)),
        successful=float(np.mean(result == pe.RESULTS.successful._value)),
        finite=bool(np.all(np.isfinite(y))),
    )


def _timed(predict, data: HourlyData, hours: np.ndarray, repeats: int) -> dict:
    """The time of `predict` on a batch of `CHUNK` test hours (tiled if fewer)."""
    idx = np.resize(hours, CHUNK)
    x = jnp.asarray(data.loads[idx], jnp.float32)
    q = jnp.asarray(data.case.q(data.loads[idx]), jnp.float32)
    # The first call compiled and ran the batch: it is the warm-up.
    _, timed = timed_batch(lambda: predict(x, q), CHUNK, repeats, warmup=0)
    t = timed["batch_s"]
    return dict(
        timed,
        per_instance_ms_lq=1e3 * t["lq"] / CHUNK,
        per_instance_ms_uq=1e3 * t["uq"] / CHUNK,
    )
