"""Every matrix product of the projection is compiled at full precision.

On GPUs since Ampere, XLA multiplies float32 matrices in TensorFloat-32 unless
told otherwise, and a trained motion planner's projections then violated the
jerk limit by 3e-2 on an H100 (1e-5 on the CPU). The CPU cannot show the
rounding, so this reads the lowered programs (StableHLO, which is what XLA
compiles): the jaxpr is not enough, as lineax's solve is a primitive whose body
is traced only when the program is lowered (on an H100 that body once ran in
TF32 and the gradients were accurate to 1e-4 instead of 1e-7).
"""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import constraints_of, random_polytope, random_set_spec, to_pinet

import pinet_eqx as pe

_PRECISION = re.compile(r"precision = \[(\w+), (\w+)\]")


def _dot_precisions(fn, *args) -> list[tuple[str, ...]]:
    """The precision of every `dot_general` in the lowered `jax.jit(fn)`."""
    text = jax.jit(fn).lower(*args).as_text()
    found = []
    for line in text.splitlines():
        if "stablehlo.dot_general" in line:
            match = _PRECISION.search(line)
            found.append(match.groups() if match else ("DEFAULT", "DEFAULT"))
    return found


def _polytope(per_instance: bool):
    poly = random_polytope(np.random.default_rng(0), 8, 3, 5)
    constraints = constraints_of(poly)
    kwargs = {}
    if per_instance:  # the equality matrix is an input, factorised in the call
        constraints[0] = pe.Equality(pe.Parameter("E", shape=poly.E.shape), poly.b)
        kwargs = {"E": jnp.asarray(poly.E)}
    return constraints, kwargs


def _cones():
    spec, _ = random_set_spec(np.random.default_rng(1), 8, ["soc", "simplex", "eq"])
    return to_pinet(spec), {}


CASES = {
    "polytope": lambda: _polytope(False),
    "per-instance": lambda: _polytope(True),
    "cones": _cones,  # the fixed-point (BiCGStab) backward pass
}


@pytest.mark.parametrize("mode", ["grad", "jvp", "inference"])
@pytest.mark.parametrize("case", list(CASES))
def test_projection_products_at_highest_precision(case, mode):
    constraints, kwargs = CASES[case]()
    proj = pe.Projector(constraints, n_iter=20)
    y_raw = jnp.asarray(np.random.default_rng(2).normal(size=8))

    def loss(y):
        y = proj(y, **kwargs)
        return jnp.sum(y**2) + proj.violation(y, **kwargs)

    if mode == "grad":
        fn = jax.grad(loss)
    elif mode == "jvp":
        fn = lambda y: jax.jvp(loss, (y,), (jnp.ones_like(y),))  # noqa: E731
    else:
        fn = lambda y: eqx.nn.inference_mode(proj).solve(y, **kwargs).y  # noqa: E731
    precisions = _dot_precisions(fn, y_raw)
    assert len(precisions) >= 3  # at least the iteration, violation and solve
    assert all(p == ("HIGHEST", "HIGHEST") for p in precisions), set(precisions)
