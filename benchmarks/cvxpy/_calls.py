r"""The timed calls, built the same way for every layer, and their timing.

A layer maps a batch `(Y, params)` (raw points (B, n), `params` a dict of
per-instance parameter values with leading axis B) to the projections (B, n).
Two calls are timed for each:

- `forward(Y, params) -> X`;
- `forward_backward(Y, params) -> (loss, (dY, dparams))`, the value and
  gradient of $\sum_{i,j} W_{ij} X_{ij}$ with respect to the raw points and
  every parameter, $W$ a fixed random weighting.

Ours are `jax.jit` of the `jax.vmap`-ed projector (the projector closed over,
as a user writes it); cvxpylayers' layer cannot be jitted (its solves are
Python-side), so its calls are `jax.value_and_grad` of the eager loss, as a
user calls it. `time_all` times each call's first call on its own (for ours,
tracing and compilation included) and then the steady state with
`benchmarks._common.timing.time_first`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from .._common.timing import time_first


def ours(projector, W) -> dict[str, Callable]:
    """`forward` and `forward_backward` of a `pe.Projector`, jitted."""
    W = jnp.asarray(W)

    def forward(Y, params):
        return jax.vmap(lambda y, p: projector(y, **p))(Y, params)

    def loss(Y, params):
        return jnp.sum(W * forward(Y, params))

    return {
        "forward": jax.jit(forward),
        "forward_backward": jax.jit(jax.value_and_grad(loss, argnums=(0, 1))),
    }


def build_twice(build: Callable) -> tuple[object, dict]:
    """`build()` twice: the second result and the seconds of both (`cold`, with
    the one-off costs of a process's first build, such as imports, and `warm`)."""
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        out = build()
        seconds.append(time.perf_counter() - start)
    return out, {"cold": seconds[0], "warm": seconds[1]}


def cvxpylayers(make: Callable, W, solver_args=None) -> dict:
    """`forward` and `forward_backward` of a `cvxpylayers.jax.CvxpyLayer`.

    `make()` returns `(problem, y_raw, params, x)`: a fresh cvxpy problem (cvxpy
    caches its canonicalisation on the problem, so each build gets its own),
    whose parameters are `y_raw` and the list `params` (passed by name in the
    calls' dict), and the variable `x`.

    **Returns:** the two calls and `setup_s`, the layer's construction time
    (`build_twice`).
    """
    from cvxpylayers.jax import CvxpyLayer

    def build():
        problem, y_raw, params, x = make()
        layer = CvxpyLayer(
            problem, parameters=[y_raw, *params], variables=[x], solver_args=solver_args
        )
        return layer, [p.name() for p in params]

    (layer, names), setup_s = build_twice(build)
    W = jnp.asarray(W)

    def forward(Y, values):
        return layer(Y, *(values[name] for name in names))[0]

    def loss(Y, values):
        return jnp.sum(W * forward(Y, values))

    return {
        "forward": forward,
        "forward_backward": jax.value_and_grad(loss, argnums=(0, 1)),
        "setup_s": setup_s,
    }


def as_jax(inst) -> tuple:
    """The batch `(Y, params)` of an `Instances` as JAX arrays (float64)."""
    Y = jnp.asarray(inst.Y)
    params = {k: jnp.asarray(v) for k, v in inst.params.items()}
    return Y, params


def time_all(calls: dict[str, Callable], args: tuple, repeats: int) -> dict:
    """`benchmarks._common.timing.time_first` of each of `calls` (`name: fn`) on
    `args`: the first call alone (`first_s`), then one untimed call and `repeats`
    interleaved ones (seconds), and `load` (the 1-minute load average)."""
    return time_first(
        {n: functools.partial(fn, *args) for n, fn in calls.items()}, repeats
    )
