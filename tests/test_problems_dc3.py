import os
import pathlib

import numpy as np
import pytest

from pinet_eqx.problems import (
    DC3Problem,
    dc3_objective,
    dc3_violation,
    make_dc3,
    solve_dc3_convex,
)

_SIZES = [(10, 5, 7, 20), (100, 50, 50, 30), (30, 30, 10, 5)]


def _shared_dc3_dir() -> pathlib.Path:
    # The published DC3 data live beside the repository checkout, never inside it,
    # so the tests that need them skip wherever they are absent (CI included).
    shared = os.environ.get("PINET_SHARED_DIR")
    if shared is None:
        shared = pathlib.Path(__file__).resolve().parents[2] / "shared"
    return pathlib.Path(shared) / "data" / "dc3"


def _load_shared(kind: str, split: str) -> dict[str, np.ndarray]:
    name = f"dc3_random_{kind}_dataset_var100_ineq50_eq50_ex10000{split}.npz"
    path = _shared_dc3_dir() / name
    if not path.exists():
        pytest.skip(f"published DC3 data not found at {path}")
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


@pytest.mark.parametrize("n_var, n_eq, n_ineq, n_examples", _SIZES)
def test_shapes(n_var, n_eq, n_ineq, n_examples):
    problem = make_dc3(n_var, n_eq, n_ineq, n_examples, seed=0)
    assert problem.Q.shape == (n_var, n_var)
    assert problem.p.shape == (n_var,)
    assert problem.A.shape == (n_eq, n_var)
    assert problem.G.shape == (n_ineq, n_var)
    assert problem.h.shape == (n_ineq,)
    assert problem.X.shape == (n_examples, n_eq)
    assert (problem.n_var, problem.n_eq, problem.n_ineq) == (n_var, n_eq, n_ineq)
    assert problem.n_examples == n_examples
    for array in (problem.Q, problem.p, problem.A, problem.G, problem.h, problem.X):
        assert array.dtype == np.float64
        assert not array.flags.writeable
    assert np.array_equal(problem.Q, np.diag(np.diag(problem.Q)))
    assert np.all(np.diag(problem.Q) >= 0)
    assert np.all(np.abs(problem.X) <= 1)


@pytest.mark.parametrize("n_var, n_eq, n_ineq, n_examples", _SIZES)
def test_pseudoinverse_point_is_strictly_feasible(n_var, n_eq, n_ineq, n_examples):
    problem = make_dc3(n_var, n_eq, n_ineq, n_examples, seed=1)
    Y = problem.X @ np.linalg.pinv(problem.A).T
    slack = problem.h - Y @ problem.G.T
    assert slack.min() > 0
    np.testing.assert_allclose(Y @ problem.A.T, problem.X, atol=1e-12)
    assert dc3_violation(Y, problem.X, problem.A, problem.G, problem.h).max() < 1e-12


def test_reproducible():
    first = make_dc3(20, 10, 10, 50, seed=3)
    second = make_dc3(20, 10, 10, 50, seed=3)
    other = make_dc3(20, 10, 10, 50, seed=4)
    for name in ("Q", "p", "A", "G", "h", "X"):
        assert np.array_equal(getattr(first, name), getattr(second, name))
        assert not np.array_equal(getattr(first, name), getattr(other, name))
    assert first.seed == 3


def test_split():
    problem = make_dc3(10, 5, 5, n_examples=100)
    train, valid, test = problem.split(n_valid=10, n_test=20)
    assert (train.shape, valid.shape, test.shape) == ((70, 5), (10, 5), (20, 5))
    assert np.array_equal(np.concatenate([train, valid, test]), problem.X)
    train, valid, test = problem.split(30, 10, 20)
    assert np.array_equal(train, problem.X[:30])
    assert np.array_equal(valid, problem.X[70:80])
    assert np.array_equal(test, problem.X[80:])
    with pytest.raises(ValueError, match="n_train=90"):
        problem.split(90, 10, 20)


def test_bad_shapes():
    problem = make_dc3(10, 5, 5, n_examples=4)
    with pytest.raises(ValueError, match="`h`"):
        DC3Problem(problem.Q, problem.p, problem.A, problem.G, problem.h[:3], problem.X)
    with pytest.raises(ValueError, match="n_eq <= n_var"):
        make_dc3(n_var=5, n_eq=6)


@pytest.mark.parametrize("nonconvex", [False, True])
def test_objective(nonconvex):
    problem = make_dc3(10, 5, 5, n_examples=1)
    y = np.random.RandomState(0).normal(size=10)
    linear = np.sin(y) if nonconvex else y
    expected = 0.5 * y @ problem.Q @ y + problem.p @ linear
    value = dc3_objective(y, problem.Q, problem.p, nonconvex=nonconvex)
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)


def test_violation():
    A = np.array([[1.0, 0.0]])
    G = np.array([[0.0, 1.0], [1.0, 1.0]])
    h = np.array([1.0, 1.0])
    Y = np.array([[0.5, 0.5], [0.0, 3.0], [1.25, 0.0]])
    X = np.array([[0.5], [0.0], [1.0]])
    np.testing.assert_allclose(dc3_violation(Y, X, A, G, h), [0.0, 2.0, 0.25])


def _solve_cvxpy(problem, x):
    cp = pytest.importorskip("cvxpy")
    pytest.importorskip("clarabel")
    y = cp.Variable(problem.n_var)
    objective = 0.5 * cp.quad_form(y, problem.Q) + problem.p @ y
    constraints = [problem.A @ y == x, problem.G @ y <= problem.h]
    cp.Problem(cp.Minimize(objective), constraints).solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12
    )
    return y.value


def test_solve_convex_matches_clarabel():
    pytest.importorskip("osqp")
    problem = make_dc3(n_examples=3, seed=5)
    Y = solve_dc3_convex(problem)
    assert Y.shape == (3, problem.n_var)
    expected = np.stack([_solve_cvxpy(problem, x) for x in problem.X])
    np.testing.assert_allclose(Y, expected, atol=1e-6, rtol=0)
    assert dc3_violation(Y, problem.X, problem.A, problem.G, problem.h).max() < 1e-8


def test_solve_convex_rejects_bad_contexts():
    problem = make_dc3(10, 5, 5, n_examples=2)
    with pytest.raises(ValueError, match=r"\(n, 5\)"):
        solve_dc3_convex(problem, problem.X[0])


@pytest.mark.parametrize("kind", ["simple", "nonconvex"])
@pytest.mark.parametrize("split", ["valid", "test"])
def test_reproduces_published_data(kind, split):
    data = _load_shared(kind, split)
    problem = make_dc3()
    assert np.array_equal(problem.Q, data["Q"][0])
    assert np.array_equal(problem.p, data["p"][0, :, 0])
    assert np.array_equal(problem.A, data["A"][0])
    # Exact up to one unit in the last place in G, and the pseudo-inverse's
    # rounding in h: see the docstring of `make_dc3`.
    np.testing.assert_allclose(problem.G, data["G"][0], atol=1e-15, rtol=0)
    np.testing.assert_allclose(problem.h, data["h"][0, :, 0], atol=1e-12, rtol=0)
    _, X_valid, X_test = problem.split()
    assert np.array_equal({"valid": X_valid, "test": X_test}[split], data["X"][..., 0])


def test_solve_convex_matches_published_solutions():
    pytest.importorskip("osqp")
    data = _load_shared("simple", "test")
    X = data["X"][:4, :, 0]
    Y = solve_dc3_convex(make_dc3(), X)
    np.testing.assert_allclose(Y, data["Ystar"][:4, :, 0], atol=1e-8, rtol=0)
