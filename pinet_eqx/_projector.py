"""The projection layer: `Projector`."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Sequence
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from . import _active_set, _blocks as blocks, _douglas_rachford as dr
from ._active_set import FixedRows
from ._adjoint import AbstractAdjoint, ImplicitAdjoint, UnrolledAdjoint
from ._affine import (
    AbstractAffineProjection,
    build_affine_projection,
    build_affine_projection_traced,
)
from ._constraints import AbstractConstraint
from ._constraints._base import LiftedPieces, check_bounds_order, shape_of
from ._equilibrate import group_labels
from ._errors import (
    BAD_DIM,
    EMPTY_CONSTRAINTS,
    INCONSISTENT_EQUALITY,
    NAN_Y_RAW,
    NO_DIM,
    NOT_A_CONSTRAINT,
    PARAM_BOUNDS_CROSSED,
    RANK_DEFICIENT,
    REFINE_NEEDS_FIXED_EQUALITY,
)
from ._implicit import fixed_point
from ._krylov import ConjugateGradient
from ._parameter import Parameter
from ._precision import full_precision
from ._refine import EqualityRefinement, RowResidual
from ._solution import RESULTS, ProjectionSolution

# A vector or matrix assembled at call time from fixed pieces and named parameters.
_Segments = tuple  # tuple[Float[Array, "..."] | Parameter, ...]


_max_abs = dr.max_abs


class Projector(eqx.Module):
    """Orthogonal projection onto a convex set, as a differentiable layer.

    Computes $y = \\Pi_{\\mathcal{C}}(y_{raw}) = \\arg\\min_{z \\in \\mathcal{C}}
    \\|z - y_{raw}\\|^2$ for $\\mathcal{C}$ the intersection of the given constraint
    sets, by Douglas-Rachford splitting on the lifted form $\\mathcal{C} =
    \\Pi_d(\\mathcal{A} \\cap \\mathcal{K})$ (paper Sec. 2.1-2.2, Algorithm 1), with
    modified Ruiz equilibration (App. H.1). Derivatives are implicit (paper eq.
    8-9): exact from the active set for polyhedral sets, from the fixed point
    otherwise; both work in forward and reverse mode.

    Everything that does not depend on the instance (lifting, equilibration,
    factorisation of the affine projection) happens once, here, in float64 on the
    host. How gradients are computed is set by `adjoint` (see
    `pinet_eqx.ImplicitAdjoint`). The output always satisfies the equality
    constraints up to rounding, whatever the number of iterations; inequalities
    converge linearly, cones typically sub-linearly. If a context makes the set
    empty, `solve` reports `RESULTS.infeasible` (the iterates certify it) instead
    of returning NaN.

    **Arguments:**

    - `constraints`: a constraint set or a non-empty list of them (`Equality`,
        `AffineInequality`, `Box`, `SecondOrderCone`, `L1NormCone`, `LInfNormCone`,
        `Simplex`). Their intersection is projected onto. Vector data may be
        `Parameter`s; so may matrices, in which case the lifted matrix is
        equilibrated and QR-factorised per instance inside the call (and gradients
        reach the matrices too).
    - `sigma`: Douglas-Rachford scaling $\\sigma > 0$, or `"auto"` (default):
        $\\sigma = 0.2 / \\mathrm{gmean}(d_y^2)$, with $d_y$ the equilibration's
        column scaling of $y$. In equilibrated coordinates the prox sees
        $\\sigma d_i^2$, so this makes the step invariant to how $y$ is scaled; on
        the paper's DC3 problems it gives 0.062 (small) and 0.145 (large), next to
        the paper's tuned 0.068 and 0.161, and on other problems it avoids the
        10-50x slow-downs of a fixed value. With per-instance matrices $d_y$, and so
        $\\sigma$, are computed per instance.
    - `omega`: relaxation $\\omega \\in (0, 2)$.
    - `n_iter`: forward iterations in training mode.
    - `n_iter_test`: forward iterations in inference mode
        (`eqx.nn.inference_mode`).
    - `tol`: if given, each instance stops as soon as its constraint violation and
        fixed-point residual (user units) are at most `tol`, checked every 5
        iterations, with the iteration count (rounded up to a multiple of 5) as a
        cap. Also the threshold for `ProjectionSolution.result`; when `None`
        (fixed iteration count), `result` is judged against `1e-5`.
    - `equilibrate`: run modified Ruiz equilibration on the lifted matrix.
    - `equilibrate_iters`, `equilibrate_tol`, `equilibrate_mode`: its $K$,
        $\\varepsilon$ and update mode (`"gauss_seidel"` or `"jacobi"`).
    - `equilibrate_y`: `"shared"` (default) gives every coordinate of $y$ one
        column scale, so the projection's objective $\\|y - y_{raw}\\|^2$ stays
        isotropic in the scaled coordinates and `sigma` has one meaning for all of
        them; rows and auxiliary variables are still balanced freely.
        `"per_column"` is the paper's variant (App. H.1), one scale per column.
        On DC3 both need the same iterations; on the paper's second-order-cone
        problem (App. B.4, 500 + 500) `"shared"` needs 3x fewer (see
        `benchmarks/RESULTS.md`).
    - `affine_form`: how the affine projection is factorised: `"nullspace"`
        ($2k(d+m)$ flops per iteration, $k = d - \\mathrm{rank}(E)$),
        `"eliminated"` ($d^2 + 2md$), or `"auto"` (the cheaper). Both are exact.
    - `adjoint`: how derivatives are computed: `pinet_eqx.ImplicitAdjoint()`
        (default) or `pinet_eqx.UnrolledAdjoint()` (needs `tol=None`).
    - `unroll`, `n_iter_bwd`, `bwd_rtol`, `bwd_atol`, `bwd_failure`: deprecated
        aliases (with a `DeprecationWarning`) for `adjoint=UnrolledAdjoint()` and
        `adjoint=ImplicitAdjoint(max_steps=..., rtol=..., atol=...,
        on_failure=...)`.
    - `check_inputs`: check at run time that `y_raw` is finite and that
        parameterised bounds are ordered (`eqx.error_if`).
    - `dim`: the output dimension $d$, only needed when no constraint implies it.
    - `inference`: start in inference mode.
    - `refine`: finish with iterative refinement, residuals computed exactly
        (Ozaki splitting), so that in float32 the constraints hold to the
        rounding of $y$ itself rather than of the products that made it.
        `"auto"` (default) refines in inference mode, wherever it applies: for
        polyhedral sets with fixed matrices, two steps onto the active (and
        violated) rows, $y \\leftarrow y - \\delta$ with $\\delta$ the
        minimum-norm solution of the active rows' residuals (the active-set
        solve of the backward pass), each kept only where it is finite and no
        less feasible; otherwise, with fixed equality matrices, $y \\leftarrow
        y - E^+ (E y - q)$. `True` refines in both modes and requires one of
        these; `False` turns it off. Gradients are those of the unrefined map
        (the correction is at rounding level near the solution).
    """

    dim: int = eqx.field(static=True)
    n_eq: int = eqx.field(static=True)
    n_ineq: int = eqx.field(static=True)
    n_cone: int = eqx.field(static=True)
    sigma: float
    omega: float
    n_iter: int = eqx.field(static=True)
    n_iter_test: int = eqx.field(static=True)
    tol: float | None = eqx.field(static=True)
    adjoint: AbstractAdjoint
    check_inputs: bool = eqx.field(static=True)
    equilibrated: bool = eqx.field(static=True)
    per_instance_matrices: bool = eqx.field(static=True)
    auto_sigma: bool = eqx.field(static=True)
    equilibrate_settings: tuple[int, float, str] = eqx.field(static=True)
    parameters: tuple[tuple[str, tuple[int, ...]], ...] = eqx.field(static=True)
    dropped_equality_rows: tuple[int, ...] = eqx.field(static=True)
    groups: tuple[blocks.Group, ...] = eqx.field(static=True)
    box_index: tuple[int, ...] = eqx.field(static=True)
    n_column_groups: int = eqx.field(static=True)
    inference: bool
    op: AbstractAffineProjection | None
    active_rows: FixedRows | None
    refine_always: bool = eqx.field(static=True)
    refinement: EqualityRefinement | RowResidual | None
    column_groups: Int[Array, " n"] | None
    E: _Segments
    C: _Segments
    q: _Segments
    ineq_lower: _Segments
    ineq_upper: _Segments
    cone_offset: _Segments
    totals: _Segments
    box_lower: Float[Array, " d"]
    box_upper: Float[Array, " d"]
    box_params: tuple  # tuple[(Int[Array, " k"], lower, upper), ...]

    def __init__(
        self,
        constraints: AbstractConstraint | Sequence[AbstractConstraint],
        *,
        sigma: float | Literal["auto"] = "auto",
        omega: float = 1.7,
        n_iter: int = 50,
        n_iter_test: int | None = None,
        tol: float | None = None,
        adjoint: AbstractAdjoint | None = None,
        equilibrate: bool = True,
        equilibrate_iters: int = 25,
        equilibrate_tol: float = 1e-3,
        equilibrate_mode: Literal["gauss_seidel", "jacobi"] = "gauss_seidel",
        equilibrate_y: Literal["shared", "per_column"] = "shared",
        affine_form: Literal["auto", "nullspace", "eliminated"] = "auto",
        check_inputs: bool = True,
        dim: int | None = None,
        inference: bool = False,
        refine: bool | Literal["auto"] = "auto",
        unroll: bool | None = None,
        n_iter_bwd: int | None = None,
        bwd_rtol: float | None = None,
        bwd_atol: float | None = None,
        bwd_failure: Literal["warn", "raise", "ignore"] | None = None,
    ):
        if isinstance(constraints, AbstractConstraint):
            constraints = [constraints]
        constraints = list(constraints)
        if len(constraints) == 0:
            raise ValueError(EMPTY_CONSTRAINTS)
        for i, c in enumerate(constraints):
            if not isinstance(c, AbstractConstraint):
                raise TypeError(NOT_A_CONSTRAINT.format(index=i, kind=type(c).__name__))
        adjoint = _deprecated_adjoint(
            ImplicitAdjoint() if adjoint is None else adjoint,
            adjoint is not None,
            dict(
                unroll=unroll,
                n_iter_bwd=n_iter_bwd,
                bwd_rtol=bwd_rtol,
                bwd_atol=bwd_atol,
                bwd_failure=bwd_failure,
            ),
        )
        _check_settings(
            sigma=1.0 if sigma == "auto" else sigma,
            omega=omega,
            n_iter=n_iter,
            n_iter_test=n_iter_test,
            tol=tol,
            adjoint=adjoint,
        )

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

        lifted = LiftedPieces.merge([c.lift(dim) for c in constraints])
        eq_rows, ineq_rows, boxes = lifted.eq, lifted.ineq, lifted.box
        cones, groups = blocks.layout(lifted.cones)

        params: dict[str, tuple[int, ...]] = {}

        def segments(items, cols=None) -> _Segments:
            """Fixed pieces as arrays, `Parameter`s registered with their shape."""
            out = []
            for value, shape in items:
                if isinstance(value, Parameter):
                    if cols is not None and value.shape is not None:
                        shape = value.shape
                        if shape[-1] != cols:
                            raise ValueError(
                                f"Projector(constraints): matrix Parameter("
                                f"{value.name!r}) has shape {shape}, but the "
                                f"projector's vectors have size {cols}."
                            )
                    _register(params, value.name, shape)
                    out.append(value)
                else:
                    out.append(jnp.asarray(value))
            return tuple(out)

        E_items = [(E, (_rows(E), dim)) for E, _ in eq_rows]
        C_items = [(C, (_rows(C), dim)) for C, _, _ in ineq_rows]
        C_items += [(M, _matrix_shape(M, dim)) for b in cones for M in b.rows]
        per_instance = any(isinstance(M, Parameter) for M, _ in E_items + C_items)
        n_box_rows = sum(_rows(C) for C, _, _ in ineq_rows)
        n_cone = sum(b.size for b in cones)
        if equilibrate_y not in ("shared", "per_column"):
            raise ValueError(
                f"Projector(equilibrate_y={equilibrate_y!r}): must be 'shared' or "
                "'per_column'."
            )
        # Column scale groups: all of y (or each y column), each box row's w, and
        # each cone block.
        y_labels = np.zeros(dim, int) if equilibrate_y == "shared" else np.arange(dim)
        labels = np.concatenate(
            [y_labels, dim + np.arange(n_box_rows)]
            + [np.full(b.size, dim + n_box_rows + i) for i, b in enumerate(cones)]
        )
        col_groups, n_col_groups = group_labels(labels, labels.size)

        q_items = [(b, (_rows(E),)) for E, b in eq_rows]
        if per_instance:
            op = None
            dropped = ()
            d_y_host = None
        else:
            E_fixed = _stack([E for E, _ in E_items], dim)
            C_fixed = _stack([C for C, _ in C_items], dim)
            op, info = build_affine_projection(
                E_fixed,
                C_fixed,
                equilibrate=equilibrate,
                eq_max_iter=equilibrate_iters,
                eq_tol=equilibrate_tol,
                eq_mode=equilibrate_mode,
                form=affine_form,
                column_groups=col_groups,
            )
            if q_items and not any(isinstance(b, Parameter) for b, _ in q_items):
                _check_consistent(
                    E_fixed, np.concatenate([b for b, _ in q_items]), info
                )
            dropped = tuple(int(i) for i in info.dropped_rows)
            d_y_host = np.asarray(info.d_y)

        # Fixed boxes are intersected now; parameterised ones at call time.
        box_lower = np.full((dim,), -np.inf)
        box_upper = np.full((dim,), np.inf)
        box_params = []
        for idx, lo, up in boxes:
            if isinstance(lo, Parameter) or isinstance(up, Parameter):
                lo_seg = segments([(lo, (idx.size,))])[0]
                up_seg = segments([(up, (idx.size,))])[0]
                box_params.append((jnp.asarray(idx), lo_seg, up_seg))
            if not isinstance(lo, Parameter):
                box_lower[idx] = np.maximum(box_lower[idx], lo)
            if not isinstance(up, Parameter):
                box_upper[idx] = np.minimum(box_upper[idx], up)
        check_bounds_order(
            box_lower, box_upper, "Projector(constraints): the Box constraints together"
        )

        self.dim = int(dim)
        self.n_eq = sum(_rows(E) for E, _ in eq_rows)
        self.n_ineq = int(n_box_rows)
        self.n_cone = int(n_cone)
        self.per_instance_matrices = per_instance
        self.auto_sigma = sigma == "auto"
        if self.auto_sigma:
            # Per-instance matrices are scaled per instance, so sigma is too (in
            # `solve`); this is then the constant it is computed from.
            sigma = _AUTO_SIGMA if per_instance else _auto_sigma(np, d_y_host)
        self.sigma = float(sigma)
        self.omega = omega
        self.n_iter = int(n_iter)
        self.n_iter_test = int(n_iter if n_iter_test is None else n_iter_test)
        self.tol = None if tol is None else float(tol)
        self.adjoint = adjoint
        self.check_inputs = bool(check_inputs)
        self.equilibrated = bool(equilibrate)
        self.equilibrate_settings = (
            int(equilibrate_iters),
            float(equilibrate_tol),
            str(equilibrate_mode),
        )
        self.dropped_equality_rows = dropped
        self.groups = tuple(groups)
        # Coordinates of y with a finite (or parameterised) bound: the box rows
        # of the active-set derivative.
        bounded = np.isfinite(box_lower) | np.isfinite(box_upper)
        for idx, _, _ in box_params:
            bounded[np.asarray(idx)] = True
        self.box_index = tuple(int(i) for i in np.flatnonzero(bounded))
        self.active_rows = (
            FixedRows.build(E_fixed, C_fixed, np.asarray(self.box_index, int))
            if not per_instance and not self.groups
            else None
        )
        self.n_column_groups = int(n_col_groups)
        self.inference = inference
        self.op = op
        if refine not in (True, False, "auto"):
            raise ValueError(
                f"Projector(refine={refine!r}): must be True, False or 'auto'."
            )
        if refine is True and (
            per_instance or not (E_items or self.active_rows is not None)
        ):
            raise ValueError(REFINE_NEEDS_FIXED_EQUALITY)
        # "auto" refines at inference only: it costs compile time (two more
        # solves per call), and training does not need rounding-level feasibility.
        self.refine_always = refine is True
        if not refine or per_instance:
            self.refinement = None
        elif self.active_rows is not None and self.n_ineq + len(self.box_index):
            # Polyhedral with fixed matrices: the active rows are refined too.
            self.refinement = RowResidual.build(np.concatenate([E_fixed, C_fixed]))
        elif E_items:
            self.refinement = EqualityRefinement.build(E_fixed)
        else:
            self.refinement = None
        self.column_groups = jnp.asarray(col_groups) if per_instance else None
        self.E = segments(E_items, cols=dim)
        self.C = segments(C_items, cols=dim)
        self.q = segments(q_items)
        self.ineq_lower = segments([(lo, (_rows(C),)) for C, lo, _ in ineq_rows])
        self.ineq_upper = segments([(up, (_rows(C),)) for C, _, up in ineq_rows])
        self.cone_offset = segments([(o, shape_of(o)) for b in cones for o in b.offset])
        self.totals = segments([(b.total, ()) for b in cones if b.kind == "simplex"])
        self.box_lower = jnp.asarray(box_lower)
        self.box_upper = jnp.asarray(box_upper)
        self.box_params = tuple(box_params)
        self.parameters = tuple(sorted(params.items()))

    def with_settings(self, **settings) -> Projector:
        """A copy with different solver settings; the factorisation is reused.

        Accepts `sigma`, `omega`, `n_iter`, `n_iter_test`, `tol`, `adjoint`,
        `check_inputs` and `inference`, and the deprecated `unroll`, `n_iter_bwd`,
        `bwd_rtol`, `bwd_atol` and `bwd_failure` (which adjust `adjoint`). (The
        static settings cannot be changed with `eqx.tree_at`.)

        **Returns:** a new `Projector`.
        """
        unknown = sorted(set(settings) - _SETTINGS - set(_DEPRECATED))
        if unknown:
            raise TypeError(
                f"Projector.with_settings: unknown setting(s) {unknown}; valid "
                f"settings are {sorted(_SETTINGS)}. Constraint data and "
                "equilibration need a new Projector."
            )
        deprecated = {k: settings.pop(k) for k in _DEPRECATED if k in settings}
        if deprecated:
            base = settings.get("adjoint", self.adjoint)
            settings["adjoint"] = _deprecated_adjoint(
                base, "adjoint" in settings, deprecated
            )
        _check_settings(**{**{k: getattr(self, k) for k in _SETTINGS}, **settings})
        new = copy.copy(self)
        if "sigma" in settings:
            object.__setattr__(new, "auto_sigma", False)
        for k, v in settings.items():
            # Equinox modules are frozen dataclasses; this is a fresh copy, so
            # setting its fields bypasses nothing that other references can see.
            object.__setattr__(new, k, v)
        return new

    # ------------------------------------------------------------------ calls

    def __call__(self, y_raw: Float[ArrayLike, " d"], **params) -> Float[Array, " d"]:
        """Project one point: $y = \\Pi_{\\mathcal{C}}(y_{raw})$.

        **Arguments:**

        - `y_raw`: the point to project, shape `(d,)`. Batch with `jax.vmap`.
        - `**params`: one value per `Parameter` name, each of shape `(k,)`.

        **Returns:** the projected point, shape `(d,)`.
        """
        # Only y: the diagnostics of `solve` would cost nothing at run time (XLA
        # drops them) but their tracing and lowering add to every compile.
        return self._solve(y_raw, None, params, diagnostics=False)

    def solve(
        self, y_raw: Float[ArrayLike, " d"], s0=None, **params
    ) -> ProjectionSolution:
        """Project one point and return the solution with its diagnostics.

        **Arguments:**

        - `y_raw`: the point to project, shape `(d,)`.
        - `s0`: optional warm start for the governing sequence (for example
            `solution.s` from a nearby instance), shape `(d + n_ineq,)`. By default
            `y_raw` lifted to $(y_{raw}, C y_{raw})$ in the internal coordinates. No
            gradient flows through it.
        - `**params`: one value per `Parameter` name.

        **Returns:** a `ProjectionSolution`.
        """
        return self._solve(y_raw, s0, params, diagnostics=True)

    @full_precision
    def _solve(self, y_raw, s0, params: dict, diagnostics: bool):
        y_raw = self._check_y(y_raw, "y_raw")
        dtype = y_raw.dtype
        values = self._resolve(params, dtype)
        data = self._data(values, dtype)
        theta = {k: data[k] for k in _THETA_KEYS}
        theta["y_raw"] = y_raw
        if self.per_instance_matrices:
            op_arg = None
            op = self._factorise(data)
            theta["op"] = op
            sigma = (
                jax.lax.stop_gradient(_auto_sigma(jnp, op.d_y))
                if self.auto_sigma
                else self.sigma
            )
        else:
            op_arg = op = jax.tree.map(
                lambda a: jax.lax.stop_gradient(a).astype(dtype), self.op
            )
            sigma = self.sigma
        n = self.dim + self.n_ineq + self.n_cone
        if s0 is None:
            # Start from y_raw lifted into the internal coordinates; this saves a
            # few iterations over the paper's s0 = 0 and changes no fixed point.
            s0 = jnp.concatenate([y_raw / op.d_y, (data["C"] @ y_raw) / op.d_w])
        else:
            s0 = jnp.asarray(s0, dtype)
            if s0.shape != (n,):
                raise ValueError(
                    f"Projector.solve(y_raw, s0): `s0` must have shape ({n},) (the "
                    f"lifted dimension d + n_ineq + n_cone), got {s0.shape}. Pass "
                    "`solution.s` from an earlier call."
                )
        s0 = jax.lax.stop_gradient(s0)
        if self.check_inputs:
            # Checked on the start, which every path consumes but no derivative
            # flows through: the check then stays out of the traced derivative
            # rules (and their compile time).
            bad = ~jnp.all(jnp.isfinite(jax.lax.stop_gradient(y_raw)))
            s0 = eqx.error_if(s0, bad, NAN_Y_RAW)
        n_max = self.n_iter_test if self.inference else self.n_iter
        omega = self.omega
        if n == self.dim and self.n_eq == 0:
            # Only boxes: the projection is a clip, exact in one step.
            y = jnp.clip(y_raw, theta["lb_y"], theta["ub_y"])
            if not diagnostics:
                return y
            zero = jnp.zeros((), dtype)
            return ProjectionSolution(
                y=y,
                s=s0,
                n_steps=jnp.asarray(0),
                primal_residual=jax.lax.stop_gradient(self._violation(y, data)),
                fixed_point_residual=zero,
                result=RESULTS.successful,
            )
        polyhedral = not self.groups
        adjoint = self.adjoint
        flags = None  # the active set, where the iteration reports it
        if isinstance(adjoint, UnrolledAdjoint):
            P = dr.prepare(theta, op, sigma, self.groups)
            s, n_steps, fp = dr.iterate(s0, P, op, omega, n_max, None)
            y = None
        elif adjoint.uses_active_set(polyhedral):
            inputs = self._inputs(y_raw, data)
            # Keyword arguments of a custom_jvp carry no tangents.
            forward, fixed = jax.lax.stop_gradient(
                (
                    _active_set.Forward(op=op, s0=s0, sigma=jnp.asarray(sigma, dtype)),
                    self.active_rows,
                )
            )
            cfg = (omega, n_max, self.tol, adjoint.solver(polyhedral), self.box_index)
            y, (s, n_steps, fp, *flags) = _active_set.project(
                inputs, forward=forward, fixed=fixed, cfg=cfg
            )
        else:
            s, n_steps, fp = fixed_point(
                theta,
                s0,
                op_arg,
                (sigma, omega),
                groups=self.groups,
                n_max=n_max,
                tol=self.tol,
                solver=adjoint.solver(polyhedral),
            )
            y = None
        # On the active-set path y already is D_y [Pi_A(s)]_y; otherwise it is
        # computed here, and the same z (and t, which only the status needs)
        # feeds the infeasibility certificate.
        if y is None or diagnostics:
            P = dr.prepare(theta, op, sigma, self.groups)
            z, t = dr.z_and_t(s, P, op)
        if y is None:
            y = op.d_y * z[: self.dim]
        if self.refinement is not None and (self.inference or self.refine_always):
            # The correction is at rounding level, so the derivative of the
            # unrefined map is kept (stop_gradient).
            y_plain = jax.lax.stop_gradient(y)
            if isinstance(self.refinement, RowResidual):
                if flags is None:
                    # Off the active-set path, P and z were computed above.
                    flags = _active_set.activity(s, P, op, z)
                fix = self._refine_active(y_plain, data, *flags)
            else:
                fix = self.refinement(y_plain, data["q"])
            # y - y is exactly zero, so the value is exactly `fix`.
            y = (y - y_plain) + jax.lax.stop_gradient(fix)
        if not diagnostics:
            return y
        viol = jax.lax.stop_gradient(self._violation(y, data))
        fp = jax.lax.stop_gradient(fp)
        tol = 1e-5 if self.tol is None else self.tol
        infeasible = dr.certifies_infeasibility(*jax.lax.stop_gradient((z, t, P, op)))
        result = RESULTS.where(
            (viol <= tol) & (fp <= tol),
            RESULTS.successful,
            RESULTS.where(infeasible, RESULTS.infeasible, RESULTS.max_steps_reached),
        )
        return ProjectionSolution(
            y=y,
            s=s,
            n_steps=jnp.asarray(n_steps),
            primal_residual=viol,
            fixed_point_residual=fp,
            result=result,
        )

    def _inputs(self, y_raw, data) -> _active_set.Inputs:
        per_instance = self.per_instance_matrices
        return _active_set.Inputs(
            y_raw=y_raw,
            q=data["q"],
            lb_y=data["lb_y"],
            ub_y=data["ub_y"],
            lb_w=data["lb_w"],
            ub_w=data["ub_w"],
            E=data["E"] if per_instance else None,
            C=data["C"] if per_instance else None,
        )

    def _refine_active(self, y, data, hi, lo):
        """`y` refined onto its active rows (see `_active_set.refine`), kept only
        where that is finite and no less feasible."""
        inputs, fixed, hi, lo = jax.lax.stop_gradient(
            (self._inputs(y, data), self.active_rows, hi, lo)
        )
        # The forward pass does not warn: a failed refinement is simply dropped.
        solver = ConjugateGradient(on_failure="ignore")
        # Two steps: far from the set the first correction is large, and its
        # own rounding (and an approximate active set) leave a second, small one.
        fix = y
        for _ in range(_REFINE_STEPS):
            fix = _active_set.refine(
                self.refinement, fixed, fix, inputs, hi, lo, self.box_index, solver
            )
        # Violations computed in the working precision are only good to a few
        # ulps of the products, hence the slack: this rejects a correction that
        # goes astray (an inconsistent active set), not rounding noise.
        slack = 64 * jnp.finfo(y.dtype).eps * (1 + jnp.max(jnp.abs(y)))
        keep = jnp.all(jnp.isfinite(fix)) & (
            self._violation(fix, data) <= self._violation(y, data) + slack
        )
        return jnp.where(keep, fix, y)

    @full_precision
    def violation(self, y: Float[ArrayLike, " d"], **params) -> Float[Array, ""]:
        """Maximum absolute constraint violation of `y`, in the user's coordinates.

        $\\max(\\|E y - q\\|_\\infty, \\|(\\ell - C y)_+\\|_\\infty,
        \\|(C y - u)_+\\|_\\infty, \\text{box terms})$, computed from the original
        (unscaled) data, whatever the equilibration.

        **Arguments:**

        - `y`: a point, shape `(d,)`.
        - `**params`: one value per `Parameter` name.

        **Returns:** a scalar.
        """
        y = self._check_y(y, "y")
        values = self._resolve(params, y.dtype)
        return self._violation(y, self._data(values, y.dtype))

    # -------------------------------------------------------------- internals

    def _check_y(self, y, argname):
        y = jnp.asarray(y)
        if not jnp.issubdtype(y.dtype, jnp.floating):
            y = y.astype(jnp.result_type(float))
        if y.shape != (self.dim,):
            hint = (
                " To project a batch, use `jax.vmap(proj)(Y, **params)`."
                if y.ndim == 2 and y.shape[-1] == self.dim
                else ""
            )
            raise ValueError(
                f"Projector: `{argname}` must have shape ({self.dim},) (one instance),"
                f" got {y.shape}.{hint}"
            )
        return y

    def _resolve(self, params: dict, dtype) -> dict:
        expected = dict(self.parameters)
        missing = sorted(set(expected) - set(params))
        unknown = sorted(set(params) - set(expected))
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if unknown:
                parts.append(f"unknown {unknown}")
            raise TypeError(
                f"Projector: parameter mismatch ({'; '.join(parts)}). This projector "
                f"expects exactly {sorted(expected) or 'no parameters'} as keyword "
                "arguments."
            )
        values = {}
        for name, shape in expected.items():
            v = jnp.asarray(params[name])
            if v.shape != shape:
                hint = (
                    " To batch, vmap over instances instead of passing a batch."
                    if v.ndim == len(shape) + 1 and v.shape[1:] == shape
                    else ""
                )
                raise ValueError(
                    f"Projector: parameter `{name}` must have shape {shape} for one "
                    f"instance, got {v.shape}.{hint}"
                )
            values[name] = v.astype(dtype)
        return values

    def _assemble(self, segments, values, dtype, cols=None):
        shape = (-1,) if cols is None else (-1, cols)
        parts = [
            (values[s.name] if isinstance(s, Parameter) else s.astype(dtype)).reshape(
                shape
            )
            for s in segments
        ]
        if not parts:
            return jnp.zeros((0,) if cols is None else (0, cols), dtype)
        return jnp.concatenate(parts)

    def _data(self, values, dtype):
        """The per-instance constraint data in the user's coordinates: matrices `E`,
        `C` (inequality rows, then cone rows), right-hand side `q`, bounds
        `lb_y, ub_y, lb_w, ub_w`, cone offsets and simplex totals."""
        lb = self.box_lower.astype(dtype)
        ub = self.box_upper.astype(dtype)
        for idx, lo, up in self.box_params:
            if isinstance(lo, Parameter):
                lb = lb.at[idx].max(values[lo.name])
            if isinstance(up, Parameter):
                ub = ub.at[idx].min(values[up.name])
        l_w = self._assemble(self.ineq_lower, values, dtype)
        u_w = self._assemble(self.ineq_upper, values, dtype)
        totals = self._assemble(self.totals, values, dtype)
        if self.check_inputs and self._has_bound_params():
            crossed = jnp.any(lb > ub) | jnp.any(l_w > u_w) | jnp.any(totals < 0)
            lb = eqx.error_if(lb, crossed, PARAM_BOUNDS_CROSSED)
        return dict(
            E=self._assemble(self.E, values, dtype, cols=self.dim),
            C=self._assemble(self.C, values, dtype, cols=self.dim),
            q=self._assemble(self.q, values, dtype),
            lb_y=lb,
            ub_y=ub,
            lb_w=l_w,
            ub_w=u_w,
            cone_offset=self._assemble(self.cone_offset, values, dtype),
            totals=totals,
        )

    def _has_bound_params(self):
        return bool(self.box_params) or any(
            isinstance(s, Parameter)
            for s in self.ineq_lower + self.ineq_upper + self.totals
        )

    def _factorise(self, data):
        """The per-instance affine projection (equilibrated, QR-factorised)."""
        iters, tol, mode = self.equilibrate_settings
        op, conditioning = build_affine_projection_traced(
            data["E"],
            data["C"],
            equilibrate=self.equilibrated,
            eq_max_iter=iters,
            eq_tol=tol,
            eq_mode=mode,
            column_groups=self.column_groups,
            n_groups=self.n_column_groups,
        )
        if self.check_inputs:
            eps = jnp.finfo(data["E"].dtype).eps
            op = eqx.error_if(op, conditioning < 100 * eps, RANK_DEFICIENT)
        return op

    def _violation(self, y, data):
        w = data["C"] @ y
        w_box, w_cone = w[: self.n_ineq], w[self.n_ineq :]
        terms = [
            _max_abs(data["E"] @ y - data["q"]),
            _max_abs(jnp.maximum(data["lb_y"] - y, 0)),
            _max_abs(jnp.maximum(y - data["ub_y"], 0)),
            _max_abs(jnp.maximum(data["lb_w"] - w_box, 0)),
            _max_abs(jnp.maximum(w_box - data["ub_w"], 0)),
        ]
        if self.groups:
            u = w_cone + data["cone_offset"]
            terms.append(blocks.violation(u, self.groups, data["totals"]))
        return jnp.max(jnp.stack(terms))


# sigma * gmean(d_y^2) at the best sigma: 0.18 (DC3 small), about 0.25 (DC3 large),
# 0.03-0.3 on random polytopes (see benchmarks/RESULTS.md).
_AUTO_SIGMA = 0.2

# Refinement steps onto the active rows (see `Projector._refine_active`).
_REFINE_STEPS = 2

# The per-instance data that the fixed point depends on (and differentiates).
_THETA_KEYS = ("q", "lb_y", "ub_y", "lb_w", "ub_w", "cone_offset", "totals")

_SETTINGS = frozenset(
    {
        "sigma",
        "omega",
        "n_iter",
        "n_iter_test",
        "tol",
        "adjoint",
        "check_inputs",
        "inference",
    }
)
# Old keywords, mapped onto `adjoint` with a DeprecationWarning (one release).
_DEPRECATED = ("unroll", "n_iter_bwd", "bwd_rtol", "bwd_atol", "bwd_failure")


def _register(params: dict, name: str, shape: tuple[int, ...]) -> None:
    if name in params and params[name] != shape:
        raise ValueError(
            f"Projector(constraints): Parameter({name!r}) is used for data of shape "
            f"{params[name]} and {shape}; one name must always have one shape."
        )
    params[name] = shape


def _rows(M) -> int:
    """Rows a matrix piece contributes (a vector `Parameter` is one row)."""
    shape = M.shape
    return shape[0] if len(shape) == 2 else 1


def _matrix_shape(M, dim: int) -> tuple[int, ...]:
    return tuple(M.shape) if isinstance(M, Parameter) else (_rows(M), dim)


def _stack(matrices, dim: int) -> np.ndarray:
    if not matrices:
        return np.zeros((0, dim))
    return np.concatenate([np.asarray(M).reshape(-1, dim) for M in matrices], 0)


def _auto_sigma(xp, d_y):
    """$\\sigma = 0.2 / \\mathrm{gmean}(d_y^2)$ (see `Projector`'s `sigma`)."""
    return _AUTO_SIGMA / xp.exp(xp.mean(xp.log(d_y**2)))


def _check_consistent(E, q, info) -> None:
    y0 = info.particular_solution(q)
    res = np.abs(E @ y0 - q)
    scale = 1.0 + np.max(np.abs(q)) + np.max(np.abs(E)) * np.max(np.abs(y0))
    bad = np.flatnonzero(res > 1e-9 * scale * max(E.shape))
    if bad.size:
        raise ValueError(
            INCONSISTENT_EQUALITY.format(
                dropped=info.dropped_rows.size,
                rows=bad[:10].tolist(),
                residual=float(res.max()),
            )
        )


def _deprecated_adjoint(
    adjoint: AbstractAdjoint, explicit: bool, old: dict
) -> AbstractAdjoint:
    """Map the deprecated backward keywords onto an adjoint, with a warning."""
    old = {k: v for k, v in old.items() if v is not None}
    if not old:
        return adjoint
    if explicit:
        raise ValueError(
            f"Projector: pass either `adjoint=` or the deprecated {sorted(old)}, "
            "not both."
        )
    warnings.warn(
        f"Projector({', '.join(sorted(old))}=...) is deprecated and will be removed "
        "in the next release: use `adjoint=pinet_eqx.UnrolledAdjoint()` instead of "
        "`unroll=True`, and `adjoint=pinet_eqx.ImplicitAdjoint(max_steps=..., "
        "rtol=..., atol=..., on_failure=...)` instead of `n_iter_bwd`, `bwd_rtol`, "
        "`bwd_atol` and `bwd_failure`.",
        DeprecationWarning,
        stacklevel=3,
    )
    unroll = old.pop("unroll", None)
    if unroll:
        return UnrolledAdjoint()
    base = adjoint if isinstance(adjoint, ImplicitAdjoint) else ImplicitAdjoint()
    renamed = dict(
        n_iter_bwd="max_steps",
        bwd_rtol="rtol",
        bwd_atol="atol",
        bwd_failure="on_failure",
    )
    return dataclasses.replace(base, **{renamed[k]: v for k, v in old.items()})


def _check_settings(*, sigma, omega, n_iter, n_iter_test, tol, adjoint, **_):
    if not (isinstance(sigma, (int, float)) and sigma > 0):
        raise ValueError(f"Projector(sigma={sigma!r}): sigma must be a float > 0.")
    if not (isinstance(omega, (int, float)) and 0 < omega < 2):
        raise ValueError(
            f"Projector(omega={omega!r}): omega must lie in (0, 2); 1.7 is a good "
            "default."
        )
    if not (isinstance(n_iter, int) and n_iter >= 1):
        raise ValueError(f"Projector(n_iter={n_iter!r}): must be an int >= 1.")
    if n_iter_test is not None and not (
        isinstance(n_iter_test, int) and n_iter_test >= 1
    ):
        raise ValueError(
            f"Projector(n_iter_test={n_iter_test!r}): must be an int >= 1 or None "
            "(same as n_iter)."
        )
    if tol is not None and not (isinstance(tol, (int, float)) and tol > 0):
        raise ValueError(f"Projector(tol={tol!r}): must be a float > 0 or None.")
    if not isinstance(adjoint, AbstractAdjoint):
        raise TypeError(
            f"Projector(adjoint={adjoint!r}): must be pinet_eqx.ImplicitAdjoint() or "
            "pinet_eqx.UnrolledAdjoint()."
        )
    if isinstance(adjoint, UnrolledAdjoint) and tol is not None:
        raise ValueError(
            "Projector(adjoint=UnrolledAdjoint(), tol=...): unrolled differentiation "
            "needs a fixed iteration count; set tol=None."
        )
