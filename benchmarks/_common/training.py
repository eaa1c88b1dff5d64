"""The one training loop shared by every network method: the paper's backbone,
Adam on a self-supervised loss, `train_loop` (schedule, first-step timing,
validation, time budget), and `fit_model` (jitted steps) and `fit_eager` (a
layer that cannot be jitted) around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import pinet_eqx as pe

from .config import TrainingConfig
from .harness import Run, Trained
from .timing import InferenceTiming


def backbone(in_size: int, out_size: int, seed: int, dtype) -> eqx.nn.MLP:
    """The paper's backbone: an MLP with two hidden layers of 200 ReLU units."""
    key = jax.random.key(seed)
    mlp = eqx.nn.MLP(in_size, out_size, 200, 2, activation=jax.nn.relu, key=key)
    return jax.tree_util.tree_map(
        lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, mlp
    )


class Plan(NamedTuple):
    """The minibatch schedule: `X_train` (`None`: a fresh batch each epoch), its
    size `n`, `batch` and `per_epoch` batches."""

    X_train: jax.Array | None
    n: int
    batch: int
    per_epoch: int


def plan(data, config: TrainingConfig) -> Plan:
    """The `Plan` for `data` and `config`: `data.X_train` shuffled each epoch, or,
    where it is `None`, one batch `data.sample_train(rng, n)` per epoch (App. B.4)."""
    if getattr(data, "X_train", None) is None:
        return Plan(None, config.batch_size, config.batch_size, 1)
    X_train = jnp.asarray(data.X_train, jnp.result_type(float))
    n = X_train.shape[0]
    batch = min(config.batch_size, n)
    return Plan(X_train, n, batch, -(-n // batch))


def optimiser(config: TrainingConfig, data) -> optax.GradientTransformation:
    """Adam at `config.lr`, constant or with a cosine decay to 1% of it over the
    training steps on `data`."""
    if config.lr_schedule == "cosine":
        steps = max(config.epochs * plan(data, config).per_epoch, 1)
        return optax.adam(optax.cosine_decay_schedule(config.lr, steps, 0.01))
    return optax.adam(config.lr)


def epoch_batches(p: Plan, data, rng: np.random.Generator):
    """Yield the training batches of one epoch of plan `p`, drawn with `rng`."""
    if p.X_train is None:
        yield jnp.asarray(data.sample_train(rng, p.batch), jnp.result_type(float))
        return
    order = jnp.asarray(rng.permutation(p.n))
    for i in range(p.per_epoch):
        yield p.X_train[order[i * p.batch : (i + 1) * p.batch]]


def train_loop(
    state,
    step: Callable,
    data,
    config: TrainingConfig,
    rng: np.random.Generator,
    run: Run,
    predictor: Callable,
    *,
    stop_in_epoch: bool = False,
):
    """Run the epochs of `plan(data, config)` with `step(state, X) -> (state,
    loss)`, validating with `predictor(state)(X)`; `stop_in_epoch` checks the time
    budget after every step. Returns the state, the epochs done and whether the
    time budget stopped training."""
    schedule, epochs, max_time = plan(data, config), config.epochs, config.max_time_s
    every = config.validate_every or max(1, epochs // 50)
    run.set_total(epochs * schedule.per_epoch)

    def over_time():
        return max_time is not None and run.elapsed() >= max_time

    epochs_done, stopped = 0, False
    for epoch in range(1, epochs + 1):
        for i, X in enumerate(epoch_batches(schedule, data, rng)):
            if run.steps == 0:
                # The first step traces and compiles: timed on its own.
                t0 = time.perf_counter()
                state, loss = step(state, X)
                jax.block_until_ready(loss)
                run.first_step_s = time.perf_counter() - t0
            else:
                state, loss = step(state, X)
            run.step(loss)
            stopped = stop_in_epoch and over_time()
            if stopped:
                break
        epochs_done = epoch - 1 + (i + 1) / schedule.per_epoch if stopped else epoch
        stopped = stopped or over_time()
        if epoch % every == 0 or epoch == epochs or stopped:
            run.validate(predictor(state), epochs_done)
        if stopped:
            break
    return state, epochs_done, stopped


def fit_model(
    model,
    data,
    config: TrainingConfig,
    seed: int,
    run: Run,
    loss: Callable,
    apply: Callable,
    apply_single: Callable | None = None,
    *,
    info: dict | None = None,
    filter_spec=None,
) -> Trained:
    """Train an Equinox model with jitted Adam steps on `loss(model, X)` over the
    leaves `filter_spec` selects (default `pe.trainable_filter(model)`). Returns a
    `Trained` in inference mode predicting with `apply(model, X)` (and
    `apply_single`), jitted with the model as an argument."""
    dtype = jnp.result_type(float)
    batch_predict = eqx.filter_jit(apply)

    def predict(model, X):
        return batch_predict(model, jnp.asarray(X, dtype))

    spec = pe.trainable_filter(model) if filter_spec is None else filter_spec
    params, static = eqx.partition(model, spec)
    optim = optimiser(config, data)

    @eqx.filter_jit
    def step(state, X):
        params, opt_state = state
        value, grads = eqx.filter_value_and_grad(
            lambda p: loss(eqx.combine(p, static), X)
        )(params)
        updates, opt_state = optim.update(grads, opt_state, params)
        return (eqx.apply_updates(params, updates), opt_state), value

    def predictor(state):
        model = eqx.nn.inference_mode(eqx.combine(state[0], static))
        return lambda X: predict(model, X)

    rng = np.random.default_rng(seed)
    state = (params, optim.init(params))
    (params, _), _, _ = train_loop(state, step, data, config, rng, run, predictor)
    model = eqx.nn.inference_mode(eqx.combine(params, static))
    single = None
    if apply_single is not None:
        single_predict = eqx.filter_jit(apply_single)

        def single(x):
            return single_predict(model, jnp.asarray(np.asarray(x), dtype))

    return Trained(
        predict=lambda X: predict(model, X),
        predict_single=single,
        info={} if info is None else info,
        model=model,
    )


def fit_eager(
    model,
    project: Callable,
    loss: Callable,
    data,
    config,
    seed: int,
    run: Run,
    info: dict | None = None,
) -> Trained:
    """Train the backbone `model` with Adam through an eager layer `project(R, X)
    -> Y` (differentiable by `jax.vjp`) on `loss(Y, X)`, the time budget checked
    after every step. `config` also gives `timing_repeats` (and
    `timing_batch_rows`)."""
    dtype = jnp.result_type(float)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    optim = optimiser(config, data)

    @jax.jit
    def raw(params, X):
        return jax.vmap(eqx.combine(params, static))(X)

    @jax.jit
    def loss_and_grad(Y, X):
        return jax.value_and_grad(loss)(Y, X)

    @jax.jit
    def update(params, opt_state, X, g_raw):
        # The backbone's VJP is recomputed here: cheaper than carrying it out of jit.
        _, pullback = jax.vjp(lambda p: raw(p, X), params)
        (grads,) = pullback(g_raw)
        updates, opt_state = optim.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def step(state, X):
        # The chain rule by hand around the eager layer: MLP (jit), layer (CPU
        # solves), loss (jit), the layer's adjoint (CPU), the MLP's VJP (jit).
        params, opt_state = state
        Y, layer_vjp = jax.vjp(lambda R: project(R, X), raw(params, X))
        value, g_Y = loss_and_grad(Y, X)
        (g_raw,) = layer_vjp(g_Y)
        return update(params, opt_state, X, g_raw), value

    def predictor(state):
        def predict(X):
            X = jnp.asarray(X, dtype)
            return project(raw(state[0], X), X)

        return predict

    rng = np.random.default_rng(seed)
    state = (params, optim.init(params))
    state, epochs_done, stopped = train_loop(
        state, step, data, config, rng, run, predictor, stop_in_epoch=True
    )
    predict = predictor(state)
    info = {
        **(info or {}),
        "inference": "jitted MLP, then one CPU cone solve per instance "
        "(diffcp thread pool, no derivative set-up)",
        "epochs_done": epochs_done,
        "stopped_by_max_time": stopped,
    }
    # Each batch takes tens of seconds of CPU solves: fewer repeats, one warm-up
    # (which compiles the layer's eager JAX glue for the batch shape).
    rows = getattr(config, "timing_batch_rows", None)
    timing = InferenceTiming(config.timing_repeats, 1, rows)

    def single(x):
        return predict(np.asarray(x)[None])[0]

    return Trained(predict, single, info, eqx.combine(state[0], static), timing)
