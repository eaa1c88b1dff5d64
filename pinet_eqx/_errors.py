"""Long error and warning messages, kept in one place."""

EMPTY_CONSTRAINTS = (
    "Projector(constraints): got an empty list of constraints. Pass at least one "
    "constraint set, e.g. `Projector([Equality(A, b)])`."
)

NOT_A_CONSTRAINT = (
    "Projector(constraints): element {index} is a {kind}, not a constraint set. "
    "Use `Equality`, `AffineInequality`, `Box`, `SecondOrderCone`, `L1NormCone`, "
    "`LInfNormCone` or `Simplex` from `pinet_eqx`."
)

NO_DIM = (
    "Projector(constraints): cannot infer the output dimension, because no "
    "constraint carries a matrix or a full-length vector. Pass `dim=` explicitly."
)

BAD_DIM = (
    "Projector(constraints): constraint {index} ({kind}) acts on vectors of size "
    "{got}, but the other constraints (or `dim=`) say {expected}."
)

INCONSISTENT_EQUALITY = (
    "Projector(constraints): the fixed equality system A y = b is inconsistent: "
    "after dropping {dropped} linearly dependent row(s), the remaining rows fix y "
    "in a way that violates row(s) {rows} by up to {residual:.3e}. Check that `b` "
    "lies in the range of `A` (dependent rows must have consistent right-hand "
    "sides)."
)

NAN_Y_RAW = (
    "Projector: `y_raw` contains NaN or inf. The projection of a non-finite point is "
    "undefined; check the backbone's output (for example for exploding activations)."
)

PARAM_BOUNDS_CROSSED = (
    "Projector: a parameterised bound has lower > upper for some entry, so the "
    "constraint set is empty. Check the values passed for the bound parameters."
)

BWD_NOT_CONVERGED = (
    "pinet_eqx: the implicit backward linear solve did not reach its tolerance "
    "within its step limit for at least one instance, so the returned gradient is "
    "approximate. Give the adjoint's solver more steps, e.g. "
    "`adjoint=pe.ImplicitAdjoint(linear_solver=pe.BiCGStab(max_steps=...))`, "
    "increase `n_iter` so the forward pass is closer to the fixed point, or pass "
    "`ImplicitAdjoint(on_failure='ignore')` to silence this."
)

BWD_NOT_CONVERGED_RAISE = (
    "pinet_eqx: the implicit backward linear solve did not converge within its "
    "step limit. Give the adjoint's solver more steps (its `max_steps`) or "
    "increase `n_iter`, or pass `ImplicitAdjoint(on_failure='warn')`."
)

RANK_DEFICIENT = (
    "Projector: the per-instance equality matrix has linearly dependent rows for "
    "some instance, so its projection is undefined. Per-instance matrices must have "
    "full row rank; remove the redundant rows (or make the matrix fixed, where "
    "dependent rows are dropped automatically)."
)
