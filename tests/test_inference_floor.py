"""With the library's defaults, after training on a small problem, float32
inference reaches the float32 rounding floor of the exact projection, for every
set kind and for per-instance matrices (issue 15).

The floor is the violation of the exact projection (cvxpy + Clarabel, polished
in float64) rounded to float32; violations are computed in float64 from the
float64 data."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    clarabel_project_sets,
    random_instance,
    random_set_spec,
    spec_violation,
    stack_values,
    to_pinet,
    values_of,
)

import pinet_eqx as pe

# The floor is a maximum over contexts of rounding errors, a noisy statistic:
# 64 contexts make it (and ours) stable enough to compare at 1.5x.
D, N_CONTEXTS, N_STEPS = 8, 64, 30
# The bounds: at most 1.5 times the floor and 1e-6 max(1, |data|_inf).
FLOOR_FACTOR, ABSOLUTE = 1.5, 1e-6
KINDS = {
    "polytope": (("eq", "ineq", "box"), {}),
    "soc": (("eq", "soc"), {}),
    "l1": (("eq", "l1"), {}),
    "simplex": (("simplex", "box"), {}),
    "per_instance_matrices": (("eq", "ineq"), {"E": (0, "E"), "b": (0, "b")}),
}


def _data_norm(spec) -> float:
    """max |entry| over the finite numbers of a spec (its matrices and bounds)."""
    values = [
        np.asarray(v, np.float64).ravel()
        for it in spec
        for v in vars(it).values()
        if not isinstance(v, str)
    ]
    flat = np.concatenate(values)
    return float(np.abs(flat[np.isfinite(flat)]).max(initial=0.0))


def _in_float32(spec, parameters):
    """`spec` with its per-instance fields rounded to float32.

    The layer receives per-instance data in float32, and that data is the set it
    projects onto (fixed data, by contrast, is kept in float64 on the host), so
    the ground truth is computed for the same rounded data.
    """
    spec = [dataclasses.replace(it) for it in spec]
    for i, field in parameters.values():
        value = np.asarray(getattr(spec[i], field), np.float64)
        setattr(spec[i], field, value.astype(np.float32).astype(np.float64))
    return spec


def _train(net, X, params, targets):
    """`N_STEPS` Adam steps on the squared distance to `targets`, in float32."""
    optimiser = optax.adam(1e-2)
    state = optimiser.init(eqx.filter(net, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(net, state):
        def loss(net):
            Y = jax.vmap(net)(X, **params)
            return jnp.mean(jnp.sum((Y - targets) ** 2, axis=1))

        grads = eqx.filter_grad(loss)(net)
        updates, state = optimiser.update(grads, state)
        return eqx.apply_updates(net, updates), state

    for _ in range(N_STEPS):
        net, state = step(net, state)
    return net


# The polytope runs in the fast tier; the other kinds take a Clarabel solve per
# context and a training run each.
CASES = [
    kind if kind == "polytope" else pytest.param(kind, marks=pytest.mark.slow)
    for kind in KINDS
]


@pytest.mark.parametrize("kind", CASES)
def test_trained_float32_inference_reaches_the_floor(kind):
    items, parameters = KINDS[kind]
    rng = np.random.default_rng(sorted(KINDS).index(kind))
    spec, y0 = random_set_spec(rng, D, items)
    # Per-instance data: one instance of the set per context.
    specs = [
        _in_float32(
            random_instance(rng, spec, y0, parameters, jitter=0.02)[0], parameters
        )
        if parameters
        else spec
        for _ in range(N_CONTEXTS)
    ]
    stacked = (
        stack_values([values_of(s, parameters) for s in specs]) if parameters else {}
    )
    params = {name: jnp.asarray(v, jnp.float32) for name, v in stacked.items()}
    projector = pe.Projector(to_pinet(spec, parameters))
    backbone = eqx.nn.MLP(4, D, 32, 2, key=jax.random.key(0), dtype=jnp.float32)
    net = pe.HardConstrainedNet(backbone, projector)
    X = jnp.asarray(rng.normal(size=(N_CONTEXTS, 4)), jnp.float32)
    # Targets outside the set, as an optimisation objective would pull them.
    targets = jnp.asarray(y0 + 2 * rng.normal(size=(N_CONTEXTS, D)), jnp.float32)
    net = _train(net, X, params, targets)

    inference = eqx.nn.inference_mode(net)
    Y = np.asarray(jax.jit(jax.vmap(inference))(X, **params), np.float64)
    raw = np.asarray(jax.vmap(net.raw)(X), np.float64)
    assert Y.dtype == np.float64 and np.isfinite(Y).all()
    cv = max(spec_violation(y, s) for y, s in zip(Y, specs))
    exact = [clarabel_project_sets(r, s) for r, s in zip(raw, specs)]
    floor = max(
        spec_violation(np.float32(z).astype(np.float64), s)
        for z, s in zip(exact, specs)
    )
    bound = ABSOLUTE * max(1.0, max(_data_norm(s) for s in specs))
    assert cv <= bound, (kind, cv, bound)
    assert cv <= FLOOR_FACTOR * floor, (kind, cv, floor)
