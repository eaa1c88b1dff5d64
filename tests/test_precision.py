"""Every matrix product of the projection is traced at full precision.

On GPUs since Ampere, XLA multiplies float32 matrices in TensorFloat-32 unless
told otherwise, and a trained motion planner's projections then violated the
jerk limit by 3e-2 on an H100 (1e-5 on the CPU). The CPU cannot show the
rounding, so this checks the traced programs: the forward pass, the violation
and the implicit backward pass, for fixed and per-instance matrices.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import constraints_of, random_polytope

import pinet_eqx as pe


def _dot_precisions(jaxpr) -> list:
    """The `precision` of every `dot_general` in a jaxpr and its sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    found += _dot_precisions(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    found += _dot_precisions(sub)
    return found


@pytest.mark.parametrize("per_instance", [False, True])
def test_projection_products_at_highest_precision(per_instance):
    rng = np.random.default_rng(0)
    poly = random_polytope(rng, 8, 3, 5)
    constraints = constraints_of(poly)
    kwargs = {}
    if per_instance:  # the equality matrix is an input, factorised in the call
        constraints[0] = pe.Equality(pe.Parameter("E", shape=poly.E.shape), poly.b)
        kwargs = {"E": jnp.asarray(poly.E)}
    proj = pe.Projector(constraints, n_iter=20)
    y_raw = jnp.asarray(rng.normal(size=8))

    def loss(y):
        y = proj(y, **kwargs)
        return jnp.sum(y**2) + proj.violation(y, **kwargs)

    jaxpr = jax.make_jaxpr(jax.grad(loss))(y_raw).jaxpr
    precisions = _dot_precisions(jaxpr)
    assert len(precisions) >= 3  # forward, violation and backward products
    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    assert all(p == highest for p in precisions), set(precisions)
