"""The projection layer: `Projector`."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal, cast

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._active_set.derivative import FixedRows
from .._active_set.face import SparseRows
from .._adjoint.adjoint import AbstractAdjoint, ImplicitAdjoint, check_adjoint
from .._linalg.equilibration import Equilibration
from .._linalg.precision import full_precision
from .._linalg.residual import RowResidual
from .._problem.lifting import LiftedProblem
from .._problem.parameter_map import AffineParameterMap
from .._sets import AbstractConstraint
from .._solver.affine import AbstractAffineProjection
from .._solver.settings import DouglasRachford, solver_from_keywords
from .._solver.solution import ProjectionSolution
from . import compat as _compat, forward, settings as _settings
from .build import build, check_polish, lift
from .frozen import freeze, thaw
from .mesh import per_instance


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
    host, and is stored frozen: optimisers and weight decay cannot change it, even
    in a plain `eqx.partition(model, eqx.is_inexact_array)` training loop. The
    output satisfies the equality constraints up to rounding, whatever the number
    of iterations; inequalities converge linearly, cones typically sub-linearly. If
    a context makes the set empty, `solve` reports `RESULTS.infeasible`.

    **Arguments:**

    - `constraints`: a constraint set or a non-empty list of them (`Equality`,
        `AffineInequality`, `Box`, `SecondOrderCone`, `L1NormCone`, `LInfNormCone`,
        `Simplex`, or your own `AbstractConstraint`). Their intersection is
        projected onto. Vector data may be `Parameter`s; so may matrices, in which
        case the lifted matrix is equilibrated and QR-factorised per instance
        inside the call (and gradients reach the matrices too).
    - `solver`: the forward solver's settings, a `pinet_eqx.DouglasRachford`.
    - `sigma`, `omega`, `n_iter`, `n_iter_test`, `tol`: shorthands for the fields
        of `DouglasRachford` (pass either these or `solver`).
    - `adjoint`: how derivatives are computed: `pinet_eqx.ImplicitAdjoint()`
        (default) or `pinet_eqx.UnrolledAdjoint()` (needs `tol=None`).
    - `equilibrate`: `True` (default) for `pinet_eqx.Equilibration()`, an
        `Equilibration` with other settings, or `False` for none.
    - `affine_form`: how the affine projection is factorised: `"nullspace"`
        ($2k(d+m)$ flops per iteration, $k = d - \\mathrm{rank}(E)$),
        `"eliminated"` ($d^2 + 2md$), `"dense"` ($(d + m)^2$ in a single
        matrix product, which may suit a GPU), `"sparse"` (a sparse LU of
        $\\tilde M \\tilde M^\\top$ on the host, applied by level-scheduled
        triangular solves; cost set by the factor's nonzeros, and no dense
        $d \\times d$ or $m \\times m$ array anywhere), or `"auto"` (the cheaper
        of the first two, or `"sparse"` for sparse input on large problems).
        All are exact. Matrices may be given as `scipy.sparse` matrices or
        `jax.experimental.sparse.BCOO`; the sparse form is polished on the
        host (an active-set method, see `polish`), has no refinement yet, and
        takes no matrix `Parameter`s.
    - `check_inputs`: check at run time that `y_raw` is finite and that
        parameterised bounds are ordered (`eqx.error_if`).
    - `dim`: the output dimension $d$, only needed when no constraint implies it.
    - `inference`: start in inference mode.
    - `refine`: finish with iterative refinement, residuals computed exactly
        (Ozaki splitting), so that in float32 the constraints hold to the
        rounding of $y$ itself rather than of the products that made it.
        `"auto"` (default) refines in inference mode: two steps onto the active
        (and violated) constraints, each the minimum-norm correction of their
        residuals (the active-set solve of the backward pass), with cone and
        simplex blocks linearised on their active face (the surface of a
        second-order cone, the facet of an $\\ell_1$ cone, and so on). The
        result is kept only where it is finite, no less feasible and a small
        move. In inference mode, polyhedral sets (no cones) are first
        polished: $y_{raw}$ is projected onto the face of the active set, and
        where that point meets the optimality conditions (feasible, multipliers
        of the right signs) it is the projection, the refinement starts from
        it and the instance is reported successful. `True` refines in both
        modes; `False` turns it off (and the polish). Gradients are those of
        the unrefined map (the correction is at rounding level near the
        solution).
    - `polish`: when polyhedral sets are polished, as `refine` describes:
        `"auto"` (default) at inference, before the refinement; `True` in
        training mode too, where the polished point replaces the iterate
        wherever it is the projection (with the derivative of its face), so
        that fewer training iterations give exact outputs; `False` never,
        which saves its solve (a tenth to a fifth of a polytope's inference
        time) where the iteration is trusted to reach `tol_test` anyway.
        `refine=False` turns it off too.
    - `n_aux`: the number of auxiliary coordinates: the constraints are on
        $(y, v) \\in \\mathbb{R}^{d + n_{aux}}$ and the objective ignores $v$,
        so that $\\mathcal{C} = \\{y : \\exists v,\\ (y, v) \\in \\mathcal{C}'\\}$
        (the paper's lifting, $n \\ge d$; `from_cvxpy` uses it for the
        variables cvxpy introduces). `y_raw` and the output then have $d$
        entries; `solve` returns $v$ as `aux`. Such sets are differentiated
        at the fixed point (no closed-form active set, no polish).
    - `parameter_map`: how `from_cvxpy` passes cvxpy's parameters: an
        affine map, evaluated in JAX at each call, from the call's keyword
        values to those of the constraints' `Parameter`s (built by
        `from_cvxpy`; `None` passes the values through).
    - `unroll`, `n_iter_bwd`, `bwd_rtol`, `bwd_atol`, `bwd_failure`,
        `equilibrate_iters`, `equilibrate_tol`, `equilibrate_mode`,
        `equilibrate_y`: deprecated aliases (with a `DeprecationWarning`) for
        `adjoint=` and `equilibrate=Equilibration(...)`.
    """

    problem: LiftedProblem
    op: AbstractAffineProjection | None
    active_rows: FixedRows | SparseRows | None
    refinement: RowResidual | None
    solver: DouglasRachford
    adjoint: AbstractAdjoint
    equilibration: Equilibration | None = eqx.field(static=True)
    auto_sigma: float | None = eqx.field(static=True)
    dropped_equality_rows: tuple[int, ...] = eqx.field(static=True)
    check_inputs: bool = eqx.field(static=True)
    refine_always: bool = eqx.field(static=True)
    polish: bool | Literal["auto"] = eqx.field(static=True)
    parameter_map: AffineParameterMap | None
    inference: bool

    def __init__(
        self,
        constraints: AbstractConstraint | Sequence[AbstractConstraint],
        *,
        solver: DouglasRachford | None = None,
        sigma: float | Literal["auto"] | None = None,
        omega: float | None = None,
        n_iter: int | None = None,
        n_iter_test: int | None = None,
        tol: float | None = None,
        adjoint: AbstractAdjoint | None = None,
        equilibrate: bool | Equilibration = True,
        affine_form: Literal[
            "auto", "nullspace", "eliminated", "dense", "sparse"
        ] = "auto",
        check_inputs: bool = True,
        dim: int | None = None,
        inference: bool = False,
        refine: bool | Literal["auto"] = "auto",
        polish: bool | Literal["auto"] = "auto",
        n_aux: int = 0,
        parameter_map: AffineParameterMap | None = None,
        **deprecated,
    ):
        pieces, dim = lift(constraints, dim)
        if not isinstance(n_aux, int) or not 0 <= n_aux < dim:
            raise ValueError(
                f"Projector(n_aux={n_aux!r}): must be an int in [0, {dim}) (the "
                f"constraints are on {dim} coordinates, the last n_aux of them "
                "auxiliary)."
            )
        shorthands = dict(
            sigma=sigma, omega=omega, n_iter=n_iter, n_iter_test=n_iter_test, tol=tol
        )
        self.solver = solver_from_keywords(solver, shorthands)
        unknown = sorted(set(deprecated) - _compat.DEPRECATED)
        if unknown:
            raise TypeError(f"Projector: unexpected keyword argument(s) {unknown}.")
        self.adjoint = _compat.adjoint(
            ImplicitAdjoint() if adjoint is None else adjoint,
            adjoint is not None,
            deprecated,
        )
        check_adjoint(self.adjoint, self.solver.tol)
        self.equilibration = _equilibration(equilibrate, deprecated)
        if refine not in (True, False, "auto"):
            raise ValueError(
                f"Projector(refine={refine!r}): must be True, False or 'auto'."
            )

        shared_y = self.equilibration is None or self.equilibration.y == "shared"
        built = build(
            pieces,
            dim,
            equilibration=self.equilibration,
            shared_y=shared_y,
            form=affine_form,
            refine=refine is not False,
            n_aux=n_aux,
        )
        self.auto_sigma = built.auto_sigma
        # Everything built here is frozen: optimisers never see it (see `_frozen`).
        self.problem, self.op, self.active_rows, self.refinement = freeze(
            (built.problem, built.op, built.rows, built.refinement)
        )
        self.dropped_equality_rows = built.dropped
        self.parameter_map = freeze(parameter_map)
        self.check_inputs = bool(check_inputs)
        # "auto" refines at inference only: it costs compile time (two more solves
        # per call), and training does not need rounding-level feasibility.
        self.refine_always = refine is True
        # `refine=False` turns the polish off too.
        polish = check_polish(polish, "Projector")
        self.polish = False if refine is False else polish
        self.inference = inference

    # ----------------------------------------------------------- settings

    @property
    def dim(self) -> int:
        """The dimension $d$ of the projected vectors (auxiliary coordinates
        not counted)."""
        return self.problem.dim - self.problem.n_aux

    @property
    def n_aux(self) -> int:
        """The number of auxiliary coordinates (see `n_aux`)."""
        return self.problem.n_aux

    @property
    def parameters(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The per-instance `Parameter`s, as sorted `(name, shape)` pairs."""
        if self.parameter_map is not None:
            return self.parameter_map.parameters
        return self.problem.parameters

    @property
    def sigma(self) -> float | Array:
        """The Douglas-Rachford scaling in use ("auto" resolved; with per-instance
        matrices, the constant it is computed from)."""
        if not isinstance(self.solver.sigma, str):
            return self.solver.sigma
        if self.auto_sigma is not None:
            return self.auto_sigma
        return float(self.solver.step_size(np.ones(1)))

    @property
    def omega(self) -> float:
        """The relaxation $\\omega$."""
        return self.solver.omega

    @property
    def n_iter(self) -> int:
        """Iterations (or their cap) in training mode."""
        return self.solver.steps(inference=False)

    @property
    def n_iter_test(self) -> int:
        """Iterations (or their cap) in inference mode. Sparse polyhedral sets
        left at the default `n_iter_test=None` run at most 10 of them before
        the host's polish (see `DouglasRachford`)."""
        return self.solver.steps(inference=True)

    @property
    def tol(self) -> float | None:
        """The stopping tolerance, or `None` for a fixed iteration count."""
        return self.solver.tol

    @property
    def equilibrated(self) -> bool:
        """Whether the lifted matrix is equilibrated."""
        return self.equilibration is not None

    def with_settings(self, **settings) -> Projector:
        """A copy with different settings; the factorisation is reused.

        Accepts the fields of `DouglasRachford` (`sigma`, `omega`, `n_iter`,
        `n_iter_test`, `tol`), `adjoint`, `check_inputs`, `inference`,
        `refine` and `polish`, and the deprecated `unroll`, `n_iter_bwd`, `bwd_rtol`,
        `bwd_atol` and `bwd_failure` (which adjust `adjoint`). Settings are
        validated as in the constructor; `n_iter_test=None` means "the same as
        `n_iter`". `refine=False` drops the refinement; `True` and `"auto"`
        choose when a projector built with one refines.

        **Returns:** a new `Projector`.
        """
        return _settings.with_settings(self, settings)

    # -------------------------------------------------------------- calls

    def __call__(self, y_raw: Float[ArrayLike, " d"], **params) -> Float[Array, " d"]:
        """Project one point: $y = \\Pi_{\\mathcal{C}}(y_{raw})$.

        **Arguments:**

        - `y_raw`: the point to project, shape `(d,)`. Batch with `jax.vmap`.
        - `**params`: one value per `Parameter` name, each of its declared shape.

        **Returns:** the projected point, shape `(d,)`.
        """
        # Only y: the diagnostics of `solve` would cost nothing at run time (XLA
        # drops them) but their tracing and lowering add to every compile.
        return cast(Array, self._solve(y_raw, None, params, diagnostics=False))

    def solve(
        self, y_raw: Float[ArrayLike, " d"], s0=None, **params
    ) -> ProjectionSolution:
        """Project one point and return the solution with its diagnostics.

        **Arguments:**

        - `y_raw`: the point to project, shape `(d,)`.
        - `s0`: optional warm start for the governing sequence (for example
            `solution.s` from a nearby instance), shape `(d + n_ineq + n_cone,)`.
            By default `y_raw` lifted to $(y_{raw}, C y_{raw})$ in the internal
            coordinates. No gradient flows through it.
        - `**params`: one value per `Parameter` name.

        **Returns:** a `ProjectionSolution`.
        """
        return cast(
            ProjectionSolution, self._solve(y_raw, s0, params, diagnostics=True)
        )

    @full_precision
    def violation(self, y: Float[ArrayLike, " d"], **params) -> Float[Array, ""]:
        """Maximum absolute constraint violation of `y`, in the user's coordinates.

        $\\max(\\|E y - q\\|_\\infty, \\|(\\ell - C y)_+\\|_\\infty,
        \\|(C y - u)_+\\|_\\infty, \\text{box and cone terms})$, computed from the
        original (unscaled) data, whatever the equilibration.

        **Arguments:**

        - `y`: a point, shape `(d,)`; with auxiliary coordinates, the point and
            its auxiliary part, `concatenate([solution.y, solution.aux])`.
        - `**params`: one value per `Parameter` name.

        **Returns:** a scalar.
        """
        y = self._check_y(y, "y", self.problem.dim)
        return per_instance(self._violation, y, self._mapped(params))

    def _violation(self, y, params: dict):
        problem = thaw(self.problem)
        values = problem.resolve(params, y.dtype)
        return problem.violation(y, problem.data(values, y.dtype, self.check_inputs))

    @full_precision
    def _solve(self, y_raw, s0, params: dict, diagnostics: bool):
        y_raw = self._check_y(y_raw, "y_raw", self.dim)
        run = functools.partial(forward.solve, self, diagnostics=diagnostics)
        return per_instance(run, y_raw, s0, self._mapped(params))

    # ---------------------------------------------------------- internals

    def _mapped(self, params: dict) -> dict:
        """The constraints' parameter values: `params`, through `parameter_map`."""
        if self.parameter_map is None:
            return params
        return thaw(self.parameter_map)(params)

    def _check_y(self, y, argname, dim: int):
        y = jnp.asarray(y)
        if not jnp.issubdtype(y.dtype, jnp.floating):
            y = y.astype(jnp.result_type(float))
        if y.shape != (dim,):
            hint = (
                " To project a batch, use `jax.vmap(proj)(Y, **params)`."
                if y.ndim == 2 and y.shape[-1] == dim
                else ""
            )
            if self.n_aux and dim == self.problem.dim:
                hint += (
                    f" This projector has {self.n_aux} auxiliary coordinates: pass "
                    "`concatenate([solution.y, solution.aux])`."
                )
            raise ValueError(
                f"Projector: `{argname}` must have shape ({dim},) (one instance),"
                f" got {y.shape}.{hint}"
            )
        return y


def _equilibration(equilibrate, deprecated: dict) -> Equilibration | None:
    """`Projector(equilibrate=...)` checked, as an `Equilibration` or `None`."""
    if not isinstance(equilibrate, (bool, Equilibration)):
        raise TypeError(
            f"Projector(equilibrate={equilibrate!r}): must be True, False or a "
            "pinet_eqx.Equilibration."
        )
    if equilibrate is True:
        equilibrate = Equilibration()
    return _compat.equilibration(equilibrate or None, deprecated)
