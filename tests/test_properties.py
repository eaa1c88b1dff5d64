"""Property tests (hypothesis): the layer behaves like a projection onto a convex set.

Whatever the random polytope and points, the output is feasible, projecting twice
changes nothing (idempotence), and the map is non-expansive,
$\\|\\Pi(a) - \\Pi(b)\\| \\le \\|a - b\\|$.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import constraints_of, random_polytope
from hypothesis import given, settings, strategies as st

import pinet_eqx as pe

ACCURATE = dict(n_iter=50_000, tol=1e-10)


# A few random polytopes in the fast tier, more in the slow one (`pytest -m slow`).
# Derandomised, so that a run is reproducible: CI draws the same examples each
# time (a failing draw is printed, and can be replayed with `@example`).
@pytest.mark.parametrize("max_examples", [3, pytest.param(15, marks=pytest.mark.slow)])
def test_projection_properties(max_examples):
    # A fresh `given` wrapper per case: Hypothesis refuses to apply settings
    # twice to one test, as both cases in one process would.
    check = given(**_STRATEGIES)(_check_properties)
    settings(max_examples=max_examples, deadline=None, derandomize=True)(check)()


_STRATEGIES = dict(
    seed=st.integers(0, 2**31 - 1),
    d=st.integers(3, 10),
    m_eq=st.integers(0, 3),
    m_ineq=st.integers(0, 6),
    box=st.booleans(),
    scale=st.floats(0.1, 10.0),
)


def _check_properties(seed, d, m_eq, m_ineq, box, scale):
    rng = np.random.default_rng(seed)
    m_eq = min(m_eq, d - 1)
    poly = random_polytope(rng, d, m_eq, m_ineq, box=box or m_eq + m_ineq == 0)
    proj = pe.Projector(constraints_of(poly), dim=d, **ACCURATE)
    project = jax.vmap(proj.solve)
    points = jnp.asarray(scale * rng.normal(size=(2, d)))
    sol = project(points)
    assert np.all(sol.result == pe.RESULTS.successful)
    y = np.asarray(sol.y)
    # Feasible.
    assert np.all(np.asarray(jax.vmap(proj.violation)(sol.y)) <= 1e-8)
    # Idempotent.
    again = np.asarray(project(sol.y).y)
    np.testing.assert_allclose(again, y, atol=1e-7 * (1 + scale))
    # Non-expansive.
    gap_out = np.linalg.norm(y[0] - y[1])
    gap_in = np.linalg.norm(np.asarray(points[0] - points[1]))
    assert gap_out <= gap_in + 1e-7 * (1 + scale)
