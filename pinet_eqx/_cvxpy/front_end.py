"""`from_cvxpy`: a `Projector` from constraints written in cvxpy.

cvxpy canonicalises the constraints (with a zero objective) into its
parametrised cone program, $A(p)\\,x + b(p) \\in \\mathcal{K}$, with
$\\mathcal{K}$ a product of zero, nonnegative and second-order cones and
$(A, b)$ affine in the parameters $p$ (DPP). Each block becomes a set of
ours (`_cvxpy_build`): zero rows an `Equality`, nonnegative rows an
`AffineInequality`, `Box` bounds or norm cones, second-order blocks a
`SecondOrderCone`. Data that depends on $p$ becomes our `Parameter`s, filled
per call by an `AffineParameterMap` evaluated in JAX. Variables that
canonicalisation introduces, where they are not eliminated, are the
projector's auxiliary coordinates.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._problem.parameter import RESERVED_NAMES
from .._problem.parameter_map import AffineParameterMap
from .._projector.projector import Projector
from .build import ConeProgramBuilder

_SUPPORTED = (
    "pinet_eqx supports constraints that canonicalise to zero, nonnegative and "
    "second-order cones: affine equalities and inequalities, bounds, l1, l2 and "
    "l-infinity norms, quad_form, sum_squares and the other SOC-representable "
    "atoms, on continuous variables, with parameters entering affinely (DPP)"
)


def from_cvxpy(
    constraints, variables, *, native_sets: bool = True, **projector_kwargs
) -> Projector:
    """A `Projector` onto the set that cvxpy `constraints` define.

    Projects onto $\\{x : \\exists u,\\ (x, u) \\text{ satisfies the
    constraints}\\}$, $x$ the given `variables` and $u$ every other variable
    (the constraints' own, and those cvxpy's canonicalisation introduces, for
    example for `cp.norm(x, 1)`): $u$ becomes auxiliary coordinates that the
    objective ignores (`Projector(n_aux=...)`), and only $x$ is returned.
    Requires DPP; each cvxpy `Parameter` is passed by its name at call time,
    `proj(y_raw, b=..., r=...)`, and derivatives reach every one of them.

    **Arguments:**

    - `constraints`: a list of cvxpy constraints.
    - `variables`: one `cp.Variable` or a sequence of them. $y$ is their
        concatenation in this order, each flattened column-major (as `cp.vec`
        flattens it).
    - `native_sets`: map rows that bound one coordinate to `Box` bounds, and
        the epigraph rows of $\\ell_1$ and $\\ell_\\infty$ norms to
        `L1NormCone` / `LInfNormCone` with their variables eliminated (`True`,
        default); `False` keeps them as rows and auxiliary coordinates, as
        cvxpy gives them (to compare).
    - `**projector_kwargs`: passed to `Projector` (`sigma`, `n_iter`,
        `affine_form`, ...).

    **Returns:** a `Projector` whose `dim` is the total size of `variables`.

    **Raises:** `ValueError` naming the constraint for what pinet_eqx cannot
    project onto: exponential, power and semidefinite cones, non-DCP or
    non-DPP constraints, integer or boolean variables.
    """
    cp = _import_cvxpy()
    constraints, variables = _check_arguments(cp, constraints, variables)
    problem = cp.Problem(cp.Minimize(0), constraints)
    _check_supported(cp, problem, constraints)
    prog = _cone_program(cp, problem, constraints)
    builder = ConeProgramBuilder(prog, variables, native_sets)
    sets = builder.sets()
    if not sets:
        raise ValueError(
            "from_cvxpy(constraints, variables): the constraints put no condition "
            "on the variables; there is nothing to project onto."
        )
    sources = [
        (p.name(), tuple(p.shape), prog.param_id_to_col.get(p.id, -1))
        for p in problem.parameters()
    ]
    mapping = AffineParameterMap(sources, builder.targets, builder.maps)
    return Projector(
        sets,
        dim=builder.layout.dim,
        n_aux=builder.layout.n_aux,
        parameter_map=mapping if builder.targets else None,
        **projector_kwargs,
    )


def _import_cvxpy():
    try:
        import cvxpy
    except ImportError as e:  # pragma: no cover - the test extra installs it
        raise ImportError(
            "from_cvxpy needs cvxpy: `pip install pinet_eqx[cvxpy]`."
        ) from e
    return cvxpy


def _check_arguments(cp, constraints, variables):
    if isinstance(constraints, cp.constraints.constraint.Constraint):
        constraints = [constraints]
    constraints = list(constraints)
    if not constraints:
        raise ValueError("from_cvxpy(constraints, variables): `constraints` is empty.")
    for i, c in enumerate(constraints):
        if not isinstance(c, cp.constraints.constraint.Constraint):
            raise TypeError(
                f"from_cvxpy(constraints, variables): constraints[{i}] is a "
                f"{type(c).__name__}, not a cvxpy constraint (write it as, e.g., "
                "`A @ x == b` or `cp.norm(x, 1) <= r`)."
            )
    if isinstance(variables, cp.Variable):
        variables = [variables]
    if not isinstance(variables, Sequence) or not variables:
        raise TypeError(
            "from_cvxpy(constraints, variables): `variables` must be a cp.Variable "
            "or a non-empty sequence of them."
        )
    for i, v in enumerate(variables):
        if not isinstance(v, cp.Variable):
            raise TypeError(
                f"from_cvxpy(constraints, variables): variables[{i}] is a "
                f"{type(v).__name__}, not a cp.Variable."
            )
    if len({v.id for v in variables}) != len(variables):
        raise ValueError(
            "from_cvxpy(constraints, variables): a variable is listed twice."
        )
    return constraints, list(variables)


def _check_supported(cp, problem, constraints) -> None:
    """Raise, naming the constraint, for what canonicalisation cannot give us."""
    for i, c in enumerate(constraints):
        for v in c.variables():
            kind = [a for a in ("integer", "boolean") if v.attributes.get(a)]
            if kind:
                raise ValueError(
                    f"from_cvxpy: constraint {i} (`{c}`) uses the {kind[0]} "
                    f"variable `{v.name()}`; a projection needs a convex set, "
                    f"so variables must be continuous. {_SUPPORTED}."
                )
        if not c.is_dcp():
            raise ValueError(
                f"from_cvxpy: constraint {i} (`{c}`) is not DCP, so cvxpy cannot "
                f"canonicalise it. {_SUPPORTED}."
            )
        if not c.is_dcp(dpp=True):
            raise ValueError(
                f"from_cvxpy: constraint {i} (`{c}`) is not DPP: its parameters "
                "do not enter affinely (for example a product of two parameters), "
                "so the cone data is not an affine map of them. Introduce a new "
                "parameter for the product. See cvxpy's DPP rules."
            )
    names = [p.name() for p in problem.parameters()]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(
                f"from_cvxpy: two cvxpy Parameters are named {name!r}; parameters "
                "are passed by name, so give each a unique `name=`."
            )
        if not name.isidentifier() or name in RESERVED_NAMES:
            raise ValueError(
                f"from_cvxpy: the cvxpy Parameter {name!r} cannot be passed as a "
                f"keyword (names must be identifiers other than "
                f"{sorted(RESERVED_NAMES)}); rename it with `name=`."
            )


def _cone_program(cp, problem, constraints):
    """cvxpy's parametrised cone program, checked for unsupported cones."""
    data, _, _ = problem.get_problem_data(cp.CLARABEL)
    prog = data[cp.settings.PARAM_PROB]
    if _unsupported(prog.cone_dims) or prog.lb_tensor is not None:
        for i, c in enumerate(constraints):
            sub = cp.Problem(cp.Minimize(0), [c]).get_problem_data(cp.CLARABEL)[0]
            kinds = _unsupported(sub[cp.settings.PARAM_PROB].cone_dims)
            if kinds:
                raise ValueError(
                    f"from_cvxpy: constraint {i} (`{c}`) canonicalises to "
                    f"{' and '.join(kinds)} cones, which pinet_eqx cannot project "
                    f"onto. {_SUPPORTED}."
                )
        raise ValueError(
            "from_cvxpy: the constraints canonicalise to cones or variable "
            f"bounds that pinet_eqx cannot map. {_SUPPORTED}."
        )
    known = {p.id for p in problem.parameters()}
    if any(p.id not in known for p in prog.parameters):
        raise ValueError(
            "from_cvxpy: a cvxpy Parameter with a structural attribute (symmetric, "
            "diag, PSD, sparsity) was reduced by cvxpy; declare it without the "
            "attribute."
        )
    return prog


def _unsupported(dims) -> list[str]:
    kinds = []
    if dims.exp:
        kinds.append("exponential")
    if dims.psd:
        kinds.append("semidefinite")
    if dims.p3d or getattr(dims, "pnd", None):
        kinds.append("power")
    return kinds
