"""cvxpylayers (JAX interface) as a projection layer, the paper's baseline: each
instance solved on the CPU through diffcp with Clarabel (diffcp's default, ECOS,
is not installed)."""

from __future__ import annotations

from collections.abc import Callable

SOLVE_METHOD = "Clarabel"


def projection_layer(
    n_var: int, n_param: int, constraints: Callable, solve_method: str = SOLVE_METHOD
):
    """An eager, differentiable `project(R, X) -> Y` onto the set of the DPP
    `constraints(y, x)` by cvxpylayers, with diffcp's `solve_method`."""
    import cvxpy as cp
    from cvxpylayers.jax import CvxpyLayer

    y = cp.Variable(n_var)
    r = cp.Parameter(n_var)
    x = cp.Parameter(n_param)
    problem = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(y - r)), constraints(y, x))
    assert problem.is_dpp()  # cvxpylayers needs a DPP problem
    layer = CvxpyLayer(
        problem,
        parameters=[r, x],
        variables=[y],
        solver_args={"solve_method": solve_method},
    )

    def project(R, X):
        return layer(R, X)[0]

    return project
