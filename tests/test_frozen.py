"""Frozen data is safe by construction: a plain Equinox training loop, weight
decay included, cannot change the projector."""

import pickle
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pinet_eqx as pe
from pinet_eqx._projector.frozen import Frozen, thaw


def _net(key, d=6, m_eq=2, m_ineq=3, d_in=4):
    rng = np.random.default_rng(0)
    A = rng.normal(size=(m_eq, d))
    G = rng.normal(size=(m_ineq, d))
    lower = np.full(d, -np.inf)  # one-sided: infinite bounds in the projector
    lower[:2] = -1.0
    proj = pe.Projector(
        [
            pe.Equality(A, pe.Parameter("b")),
            pe.AffineInequality(G, upper=np.ones(m_ineq)),
            pe.Box(lower, np.inf),
        ]
    )
    mlp = eqx.nn.MLP(d_in, d, 16, 1, key=key)
    return pe.HardConstrainedNet(mlp, proj), A


def _frozen_leaves(proj):
    return [
        leaf
        for leaf in jax.tree.leaves(proj, is_leaf=lambda x: isinstance(x, Frozen))
        if isinstance(leaf, Frozen)
    ]


def test_plain_equinox_loop_with_weight_decay_leaves_the_projector_intact():
    net, A = _net(jax.random.key(0))
    X = jax.random.normal(jax.random.key(1), (32, 4))
    B = X[:, :2] @ jnp.asarray(np.ones((2, 2)))
    before = jax.tree.map(np.asarray, eqx.filter(net.projector, eqx.is_array))

    # The loop a new Equinox user writes: no pinet_eqx helper involved.
    params, static = eqx.partition(net, eqx.is_inexact_array)
    opt = optax.adamw(1e-2, weight_decay=0.5)
    state = opt.init(params)

    @eqx.filter_jit
    def step(params, state):
        def loss(params):
            model = eqx.combine(params, static)
            y = jax.vmap(lambda x, b: model(x, b=b))(X, B)
            return jnp.mean(y**2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    for _ in range(5):
        params, state, value = step(params, state)
    trained = eqx.combine(params, static)
    assert np.isfinite(value)
    # Nothing in the projector is an inexact array, so nothing reached adamw.
    assert not jax.tree.leaves(eqx.filter(net.projector, eqx.is_inexact_array))
    after = jax.tree.map(np.asarray, eqx.filter(trained.projector, eqx.is_array))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    Y = jax.vmap(lambda x, b: trained(x, b=b))(X, B)
    assert np.all(np.isfinite(Y))
    np.testing.assert_allclose(Y @ A.T, B, atol=1e-9)
    # The backbone did train.
    assert not np.allclose(
        trained.backbone.layers[0].weight, net.backbone.layers[0].weight
    )


def test_frozen_data_are_jit_arguments_not_constants():
    """Frozen leaves are traced arrays: the compiled program takes them as inputs
    (so changing them does not recompile, and they are not baked in)."""
    net, _ = _net(jax.random.key(0))
    proj = net.projector
    frozen = _frozen_leaves(proj)
    assert frozen and all(isinstance(f.bits, jax.Array) for f in frozen)
    assert all(jnp.issubdtype(f.bits.dtype, jnp.unsignedinteger) for f in frozen)
    y = jnp.ones(proj.dim)
    b = jnp.zeros(2)
    arrays, static = eqx.partition(proj, eqx.is_array)
    lowered = jax.jit(lambda a, y, b: eqx.combine(a, static)(y, b=b)).lower(
        arrays, y, b
    )
    n_args = len(jax.tree.leaves((arrays, y, b)))
    assert len(jax.tree.leaves(lowered.args_info)) == n_args
    assert _frozen_constants(lowered.as_text()) == 0
    # The check can see them: closing over the projector bakes them in.
    baked = jax.jit(lambda y, b: proj(y, b=b)).lower(y, b)
    assert _frozen_constants(baked.as_text()) > 0


def _frozen_constants(text):
    """How many unsigned-integer array constants (frozen bits) a program holds."""
    pattern = re.compile(r"stablehlo.constant .*tensor<[0-9x]+xui(32|64)>")
    return sum(1 for line in text.splitlines() if pattern.search(line))


def test_thaw_gives_back_the_exact_values():
    net, _ = _net(jax.random.key(0))
    op = thaw(net.projector.op)
    bounds = thaw(net.projector.problem).box_lower
    assert jnp.issubdtype(op.d_y.dtype, jnp.floating)
    assert np.isneginf(np.asarray(bounds)[2:]).all()


@pytest.mark.parametrize("via", ["pickle", "tree_serialise_leaves"])
def test_round_trips(tmp_path, via):
    net, _ = _net(jax.random.key(0))
    x, b = jnp.ones(4), jnp.zeros(2)
    if via == "pickle":
        # An MLP's activations pickle by reference except its default final
        # activation (a lambda), so only the projector is pickled here.
        loaded = pickle.loads(pickle.dumps(net.projector))
        y, y_loaded = net.projector(x[:2].repeat(3), b=b), loaded(x[:2].repeat(3), b=b)
    else:
        path = tmp_path / "net.eqx"
        eqx.tree_serialise_leaves(path, net)
        loaded = eqx.tree_deserialise_leaves(path, _net(jax.random.key(9))[0])
        y, y_loaded = net(x, b=b), loaded(x, b=b)
    assert np.array_equal(np.asarray(y), np.asarray(y_loaded))
