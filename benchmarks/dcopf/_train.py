"""A self-supervised DC-OPF proxy: loads in, dispatch out, feasible by design.

An MLP maps the scaled loads to a correction of the base-case dispatch, the
projection layer makes it feasible, and the loss is the generation cost. The
test outputs (inference mode) are compared with Clarabel's DC-OPF optimum: the
optimality gap and the issue's normalised row residual. On the PEGASE cases
every generator costs 1 per MW, so every feasible dispatch has a zero gap
whatever it learnt; the record says so (`cost_constant_on_set`).
"""

from __future__ import annotations

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import pinet_eqx as pe

from .._common import provenance
from ._fixture import GridCase, sample_loads
from ._projection import EPS32, max_residuals, projector, share_successful


def train(
    case: GridCase,
    *,
    steps: int = 300,
    batch: int = 64,
    n_test: int = 32,
    seed: int = 0,
    lr: float = 1e-3,
    distance_weight: float = 0.0,
) -> dict:
    """Train the proxy in float32 on this CPU; returns a JSON-able record.
    `distance_weight` > 0 adds that times the mean squared distance from the raw
    outputs to the layer's, in spreads (zero at the optimum)."""
    from tqdm.auto import tqdm

    from ._data import dcopf_clarabel

    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    proj = projector(case)
    build_s = time.perf_counter() - start
    y_base = dcopf_clarabel(case, case.p_d)[0]
    spread = float(np.std(y_base))
    scale_in = np.where(np.abs(case.p_d) > 0, np.abs(case.p_d), 1.0)
    c2 = jnp.asarray(case.cost_quad, jnp.float32)
    c1 = jnp.asarray(case.cost_lin, jnp.float32)
    n_gen = case.n_gen

    def cost(y):
        p = y[:n_gen]
        return jnp.sum(c2 * p * p + c1 * p)

    backbone = eqx.nn.MLP(
        case.n_bus, case.dim, 256, 2, key=jax.random.key(seed), activation=jax.nn.gelu
    )
    y0 = jnp.asarray(y_base, jnp.float32)

    class Proxy(eqx.Module):
        mlp: eqx.nn.MLP

        def __call__(self, x):
            return y0 + spread * 0.1 * self.mlp(x)

    net = pe.HardConstrainedNet(Proxy(backbone), proj)
    params, static = eqx.partition(net, pe.trainable_filter(net))
    opt = optax.adam(lr)
    state = opt.init(params)

    def features(p_d):
        return jnp.asarray(p_d / scale_in, jnp.float32)

    @eqx.filter_jit
    def step(params, state, x, q):
        def loss(params):
            model = eqx.combine(params, static)
            raw = jax.vmap(model.backbone)(x)
            ys = jax.vmap(lambda r, q: model.projector(r, q=q))(raw, q)
            value = jnp.mean(jax.vmap(cost)(ys))
            if distance_weight:
                gap = (raw - ys) / spread
                value = value + distance_weight * jnp.mean(jnp.sum(gap * gap, -1))
            return value

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return eqx.apply_updates(params, updates), state, value

    losses = []
    t0 = time.perf_counter()
    first_step_s = None
    bar = tqdm(range(steps), desc=f"{case.name} training", unit="step")
    for _ in bar:
        p_d = sample_loads(case, batch, rng)
        params, state, value = step(
            params, state, features(p_d), jnp.asarray(case.q(p_d), jnp.float32)
        )
        losses.append(float(value))
        bar.set_postfix(loss=f"{losses[-1]:.6g}", refresh=False)
        if first_step_s is None:
            first_step_s = time.perf_counter() - t0
    train_s = time.perf_counter() - t0

    model = eqx.nn.inference_mode(eqx.combine(params, static))
    p_test = sample_loads(case, n_test, rng)
    raw = jax.jit(jax.vmap(model.backbone))(features(p_test))
    sol = jax.jit(jax.vmap(lambda y, q: model.projector.solve(y, q=q)))(
        raw, jnp.asarray(case.q(p_test), jnp.float32)
    )
    ys = np.asarray(sol.y, np.float64)
    # How far the trained network's raw outputs land from the set, in units of
    # the spread of the base-case dispatch (the suite's near ones are 0.1).
    distance = np.linalg.norm(np.asarray(raw, np.float64) - ys, axis=1) / (
        spread * np.sqrt(case.dim)
    )
    optima = [dcopf_clarabel(case, p_d)[1] for p_d in p_test]
    gaps = [(case.cost(y[:n_gen]) - c) / abs(c) for y, c in zip(ys, optima)]
    resid = max_residuals(case, ys, p_test) / EPS32
    return dict(
        case=case.name,
        steps=steps,
        batch=batch,
        distance_weight=distance_weight,
        build_s=build_s,
        first_step_s=first_step_s,
        train_s=train_s,
        total_s=build_s + train_s,
        loss_first=losses[0],
        loss_last=losses[-1],
        gap_mean=float(np.mean(gaps)),
        gap_max=float(np.max(gaps)),
        normalised_residual_over_eps32_max=float(np.max(resid)),
        gaps=[float(g) for g in gaps],
        normalised_residuals_over_eps32=resid.tolist(),
        raw_distance_in_spreads_median=float(np.median(distance)),
        raw_distance_in_spreads_max=float(np.max(distance)),
        test_successful=share_successful(sol),
        cost_constant_on_set=bool(
            np.all(case.cost_quad == 0) and np.ptp(case.cost_lin) == 0
        ),
        machine=provenance.machine(),
    )
