r"""DC3 (Donti, Rolnick and Kolter, ICLR 2021), a clean-room JAX reimplementation
from the paper's description.

The network predicts the partial variables $z$; the equality completion gives
$y_\text{dep} = A_\text{dep}^{-1}(x - A_\text{part} z)$; the inequality correction
takes gradient steps with momentum on $\|\max(G y - h, 0)\|^2$ in $z$; the soft
loss $J(y) + \lambda((1 - f)\|\max(G y - h, 0)\|^2 + f\|A y - x\|^2)$ is
differentiated through both. The network is DC3's MLP (linear, batch norm, ReLU,
dropout) with DC3's hyperparameters. One addition: the dependent columns are
redrawn until the correction is stable at its step size (`make_completion`).
"""

from __future__ import annotations

import dataclasses
import math
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from pinet_eqx.problems import DC3Problem

from .._common.config import TrainingConfig
from .._common.harness import Run, Trained
from .._common.training import optimiser, plan, train_loop
from ._data import Dataset


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(TrainingConfig):
    """DC3's hyperparameters (`corr_lr` 1e-8 from 1000 variables, as tuned)."""

    hidden: int = 200
    n_hidden_layers: int = 2
    dropout: float = 0.2
    batch_norm_momentum: float = 0.1  # PyTorch's BatchNorm1d defaults, as in DC3
    batch_norm_eps: float = 1e-5
    soft_weight: float = 10.0
    soft_weight_eq_frac: float = 0.5
    corr_train_steps: int = 10
    corr_test_max_steps: int = 10
    corr_eps: float = 1e-4
    corr_lr: float = 1e-7
    corr_momentum: float = 0.5
    # A random n_eq x n_eq submatrix of a Gaussian A has a condition number of
    # a few times n_eq; redraw only the rare ill-conditioned tail.
    completion_max_cond: float
    completion_max_tries: int = 100
    # Redraw the columns until the correction is stable at `corr_lr` (see
    # `make_completion`): DC3's fixed step diverges for some draws.
    completion_stable_correction: bool = True
    epochs: int = 1000
    batch_size: int = 200
    lr: float = 1e-4
    validate_every: int | None = 20  # 50 points over the 1000 epochs


def default_config(data: Dataset) -> Config:
    """DC3's hyperparameters for `data`."""
    return Config(
        corr_lr=1e-8 if data.problem.n_var >= 1000 else 1e-7,
        completion_max_cond=100.0 * data.problem.n_eq,
    )


class Completion(eqx.Module):
    r"""The equality completion $y(x, z)$, $y_\text{dep} = D(x - A_\text{part} z)$
    with $D = A_\text{dep}^{-1}$, and the slack $G y - h = G_z z + G_x x - h$;
    `order` puts `[z, y_dep]` back in variable order."""

    A_part: jax.Array
    D: jax.Array
    order: jax.Array
    A: jax.Array
    G_z: jax.Array
    G_x: jax.Array
    h: jax.Array


def make_completion(
    problem: DC3Problem,
    rng: np.random.Generator,
    dtype=None,
    max_cond: float | None = None,
    max_tries: int = 100,
    corr_lr: float | None = None,
    corr_momentum: float = 0.0,
) -> tuple[Completion, dict]:
    r"""Draw the dependent columns of $A$ (at most `max_tries` times) until
    $A_\text{dep}$'s condition number is at most `max_cond` (default `100 * n_eq`)
    and, given `corr_lr`, the correction is stable, $\gamma \|G_z\|_2^2 < 1 + \mu$
    (heavy ball on a Hessian $\preceq 2 G_z^\top G_z$). Returns the `Completion`
    and facts about it."""
    dtype = jnp.result_type(float) if dtype is None else dtype
    A, G, h = problem.A, problem.G, problem.h
    n_eq, n_var = A.shape
    max_cond = 100.0 * n_eq if max_cond is None else max_cond
    best_cond = best_ratio = np.inf
    for tries in range(1, max_tries + 1):
        perm = rng.permutation(n_var)
        dep, part = np.sort(perm[:n_eq]), np.sort(perm[n_eq:])
        cond = np.linalg.cond(A[:, dep])
        best_cond = min(best_cond, cond)
        if cond > max_cond:
            continue
        D = np.linalg.inv(A[:, dep])
        A_part = A[:, part]
        G_x = G[:, dep] @ D
        G_z = G[:, part] - G_x @ A_part
        ratio = 0.0
        if corr_lr is not None and G_z.size:
            ratio = corr_lr * np.linalg.norm(G_z, 2) ** 2 / (1 + corr_momentum)
        best_ratio = min(best_ratio, ratio)
        if ratio < 1:
            break
    else:
        raise ValueError(
            f"No choice of {n_eq} dependent columns of A out of {max_tries} draws "
            f"has a condition number <= {max_cond:g} (the best: {best_cond:.3g}) "
            "and a stable correction, corr_lr * ||G_z||^2 / (1 + corr_momentum) "
            f"< 1 (the best: {best_ratio:.3g}); raise `completion_max_cond` or "
            "`completion_max_tries`, or lower `corr_lr`."
        )
    order = np.argsort(np.concatenate([part, dep]))
    A_part, D, A, G_z, G_x, h = (
        jnp.asarray(a, dtype) for a in (A_part, D, A, G_z, G_x, h)
    )
    completion = Completion(A_part, D, jnp.asarray(order), A, G_z, G_x, h)
    info = {
        "completion_cond": float(cond),
        "correction_stability": float(ratio),
        "completion_draws": tries,
        "dependent_columns": dep.tolist(),
        "n_partial": int(n_var - n_eq),
    }
    return completion, info


def complete(c: Completion, X: jax.Array, Z: jax.Array) -> jax.Array:
    """The completed points $Y$ `(n, n_var)` from contexts `X` and partials `Z`."""
    dep = (X - Z @ c.A_part.T) @ c.D.T
    return jnp.concatenate([Z, dep], axis=1)[:, c.order]


def slack(c: Completion, X: jax.Array, Z: jax.Array) -> jax.Array:
    """$G y - h$ for the completed points, of shape `(n, n_ineq)`."""
    return Z @ c.G_z.T + X @ c.G_x.T - c.h[None, :]


def correct(
    c: Completion,
    X: jax.Array,
    Z: jax.Array,
    *,
    steps: int,
    lr: float,
    momentum: float,
    eps: float | None = None,
) -> jax.Array:
    r"""DC3's inequality correction of `Z`: $d \leftarrow \mu d + \gamma \nabla$,
    $z \leftarrow z - d$ on $\|\max(G y(x, z) - h, 0)\|^2$; exactly `steps` steps
    (training), or with `eps` until the batch's violation is at most `eps` (test)."""
    offset = X @ c.G_x.T - c.h[None, :]  # the slack's part that z does not change

    def violation(Z):
        return jax.nn.relu(Z @ c.G_z.T + offset)

    def step(Z, d, r):
        d = momentum * d + lr * (2.0 * r @ c.G_z)
        return Z - d, d

    if eps is None:

        def body(carry, _):
            Z, d = carry
            return step(Z, d, violation(Z)), None

        (Z, _), _ = jax.lax.scan(body, (Z, jnp.zeros_like(Z)), None, length=steps)
        return Z

    def cond(carry):
        i, _, _, r = carry
        return (i < steps) & (jnp.max(r, initial=0.0) > eps)

    def body_eps(carry):
        i, Z, d, r = carry
        Z, d = step(Z, d, r)
        return i + 1, Z, d, violation(Z)

    init = (jnp.asarray(0), Z, jnp.zeros_like(Z), violation(Z))
    return jax.lax.while_loop(cond, body_eps, init)[1]


class Network(eqx.Module):
    """DC3's MLP: each hidden layer is linear, batch norm, ReLU and dropout; the
    running batch-norm statistics are kept outside the module."""

    weights: tuple[jax.Array, ...]
    biases: tuple[jax.Array, ...]
    scales: tuple[jax.Array, ...]
    shifts: tuple[jax.Array, ...]
    dropout: float = eqx.field(static=True)
    momentum: float = eqx.field(static=True)
    eps: float = eqx.field(static=True)

    def __call__(self, X, stats, *, train: bool, key=None):
        """The partial variables for `X` and the updated running statistics (with
        `train`: batch statistics and dropout, which needs `key`)."""
        H = X
        new_stats = []
        if train and self.dropout > 0:
            # One draw for every layer's mask: on CPU each random call site adds
            # about a second of compilation.
            keep = jax.random.bernoulli(
                key, 1 - self.dropout, (len(stats), X.shape[0], self.scales[0].size)
            )
        for i, (mean, var) in enumerate(stats):
            H = H @ self.weights[i].T + self.biases[i][None]
            if train:
                batch_mean, batch_var = jnp.mean(H, axis=0), jnp.var(H, axis=0)
                n = H.shape[0]
                # PyTorch's convention: the running variance is the unbiased one.
                unbiased = batch_var * (n / max(n - 1, 1))
                mean = (1 - self.momentum) * mean + self.momentum * batch_mean
                var = (1 - self.momentum) * var + self.momentum * unbiased
                H = (H - batch_mean[None]) * jax.lax.rsqrt(batch_var + self.eps)[None]
            else:
                H = (H - mean[None]) * jax.lax.rsqrt(var + self.eps)[None]
            new_stats.append((mean, var))
            H = jax.nn.relu(H * self.scales[i][None] + self.shifts[i][None])
            if train and self.dropout > 0:  # inverted dropout
                H = jnp.where(keep[i], H / (1 - self.dropout), 0.0)
        return H @ self.weights[-1].T + self.biases[-1][None], tuple(new_stats)


def init_network(n_in: int, n_out: int, config: Config, key, dtype):
    r"""A `Network` (PyTorch's initialisation, uniform on $[-1/\sqrt m, 1/\sqrt m]$
    for fan-in $m$, from one draw) and its initial running statistics."""
    width, depth = config.hidden, config.n_hidden_layers
    sizes = [n_in, *[width] * depth, n_out]
    shapes = [((b, a), (b,)) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    total = sum(b * a + b for (b, a), _ in shapes)
    u = jax.random.uniform(key, (total,), dtype, minval=-1.0, maxval=1.0)
    weights, biases, at = [], [], 0
    for (out, fan_in), _ in shapes:
        bound = 1 / math.sqrt(fan_in)
        weights.append(bound * u[at : at + out * fan_in].reshape(out, fan_in))
        at += out * fan_in
        biases.append(bound * u[at : at + out])
        at += out
    scales, shifts = (
        tuple(f(width, dtype) for _ in range(depth)) for f in (jnp.ones, jnp.zeros)
    )
    norm = (config.dropout, config.batch_norm_momentum, config.batch_norm_eps)
    net = Network(tuple(weights), tuple(biases), scales, shifts, *map(float, norm))
    stats = tuple(
        (jnp.zeros(width, dtype), jnp.ones(width, dtype)) for _ in range(depth)
    )
    return net, stats


def fit(data: Dataset, config: Config, seed: int, run: Run) -> Trained:
    """Draw the completion and train DC3's network on the soft loss."""
    dtype = jnp.result_type(float)
    P = data.problem
    rng = np.random.default_rng(seed)  # draws the completion, then the shuffles
    start = time.perf_counter()
    stable = config.corr_lr if config.completion_stable_correction else None
    draws = (config.completion_max_cond, config.completion_max_tries, stable)
    comp, info = make_completion(P, rng, dtype, *draws, config.corr_momentum)
    info["setup_s"] = time.perf_counter() - start
    net, stats = init_network(
        P.n_eq, P.n_var - P.n_eq, config, jax.random.key(seed), dtype
    )
    # Row by row, as the batched objective broadcasts a vector against a matrix,
    # which the tests' strict rank promotion forbids.
    objective = jax.vmap(data.objective_jax(dtype))
    weight, frac = config.soft_weight, config.soft_weight_eq_frac
    corr = {"lr": config.corr_lr, "momentum": config.corr_momentum}

    def soft_loss(net, stats, comp, X, key):
        Z, stats = net(X, stats, train=True, key=key)
        Z = correct(comp, X, Z, steps=config.corr_train_steps, **corr)
        Y = complete(comp, X, Z)
        ineq = jnp.sum(jax.nn.relu(slack(comp, X, Z)) ** 2, axis=1)
        eq = jnp.sum((Y @ comp.A.T - X) ** 2, axis=1)
        penalty = weight * ((1 - frac) * ineq + frac * eq)
        return jnp.mean(objective(Y) + penalty), stats

    optim = optimiser(config, data)

    # Everything is an argument, not a closed-over constant, so that no array is
    # folded into the compiled program.
    @eqx.filter_jit
    def train_step(net, stats, opt_state, key, comp, X):
        key, sub = jax.random.split(key)
        (value, stats), grads = jax.value_and_grad(soft_loss, has_aux=True)(
            net, stats, comp, X, sub
        )
        updates, opt_state = optim.update(grads, opt_state, net)
        return eqx.apply_updates(net, updates), stats, opt_state, key, value

    def step(state, X):
        *state, value = train_step(*state, comp, X)
        return tuple(state), value

    @eqx.filter_jit
    def infer(net, stats, comp, X):
        Z, _ = net(X, stats, train=False)
        Z = correct(
            comp, X, Z, steps=config.corr_test_max_steps, eps=config.corr_eps, **corr
        )
        return complete(comp, X, Z)

    def predictor(state):
        net, stats = state[:2]
        return lambda X: infer(net, stats, comp, jnp.asarray(np.asarray(X), dtype))

    key = jax.random.fold_in(jax.random.key(seed), 1)  # the init used key(seed)
    state = (net, stats, optim.init(net), key)
    state, epochs_done, _ = train_loop(state, step, data, config, rng, run, predictor)
    net = state[0]
    info["epochs_run"] = epochs_done
    info["steps_per_epoch"] = plan(data, config).per_epoch
    info["n_parameters"] = int(
        sum(math.prod(a.shape) for a in jax.tree.leaves(eqx.filter(net, eqx.is_array)))
    )
    return Trained(predict=predictor(state), info=info)
