"""End-to-end training with optax, frozen arrays, serialisation, inference mode."""

import pickle

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
import pytest
from helpers import random_polytope

import pinet_eqx as pe


def relu(x):
    # A module-level activation: `jax.nn.relu` (eqx.nn.MLP's default) is a wrapped
    # function that the standard pickle cannot serialise by reference.
    return jnp.maximum(x, 0)


def identity(x):
    # Likewise, eqx.nn.MLP's default `final_activation` is a lambda.
    return x


def _make_net(key, poly, **settings):
    proj = pe.Projector(
        [
            pe.Equality(poly.E, pe.Parameter("b")),
            pe.AffineInequality(poly.C, poly.lower, poly.upper),
            pe.Box(poly.lb, poly.ub),
        ],
        **settings,
    )
    backbone = eqx.nn.MLP(
        poly.E.shape[0],
        poly.d,
        32,
        2,
        activation=relu,
        final_activation=identity,
        key=key,
    )
    return pe.HardConstrainedNet(backbone, proj)


def _setup(seed=0):
    rng = np.random.default_rng(seed)
    poly = random_polytope(rng, 10, 3, 6, infs=False)
    # Contexts: right-hand sides of feasible shifts of the interior point.
    shifts = rng.uniform(-0.005, 0.005, size=(64, 10))
    X = jnp.asarray((poly.y_feas + shifts) @ poly.E.T)
    target = jnp.asarray(rng.normal(size=10))
    return poly, X, target


def _train(net, X, target, steps=30, weight_decay=1e-2):
    params, static = eqx.partition(net, pe.trainable_filter(net))
    optim = optax.adamw(1e-2, weight_decay=weight_decay)
    opt_state = optim.init(params)

    def loss_fn(params, X):
        model = eqx.combine(params, static)
        Y = jax.vmap(lambda x: model(x, b=x))(X)
        return jnp.mean(jnp.sum((Y - target[None, :]) ** 2, axis=-1))

    @eqx.filter_jit
    def step(params, opt_state, X):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(params, X)
        updates, opt_state = optim.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, X)
        losses.append(float(loss))
    return eqx.combine(params, static), losses


def _leaves(tree):
    return [x for x in jtu.tree_leaves(tree) if eqx.is_array(x)]


def test_training_keeps_projector_bit_identical_and_feasible():
    poly, X, target = _setup()
    net = _make_net(
        jax.random.key(0),
        poly,
        n_iter=5000,
        tol=1e-8,
        adjoint=pe.ImplicitAdjoint(on_failure="ignore"),
    )
    trained, losses = _train(net, X, target)
    assert losses[-1] < 0.8 * losses[0]
    before, after = _leaves(net.projector), _leaves(trained.projector)
    assert len(before) == len(after) > 0
    for a, b in zip(before, after):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The backbone did change.
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(_leaves(net.backbone), _leaves(trained.backbone))
    )
    Y = jax.vmap(lambda x: trained(x, b=x))(X)
    viol = jax.vmap(lambda y, x: trained.projector.violation(y, b=x))(Y, X)
    assert float(viol.max()) < 1e-6


def test_trainable_filter_freezes_selected_layers():
    poly, X, target = _setup(1)
    net = _make_net(jax.random.key(1), poly, n_iter=100)
    spec = pe.trainable_filter(net, frozen=lambda m: m.backbone.layers[0])
    assert not any(jtu.tree_leaves(spec.projector))
    assert not any(jtu.tree_leaves(spec.backbone.layers[0]))
    assert all(jtu.tree_leaves(spec.backbone.layers[1]))


def test_serialise_and_pickle_round_trip(tmp_path):
    poly, X, target = _setup(2)
    make = lambda: _make_net(  # noqa: E731
        jax.random.key(2),
        poly,
        n_iter=100,
        adjoint=pe.ImplicitAdjoint(on_failure="ignore"),
    )
    trained, _ = _train(make(), X, target, steps=5)
    path = tmp_path / "net.eqx"
    eqx.tree_serialise_leaves(path, trained)
    loaded = eqx.tree_deserialise_leaves(path, make())
    for a, b in zip(_leaves(trained), _leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    out = jax.vmap(lambda x: trained(x, b=x))(X)
    np.testing.assert_array_equal(out, jax.vmap(lambda x: loaded(x, b=x))(X))
    unpickled = pickle.loads(pickle.dumps(trained))
    np.testing.assert_array_equal(out, jax.vmap(lambda x: unpickled(x, b=x))(X))


def test_inference_mode_switches_iteration_count():
    poly, X, _ = _setup(3)
    net = _make_net(jax.random.key(3), poly, n_iter=7, n_iter_test=23)
    y_raw = net.raw(X[0])
    assert int(net.projector.solve(y_raw, b=X[0]).n_iter) == 7
    test_net = eqx.nn.inference_mode(net)
    assert test_net.projector.inference
    # At least the 23 inference iterations; more (in steps of 5) only while the
    # instance is above `tol_test`.
    sol = test_net.projector.solve(y_raw, b=X[0])
    n = int(sol.n_iter)
    assert n >= 23 and (n - 23) % 5 == 0
    assert n == 23 or float(sol.fixed_point_residual) <= 1e-4
    back = eqx.nn.inference_mode(test_net, value=False)
    assert int(back.projector.solve(y_raw, b=X[0]).n_iter) == 7


@pytest.mark.slow
def test_float32_equalities_hold_to_working_precision():
    rng = np.random.default_rng(4)
    d, m_eq, m_ineq = 40, 15, 20
    poly = random_polytope(rng, d, m_eq, m_ineq)
    proj = pe.Projector(
        [
            pe.Equality(poly.E, pe.Parameter("b")),
            pe.AffineInequality(poly.C, poly.lower, poly.upper),
            pe.Box(poly.lb, poly.ub),
        ],
        n_iter=5,  # far from converged: equalities must hold anyway
    )
    B = 64
    shifts = rng.uniform(-0.05, 0.05, size=(B, d))
    bs = (poly.y_feas + shifts) @ poly.E.T
    Y = 3 * rng.normal(size=(B, d))
    out = jax.vmap(lambda y, b: proj(y, b=b))(
        jnp.asarray(Y, jnp.float32), jnp.asarray(bs, jnp.float32)
    )
    assert out.dtype == jnp.float32
    # Measured in float64 against the float32 data actually passed in.
    b32 = np.asarray(jnp.asarray(bs, jnp.float32), np.float64)
    eq_viol = np.abs(np.asarray(out, np.float64) @ poly.E.T - b32).max()
    assert eq_viol <= 1e-6 * np.abs(b32).max(), eq_viol
