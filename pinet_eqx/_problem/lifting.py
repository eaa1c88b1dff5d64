"""The lifted problem: how constraint sets become $\\mathcal{A} \\cap \\mathcal{K}$.

Paper Sec. 2.1 writes a set $\\mathcal{C} \\subseteq \\mathbb{R}^d$ as the
projection onto $y$ of $\\{(y, w) : E y = q,\\ w = C y\\} \\cap \\mathcal{K}$, with
$\\mathcal{K}$ a product of boxes on $y$, boxes on the inequality rows of $w$, and
cone blocks. Each constraint contributes its pieces through `lift`
(`LiftedPieces`); `LiftedProblem` stacks them, records which pieces are per-instance
`Parameter`s, and assembles one instance's data (`InstanceData`) at call time.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._linalg.sparse import SparseMatrix
from . import blocks
from .host_data import host_data
from .parameter import Parameter, check_values
from .pieces import LiftedPieces, rows_of, size_of
from .segments import Registry, Segments, assemble, assemble_matrix

PARAM_BOUNDS_CROSSED = (
    "Projector: a parameterised bound has lower > upper for some entry, so the "
    "constraint set is empty. Check the values passed for the bound parameters."
)


class InstanceData(eqx.Module):
    """One instance's constraint data, in the user's coordinates.

    `E`, `C`: the equality and lifted matrices (the inequality rows, then the
    cone rows), dense or, kept sparse, `SparseMatrix`; `q`: the equality
    right-hand side; `lb_y, ub_y`: bounds on $y$; `lb_w, ub_w`: bounds on the
    inequality rows; `cone_offset`, `totals`: the cone blocks' offsets and
    simplex totals. `E` and `C` are `None` where a derivative rule must not see
    them (fixed matrices).
    """

    E: Float[Array, "m_eq d"] | SparseMatrix | None
    C: Float[Array, "m d"] | SparseMatrix | None
    q: Float[Array, " m_eq"]
    lb_y: Float[Array, " d"]
    ub_y: Float[Array, " d"]
    lb_w: Float[Array, " m_box"]
    ub_w: Float[Array, " m_box"]
    cone_offset: Float[Array, " m_cone"]
    totals: Float[Array, " n_total"]

    def dense_matrices(self) -> tuple[Array, Array]:
        """`(E, C)`, where the caller handles dense matrices only (the
        refinement, per-instance factorisations and tangents)."""
        E, C = self.E, self.C
        assert E is not None and C is not None, "matrices left out of this data"
        assert not isinstance(E, SparseMatrix) and not isinstance(C, SparseMatrix)
        return E, C


class LiftedProblem(eqx.Module):
    """The stacked lifted structure of a list of constraints.

    Fixed pieces are arrays; `Parameter` pieces are filled in per instance by
    `data`. The cone blocks are grouped by set and size (`groups`).

    **Arguments:**

    - `pieces`: the merged `LiftedPieces` of all constraints.
    - `dim`: the dimension $d$ of $y$.
    - `sparse`: keep the fixed matrices sparse (`SparseMatrix`, one for $E$ and
        one for $C$) instead of dense.
    - `n_aux`: the last `n_aux` coordinates of $y$ are auxiliary: the objective
        ignores them (the paper's lifting with $n \\ge d$).
    """

    dim: int = eqx.field(static=True)
    n_aux: int = eqx.field(static=True)
    n_eq: int = eqx.field(static=True)
    n_ineq: int = eqx.field(static=True)
    n_cone: int = eqx.field(static=True)
    parameters: tuple[tuple[str, tuple[int, ...]], ...] = eqx.field(static=True)
    groups: tuple[blocks.Group, ...] = eqx.field(static=True)
    box_index: tuple[int, ...] = eqx.field(static=True)
    per_instance: bool = eqx.field(static=True)
    E: Segments
    C: Segments
    q: Segments
    ineq_lower: Segments
    ineq_upper: Segments
    cone_offset: Segments
    totals: Segments
    box_lower: Float[Array, " d"]
    box_upper: Float[Array, " d"]
    box_params: tuple  # tuple[(Int[Array, " k"], lower, upper), ...]

    def __init__(
        self, pieces: LiftedPieces, dim: int, sparse: bool = False, n_aux: int = 0
    ):
        self.n_aux = int(n_aux)
        cones, self.groups = blocks.layout(list(pieces.cones))
        params: dict[str, tuple[int, ...]] = {}
        segments = Registry(params, dim)
        ineq = pieces.ineq
        if sparse:
            E, C, _, _ = host_data(pieces, dim, sparse=True)
            self.E = (SparseMatrix.from_scipy(E),)
            self.C = (SparseMatrix.from_scipy(C),)
        else:
            self.E = segments.matrices([E for E, _ in pieces.eq])
            self.C = segments.matrices(
                [C for C, _, _ in ineq] + [M for b in cones for M in b.rows]
            )
        self.q = segments.vectors([(b, rows_of(E)) for E, b in pieces.eq])
        self.ineq_lower = segments.vectors([(lo, rows_of(C)) for C, lo, _ in ineq])
        self.ineq_upper = segments.vectors([(up, rows_of(C)) for C, _, up in ineq])
        self.cone_offset = segments.vectors(
            [(o, size_of(o)) for b in cones for o in b.offset]
        )
        self.totals = segments.vectors(
            [(b.total, 1) for b in cones if b.cone.has_total]
        )
        # Fixed boxes are intersected now; parameterised ones at call time.
        lower, upper = np.full(dim, -np.inf), np.full(dim, np.inf)
        box_params = []
        for idx, lo, up in pieces.box:
            if isinstance(lo, Parameter) or isinstance(up, Parameter):
                lo_seg, up_seg = segments.vectors([(lo, idx.size), (up, idx.size)])
                box_params.append((jnp.asarray(idx), lo_seg, up_seg))
            if not isinstance(lo, Parameter):
                lower[idx] = np.maximum(lower[idx], lo)
            if not isinstance(up, Parameter):
                upper[idx] = np.minimum(upper[idx], up)
        check_bounds_order(
            lower, upper, "Projector(constraints): the Box constraints together"
        )
        # Coordinates of y with a finite or parameterised bound: the box rows of the
        # active-set derivative.
        bounded = np.isfinite(lower) | np.isfinite(upper)
        for idx, lo, up in pieces.box:
            if isinstance(lo, Parameter) or isinstance(up, Parameter):
                bounded[idx] = True
        self.box_index = tuple(int(i) for i in np.flatnonzero(bounded))
        self.box_lower = jnp.asarray(lower)
        self.box_upper = jnp.asarray(upper)
        self.box_params = tuple(box_params)
        self.dim = int(dim)
        self.n_eq = sum(rows_of(E) for E, _ in pieces.eq)
        self.n_ineq = sum(rows_of(C) for C, _, _ in ineq)
        self.n_cone = sum(b.size for b in cones)
        self.parameters = tuple(sorted(params.items()))
        self.per_instance = any(isinstance(M, Parameter) for M in self.E + self.C)

    @property
    def sparse(self) -> bool:
        """Whether the fixed matrices are kept sparse."""
        return any(isinstance(M, SparseMatrix) for M in self.E + self.C)

    def column_labels(self, shared_y: bool) -> np.ndarray:
        """Equilibration group labels of the lifted columns $(y, w)$: all of $y$
        (`shared_y`) or each coordinate alone, each auxiliary coordinate and
        each inequality row's $w$ alone (the objective does not see them), and
        each cone block as one group (its scaled set must stay a cone)."""
        d, m = self.dim, self.n_ineq
        y_labels = np.arange(d)
        if shared_y:
            y_labels[: d - self.n_aux] = 0
        cone_labels = [
            np.full(g.size, d + m + i)
            for i, g in enumerate(g for g in self.groups for _ in range(g.count))
        ]
        return np.concatenate([y_labels, d + np.arange(m)] + cone_labels)

    def has_bound_parameters(self) -> bool:
        """Whether any bound (box, inequality, simplex total) is a `Parameter`."""
        return bool(self.box_params) or any(
            isinstance(s, Parameter)
            for s in self.ineq_lower + self.ineq_upper + self.totals
        )

    def resolve(self, params: dict, dtype) -> dict:
        """Check the call's keyword parameters against the declared ones.

        **Returns:** the values by name, cast to `dtype`.
        """
        values = check_values(self.parameters, params)
        return {name: v.astype(dtype) for name, v in values.items()}

    def data(self, values: dict, dtype, check: bool) -> InstanceData:
        """Assemble one instance's `InstanceData` from the resolved `values`.

        With `check`, parameterised bounds that cross (lower > upper, or a
        negative simplex total) raise at run time (`eqx.error_if`).
        """
        lb = self.box_lower.astype(dtype)
        ub = self.box_upper.astype(dtype)
        for idx, lo, up in self.box_params:
            if isinstance(lo, Parameter):
                lb = lb.at[idx].max(values[lo.name])
            if isinstance(up, Parameter):
                ub = ub.at[idx].min(values[up.name])
        l_w = assemble(self.ineq_lower, values, dtype)
        u_w = assemble(self.ineq_upper, values, dtype)
        totals = assemble(self.totals, values, dtype)
        if check and self.has_bound_parameters():
            crossed = jnp.any(lb > ub) | jnp.any(l_w > u_w) | jnp.any(totals < 0)
            lb = eqx.error_if(lb, crossed, PARAM_BOUNDS_CROSSED)
        return InstanceData(
            E=assemble_matrix(self.E, values, dtype, self.dim),
            C=assemble_matrix(self.C, values, dtype, self.dim),
            q=assemble(self.q, values, dtype),
            lb_y=lb,
            ub_y=ub,
            lb_w=l_w,
            ub_w=u_w,
            cone_offset=assemble(self.cone_offset, values, dtype),
            totals=totals,
        )

    def violation(self, y: Float[Array, " d"], data: InstanceData) -> Float[Array, ""]:
        """The largest absolute constraint violation of `y`, in the user's units."""
        assert data.E is not None and data.C is not None  # as built by `data()`
        w = data.C @ y
        rows = jnp.concatenate(
            [
                data.E @ y - data.q,
                w[: self.n_ineq],
                w[self.n_ineq :] + data.cone_offset,
            ]
        )
        return self.row_violation(y, rows, data)

    def row_violation(
        self, y: Float[Array, " d"], rows: Float[Array, " m"], data: InstanceData
    ) -> Float[Array, ""]:
        """`violation` of `y` from its rows' values, already computed: `rows` is
        $(E y - q, C y, C_{cone} y + o)$, its inequality part possibly offset
        by the same vector as `data`'s inequality bounds."""
        m_eq, m = self.n_eq, self.n_ineq
        w_box, u = rows[m_eq : m_eq + m], rows[m_eq + m :]
        terms = [
            max_abs(rows[:m_eq]),
            max_abs(jnp.maximum(data.lb_y - y, 0)),
            max_abs(jnp.maximum(y - data.ub_y, 0)),
            max_abs(jnp.maximum(data.lb_w - w_box, 0)),
            max_abs(jnp.maximum(w_box - data.ub_w, 0)),
        ]
        if self.groups:
            terms.append(blocks.violation(u, self.groups, data.totals))
        return jnp.max(jnp.stack(terms))


def check_bounds_order(lower, upper, owner: str) -> None:
    """Raise if fixed bounds have `lower > upper` anywhere (the set would be empty)."""
    if isinstance(lower, Parameter) or isinstance(upper, Parameter):
        return
    lower, upper = np.broadcast_arrays(np.atleast_1d(lower), np.atleast_1d(upper))
    crossed = np.flatnonzero(lower > upper)
    if crossed.size:
        i = int(crossed[0])
        raise ValueError(
            f"{owner}: lower > upper at index {i} (lower={lower[i]}, upper="
            f"{upper[i]}), so the set is empty ({crossed.size} crossed entries in "
            "all). Swap or fix the bounds."
        )


def max_abs(x):
    """$\\|x\\|_\\infty$, with 0 for an empty vector."""
    if x.size == 0:
        return jnp.zeros((), x.dtype)
    return jnp.max(jnp.abs(x))
