"""What a `Projector` computes once, on the host: the lifted problem and the
factorisations its calls read.

Everything that does not depend on the instance (the lifted structure, the
equilibration, the affine projection's factorisation, the active-set and
refinement data) is built here in float64, then frozen by the `Projector`.
Fixed matrices are factorised densely (`_affine`) or, with
`affine_form="sparse"`, kept sparse end to end (`_sparse_affine`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, cast

import numpy as np
import scipy.sparse as sp

from .._active_set.derivative import FixedRows
from .._active_set.face import SparseRows
from .._linalg.equilibration import (
    Equilibration,
    _group_rms,
    equilibrate_sparse,
    group_labels,
)
from .._linalg.host_solve import row_norms
from .._linalg.residual import RowResidual
from .._linalg.sparse import SparseMatrix, is_sparse
from .._problem.host_data import host_data, host_rhs_low
from .._problem.lifting import LiftedProblem
from .._problem.pieces import LiftedPieces
from .._sets import AbstractConstraint
from .._solver.affine import AbstractAffineProjection, build_affine_projection
from .._solver.settings import DouglasRachford
from .._solver.sparse_affine import build_sparse_projection, lifted_sparse

BAD_DIM = (
    "Projector(constraints): constraint {index} ({kind}) acts on vectors of size "
    "{got}, but the other constraints (or `dim=`) say {expected}."
)

EMPTY_CONSTRAINTS = (
    "Projector(constraints): got an empty list of constraints. Pass at least one "
    "constraint set, e.g. `Projector([Equality(A, b)])`."
)

NO_DIM = (
    "Projector(constraints): cannot infer the output dimension, because no "
    "constraint carries a matrix or a full-length vector. Pass `dim=` explicitly."
)

NOT_A_CONSTRAINT = (
    "Projector(constraints): element {index} is a {kind}, not a constraint set. "
    "Use `Equality`, `AffineInequality`, `Box`, `SecondOrderCone`, `L1NormCone`, "
    "`LInfNormCone` or `Simplex` from `pinet_eqx`."
)

AFFINE_FORMS = ("auto", "nullspace", "eliminated", "dense", "sparse")
# `affine_form="auto"` keeps sparse input sparse from this lifted size on
# (d + number of inequality and cone rows); below it the dense forms' few
# large matrix products beat the sparse solves' many small steps.
SPARSE_MIN_SIZE = 1000


@dataclasses.dataclass(frozen=True)
class Built:
    """The host-side products of `build`, before freezing."""

    problem: LiftedProblem
    op: AbstractAffineProjection | None
    rows: FixedRows | SparseRows | None
    refinement: RowResidual | None
    dropped: tuple[int, ...]
    auto_sigma: float | None


def use_sparse(pieces: LiftedPieces, dim: int, form: str) -> bool:
    """Whether the fixed matrices stay sparse: `form="sparse"`, or `"auto"`
    with a sparse matrix among the pieces on a lifted set of at least
    `SPARSE_MIN_SIZE` coordinates."""
    if form not in AFFINE_FORMS:
        raise ValueError(
            f"Projector(affine_form={form!r}): must be one of {AFFINE_FORMS}."
        )
    if form != "auto":
        return form == "sparse"
    matrices = [E for E, _ in pieces.eq] + [C for C, _, _ in pieces.ineq]
    matrices += [M for b in pieces.cones for M in b.rows]
    if not any(is_sparse(M) for M in matrices):
        return False
    n_rows = sum(M.shape[0] if len(M.shape) == 2 else 1 for M in matrices[1:])
    return dim + n_rows >= SPARSE_MIN_SIZE


def build(
    pieces: LiftedPieces,
    dim: int,
    *,
    equilibration: Equilibration | None,
    shared_y: bool,
    form: str,
    refine: bool,
    n_aux: int = 0,
) -> Built:
    """Lift, equilibrate and factorise, in float64 on the host.

    **Arguments:**

    - `pieces`, `dim`: the merged constraints and the dimension of $y$.
    - `equilibration`: the Ruiz settings, or `None`.
    - `shared_y`: one column scale for all of $y$ (see `Equilibration.y`).
    - `form`: the `affine_form` (see `Projector`).
    - `refine`: whether the refinement data is built.
    - `n_aux`: how many of the last coordinates of $y$ are auxiliary.

    **Returns:** a `Built`.
    """
    sparse = use_sparse(pieces, dim, form)
    problem = LiftedProblem(pieces, dim, sparse=sparse, n_aux=n_aux)
    d_out = dim - n_aux
    labels = problem.column_labels(shared_y)
    col_groups, _ = group_labels(labels, labels.size)
    E, C, q, per_instance_rows = host_data(pieces, dim, sparse=sparse)
    if sparse:
        op = _sparse_op(E, C, equilibration, col_groups)
        rows = (
            None
            if problem.groups
            else SparseRows(
                M=SparseMatrix.from_scipy(sp.vstack([E, C]), remainder=True),
                m_eq=E.shape[0],
            )
        )
        # "auto" for the fixed factorisation, in float64 on the host.
        auto_sigma = float(DouglasRachford().step_size(np.asarray(op.d_y)[:d_out]))
        return Built(problem, op, rows, None, (), auto_sigma)
    op = rows = refinement = None
    dropped: tuple[int, ...] = ()
    auto_sigma = None
    if not problem.per_instance:
        op, info = build_affine_projection(
            E,
            C,
            equilibration=equilibration,
            form=form,
            column_groups=col_groups,
        )
        if q is not None and q.size:
            info.check_consistent(E, q)
        dropped = tuple(int(i) for i in info.dropped_rows)
        auto_sigma = float(DouglasRachford().step_size(np.asarray(info.d_y)[:d_out]))
        box = np.asarray(problem.box_index, int)
        if not problem.groups:
            rows = FixedRows.build(E, C, box, refine)
        elif refine:
            # Only the refinement's first step uses them (see `_refine`).
            m = problem.n_ineq
            rows = FixedRows.build(E, C[:m], box, cone=C[m:])
    if refine and per_instance_rows.size:
        # Sliced once, from the float64 data (per-instance rows per call).
        refinement = RowResidual.build(
            np.concatenate([E, C]),
            *host_rhs_low(pieces),
            per_instance=per_instance_rows if problem.per_instance else None,
        )
    return Built(problem, op, rows, refinement, dropped, auto_sigma)


def _sparse_op(E, C, equilibration: Equilibration | None, col_groups):
    """The sparse affine projection, equilibrated as the dense forms are
    (`_affine.build_affine_projection`): rows of $C$ first scaled to unit
    length with their auxiliary columns, then Ruiz sweeps."""
    m_eq, d = E.shape
    m = C.shape[0]
    if equilibration is None or m_eq + m == 0:
        return build_sparse_projection(E, C, np.ones(m_eq + m), np.ones(d + m))
    norms = row_norms(C)
    norms = np.where(norms > 0, norms, 1.0)
    n_groups = int(col_groups.max()) + 1 if col_groups.size else 0
    norms = _group_rms(np, np.concatenate([np.ones(d), norms]), col_groups, n_groups)
    d_r0 = np.concatenate([np.ones(m_eq), 1 / norms[d:]])
    d_c0 = np.concatenate([np.ones(d), norms[d:]])
    start = sp.diags(d_r0) @ lifted_sparse(E, C) @ sp.diags(d_c0)
    d_r, d_c = equilibrate_sparse(
        sp.csr_matrix(start),
        n_iter=equilibration.n_iter,
        tol=equilibration.tol,
        mode=equilibration.mode,
        column_groups=col_groups,
    )
    return build_sparse_projection(E, C, d_r * d_r0, d_c * d_c0)


def lift(constraints, dim) -> tuple[LiftedPieces, int]:
    """Validate the constraints, infer $d$, and merge their lifted pieces."""
    if isinstance(constraints, AbstractConstraint):
        constraints = [constraints]
    constraints = list(constraints)
    if not constraints:
        raise ValueError(EMPTY_CONSTRAINTS)
    for i, c in enumerate(constraints):
        if not isinstance(c, AbstractConstraint):
            raise TypeError(NOT_A_CONSTRAINT.format(index=i, kind=type(c).__name__))
    # Output dimension: from `dim=` or from the first constraint that knows it.
    for i, c in enumerate(constraints):
        cd = c.dim()
        if cd is None:
            continue
        if dim is None:
            dim = cd
        elif cd != dim:
            raise ValueError(
                BAD_DIM.format(index=i, kind=type(c).__name__, got=cd, expected=dim)
            )
    if dim is None:
        raise ValueError(NO_DIM)
    pieces = [c.lift(dim) for c in constraints]
    for i, p in enumerate(pieces):
        if not isinstance(p, LiftedPieces):
            raise TypeError(
                f"Projector(constraints): constraint {i} "
                f"({type(constraints[i]).__name__}).lift(dim) returned "
                f"{type(p).__name__}; it must return a pinet_eqx.LiftedPieces."
            )
    return LiftedPieces.merge(pieces), int(dim)


def check_polish(polish, where: str) -> bool | Literal["auto"]:
    """`polish`, checked to be `True`, `False` or `"auto"`."""
    if not (isinstance(polish, bool) or (isinstance(polish, str) and polish == "auto")):
        raise TypeError(
            f"{where}(polish={polish!r}): must be True, False or 'auto' (the "
            "default: at inference only)."
        )
    return cast("bool | Literal['auto']", polish)
