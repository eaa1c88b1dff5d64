"""The last phase of one instance's forward pass: its `ProjectionSolution`.

The status is successful where the output is feasible and the fixed point
reached to the tolerance that the iterate can resolve (or where the polish
found the projection), infeasible where the iterates certify that the set is
empty (`douglas_rachford.certifies_infeasibility`) or the finish proved it
(the host's polish: `_host_ipm._Iterate.proves_empty`), and
`max_steps_reached` otherwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from . import douglas_rachford as dr
from .instance import Instance, Iterated, padded
from .solution import RESULTS, ProjectionSolution


def certify(
    instance: Instance,
    it: Iterated,
    y: Float[Array, " d"],
    viol: Float[Array, ""] | None,
    polished: Bool[Array, ""] | bool,
    empty: Bool[Array, ""] | bool = False,
) -> ProjectionSolution:
    """Phase four: the solution of `instance` at the finished point `y`, with its
    constraint violation `viol` where the finish measured it, and `empty`
    where the finish proved the set empty."""
    problem, data, op = instance.problem, instance.data, instance.op
    d_out = instance.y_raw.shape[0]
    if viol is None:
        viol = problem.violation(y, data)
    viol, fp = jax.lax.stop_gradient((viol, it.fp))
    tol = dr.reachable_tol(it.status_tol, *jax.lax.stop_gradient((it.z, it.P)))
    infeasible = empty | dr.certifies_infeasibility(
        *jax.lax.stop_gradient((it.z, it.t, it.P, op))
    )
    result = RESULTS.where(
        polished | ((viol <= tol) & (fp <= tol)),
        RESULTS.successful,
        RESULTS.where(infeasible, RESULTS.infeasible, RESULTS.max_steps_reached),
    )
    return ProjectionSolution(
        y=y[:d_out],
        aux=y[d_out:],
        s=it.s,
        n_iter=jnp.asarray(it.n_iter),
        primal_residual=viol,
        fixed_point_residual=fp,
        result=result,
    )


def clip(instance: Instance, diagnostics: bool):
    """The whole pass for a set of boxes only: the projection is a clip, exact
    in one step (auxiliary coordinates, unconstrained, stay at zero)."""
    problem, data, y_raw = instance.problem, instance.data, instance.y_raw
    y = jnp.clip(padded(y_raw, problem.n_aux), data.lb_y, data.ub_y)
    if not diagnostics:
        return y[: y_raw.shape[0]]
    return ProjectionSolution(
        y=y[: y_raw.shape[0]],
        aux=y[y_raw.shape[0] :],
        s=instance.s0,
        n_iter=jnp.asarray(0),
        primal_residual=jax.lax.stop_gradient(problem.violation(y, data)),
        fixed_point_residual=jnp.zeros((), y_raw.dtype),
        result=RESULTS.successful,
    )
