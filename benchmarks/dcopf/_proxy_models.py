r"""The networks of the DC-OPF proxy benchmark, and the grid algebra their losses need.

Every method shares one backbone, an `eqx.nn.MLP` from the standardised bus
loads (`Standardised`), followed by: **ours** (`pe.HardConstrainedNet`), the
projection layer onto the DC-OPF set; **E2ELR** (Chen, Tanneau and Van
Hentenryck, IEEE Trans. Power Syst. 2023, Sec. III), a sigmoid into the
generator bounds, then the power-balance `repair` (line overloads only
penalised in the loss); or an **MLP with penalties** on the dispatch itself.

`evaluate` scores a proxy hour by hour: the optimality gap of a dispatch $p$ is
$(c(p) - c^\star) / |c^\star|$, $c$ the cost without its constant terms and
$c^\star$ Clarabel's optimum at 1e-8; line flows come from the PTDF (`ptdf`,
the reference bus as slack: $C y = M (A_g p_g - q)$), the same for every method.
"""

from __future__ import annotations

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from jaxtyping import Array, Float

import pinet_eqx as pe

from ._fixture import GridCase
from ._projection import EPS32, max_residuals, projector, timed_batch
from ._proxy_data import INFEASIBLE, HourlyData, clarabel_dcopf

METHODS = ("ours", "ours-dist", "ours-sup", "e2elr", "mlp")
CHUNK = 256  # the batch: inference runs and is timed at this size


class Scaling(eqx.Module):
    """Fixed input and output scalings of a backbone (`frozen`: never trained)."""

    x_mean: Float[Array, " n_in"]
    x_std: Float[Array, " n_in"]
    y_center: Float[Array, " n_out"]
    y_scale: Float[Array, " n_out"]


class Standardised(eqx.Module):
    r"""MLP between fixed scalings: $c + s \odot \mathrm{MLP}((x - \mu) / \sigma)$."""

    mlp: eqx.nn.MLP
    scaling: Scaling

    def __call__(self, x):
        s = self.scaling
        return s.y_center + s.y_scale * self.mlp((x - s.x_mean) / s.x_std)


class E2ELR(eqx.Module):
    """E2ELR's proxy: backbone, sigmoid into the bounds, `repair` to the load."""

    backbone: Standardised
    p_min: Float[Array, " n_gen"]
    p_max: Float[Array, " n_gen"]
    fixed: Float[Array, ""]

    def __call__(self, x):
        p = self.p_min + jax.nn.sigmoid(self.backbone(x)) * (self.p_max - self.p_min)
        return repair(p, self.p_min, self.p_max, jnp.sum(x) + self.fixed)


def repair(p, p_min, p_max, demand):
    r"""E2ELR's proportional response: $p + \eta (p_{max} - p)$ when $\sum p <
    D$, $p - \eta (p - p_{min})$ when $\sum p > D$, with $\eta \in [0, 1]$ the
    fraction that closes the gap (1 when it cannot be closed)."""
    short = demand - jnp.sum(p)
    room_up = jnp.sum(p_max - p)
    room_down = jnp.sum(p - p_min)
    # The `where`s keep a zero room from dividing by zero (and its gradient NaN).
    eta_up = jnp.clip(short / jnp.where(room_up > 0, room_up, 1.0), 0.0, 1.0)
    eta_down = jnp.clip(-short / jnp.where(room_down > 0, room_down, 1.0), 0.0, 1.0)
    return jnp.where(short >= 0, p + eta_up * (p_max - p), p - eta_down * (p - p_min))


def _reduced(case: GridCase) -> tuple[np.ndarray, sp.csc_matrix]:
    """`(keep, B_red)`: the non-reference buses and $B_{bus}$ restricted to them."""
    keep = np.flatnonzero(np.arange(case.n_bus) != case.ref_bus)
    B_bus = -case.E[: case.n_bus, case.n_gen :]
    return keep, sp.csc_matrix(B_bus[keep][:, keep])


def ptdf(case: GridCase) -> np.ndarray:
    """The `(n_branch, n_bus)` matrix $M$ with $C y = M (A_g p_g - q)$ for every
    $y$ that balances the buses, the reference bus as slack (its column zero)."""
    keep, _, B_f, lu = _flow_solver(case)
    M = np.zeros((case.n_branch, case.n_bus))
    # lu is of B_red^T: trans="T" solves with B_red.
    M[:, keep] = lu.solve(B_f.T.toarray(), trans="T").T
    return M


_FLOW_SOLVERS: dict = {}


def _flow_solver(case: GridCase) -> tuple:
    """`(keep, A_g, B_f, lu)`: the non-reference buses, the generators' buses
    (sparse), $B_f$ on the non-reference buses and the sparse LU of the reduced
    $B_{bus}$ transposed (the flows are $B_f B^{-\top} x$), built once per grid
    (name and size)."""
    key = (case.name, case.n_bus, case.n_branch)
    if key not in _FLOW_SOLVERS:
        keep, B_red = _reduced(case)
        A_g = case.E[: case.n_bus, : case.n_gen].tocsr()
        B_f = case.C[:, case.n_gen :].tocsc()[:, keep].tocsr()
        _FLOW_SOLVERS[key] = keep, A_g, B_f, spla.splu(sp.csc_matrix(B_red.T))
    return _FLOW_SOLVERS[key]


def injections_matrix(case: GridCase) -> np.ndarray:
    """`A_g`, `(n_bus, n_gen)`: the bus of each generator."""
    return case.E[: case.n_bus, : case.n_gen].toarray()


def center(case: GridCase, mean_load: np.ndarray) -> np.ndarray:
    """A solver-free centre: the mean total load shared in proportion to each
    unit's range (`repair` of the lower bounds), and its DC power flow's angles."""
    q = case.q(mean_load)[: case.n_bus]
    total = float(np.sum(q))
    p = np.asarray(repair(case.p_min, case.p_min, case.p_max, total), np.float64)
    keep, B_red = _reduced(case)
    theta = np.zeros(case.n_bus)
    theta[keep] = spla.spsolve(B_red, (injections_matrix(case) @ p - q)[keep])
    return np.concatenate([p, theta])


def make_model(case: GridCase, method: str, *, width, depth, key, scaling=None):
    """`(model, frozen)`: the untrained float32 network of `method` (loads to $y$,
    or to $p_g$) and its selector for `pe.trainable_filter`; `scaling` from
    `scalings` (`None`: placeholders, for `pe.load`'s skeleton)."""
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}, not {method!r}.")
    n_out = case.dim if method.startswith("ours") else case.n_gen
    if scaling is None:  # placeholders, for `pe.load`'s skeleton
        scaling = dict(x_mean=np.zeros(case.n_bus), x_std=np.ones(case.n_bus))
        scaling |= dict(y_center=np.zeros(n_out), y_scale=np.ones(n_out))
    f32 = {k: jnp.asarray(v, jnp.float32) for k, v in scaling.items()}
    mlp = eqx.nn.MLP(case.n_bus, n_out, width, depth, activation=jax.nn.relu, key=key)
    backbone = Standardised(mlp, Scaling(**f32))
    if method.startswith("ours"):
        net = pe.HardConstrainedNet(backbone, projector(case))
        return net, lambda m: m.backbone.scaling
    if method == "e2elr":
        data = (case.p_min, case.p_max, np.sum(case.p_fixed))
        model = E2ELR(backbone, *(jnp.asarray(a, jnp.float32) for a in data))
        return model, lambda m: (m.backbone.scaling, m.p_min, m.p_max, m.fixed)
    return backbone, lambda m: m.scaling


def scalings(case: GridCase, method: str, train_loads, train_optima=None) -> dict:
    """The fixed scalings of `method`'s backbone: the training loads' mean and
    spread per bus (1 where constant); outputs around 0 (E2ELR's logits), else
    `center` (the mean optimum for `ours-sup`) in tenths of each unit's range
    and of the angles' spread.
    """
    x_mean = train_loads.mean(axis=0)
    x_std = train_loads.std(axis=0)
    x_std = np.where(x_std > 1e-9 * max(float(x_std.max()), 1.0), x_std, 1.0)
    if method == "e2elr":
        out = dict(y_center=np.zeros(case.n_gen), y_scale=np.ones(case.n_gen))
    else:
        y_c = center(case, x_mean)
        if method == "ours-sup" and train_optima is not None:
            y_c = np.asarray(train_optima, np.float64).mean(axis=0)
        p_scale = 0.1 * np.maximum(case.p_max - case.p_min, 1e-3)
        theta_scale = np.full(case.n_bus, 0.1 * max(np.std(y_c[case.n_gen :]), 1e-3))
        y_scale = np.concatenate([p_scale, theta_scale])
        if method == "mlp":
            y_c, y_scale = y_c[: case.n_gen], p_scale
        out = dict(y_center=y_c, y_scale=y_scale)
    return dict(x_mean=x_mean, x_std=x_std, **out)


class Grid(eqx.Module):
    """The float32 grid data and scales of the losses (arguments, not constants)."""

    c2: jax.Array
    c1: jax.Array
    A_g: jax.Array | None
    M: jax.Array | None
    flow_lower: jax.Array
    flow_upper: jax.Array
    p_min: jax.Array
    p_max: jax.Array
    cost_scale: float = eqx.field(static=True)
    penalty_unit: float = eqx.field(static=True)

    @classmethod
    def of(cls, case: GridCase, scaling: dict, flows: bool = True) -> Grid:
        """The arrays of `case`; the cost scale is the `center` dispatch's cost,
        the penalty unit its largest marginal cost over that scale. Without
        `flows`, no `A_g` and `M` (dense: the PTDF of case_ACTIVSg25k is 3 GB in
        float32), which only the losses that penalise overloads use."""
        p_c = center(case, scaling["x_mean"])[: case.n_gen]
        scale = float(case.cost(p_c))
        marginal = float(np.max(2 * case.cost_quad * p_c + case.cost_lin))
        f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
        dense = (injections_matrix(case), ptdf(case)) if flows else (None, None)
        arrays = (case.flow_lower, case.flow_upper, case.p_min, case.p_max)
        return cls(
            f32(case.cost_quad), f32(case.cost_lin),
            *(None if a is None else f32(a) for a in dense),
            *map(f32, arrays), abs(scale), marginal / abs(scale),
        )  # fmt: skip


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
    """`predict(x, q) -> (p_g, y, result)` in inference mode (`y`, `result`: `None`
    without our layer), one jitted function for every network (compiled once)."""
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


def _flows(case: GridCase, p: np.ndarray, loads: np.ndarray):
    """`(overload_mw, loading)`: per hour, the largest overload (MW, 0 if none)
    and the largest |flow| / rating, from the dispatch's DC flows: the angles
    of the injections by the reduced $B_{bus}$'s sparse LU, then $B_f$ (the
    flows `ptdf` gives, without its dense matrix: 6 GB on case_ACTIVSg25k)."""
    keep, A_g, B_f, lu = _flow_solver(case)
    injections = (A_g @ p.T).T - case.q(loads)[:, :-1]
    flow = (B_f @ lu.solve(np.ascontiguousarray(injections[:, keep].T))).T
    over = np.maximum(flow - case.flow_upper, 0) + np.maximum(case.flow_lower - flow, 0)
    loading = np.abs(flow + case.f_shift) / case.f_max
    return over.max(axis=1) * case.base_mva, loading.max(axis=1)


def _percentiles(values: np.ndarray) -> dict:
    """Mean, median, 99th percentile and max of `values` (NaN when empty)."""
    if values.size == 0:
        return dict(mean=np.nan, p50=np.nan, p99=np.nan, max=np.nan)
    return dict(
        mean=float(np.mean(values)), p50=float(np.median(values)),
        p99=float(np.percentile(values, 99)), max=float(np.max(values)),
    )  # fmt: skip


def evaluate(method: str, model, data: HourlyData, part, *, per_hour=False, repeats=0):
    """Scores `model` of `method` on the solved hours of `part`: the gaps,
    overloads (MW), imbalance and bound violations and, for our layer, the share
    `successful`, the normalised residual over eps32 and `infeasible_hours`;
    `repeats` > 0 adds the time at batch `CHUNK`, `per_hour` each hour's numbers."""
    case = data.case
    hours = data.solved(part)
    predict = predictor(method, model)
    p, y, result = _run(predict, data, hours)
    cost = case.cost(p)
    gaps = (cost - data.cost_opt[hours]) / np.abs(data.cost_opt[hours])
    over, loading = _flows(case, p, data.loads[hours])
    demand = case.q(data.loads[hours])[:, :-1].sum(axis=1)
    bounds = np.maximum(p - case.p_max, 0) + np.maximum(case.p_min - p, 0)
    record = dict(
        n_hours=int(hours.size), gap_mean=float(np.mean(gaps)) if gaps.size else np.nan,
        gap=_percentiles(gaps), overload_mw=_percentiles(over),
        overloaded_share=float(np.mean(over > 1e-3)) if over.size else np.nan,
        imbalance_mw_max=float(np.max(np.abs(p.sum(1) - demand)) * case.base_mva),
        bound_violation_mw_max=float(bounds.max() * case.base_mva),
    )  # fmt: skip
    if y is not None:
        resid = max_residuals(case, y, data.loads[hours])
        record.update(
            successful=float(np.mean(result == pe.RESULTS.successful._value)),
            residual_over_eps32=_percentiles(resid / EPS32),
            infeasible_hours=_infeasible(predict, data, part),
        )
    if per_hour:
        p_opt = data.y_opt[hours, : case.n_gen].astype(np.float64)
        _, opt_loading = _flows(case, p_opt, data.loads[hours])
        record["per_hour"] = dict(
            hour=hours.tolist(), gap=gaps.tolist(), cost=cost.tolist(),
            loading=loading.tolist(), opt_cost=data.cost_opt[hours].tolist(),
            opt_loading=opt_loading.tolist(),
            time=[str(t) for t in data.hours[hours]],
        )  # fmt: skip
    if repeats > 0:
        record["timing"] = _timed(predict, data, hours, repeats)
    return record


def _infeasible(predict, data: HourlyData, part: np.ndarray, most: int = 64) -> dict:
    """What the layer flags on (at most `most` of) the infeasible hours of
    `part`, and whether its outputs are finite."""
    every = part[data.status[part] == INFEASIBLE]
    if every.size == 0:
        return dict(n_hours=0)
    hours = every[np.linspace(0, every.size - 1, min(most, every.size)).astype(int)]
    _, y, result = _run(predict, data, hours)
    total = data.loads[every].sum(1) + data.case.p_fixed.sum()
    share = lambda flag: float(np.mean(result == flag._value))  # noqa: E731
    return dict(
        n_hours=int(every.size), n_run=int(hours.size),
        below_total_pmin=int(np.sum(total < np.sum(data.case.p_min))),
        flagged_infeasible=share(pe.RESULTS.infeasible),
        flagged_max_steps=share(pe.RESULTS.max_steps_reached),
        successful=share(pe.RESULTS.successful), finite=bool(np.all(np.isfinite(y))),
    )  # fmt: skip


def timed_batch_inputs(data: HourlyData, hours: np.ndarray) -> tuple:
    """`(x, q)`: the loads and balance right-hand sides of the timed batch,
    `CHUNK` of `hours` (tiled if fewer), float32."""
    idx = np.resize(hours, CHUNK)
    x = jnp.asarray(data.loads[idx], jnp.float32)
    return x, jnp.asarray(data.case.q(data.loads[idx]), jnp.float32)


def _timed(predict, data: HourlyData, hours: np.ndarray, repeats: int) -> dict:
    """The time of `predict` on a batch of `CHUNK` test hours (tiled if fewer)."""
    x, q = timed_batch_inputs(data, hours)
    # The first call compiled and ran the batch: it is the warm-up.
    _, timed = timed_batch(lambda: predict(x, q), CHUNK, repeats, warmup=0)
    t = timed["batch_s"]
    return dict(
        timed, per_instance_ms_lq=1e3 * t["lq"] / CHUNK,
        per_instance_ms_uq=1e3 * t["uq"] / CHUNK,
        same_run=_same_run(lambda: predict(x, q), data, hours, repeats),
    )  # fmt: skip


# Clarabel's hours per turn of `_same_run`.
_SAME_RUN_HOURS = 8


def _same_run(call, data: HourlyData, hours: np.ndarray, repeats: int) -> dict:
    """A batch of `call` and Clarabel's `solve()` (default settings, one thread,
    as `time_solvers`) on `_SAME_RUN_HOURS` of the same hours, in turn
    `repeats` times: per-instance medians and their ratio, which the
    machine's drift between separate commands does not move."""
    ours, clarabel = [], []
    for r in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(call())
        ours.append(1e3 * (time.perf_counter() - start) / CHUNK)
        turn = np.resize(np.roll(hours, -r * _SAME_RUN_HOURS), _SAME_RUN_HOURS)
        solves = [clarabel_dcopf(data.case, data.loads[h])[1] for h in turn]
        clarabel.append(1e3 * float(np.mean(solves)))
    ours_ms, clarabel_ms = float(np.median(ours)), float(np.median(clarabel))
    return dict(
        ours_ms=ours_ms, clarabel_ms=clarabel_ms, ratio=ours_ms / clarabel_ms,
        repeats=repeats, clarabel_hours=_SAME_RUN_HOURS,
    )  # fmt: skip
