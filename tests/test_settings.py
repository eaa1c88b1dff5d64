"""Solver settings: `DouglasRachford`, `Equilibration`, `with_settings` and the
deprecated keywords."""

import dataclasses
import warnings

import jax
import numpy as np
import pytest
from helpers import constraints_of, raises_for, random_polytope

import pinet_eqx as pe


def _projector(**kwargs):
    rng = np.random.default_rng(0)
    spec = random_polytope(rng, d=8, m_eq=2, m_ineq=5)
    return pe.Projector(constraints_of(spec), **kwargs), spec


def test_shorthands_build_the_solver():
    proj, _ = _projector(sigma=0.3, omega=1.5, n_iter=20, n_iter_test=40, tol=1e-7)
    assert proj.solver == pe.DouglasRachford(
        sigma=0.3, omega=1.5, n_iter=20, n_iter_test=40, tol=1e-7
    )
    same, _ = _projector(solver=proj.solver)
    assert same.solver == proj.solver
    with pytest.raises(ValueError, match="either `solver=` or"):
        _projector(solver=proj.solver, n_iter=3)


def test_n_iter_test_follows_n_iter_until_set():
    proj, _ = _projector(n_iter=30)
    assert proj.n_iter_test == 30
    # Resolved when used, not at construction: changing n_iter moves both.
    more = proj.with_settings(n_iter=200)
    assert (more.n_iter, more.n_iter_test) == (200, 200)
    fixed = proj.with_settings(n_iter_test=70)
    assert (fixed.n_iter, fixed.n_iter_test) == (30, 70)
    # None means "the same as n_iter" again, and inference still runs.
    reset = fixed.with_settings(n_iter_test=None, n_iter=40)
    assert reset.n_iter_test == 40


def test_inference_runs_the_inference_count():
    """Without `tol_test`, inference mode runs exactly `n_iter_test` iterations."""
    proj, spec = _projector(n_iter=5)
    proj = proj.with_settings(tol_test=None)
    y = np.random.default_rng(1).normal(size=spec.d)
    sol = proj.with_settings(n_iter_test=None, inference=True).solve(y)
    assert int(sol.n_iter) == 5
    sol = proj.with_settings(n_iter_test=35, inference=True).solve(y)
    assert int(sol.n_iter) == 35
    sol = proj.with_settings(n_iter_test=35).solve(y)  # training mode
    assert int(sol.n_iter) == 5


@pytest.mark.parametrize("scale", [pytest.param(0.1, marks=pytest.mark.slow), 30.0])
def test_inference_iterates_to_tol_test(scale):
    """By default, inference runs `n_iter_test` iterations, then each instance
    above `tol_test` goes on (in steps of 5) up to `n_iter_test_max`; `result` is
    successful exactly when both residuals are within `tol_test`. Training mode
    is unaffected."""
    proj, spec = _projector(n_iter=10)
    Y = np.random.default_rng(3).normal(size=(16, spec.d)) * scale
    tol = proj.solver.inference_tol(Y.dtype)
    assert (tol, proj.solver.n_iter_test_max) == (1e-9, 1000)  # "auto", float64
    sol = jax.vmap(proj.with_settings(inference=True).solve)(Y)
    n = np.asarray(sol.n_iter)
    met = (np.asarray(sol.primal_residual) <= tol) & (
        np.asarray(sol.fixed_point_residual) <= tol
    )
    assert np.array_equal(np.asarray(sol.result == pe.RESULTS.successful), met)
    assert np.all(n >= 10) and np.all((n - 10) % 5 == 0) and np.all(n <= 1000)
    assert np.all(met | (n == 1000))  # only the cap stops an instance short
    # Most instances meet the tolerance; far ones need more than 10 iterations.
    assert met.mean() >= 0.75
    if scale > 1:
        assert n.max() > 10
    trained = jax.vmap(proj.solve)(Y)
    assert np.all(np.asarray(trained.n_iter) == 10)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(sigma=-1.0), "sigma"),
        (dict(sigma="tuned"), "sigma"),
        (dict(omega=2.0), "omega"),
        (dict(n_iter=0), "n_iter"),
        (dict(n_iter=2.5), "n_iter"),
        (dict(n_iter_test=0), "n_iter_test"),
        (dict(tol=0.0), "tol"),
        (dict(tol_test=-1e-3), "tol_test"),
        (dict(tol_test="tight"), "tol_test"),
        (dict(n_iter_test_max=0), "n_iter_test_max"),
    ],
)
def test_bad_settings_name_the_argument(settings, message):
    proj, _ = _projector()
    with raises_for(message, ValueError, message):
        proj.with_settings(**settings)
    with raises_for(message, ValueError, message):
        if message in ("tol_test", "n_iter_test_max"):  # solver fields only
            pe.DouglasRachford(**settings)
        else:
            _projector(**settings)


def test_with_settings_rejects_unknown_and_structural_settings():
    proj, _ = _projector()
    with pytest.raises(TypeError, match="unknown setting"):
        proj.with_settings(equilibrate=False)
    with pytest.raises(ValueError, match="fixed iteration count"):
        proj.with_settings(tol=1e-6, adjoint=pe.UnrolledAdjoint())
    with pytest.raises(TypeError, match="unexpected keyword"):
        _projector(n_iters=3)


def test_with_settings_reuses_the_factorisation():
    proj, _ = _projector()
    new = proj.with_settings(sigma=0.5, n_iter=7, inference=True, check_inputs=False)
    assert new.op is proj.op and new.problem is proj.problem
    assert (new.sigma, new.n_iter, new.inference, new.check_inputs) == (
        0.5,
        7,
        True,
        False,
    )
    # The original is unchanged.
    assert proj.n_iter == 50 and not proj.inference


@pytest.mark.slow
def test_with_settings_refine_matches_a_projector_built_with_it():
    """`with_settings(refine=...)` gives the outputs of a projector built with that
    `refine`, in both modes; there is nothing to switch on without a refinement."""
    Y = np.random.default_rng(3).normal(size=(6, 8)) * 3
    for inference in (False, True):
        outputs = {}
        for refine in (True, "auto", False):
            built, _ = _projector(refine=refine, inference=inference, n_iter=30)
            switched, _ = _projector(n_iter=30, inference=inference)
            switched = switched.with_settings(refine=refine)
            y_built = np.asarray(jax.vmap(built)(Y))
            np.testing.assert_array_equal(np.asarray(jax.vmap(switched)(Y)), y_built)
            outputs[refine] = y_built
        # The setting matters: refinement moves the 30-iteration outputs.
        refined = True if not inference else "auto"
        assert np.abs(outputs[refined] - outputs[False]).max() > 1e-12
    plain, _ = _projector(refine=False)
    with raises_for("refine", ValueError, "no refinement to switch on"):
        plain.with_settings(refine=True)
    with raises_for("refine", ValueError, "must be True, False or 'auto'"):
        plain.with_settings(refine="always")


def test_polish_setting():
    """`polish` is `"auto"` (default), `True` or `False`, set at construction or
    by `with_settings`; `"auto"` acts at inference only (training mode gives
    the same outputs as `False`), `True` in training mode too."""
    proj, spec = _projector(n_iter=10)
    assert proj.polish == "auto" and proj.with_settings(polish=False).polish is False
    assert _projector(polish=True)[0].polish is True
    Y = np.random.default_rng(4).normal(size=(6, spec.d)) * 3
    off = proj.with_settings(polish=False)
    np.testing.assert_array_equal(jax.vmap(off)(Y), jax.vmap(proj)(Y))
    always = jax.vmap(proj.with_settings(polish=True))(Y)
    assert np.max(np.abs(always - jax.vmap(proj)(Y))) > 1e-6
    for bad in ("yes", 1):
        with raises_for("polish", TypeError, "must be True, False or 'auto'"):
            proj.with_settings(polish=bad)
    with raises_for("polish", TypeError, "must be True, False or 'auto'"):
        _projector(polish=1)


@pytest.mark.parametrize("tol", [None, 1e-3, 1e-10])
def test_result_tracks_the_tolerance(tol):
    """`result` is judged against `tol`, or `default_tol(dtype)` without one: it
    is successful exactly when both residuals are within it."""
    proj, spec = _projector(n_iter=40, tol=tol)
    Y = np.random.default_rng(2).normal(size=(16, spec.d)) * 3
    sol = jax.vmap(proj.solve)(Y)
    threshold = pe.DouglasRachford.default_tol(Y.dtype) if tol is None else tol
    met = (np.asarray(sol.primal_residual) <= threshold) & (
        np.asarray(sol.fixed_point_residual) <= threshold
    )
    assert np.array_equal(np.asarray(sol.result == pe.RESULTS.successful), met)
    # A cap that is too small for the tolerance leaves instances reported.
    if tol == 1e-10:
        assert not met.all()


def test_default_tol_by_precision():
    assert pe.DouglasRachford.default_tol(np.float32) == 1e-5
    assert pe.DouglasRachford.default_tol(np.float64) == 1e-9
    # Inference's tolerance: "auto" by precision, or the value given.
    solver = pe.DouglasRachford()
    assert solver.tol_test == "auto"
    assert solver.inference_tol(np.float32) == 1e-4
    assert solver.inference_tol(np.float64) == 1e-9
    assert pe.DouglasRachford(tol_test=1e-6).inference_tol(np.float64) == 1e-6
    assert pe.DouglasRachford(tol_test=None).inference_tol(np.float32) is None


def test_equilibration_settings_and_deprecated_keywords():
    proj, _ = _projector(equilibrate=pe.Equilibration(n_iter=3, mode="jacobi"))
    assert proj.equilibration == pe.Equilibration(n_iter=3, mode="jacobi")
    assert _projector(equilibrate=False)[0].equilibration is None
    with raises_for("mode", ValueError, "mode"):
        pe.Equilibration(mode="ruiz")
    with pytest.warns(DeprecationWarning, match="equilibrate_iters"):
        old, _ = _projector(equilibrate_iters=3, equilibrate_mode="jacobi")
    assert old.equilibration == proj.equilibration
    with pytest.warns(DeprecationWarning, match="n_iter_bwd"):
        old, _ = _projector(n_iter_bwd=7)
    assert old.adjoint == pe.ImplicitAdjoint(max_steps=7)
    with pytest.warns(DeprecationWarning, match="max_iter"):
        pe.equilibrate(np.eye(3), max_iter=2)


def test_settings_objects_are_hashable_configuration():
    """Settings never hold arrays (only sigma is a leaf, for autotune's sweep)."""
    solver = pe.DouglasRachford(sigma=0.1)
    assert hash(solver) == hash(dataclasses.replace(solver))
    assert jax.tree.leaves(solver) == [0.1]
    assert jax.tree.leaves(pe.Equilibration()) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _projector()  # no deprecation warning from the defaults


def test_tolerance_below_the_rounding_is_raised_to_it():
    """In float32, a `tol` below what the dtype resolves at the point's magnitude
    is raised to 10 eps max(1, |(y, C y)|_inf): instances stop well before the
    cap, and `result` is judged against the same raised bound."""
    rng = np.random.default_rng(4)
    spec = random_polytope(rng, d=8, m_eq=2, m_ineq=5, box=False)
    # Scaled data: the lifted point is large, so float32 resolves only ~1e-5.
    scaled = dataclasses.replace(
        spec, b=300 * spec.b, upper=300 * spec.upper, lower=300 * spec.lower
    )
    proj = pe.Projector(constraints_of(scaled), n_iter=2000, tol=1e-12)
    Y = np.asarray(rng.normal(size=(8, spec.d)) * 300, np.float32)
    sol = jax.vmap(proj.solve)(Y)
    assert sol.y.dtype == np.float32
    n = np.asarray(sol.n_iter)
    assert np.all(n < 2000), n
    assert np.all(np.asarray(sol.result == pe.RESULTS.successful))
    # The bound the instances met is a small multiple of the rounding.
    y = np.asarray(sol.y, np.float64)
    magnitude = np.maximum(np.abs(y).max(1), np.abs(y @ spec.C.T).max(1))
    eps = np.finfo(np.float32).eps
    fp = np.asarray(sol.fixed_point_residual)
    assert np.all(fp <= 1.5 * 10 * eps * np.maximum(1.0, magnitude)), fp
