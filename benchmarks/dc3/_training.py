"""The training loop shared by every network method (ours, reference, baselines).

Every network method trains the same backbone, an MLP with two hidden layers of
200 ReLU units, with Adam on the self-supervised loss, shuffling the training
contexts each epoch with `np.random.default_rng(seed)`. Only the layer after the
backbone and the loss differ, so they are the arguments here.
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

from ._data import Dataset
from ._harness import Run

TRAINING_KEYS = (
    "epochs",
    "batch_size",
    "lr",
    "lr_schedule",
    "validate_every",
    "max_time_s",
)


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


def optimiser(config: dict, total_steps: int) -> optax.GradientTransformation:
    """Adam at `config["lr"]`, constant or with a cosine decay to 1% of it."""
    schedule = config.get("lr_schedule", "constant")
    if schedule == "constant":
        return optax.adam(config["lr"])
    if schedule == "cosine":
        decay = optax.cosine_decay_schedule(config["lr"], max(total_steps, 1), 0.01)
        return optax.adam(decay)
    raise ValueError(f"`lr_schedule` must be 'constant' or 'cosine', got {schedule!r}.")


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


def plan(data, config: dict) -> Plan:
    """The `Plan` for `data` and `config` (`batch_size`, `epochs`,
    `validate_every`, `max_time_s`).

    `data` is a DC3 `Dataset` (fixed training contexts `X_train`, shuffled each
    epoch) or any object whose `X_train` is `None` and which has
    `sample_train(rng, n)`: then each epoch is one fresh batch of `batch_size`
    contexts (the protocol of the paper's App. B.4).
    """
    epochs = config["epochs"]
    every = config.get("validate_every") or max(1, epochs // 50)
    max_time = config.get("max_time_s")
    if getattr(data, "X_train", None) is None:
        batch = config["batch_size"]
        return Plan(None, batch, batch, 1, epochs, every, max_time)
    X_train = jnp.asarray(data.X_train, jnp.result_type(float))
    n = X_train.shape[0]
    batch = min(config["batch_size"], n)
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


def fit_network(
    model,
    data: Dataset,
    config: dict,
    seed: int,
    run: Run,
    loss: Callable,
    predict: Callable,
    filter_spec=None,
):
    """Train `model` with minibatch Adam and record validation curves.

    **Arguments:**

    - `model`: an Equinox model.
    - `data`: the `Dataset`; training uses `data.X_train` (or fresh batches from
        `data.sample_train`, see `plan`).
    - `config`: needs `epochs`, `batch_size`, `lr`; optional `lr_schedule`
        (`"constant"` or `"cosine"`), `validate_every` (epochs between validation
        points, default about 50 points in all) and `max_time_s` (stop once the
        training time exceeds it, after the current epoch).
    - `seed`: seeds the shuffling.
    - `run`: the `Run` that times, shows progress and records curves.
    - `loss`: `loss(model, X) -> scalar`, on a batch of contexts.
    - `predict`: `predict(model, X) -> Y` in inference mode, for validation.
    - `filter_spec`: what to train (default `pinet_eqx.trainable_filter(model)`).

    **Returns:** the trained model.
    """
    schedule = plan(data, config)
    epochs, every, max_time = schedule.epochs, schedule.every, schedule.max_time
    run.set_total(epochs * schedule.per_epoch)

    spec = pe.trainable_filter(model) if filter_spec is None else filter_spec
    params, static = eqx.partition(model, spec)
    optim = optimiser(config, epochs * schedule.per_epoch)
    opt_state = optim.init(params)

    @eqx.filter_jit
    def step(params, opt_state, X):
        value, grads = eqx.filter_value_and_grad(
            lambda p: loss(eqx.combine(p, static), X)
        )(params)
        updates, opt_state = optim.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, value

    def validate(epoch):
        model = eqx.nn.inference_mode(eqx.combine(params, static))
        run.validate(lambda X: predict(model, X), epoch)

    rng = np.random.default_rng(seed)
    for epoch in range(1, epochs + 1):
        for X in epoch_batches(schedule, data, rng):
            if run.steps == 0:
                # The first step traces and compiles: timed on its own.
                t0 = time.perf_counter()
                params, opt_state, value = step(params, opt_state, X)
                jax.block_until_ready(value)
                run.first_step(time.perf_counter() - t0)
            else:
                params, opt_state, value = step(params, opt_state, X)
            run.step(value)
        done = max_time is not None and run.elapsed() >= max_time
        if epoch % every == 0 or epoch == epochs or done:
            validate(epoch)
        if done:
            break
    return eqx.combine(params, static)
