"""The solver baseline (beyond the paper): effort-optimal trajectories by OSQP.

With $\\lambda = \\nu = 0$ the objective $\\sum_i \\sum_t \\|a_i[t]\\|^2$ is a
convex quadratic and separable across vehicles, so the fleet's optimum is each
vehicle's optimum of a small quadratic programme over the same constraints the
projector enforces. The network's relative suboptimality against it is what the
paper never measured.
"""

from __future__ import annotations

import time

import numpy as np

import pinet_eqx as pe

from ._problem import Problem, constraint_matrices


def solve_effort_qp(starts, goals, problem: Problem, eps: float = 1e-9):
    """Effort-optimal trajectories of every vehicle of every context, by OSQP.

    The quadratic programme of one vehicle is $\\min \\tfrac12 y^\\top P y$ with
    $P = 2\\,\\mathrm{diag}(1_a)$ (ones on the accelerations), subject to the
    dynamics, $p[0] = \\bar p[0]$, $p[T] = \\bar p[T]$, $v[0] = v[T] = 0$, the jerk
    rows and the boxes, all as rows of one OSQP constraint matrix. It is set up
    once; only the bounds of the start and goal rows change between vehicles.
    Solved to `eps` with polishing.

    **Arguments:**

    - `starts`, `goals`: `(n, N, 2)`.
    - `problem`: the `Problem`.
    - `eps`: OSQP's absolute and relative tolerance.

    **Returns:** `(Y, seconds)`: the optima, `(n, N, 6T + 4)` float64, and the
    solve time. Raises `RuntimeError` if OSQP does not solve a vehicle.
    """
    import osqp
    import scipy.sparse as sp

    c = constraint_matrices(problem)
    d = problem.dim
    a_cols = np.zeros(d)
    a_cols[problem.slices[2]] = 1.0
    n_fixed = len(c["dynamics"]) + len(c["rest"])
    A = np.concatenate(
        [c["dynamics"], c["rest"], c["start"], c["goal"], c["jerk"], np.eye(d)]
    )
    j = problem.j_max
    lo = np.concatenate(
        [np.zeros(n_fixed + 4), np.full(len(c["jerk"]), -j), c["lower"]]
    )
    up = np.concatenate([np.zeros(n_fixed + 4), np.full(len(c["jerk"]), j), c["upper"]])
    qp = osqp.OSQP()
    qp.setup(
        sp.diags(2.0 * a_cols, format="csc"),
        np.zeros(d),
        sp.csc_matrix(A),
        lo,
        up,
        eps_abs=eps,
        eps_rel=eps,
        max_iter=1_000_000,
        polishing=True,
        verbose=False,
    )
    starts = np.asarray(starts, np.float64)
    goals = np.asarray(goals, np.float64)
    Y = np.empty((*starts.shape[:2], d))
    rows = slice(n_fixed, n_fixed + 4)
    tic = time.perf_counter()
    for i in range(starts.shape[0]):
        for k in range(starts.shape[1]):
            lo[rows] = up[rows] = np.concatenate([starts[i, k], goals[i, k]])
            qp.update(l=lo, u=up)
            result = qp.solve(raise_error=False)
            if result.info.status != "solved":
                raise RuntimeError(
                    f"solve_effort_qp: OSQP stopped with status "
                    f"'{result.info.status}' on context {i}, vehicle {k} "
                    f"(start {starts[i, k]}, goal {goals[i, k]}); try a larger `eps`."
                )
            Y[i, k] = result.x
    return Y, time.perf_counter() - tic


def effort_np(Y, problem: Problem) -> np.ndarray:
    """The fleet's effort in float64 NumPy, `(...)` for `Y` of shape `(..., N, d)`."""
    a = np.asarray(Y, np.float64)[..., problem.slices[2]]
    return (a**2).sum((-2, -1))


def relative_suboptimality(Y, Y_star, problem: Problem) -> dict[str, float]:
    """Mean, median and max of the RS of the effort, per context
    (`pe.relative_suboptimality`, clipped at 0), and its mean without clipping
    (`rs_signed_mean`: negative only if a trajectory beats the optimum, which a
    feasible one cannot)."""
    J = effort_np(Y, problem)
    J_star = effort_np(Y_star, problem)
    gap = (J - J_star) / np.abs(J_star)
    rs = np.asarray(pe.relative_suboptimality(J, J_star))
    return {
        "rs_mean": float(rs.mean()),
        "rs_median": float(np.median(rs)),
        "rs_max": float(rs.max()),
        "rs_signed_mean": float(gap.mean()),
        "effort_mean": float(J.mean()),
        "effort_star_mean": float(J_star.mean()),
    }
