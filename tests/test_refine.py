"""`Projector(refine=...)`: iterative refinement onto the active constraints,
with residuals computed nearly exactly."""

import dataclasses
import subprocess
import sys
import textwrap
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    assert_close,
    central_difference,
    clarabel_project,
    clarabel_project_sets,
    constraints_of,
    random_instance,
    random_polytope,
    random_set_spec,
    slow_except,
    spec_violation,
    to_pinet,
    values_of,
)

import pinet_eqx as pe
from pinet_eqx._linalg.residual import (
    SlicePlan,
    exact_residual,
    pairwise_sum,
    split_rows,
)
from pinet_eqx._problem.cones import _surface_value
from pinet_eqx.problems import make_dc3


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("d", [100, 1500])  # plans of 2 and 3 matrix slices
def test_exact_residual_is_nearly_exact(dtype, d):
    rng = np.random.default_rng(0)
    E = rng.normal(size=(30, d))
    y = rng.normal(size=d).astype(dtype)
    rhs = (E @ y.astype(np.float64)).astype(dtype)  # a nearly cancelling residual
    # Exact rational arithmetic on the float64 E and the working-precision y, rhs.
    fractions = [
        sum(Fraction(a) * Fraction(float(b)) for a, b in zip(row, y))
        - Fraction(float(c))
        for row, c in zip(E, rhs)
    ]
    exact = np.array([float(f) for f in fractions])
    plan = SlicePlan.for_length(d, dtype)
    slices = split_rows(E, plan)
    assert np.array_equal(slices.astype(dtype).astype(np.float64), slices)
    r, low = jax.jit(lambda S, y, q: exact_residual(S, y, q, plan))(
        jnp.asarray(slices, dtype), jnp.asarray(y), jnp.asarray(rhs)
    )
    plain = jnp.asarray(E, dtype) @ jnp.asarray(y) - jnp.asarray(rhs)
    eps = float(jnp.finfo(dtype).eps)
    scale = np.abs(E) @ np.abs(y.astype(np.float64))
    # Rounding of the result, plus the neglected slices (below 2^-target).
    neglected = 4 * d * 2.0 ** (-plan.target_bits) * scale
    error = np.abs(np.asarray(r, np.float64) - exact)
    assert np.all(error <= eps * np.abs(exact) + neglected)
    # The low part carries the result's rounding: r + low is exact but for the
    # neglected slices.
    r, low = np.asarray(r, np.float64), np.asarray(low, np.float64)
    assert np.all(np.abs(low) <= eps * np.abs(r))
    two_part = np.array(
        [float(Fraction(a) + Fraction(b) - f) for a, b, f in zip(r, low, fractions)]
    )
    assert np.all(np.abs(two_part) <= 4 * eps**2 * np.abs(exact) + neglected)
    # ...where the plain product is off by much more.
    assert np.abs(np.asarray(plain, np.float64) - exact).max() > 10 * error.max()


@pytest.mark.parametrize("n", [1, 7, 64, 1000])
def test_pairwise_sum_is_twice_as_precise(n):
    rng = np.random.default_rng(n)
    # Terms that cancel to far below their size, as a cone's surface value does.
    x = rng.normal(size=(16, n)) * 2.0 ** rng.integers(-8, 8, size=(16, n))
    x = np.concatenate([x, -x[:, ::-1] * (1 + 2**-20)], axis=1).astype(np.float32)
    exact = np.array([float(sum(Fraction(float(v)) for v in row)) for row in x])
    total = np.asarray(jax.jit(pairwise_sum)(jnp.asarray(x)), np.float64)
    eps = float(jnp.finfo(jnp.float32).eps)
    scale = np.abs(x.astype(np.float64)).sum(axis=1)
    assert np.all(np.abs(total - exact) <= eps * np.abs(exact) + 8 * eps**2 * scale)


def test_float32_surface_value_of_a_cone_is_accurate():
    # ||x|| - t for points on the surface up to rounding: the plain difference
    # of the float32 norm and t is off by about an ulp of t.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 5)).astype(np.float32)
    t = (np.linalg.norm(x.astype(np.float64), axis=1) * (1 + 1e-7)).astype(np.float32)
    exact = np.linalg.norm(x.astype(np.float64), axis=1) - t.astype(np.float64)
    X, T = jnp.asarray(x), jnp.asarray(t)
    norm = jnp.sqrt(jnp.sum(X * X, axis=1))
    value = np.asarray(jax.jit(_surface_value)(X, T, norm), np.float64)
    plain = np.asarray(norm - T, np.float64)
    eps = float(jnp.finfo(jnp.float32).eps)
    assert np.all(np.abs(value - exact) <= 4 * eps * np.abs(exact) + 1e-13)
    assert np.abs(plain - exact).max() > 100 * np.abs(value - exact).max()


def _dc3_projector(refine, n=64):
    problem = make_dc3(100, 50, 50, n_examples=n, seed=3)
    return problem, pe.Projector(
        [
            pe.Equality(problem.A, pe.Parameter("b")),
            pe.AffineInequality(problem.G, upper=problem.h),
        ],
        n_iter=200,
        refine=refine,
    )


@pytest.mark.slow
def test_refine_keeps_the_float64_projection_and_its_gradient():
    problem, plain = _dc3_projector(False)
    _, refined = _dc3_projector(True)
    X = jnp.asarray(problem.X)
    Y = jax.random.normal(jax.random.key(0), (X.shape[0], 100)) * 3

    def project(proj, Y):
        return jax.vmap(lambda y, x: proj(y, b=x))(Y, X)

    Y0, Y1 = project(plain, Y), project(refined, Y)
    # The refinement pins the active inequality rows too, moving y by what the
    # 200 iterations left on them (about 1e-10 here), and no further.
    np.testing.assert_allclose(Y1, Y0, atol=1e-8)
    assert float(jnp.abs(Y1 @ problem.A.T - X).max()) <= 1e-12
    ineq = lambda Y: float(np.maximum(np.asarray(Y) @ problem.G.T - problem.h, 0).max())  # noqa: E731
    assert ineq(Y1) <= 1e-12 < ineq(Y0)
    g0 = jax.grad(lambda Y: jnp.sum(jnp.sin(project(plain, Y))))(Y)
    g1 = jax.grad(lambda Y: jnp.sum(jnp.sin(project(refined, Y))))(Y)
    np.testing.assert_allclose(g1, g0, rtol=1e-9, atol=1e-9)


def test_refined_solution_reports_the_violation_of_its_output():
    """`primal_residual` of a refined solution is computed from the refinement's
    updated residuals, not recomputed: it must match the output's violation
    computed independently (float64, stopped early so that the refinement moves
    the iterate)."""
    problem = make_dc3(100, 50, 50, n_examples=16, seed=3)
    X = jnp.asarray(problem.X)
    Y_raw = jax.random.normal(jax.random.key(1), (16, 100)) * 3

    def solve(refine):
        projector = pe.Projector(
            [
                pe.Equality(problem.A, pe.Parameter("b")),
                pe.AffineInequality(problem.G, upper=problem.h),
            ],
            solver=pe.DouglasRachford(n_iter_test=20, tol_test=None),
            inference=True,
            refine=refine,
        )
        return jax.vmap(lambda y, x: projector.solve(y, b=x))(Y_raw, X)

    sol = solve("auto")
    Y = np.asarray(sol.y)
    violation = np.maximum(
        np.abs(Y @ problem.A.T - problem.X).max(axis=1),
        np.maximum(Y @ problem.G.T - problem.h, 0).max(axis=1),
    )
    # The iterate was far from feasible; the refined output is at rounding level
    # and reports exactly that.
    assert np.asarray(solve(False).primal_residual).min() > 1e-6
    assert violation.max() <= 1e-12
    np.testing.assert_allclose(sol.primal_residual, violation, rtol=0, atol=1e-12)


@pytest.mark.parametrize("matrices", slow_except(["fixed", "per_instance"], "fixed"))
@pytest.mark.parametrize("cap", [pytest.param(40, marks=pytest.mark.slow), 160])
def test_polish_certifies_projections_before_the_iteration_converges(cap, matrices):
    """At inference, a polytope is polished: `y_raw` is projected onto the face
    of the iterate's active set, and the instance is reported successful where
    that point meets the optimality conditions, long before the iteration
    itself reaches `tol`. Every instance so reported is the projection
    (Clarabel); the others are reported as not converged."""
    rng = np.random.default_rng(11)
    poly = random_polytope(rng, 20, 4, 15)
    Y = jnp.asarray(poly.y_feas + 3 * rng.normal(size=(16, 20)))
    constraints, params = constraints_of(poly), {}
    if matrices == "per_instance":
        constraints[0] = pe.Equality(pe.Parameter("E", shape=poly.E.shape), poly.b)
        params = {"E": jnp.broadcast_to(poly.E, (16, *poly.E.shape))}
    solver = pe.DouglasRachford(n_iter_test=cap, n_iter_test_max=cap)
    proj = pe.Projector(constraints, solver=solver, inference=True)

    def solve(proj):
        return jax.vmap(lambda y, p: proj.solve(y, **p))(Y, params)

    sol = solve(proj)
    certified = np.asarray(sol.result == pe.RESULTS.successful)
    for i in np.flatnonzero(certified):
        assert_close(sol.y[i], clarabel_project(np.asarray(Y[i]), poly), atol=1e-8)
    converged = solve(proj.with_settings(refine=False)).result
    n_converged = int(np.sum(np.asarray(converged == pe.RESULTS.successful)))
    # Without the polish, the refinement can only lower the violation.
    unpolished = solve(proj.with_settings(polish=False))
    n_unpolished = int(np.sum(np.asarray(unpolished.result == pe.RESULTS.successful)))
    assert n_converged <= n_unpolished < certified.sum()
    if cap == 160:
        assert n_unpolished <= 4 and certified.sum() >= 14, (n_unpolished, certified)


@pytest.mark.parametrize(
    "matrices, settings",
    [
        ("fixed", {}),
        pytest.param("per_instance", {}, marks=pytest.mark.slow),
        ("fixed", {"adjoint": pe.UnrolledAdjoint()}),
        ("fixed", {"refine": True}),
    ],
)
def test_training_polish_gives_the_projection_and_keeps_the_gradient(
    matrices, settings
):
    """With `polish=True`, training mode polishes too: after a few iterations
    the output is the projection (Clarabel) wherever the polish certifies it,
    the iterate elsewhere. The gradient in `y_raw` is the iterate's where it
    is not certified, and the projection's own where it is (the polish's
    rounds may leave the iterate's face; against central differences of
    Clarabel), or the unrolled one throughout. A per-instance matrix's
    gradient also involves the multipliers: the iterate's where it is not
    certified, the projection's own where it is. With `refine=True` the
    polished point is refined too."""
    rng = np.random.default_rng(12)
    poly = random_polytope(rng, 20, 4, 15)
    Y = jnp.asarray(poly.y_feas + rng.normal(size=(16, 20)))
    V = jnp.asarray(rng.normal(size=(16, 20)))
    constraints, params = constraints_of(poly), {}
    if matrices == "per_instance":
        constraints[0] = pe.Equality(pe.Parameter("E", shape=poly.E.shape), poly.b)
        params = {"E": jnp.broadcast_to(poly.E, (16, *poly.E.shape))}
    plain = pe.Projector(constraints, n_iter=20, **settings)
    polished = plain.with_settings(polish=True)

    def loss(Y, params, proj):
        out = jax.vmap(lambda y, p: proj(y, **p))(Y, params)
        return jnp.sum(V * out)

    sol = jax.vmap(lambda y, p: polished.solve(y, **p))(Y, params)
    iterate = jax.vmap(lambda y, p: plain.solve(y, **p))(Y, params)
    certified = np.asarray(sol.result == pe.RESULTS.successful)
    assert certified.sum() >= 12, certified
    exact = np.stack([clarabel_project(np.asarray(y), poly) for y in Y])
    for i in range(16):
        if certified[i]:
            assert_close(sol.y[i], exact[i], atol=1e-8)
        elif "refine" not in settings:
            np.testing.assert_array_equal(sol.y[i], iterate.y[i])
    # Twenty iterations alone are far from it.
    assert np.max(np.abs(np.asarray(iterate.y) - exact)) > 1e-4
    g_plain, g_polished = (
        jax.grad(loss, argnums=(0, 1))(Y, params, p) for p in (plain, polished)
    )
    unrolled = "adjoint" in settings
    plain_rows = ~certified | unrolled
    np.testing.assert_allclose(
        g_polished[0][plain_rows], g_plain[0][plain_rows], rtol=1e-12, atol=1e-12
    )
    for i in np.flatnonzero(~plain_rows):
        # A projection's Jacobian is symmetric: the gradient of V . y is J V.
        y_i, v_i = np.asarray(Y[i]), np.asarray(V[i])
        fd = central_difference(lambda y: clarabel_project(y, poly), y_i, v_i, 1e-4)
        assert_close(g_polished[0][i], fd, 1e-6, what="d/dy_raw")
    if matrices == "per_instance":
        E_plain, E_polished = g_plain[1]["E"], g_polished[1]["E"]
        np.testing.assert_allclose(
            E_polished[~certified], E_plain[~certified], rtol=1e-12, atol=1e-12
        )
        i = int(np.flatnonzero(certified)[0])
        D = rng.normal(size=poly.E.shape)

        def moved(t):
            shifted = dataclasses.replace(poly, E=poly.E + t * D)
            return np.asarray(V[i]) @ clarabel_project(np.asarray(Y[i]), shifted)

        fd = central_difference(moved, 0.0, 1.0, 1e-4)
        assert_close(np.sum(E_polished[i] * D), fd, 1e-7, rtol=1e-5, what="d/dE")


@pytest.mark.parametrize(
    "items",
    slow_except(
        [("eq", "soc"), ("eq", "l1"), ("simplex", "box"), ("eq", "ineq", "soc")],
        ("simplex", "box"),
    ),
)
def test_eliminated_refinement_step_is_the_general_one(items, monkeypatch):
    """With fixed matrices, a cone set's first refinement step eliminates the
    equality rows on the host (`step_eliminated`); its correction is the
    general step's minimum-norm one (up to their regularisations), on
    iterates far enough from converged that the corrections are large."""
    from pinet_eqx._active_set import refine as _refine

    rng = np.random.default_rng(len(items))
    spec, y0 = random_set_spec(rng, 10, items)
    solver = pe.DouglasRachford(n_iter_test=8, tol_test=None)
    proj = pe.Projector(to_pinet(spec, {}), solver=solver)
    assert proj.active_rows is not None and proj.active_rows.cone is not None
    proj = proj.with_settings(inference=True)
    pairs = []
    eliminated = _refine.step_eliminated

    def both(problem, fixed, rows, y, data, flags, pre, solver):
        new = eliminated(problem, fixed, rows, y, data, flags, pre, solver)
        general = _refine.step(problem, rows, y, data, flags, pre, solver, None)
        pairs.append((np.asarray(y - new), np.asarray(y - general)))
        return new

    monkeypatch.setattr(_refine, "step_eliminated", both)
    for y_raw in y0 + 2 * rng.normal(size=(6, 10)):
        proj(jnp.asarray(y_raw))  # eager, so that the corrections are values
    assert len(pairs) == 6
    sizes = [np.max(np.abs(general)) for _, general in pairs]
    assert max(sizes) > 1e-4, sizes  # the corrections are not at rounding level
    for new, general in pairs:
        scale = max(np.max(np.abs(general)), 1e-12)
        assert np.max(np.abs(new - general)) <= 1e-4 * scale


@pytest.mark.slow
def test_refine_reaches_the_float32_rounding_floor():
    # x64 is global and on in the test process, so float32 runs in a subprocess.
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, "tests")  # for the test module's `helpers`
        import jax, jax.numpy as jnp, numpy as np
        from tests.test_refine import _dc3_projector
        assert not jax.config.jax_enable_x64
        for refine in (False, True):
            problem, proj = _dc3_projector(refine, n=256)
            X = problem.X
            Y = jax.random.normal(jax.random.key(0), (X.shape[0], 100)) * 3
            Y = jax.vmap(lambda y, x: proj(y, b=x))(Y, jnp.asarray(X, jnp.float32))
            assert Y.dtype == jnp.float32
            Y = np.asarray(Y, np.float64)
            print(np.abs(Y @ problem.A.T - X).max())
    """)
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=".",
    )
    plain, refined = (float(v) for v in out.stdout.split())
    assert refined < 0.5 * plain
    assert refined < 2e-6


POLISH_KINDS = {
    "soc": (("eq", "soc"), {}),
    "l1": (("eq", "l1", "box"), {}),
    "linf": (("ineq", "linf"), {}),
    "simplex": (("simplex", "ineq"), {}),
    "per_instance_matrices": (("eq", "soc"), {"E": (0, "E"), "b": (0, "b")}),
}


# The fast tier covers one cone face and the per-call slices; the other faces run
# in the slow tier.
_FAST = ("soc", "per_instance_matrices")


_CASES = [
    k if k in _FAST else pytest.param(k, marks=pytest.mark.slow) for k in POLISH_KINDS
]


@pytest.mark.parametrize("kind", _CASES)
def test_refine_pins_cones_simplices_and_per_instance_rows(kind):
    """Stopped early (float64, 20 or 30 iterations), the refinement takes every kind of
    set from the iteration's violation (above 1e-8) to 1e-10 or less, moving y by
    no more than the iteration's own error (the distance to Clarabel's
    projection)."""
    items, parameters = POLISH_KINDS[kind]
    rng = np.random.default_rng(4)
    spec, y0 = random_set_spec(rng, 8, items)
    if parameters:
        spec, y0 = random_instance(rng, spec, y0, parameters, jitter=0.02)
    params = {k: jnp.asarray(v) for k, v in values_of(spec, parameters).items()}
    constraints = to_pinet(spec, parameters)
    # Per-instance factorisations converge faster from the lifted start.
    early = pe.DouglasRachford(n_iter_test=20 if parameters else 30, tol_test=None)
    plain = pe.Projector(constraints, solver=early, refine=False, inference=True)
    refined = pe.Projector(constraints, solver=early, inference=True)
    raws = jnp.asarray(y0 + 2 * rng.normal(size=(6, 8)))
    # Each compiled once for the six points, batched.
    Y_plain, Y = (
        np.asarray(jax.jit(jax.vmap(lambda r, p=p: p(r, **params)))(raws))
        for p in (plain, refined)
    )
    gained = 0
    for raw, y_plain, y in zip(np.asarray(raws), Y_plain, Y):
        exact = clarabel_project_sets(raw, spec)
        # Newton steps on a curved face converge quadratically, not in one step.
        assert spec_violation(y, spec) <= 1e-10
        error = np.abs(y_plain - exact).max()
        assert np.abs(y - exact).max() <= 2 * error + 1e-10
        gained += spec_violation(y_plain, spec) > 1e-8
    # The early stop really left violations for the refinement to remove.
    assert gained >= 2


def test_refine_false_builds_no_refinement():
    A = np.ones((1, 3))
    assert pe.Projector(pe.SecondOrderCone(A), refine=False).refinement is None
    for constraint in (
        pe.AffineInequality(A, upper=np.ones(1)),
        pe.SecondOrderCone(np.eye(3)),
        pe.Equality(pe.Parameter("A", shape=(1, 3)), np.ones(1)),
    ):
        assert pe.Projector(constraint, refine=True).refinement is not None
