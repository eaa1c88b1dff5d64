"""One projection, end to end: the forward solve of a `Projector` for one instance.

The pipeline of paper Algorithm 1 for one point: assemble the instance's data,
factorise per-instance matrices, start from $y_{raw}$ lifted, iterate under the
adjoint's derivative rule (the active set, the fixed point, or unrolled), refine
onto the active rows in inference mode, and report the status.
"""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp

from . import _active_set, _douglas_rachford as dr, _polish
from ._adjoint import UnrolledAdjoint
from ._affine import build_affine_projection_traced
from ._equilibrate import group_labels
from ._errors import NAN_Y_RAW, RANK_DEFICIENT
from ._frozen import thaw
from ._implicit import fixed_point
from ._krylov import ConjugateGradient, default_rtol
from ._lifting import InstanceData, LiftedProblem
from ._refine import stored, two_sum
from ._solution import RESULTS, ProjectionSolution
from ._solver import DouglasRachford

# Refinement steps onto the active rows (see `_refine_active`): far from the set
# the first correction is large, and its own rounding (and an approximate active
# set) leave a second, small one.
_REFINE_STEPS = 2
# A refinement may move y by at most this multiple of the violation it removes
# (or by sqrt(eps) relative, whichever is larger): see `_refine_active`.
_MOVE_FACTOR = 100
# A polished point may miss its active rows by at most this multiple of the
# tolerance before the refinement (see `_refine`).
_POLISH_SLACK = 100


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
        sigma = jax.lax.stop_gradient(proj.solver.step_size(op.d_y))
    else:
        op = jax.tree.map(lambda a: a.astype(dtype), fixed_op)
        sigma = proj.sigma
    s0 = _start(proj, y_raw, s0, data, op)
    n_min, n_max, tol = proj.solver.schedule(proj.inference, y_raw.dtype)
    if problem.n_ineq + problem.n_cone == 0 and problem.n_eq == 0:
        # Only boxes: the projection is a clip, exact in one step.
        y = jnp.clip(y_raw, data.lb_y, data.ub_y)
        if not diagnostics:
            return y
        return ProjectionSolution(
            y=y,
            s=s0,
            n_iter=jnp.asarray(0),
            primal_residual=jax.lax.stop_gradient(problem.violation(y, data)),
            fixed_point_residual=jnp.zeros((), dtype),
            result=RESULTS.successful,
        )
    polyhedral = not problem.groups
    adjoint, omega = proj.adjoint, proj.solver.omega
    # Derivative rules see the matrices only through a per-instance `op`.
    theta_data = dataclasses.replace(data, E=None, C=None)
    flags = None  # the active set, where the iteration reports it
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
    if refinement is not None and (proj.inference or proj.refine_always):
        # The correction is at rounding level, so the derivative of the
        # unrefined map is kept (stop_gradient). y is as stored so that
        # y - y_plain below is exactly zero (see `_refine.stored`).
        y = stored(y)
        y_plain = jax.lax.stop_gradient(y)
        pre = None
        if flags is None:
            # Off the active-set path (every set with cones), P and z were
            # computed above.
            flags = _active_set.activity(s, P, op, z)
            if problem.groups:
                pre = dr.cone_argument(s, z, P)
        # At inference, polyhedral sets are first polished (see `_refine`).
        polish = proj.polish and not problem.groups and proj.inference
        fix, viol, polished = _refine(
            problem, rows, refinement, y_plain, data, flags, pre,
            y_raw if polish else None, status_tol,
        )  # fmt: skip
        # y - y is exactly zero, so the value is exactly `fix`.
        y = (y - y_plain) + jax.lax.stop_gradient(fix)
    else:
        viol = None
    if not diagnostics:
        return y
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
        y=y,
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
        s0 = jnp.concatenate([y_raw / op.d_y, (data.C @ y_raw) / op.d_w])
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


def column_groups(proj, problem: LiftedProblem):
    """The equilibration's column group labels and their count."""
    shared_y = proj.equilibration is None or proj.equilibration.y == "shared"
    labels = problem.column_labels(shared_y)
    return group_labels(labels, labels.size)


def _factorise(proj, problem: LiftedProblem, data: InstanceData):
    """The per-instance affine projection (equilibrated, QR-factorised)."""
    groups, n_groups = column_groups(proj, problem)
    assert data.E is not None and data.C is not None  # per-instance matrices
    op, conditioning = build_affine_projection_traced(
        data.E,
        data.C,
        equilibration=proj.equilibration,
        column_groups=jnp.asarray(groups),
        n_groups=n_groups,
    )
    if proj.check_inputs:
        eps = jnp.finfo(data.E.dtype).eps
        op = eqx.error_if(op, conditioning < 100 * eps, RANK_DEFICIENT)
    return op


def _refine(problem, rows, residual, y, data, flags, pre, y_raw=None, tol=None):
    """`y` refined onto its active constraints, `_REFINE_STEPS` times, kept only
    where that is finite, no less feasible and a small move; the violation
    of the point returned (see `LiftedProblem.violation`), from its residual;
    and whether it was polished.

    With `y_raw` (polyhedral sets), `y` is first polished: replaced by the
    projection of `y_raw` onto the face of its active set
    (`_active_set.polish`) where that point satisfies the optimality conditions
    to `tol` (raised to the rounding of its values): it is feasible, and its
    multipliers have the signs of their bounds. It is then the projection,
    however far the iteration was from converging, and the refinement starts
    from it. If the refined point still misses `tol`, the iterate is returned
    unrefined.

    Polyhedral sets with fixed matrices use the host-eliminated active-set solve
    (`_active_set.refine`); every other set the general one (`_polish.step`),
    with the per-instance rows of the residual sliced per call.

    `y` arrives as stored (see `_refine.stored`), so that the residual, the
    corrections and the updates all see the same point.

    The residual $r = [E; C] y - (q, h, -o)$, with $h$ a bound of each
    inequality row (the one it is pinned to, if any), is computed nearly
    exactly once, at the iterate. Each later step updates it,
    $r \\leftarrow r - [E; C](y - y')$, by an ordinary product: $y - y'$ is the
    small correction, exact in floating point (the two points agree in their
    leading digits), so the product's rounding is that small fraction of the
    rounding of $[E; C] y$.
    """
    data, flags, pre = jax.lax.stop_gradient((data, flags, pre))
    assert data.E is not None and data.C is not None  # as built by `data()`
    if problem.per_instance:
        residual = residual.with_matrix(jnp.concatenate([data.E, data.C]))
    hi, lo = flags
    # Each inequality row's residual is taken against a bound: the one it is
    # pinned to, else its finite one (the upper if both are). The residuals of
    # the rows at or near a bound are then small and nearly exact in the working
    # precision, where the rows' values C y would round at their own, larger,
    # scale; a weakly active row could hide a violation in that rounding.
    d = problem.dim
    finite = jnp.where(
        jnp.isfinite(data.ub_w),
        data.ub_w,
        jnp.where(jnp.isfinite(data.lb_w), data.lb_w, 0.0),
    )
    pinned = jnp.where(hi[d:], data.ub_w, jnp.where(lo[d:], data.lb_w, finite))
    shifted = dataclasses.replace(
        data, lb_w=data.lb_w - pinned, ub_w=data.ub_w - pinned
    )
    # The forward pass does not warn: a failed refinement is simply dropped.
    # Each step's solve (conjugate gradients, for a large active set) stops at
    # the square root of the dtype's default accuracy: a step leaves that
    # fraction of the residual it removes, which the next step sees, nearly
    # exactly, and removes in turn, so two steps leave its square, in about
    # half the conjugate-gradient steps of a full-accuracy solve.
    rtol = math.sqrt(default_rtol(y.dtype))
    solver = ConjugateGradient(rtol=rtol, on_failure="ignore")
    if rows is not None:
        inputs = _active_set.Inputs(y, dataclasses.replace(shifted, E=None, C=None))

        def step(y, r, r_low, last):
            del r_low  # the rows' residuals are small: their rounding is too
            return _active_set.refine(
                r, rows, y, inputs, hi, lo, problem.box_index, solver
            )
    else:
        totals_low = residual.totals_low(y.dtype)

        def step(y, r, r_low, last):
            # The last step is at rounding level: weighted, it goes where the
            # grid can represent it (see `_polish.rounding_weights`).
            weights = _polish.rounding_weights(y) if last else None
            return _polish.step(
                problem, r, r_low, totals_low, y, shifted, hi, lo, pre, solver,
                weights,
            )  # fmt: skip

    polished = jnp.asarray(False)
    iterate = y
    if y_raw is not None:
        y_raw = jax.lax.stop_gradient(y_raw)
        # Its multipliers' signs are tested, so its solve runs to full accuracy.
        accurate = ConjugateGradient(rtol=default_rtol(y.dtype), on_failure="ignore")
        candidate, wrong_sign = _active_set.polish(
            rows, y_raw, data, hi, lo, problem.box_index, accurate
        )
        bound = dr.resolvable_tol(tol, jnp.max(jnp.abs(candidate)))
        # It must satisfy the rows it leaves free; the active ones it meets to
        # its solve's accuracy, and the refinement closes that gap (checked on
        # the point returned), up to `_POLISH_SLACK` times the tolerance (more
        # means a badly conditioned active set, where the refinement is no
        # more reliable than the solve).
        pinned_y, pinned_w = hi[:d] | lo[:d], hi[d:] | lo[d:]
        free = dataclasses.replace(
            data,
            lb_y=jnp.where(pinned_y, -jnp.inf, data.lb_y),
            ub_y=jnp.where(pinned_y, jnp.inf, data.ub_y),
            lb_w=jnp.where(pinned_w, -jnp.inf, data.lb_w),
            ub_w=jnp.where(pinned_w, jnp.inf, data.ub_w),
        )
        polished = (
            jnp.all(jnp.isfinite(candidate))
            & (wrong_sign <= bound)
            & (problem.violation(candidate, free) <= bound)
            & (problem.violation(candidate, data) <= _POLISH_SLACK * bound)
        )
        y = stored(jnp.where(polished, candidate, y))
    rhs = jnp.concatenate([data.q, pinned, -data.cone_offset])
    # The cone rows' values M y + o are of the order of y, not small: what
    # rounding takes from them (r_low) is carried along, for the faces.
    r, r_low = residual(y, rhs)
    before = problem.row_violation(y, r, shifted)
    fix = y
    for k in range(_REFINE_STEPS):
        new = stored(step(fix, r, r_low, k == _REFINE_STEPS - 1))
        change = fix - new
        r, error = two_sum(r, -jnp.concatenate([data.E @ change, data.C @ change]))
        r_low = r_low + error
        fix = new
    after = problem.row_violation(fix, r, shifted)
    eps = jnp.finfo(y.dtype).eps
    size = 1 + jnp.max(jnp.abs(y))
    # The correction is meant to be at the scale of the rounding or of the
    # violation it removes. Nearly dependent active rows (a thin slab, nearly
    # parallel rows) make its system nearly singular, and the minimum-norm
    # solve can then throw a converged point far away while keeping it
    # feasible; such a move is rejected and the iterate kept. The slack
    # allows for the rounding of the updated residuals.
    moved = jnp.max(jnp.abs(fix - y))
    keep = (
        jnp.all(jnp.isfinite(fix))
        & (after <= before + 64 * eps * size)
        & (moved <= jnp.maximum(jnp.sqrt(eps) * size, _MOVE_FACTOR * before))
    )
    out, viol = jnp.where(keep, fix, y), jnp.where(keep, after, before)
    if y_raw is not None:
        # A polished point that ends above the tolerance is not certified; the
        # iterate, as the iteration left it, is then no worse.
        certified = viol <= bound
        failed = polished & ~certified
        out = jnp.where(failed, iterate, out)
        viol = jnp.where(failed, problem.violation(iterate, data), viol)
        polished = polished & certified
    return out, viol, polished
