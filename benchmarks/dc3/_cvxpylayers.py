r"""cvxpylayers (JAX interface) as the projection layer: the paper's baseline.

The backbone is the shared MLP (`_training.backbone`). Its output
$y_{\text{raw}}$ is projected by a `cvxpylayers.jax.CvxpyLayer` around the DPP
problem $\min_y \tfrac12\|y - y_{\text{raw}}\|^2$ s.t. $Ay = x$, $Gy \le h$, with
$y_{\text{raw}}$ and $x$ as parameters. cvxpylayers canonicalises it to a cone
program, solves each instance on the CPU through diffcp and differentiates it with
diffcp's adjoint. Training is self-supervised: the loss is the mean objective.

The solver is Python-side, so the layer cannot be jitted: each step runs the
jitted MLP, the layer eagerly, and the jitted MLP backward and Adam update.
diffcp's default cone solver, ECOS, is not installed; Clarabel (also an
interior-point method, to high accuracy) is used instead.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import _harness
from ._data import Dataset
from ._harness import Run, Trained
from ._training import backbone, epoch_batches, optimiser, plan

MAX_N_VAR = 200  # beyond this, one epoch takes hours on a CPU
_SOLVE_METHOD = "Clarabel"


def default_config(data: Dataset) -> dict:
    """The hyperparameters of the cvxpylayers baseline.

    25 epochs is the paper's budget for this baseline; batch size and learning
    rate are the paper's Pinet configuration (as for the reference method).
    `max_time_s` (seconds of training time, `None` for no limit) stops it after the
    step that reaches it. `solve_method` is diffcp's cone solver.
    `timing_repeats` caps the timed batch inferences (each takes tens of seconds).
    """
    del data
    return {
        "epochs": 25,
        "batch_size": 2048,
        "lr": 1e-2,
        "lr_schedule": "constant",
        "validate_every": 1,
        "max_time_s": None,
        "solve_method": _SOLVE_METHOD,
        "timing_repeats": 3,
    }


def make_projection(A, G, h, solve_method: str = _SOLVE_METHOD):
    r"""A differentiable projection onto $\{y : Ay = x, Gy \le h\}$ by cvxpylayers.

    Solves $\min_y \tfrac12\|y - r\|^2$ s.t. $Ay = x$, $Gy \le h$ for each row of
    a batch $(R, X)$ with diffcp; the vector-Jacobian product comes from diffcp's
    adjoint of the cone program. It runs eagerly (not under `jax.jit`).

    **Arguments:**

    - `A`, `G`, `h`: the constraint data (NumPy, float64).
    - `solve_method`: diffcp's cone solver.

    **Returns:** `project(R, X) -> Y` for batches `(B, n)`, `(B, n_eq)`, or single
    vectors.
    """
    A, G, h = (np.asarray(M, np.float64) for M in (A, G, h))
    return projection_layer(
        A.shape[1], A.shape[0], lambda y, x: [A @ y == x, G @ y <= h], solve_method
    )


def projection_layer(
    n_var: int, n_param: int, constraints: Callable, solve_method: str = _SOLVE_METHOD
):
    r"""A differentiable projection onto $\{y : \text{constraints}(y, x)\}$ by
    cvxpylayers.

    Solves $\min_y \frac12\|y - r\|^2$ subject to `constraints(y, x)` (a list of
    DPP-compliant CVXPY constraints in the variable `y` and the parameter `x`)
    for each row of a batch $(R, X)$ with diffcp; the vector-Jacobian product
    comes from diffcp's adjoint of the cone program. It runs eagerly (not under
    `jax.jit`).

    **Arguments:**

    - `n_var`, `n_param`: the sizes of `y` and `x`.
    - `constraints`: `constraints(y, x) -> list` of CVXPY constraints.
    - `solve_method`: diffcp's cone solver.

    **Returns:** `project(R, X) -> Y` for batches `(B, n_var)`, `(B, n_param)`,
    or single vectors.
    """
    import cvxpy as cp
    from cvxpylayers.jax import CvxpyLayer

    y = cp.Variable(n_var)
    r = cp.Parameter(n_var)
    x = cp.Parameter(n_param)
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(y - r)), constraints(y, x))
    assert problem.is_dpp()  # cvxpylayers needs a DPP problem
    layer = CvxpyLayer(
        problem,
        parameters=[r, x],
        variables=[y],
        solver_args={"solve_method": solve_method},
    )

    def project(R, X):
        return layer(R, X)[0]

    return project


def fit(data: Dataset, config: dict, seed: int, run: Run) -> Trained:
    """Train the shared backbone through the cvxpylayers projection with Adam.

    **Arguments:**

    - `data`: the `Dataset`; at most `MAX_N_VAR` variables.
    - `config`: `default_config(data)`, possibly overridden.
    - `seed`: seeds the initialisation (`jax.random.key`) and the batch order
        (`np.random.default_rng`).
    - `run`: the harness's `Run` (steps, validation, clock).

    **Returns:** a `Trained` whose `predict` runs the jitted MLP, then the layer's
    CPU solves (diffcp's thread pool) without the derivative set-up.
    """
    P = data.problem
    if P.n_var > MAX_N_VAR:
        raise ValueError(
            f"cvxpylayers is limited to problems with at most {MAX_N_VAR} variables "
            f"(this one has {P.n_var}): it solves and differentiates every instance "
            "one at a time with a CPU cone solver, so an epoch would take hours."
        )
    dtype = jnp.result_type(float)
    project = make_projection(P.A, P.G, P.h, config["solve_method"])
    # Row by row: the batched form broadcasts (n,) against (B, n), which
    # jax_numpy_rank_promotion='raise' (our tests' setting) rejects.
    objective = jax.vmap(data.objective_jax(dtype))
    model = backbone(P.n_eq, P.n_var, seed, dtype)
    return fit_eager(
        model,
        project,
        lambda Y, X: jnp.mean(objective(Y)),
        data,
        config,
        seed,
        run,
        info={"solver": f"cvxpylayers (diffcp, {config['solve_method']})"},
    )


def fit_eager(
    model,
    project: Callable,
    loss: Callable,
    data,
    config: dict,
    seed: int,
    run: Run,
    info: dict | None = None,
) -> Trained:
    """Train `model` through a projection layer that cannot be jitted, with Adam.

    The loop follows `_training.fit_network` (same `plan`, batches and
    validation points) but cannot jit the step, and it checks `max_time_s` after
    every step rather than every epoch, since one epoch can take many minutes.

    **Arguments:**

    - `model`: the backbone (an Equinox model mapping a context to `y_raw`).
    - `project`: `project(R, X) -> Y`, the eager layer on a batch of raw outputs
        `R` and contexts `X`, differentiable by `jax.vjp`.
    - `loss`: `loss(Y, X) -> scalar`, jit-able.
    - `data`: the data set (see `_training.plan`).
    - `config`: `epochs`, `batch_size`, `lr`, `lr_schedule`, `validate_every`,
        `max_time_s` and `timing_repeats` (recorded for `time_inference`).
    - `seed`: seeds the batch order or the fresh batches.
    - `run`: the harness's `Run`.
    - `info`: recorded in the returned `Trained.info`.

    **Returns:** a `Trained` whose `predict` runs the jitted backbone, then the
    layer.
    """
    dtype = jnp.result_type(float)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    schedule = plan(data, config)
    epochs, every, max_time = schedule.epochs, schedule.every, schedule.max_time
    per_epoch = schedule.per_epoch
    optim = optimiser(config, epochs * per_epoch)
    opt_state = optim.init(params)

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

    def step(params, opt_state, X):
        # The chain rule by hand around the eager layer: MLP (jit), layer (CPU
        # solves), loss (jit), the layer's adjoint (CPU), the MLP's VJP (jit).
        Y, layer_vjp = jax.vjp(lambda R: project(R, X), raw(params, X))
        loss, g_Y = loss_and_grad(Y, X)
        (g_raw,) = layer_vjp(g_Y)
        params, opt_state = update(params, opt_state, X, g_raw)
        return params, opt_state, loss

    def predictor(params):
        def predict(X):
            X = jnp.asarray(X, dtype)
            return project(raw(params, X), X)

        return predict

    run.set_total(epochs * per_epoch)
    rng = np.random.default_rng(seed)
    epochs_done, stopped = 0, False
    for epoch in range(1, epochs + 1):
        for i, X in enumerate(epoch_batches(schedule, data, rng)):
            params, opt_state, loss = step(params, opt_state, X)
            run.step(loss)
            stopped = max_time is not None and run.elapsed() >= max_time
            if stopped:
                break
        epochs_done = epoch if not stopped else epoch - 1 + (i + 1) / per_epoch
        if epoch % every == 0 or epoch == epochs or stopped:
            run.validate(predictor(params), epochs_done)
        if stopped:
            break

    predict = predictor(params)
    return Trained(
        predict=predict,
        predict_single=lambda x: predict(np.asarray(x)[None])[0],
        info={
            **(info or {}),
            "inference": "jitted MLP, then one CPU cone solve per instance "
            "(diffcp thread pool, no derivative set-up)",
            "epochs_done": epochs_done,
            "stopped_by_max_time": stopped,
            "timing_repeats": config["timing_repeats"],
        },
        model=eqx.combine(params, static),
    )


def time_inference(
    trained: Trained,
    data: Dataset,
    repeats: int = 20,
    batch_size: int = 1024,
    single_repeats: int | None = None,
) -> dict:
    """Single-instance and batch inference times, as `_harness.time_inference`.

    A batch of 1024 takes tens of seconds of CPU solves, so the batch is timed
    `min(repeats, timing_repeats)` times and the single instance five times as
    often, each after one warm-up (which compiles the layer's eager JAX glue for
    the batch shape).
    """
    repeats = min(repeats, trained.info["timing_repeats"])
    return _harness.time_inference(
        trained, data, repeats, batch_size, single_repeats, warmup=1
    )
