"""The one training loop shared by every network method (ours, reference, baselines).

Every network method trains the same backbone, an MLP with two hidden layers of
200 ReLU units, with Adam on a self-supervised loss, shuffling the training
contexts each epoch with `np.random.default_rng(seed)` (or drawing a fresh batch
each epoch). `train_loop` runs that schedule, times the first step, validates
and stops on the time budget for all of them; `fit_model` (jitted steps) and
`fit_eager` (a layer that cannot be jitted) wrap it with an Adam step.
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
    mlp = eqx.nn.MLP(
        in_size,
        out_size,
        width_size=200,
        depth=2,
        activation=jax.nn.relu,
        key=jax.random.key(seed),
    )
    return jax.tree_util.tree_map(
        lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, mlp
    )


def optimiser(config: TrainingConfig, total_steps: int) -> optax.GradientTransformation:
    """Adam at `config.lr`, constant or with a cosine decay to 1% of it."""
    if config.lr_schedule == "cosine":
        decay = optax.cosine_decay_schedule(config.lr, max(total_steps, 1), 0.01)
        return optax.adam(decay)
    return optax.adam(config.lr)


class Plan(NamedTuple):
    """The minibatch schedule every training loop follows.

    **Fields:** the training contexts `X_train` (a JAX array of JAX's default
    float; `None` when each epoch draws a fresh batch), their number `n`, the
    `batch` size, the number of batches per epoch `per_epoch` (the last, partial
    batch is used too), `epochs`, `every` (epochs between validation points;
    default about 50 points in all) and `max_time` (stop after the epoch in which
    training time exceeds it; `None`: no limit).
    """

    X_train: jax.Array | None
    n: int
    batch: int
    per_epoch: int
    epochs: int
    every: int
    max_time: float | None


def plan(data, config: TrainingConfig) -> Plan:
    """The `Plan` for `data` and `config`.

    `data` is a DC3 `Dataset` (fixed training contexts `X_train`, shuffled each
    epoch) or any object whose `X_train` is `None` and which has
    `sample_train(rng, n)`: then each epoch is one fresh batch of `batch_size`
    contexts (the protocol of the paper's App. B.4).
    """
    epochs = config.epochs
    every = config.validate_every or max(1, epochs // 50)
    max_time = config.max_time_s
    if getattr(data, "X_train", None) is None:
        batch = config.batch_size
        return Plan(None, batch, batch, 1, epochs, every, max_time)
    X_train = jnp.asarray(data.X_train, jnp.result_type(float))
    n = X_train.shape[0]
    batch = min(config.batch_size, n)
    return Plan(X_train, n, batch, -(-n // batch), epochs, every, max_time)


def epoch_batches(p: Plan, data, rng: np.random.Generator):
    """Yield the training batches of one epoch of plan `p`, drawn with `rng`.

    A permutation of `p.X_train` cut into batches, or, when `p.X_train` is
    `None`, one fresh batch `data.sample_train(rng, p.batch)`.
    """
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
    """Run the epochs of `plan(data, config)` and record the validation curve.

    **Arguments:**

    - `state`: what the steps update (parameters, optimiser state, ...).
    - `step`: `step(state, X) -> (state, loss)` on one batch of contexts.
    - `data`, `config`: see `plan`.
    - `rng`: shuffles the training contexts (or draws the fresh batches).
    - `run`: counts the steps, times the first (trace and compile), validates.
    - `predictor`: `predictor(state) -> predict`, `predict(X) -> Y` for validation.
    - `stop_in_epoch`: check `config.max_time_s` after every step rather than
        every epoch, for steps so slow that one epoch can take many minutes.

    **Returns:** the final state, the epochs done (a fraction when stopped within
    an epoch) and whether the time budget stopped the training.
    """
    schedule = plan(data, config)
    run.set_total(schedule.epochs * schedule.per_epoch)

    def over_time():
        return schedule.max_time is not None and run.elapsed() >= schedule.max_time

    epochs_done, stopped = 0, False
    for epoch in range(1, schedule.epochs + 1):
        for i, X in enumerate(epoch_batches(schedule, data, rng)):
            if run.steps == 0:
                # The first step traces and compiles: timed on its own.
                t0 = time.perf_counter()
                state, loss = step(state, X)
                jax.block_until_ready(loss)
                run.first_step(time.perf_counter() - t0)
            else:
                state, loss = step(state, X)
            run.step(loss)
            stopped = stop_in_epoch and over_time()
            if stopped:
                break
        epochs_done = epoch - 1 + (i + 1) / schedule.per_epoch if stopped else epoch
        stopped = stopped or over_time()
        if epoch % schedule.every == 0 or epoch == schedule.epochs or stopped:
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
    """Train an Equinox model with jitted minibatch Adam steps (`train_loop`).

    **Arguments:**

    - `model`: an Equinox model.
    - `data`, `config`: see `plan`.
    - `seed`: seeds the shuffling.
    - `run`: the `Run` that times, shows progress and records curves.
    - `loss`: `loss(model, X) -> scalar`, on a batch of contexts.
    - `apply`: `apply(model, X) -> Y` on a batch of contexts (JAX arrays), in
        inference mode; it also makes the validation predictions.
    - `apply_single`: `apply_single(model, x) -> y` for one context (default:
        `apply` on a batch of one).
    - `info`: recorded in `Trained.info`.
    - `filter_spec`: what to train (default `pinet_eqx.trainable_filter(model)`,
        which leaves a projector's frozen data alone).

    **Returns:** a `Trained` in inference mode whose predictors take NumPy
    contexts and are jitted with the model as an argument, not a closed-over
    constant, so that its arrays are not folded into the compiled program.
    """
    dtype = jnp.result_type(float)
    batch_predict = eqx.filter_jit(apply)

    def predict(model, X):
        return batch_predict(model, jnp.asarray(X, dtype))

    schedule = plan(data, config)
    spec = pe.trainable_filter(model) if filter_spec is None else filter_spec
    params, static = eqx.partition(model, spec)
    optim = optimiser(config, schedule.epochs * schedule.per_epoch)

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
    """Train `model` through a projection layer that cannot be jitted, with Adam.

    The loop is `train_loop` (same `plan`, batches and validation points), with
    the step built by hand around the eager layer and `max_time_s` checked after
    every step, since one epoch can take many minutes.

    **Arguments:**

    - `model`: the backbone (an Equinox model mapping a context to `y_raw`).
    - `project`: `project(R, X) -> Y`, the eager layer on a batch of raw outputs
        `R` and contexts `X`, differentiable by `jax.vjp`.
    - `loss`: `loss(Y, X) -> scalar`, jit-able.
    - `data`: the data set (see `plan`).
    - `config`: a `TrainingConfig` with `timing_repeats` (and, optionally,
        `timing_batch_rows`) for the inference timing.
    - `seed`: seeds the batch order or the fresh batches.
    - `run`: the harness's `Run`.
    - `info`: recorded in the returned `Trained.info`.

    **Returns:** a `Trained` whose `predict` runs the jitted backbone, then the
    layer.
    """
    dtype = jnp.result_type(float)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    schedule = plan(data, config)
    optim = optimiser(config, schedule.epochs * schedule.per_epoch)

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
    return Trained(
        predict=predict,
        predict_single=lambda x: predict(np.asarray(x)[None])[0],
        info={
            **(info or {}),
            "inference": "jitted MLP, then one CPU cone solve per instance "
            "(diffcp thread pool, no derivative set-up)",
            "epochs_done": epochs_done,
            "stopped_by_max_time": stopped,
        },
        model=eqx.combine(state[0], static),
        # Each batch takes tens of seconds of CPU solves: fewer repeats, one
        # warm-up (which compiles the layer's eager JAX glue for the batch shape).
        timing=InferenceTiming(
            max_repeats=config.timing_repeats,
            warmup=1,
            batch_rows=getattr(config, "timing_batch_rows", None),
        ),
    )
