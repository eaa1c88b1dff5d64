"""Badly conditioned polytopes, in float64, against Clarabel: rows scaled over
10^+-5, duplicated rows, nearly parallel rows and thin slabs. Every instance is
either accurate or reported as not converged, and most are accurate."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import numpy as np
import pytest
from helpers import (
    Polytope,
    clarabel_project,
    constraints_of,
    random_polytope,
    slow_except,
)

import pinet_eqx as pe

KINDS = ("scaled_rows", "duplicated_rows", "parallel_rows", "thin_slab", "all")
D, M_EQ, M_INEQ = 10, 2, 8
# The accuracy: relative violation and distance to Clarabel's projection.
REL_VIOLATION, DISTANCE = 1e-9, 1e-5


def _append_row(poly: Polytope, row, half_width: float) -> Polytope:
    """`poly` with one more two-sided row, centred on its interior point."""
    centre = row @ poly.y_feas
    return dataclasses.replace(
        poly,
        C=np.vstack([poly.C, row]),
        lower=np.append(poly.lower, centre - half_width),
        upper=np.append(poly.upper, centre + half_width),
    )


def _scale_rows(poly: Polytope, s) -> Polytope:
    """`poly` with inequality row i and its bounds multiplied by `s[i] > 0`: the
    same set."""
    return dataclasses.replace(
        poly, C=s[:, None] * poly.C, lower=s * poly.lower, upper=s * poly.upper
    )


def ill_conditioned(rng, kind: str) -> tuple[Polytope, Polytope]:
    """A badly conditioned polytope of `kind`, and the same set with its rows
    unscaled (for the ground truth: Clarabel itself fails on rows scaled over
    10^+-5)."""
    poly = random_polytope(rng, D, M_EQ, M_INEQ, box=False, infs=False)
    if kind in ("duplicated_rows", "all"):
        poly = dataclasses.replace(
            poly,
            C=np.vstack([poly.C, poly.C[2]]),
            lower=np.append(poly.lower, poly.lower[2]),
            upper=np.append(poly.upper, poly.upper[2]),
        )
    if kind in ("parallel_rows", "all"):
        poly = _append_row(poly, poly.C[1] + 1e-6 * rng.normal(size=D), 0.3)
    if kind in ("thin_slab", "all"):
        centre = poly.C[0] @ poly.y_feas
        poly.lower[0], poly.upper[0] = centre - 1e-6, centre + 1e-6
    if kind not in ("scaled_rows", "all"):
        return poly, poly
    return _scale_rows(poly, 10.0 ** rng.uniform(-5, 5, size=poly.C.shape[0])), poly


def relative_violation(poly: Polytope, y) -> float:
    """The largest constraint violation of `y`, relative to max(1, |y|_inf)."""
    Cy = poly.C @ y
    violation = max(
        np.abs(poly.E @ y - poly.b).max(),
        np.maximum(Cy - poly.upper, 0).max(),
        np.maximum(poly.lower - Cy, 0).max(),
    )
    return violation / max(1.0, np.abs(y).max())


@pytest.mark.parametrize("kind", slow_except(KINDS, "all"))
def test_badly_conditioned_polytopes_are_accurate_or_reported(kind):
    rng = np.random.default_rng(KINDS.index(kind))
    accurate, total = 0, 0
    for _ in range(3):
        poly, truth = ill_conditioned(rng, kind)
        # The defaults: in float64, inference iterates to 1e-9 (cap 1000).
        proj = pe.Projector(constraints_of(poly))
        Y = poly.y_feas + 3 * rng.normal(size=(4, D))
        sol = jax.jit(jax.vmap(eqx.nn.inference_mode(proj).solve))(Y)
        successful = np.asarray(sol.result == pe.RESULTS.successful)
        # The polish and refinement never lose an instance the iteration got.
        plain = jax.vmap(eqx.nn.inference_mode(proj.with_settings(refine=False)).solve)
        converged = np.asarray(plain(Y).result == pe.RESULTS.successful)
        assert np.all(successful | ~converged), (kind, successful, converged)
        for i, y in enumerate(np.asarray(sol.y)):
            violation = relative_violation(truth, y)
            distance = np.abs(y - clarabel_project(Y[i], truth)).max()
            ok = violation <= REL_VIOLATION and distance <= DISTANCE
            assert ok or not successful[i], (kind, i, violation, distance)
            accurate += ok
            total += 1
    assert accurate >= 0.9 * total, (accurate, total)


def test_row_scaling_does_not_change_the_iteration():
    """The equilibration starts from unit-norm inequality rows, so scaling the
    rows (which leaves the set unchanged) leaves the iterates unchanged up to
    rounding, at a fixed iteration count."""
    rng = np.random.default_rng(7)
    poly = random_polytope(rng, D, M_EQ, M_INEQ, box=False)
    scaled = _scale_rows(poly, 10.0 ** rng.uniform(-5, 5, size=M_INEQ))
    Y = poly.y_feas + 3 * rng.normal(size=(4, D))
    out = [
        np.asarray(jax.vmap(pe.Projector(constraints_of(p), n_iter=30))(Y))
        for p in (poly, scaled)
    ]
    np.testing.assert_allclose(out[1], out[0], rtol=0, atol=1e-9)
