"""`from_cvxpy`: projections onto sets written in cvxpy, against cvxpy + Clarabel.

Each case is a cvxpy problem family with parameters. The ground truth is
Clarabel (tolerances 1e-12) solving min ||x - y_raw||^2 over the same
constraints; derivatives are checked against central differences of that
ground truth, so nothing here compares our code with itself.
"""

from __future__ import annotations

import cvxpy as cp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import slow_except

import pinet_eqx as pe
from benchmarks.cvxpy._accuracy import Family


def _l1_equality_box(rng):
    x = cp.Variable(6, name="x")
    b, r = cp.Parameter(2, name="b"), cp.Parameter(name="r", nonneg=True)
    A = rng.standard_normal((2, 6))
    cons = [A @ x == b, cp.norm(x, 1) <= r, x >= -1, x <= 2]
    return Family([x], cons, {"b": A @ (0.1 * rng.standard_normal(6)), "r": 2.0})


def _linf_soc(rng):
    x = cp.Variable(5, name="x")
    g, s = cp.Parameter(3, name="g"), cp.Parameter(name="s")
    F, f = rng.standard_normal((3, 5)), rng.standard_normal(5)
    cons = [cp.norm(F @ x + g, 2) <= f @ x + 3.0, cp.norm(x - 0.2, "inf") <= s]
    return Family([x], cons, {"g": 0.3 * rng.standard_normal(3), "s": 0.7})


def _simplex_l2(rng):
    x = cp.Variable(5, name="x")
    total, c = cp.Parameter(name="total"), cp.Parameter(5, name="c")
    cons = [x >= 0, cp.sum(x) == total, cp.norm(x - c, 2) <= 0.9]
    return Family([x], cons, {"total": 1.5, "c": rng.uniform(0.1, 0.5, 5)})


def _matrix_parameter(rng):
    x = cp.Variable(5, name="x")
    A = cp.Parameter((3, 5), name="A")
    cons = [A @ x <= 1.0, cp.abs(x) <= 2.0]
    return Family([x], cons, {"A": rng.standard_normal((3, 5))})


def _two_variables(rng):
    x, Y = cp.Variable(3, name="x"), cp.Variable((2, 2), name="Y")
    z = cp.Variable(name="z")  # not projected: an auxiliary coordinate
    rad = cp.Parameter(name="rad", nonneg=True)
    cons = [
        cp.sum(Y, axis=0) == x[:2],
        Y >= 0,
        cp.norm(x, 2) <= rad,
        x[2] <= z,
        z <= 0.5,
    ]
    return Family([x, Y], cons, {"rad": 1.2})


CASES = {
    "l1_equality_box": _l1_equality_box,
    "linf_soc": _linf_soc,
    "simplex_l2": _simplex_l2,
    "matrix_parameter": _matrix_parameter,
    "two_variables": _two_variables,
}


def _setup(name, seed=0):
    rng = np.random.default_rng(seed)
    case = CASES[name](rng)
    proj = pe.from_cvxpy(case.constraints, case.variables)
    return rng, case, proj.with_settings(inference=True)


@pytest.mark.parametrize(
    "name",
    slow_except(list(CASES), "l1_equality_box", "matrix_parameter", "two_variables"),
)
def test_projection_and_gradients_match_clarabel(name):
    """Projections near and far from the set against Clarabel (1e-6,
    relative), and directional derivatives of w . y with respect to y_raw and
    to each parameter against central differences of Clarabel's projection
    (1e-4, relative). One compiled solve and one compiled gradient per case."""
    rng, case, proj = _setup(name)
    assert proj.dim == case.dim
    values = {k: jnp.asarray(v, float) for k, v in case.values.items()}
    solve = jax.jit(jax.vmap(lambda y, p: proj.solve(y, **p), in_axes=(0, None)))
    scales = np.array([0.5, 0.5, 4.0, 4.0])[:, None]
    Y = scales * rng.standard_normal((4, case.dim))
    sols = solve(Y, values)
    assert np.all(sols.result == pe.RESULTS.successful)
    for i, y_raw in enumerate(Y):
        y = np.asarray(sols.y[i])
        expected, accurate = case.project(y_raw, with_status=True)
        err = np.max(np.abs(y - expected)) / max(1.0, np.max(np.abs(expected)))
        # Where Clarabel stops short of 1e-12 ("optimal_inaccurate", seen on
        # simplex_l2 far away), our point must be feasible and at least as good.
        ok = err <= 1e-6 or (not accurate and case.no_worse(y, expected, y_raw))
        assert ok, f"{name}, instance {i}: relative error {err:.2e}"
        full = jnp.concatenate([sols.y[i], sols.aux[i]])
        assert proj.violation(full, **values) <= 1e-8

    y_raw = 2.0 * rng.standard_normal(case.dim)
    w = rng.standard_normal(case.dim)
    grads = jax.jit(jax.grad(lambda y, p: jnp.dot(w, proj(y, **p)), argnums=(0, 1)))(
        y_raw, values
    )
    # Clarabel's points are good to about 1e-9, so a smaller step would
    # measure its noise; the pieces are smooth at this scale.
    eps = 1e-3

    def check(what, derivative, plus, minus):
        fd = (w @ plus - w @ minus) / (2 * eps)
        err = abs(derivative - fd)
        assert err <= 1e-4 * max(abs(fd), 1e-3), f"{what}: {derivative} vs {fd}"

    v = rng.standard_normal(case.dim)
    plus, minus = case.project(y_raw + eps * v), case.project(y_raw - eps * v)
    check("y_raw", float(grads[0] @ v), plus, minus)
    for name_p, value in case.values.items():
        v = rng.standard_normal(np.shape(value))
        up = {**case.values, name_p: np.asarray(value) + eps * v}
        down = {**case.values, name_p: np.asarray(value) - eps * v}
        derivative = float(jnp.sum(grads[1][name_p] * v))
        check(name_p, derivative, case.project(y_raw, up), case.project(y_raw, down))


def test_batched_and_jitted():
    """A batch under jit and vmap equals one-by-one calls."""
    rng, case, proj = _setup("l1_equality_box")
    Y = 2.0 * rng.standard_normal((4, case.dim))
    B = np.stack([case.values["b"]] * 4)
    out = jax.jit(jax.vmap(lambda y, b: proj(y, b=b, r=2.0)))(Y, B)
    for y_raw, y in zip(Y, out):
        np.testing.assert_allclose(y, case.project(y_raw), atol=1e-7)


def _small_projector():
    x, b = cp.Variable(4, name="x"), cp.Parameter(name="b")
    return pe.from_cvxpy([cp.sum(x) == b, cp.norm(x, 1) <= 3.0], x)


def test_pickles():
    import pickle

    proj = _small_projector()
    y_raw = jnp.arange(4.0)
    np.testing.assert_array_equal(
        pickle.loads(pickle.dumps(proj))(y_raw, b=1.0), proj(y_raw, b=1.0)
    )


@pytest.mark.slow  # compiles a training step: 20 s
def test_trains_in_a_hard_constrained_net():
    """A `from_cvxpy` projector is a `Projector`: in a `HardConstrainedNet`
    trained with adamw its data (the parameter map too) stay bit-identical
    while the outputs stay feasible."""
    import equinox as eqx
    import optax

    proj = _small_projector()

    net = pe.HardConstrainedNet(eqx.nn.MLP(1, 4, 8, 1, key=jax.random.key(0)), proj)
    params, static = eqx.partition(net, pe.trainable_filter(net))
    opt = optax.adamw(1e-2, weight_decay=0.1)
    state = opt.init(params)
    X = jnp.linspace(0.0, 1.0, 8)[:, None]

    @jax.jit
    def step(params, state):
        def loss(params):
            model = eqx.combine(params, static)
            return jnp.mean(jax.vmap(lambda x: jnp.sum(model(x, b=x[0]) ** 2))(X))

        updates, state = opt.update(jax.grad(loss)(params), state, params)
        return eqx.apply_updates(params, updates), state

    for _ in range(3):
        params, state = step(params, state)
    trained = eqx.combine(params, static)
    for before, after in zip(jax.tree.leaves(proj), jax.tree.leaves(trained.projector)):
        np.testing.assert_array_equal(before, after)
    Y = jax.vmap(lambda x: trained.projector.with_settings(inference=True)(
        trained.raw(x), b=x[0]))(X)  # fmt: skip
    np.testing.assert_allclose(Y.sum(axis=1), X[:, 0], atol=1e-9)
    assert np.all(np.abs(Y).sum(axis=1) <= 3.0 + 1e-9)


@pytest.mark.parametrize(
    "make, cone_rows, ineq_rows",
    [
        pytest.param(  # L1NormCone, 1 + 3
            lambda x, r: [cp.norm(x - 1, 1) <= r], 4, 0, marks=pytest.mark.slow
        ),
        (lambda x, r: [cp.norm(2 * x + 1, "inf") <= r + x[0]], 4, 0),  # LInf
        pytest.param(  # two-sided rows
            lambda x, r: [cp.abs(x) <= 2.0, cp.sum(x) <= r],
            0,
            4,
            marks=pytest.mark.slow,
        ),
        pytest.param(
            lambda x, r: [cp.norm(x + 1, 2) <= r + x[0]],
            4,
            0,  # SOC head
            marks=pytest.mark.slow,
        ),
    ],
    ids=["l1", "linf", "abs", "soc_head"],
)
def test_norm_epigraphs_become_native_sets(make, cone_rows, ineq_rows):
    """cvxpy's epigraph variables of l1, l-infinity and l2 norms are
    eliminated into native norm cones (or two-sided rows); `native_sets=False`
    keeps them as auxiliary coordinates. Both project as Clarabel does."""
    x, r = cp.Variable(3, name="x"), cp.Parameter(name="r")
    case = Family([x], make(x, r), {"r": 3.0})
    native = pe.from_cvxpy(case.constraints, x)
    rows = pe.from_cvxpy(case.constraints, x, native_sets=False)
    assert native.n_aux == 0 and rows.n_aux >= 1
    assert native.problem.n_cone == cone_rows
    assert native.problem.n_ineq == ineq_rows
    y_raw = np.array([3.3, -2.4, 0.5])
    for proj in (native, rows):
        y = proj.with_settings(inference=True)(y_raw, **case.values)
        np.testing.assert_allclose(y, case.project(y_raw), atol=1e-8)


def test_variables_that_equalities_define_are_substituted():
    """cvxpy's cumsum adds variables tied to x by a chain of equalities; they
    are substituted (no auxiliary coordinate), as a hand-written matrix would
    be, and the projection is Clarabel's."""
    x, u = cp.Variable(6, name="x"), cp.Parameter(name="u")
    case = Family([x], [cp.cumsum(x)[:4] <= u, cp.norm(x, 2) <= 2.0], {"u": 0.3})
    proj = pe.from_cvxpy(case.constraints, x)
    assert proj.n_aux == 0 and proj.problem.n_eq == 0
    y_raw = np.array([1.0, 0.4, -0.2, 0.9, -1.5, 0.7])
    y = proj.with_settings(inference=True)(y_raw, **case.values)
    np.testing.assert_allclose(y, case.project(y_raw), atol=1e-7)


def test_free_variable_passes_through():
    """A requested variable that no constraint mentions is returned as given."""
    x, u = cp.Variable(3, name="x"), cp.Variable(2, name="u")
    proj = pe.from_cvxpy([cp.sum(x) == 1.0], [x, u])
    y = proj.with_settings(inference=True)(jnp.array([1.0, 2.0, 3.0, -4.0, 5.0]))
    np.testing.assert_allclose(y, [-2 / 3, 1 / 3, 4 / 3, -4.0, 5.0], atol=1e-9)


def test_bounds_become_native_boxes():
    """Rows on one coordinate map to `Box` bounds, unless `native_sets=False`."""
    x = cp.Variable(4, name="x")
    lo = cp.Parameter(4, name="lo")
    cons = [x >= lo, x <= 2.0, cp.sum(x) <= 1.0]
    native = pe.from_cvxpy(cons, x)
    rows = pe.from_cvxpy(cons, x, native_sets=False)
    # Without native sets, x >= lo and x <= 2 are one two-sided row each.
    assert native.problem.n_ineq == 1 and rows.problem.n_ineq == 5
    y_raw = np.array([3.0, -2.0, 0.5, 1.0])
    case = Family([x], cons, {"lo": -np.ones(4)})
    for proj in (native, rows):
        y = proj.with_settings(inference=True)(y_raw, **case.values)
        np.testing.assert_allclose(y, case.project(y_raw), atol=1e-8)


def _sparse_case(n):
    x = cp.Variable(n, name="x")
    b = cp.Parameter(n - 1, name="b")
    rng = np.random.default_rng(3)
    cons = [cp.diff(x) <= b, cp.diff(x) >= -b, cp.sum(x) == 1.0]
    return rng, Family([x], cons, {"b": rng.uniform(0.01, 0.1, n - 1)})


def test_large_sparse_data_takes_the_sparse_path():
    """Sparse cvxpy data on a large set keeps the sparse affine form (the
    two-sided rows joined: 599 of them, not 1198)."""
    _, case = _sparse_case(600)
    proj = pe.from_cvxpy(case.constraints, case.variables)
    assert proj.problem.sparse and proj.problem.n_ineq == 599


@pytest.mark.slow
def test_large_sparse_projection_matches_clarabel():
    rng, case = _sparse_case(600)
    proj = pe.from_cvxpy(case.constraints, case.variables)
    y_raw = rng.standard_normal(600)
    sol = proj.with_settings(inference=True).solve(y_raw, **case.values)
    assert sol.result == pe.RESULTS.successful
    np.testing.assert_allclose(sol.y, case.project(y_raw), atol=1e-7)


# ------------------------------------------------------------------- errors

_x = cp.Variable(3, name="x")
_p, _q = cp.Parameter(name="p"), cp.Parameter(name="q")


@pytest.mark.parametrize(
    "constraints, variables, error, match",
    [
        ([cp.exp(_x[0]) <= 1.0], _x, ValueError, "constraint 0 .*exponential"),
        (
            [cp.sum(_x) == 1, cp.constraints.PowCone3D(_x[0], _x[1], _x[2], 0.3)],
            _x,
            ValueError,
            "constraint 1 .*power",
        ),
        ([cp.Variable((2, 2), symmetric=True) >> 0], _x, ValueError, "semidefinite"),
        ([_p * _q * _x[0] <= 1.0], _x, ValueError, "constraint 0 .*not DPP"),
        ([_x[0] * _x[1] <= 1.0], _x, ValueError, "not DCP"),
        ([cp.sum(cp.Variable(2, integer=True)) <= 1], _x, ValueError, "integer"),
        ([cp.sum(cp.Variable(2, boolean=True)) <= 1], _x, ValueError, "boolean"),
        ([], _x, ValueError, "empty"),
        (["x <= 1"], _x, TypeError, r"constraints\[0\] is a str"),
        ([cp.sum(_x) <= 1], [_x, _x], ValueError, "listed twice"),
        ([cp.sum(_x) <= 1], [_x, 3], TypeError, r"variables\[1\]"),
        (
            [cp.sum(_x) <= cp.Parameter(name="y_raw")],
            _x,
            ValueError,
            "cannot be passed as a keyword",
        ),
        ([cp.sum(_x) <= _p, _x[0] >= cp.Parameter(name="p")], _x, ValueError, "named"),
    ],
    ids=[
        "exponential",
        "power",
        "psd",
        "non_dpp",
        "non_dcp",
        "integer",
        "boolean",
        "empty",
        "not_a_constraint",
        "duplicate_variable",
        "not_a_variable",
        "reserved_name",
        "duplicate_parameter",
    ],
)
def test_unsupported_constructs_raise(constraints, variables, error, match):
    with pytest.raises(error, match=match):
        pe.from_cvxpy(constraints, variables)


def test_wrong_parameters_raise():
    _, case, proj = _setup("l1_equality_box")
    y_raw = jnp.zeros(case.dim)
    with pytest.raises(TypeError, match=r"missing \['r'\]"):
        proj(y_raw, b=case.values["b"])
    with pytest.raises(ValueError, match="parameter `b` must have shape"):
        proj(y_raw, b=jnp.zeros(3), r=1.0)
    _, case, proj = _setup("two_variables")  # z is auxiliary
    with pytest.raises(ValueError, match="auxiliary coordinates"):
        proj.violation(jnp.zeros(case.dim), **case.values)
