r"""The timed calls, built the same way for every layer, their timing, what a
projector was built as and how outputs and gradients compare (float64 NumPy).

A layer maps a batch `(Y, params)` (raw points (B, n), per-instance parameter
values by name) to its projections. Each has `forward(Y, params) -> X` and
`forward_backward(Y, params)`, the value and gradient of $\sum_{ij} W_{ij}
X_{ij}$ ($W$ fixed, random) with respect to the raw points and every
parameter. Ours are jitted; cvxpylayers' cannot be (its solves are in Python),
so its calls run eagerly, as a user calls them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import pinet_eqx as pe

from .._common.timing import time_first
from . import _problems


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
    """`forward`, `forward_backward` and `setup_s` (`build_twice`) of a
    `CvxpyLayer` of `make() -> (problem, y_raw, params, x)`, a fresh problem each
    time (cvxpy caches its canonicalisation on it), `params` passed by name."""
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
    """`timing.time_first` of each of `calls` (`name: fn`) on `args`."""
    return time_first(
        {n: functools.partial(fn, *args) for n, fn in calls.items()}, repeats
    )


def accuracy(problem, inst, X, ref) -> dict:
    """Outputs `X` against Clarabel's `ref`: `max_abs`, the largest objective
    difference (`objective_excess`, ours minus Clarabel's), our `violation` and
    Clarabel's (`ref_violation`)."""
    excess = _problems.objective(inst, X) - _problems.objective(inst, ref)
    return {
        "max_abs": max_abs(X, ref),
        "objective_excess": float(excess.max()),
        "violation": float(_problems.violation(problem, inst, X).max()),
        "ref_violation": float(_problems.violation(problem, inst, ref).max()),
    }


def structure(proj) -> dict:
    """What a projector was built as: its coordinates, rows, form and iterations."""
    P = proj.problem
    return {
        "n_aux": proj.n_aux,
        "n_eq": P.n_eq,
        "n_ineq": P.n_ineq,
        "n_cone": P.n_cone,
        "n_boxed": len(P.box_index),
        "affine_form": type(proj.op).__name__,
        "n_iter": proj.solver.n_iter,
    }


def inference_solve(proj, args):
    """The `ProjectionSolution`s of `proj` in inference mode on `(Y, params)`."""
    infer = proj.with_settings(inference=True)
    return jax.jit(jax.vmap(lambda y, p: infer.solve(y, **p)))(*args)


def iterations(solution) -> dict:
    """Median and max iterations of a batch of `ProjectionSolution`s, and the
    number of instances reported successful."""
    n_iter = np.asarray(solution.n_iter)
    return {
        "median": float(np.median(n_iter)),
        "max": int(n_iter.max()),
        "successful": int((solution.result == pe.RESULTS.successful).sum()),
    }


def gradient_error(g, g_ref) -> dict:
    """`max` and `median` over instances of $\\|g_i - g_{ref,i}\\| /
    \\|g_{ref,i}\\|$, gradient pytrees with leading axis B, all leaves together."""

    def flat(tree):
        leaves = jax.tree_util.tree_leaves(tree)
        B = leaves[0].shape[0]
        return np.concatenate([np.asarray(a).reshape(B, -1) for a in leaves], axis=1)

    a, b = flat(g), flat(g_ref)
    err = np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-300)
    return {"max": float(err.max()), "median": float(np.median(err))}


def max_abs(X, Y) -> float:
    """$\\max |X - Y|$ over every entry, in float64."""
    return float(np.abs(np.asarray(X, np.float64) - np.asarray(Y, np.float64)).max())
