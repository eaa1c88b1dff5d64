"""A self-supervised DC-OPF proxy (`train`), and one training step of the
baselines where they fit (`baseline`).

`train`: an MLP maps the scaled loads to a correction of the base-case
dispatch, the projection layer makes it feasible, and the loss is the
generation cost. The test outputs (inference mode) are compared with Clarabel's
DC-OPF optimum: the optimality gap and the issue's normalised row residual. On
the PEGASE cases every generator costs 1 per MW, so every feasible dispatch has
a zero gap whatever it learnt; the record says so (`cost_constant_on_set`).

`baseline`: value and gradient of a fixed random weighting of a batch of
projections at the suite's near raw outputs, with respect to them and the loads'
right-hand side; the accuracy against Clarabel's projection and the violation,
in float64; and `train`'s 300 steps at batch 64 extrapolated from one step
(`train_300_steps_s_estimate`; the issue's budget is 10 minutes). The layers:
`CvxpyLayer` at its defaults (diffcp with SCS), float64; the reference
(`pip install --no-deps pinet-hcnn==0.2.0 beartype`), float32, dense matrices
only: the inequalities become one-sided rows $[C; -C; I; -I]$ (infinite bounds
dropped), Ruiz equilibration, 50 forward and 25 backward iterations,
$\\sigma = 10^{-3}$ (the issue's best).
"""

from __future__ import annotations

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

import pinet_eqx as pe

from .._common import provenance, timing
from . import _projection
from ._data import _inequalities, dcopf_clarabel, project_clarabel
from ._fixture import GridCase, sample_loads

TRAIN_STEPS, TRAIN_BATCH = 300, 64


def train(
    case: GridCase, *, steps=TRAIN_STEPS, batch=TRAIN_BATCH, n_test=32, seed=0,
    lr=1e-3, distance_weight=0.0,
) -> dict:  # fmt: skip
    """Train the proxy in float32 on this CPU; returns a JSON-able record.
    `distance_weight` > 0 adds that times the mean squared distance from the raw
    outputs to the layer's, in spreads (zero at the optimum)."""
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    proj = _projection.projector(case)
    build_s = time.perf_counter() - start
    y_base = dcopf_clarabel(case, case.p_d)[0]
    spread = float(np.std(y_base))
    scale_in = np.where(np.abs(case.p_d) > 0, np.abs(case.p_d), 1.0)
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
    step = _step(case, static, opt, spread, distance_weight)

    def features(p_d):
        return jnp.asarray(p_d / scale_in, jnp.float32)

    losses, first_step_s = [], None
    t0 = time.perf_counter()
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
    return dict(
        case=case.name, steps=steps, batch=batch, distance_weight=distance_weight,
        build_s=build_s, first_step_s=first_step_s, train_s=train_s,
        total_s=build_s + train_s, loss_first=losses[0], loss_last=losses[-1],
        **_tested(case, model, features(p_test), p_test, spread),
        cost_constant_on_set=bool(
            np.all(case.cost_quad == 0) and np.ptp(case.cost_lin) == 0
        ),
        machine=provenance.machine(),
    )  # fmt: skip


def _step(case: GridCase, static, opt, spread: float, distance_weight: float):
    """The jitted training step `(params, state, x, q) -> (params, state, loss)`:
    the mean cost of the layer's outputs, plus the distance term."""
    c2 = jnp.asarray(case.cost_quad, jnp.float32)
    c1 = jnp.asarray(case.cost_lin, jnp.float32)

    def cost(y):
        p = y[: case.n_gen]
        return jnp.sum(c2 * p * p + c1 * p)

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

    return step


def _tested(case: GridCase, model, x, p_test, spread: float) -> dict:
    """The trained `model`'s test outputs (features `x`, loads `p_test`) against
    Clarabel's DC-OPF optima: gaps, normalised residuals, raw distances."""
    raw = jax.jit(jax.vmap(model.backbone))(x)
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
    gaps = [(case.cost(y[: case.n_gen]) - c) / abs(c) for y, c in zip(ys, optima)]
    resid = _projection.max_residuals(case, ys, p_test) / _projection.EPS32
    return dict(
        gap_mean=float(np.mean(gaps)), gap_max=float(np.max(gaps)),
        normalised_residual_over_eps32_max=float(np.max(resid)),
        gaps=[float(g) for g in gaps], normalised_residuals_over_eps32=resid.tolist(),
        raw_distance_in_spreads_median=float(np.median(distance)),
        raw_distance_in_spreads_max=float(np.max(distance)),
        test_successful=_projection.share_successful(sol),
    )  # fmt: skip


def baseline(case: GridCase, layer: str, *, batch: int = 8, repeats: int = 2) -> dict:
    """The record of one baseline (`"cvxpylayers"` or `"reference"`) on `case`."""
    rng = np.random.default_rng(0)
    loads = sample_loads(case, batch, rng)
    y_center = project_clarabel(case, np.zeros(case.dim), loads[0])[0]
    Y = _projection.raw_outputs(case, loads, rng, _projection.NEAR, y_center)
    Q = case.q(loads)
    W = rng.normal(size=Y.shape)
    rss0 = provenance.peak_rss_gb()
    start = time.perf_counter()
    if layer == "cvxpylayers":
        forward, dtype = _cvxpylayers(case), jnp.float64
    elif layer == "reference":
        forward, dtype = _reference(case), jnp.float32
    else:
        raise ValueError(f"layer={layer!r}: pass 'cvxpylayers' or 'reference'.")
    build_s = time.perf_counter() - start

    def loss(Y, Q):
        return jnp.sum(jnp.asarray(W, dtype) * forward(Y, Q))

    step = jax.value_and_grad(loss, argnums=(0, 1))
    if layer == "reference":
        step = jax.jit(step)
    args = (jnp.asarray(Y, dtype), jnp.asarray(Q, dtype))
    start = time.perf_counter()
    jax.block_until_ready(step(*args))
    first_s = time.perf_counter() - start
    t = timing.time_calls(lambda: step(*args), repeats=repeats, warmup=0)
    ys = np.asarray(forward(*args), np.float64)
    errors, viols = [], []
    for i in range(batch):
        ref = project_clarabel(case, Y[i], loads[i])[0]
        errors.append(np.abs(ys[i] - ref).max() / np.abs(ref).max())
        viols.append(max(case.residuals(ys[i], loads[i])))
    per_instance = t["median"] / batch
    return dict(
        case=case.name, layer=layer, dtype=jnp.dtype(dtype).name, batch=batch,
        build_s=build_s, peak_rss_gb_after_build=provenance.peak_rss_gb(),
        peak_rss_gb_before=rss0, first_step_s=first_s, step_s=t,
        train_300_steps_s_estimate=TRAIN_STEPS * TRAIN_BATCH * per_instance,
        rel_err_max=float(np.max(errors)), rel_err_median=float(np.median(errors)),
        violation_max=float(np.max(viols)), machine=provenance.machine(),
    )  # fmt: skip


def _cvxpylayers(case: GridCase):
    """`(Y, Q) -> projections` by a `CvxpyLayer` at its defaults."""
    import cvxpy as cp

    from ..cvxpy._measure import cvxpylayers

    def make():
        y = cp.Variable(case.dim, name="y")
        y_raw = cp.Parameter(case.dim, name="y_raw")
        q = cp.Parameter(case.E.shape[0], name="q")
        G, h = _inequalities(case)
        cons = [case.E @ y == q, G @ y <= h]
        problem = cp.Problem(cp.Minimize(cp.sum_squares(y - y_raw)), cons)
        return problem, y_raw, [q], y

    layer = cvxpylayers(make, np.zeros(case.dim))
    return lambda Y, Q: layer["forward"](Y, {"q": Q})


def _reference(case: GridCase):
    """`(Y, Q) -> projections` by the reference, as the module says."""
    from .._common.reference import ReferenceDC3Projector

    G, h = _inequalities(case)
    ref = ReferenceDC3Projector(
        case.E.toarray(), G.toarray(), h, sigma=1e-3, dtype=jnp.float32
    )
    return ref.projection(n_iter=50, n_iter_bwd=25)
