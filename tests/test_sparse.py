"""Sparse constraint matrices (`affine_form="sparse"`): the same projection and
derivatives as the dense forms, in float64, and clear errors for bad input."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from helpers import (
    ConeSpec,
    EqualitySpec,
    InequalitySpec,
    Polytope,
    assert_close,
    central_difference,
    clarabel_project,
    raises_for,
    random_polytope,
    random_set_spec,
    slow_except,
    to_pinet,
)
from jax.experimental import sparse as jsparse

import pinet_eqx as pe


def sparsify(spec, to=sp.csr_matrix):
    """`spec` with every matrix converted by `to` (same entries)."""
    out = []
    for it in spec:
        if isinstance(it, ConeSpec):
            it = dataclasses.replace(it, A=to(it.A))
        elif isinstance(it, EqualitySpec):
            it = dataclasses.replace(it, E=to(it.E))
        elif isinstance(it, InequalitySpec):
            it = dataclasses.replace(it, C=to(it.C))
        out.append(it)
    return out


def sparse_polytope(rng, d, m_eq, m_ineq, density):
    """`random_polytope` with most matrix entries zero (each row keeps one on a
    distinct column, so the rows stay independent), still strictly feasible."""
    poly = random_polytope(rng, d, m_eq, m_ineq)

    def thin(M, offset):
        keep = rng.random(M.shape) < density
        keep[np.arange(M.shape[0]), (offset + np.arange(M.shape[0])) % d] = True
        return np.where(keep, M, 0.0)

    E, C = thin(poly.E, 0), thin(poly.C, m_eq)
    shift = C @ poly.y_feas - poly.C @ poly.y_feas
    return dataclasses.replace(
        poly,
        E=E,
        b=E @ poly.y_feas,
        C=C,
        lower=poly.lower + shift,
        upper=poly.upper + shift,
    )


def _bcoo(M):
    return jsparse.BCOO.fromdense(jnp.asarray(M))


@eqx.filter_jit
def _batched(proj, Y):
    return jax.vmap(proj)(Y)


@eqx.filter_jit
def _vjp(proj, Y):
    return jax.grad(lambda Y: jnp.sum(jnp.sin(jax.vmap(proj)(Y))))(Y)


@eqx.filter_jit
def _jvp(proj, Y, T):
    return jax.jvp(jax.vmap(proj), (Y,), (T,))[1]


# Every set that takes a matrix: polyhedral (active-set derivative) and with
# cones and simplices (fixed-point derivative).
KINDS = [
    ("eq", "ineq", "box"),
    ("ineq",),
    ("eq", "soc", "box"),
    ("l1", "ineq"),
    ("linf", "eq"),
    ("simplex", "eq", "soc"),
]
ADJOINTS = {
    "implicit": pe.ImplicitAdjoint(rtol=1e-14, atol=1e-15, max_steps=2000),
    "unrolled": pe.UnrolledAdjoint(),
}


@pytest.mark.parametrize("adjoint", sorted(ADJOINTS))
@pytest.mark.parametrize(
    "kinds",
    slow_except(KINDS, ("eq", "ineq", "box")),
    ids="-".join,
)
def test_sparse_matches_dense(kinds, adjoint):
    """Outputs, VJPs and JVPs of the sparse form equal the dense form's to 1e-10
    (same iteration count, training mode)."""
    rng = np.random.default_rng(len(kinds) + 7 * len(adjoint))
    d = 10
    spec, y0 = random_set_spec(rng, d, kinds, m_eq=2, m_ineq=4, cone_rows=3)
    settings = dict(n_iter=150, tol=None, adjoint=ADJOINTS[adjoint])
    dense = pe.Projector(to_pinet(spec), **settings)
    sparse = pe.Projector(to_pinet(sparsify(spec)), affine_form="sparse", **settings)
    assert sparse.problem.sparse and not dense.problem.sparse
    Y = y0 + 2.0 * rng.normal(size=(3, d))
    assert_close(_batched(sparse, Y), _batched(dense, Y), 1e-10, what="outputs")

    def loss(proj):
        return lambda Y: jnp.sum(jnp.sin(_batched(proj, Y)))

    assert_close(jax.grad(loss(sparse))(Y), jax.grad(loss(dense))(Y), 1e-10, what="VJP")
    T = rng.normal(size=Y.shape)
    jvp_s = jax.jvp(lambda Y: _batched(sparse, Y), (Y,), (T,))[1]
    jvp_d = jax.jvp(lambda Y: _batched(dense, Y), (Y,), (T,))[1]
    assert_close(jvp_s, jvp_d, 1e-10, what="JVP")


def test_bcoo_input_equals_scipy():
    """A `BCOO` matrix builds the same projector as the `scipy.sparse` one."""
    rng = np.random.default_rng(3)
    spec, y0 = random_set_spec(rng, 8, ("eq", "ineq", "soc"), cone_rows=3)
    a = pe.Projector(to_pinet(sparsify(spec)), affine_form="sparse", n_iter=40)
    b = pe.Projector(to_pinet(sparsify(spec, _bcoo)), affine_form="sparse", n_iter=40)
    Y = y0 + rng.normal(size=(2, 8))
    np.testing.assert_array_equal(_batched(a, Y), _batched(b, Y))


@pytest.mark.slow
def test_sparse_polytope_against_clarabel():
    """A genuinely sparse polytope, at the defaults in inference mode: the
    projection (cvxpy + Clarabel) to 1e-6, with parameters in the right-hand
    side; gradients in the loads against central differences."""
    rng = np.random.default_rng(11)
    poly = sparse_polytope(rng, d=30, m_eq=6, m_ineq=20, density=0.15)
    E, C = sp.csr_matrix(poly.E), sp.csr_matrix(poly.C)
    b = pe.Parameter("b")
    proj = pe.Projector(
        [
            pe.Equality(E, b),
            pe.AffineInequality(C, poly.lower, poly.upper),
            pe.Box(poly.lb, poly.ub),
        ],
        affine_form="sparse",
        inference=True,
    )
    for scale in (0.5, 5.0):  # near and far raw outputs
        y_raw = poly.y_feas + scale * rng.normal(size=30)
        sol = proj.solve(y_raw, b=poly.b)
        assert sol.result == pe.RESULTS.successful
        expected = clarabel_project(y_raw, poly)
        assert_close(sol.y, expected, 1e-6 * max(1.0, np.abs(expected).max()))

    train = proj.with_settings(inference=False, tol=1e-12, n_iter=5000)
    y_raw = poly.y_feas + rng.normal(size=30)
    v = rng.normal(size=poly.b.shape)
    w = rng.normal(size=30)

    def f(bv):
        return jnp.dot(w, train(y_raw, b=bv))

    grad = jax.grad(f)(jnp.asarray(poly.b))
    eps = 1e-6
    fd = (f(poly.b + eps * v) - f(poly.b - eps * v)) / (2 * eps)
    assert_close(jnp.dot(grad, v), fd, 1e-6, rtol=1e-5, what="d/db")


@pytest.mark.parametrize(
    "make, argument, match",
    [
        (
            lambda: pe.Equality(sp.csr_matrix(np.ones((3, 4))), np.ones(2)),
            "b",
            r"shape \(3,\)",
        ),
        (
            lambda: pe.Equality(sp.csr_matrix(np.array([[1.0, np.nan]])), [1.0]),
            "A",
            "NaN or inf",
        ),
        (
            lambda: pe.AffineInequality(_bcoo(np.array([[1.0, np.inf]])), upper=1.0),
            "C",
            "NaN or inf",
        ),
        (
            lambda: pe.Equality(sp.csr_matrix(np.array([[1.0, 0], [0, 0]])), [1, 0]),
            "A",
            r"row\(s\) \[1\].*all zero",
        ),
        (
            lambda: pe.AffineInequality(
                sp.csr_matrix(np.zeros((2, 3))), lower=-1.0, upper=1.0
            ),
            "C",
            "all zero",
        ),
        (
            lambda: pe.Equality(sp.coo_matrix(np.ones((2, 3, 1)).reshape(2, 3)), [1]),
            "b",
            r"shape \(2,\)",
        ),
    ],
)
def test_bad_sparse_input(make, argument, match):
    with raises_for(argument, ValueError, match):
        make()


def test_sparse_dimension_mismatch():
    """A sparse matrix of the wrong width, among other constraints, is named."""
    with pytest.raises(ValueError, match="acts on vectors of size 3"):
        pe.Projector(
            [
                pe.Equality(sp.csr_matrix(np.ones((1, 4))), [1.0]),
                pe.AffineInequality(sp.csr_matrix(np.ones((1, 3))), upper=1.0),
            ]
        )


def test_dependent_sparse_rows_say_why():
    """Duplicated equality rows make the sparse factorisation singular: the
    error says so and how to fix it (the dense forms drop them)."""
    A = sp.csr_matrix(np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]))
    cons = [pe.Equality(A, [1.0, 1.0]), pe.Box(-np.ones(3), np.ones(3))]
    with pytest.raises(ValueError, match="linearly dependent.*Remove"):
        pe.Projector(cons, affine_form="sparse")
    dense = pe.Projector(cons)  # "auto": small, so dense, which drops the row
    assert dense.dropped_equality_rows == (1,)


def test_sparse_refuses_matrix_parameters():
    with pytest.raises(ValueError, match="matrix Parameter"):
        pe.Projector(
            [
                pe.Equality(sp.csr_matrix(np.eye(3)), np.ones(3)),
                pe.AffineInequality(pe.Parameter("C", shape=(1, 3)), upper=1.0),
            ],
            affine_form="sparse",
        )


def test_infeasible_instance_flagged_and_finite():
    """Loads that no point can meet: reported infeasible or not converged,
    never successful, and finite."""
    A = sp.csr_matrix(np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]))
    proj = pe.Projector(
        [pe.Equality(A, pe.Parameter("load")), pe.Box(np.zeros(4), np.ones(4))],
        affine_form="sparse",
        inference=True,
    )
    ok = proj.solve(np.zeros(4), load=np.array([1.0, 1.5]))
    assert ok.result == pe.RESULTS.successful
    bad = proj.solve(np.zeros(4), load=np.array([3.0, 1.0]))  # sum of 2 in [0, 1]
    assert bad.result != pe.RESULTS.successful
    assert np.all(np.isfinite(bad.y))


@pytest.mark.slow
def test_docs_example_runs():
    """The code of docs/concepts/sparse.md runs as shown."""
    import pathlib
    import re

    page = pathlib.Path(__file__).parents[1] / "docs" / "concepts" / "sparse.md"
    code = re.search(r"```python\n(.*?)```", page.read_text(), re.S)
    assert code is not None
    exec(compile(code.group(1), str(page), "exec"), {})


def test_parallel_rows_gradients_in_bounds():
    """Parallel rows (c, -2c, 3c) are merged by the sparse polish, and the
    face it returns carries the flag on the row whose bound binds: reverse-mode
    gradients in y_raw and in every row and box bound (parameters) against
    central differences of Clarabel's projection (float64, inference mode)."""
    rng = np.random.default_rng(0)
    d = 6
    c = np.zeros(d)
    c[[0, 2]] = [1.0, 0.5]
    C = np.stack([c, -2 * c, 3 * c, np.eye(d)[3] + 0.5 * np.eye(d)[1]])
    bounds = dict(
        lo=np.array([-5.0, -1.0, -15.0, -2.0]),  # c y <= 0.5 binds, by row 1
        up=np.array([1.0, 8.0, 3.0, 2.0]),
        ub=np.full(d, 3.0),
    )
    E = np.array([[1.0, 1, 0, 0, 0, 1]])
    proj = pe.Projector(
        [
            pe.Equality(sp.csr_matrix(E), [0.3]),
            pe.AffineInequality(
                sp.csr_matrix(C), pe.Parameter("lo"), pe.Parameter("up")
            ),
            pe.Box(-3.0, pe.Parameter("ub")),
        ],
        affine_form="sparse",
        inference=True,
    )
    y_raw = np.array([2.5, -0.3, 2.0, 2.5, 5.0, 0.4])
    w = rng.normal(size=d)

    def clarabel(y, lo, up, ub):
        poly = Polytope(E, np.array([0.3]), C, lo, up, np.full(d, -3.0), ub, y)
        return w @ clarabel_project(y, poly)

    args = (y_raw, bounds["lo"], bounds["up"], bounds["ub"])
    grads = jax.grad(
        lambda y, lo, up, ub: jnp.dot(w, proj(y, lo=lo, up=up, ub=ub)),
        argnums=(0, 1, 2, 3),
    )(*map(jnp.asarray, args))
    # One random direction per argument: a gradient on the wrong one of the
    # parallel rows changes the row bounds' directional derivatives.
    directions = [(k, rng.normal(size=np.size(args[k]))) for k in range(4)]
    for k, e in directions:

        def moved(t):
            shifted = list(args)
            shifted[k] = args[k] + t * e
            return clarabel(*shifted)

        fd = central_difference(moved, 0.0, 1.0, 1e-6)
        assert_close(jnp.dot(grads[k], e), fd, 1e-7, what=f"argument {k}, {e}")
