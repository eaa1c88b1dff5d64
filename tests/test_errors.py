"""Bad input gets a clear error that names the argument; never a silent NaN."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raises_for

import pinet_eqx as pe

A = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
C = np.array([[1.0, -1.0, 0.0]])


def _proj(**kw):
    return pe.Projector(
        [pe.Equality(A, pe.Parameter("b")), pe.AffineInequality(C, upper=1.0)], **kw
    )


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: pe.Projector([]), ValueError, "empty list"),
        (lambda: pe.Projector([A]), TypeError, "not a constraint"),
        (lambda: pe.Equality(A, np.ones(3)), ValueError, r"`b` must have shape \(2,\)"),
        (
            lambda: pe.Equality(np.ones(3), np.ones(3)),
            ValueError,
            "`A` must have shape",
        ),
        (lambda: pe.Equality([[1.0, np.nan]], [0.0]), ValueError, "`A` contains NaN"),
        (lambda: pe.AffineInequality([[np.inf, 0.0]], upper=1.0), ValueError, "`C`"),
        (
            lambda: pe.AffineInequality(C, lower=2.0, upper=1.0),
            ValueError,
            "lower > upper",
        ),
        (lambda: pe.AffineInequality(C), ValueError, "vacuous"),
        (
            lambda: pe.Box(lower=[0.0, 1.0], upper=[1.0, 0.0]),
            ValueError,
            "lower > upper",
        ),
        (lambda: pe.Box(lower=[0.0, np.inf]), ValueError, "infinite entry"),
        (
            lambda: pe.Projector(
                [
                    pe.Box(lower=1.0, upper=2.0, mask=[True, False]),
                    pe.Box(upper=[0.0, 5.0]),
                ]
            ),
            ValueError,
            "lower > upper",
        ),
        (
            lambda: pe.Box(lower=0.0, mask=[1, 0]),
            ValueError,
            "`mask` must be a boolean",
        ),
        (
            lambda: pe.Projector(
                [pe.Equality(A, [1.0, 1.0]), pe.Box(-np.ones(4), np.ones(4))]
            ),
            ValueError,
            "size 4",
        ),
        (lambda: pe.Projector([pe.Box(lower=0.0)]), ValueError, "dim="),
        (
            lambda: pe.Projector(
                [pe.Equality(np.vstack([A, A]), [1.0, 1.0, 1.0, 2.0])]
            ),
            ValueError,
            "inconsistent",
        ),
        (lambda: pe.Parameter("not a name"), ValueError, "identifier"),
        (lambda: pe.Parameter("key"), ValueError, "reserved"),
        (lambda: _proj(sigma=-1.0), ValueError, "sigma"),
        (lambda: _proj(omega=2.5), ValueError, "omega"),
        (lambda: _proj(n_iter=0), ValueError, "n_iter"),
        (
            lambda: _proj(adjoint=pe.UnrolledAdjoint(), tol=1e-6),
            ValueError,
            r"UnrolledAdjoint\(\), tol=.*tol=None",
        ),
        (lambda: pe.ImplicitAdjoint(on_failure="loud"), ValueError, "on_failure"),
        (lambda: pe.ImplicitAdjoint(method="exact"), ValueError, "method"),
        (
            lambda: pe.ImplicitAdjoint(linear_solver=pe.BiCGStab(), rtol=1e-8),
            ValueError,
            "on that solver instead",
        ),
        (lambda: _proj(adjoint="implicit"), TypeError, "adjoint="),
        (
            lambda: _proj(adjoint=pe.ImplicitAdjoint(), n_iter_bwd=10),
            ValueError,
            "either `adjoint=` or the deprecated",
        ),
        (
            lambda: _proj().with_settings(
                adjoint=pe.UnrolledAdjoint(), bwd_failure="ignore"
            ),
            ValueError,
            "either `adjoint=` or the deprecated",
        ),
        (lambda: _proj().with_settings(n_itr=3), TypeError, "unknown setting"),
    ],
)
def test_construction_errors(make, exc, match):
    # Under the runtime type checker, arguments of the wrong type are rejected
    # before our checks run, by a TypeCheckError that names the parameter.
    with raises_for(_PARAMETER_OF.get(match, "(none)"), exc, match):
        make()


_PARAMETER_OF = {
    "not a constraint": "constraints",
    "on_failure": "on_failure",
    "method": "method",
    "adjoint=": "adjoint",
}


def test_active_set_adjoint_on_a_cone_problem_raises():
    proj = pe.Projector(
        [pe.SecondOrderCone(np.eye(3)[:2], f=np.eye(3)[2])],
        adjoint=pe.ImplicitAdjoint(method="active_set"),
    )
    with pytest.raises(ValueError, match="method='active_set'.*polyhedral"):
        proj(jnp.ones(3))


def test_call_errors_name_the_argument():
    proj = _proj()
    y, b = jnp.zeros(3), jnp.ones(2)
    with raises_for("y_raw", ValueError, r"`y_raw` must have shape \(3,\).*vmap"):
        proj(jnp.zeros((4, 3)), b=b)
    with raises_for("y_raw", ValueError, r"`y_raw` must have shape \(3,\)"):
        proj(jnp.zeros(5), b=b)
    with pytest.raises(TypeError, match=r"missing \['b'\]"):
        proj(y)
    with pytest.raises(TypeError, match=r"unknown \['c'\]"):
        proj(y, b=b, c=b)
    with pytest.raises(ValueError, match=r"parameter `b` must have shape \(2,\)"):
        proj(y, b=jnp.ones(3))
    with pytest.raises(ValueError, match=r"`s0` must have shape \(4,\)"):
        proj.solve(y, s0=jnp.zeros(3), b=b)


def test_nan_y_raw_raises_instead_of_propagating():
    proj = _proj()
    f = jax.jit(lambda y: proj(y, b=jnp.ones(2)))
    with pytest.raises(Exception, match="non-finite|NaN"):
        jax.block_until_ready(f(jnp.array([0.0, jnp.nan, 1.0])))
    # Under vmap, one bad instance is reported too.
    Y = jnp.zeros((3, 3)).at[1, 2].set(jnp.inf)
    with pytest.raises(Exception, match="NaN or inf"):
        jax.block_until_ready(jax.vmap(lambda y: proj(y, b=jnp.ones(2)))(Y))


def test_crossed_parameter_bounds_raise_at_run_time():
    proj = pe.Projector(
        [pe.Equality(A, [1.0, 1.0]), pe.Box(pe.Parameter("lo"), pe.Parameter("hi"))]
    )
    with pytest.raises(Exception, match="lower > upper"):
        jax.block_until_ready(proj(jnp.zeros(3), lo=jnp.ones(3), hi=jnp.zeros(3)))


def test_checks_can_be_disabled_for_speed():
    proj = _proj(check_inputs=False)
    out = proj(jnp.array([0.0, jnp.nan, 1.0]), b=jnp.ones(2))
    # Documented behaviour without checks: NaN propagates, it is not hidden.
    assert bool(jnp.any(jnp.isnan(out)))
    assert isinstance(eqx.nn.inference_mode(proj), pe.Projector)
