"""Forward accuracy against cvxpy + Clarabel (float64)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    assert_close,
    clarabel_project,
    clarabel_project_sets,
    constraints_of,
    random_polytope,
    random_set_spec,
    slow_except,
    to_pinet,
)

import pinet_eqx as pe

# (d, m_eq, m_ineq, box)
KINDS = {
    "equality": (12, 5, 0, False),
    "inequality": (12, 0, 9, False),
    "box": (12, 0, 0, True),
    "mixed": (15, 4, 10, True),
}

ACCURATE = dict(n_iter=100_000, tol=1e-10, sigma=0.1)


# "mixed" has every kind of row: the fast tier runs it in every affine form,
# with and without equilibration; `pytest -m slow` runs every combination.
FAST = {
    ("nullspace", True, "mixed"),
    ("eliminated", False, "mixed"),
    ("dense", True, "mixed"),
}


@pytest.mark.parametrize(
    "affine_form, equilibrate, kind",
    [
        (form, eq, kind)
        if (form, eq, kind) in FAST
        else pytest.param(form, eq, kind, marks=pytest.mark.slow)
        for form in ("nullspace", "eliminated", "dense")
        for eq in (True, False)
        for kind in KINDS
    ],
)
def test_matches_clarabel(kind, equilibrate, affine_form):
    d, m_eq, m_ineq, box = KINDS[kind]
    rng = np.random.default_rng(10 * list(KINDS).index(kind) + int(equilibrate))
    poly = random_polytope(rng, d, m_eq, m_ineq, box=box)
    proj = pe.Projector(
        constraints_of(poly),
        equilibrate=equilibrate,
        affine_form=affine_form,
        **ACCURATE,
    )
    for _ in range(3):
        y_raw = 2.0 * rng.normal(size=d)
        sol = proj.solve(jnp.asarray(y_raw))
        expected = clarabel_project(y_raw, poly)
        assert sol.result == pe.RESULTS.successful
        assert_close(sol.y, expected, atol=1e-6, what=f"{kind} projection")
        assert float(sol.primal_residual) <= 1e-9


@pytest.mark.slow
def test_feasible_point_is_fixed():
    rng = np.random.default_rng(1)
    poly = random_polytope(rng, 10, 3, 6)
    proj = pe.Projector(constraints_of(poly), **ACCURATE)
    assert_close(proj(jnp.asarray(poly.y_feas)), poly.y_feas, atol=1e-8, what="y_feas")


def test_parameters_vary_per_instance_under_vmap():
    rng = np.random.default_rng(2)
    poly = random_polytope(rng, 14, 4, 8)
    proj = pe.Projector(
        constraints_of(poly, parameters=("b", "upper", "lb")), **ACCURATE
    )
    assert dict(proj.parameters) == {"b": (4,), "upper": (8,), "lb": (14,)}
    B = 5
    # Each instance gets its own feasible data: shift the interior point.
    shifts = rng.uniform(-0.3, 0.3, size=(B, 14))
    bs = (poly.y_feas + shifts) @ poly.E.T
    uppers = poly.upper + (shifts @ poly.C.T).clip(min=0)
    lbs = np.minimum(poly.lb, poly.y_feas + shifts - 0.1)
    Y = 2.0 * rng.normal(size=(B, 14))
    out = jax.jit(jax.vmap(lambda y, b, u, lb: proj(y, b=b, upper=u, lb=lb)))(
        Y, bs, uppers, lbs
    )
    for i in range(B):
        expected = clarabel_project(Y[i], poly, b=bs[i], upper=uppers[i], lb=lbs[i])
        assert_close(out[i], expected, atol=1e-6, what=f"instance {i}")


def test_box_mask_and_infinite_bounds():
    d = 8
    mask = np.zeros(d, dtype=bool)
    mask[[1, 4, 6]] = True
    proj = pe.Projector(
        [pe.Box(lower=[-1.0, 0.0, -np.inf], upper=[1.0, np.inf, 0.5], mask=mask)]
    )
    y_raw = jnp.linspace(-3.0, 3.0, d)
    y = proj(y_raw)
    expected = np.asarray(y_raw).copy()
    expected[1] = np.clip(expected[1], -1, 1)
    expected[4] = max(expected[4], 0.0)
    expected[6] = min(expected[6], 0.5)
    assert_close(y, expected, atol=1e-9, what="masked box")


def test_intersecting_boxes():
    proj = pe.Projector(
        [pe.Box(lower=-1.0, upper=1.0), pe.Box(lower=np.array([0.0, -5.0, 0.2]))]
    )
    y = proj(jnp.array([-2.0, -2.0, 0.0]))
    assert_close(y, [0.0, -1.0, 0.2], atol=1e-9, what="box intersection")


def test_redundant_consistent_equalities():
    rng = np.random.default_rng(3)
    poly = random_polytope(rng, 10, 4, 5)
    # Append a duplicate row and a linear combination, with consistent b.
    extra = np.stack([poly.E[0], poly.E[1] - 2 * poly.E[2]])
    E = np.concatenate([poly.E, extra])
    b = E @ poly.y_feas
    proj = pe.Projector(
        [
            pe.Equality(E, b),
            pe.AffineInequality(poly.C, poly.lower, poly.upper),
            pe.Box(poly.lb, poly.ub),
        ],
        **ACCURATE,
    )
    assert len(proj.dropped_equality_rows) == 2
    y_raw = rng.normal(size=10)
    assert_close(proj(jnp.asarray(y_raw)), clarabel_project(y_raw, poly), atol=1e-6)


def test_two_sided_inequality_with_infinite_entries():
    rng = np.random.default_rng(4)
    poly = random_polytope(rng, 9, 0, 7, box=False, infs=False)
    poly.lower[[0, 3]] = -np.inf
    poly.upper[[1, 3]] = np.inf
    proj = pe.Projector(constraints_of(poly), **ACCURATE)
    y_raw = 3 * rng.normal(size=9)
    assert_close(proj(jnp.asarray(y_raw)), clarabel_project(y_raw, poly), atol=1e-6)


def test_early_stopping_reports_iterations_and_status():
    rng = np.random.default_rng(5)
    poly = random_polytope(rng, 20, 6, 12)
    proj = pe.Projector(constraints_of(poly), n_iter=20_000, tol=1e-6)
    Y = jnp.asarray(rng.normal(size=(6, 20)))
    sol = jax.vmap(proj.solve)(Y)
    assert np.all(sol.result == pe.RESULTS.successful)
    assert np.all(sol.n_iter < 20_000)
    # Each instance stops on its own: the counts differ across the batch.
    assert len(set(np.asarray(sol.n_iter).tolist())) > 1
    assert np.all(sol.primal_residual <= 1e-6)
    # The reported residual is the true violation of the returned point.
    viol = jax.vmap(proj.violation)(sol.y)
    assert_close(sol.primal_residual, viol, atol=1e-12)
    # A budget that is too small is reported, not hidden.
    short = proj.with_settings(n_iter=2)
    assert np.any(jax.vmap(short.solve)(Y).result == pe.RESULTS.max_steps_reached)


def test_warm_start_reduces_iterations():
    rng = np.random.default_rng(6)
    poly = random_polytope(rng, 20, 6, 12)
    proj = pe.Projector(constraints_of(poly), n_iter=5000, tol=1e-9)
    y_raw = jnp.asarray(rng.normal(size=20))
    cold = proj.solve(y_raw)
    warm = proj.solve(y_raw + 1e-3, s0=cold.s)
    assert int(warm.n_iter) < int(cold.n_iter)
    assert_close(warm.y, clarabel_project(np.asarray(y_raw) + 1e-3, poly), atol=1e-6)


def _drifting_case():
    """A polytope and point on which the iteration drifts: the projection is a
    vertex (three equalities and two active rows in five dimensions) next to a
    third row with 1e-3 of slack, which the iteration holds as active for
    about 50000 steps unless the drift is skipped (a hypothesis draw)."""
    rng = np.random.default_rng(28952)
    poly = random_polytope(rng, 5, 3, 3, box=False)
    return poly, 4.0 * rng.normal(size=(2, 5))[0]


def test_a_drift_near_a_vertex_is_skipped():
    poly, y_raw = _drifting_case()
    proj = pe.Projector(constraints_of(poly), n_iter=2000, tol=1e-10)
    sol = proj.solve(jnp.asarray(y_raw))
    assert sol.result == pe.RESULTS.successful
    assert int(sol.n_iter) < 1000
    assert_close(sol.y, clarabel_project(y_raw, poly), atol=1e-8)


def _float32_drift_rows():
    """A polytope with a 1-dimensional face structure (4 variables, 3
    equalities, 16 two-sided rows) and 8 far raw outputs: without the skip 5
    stopped at the cap, up to 1.8e-2 from the projection."""
    rng = np.random.default_rng(675405135)
    poly = random_polytope(rng, 4, 3, 16, box=False)
    return constraints_of(poly), poly.y_feas + 5 * rng.normal(size=(8, 4)), poly


def _float32_drift_small():
    """Equalities, rows and a box in 8 variables, 32 far raw outputs: in one
    the step t - z of its drift (2e-3) changes by about one rounding of s
    between checks, ten times the relative threshold, and it stopped at the
    cap 2e-3 from the set."""
    rng = np.random.default_rng(102)
    spec, y0 = random_set_spec(rng, 8, ("eq", "ineq", "box"))
    return to_pinet(spec), y0 + 5 * rng.normal(size=(32, 8)), spec


@pytest.mark.parametrize(
    "case",
    slow_except([_float32_drift_rows, _float32_drift_small], _float32_drift_small),
)
def test_float32_drifts_are_skipped_through_rounding(case):
    """In float32 a drift's t - z wobbles by the rounding of s from one check to
    the next; it is still skipped, and every instance converges at the
    defaults to the projection (Clarabel)."""
    constraints, raw, spec = case()
    Y = jnp.asarray(raw, jnp.float32)
    proj = eqx.nn.inference_mode(pe.Projector(constraints))
    sol = jax.vmap(proj.solve)(Y)
    assert np.all(sol.result == pe.RESULTS.successful)
    if isinstance(spec, list):
        truth = [clarabel_project_sets(np.asarray(y, np.float64), spec) for y in Y]
    else:
        truth = [clarabel_project(np.asarray(y, np.float64), spec) for y in Y]
    assert_close(np.asarray(sol.y, np.float64), np.stack(truth), atol=1e-5)


def test_drift_steps_are_those_of_the_iteration():
    """The state after the skipped steps is the iteration's own after as many
    steps, and the drift ends right after them."""
    from pinet_eqx._projector.frozen import thaw
    from pinet_eqx._solver import douglas_rachford as dr

    poly, y_raw = _drifting_case()
    y_raw = jnp.asarray(y_raw)
    proj = pe.Projector(constraints_of(poly), tol=None)
    problem, op = thaw((proj.problem, proj.op))
    data = problem.data(problem.resolve({}, y_raw.dtype), y_raw.dtype, False)
    P = dr.prepare(y_raw, data, op, proj.sigma)
    omega = proj.solver.omega

    def state(n):
        s = proj.with_settings(n_iter=n).solve(y_raw).s
        return (s, *dr.z_and_t(s, P, op))

    before = state(1000)
    s, z, t = state(1000 + dr.CHECK_EVERY)
    jump = int(dr.drift_steps(s, z, t, *before[1:], P, omega))
    assert jump > 10_000
    skipped = s + jump * omega * (t - z)
    s_plain, z_plain, t_plain = state(1000 + dr.CHECK_EVERY + jump)
    assert_close(skipped, s_plain, atol=1e-9 * float(jnp.max(jnp.abs(s_plain))))
    # Still drifting at the state reached, no longer a few steps later.
    assert_close(t_plain - z_plain, t - z, atol=1e-9)
    _, z_after, t_after = state(1000 + 2 * dr.CHECK_EVERY + jump)
    assert float(jnp.max(jnp.abs((t_after - z_after) - (t - z)))) > 1e-6


def test_violation_uses_original_coordinates():
    rng = np.random.default_rng(7)
    # Badly scaled rows make equilibration matter.
    poly = random_polytope(rng, 10, 3, 6)
    poly.C[0] *= 1e3
    poly.lower[0] *= 1e3
    poly.upper[0] *= 1e3
    proj = pe.Projector(constraints_of(poly))
    y = rng.normal(size=10)
    expected = max(
        np.abs(poly.E @ y - poly.b).max(),
        np.maximum(poly.lower - poly.C @ y, 0).max(),
        np.maximum(poly.C @ y - poly.upper, 0).max(),
        np.nan_to_num(np.maximum(poly.lb - y, 0)).max(),
        np.nan_to_num(np.maximum(y - poly.ub, 0)).max(),
    )
    assert_close(proj.violation(jnp.asarray(y)), expected, atol=1e-9, rtol=1e-12)


def test_equilibrate_balances_norms():
    rng = np.random.default_rng(8)
    M = rng.normal(size=(20, 30)) * np.logspace(-3, 3, 30)[None, :]
    d_r, d_c = pe.equilibrate(M)
    scaled = d_r[:, None] * M * d_c[None, :]
    for axis in (0, 1):
        norms = np.linalg.norm(scaled, axis=axis)
        assert norms.max() / norms.min() < 1.01
    d_r_j, d_c_j = pe.equilibrate(M, mode="jacobi", n_iter=200)
    scaled_j = d_r_j[:, None] * M * d_c_j[None, :]
    assert np.ptp(np.linalg.norm(scaled_j, axis=1)) < 0.05


@pytest.mark.slow
def test_auto_sigma_is_robust_to_rescaling_y():
    # Substituting y = alpha * y' rescales the columns of every matrix. "auto" sigma
    # follows the equilibration's column scaling, so the iteration count barely
    # moves, where a fixed sigma goes from 125 to over 20000 iterations here.
    rng = np.random.default_rng(9)
    poly = random_polytope(rng, 16, 5, 10, box=False)
    y_raw = 2.0 * rng.normal(size=16)
    expected = clarabel_project(y_raw, poly)
    steps = []
    for alpha in (1.0, 30.0, 0.03):
        proj = pe.Projector(
            [
                pe.Equality(poly.E / alpha, poly.b),
                pe.AffineInequality(poly.C / alpha, poly.lower, poly.upper),
            ],
            n_iter=20_000,
            tol=1e-9,
        )
        sol = proj.solve(jnp.asarray(alpha * y_raw))
        assert sol.result == pe.RESULTS.successful
        assert_close(sol.y / alpha, expected, atol=1e-6, what=f"alpha={alpha}")
        steps.append(int(sol.n_iter))
    assert max(steps) <= 1.5 * min(steps), steps


def test_works_under_every_transformation():
    rng = np.random.default_rng(10)
    poly = random_polytope(rng, 8, 3, 5)
    proj = pe.Projector(constraints_of(poly, parameters=("b",)), n_iter=200)
    y_raw = jnp.asarray(rng.normal(size=8))
    b = jnp.asarray(poly.b)
    eager = proj(y_raw, b=b)
    # (A Module holding arrays is not hashable, so `jax.jit(proj)` itself is not
    # allowed; jit a function that closes over it, or use eqx.filter_jit.)
    transforms = (
        jax.jit(lambda y, b: proj(y, b=b)),
        eqx.filter_jit(proj),
        eqx.filter_jit(proj.solve),
    )
    for transformed in transforms:
        out = transformed(y_raw, b=b)
        out = out.y if isinstance(out, pe.ProjectionSolution) else out
        np.testing.assert_allclose(out, eager, rtol=1e-12, atol=1e-12)
    batched = jax.vmap(proj)(jnp.stack([y_raw, y_raw]), b=jnp.stack([b, b]))
    np.testing.assert_allclose(batched[1], eager, rtol=1e-12, atol=1e-12)
    # The projector can be a traced argument too (filter_jit over the module).
    g = eqx.filter_jit(eqx.filter_grad(lambda y, p: jnp.sum(p(y, b=b) ** 2)))(
        y_raw, proj
    )
    assert g.shape == (8,) and bool(jnp.all(jnp.isfinite(g)))
