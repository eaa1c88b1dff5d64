"""Flax NNX (docs/concepts/flax.md): a projector held in an `nnx.Module` trains
with `nnx.Optimizer` and weight decay without changing, checkpoints through Orbax
as the page shows, and the pure-function path matches the projector. Float64."""

from __future__ import annotations

import pathlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import pinet_eqx as pe

_PAGE = pathlib.Path(__file__).parents[1] / "docs" / "concepts" / "flax.md"

_D, _N_EQ, _N_INEQ, _HIDDEN = 6, 2, 2, 16
_RNG = np.random.default_rng(3)
_A = _RNG.normal(size=(_N_EQ, _D))
_C = _RNG.normal(size=(_N_INEQ, _D))
_U = np.full(_N_INEQ, 1.0)
_LO, _HI = -1.0, 1.0
# Feasible right-hand sides: b = A y0 with y0 inside the box and C y0 < u.
_Y0 = _RNG.uniform(-0.3, 0.3, size=(16, _D))
assert np.all(_Y0 @ _C.T < _U)
_B = _Y0 @ _A.T


def _make_projector():
    return pe.Projector(
        [
            pe.Equality(_A, pe.Parameter("b")),
            pe.AffineInequality(_C, upper=_U),
            pe.Box(_LO, _HI),
        ],
        n_iter=30,
    )


class _Model(nnx.Module):
    def __init__(self, projector, *, rngs):
        kw = dict(param_dtype=jnp.float64, rngs=rngs)
        self.hidden = nnx.Linear(_N_EQ, _HIDDEN, **kw)
        self.out = nnx.Linear(_HIDDEN, _D, **kw)
        self.projector = nnx.data(projector)

    def __call__(self, b):
        y_raw = self.out(nnx.relu(self.hidden(b)))
        return jax.vmap(self.projector)(y_raw, b=b)


def _optimizer(model):
    return nnx.Optimizer(model, optax.adamw(1e-2, weight_decay=0.1), wrt=nnx.Param)


_TRACES = []


@nnx.jit
def _train_step(model, optimizer, b):
    _TRACES.append(None)  # runs once per compilation

    def loss_fn(model):
        Y = model(b)
        return jnp.mean(jnp.sum((Y - 0.5) ** 2, axis=-1))

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def _bits(tree):
    return [np.array(leaf) for leaf in jax.tree.leaves(tree)]


def _identical(xs, ys):
    return len(xs) == len(ys) and all(
        x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
        for x, y in zip(xs, ys)
    )


def _trained(steps=3):
    model = _Model(_make_projector(), rngs=nnx.Rngs(0))
    optimizer = _optimizer(model)
    for _ in range(steps):
        _train_step(model, optimizer, jnp.asarray(_B))
    return model, optimizer


def test_docs_example_runs(tmp_path, monkeypatch):
    """Every ```python block of docs/concepts/flax.md, run in order, as shown."""
    blocks = re.findall(r"```python\n(.*?)```", _PAGE.read_text(), re.S)
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)  # the page writes ./checkpoints
    namespace: dict = {}
    exec(compile("\n".join(blocks), str(_PAGE), "exec"), namespace)
    model, B = namespace["model"], namespace["B"]
    assert np.array_equal(namespace["Y_restored"], model(B))
    assert isinstance(model.projector, pe.Projector)


def test_training_changes_the_mlp_not_the_projector():
    model = _Model(_make_projector(), rngs=nnx.Rngs(0))
    optimizer = _optimizer(model)
    params_before = _bits(nnx.state(model, nnx.Param))
    projector_before = _bits(model.projector)
    treedef_before = jax.tree.structure(model.projector)
    traces_before = len(_TRACES)

    losses = [float(_train_step(model, optimizer, jnp.asarray(_B))) for _ in range(4)]

    assert len(_TRACES) - traces_before <= 1  # compiled at most once (cached)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    params_after = _bits(nnx.state(model, nnx.Param))
    assert len(params_after) == 4
    for before, after in zip(params_before, params_after):
        assert not np.array_equal(before, after)  # adamw moved every weight
    assert jax.tree.structure(model.projector) == treedef_before
    assert _identical(_bits(model.projector), projector_before)
    assert len(projector_before) > 10  # the projector's arrays were compared

    # Feasible, by the projector's measure and independently.
    model.projector = eqx.nn.inference_mode(model.projector)
    Y = np.asarray(model(jnp.asarray(_B)))
    assert Y.dtype == np.float64
    violation = jax.vmap(model.projector.violation)(Y, b=_B)
    assert float(violation.max()) < 1e-8
    assert np.abs(Y @ _A.T - _B).max() < 1e-8
    assert (Y @ _C.T - _U).max() < 1e-8
    assert Y.min() > _LO - 1e-8 and Y.max() < _HI + 1e-8
    # (`inference` is a leaf too: back to training mode, every leaf is as built.)
    model.projector = eqx.nn.inference_mode(model.projector, False)
    assert _identical(_bits(model.projector), projector_before)


def test_optimizer_state_holds_only_the_mlp():
    model, optimizer = _trained(steps=1)
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    n_params = sum(p.size for p in params)
    assert n_params == (_N_EQ + 1) * _HIDDEN + (_HIDDEN + 1) * _D
    opt_state = jax.tree.leaves(nnx.state(optimizer, nnx.OptState))
    # Adam's two moments per weight array, its count and the optimiser's step.
    assert len(opt_state) == 2 * len(params) + 2
    assert sum(x.size for x in opt_state) == 2 * n_params + 2
    moments = [x for x in opt_state if x.ndim > 0]
    assert sorted(x.shape for x in moments) == sorted(2 * [p.shape for p in params])
    assert all(x.dtype == jnp.float64 for x in moments)


def test_orbax_refuses_the_whole_state(tmp_path):
    """Why the page checkpoints the Params only: Orbax will not save the
    projector's empty arrays. (If this starts passing, update the page.)"""
    model = _Model(_make_projector(), rngs=nnx.Rngs(0))
    assert any(x.size == 0 for x in jax.tree.leaves(model.projector))
    checkpointer = ocp.StandardCheckpointer()
    with pytest.raises(ValueError, match="zero size"):
        checkpointer.save(tmp_path / "state", nnx.state(model))
        checkpointer.wait_until_finished()


def test_checkpoint_round_trip_is_bit_identical(tmp_path):
    model, optimizer = _trained(steps=3)
    B = jnp.asarray(_B)
    Y = np.asarray(model(B))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "params", nnx.state(model, nnx.Param))
    checkpointer.save(tmp_path / "opt_state", nnx.state(optimizer, nnx.OptState))
    checkpointer.wait_until_finished()
    pe.save(tmp_path / "projector.eqx", model.projector, {})

    # Orbax for the Params and the optimiser's state, the projector rebuilt.
    restored = _Model(_make_projector(), rngs=nnx.Rngs(1))
    assert not np.array_equal(np.asarray(restored(B)), Y)  # other weights
    params = checkpointer.restore(tmp_path / "params", nnx.state(restored, nnx.Param))
    nnx.update(restored, params)
    assert np.array_equal(np.asarray(restored(B)), Y)
    assert _identical(_bits(restored.projector), _bits(model.projector))
    restored_opt = _optimizer(restored)
    opt_state = checkpointer.restore(
        tmp_path / "opt_state", nnx.state(restored_opt, nnx.OptState)
    )
    nnx.update(restored_opt, opt_state)
    assert _identical(
        _bits(nnx.state(restored_opt, nnx.OptState)),
        _bits(nnx.state(optimizer, nnx.OptState)),
    )

    # The projector stored with pe.save instead of rebuilt.
    restored.projector = pe.load(tmp_path / "projector.eqx", _make_projector)
    assert _identical(_bits(restored.projector), _bits(model.projector))
    assert np.array_equal(np.asarray(restored(B)), Y)

    # Training goes on from the same point: one more step, the same weights.
    _train_step(model, optimizer, B)
    _train_step(restored, restored_opt, B)
    assert _identical(
        _bits(nnx.state(restored, nnx.Param)), _bits(nnx.state(model, nnx.Param))
    )
    assert np.array_equal(np.asarray(restored(B)), np.asarray(model(B)))


def test_other_ways_of_holding_the_projector_fail():
    """The page's claims about the alternatives to `nnx.data`."""
    projector = _make_projector()

    class Plain(nnx.Module):
        def __init__(self):
            self.projector = projector

    class Static(nnx.Module):
        def __init__(self):
            self.projector = nnx.static(projector)

    class InVariable(nnx.Module):
        def __init__(self):
            self.projector = nnx.Variable(projector)

    with pytest.raises(ValueError, match="nnx.data"):
        Plain()
    with pytest.raises(ValueError, match="static"):
        Static()
    held = InVariable()
    with pytest.raises(TypeError, match="sigma"):
        nnx.jit(lambda m, y: m.projector.get_value()(y, b=_B[0]))(held, _Y0[0])


def test_pure_function_path():
    projector = _make_projector()
    arrays, static = eqx.partition(projector, eqx.is_array)
    leaves = jax.tree.leaves(arrays)
    assert leaves and all(
        jnp.issubdtype(x.dtype, jnp.unsignedinteger) or x.dtype == jnp.bool_
        for x in leaves
    )
    assert not jax.tree.leaves(eqx.filter(arrays, eqx.is_inexact_array))

    def project(arrays, y_raw, b):
        return eqx.combine(arrays, static)(y_raw, b=b)

    Y_raw = jnp.asarray(_RNG.normal(size=(len(_B), _D)))
    B = jnp.asarray(_B)
    batched = jax.jit(jax.vmap(project, in_axes=(None, 0, 0)))
    direct = jax.jit(jax.vmap(lambda y, b: projector(y, b=b)))
    Y = batched(arrays, Y_raw, B)
    assert np.array_equal(Y, direct(Y_raw, B))
    eager = jax.vmap(lambda y, b: projector(y, b=b))(Y_raw, B)
    np.testing.assert_allclose(Y, eager, rtol=0, atol=1e-12)

    w = jnp.asarray(_RNG.normal(size=_D))

    def loss(f):
        return lambda y_raw, b: jnp.sum(w * f(y_raw, b)) + jnp.sum(f(y_raw, b) ** 2)

    pure = jax.jit(jax.grad(loss(lambda y, b: project(arrays, y, b)), (0, 1)))
    ref = jax.jit(jax.grad(loss(lambda y, b: projector(y, b=b)), (0, 1)))
    for i in range(3):
        g_pure, g_ref = pure(Y_raw[i], B[i]), ref(Y_raw[i], B[i])
        for a, r in zip(g_pure, g_ref):
            assert np.all(np.isfinite(a)) and np.any(a != 0)
            np.testing.assert_allclose(a, r, rtol=0, atol=1e-12)
