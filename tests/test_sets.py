"""Cones, simplices and per-instance data (float64).

Every projection is checked against cvxpy + Clarabel on the same plain description of
the set (`helpers.ConeSpec`, `SimplexSpec`, ...), which also builds the pinet_eqx
constraints (`helpers.to_pinet`). Covered: each set alone and in mixtures, vector and
matrix parameters varying per instance under `jax.vmap`, equilibration on badly
scaled data, implicit gradients against finite differences, infeasible contexts, and
constructor errors.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    BoxSpec,
    ConeSpec,
    EqualitySpec,
    SimplexSpec,
    assert_close,
    badly_scale,
    central_difference,
    clarabel_is_feasible,
    clarabel_project_sets,
    random_instance,
    random_set_spec,
    slow_except,
    spec_residuals,
    spec_violation,
    stack_values,
    to_pinet,
    values_of,
)

import pinet_eqx as pe

# Douglas-Rachford is slower on cones than on polytopes; each instance stops as soon
# as it reaches `tol`, so a large budget costs little on the easy instances.
ACCURATE = dict(n_iter=5000, tol=1e-10)
BATCH = 4


def _solve_batch(proj, Y, values):
    """`proj.solve` over a batch, jitted once: Y (B, d), values {name: (B, ...)}."""
    values = {k: jnp.asarray(v) for k, v in values.items()}
    return eqx.filter_jit(jax.vmap(proj.solve))(jnp.asarray(Y), **values)


def _violations(proj, Y, values):
    values = {k: jnp.asarray(v) for k, v in values.items()}
    return np.asarray(jax.vmap(proj.violation)(jnp.asarray(Y), **values))


def _check_against_clarabel(sol, Y, instances, proj, values):
    """Each instance matches Clarabel, is feasible, and is not flagged infeasible."""
    viol = _violations(proj, sol.y, values)
    assert not np.any(np.asarray(sol.result == pe.RESULTS.infeasible))
    for i, spec in enumerate(instances):
        expected = clarabel_project_sets(Y[i], spec)
        assert_close(sol.y[i], expected, atol=1e-6, what=f"instance {i}")
        assert viol[i] <= 1e-7, f"instance {i}: violation {viol[i]:.3e}"
        # The reported violation is the true one, in the user's coordinates.
        assert_close(viol[i], spec_violation(sol.y[i], spec), atol=1e-9)


# ------------------------------------------------------------------ 1-2. fixed sets

# name: (d, kinds, options for random_set_spec)
SET_CASES = {
    # each set alone
    "soc": (8, ["soc"], dict(cone_rows=6)),
    "l1": (8, ["l1"], dict(cone_rows=4)),
    "linf": (8, ["linf"], dict(cone_rows=5)),
    "simplex": (8, ["simplex"], dict(simplex_size=5)),
    # several sets of one kind
    "soc_x3": (10, ["soc", "soc", "soc"], dict(cone_rows=4)),
    "l1_x2": (10, ["l1", "l1"], dict(cone_rows=4)),
    "simplex_x2": (10, ["simplex", "simplex"], dict(simplex_size=4)),
    # mixtures
    "soc_polytope": (10, ["soc", "eq", "ineq", "box"], dict(cone_rows=4)),
    "simplex_x_box": (9, ["simplex", "box"], dict(simplex_size=5, infs=False)),
    "l1_equality": (9, ["l1", "eq"], dict(cone_rows=5)),
    "everything": (
        12,
        ["soc", "l1", "linf", "simplex", "eq", "ineq", "box"],
        dict(cone_rows=3, simplex_size=4),
    ),
}


@pytest.mark.parametrize("case", slow_except(SET_CASES, "everything"))
def test_projection_matches_clarabel(case):
    d, kinds, opts = SET_CASES[case]
    rng = np.random.default_rng(100 + list(SET_CASES).index(case))
    spec, _ = random_set_spec(rng, d, kinds, **opts)
    proj = pe.Projector(to_pinet(spec), dim=d, **ACCURATE)
    Y = 2.0 * rng.normal(size=(BATCH, d))
    # The raw points are (mostly) outside the set, so the test is not vacuous ...
    outside = [spec_violation(y, spec) for y in Y]
    assert np.mean(np.asarray(outside) > 1e-2) >= 0.75, outside
    # ... and the violation of an infeasible point is the true one.
    assert_close(_violations(proj, Y, {}), outside, atol=1e-9, rtol=1e-12)
    sol = _solve_batch(proj, Y, {})
    _check_against_clarabel(sol, Y, [spec] * BATCH, proj, {})


# ---------------------------------------------------- 3-4. per-instance parameters

# name: (d, kinds, {parameter name: (item index, field)}, how far the interior point
# moves between instances)
PARAM_CASES = {
    # 3. vector / scalar data
    "soc_a_b_f": (
        8,
        ["soc", "box"],
        {"a": (0, "a"), "b": (0, "b"), "f": (0, "f")},
        0.0,
    ),
    "l1_b_simplex_total": (
        9,
        ["simplex", "l1"],
        {"total": (0, "total"), "b": (1, "b")},
        0.0,
    ),
    "linf_a_equality_b": (9, ["linf", "eq"], {"a": (0, "a"), "q": (1, "b")}, 0.2),
    # 4. matrix data, A(x)
    "polytope_E_b_C": (
        8,
        ["eq", "ineq", "box"],
        {"E": (0, "E"), "q": (0, "b"), "C": (1, "C")},
        0.0,
    ),
    "soc_A_f": (8, ["soc", "ineq"], {"A": (0, "A"), "f": (0, "f")}, 0.0),
    "l1_A_equality_E": (9, ["l1", "eq"], {"A": (0, "A"), "E": (1, "E")}, 0.0),
}
PARAM_OPTS = dict(cone_rows=4, m_eq=2, m_ineq=3, simplex_size=4)


def _instances(rng, spec, y0, parameters, jitter=0.0, n=BATCH):
    """`n` strictly feasible instances with different parameter values."""
    instances = [
        random_instance(rng, spec, y0, parameters, jitter)[0] for _ in range(n)
    ]
    values = stack_values([values_of(s, parameters) for s in instances])
    for name, v in values.items():
        assert np.ptp(v, axis=0).max() > 1e-2, f"{name} does not vary"
    return instances, values


@pytest.mark.parametrize("case", slow_except(PARAM_CASES, "soc_A_f"))
def test_per_instance_parameters_match_clarabel(case):
    d, kinds, parameters, jitter = PARAM_CASES[case]
    rng = np.random.default_rng(200 + list(PARAM_CASES).index(case))
    spec, y0 = random_set_spec(rng, d, kinds, **PARAM_OPTS)
    proj = pe.Projector(to_pinet(spec, parameters), dim=d, **ACCURATE)
    instances, values = _instances(rng, spec, y0, parameters, jitter)
    Y = 2.0 * rng.normal(size=(BATCH, d))
    sol = _solve_batch(proj, Y, values)
    _check_against_clarabel(sol, Y, instances, proj, values)


# ----------------------------------------------------------------- 5. equilibration

# name: (d, kinds, parameters)
EQUILIBRATE_CASES = {
    "cone_mixture": (10, ["soc", "l1", "linf", "eq", "ineq", "box"], {}),
    "per_instance_matrices": (
        8,
        ["soc", "eq", "box"],
        {"A": (0, "A"), "a": (0, "a"), "E": (1, "E"), "q": (1, "b")},
    ),
}


def _row_norms(spec):
    mats = [getattr(it, f) for it in spec for f in ("A", "E", "C") if hasattr(it, f)]
    return np.concatenate([np.linalg.norm(M, axis=1) for M in mats])


@pytest.mark.parametrize(
    "case", slow_except(EQUILIBRATE_CASES, "per_instance_matrices")
)
def test_equilibration_does_not_change_the_projection(case):
    d, kinds, parameters = EQUILIBRATE_CASES[case]
    rng = np.random.default_rng(300 + list(EQUILIBRATE_CASES).index(case))
    spec, y0 = random_set_spec(rng, d, kinds, cone_rows=3, m_eq=2, m_ineq=3)
    if parameters:
        instances = _instances(rng, spec, y0, parameters)[0]
    else:
        instances = [spec] * BATCH
    # Every equality and inequality row, and every cone as a whole, is multiplied by
    # a factor in [1e-2, 1e2]: the data is badly scaled, but the set, hence the
    # projection, is unchanged. The same seed gives the fixed items the same
    # factors in every instance. (The coordinates are not rescaled: that changes the
    # projection's geometry, and unequilibrated Douglas-Rachford then needs far more
    # iterations than a unit test can afford.)
    seed = int(rng.integers(1 << 30))
    spec_z = badly_scale(spec, y0, seed, cols=(1.0, 1.0))[0]
    scaled = [badly_scale(s, y0, seed, cols=(1.0, 1.0))[0] for s in instances]
    norms = _row_norms(spec_z)
    assert norms.max() / norms.min() > 1e2
    values = stack_values([values_of(s, parameters) for s in scaled])
    Y = 2.0 * rng.normal(size=(BATCH, d))
    sols = {
        eq: _solve_batch(
            pe.Projector(
                to_pinet(spec_z, parameters),
                equilibrate=eq,
                n_iter=200_000,  # unequilibrated needs up to ~2e5 steps here
                tol=1e-11,
            ),
            Y,
            values,
        )
        for eq in (True, False)
    }
    assert_close(sols[True].y, sols[False].y, atol=1e-7, what="equilibrated vs not")
    for i, s in enumerate(instances):
        expected = clarabel_project_sets(Y[i], s)  # the unscaled data
        for eq, sol in sols.items():
            assert_close(sol.y[i], expected, atol=1e-6, what=f"{eq=}, {i}")


# ------------------------------------------------------------------ 6. gradients

GRAD_SETTINGS = dict(
    n_iter=20_000,
    tol=1e-12,
    adjoint=pe.ImplicitAdjoint(
        max_steps=500, rtol=1e-10, atol=1e-12, on_failure="raise"
    ),
)

# name: (d, kinds, parameters, argument to differentiate, index of the item that
# must be active at the projection)
GRAD_CASES = {
    "y_raw_soc_polytope": (8, ["soc", "eq", "box"], {}, "y_raw", 0),
    "y_raw_l1_simplex": (8, ["l1", "simplex"], {}, "y_raw", 0),
    "soc_offset_a": (8, ["soc", "eq"], {"a": (0, "a")}, "a", 0),
    "linf_scalar_b": (8, ["linf", "ineq"], {"b": (0, "b")}, "b", 0),
    "soc_matrix_A": (8, ["soc", "box"], {"A": (0, "A")}, "A", 0),
    "equality_matrix_E": (8, ["eq", "soc"], {"E": (0, "E")}, "E", 1),
}


@pytest.mark.parametrize("case", slow_except(GRAD_CASES, "soc_offset_a"))
def test_vjp_matches_finite_differences(case):
    d, kinds, parameters, wrt, active = GRAD_CASES[case]
    rng = np.random.default_rng(400 + list(GRAD_CASES).index(case))
    spec, _ = random_set_spec(rng, d, kinds, cone_rows=4, m_eq=2, m_ineq=3)
    proj = pe.Projector(to_pinet(spec, parameters), dim=d, **GRAD_SETTINGS)
    # A random point whose projection has the item of interest active (so its data
    # has a non-zero derivative), judged by the independent solver.
    for _ in range(20):
        y_raw = 2.0 * rng.normal(size=d)
        _, slack = spec_residuals(clarabel_project_sets(y_raw, spec), [spec[active]])
        if abs(slack) <= 1e-9:
            break
    assert abs(slack) <= 1e-9, f"item {active} is never active"

    values = {k: jnp.asarray(v) for k, v in values_of(spec, parameters).items()}
    values["y_raw"] = jnp.asarray(y_raw)
    cot = jnp.asarray(rng.normal(size=d))

    @jax.jit
    def loss(x):
        vals = dict(values)
        vals[wrt] = x
        y = vals.pop("y_raw")
        return jnp.dot(cot, proj(y, **vals))

    x0 = values[wrt]
    v = jnp.asarray(rng.normal(size=x0.shape))
    grad = jax.jit(jax.grad(loss))(x0)
    assert grad.shape == x0.shape and bool(jnp.all(jnp.isfinite(grad)))
    directional = float(jnp.sum(grad * v))
    fd = float(central_difference(loss, x0, v, eps=1e-6))
    assert abs(fd) > 1e-3, f"degenerate test point: directional derivative {fd:.2e}"
    assert abs(directional - fd) <= 1e-4 * max(1.0, abs(fd)), (directional, fd)


# ------------------------------------------------------------- 7. infeasibility

_D = 5
# name: (spec, parameters, infeasible value, feasible value)
INFEASIBLE_CASES = {
    # sum(y) = s with 0 <= y <= 1: empty for s = 10.
    "equality_vs_box": (
        [
            EqualitySpec(np.ones((1, _D)), np.array([2.0])),
            BoxSpec(np.zeros(_D), np.ones(_D)),
        ],
        {"s": (0, "b")},
        {"s": np.array([10.0])},
        {"s": np.array([2.0])},
    ),
    # ||y||_2 <= b: empty for b = -1, known only at run time.
    "soc_negative_b": (
        [ConeSpec("soc", np.eye(_D), np.zeros(_D), np.zeros(_D), np.asarray(1.0))],
        {"r": (0, "b")},
        {"r": np.asarray(-1.0)},
        {"r": np.asarray(1.0)},
    ),
    # y_0 + y_1 = 1.5 with y_{0,1,2} on the simplex of total t: empty for t = 1.
    "simplex_total_vs_equality": (
        [
            SimplexSpec(np.array([0, 1, 2]), np.asarray(2.0)),
            EqualitySpec(np.array([[1.0, 1.0, 0.0, 0.0, 0.0]]), np.array([1.5])),
        ],
        {"t": (0, "total")},
        {"t": np.asarray(1.0)},
        {"t": np.asarray(2.0)},
    ),
}


def _with_values(spec, parameters, values):
    out = [dataclasses.replace(it) for it in spec]
    for name, (i, field) in parameters.items():
        setattr(out[i], field, values[name])
    return out


@pytest.mark.parametrize("case", slow_except(INFEASIBLE_CASES, "equality_vs_box"))
def test_infeasible_context_is_reported(case):
    spec, parameters, bad, good = INFEASIBLE_CASES[case]
    bad_spec = _with_values(spec, parameters, bad)
    good_spec = _with_values(spec, parameters, good)
    assert not clarabel_is_feasible(bad_spec, _D)
    assert clarabel_is_feasible(good_spec, _D)
    proj = pe.Projector(to_pinet(spec, parameters), tol=1e-8, n_iter=1000)
    rng = np.random.default_rng(500 + list(INFEASIBLE_CASES).index(case))
    Y = 2.0 * rng.normal(size=(2, _D))
    values = stack_values([bad, good])
    sol = _solve_batch(proj, Y, values)
    infeasible = np.asarray(sol.result == pe.RESULTS.infeasible)
    successful = np.asarray(sol.result == pe.RESULTS.successful)
    assert infeasible[0], "the infeasible context is not flagged"
    assert successful[1] and not infeasible[1], "the feasible context is flagged"
    assert bool(jnp.all(jnp.isfinite(sol.y)))
    viol = _violations(proj, sol.y, values)
    # The violation of the returned point is reported truthfully (and is positive:
    # no point satisfies an empty set).
    true_bad = spec_violation(sol.y[0], bad_spec)
    assert true_bad > 1e-3
    assert_close(viol[0], true_bad, atol=1e-9, rtol=1e-9, what="violation")
    assert_close(sol.primal_residual[0], viol[0], atol=1e-12, what="primal_residual")
    assert viol[1] <= 1e-8
    expected = clarabel_project_sets(Y[1], good_spec)
    assert_close(sol.y[1], expected, atol=1e-5, what="feasible context")


# ------------------------------------------------------------ 8. constructor errors

_E3 = np.eye(3)


def _in_projector(make, dim=3):
    # A set may check its data itself or when the projector lifts it; both count.
    return lambda: pe.Projector([make()], dim=dim)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: pe.SecondOrderCone(np.ones(3)), "`A`"),
        (lambda: pe.L1NormCone(np.ones((2, 3, 1))), "`A`"),
        (lambda: pe.SecondOrderCone(_E3, a=np.ones(2)), "`a`"),
        (lambda: pe.LInfNormCone(_E3, f=np.ones(4)), "`f`"),
        (lambda: pe.L1NormCone(_E3, b=np.ones(2)), "`b`"),
        (lambda: pe.SecondOrderCone(_E3, a=np.array([0.0, np.nan, 0.0])), "`a`"),
        (lambda: pe.Simplex([0, 1, 1]), "indices"),
        (lambda: pe.Simplex([0.5, 1.5]), "indices"),
        (lambda: pe.Simplex([[0, 1]]), "indices"),
        (_in_projector(lambda: pe.Simplex([0, 7]), dim=5), "indices"),
        (lambda: pe.Simplex([0, 1], total=-1.0), "total"),
        # Per-instance matrices need their shape up front.
        (_in_projector(lambda: pe.SecondOrderCone(pe.Parameter("M"))), "`A`"),
        (
            _in_projector(lambda: pe.Equality(pe.Parameter("M"), np.zeros(2))),
            "`A`",
        ),
        (
            _in_projector(lambda: pe.AffineInequality(pe.Parameter("M"), upper=1.0)),
            "`C`",
        ),
        (
            _in_projector(lambda: pe.SecondOrderCone(pe.Parameter("M", shape=(3,)))),
            "`A`",
        ),
        (
            _in_projector(
                lambda: pe.SecondOrderCone(
                    pe.Parameter("M", shape=(2, 3)), a=np.ones(3)
                )
            ),
            "`a`",
        ),
        (
            _in_projector(
                lambda: pe.Equality(pe.Parameter("M", shape=(2, 3)), np.zeros(3))
            ),
            "`b`",
        ),
        (
            lambda: pe.Projector(
                [pe.SecondOrderCone(_E3), pe.Box(-np.ones(4), np.ones(4))]
            ),
            "size 4",
        ),
    ],
)
def test_constructor_errors_name_the_argument(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_call_checks_parameter_shapes():
    proj = pe.Projector(
        [pe.SecondOrderCone(pe.Parameter("M", shape=(2, 3)), b=pe.Parameter("r"))],
        n_iter=5,
    )
    y = jnp.zeros(3)
    proj.violation(y, M=jnp.ones((2, 3)), r=jnp.asarray(1.0))  # right shapes work
    with pytest.raises(ValueError, match="`M`"):
        proj(y, M=jnp.ones((3, 3)), r=jnp.asarray(1.0))
    with pytest.raises(ValueError, match="`r`"):
        proj(y, M=jnp.ones((2, 3)), r=jnp.ones(2))
