"""DC3 data sets, with the optimal validation and test solutions of an independent
solver (OSQP, or IPOPT from $A^+ x$ for the non-convex problem), cached on disk."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from pinet_eqx.problems import DC3Problem, dc3_violation, make_dc3, solve_dc3_convex

from .._common import metrics
from .._common.problems import (
    DC3_PROBLEMS as PROBLEMS,
    DC3_SIZES as SIZES,
    read_paper_instances,
)
from ._solvers import solve_nonconvex

# The keys of this suite's metrics record.
METRICS = (*metrics.METRICS, "eq_cv_max", "ineq_cv_max")
# How many validation and test contexts get optimal solutions (the rest of the
# split is unused): on the large problem an IPOPT solve takes 0.6-2.5 s on a
# 2-core CPU, so only the first 256 of each.
N_SOLVED = {"large": 256}
DEFAULT_CACHE = pathlib.Path(__file__).resolve().parent.parent / "_out" / "dc3"
_SOLUTION_TOL = 1e-6  # largest accepted violation of a cached optimal solution


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    r"""One DC3 benchmark (`name` e.g. `"nonconvex-small"`): the problem, whether
    the objective is $\tfrac12 y^\top Q y + p^\top \sin y$ (`nonconvex`), the
    splits, the optimal `Y` and their values `J`, and the data's `source`."""

    name: str
    problem: DC3Problem
    nonconvex: bool
    X_train: np.ndarray
    X_valid: np.ndarray
    X_test: np.ndarray
    Y_valid: np.ndarray
    Y_test: np.ndarray
    J_valid: np.ndarray
    J_test: np.ndarray
    source: dict

    def objective(self, Y) -> np.ndarray:
        """The objective of each row of `Y`, in float64 NumPy."""
        Y = np.asarray(Y, dtype=np.float64)
        q = np.diag(self.problem.Q)
        linear = np.sin(Y) if self.nonconvex else Y
        return 0.5 * np.sum(q * Y * Y, axis=1) + linear @ self.problem.p

    def objective_jax(self, dtype):
        """A batched JAX objective `Y -> J` with the data cast to `dtype`."""
        import jax.numpy as jnp

        q = jnp.asarray(np.diag(self.problem.Q), dtype)
        p = jnp.asarray(self.problem.p, dtype)
        nonconvex = self.nonconvex

        def objective(Y):
            linear = jnp.sin(Y) if nonconvex else Y
            return 0.5 * (Y * Y) @ q + linear @ p

        return objective

    def violation(self, Y, X) -> np.ndarray:
        """CV of each row: $\\max(\\|Ay - x\\|_\\infty, \\|(Gy - h)_+\\|_\\infty)$."""
        P = self.problem
        return dc3_violation(np.asarray(Y, np.float64), X, P.A, P.G, P.h)

    def relative_suboptimality(self, Y, J_star, X=None) -> np.ndarray:
        """RS of each row, $\\max(0, (J(\\hat y) - J^\\star)/|J^\\star|)$, float64
        (`X` unused: the objective does not depend on the context)."""
        del X
        return np.maximum(0.0, (self.objective(Y) - J_star) / np.abs(J_star))

    def test_metrics(self, Y) -> metrics.Metrics:
        """The float64 test metrics of `Y` for the first `len(Y)` test contexts."""
        P = self.problem
        Y = np.asarray(Y, np.float64)
        n = len(Y)
        rs = self.relative_suboptimality(Y, self.J_test[:n])
        eq = np.abs(Y @ P.A.T - self.X_test[:n]).max(axis=1)
        ineq = np.maximum(Y @ P.G.T - P.h, 0.0).max(axis=1)
        return metrics.Metrics(rs, np.maximum(eq, ineq), {"eq": eq, "ineq": ineq})

    @property
    def sizes(self) -> dict:
        P = self.problem
        return {"n_var": P.n_var, "n_eq": P.n_eq, "n_ineq": P.n_ineq}


def _cached_solutions(path: pathlib.Path, problem, X, nonconvex, label, verbose):
    if path.exists():
        with np.load(path) as f:
            if f["X"].shape == X.shape and np.array_equal(f["X"], X):
                return f["Y"]
    if verbose:
        solver = "IPOPT (casadi)" if nonconvex else "OSQP"
        print(f"Solving {len(X)} {label} contexts with {solver}; cached in {path}")
    Y = (solve_nonconvex if nonconvex else solve_dc3_convex)(problem, X)
    cv = dc3_violation(Y, X, problem.A, problem.G, problem.h)
    if cv.max() > _SOLUTION_TOL:
        raise RuntimeError(
            f"The solver's {label} solutions violate the constraints by up to "
            f"{cv.max():.1e} (> {_SOLUTION_TOL:g}); not caching them."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, X=X, Y=Y)
    return Y


def load(
    problem: str = "nonconvex",
    size: str = "small",
    *,
    seed: int = 17,
    cache_dir: str | pathlib.Path | None = None,
    verbose: bool = True,
) -> Dataset:
    """A DC3 data set (`seed` 17 gives the published data) with its optimal
    solutions, cached in `cache_dir` (default `benchmarks/_out/dc3`)."""
    if problem not in PROBLEMS:
        raise ValueError(f"`problem` must be one of {PROBLEMS}, got {problem!r}.")
    if size not in SIZES:
        raise ValueError(f"`size` must be one of {tuple(SIZES)}, got {size!r}.")
    n_var, n_eq, n_ineq, n_examples, n_valid, n_test = SIZES[size]
    dc3 = make_dc3(n_var, n_eq, n_ineq, n_examples=n_examples, seed=seed)
    X_train, X_valid, X_test = dc3.split(n_valid=n_valid, n_test=n_test)
    X_valid = X_valid[: N_SOLVED.get(size, n_valid)]
    X_test = X_test[: N_SOLVED.get(size, n_test)]
    nonconvex = problem == "nonconvex"
    cache = pathlib.Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    key = f"{problem}_var{n_var}_eq{n_eq}_ineq{n_ineq}_ex{n_examples}_seed{seed}"
    key_valid = key if len(X_valid) == n_valid else f"{key}_first{len(X_valid)}"
    key_test = key if len(X_test) == n_test else f"{key}_first{len(X_test)}"
    Y_valid, Y_test = (
        _cached_solutions(cache / f"{k}_{label}.npz", dc3, X, nonconvex, label, verbose)
        for k, label, X in ((key_valid, "valid", X_valid), (key_test, "test", X_test))
    )
    source = dict(generator="make_dc3", problem=problem, size=size, seed=seed)
    source["n_examples"] = n_examples
    splits, solutions = (X_train, X_valid, X_test), (Y_valid, Y_test)
    return _dataset(f"{problem}-{size}", dc3, nonconvex, splits, solutions, source)


def _dataset(name, dc3, nonconvex, splits, solutions, source) -> Dataset:
    """The `Dataset` with the optimal values of its `solutions`."""
    data = Dataset(name, dc3, nonconvex, *splits, *solutions, None, None, source)
    J = [data.objective(Y) for Y in solutions]
    return dataclasses.replace(data, J_valid=J[0], J_test=J[1])


def load_instances(path: str | pathlib.Path, problem: str = "nonconvex") -> Dataset:
    """The paper's instances (`read_paper_instances`) as a `Dataset` named
    `"{problem}-paper"`, with training contexts drawn afresh from $U[-1, 1]$."""
    paper = read_paper_instances(path, problem)
    rng = np.random.RandomState(17)
    X_train = rng.uniform(-1.0, 1.0, size=(7952, paper.problem.n_eq))
    splits = (X_train, paper.X_valid, paper.X_test)
    source = {"instances": str(pathlib.Path(path)), "problem": problem}
    nonconvex, solutions = problem == "nonconvex", (paper.Y_valid, paper.Y_test)
    name = f"{problem}-paper"
    return _dataset(name, paper.problem, nonconvex, splits, solutions, source)
