r"""DC-OPF proxies on the ACTIVSg hours: training, the checkpoint, the test record.

`python -m benchmarks.dcopf proxy --method M` trains one method of
`_proxy_models.METHODS` on the feasible training hours, in float32, with Adam
(warm-up, then cosine), keeps the network with the best validation gap
(`pe.save`) and scores the test hours in inference mode (`evaluate`). The
losses, costs divided by the centre's cost so that they are near 1: `ours`, the
paper's recipe, the dispatch cost of the layer's output (`ours-dist` adds
`dist_weight` times the mean squared distance from the raw output to the
layer's, in the backbone's output scale, to keep the projection short);
`ours-sup`, the raw output regressed on Clarabel's optimum (no projection in
training); `e2elr`, cost plus `penalty` times the line overloads, E2ELR's
recipe; `mlp`, cost plus `penalty` times the imbalance, bound violations and
overloads.
"""

from __future__ import annotations

import json
import pathlib
import time
import traceback

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

import pinet_eqx as pe

from .._common import provenance
from ._proxy_data import PARTS, SOLVED, UNSOLVED, HourlyData, evenly, load_hours
from ._proxy_models import Grid, cost_of, evaluate, make_model, scalings

USABLE = (SOLVED, UNSOLVED)  # training hours not found infeasible


def _loss_fn(method: str, static, grid: Grid, settings: dict):
    """`loss(params, x, q, y_opt)` of `method`, averaged over the batch."""
    n_gen = grid.c2.shape[0]

    def cost(p):
        return cost_of(grid, p) / grid.cost_scale

    def overload(p, q):
        assert grid.A_g is not None and grid.M is not None  # Grid.of(flows=True)
        flow = (p @ grid.A_g.T - q[:, :-1]) @ grid.M.T
        upper, lower = grid.flow_upper[None], grid.flow_lower[None]
        over = jax.nn.relu(flow - upper) + jax.nn.relu(lower - flow)
        return jnp.sum(over, axis=-1)

    def loss(params, x, q, y_opt):
        model = eqx.combine(params, static)
        if method == "ours-sup":
            raw = jax.vmap(model.backbone)(x)
            scale = model.backbone.scaling.y_scale
            value = jnp.mean(((raw - y_opt) / scale[None]) ** 2, axis=-1)
        elif method.startswith("ours"):
            raw = jax.vmap(model.backbone)(x)
            y = jax.vmap(lambda r, q: model.projector(r, q=q))(raw, q)
            value = cost(y[:, :n_gen])
            if method == "ours-dist":
                scale = model.backbone.scaling.y_scale
                dist = jnp.mean(((raw - y) / scale[None]) ** 2, axis=-1)
                value = value + settings["dist_weight"] * dist
        else:
            p = jax.vmap(model)(x)
            violation = overload(p, q)
            if method == "mlp":
                imbalance = jnp.abs(jnp.sum(p, -1) - jnp.sum(q[:, :-1], -1))
                lo, hi = grid.p_min[None], grid.p_max[None]
                bounds = jax.nn.relu(p - hi) + jax.nn.relu(lo - p)
                violation = imbalance + jnp.sum(bounds, -1) + violation
            value = cost(p) + settings["penalty"] * violation
        return jnp.mean(value)

    return loss


def _host_failure(error: Exception, k: int, failed: list) -> bool:
    """Lists a step whose host factorisation was singular (others raise); True
    after ten in a row (every later batch then fails too)."""
    text = "".join(traceback.format_exception_only(error))
    if "singular" not in text:
        raise error
    failed.append((k, text.strip().splitlines()[-1][:200]))
    return len(failed) >= 10 and failed[-10][0] == k - 9


def _adam(loss, params, steps: int, lr: float):
    """`(step, state)`: a jitted Adam step on `loss` (a warm-up to `lr` over a
    tenth of the steps, at most 100, then a cosine decay to 2 % of it)."""
    warmup = max(1, min(100, steps // 10))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, lr, warmup, max(steps, warmup + 1), end_value=0.02 * lr
    )
    optim = optax.adam(schedule)

    @eqx.filter_jit
    def step(params, state, x, q, y_opt):
        value, grads = jax.value_and_grad(loss)(params, x, q, y_opt)
        updates, state = optim.update(grads, state, params)
        return eqx.apply_updates(params, updates), state, value

    return step, optim.init(params)


def fit(params, static, loss, sample, validate, *, steps, lr, every, save, seed, desc):
    """`(best_model, info)`: `_adam` on `loss` from `params` (the model with
    `static`) over batches `sample(rng)`, `validate(model)` (lower is better)
    every `every` steps and after the last, `save(model)` of each best so far,
    failed steps skipped (`_host_failure`). `info`: the times, the `history` of
    (step, loss, gap), `best_step` and the failed steps."""
    step, state = _adam(loss, params, steps, lr)
    rng = np.random.default_rng(seed)
    # The best network so far (gap, params, step), and every validation.
    best, history, validate_s = (np.inf, params, 0), [], 0.0

    def keep(k: int, params, value) -> float:
        """Validates `params` after step `k`; keeps (and saves) them if best."""
        nonlocal best, validate_s
        start = time.perf_counter()
        model = eqx.combine(params, static)
        gap = float(validate(model))
        validate_s += time.perf_counter() - start
        history.append((k, float(value), gap))
        if gap < best[0]:
            best = (gap, params, k)
            save(model)
        return gap

    failed, stopped_at, last_ok, first_step_s = [], None, 0, None
    value = jnp.nan
    start = time.perf_counter()
    bar = tqdm(range(1, steps + 1), desc=desc, unit="step")
    for k in bar:
        try:
            params, state, value = step(params, state, *sample(rng))
        except (ValueError, RuntimeError) as error:
            if _host_failure(error, k, failed):
                stopped_at = k
                break
            continue
        last_ok = k
        if first_step_s is None:
            jax.block_until_ready(value)
            first_step_s = time.perf_counter() - start
        if k % every == 0 or k == steps:
            gap = keep(k, params, value)
            bar.set_postfix(loss=f"{float(value):.5g}", val_gap=f"{gap:.3%}")
    if stopped_at is not None and (not history or history[-1][0] < last_ok):
        keep(last_ok, params, value)
    info = dict(
        train_s=time.perf_counter() - start, validate_s=validate_s,
        first_step_s=first_step_s, history=history, best_step=best[2],
        best_val_gap=best[0], failed_steps=[k for k, _ in failed],
        failed_messages=sorted({text for _, text in failed}), stopped_at=stopped_at,
    )  # fmt: skip
    return eqx.combine(best[1], static), info


def _sampler(data: HourlyData, hours: np.ndarray, batch: int, augment: float):
    """Batches of training hours, drawn with replacement; with `augment` > 0 each
    bus's load is multiplied by a mean-one log-normal factor of that spread."""
    case = data.case

    def sample(rng):
        idx = rng.choice(hours, size=batch)
        p_d = data.loads[idx]
        if augment:
            p_d = p_d * np.exp(rng.normal(-0.5 * augment**2, augment, p_d.shape))
        arrays = (p_d, case.q(p_d), np.nan_to_num(data.y_opt[idx]))
        return tuple(jnp.asarray(a, jnp.float32) for a in arrays)

    return sample


def _validation_hours(data: HourlyData, n: int) -> np.ndarray:
    """`n` feasible validation hours, evenly spaced."""
    solved = data.solved(data.val)
    if solved.size == 0:
        raise ValueError(f"No feasible validation hour of {data.case.name}.")
    return np.unique(evenly(solved, n))


def train_proxy(
    data: HourlyData, method: str, *, steps=2000, batch=64, lr=1e-3, width=256,
    depth=3, seed=0, every=200, n_val=64, dist_weight=1e-2, penalty=10.0,
    augment=0.0, checkpoint: pathlib.Path | None = None, fixture=None, init=None,
):  # fmt: skip
    """`(model, info)`: `method` trained on `data` (module docstring), validated
    on `n_val` hours; `penalty` is in units of the centre's largest marginal cost,
    `augment` the spread of per-bus noise on training loads, `fixture` recorded to
    rebuild the grid; `init` a checkpoint of the same grid and network sizes to
    start from (fine-tuning, such as the paper's recipe from the supervised
    proxy), its fixed scalings kept. `info`: `fit`'s, with `build_s`.
    """
    case = data.case
    if method == "ours-sup":
        train_hours = data.solved(data.train)
        optima = data.y_opt[train_hours]
    else:
        # Hours the solver has not reached yet (a partial cache) are kept: the
        # other losses need no optimum. Only the solver's verdicts exclude.
        train_hours = data.train[np.isin(data.status[data.train], USABLE)]
        optima = None
    scaling = scalings(case, method, data.loads[train_hours], optima)
    start = time.perf_counter()
    key = jax.random.key(seed)
    sizes = dict(width=width, depth=depth)
    model, frozen = make_model(case, method, key=key, scaling=scaling, **sizes)
    if init is not None:
        model = _initial(init, model, case.name, data.variant)
    build_s = time.perf_counter() - start
    grid = Grid.of(case, scaling, flows=method in ("e2elr", "mlp"))
    settings = dict(dist_weight=dist_weight, penalty=penalty * grid.penalty_unit)
    params, static = eqx.partition(model, pe.trainable_filter(model, frozen))
    loss = _loss_fn(method, static, grid, settings)
    val_hours = _validation_hours(data, n_val)

    def validate(model):
        return evaluate(method, model, data, val_hours)["gap_mean"]

    hyper = dict(case=case.name, variant=data.variant, method=method, fixture=fixture)

    def save(model):
        if checkpoint is not None:
            pe.save(checkpoint, model, dict(hyper, **sizes))

    sample = _sampler(data, train_hours, batch, augment)
    model, info = fit(
        params, static, loss, sample, validate, steps=steps, lr=lr, every=every,
        save=save, seed=seed, desc=f"{case.name} {method}",
    )  # fmt: skip
    return model, dict(info, build_s=build_s)


def _initial(path: str, model, case: str, variant: str):
    """The network saved at `path` (training mode), checked to have `model`'s
    structure and to be of the grid `case` and `variant`."""
    hyper: dict = {}

    def make(**hyperparameters):
        hyper.update(hyperparameters)
        return make_proxy(**hyperparameters)

    saved = pe.load(path, make)
    if (hyper.get("case"), hyper.get("variant")) != (case, variant):
        raise ValueError(
            f"`init`: {path} is a proxy of {hyper.get('case')} "
            f"({hyper.get('variant')}), not of {case} ({variant})."
        )
    shapes = [
        jax.tree.map(jnp.shape, eqx.filter(m, eqx.is_array)) for m in (saved, model)
    ]
    if shapes[0] != shapes[1]:
        raise ValueError(
            f"`init`: {path} is not a network of this method's shape; train with "
            f"its `width` ({hyper.get('width')}) and `depth` ({hyper.get('depth')})."
        )
    return saved


def make_proxy(case, variant, method, width, depth, fixture=None):
    """The skeleton `pe.load` fills: the network of `method` for the grid."""
    grid_case, key = load_hours(case, variant, fixture=fixture)[0], jax.random.key(0)
    return make_model(grid_case, method, width=width, depth=depth, key=key)[0]


def load_proxy(path: str | pathlib.Path):
    """A network written by `train_proxy`'s checkpoint, ready for inference."""
    return eqx.nn.inference_mode(pe.load(path, make_proxy))


def _scored(method, model, data: HourlyData, n_test, repeats) -> dict:
    """`evaluate` per hour on `n_test` test hours (evenly spaced; `None`: all)."""
    part = evenly(data.test, n_test)
    return evaluate(method, model, data, part, per_hour=True, repeats=repeats)


def reevaluate(data: HourlyData, method: str, *, out, tag=None, repeats=3) -> dict:
    """The record of an earlier `run` with its checkpoint's `test` scored again
    by the library as it is now (`machine` replaced, the training's kept as
    `trained_on`, `reevaluated` set)."""
    path = out / "proxy" / f"{data.stem(method, tag)}.json"
    record = json.loads(path.read_text())
    model = load_proxy(record["checkpoint"])
    n_test = record["settings"].get("n_test")
    record["test"] = _scored(method, model, data, n_test, repeats)
    # The test (and its timing) is of now; the training of the recorded run.
    record["trained_on"] = record.get("trained_on", record["machine"])
    record["machine"] = provenance.machine()
    record["reevaluated"] = True
    return record


def run(data, method: str, *, out, tag=None, n_test=None, repeats=3, **settings):
    """Trains `method` (checkpoint `out/proxy/{data.stem(method, tag)}.eqx`) and
    scores it on `n_test` test hours (`_scored`); a JSON-able record."""
    case = data.case
    checkpoint = out / "proxy" / f"{data.stem(method, tag)}.eqx"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    model, info = train_proxy(data, method, checkpoint=checkpoint, **settings)
    test = _scored(method, model, data, n_test, repeats)
    return dict(
        case=case.name, variant=data.variant, method=method, n_bus=case.n_bus,
        dim=case.dim, settings=dict(settings, n_test=n_test),
        hours={part: data.counts(getattr(data, part)) for part in PARTS}, **info,
        test=test, checkpoint=str(checkpoint), machine=provenance.machine(),
    )  # fmt: skip
