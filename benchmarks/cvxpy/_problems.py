r"""The problems of the suite, their instances and their reference solutions.

**The issue's problem** (target A): $x \in \mathbb{R}^{30}$ with $A x = b$ ($A$
5 x 30 Gaussian, $b$ a `Parameter`), $\|x\|_1 \le r$ ($r$ a `Parameter`),
$\|F x + g\|_2 \le h^\top x + 0.6$ (fixed data), $-1 \le x \le 1$ and a partial
sum (`PARTIAL_SUMS`). Each instance's $b = A x_0$ and $r \sim U(4, 6)$ come
from an interior point $x_0 \sim U(-0.15, 0.15)^{30}$, so every set is
nonempty; the raw points $y_{raw} \sim N(0, I)$ are far enough that the
$\ell_1$ ball is active at every projection.

**DC3 small** (target B): `pinet_eqx.problems.make_dc3()`, its last contexts as
$x$ in $\{y : A y = x,\ G y \le h\}$, $y_{raw} \sim N(0, I)$.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._common.solvers import clarabel

N_VAR, N_EQ, N_SOC = 30, 5, 8
SOC_OFFSET = 0.6
PARTIAL_BOUND = 0.5
PARTIAL_SUMS = {
    # name: how the partial-sum inequality is written.
    "sum": "cp.sum(x[:15]) <= 0.5 (one row, no auxiliary variable)",
    "cumsum": "cp.cumsum(x)[:10] <= 0.5 (cvxpy adds 30 auxiliary variables, tied "
    "to x by equalities)",
    "matrix": "L @ x <= 0.5, L the first 10 rows of the lower-triangular ones "
    "matrix (the same set as cumsum, no auxiliary variable)",
}
DC3_SIZES = {"small": (100, 50, 50), "tiny": (20, 10, 10)}


@dataclasses.dataclass(frozen=True, eq=False)
class IssueProblem:
    """The issue's problem in cvxpy: the variable `x`, the parameters `b` and
    `r`, the `constraints`, the fixed data and the `partial` sum's form."""

    x: object
    b: object
    r: object
    constraints: list
    A: np.ndarray
    F: np.ndarray
    g: np.ndarray
    h: np.ndarray
    partial: str

    def projection_problem(self):
        """`(problem, y_raw)`: cvxpy's $\\min_x \\|x - y_{raw}\\|^2$ over the set,
        with `y_raw` a `Parameter` (for cvxpylayers and the reference)."""
        import cvxpy as cp

        y_raw = cp.Parameter(N_VAR, name="y_raw")
        objective = cp.Minimize(cp.sum_squares(self.x - y_raw))
        return cp.Problem(objective, self.constraints), y_raw

    def partial_sums(self, X: np.ndarray) -> np.ndarray:
        """The partial sums that the constraint bounds by `PARTIAL_BOUND`, for
        points `X` of shape (..., n)."""
        sums = np.cumsum(X, axis=-1)
        return sums[..., 14:15] if self.partial == "sum" else sums[..., :10]

    def soc(self, X: np.ndarray) -> np.ndarray:
        """$\\|F x + g\\|_2 - h^\\top x - c$ of the points `X` (..., n)."""
        norm = np.linalg.norm(X @ self.F.T + self.g, axis=-1)
        return norm - (X @ self.h + SOC_OFFSET)

    def interior(self, x0: np.ndarray, r: float) -> bool:
        """Whether `x0` satisfies every inequality strictly for radius `r`."""
        return bool(
            np.abs(x0).sum() < r
            and self.soc(x0) < 0
            and np.abs(x0).max() < 1
            and self.partial_sums(x0).max() < PARTIAL_BOUND
        )


def issue_problem(partial: str = "sum", seed: int = 0) -> IssueProblem:
    """The issue's problem (module docstring) with fixed data drawn from `seed`."""
    import cvxpy as cp

    rng = np.random.default_rng(seed)
    A = rng.standard_normal((N_EQ, N_VAR))
    F = rng.standard_normal((N_SOC, N_VAR)) / np.sqrt(N_VAR)
    g = 0.1 * rng.standard_normal(N_SOC)
    h = 0.1 * rng.standard_normal(N_VAR) / np.sqrt(N_VAR)
    x = cp.Variable(N_VAR, name="x")
    b = cp.Parameter(N_EQ, name="b")
    r = cp.Parameter(name="r", nonneg=True)
    if partial == "sum":
        partial_sum = cp.sum(x[:15]) <= PARTIAL_BOUND
    elif partial == "cumsum":
        partial_sum = cp.cumsum(x)[:10] <= PARTIAL_BOUND
    elif partial == "matrix":
        partial_sum = np.tril(np.ones((10, N_VAR))) @ x <= PARTIAL_BOUND
    else:
        raise ValueError(f"partial={partial!r}: choose one of {tuple(PARTIAL_SUMS)}.")
    constraints = [
        A @ x == b,
        cp.norm(x, 1) <= r,
        cp.norm(F @ x + g, 2) <= h @ x + SOC_OFFSET,
        x >= -1,
        x <= 1,
        partial_sum,
    ]
    return IssueProblem(x, b, r, constraints, A, F, g, h, partial)


@dataclasses.dataclass(frozen=True)
class Instances:
    """A batch of instances: raw points `Y` (B, n), parameters `params` (name:
    per-instance values, leading axis B) and the loss's weighting `W` (B, n)."""

    Y: np.ndarray
    params: dict
    W: np.ndarray

    @property
    def batch(self) -> int:
        return self.Y.shape[0]


def issue_instances(problem: IssueProblem, batch: int, seed: int = 1) -> Instances:
    """`batch` instances of the issue's problem (module docstring)."""
    rng = np.random.default_rng(seed)
    X0, R = np.empty((batch, N_VAR)), rng.uniform(4.0, 6.0, batch)
    for i in range(batch):
        while True:
            x0 = rng.uniform(-0.15, 0.15, N_VAR)
            if problem.interior(x0, R[i]):
                break
        X0[i] = x0
    Y = rng.standard_normal((batch, N_VAR))
    W = rng.standard_normal((batch, N_VAR))
    return Instances(Y, {"b": X0 @ problem.A.T, "r": R}, W)


def reference(problem: IssueProblem, inst: Instances, tol: float = 1e-10):
    """The projections by cvxpy with Clarabel at tolerance `tol`, one instance
    at a time; `optimal_inaccurate` solutions are kept."""
    import cvxpy as cp

    prob, y_raw = problem.projection_problem()
    out = np.empty_like(inst.Y)
    for i in range(inst.batch):
        y_raw.value = inst.Y[i]
        problem.b.value = inst.params["b"][i]
        problem.r.value = inst.params["r"][i]
        clarabel(prob, tol, quiet=True)
        if prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
            raise RuntimeError(f"Clarabel: {prob.status} on instance {i}.")
        out[i] = problem.x.value
    return out


def objective(inst: Instances, X: np.ndarray) -> np.ndarray:
    """$\\|x - y_{raw}\\|^2$ of each instance."""
    return np.sum((np.asarray(X, np.float64) - inst.Y) ** 2, axis=1)


def violation(problem: IssueProblem, inst: Instances, X: np.ndarray) -> np.ndarray:
    """The largest violation of any constraint, per instance (NumPy, float64)."""
    X = np.asarray(X, np.float64)
    parts = [
        np.abs(X @ problem.A.T - inst.params["b"]).max(axis=1),
        np.abs(X).sum(axis=1) - inst.params["r"],
        problem.soc(X),
        np.abs(X).max(axis=1) - 1,
        problem.partial_sums(X).max(axis=1) - PARTIAL_BOUND,
    ]
    return np.maximum(np.max(parts, axis=0), 0.0)


def activity(problem: IssueProblem, inst: Instances, X: np.ndarray, tol=1e-6):
    """The share of instances whose projection `X` (B, n) has each inequality
    active (within `tol`): `l1`, `soc`, `box` (any bound), `partial` (any row)."""
    active = {
        "l1": np.abs(np.abs(X).sum(axis=1) - inst.params["r"]) < tol,
        "soc": np.abs(problem.soc(X)) < tol,
        "box": (np.abs(X) > 1 - tol).any(axis=1),
        "partial": (problem.partial_sums(X) > PARTIAL_BOUND - tol).any(axis=1),
    }
    return {name: float(a.mean()) for name, a in active.items()}


@dataclasses.dataclass(frozen=True, eq=False)
class DC3:
    """A DC3 polytope $\\{y : A y = x,\\ G y \\le h\\}$ and a batch on it."""

    A: np.ndarray
    G: np.ndarray
    h: np.ndarray
    inst: Instances


def dc3(size: str, batch: int, seed: int = 2) -> DC3:
    """The DC3 problem of `size` (`DC3_SIZES`), its last `batch` contexts as the
    parameter `b` and raw points $y_{raw} \\sim N(0, I)$."""
    from pinet_eqx.problems import make_dc3

    n_var, n_eq, n_ineq = DC3_SIZES[size]
    problem = make_dc3(n_var, n_eq, n_ineq)
    rng = np.random.default_rng(seed)
    Y = rng.standard_normal((batch, n_var))
    W = rng.standard_normal((batch, n_var))
    X = problem.X[-batch:]
    return DC3(problem.A, problem.G, problem.h, Instances(Y, {"b": X}, W))


def dc3_from_cvxpy(data: DC3, **settings):
    """The same set written in cvxpy, `A @ y == b`, `G @ y <= h`, through
    `pe.from_cvxpy`."""
    import cvxpy as cp
    import pinet_eqx as pe

    y = cp.Variable(data.A.shape[1], name="y")
    b = cp.Parameter(data.A.shape[0], name="b")
    return pe.from_cvxpy([data.A @ y == b, data.G @ y <= data.h], y, **settings)
