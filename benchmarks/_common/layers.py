r"""cvxpylayers (JAX interface) as a projection layer, the paper's baseline.

cvxpylayers canonicalises a DPP problem to a cone program, solves each instance
on the CPU through diffcp and differentiates it with diffcp's adjoint. diffcp's
default cone solver, ECOS, is not installed; Clarabel (also an interior-point
method, to high accuracy) is used instead.
"""

from __future__ import annotations

from collections.abc import Callable

SOLVE_METHOD = "Clarabel"


def projection_layer(
    n_var: int, n_param: int, constraints: Callable, solve_method: str = SOLVE_METHOD
):
    r"""A differentiable projection onto $\{y : \text{constraints}(y, x)\}$ by
    cvxpylayers: $\min_y \frac12\|y - r\|^2$ subject to `constraints(y, x)`
    (DPP-compliant CVXPY constraints in `y` and the parameter `x`), solved with
    diffcp's `solve_method`, its VJP from diffcp's adjoint. Eager (not under
    `jax.jit`); returns `project(R, X) -> Y` for batches or single vectors.
    """
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
