"""One projection, end to end: the forward solve of a `Projector` for one instance.

The pipeline of paper Algorithm 1 for one point: assemble the instance's data,
factorise per-instance matrices, start from $y_{raw}$ lifted, iterate under the
adjoint's derivative rule (the active set, the fixed point, or unrolled), refine
onto the active rows in inference mode, and report the status.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp

from .._active_set import derivative as _active_set
from .._active_set.refine import polish as _polish, refine
from .._adjoint.adjoint import UnrolledAdjoint
from .._adjoint.implicit import fixed_point
from .._linalg.equilibration import group_labels
from .._linalg.residual import stored
from .._problem.lifting import InstanceData, LiftedProblem
from .._solver import douglas_rachford as dr
from .._solver.affine import build_affine_projection_traced
from .._solver.settings import DouglasRachford
from .._solver.solution import RESULTS, ProjectionSolution
from .frozen import thaw

NAN_Y_RAW = (
    "Projector: `y_raw` contains NaN or inf. The projection of a non-finite point is "
    "undefined; check the backbone's output (for example for exploding activations)."
)

RANK_DEFICIENT = (
    "Projector: the per-instance equality matrix has linearly dependent rows for "
    "some instance, so its projection is undefined. Per-instance matrices must have "
    "full row rank; remove the redundant rows (or make the matrix fixed, where "
    "dependent rows are dropped automatically)."
)


def solve(proj, y_raw, s0, params: dict, diagnostics: bool):
    """Project one checked point `y_raw` with `proj` (a `Projector`).

    Assembles the instance's data, factorises per-instance matrices, runs
    Douglas-Rachford under the adjoint's derivative rule, refines in inference
    mode, and, with `diagnostics`, returns a `ProjectionSolution` (else only $y$).
    """
    dtype = y_raw.dtype
    problem, fixed_op, rows, refinement = thaw(
        (proj.problem, proj.op, proj.active_rows, proj.refinement)
    )
    data = problem.data(problem.resolve(params, dtype), dtype, proj.check_inputs)
    if problem.per_instance:
        op = _factorise(proj, problem, data)
        sigma = jax.lax.stop_gradient(proj.solver.step_size(op.d_y[: y_raw.shape[0]]))
    else:
        op = jax.tree.map(_cast_floating(dtype), fixed_op)
        sigma = proj.sigma
    s0 = _start(proj, y_raw, s0, data, op)
    n_min, n_max, tol = proj.solver.schedule(proj.inference, y_raw.dtype)
    # Auxiliary coordinates (the last `n_aux` of y) are not in the objective;
    # the closed-form active-set derivative and the polish assume they all are,
    # so such sets take the general path (the fixed point) and no polish.
    polyhedral = not problem.groups and problem.n_aux == 0
    # Where the refinement is on, polyhedral sets are polished at inference
    # (`polish="auto"`), and in training mode too with `polish=True`.
    polish = polyhedral and (
        proj.polish is True or (proj.polish == "auto" and proj.inference)
    )
    # Sparse sets have no refinement (yet), but are polished all the same.
    finishing = refinement is not None or (problem.sparse and rows is not None)
    if problem.sparse and finishing and polish and proj.solver.tol is None:
        # Their polish is an active-set method that finishes from any nearby
        # face (`_host_polish`): the iteration only has to find one, in its
        # `n_iter_test` steps, not to converge (on badly scaled grids it
        # would not, in any affordable number).
        n_min, n_max, tol = 0, proj.solver.steps(proj.inference), None
    if problem.n_ineq + problem.n_cone == 0 and problem.n_eq == 0:
        # Only boxes: the projection is a clip, exact in one step (auxiliary
        # coordinates, unconstrained, stay at zero).
        y = jnp.clip(_padded(y_raw, proj.problem.n_aux), data.lb_y, data.ub_y)
        if not diagnostics:
            return y[: y_raw.shape[0]]
        return ProjectionSolution(
            y=y[: y_raw.shape[0]],
            aux=y[y_raw.shape[0] :],
            s=s0,
            n_iter=jnp.asarray(0),
            primal_residual=jax.lax.stop_gradient(problem.violation(y, data)),
            fixed_point_residual=jnp.zeros((), dtype),
            result=RESULTS.successful,
        )
    adjoint, omega = proj.adjoint, proj.solver.omega
    # Derivative rules see the matrices only through a per-instance `op`.
    theta_data = dataclasses.replace(data, E=None, C=None)
    flags = None  # the active set, where the iteration reports it
    inputs = None  # the differentiated data, on the active-set path
    y = None
    if isinstance(adjoint, UnrolledAdjoint):
        # A fixed count, which reverse mode can unroll (inference mode too: its
        # `n_iter_test` iterations, without `tol_test`'s extra ones).
        n_max, tol = proj.solver.steps(proj.inference), None
        P = dr.prepare(y_raw, data, op, sigma, problem.groups)
        s, n_iter, fp = dr.iterate(s0, P, op, omega, n_max, None)
    elif adjoint.uses_active_set(polyhedral):
        if problem.per_instance:
            inputs = _active_set.Inputs(y_raw, data)
        else:
            inputs = _active_set.Inputs(y_raw, theta_data)
        # Keyword arguments of a custom_jvp carry no tangents.
        forward = jax.lax.stop_gradient(
            _active_set.Forward(op=op, s0=s0, sigma=jnp.asarray(sigma, dtype))
        )
        cfg = (
            omega,
            (n_min, n_max),
            tol,
            adjoint.solver(polyhedral),
            problem.box_index,
        )
        y, (s, n_iter, fp, *flags) = _active_set.project(
            inputs, forward=forward, fixed=rows, cfg=cfg
        )
    else:
        theta = (y_raw, theta_data, op if problem.per_instance else None)
        s, n_iter, fp = fixed_point(
            theta,
            s0,
            None if problem.per_instance else op,
            (sigma, omega),
            groups=problem.groups,
            n_max=n_max,
            tol=tol,
            solver=adjoint.solver(polyhedral),
            n_min=n_min,
        )
    # On the active-set path y already is D_y [Pi_A(s)]_y; otherwise it is
    # computed here, and the same z (and t, which only the status needs)
    # feeds the infeasibility certificate.
    if y is None or diagnostics:
        P = dr.prepare(y_raw, data, op, sigma, problem.groups)
        z, t = dr.z_and_t(s, P, op)
    if y is None:
        y = op.d_y * z[: problem.dim]
    status_tol = DouglasRachford.default_tol(dtype) if tol is None else tol
    polished = False
    refining = refinement is not None and (proj.inference or proj.refine_always)
    viol = None
    if refining or (finishing and polish):
        # The derivative of the unrefined map is kept (stop_gradient): the
        # refinement's correction is at rounding level, and a polished point's
        # own derivative is its face's: the iterate's (dense sets), or the one
        # the host's polish ends on (sparse sets, `on_face` below). y is as
        # stored so that y - y_plain below is exactly zero (see
        # `_residual.stored`).
        y = stored(y)
        y_plain = jax.lax.stop_gradient(y)
        pre = None
        if flags is None:
            # Off the active-set path (every set with cones), P and z were
            # computed above.
            flags = _active_set.activity(s, P, op, z)
            if problem.groups:
                pre = dr.cone_argument(s, z, P)
        if refining:
            # Polyhedral sets are first polished (see `refine`).
            fix, viol, polished = refine(
                problem, rows, refinement, y_plain, data, flags, pre,
                y_raw if polish else None, status_tol,
            )  # fmt: skip
        else:
            # Without the refinement (sparse sets; training mode with
            # `polish=True`): the polished point where it is the projection.
            candidate, polished, _, face = _polish(
                problem, rows, y_raw, data, flags, status_tol
            )
            fix = jnp.where(polished, candidate, y_plain)
            if inputs is not None:
                # Its derivative is its face's, which the host's polish
                # (`_host_polish`) may have moved away from the iterate's.
                face = jax.tree.map(partial(jnp.where, polished), face, tuple(flags))
                y_plain = y = _active_set.on_face(
                    inputs,
                    value=fix,
                    flags=jax.lax.stop_gradient(tuple(face)),
                    fixed=rows,
                    cfg=cfg,
                )
        # y - y is exactly zero, so the value is exactly `fix`.
        y = (y - jax.lax.stop_gradient(y_plain)) + jax.lax.stop_gradient(fix)
    d_out = y_raw.shape[0]
    if not diagnostics:
        return y[:d_out]
    if viol is None:
        viol = problem.violation(y, data)
    viol, fp = jax.lax.stop_gradient((viol, fp))
    tol = dr.reachable_tol(status_tol, *jax.lax.stop_gradient((z, P)))
    infeasible = dr.certifies_infeasibility(*jax.lax.stop_gradient((z, t, P, op)))
    result = RESULTS.where(
        polished | ((viol <= tol) & (fp <= tol)),
        RESULTS.successful,
        RESULTS.where(infeasible, RESULTS.infeasible, RESULTS.max_steps_reached),
    )
    return ProjectionSolution(
        y=y[:d_out],
        aux=y[d_out:],
        s=s,
        n_iter=jnp.asarray(n_iter),
        primal_residual=viol,
        fixed_point_residual=fp,
        result=result,
    )


def _start(proj, y_raw, s0, data: InstanceData, op):
    """The start of the iteration, checked; `y_raw` is checked on it."""
    n = op.d_y.shape[0] + op.d_w.shape[0]
    if s0 is None:
        # y_raw lifted into the internal coordinates: this saves a few
        # iterations over the paper's s0 = 0 and changes no fixed point.
        y = _padded(y_raw, proj.problem.n_aux)
        assert data.C is not None  # as assembled by `LiftedProblem.data`
        s0 = jnp.concatenate([y / op.d_y, (data.C @ y) / op.d_w])
    else:
        s0 = jnp.asarray(s0, y_raw.dtype)
        if s0.shape != (n,):
            raise ValueError(
                f"Projector.solve(y_raw, s0): `s0` must have shape ({n},) (the "
                f"lifted dimension d + n_ineq + n_cone), got {s0.shape}. Pass "
                "`solution.s` from an earlier call."
            )
    s0 = jax.lax.stop_gradient(s0)
    if proj.check_inputs:
        # Checked on the start, which every path consumes but no derivative
        # flows through: the check then stays out of the derivative rules.
        bad = ~jnp.all(jnp.isfinite(jax.lax.stop_gradient(y_raw)))
        s0 = eqx.error_if(s0, bad, NAN_Y_RAW)
    return s0


def _padded(y_raw, n_aux: int):
    """`y_raw` with zeros for the `n_aux` auxiliary coordinates, as long as $y$."""
    return jnp.concatenate([y_raw, jnp.zeros(n_aux, y_raw.dtype)])


def column_groups(proj, problem: LiftedProblem):
    """The equilibration's column group labels and their count."""
    shared_y = proj.equilibration is None or proj.equilibration.y == "shared"
    labels = problem.column_labels(shared_y)
    return group_labels(labels, labels.size)


def _factorise(proj, problem: LiftedProblem, data: InstanceData):
    """The per-instance affine projection (equilibrated, QR-factorised)."""
    groups, n_groups = column_groups(proj, problem)
    E, C = data.dense_matrices()  # per-instance matrices are dense
    op, conditioning = build_affine_projection_traced(
        E,
        C,
        equilibration=proj.equilibration,
        column_groups=jnp.asarray(groups),
        n_groups=n_groups,
    )
    if proj.check_inputs:
        eps = jnp.finfo(E.dtype).eps
        op = eqx.error_if(op, conditioning < 100 * eps, RANK_DEFICIENT)
    return op


def _cast_floating(dtype):
    """`astype(dtype)` for floating arrays; index arrays (a sparse factor's) stay."""

    def cast(a):
        return a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a

    return cast
