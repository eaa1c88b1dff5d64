"""`pinet_eqx.autotune` (paper App. H.2): it picks a sigma and an iteration count
that actually do well, and it rejects bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import clarabel_project, constraints_of, raises_for, random_polytope

import pinet_eqx as pe

# Fine enough that some sigma meets the tolerances: the good range is narrow.
SIGMAS = np.logspace(-3, np.log10(5.05), 20)
N_ITERS = (10, 25, 50, 100, 200)


@pytest.fixture(scope="module")
def tuned():
    rng = np.random.default_rng(0)
    poly = random_polytope(rng, 12, 3, 8, infs=False)
    proj = pe.Projector(constraints_of(poly, parameters=("b",)))
    shifts = rng.uniform(-0.01, 0.01, size=(24, 12))
    B = (poly.y_feas + shifts) @ poly.E.T
    Y = rng.normal(size=(24, 12))
    result = pe.autotune(
        proj,
        Y,
        {"b": B},
        sigmas=SIGMAS,
        n_iters=N_ITERS,
        violation_tol=1e-5,
        suboptimality_tol=1e-4,
    )
    return poly, proj, result


def test_autotune_scores_and_choice_are_consistent(tuned):
    _, proj, result = tuned
    assert result.sigmas.shape == result.sigma_violation.shape == (SIGMAS.size,)
    assert result.n_iter_violation.shape == (len(N_ITERS),)
    assert result.sigma in SIGMAS and result.n_iter in N_ITERS
    ok = (result.sigma_violation <= 1e-5) & (result.sigma_suboptimality <= 1e-4)
    assert ok.any()
    # A candidate with the smallest violation (up to ties at rounding level, which
    # autotune breaks with fewer iterations), and the first count that passes.
    chosen = int(np.flatnonzero(SIGMAS == result.sigma)[0])
    assert ok[chosen]
    floor = max(result.sigma_violation[ok].min(), 1e-3 * 1e-5)
    assert result.sigma_violation[chosen] <= floor
    ok_n = (result.n_iter_violation <= 1e-5) & (result.n_iter_suboptimality <= 1e-4)
    assert result.n_iter == N_ITERS[int(np.flatnonzero(ok_n)[0])]
    assert result.projector.sigma == result.sigma
    assert result.projector.n_iter == result.n_iter
    assert result.projector.n_iter_test == max(result.n_iter, proj.n_iter_test)
    assert 0 < result.seconds < 300


def test_iteration_scores_equal_fresh_runs_of_each_count(tuned):
    """Autotune scores each count by continuing the previous count's iterates;
    that equals running the count from the start."""
    poly, proj, result = tuned
    rng = np.random.default_rng(0)
    random_polytope(rng, 12, 3, 8, infs=False)  # the fixture's draws, replayed
    shifts = rng.uniform(-0.01, 0.01, size=(24, 12))
    B = jnp.asarray((poly.y_feas + shifts) @ poly.E.T)
    Y = jnp.asarray(rng.normal(size=(24, 12)))
    exact = proj.with_settings(tol=1e-9, n_iter=5000)
    Pi = jax.vmap(lambda y, b: exact(y, b=b))(Y, B)
    distance = np.linalg.norm(np.asarray(Pi - Y), axis=1)
    for n, viol, subopt in zip(
        result.n_iters, result.n_iter_violation, result.n_iter_suboptimality
    ):
        fresh = proj.with_settings(sigma=result.sigma, n_iter=n, refine=False)
        y = jax.vmap(lambda y, b, fresh=fresh: fresh(y, b=b))(Y, B)
        v = jax.vmap(lambda y, b, fresh=fresh: fresh.violation(y, b=b))(y, B)
        dist = np.linalg.norm(np.asarray(y - Y), axis=1)
        np.testing.assert_allclose(viol, float(v.max()), rtol=1e-9, atol=1e-15)
        expected = np.mean(np.abs(dist / distance - 1))
        np.testing.assert_allclose(subopt, expected, rtol=1e-9, atol=1e-15)


def test_autotune_scores_the_iteration_not_the_refinement():
    """A projector that refines in training mode, or differentiates by unrolling,
    is tuned on the same scores as one that does neither (a refinement would take
    every sigma to rounding level), and keeps its settings; candidate counts are
    sorted and deduplicated."""
    rng = np.random.default_rng(5)
    poly = random_polytope(rng, 6, 1, 4, infs=False)
    Y = rng.normal(size=(8, 6))
    kwargs = dict(sigmas=SIGMAS[::4], n_iters=(40, 10, 40, 20))
    refined = pe.autotune(pe.Projector(constraints_of(poly), refine=True), Y, **kwargs)
    plain = pe.autotune(pe.Projector(constraints_of(poly), refine=False), Y, **kwargs)
    assert refined.n_iters == plain.n_iters == (10, 20, 40)
    np.testing.assert_array_equal(refined.sigma_violation, plain.sigma_violation)
    np.testing.assert_array_equal(refined.n_iter_violation, plain.n_iter_violation)
    assert refined.projector.refine_always and refined.projector.refinement is not None
    # The adjoint does not change the iteration, and the tuned projector keeps it.
    unrolled = pe.Projector(constraints_of(poly), adjoint=pe.UnrolledAdjoint())
    unrolled = pe.autotune(unrolled, Y, **kwargs)
    np.testing.assert_array_equal(unrolled.n_iter_violation, plain.n_iter_violation)
    assert isinstance(unrolled.projector.adjoint, pe.UnrolledAdjoint)


def test_tuned_projector_is_accurate_on_fresh_points(tuned):
    """Against Clarabel, on points and contexts not used for tuning."""
    poly, _, result = tuned
    rng = np.random.default_rng(1)
    proj = result.projector
    for _ in range(3):
        b = (poly.y_feas + rng.uniform(-0.01, 0.01, size=12)) @ poly.E.T
        y_raw = rng.normal(size=12)
        y = proj(jnp.asarray(y_raw), b=jnp.asarray(b))
        expected = clarabel_project(y_raw, poly, b=b)
        assert np.max(np.abs(np.asarray(y) - expected)) < 1e-3


def test_tuned_sigma_beats_the_worst_grid_value(tuned):
    _, proj, result = tuned
    worst = SIGMAS[np.argmax(result.sigma_violation)]
    assert result.sigma_violation.max() > 100 * result.sigma_violation.min()
    assert worst != result.sigma


def test_autotune_rejects_bad_input():
    proj = pe.Projector([pe.Box(-1.0, np.ones(3)), pe.Equality(np.ones((1, 3)), 0.0)])
    with raises_for("y_raw", ValueError, "y_raw"):
        pe.autotune(proj, jnp.ones(3))
    with pytest.raises(ValueError, match="sigmas"):
        pe.autotune(proj, jnp.ones((2, 3)), sigmas=[0.1, -1.0])
    with pytest.raises(ValueError, match="n_iters"):
        pe.autotune(proj, jnp.ones((2, 3)), n_iters=[])
    proj_b = pe.Projector([pe.Equality(np.ones((1, 3)), pe.Parameter("b"))])
    with pytest.raises(ValueError, match="one row per point"):
        pe.autotune(proj_b, jnp.ones((2, 3)), {"b": jnp.ones((3, 1))})


def test_autotune_in_float32_keeps_the_dtype():
    proj = pe.Projector([pe.Equality(np.ones((1, 4)), 1.0), pe.Box(0.0, np.ones(4))])
    Y = jax.random.normal(jax.random.key(0), (8, 4), jnp.float32)
    result = pe.autotune(proj, Y, sigmas=SIGMAS[:4], n_iters=(10, 50))
    assert result.projector(Y[0]).dtype == jnp.float32


@pytest.mark.slow  # 11 s; the other autotune tests stay in the fast tier
def test_inference_after_autotune_is_no_worse_than_the_defaults():
    """Autotune tunes for the training budget; inference keeps at least the
    defaults' accuracy. Without the refinement (which would take both to the
    rounding floor) the comparison depends on the iterations alone."""
    rng = np.random.default_rng(4)
    d = 8
    A = rng.normal(size=(5, d))
    y0 = rng.uniform(-0.3, 0.3, size=d)
    constraints = [
        pe.SecondOrderCone(A, None, None, float(np.linalg.norm(A @ y0)) + 0.2),
        pe.Equality(rng.normal(size=(2, d)), pe.Parameter("b")),
    ]
    E = constraints[1].A
    defaults = pe.Projector(constraints, refine=False)
    Y = 3 * rng.normal(size=(32, d))
    B = (y0 + rng.uniform(-0.01, 0.01, size=(32, d))) @ E.T
    result = pe.autotune(defaults, Y[:16], {"b": B[:16]}, n_iters=(10, 25, 50))

    def inference_cv(proj):
        proj = proj.with_settings(inference=True)
        sol = jax.vmap(lambda y, b: proj.solve(y, b=b))(Y[16:], B[16:])
        return float(sol.primal_residual.max())

    assert inference_cv(result.projector) <= 1.01 * inference_cv(defaults) + 1e-12
