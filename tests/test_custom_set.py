"""User-defined sets: `AbstractConstraint` and `AbstractCone` are extensible
through the public lift types, checked against Clarabel and finite differences."""

import cvxpy as cp
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import central_difference

import pinet_eqx as pe


class Halfspace(pe.AbstractConstraint):
    """$\\{y : a^\\top y \\le c\\}$, lifted as one inequality row."""

    a: np.ndarray
    c: float

    def dim(self):
        return self.a.shape[0]

    def lift(self, dim):
        row = np.asarray(self.a, float)[None, :]
        return pe.LiftedPieces(ineq=((row, np.array([-np.inf]), np.array([self.c])),))


class Orthant(pe.AbstractCone):
    """The nonnegative orthant, as a cone block (self-dual)."""

    def project(self, u, total):
        return jnp.maximum(u, 0)

    def excess(self, u, total):
        return jnp.max(-u, axis=1)

    def support(self, v, offset, total):
        # inf over k >= -o of <v, k> is -<v, o> when v >= 0, else -inf.
        return -jnp.sum(v * offset, axis=1), jnp.max(jnp.maximum(-v, 0), axis=1)


class Nonnegative(pe.AbstractConstraint):
    """$\\{y : y_S \\ge 0\\}$ through the user-defined `Orthant` cone."""

    indices: np.ndarray

    def dim(self):
        return None

    def lift(self, dim):
        k = len(self.indices)
        rows = np.zeros((k, dim))
        rows[np.arange(k), self.indices] = 1.0
        block = pe.ConeBlock(
            cone=Orthant(), rows=(rows,), offset=(np.zeros(k),), size=k
        )
        return pe.LiftedPieces(cones=(block,))


def _problem(rng, d=7):
    A = rng.normal(size=(2, d))
    y0 = np.abs(rng.normal(size=d)) + 0.1
    a = rng.normal(size=d)
    c = float(a @ y0) + 0.5
    S = np.array([0, 2, 3, 5])
    constraints = [pe.Equality(A, A @ y0), Halfspace(a, c), Nonnegative(S)]
    return constraints, (A, A @ y0, a, c, S)


def _clarabel(y_raw, data):
    A, b, a, c, S = data
    y = cp.Variable(y_raw.shape[0])
    cons = [A @ y == b, a @ y <= c, y[S] >= 0]
    cp.Problem(cp.Minimize(cp.sum_squares(y - y_raw)), cons).solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12
    )
    return y.value


@pytest.mark.parametrize("seed", [0, 1])
def test_user_defined_sets_project_like_clarabel(seed):
    rng = np.random.default_rng(seed)
    constraints, data = _problem(rng)
    proj = pe.Projector(constraints, n_iter=20000, tol=1e-11)
    assert proj.problem.groups[0].cone == Orthant()
    for _ in range(3):
        y_raw = 2 * rng.normal(size=7)
        sol = proj.solve(jnp.asarray(y_raw))
        assert sol.result == pe.RESULTS.successful
        np.testing.assert_allclose(sol.y, _clarabel(y_raw, data), atol=1e-7)


def test_user_defined_cone_is_differentiable():
    rng = np.random.default_rng(3)
    constraints, _ = _problem(rng)
    proj = pe.Projector(constraints, n_iter=20000, tol=1e-12)
    y_raw, v = jnp.asarray(2 * rng.normal(size=7)), jnp.asarray(rng.normal(size=7))
    g = jnp.asarray(rng.normal(size=7))
    loss = lambda y: jnp.dot(g, proj(y))  # noqa: E731
    grad = jax.grad(loss)(y_raw)
    fd = central_difference(loss, y_raw, v)
    np.testing.assert_allclose(jnp.dot(grad, v), fd, rtol=1e-5, atol=1e-8)


def test_a_set_that_returns_the_wrong_type_is_a_clear_error():
    class Broken(pe.AbstractConstraint):
        def dim(self):
            return 3

        def lift(self, dim):
            return {"eq": ()}

    with pytest.raises(TypeError, match="must return a pinet_eqx.LiftedPieces"):
        pe.Projector([Broken()])
    assert isinstance(Orthant(), eqx.Module)
