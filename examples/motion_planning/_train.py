"""Self-supervised training of a planner on any objective, and batched prediction."""

from __future__ import annotations

import time
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import pinet_eqx as pe


def train(
    model: eqx.Module,
    data: tuple,
    objective: Callable,
    *,
    epochs: int,
    lookup: Callable | None = None,
    batch_size: int = 64,
    lr: float = 1e-3,
    residual_weight: float = 0.1,
    seed: int = 0,
    time_budget: float | None = None,
    desc: str = "train",
    disable_bar: bool = False,
):
    """Train `model` on the mean of `objective` over batches of contexts.

    The loss is $\\frac{1}{B} \\sum_b [\\varphi(y_b) + \\mu \\|y_{raw,b} -
    y_b\\|^2]$, with $y_b$ the fleet's projected trajectories and $y_{raw,b}$
    the raw ones: self-supervised, no solver involved. The paper trains on
    $\\varphi$ alone ($\\mu = 0$). We add the projection residual because raw
    rollouts far from the feasible set project onto points with active jerk
    constraints, where the projection's Jacobian is zero in the directions that
    would improve $\\varphi$. We measured it: optimising the raw accelerations
    of 4 contexts of 5 vehicles directly through the projection on the effort
    (float64, Adam) stalls 1-5% above the optimum, with 35 of the 960 jerk
    constraints active (none is at the optimum); with $\\mu = 0.1$ it converges
    to the optimum. The term does not move the optimum: every feasible
    trajectory is the rollout of its own accelerations, so the best raw output
    is feasible, with zero residual. Adam with a cosine
    decay to 1% of `lr`; only the arrays `pe.trainable_filter` selects are
    updated (never the projector's factorisation), and a step with a non-finite
    gradient is skipped and counted. The progress bar shows the loss and the
    largest violation of the batch, as the projector measures it.

    **Arguments:**

    - `model`: a `FleetPlanner` (or any Module with its `raw(x, starts)`,
        `project(Y_raw, starts, goals)` and `violation(Y, starts, goals)`).
    - `data`: `(X, starts, goals)`, the training contexts: the backbone's inputs
        (a PyTree with a leading batch axis) and `(n, N, 2)` arrays.
    - `objective`: $\\varphi(Y, x)$ of one fleet's trajectories `Y`, `(N, d)`,
        and its backbone input `x`, returning a scalar.
    - `epochs`, `batch_size`, `lr`, `seed`: the schedule and the shuffling.
    - `lookup`: a Module mapping a batch of stored inputs to the backbone's
        inputs inside the jitted step (e.g. `MapTable`: map indices to maps);
        `None` feeds `X` as it is.
    - `residual_weight`: $\\mu$, summed over the fleet's coordinates.
    - `time_budget`: if given, stop after the first step that ends past this many
        seconds (compilation included).
    - `desc`, `disable_bar`: the progress bar's label, and switching it off.

    **Returns:** `(model, info)`, with `info` a dict: `seconds` (the training
    wall-clock time, compilation included), `steps`, `skipped_steps`,
    `stopped_by_budget`, and the `history` of `(step, seconds, loss, max_cv)`
    recorded every few steps.
    """
    X, starts, goals = data
    n = len(starts)
    n_batches = max(n // batch_size, 1)
    total = epochs * n_batches
    params, static = eqx.partition(model, pe.trainable_filter(model))
    schedule = optax.cosine_decay_schedule(lr, total, alpha=0.01)
    optim = optax.apply_if_finite(optax.adam(schedule), max_consecutive_errors=20)
    opt_state = optim.init(params)

    def loss_fn(params, lookup, x, s, g):
        model = eqx.combine(params, static)
        x = _lookup(lookup, x)
        Y_raw = jax.vmap(model.raw)(x, s)
        Y = jax.vmap(model.project)(Y_raw, s, g)
        cv = jax.vmap(model.violation)(jax.lax.stop_gradient(Y), s, g)
        loss = jax.vmap(objective)(Y, x)
        if residual_weight:
            loss = loss + residual_weight * jnp.sum((Y_raw - Y) ** 2, axis=(-2, -1))
        return jnp.mean(loss), jnp.max(cv)

    @eqx.filter_jit
    def step(params, opt_state, lookup, x, s, g):
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, cv), grads = grad_fn(params, lookup, x, s, g)
        updates, opt_state = optim.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss, cv

    rng = np.random.default_rng(seed)
    history = []
    done = 0
    stopped = False
    start = time.perf_counter()
    with tqdm(total=total, desc=desc, unit="step", disable=disable_bar) as bar:
        for _ in range(epochs):
            order = rng.permutation(n)
            for i in range(n_batches):
                idx = order[i * batch_size : (i + 1) * batch_size]
                batch = jax.tree.map(lambda a: a[idx], (X, starts, goals))
                params, opt_state, loss, cv = step(params, opt_state, lookup, *batch)
                done += 1
                bar.update()
                if done % 10 == 0 or done == total:
                    loss, cv = float(loss), float(cv)
                    elapsed = time.perf_counter() - start
                    history.append((done, elapsed, loss, cv))
                    bar.set_postfix_str(f"loss {loss:.4g}, max CV {cv:.1e}")
                if (
                    time_budget is not None
                    and time.perf_counter() - start > time_budget
                ):
                    stopped = True
                    break
            if stopped:
                break
    jax.block_until_ready(params)
    info = {
        "seconds": time.perf_counter() - start,
        "steps": done,
        "skipped_steps": int(opt_state.total_notfinite),
        "stopped_by_budget": stopped,
        "history": history,
    }
    return eqx.combine(params, static), info


def predict(
    model: eqx.Module,
    X,
    starts,
    goals,
    chunk: int = 256,
    lookup: Callable | None = None,
) -> np.ndarray:
    """The model's trajectories in inference mode (`n_iter_test` projection
    iterations), in chunks of contexts, as a NumPy array `(n, N, d)`; `lookup`
    as in `train`."""
    model = eqx.nn.inference_mode(model)
    out = []
    for i in range(0, len(starts), chunk):
        part = jax.tree.map(lambda a: a[i : i + chunk], (X, starts, goals))
        out.append(np.asarray(_batched(model, lookup, *part)))
    return np.concatenate(out)


def _lookup(lookup, X):
    return X if lookup is None else lookup(X)


@eqx.filter_jit
def _batched(model, lookup, X, starts, goals):
    return jax.vmap(model)(_lookup(lookup, X), starts, goals)
