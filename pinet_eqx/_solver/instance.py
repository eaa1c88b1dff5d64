"""One instance, prepared for the iteration, and what the iteration hands on.

The forward pass of one instance runs in four phases (`_projector.forward`):
`prepare` (here) assembles the instance's data, factorises per-instance
matrices, starts from $y_{raw}$ lifted and fixes the iteration's schedule, all
into one `Instance`; the adjoint's rule iterates it (`_adjoint.iterate`, giving
an `Iterated`); the active set finishes it (`_active_set.finish`); and
`certify` reports its status.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._linalg.equilibration import group_labels
from .._problem.lifting import InstanceData, LiftedProblem
from .affine import build_affine_projection_traced

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


# The default iteration count in inference mode of sparse polyhedral sets,
# whose host polish finishes from the iterate's face (see `prepare`).
HOST_FINISH_STEPS = 10


@dataclasses.dataclass(frozen=True)
class Instance:
    """One instance, ready to iterate: its data and the settings that apply to it.

    `problem`, `op`, `rows` and `refinement` are the projector's (thawed; `op`
    factorised for this instance where its matrices are per-instance); `data`
    the instance's constraint data; `s0` the checked start; `(n_min, n_max,
    tol)` the iteration's schedule and `n_steps` its fixed count; the flags
    say which finish applies (see `prepare`).
    """

    problem: LiftedProblem
    op: Any  # AbstractAffineProjection | SparseProjection
    rows: Any  # FixedRows | SparseRows | None
    refinement: Any  # RowResidual | None
    data: InstanceData
    y_raw: Float[Array, " d_out"]
    s0: Float[Array, " n"]
    sigma: Any
    omega: float
    adjoint: Any  # AbstractAdjoint
    n_min: int
    n_max: int
    tol: float | None
    n_steps: int
    polyhedral: bool
    polish: bool
    finishing: bool
    refining: bool

    @property
    def only_boxes(self) -> bool:
        """Whether the set is boxes only, so that the projection is a clip."""
        p = self.problem
        return p.n_ineq + p.n_cone == 0 and p.n_eq == 0


@dataclasses.dataclass(frozen=True)
class Iterated:
    """The iteration's outcome: the governing sequence `s`, its count and fixed
    point residual `fp`; `y` where the derivative rule made it (the active-set
    path), with the active set `flags` and its `inputs` and `cfg`; the prepared
    iteration `P` with `z` and `t` where they were read out; and the tolerance
    the outcome is judged by, `status_tol`."""

    s: Float[Array, " n"]
    n_iter: Any
    fp: Float[Array, ""]
    y: Float[Array, " d"]
    flags: Any
    inputs: Any
    cfg: Any
    P: Any
    z: Any
    t: Any
    status_tol: float


def prepare(proj, frozen: tuple, y_raw, s0, params: dict) -> Instance:
    """Phase one: the `Instance` of `y_raw` for `proj` (a `Projector`), whose
    `frozen` arrays `(problem, op, active_rows, refinement)` are thawed."""
    dtype = y_raw.dtype
    problem, fixed_op, rows, refinement = frozen
    data = problem.data(problem.resolve(params, dtype), dtype, proj.check_inputs)
    if problem.per_instance:
        op = factorise(proj, problem, data)
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
        # would not, in any affordable number). A nearby face is found in a
        # few steps: by default inference runs `HOST_FINISH_STEPS`, after
        # which the host's work is within a few per cent of its work after
        # 50 (see inference.md).
        n_steps = proj.solver.steps(proj.inference)
        if proj.inference and proj.solver.n_iter_test is None:
            n_steps = min(n_steps, HOST_FINISH_STEPS)
        n_min, n_max, tol = 0, n_steps, None
    return Instance(
        problem=problem,
        op=op,
        rows=rows,
        refinement=refinement,
        data=data,
        y_raw=y_raw,
        s0=s0,
        sigma=sigma,
        omega=proj.solver.omega,
        adjoint=proj.adjoint,
        n_min=n_min,
        n_max=n_max,
        tol=tol,
        n_steps=proj.solver.steps(proj.inference),
        polyhedral=polyhedral,
        polish=polish,
        finishing=finishing,
        refining=refinement is not None and (proj.inference or proj.refine_always),
    )


def _start(proj, y_raw, s0, data: InstanceData, op):
    """The start of the iteration, checked; `y_raw` is checked on it."""
    n = op.d_y.shape[0] + op.d_w.shape[0]
    if s0 is None:
        # y_raw lifted into the internal coordinates: this saves a few
        # iterations over the paper's s0 = 0 and changes no fixed point.
        y = padded(y_raw, proj.problem.n_aux)
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


def padded(y_raw, n_aux: int):
    """`y_raw` with zeros for the `n_aux` auxiliary coordinates, as long as $y$."""
    return jnp.concatenate([y_raw, jnp.zeros(n_aux, y_raw.dtype)])


def column_groups(proj, problem: LiftedProblem):
    """The equilibration's column group labels and their count."""
    shared_y = proj.equilibration is None or proj.equilibration.y == "shared"
    labels = problem.column_labels(shared_y)
    return group_labels(labels, labels.size)


def factorise(proj, problem: LiftedProblem, data: InstanceData):
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
