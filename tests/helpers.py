"""Shared test helpers: random feasible sets, an independent projection oracle
(cvxpy + Clarabel), and finite differences."""

from __future__ import annotations

import dataclasses

import numpy as np

import pinet_eqx as pe


@dataclasses.dataclass
class Polytope:
    """{y : E y = b, lower <= C y <= upper, lb <= y <= ub}, with an interior point."""

    E: np.ndarray
    b: np.ndarray
    C: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    y_feas: np.ndarray

    @property
    def d(self):
        return self.E.shape[1] if self.E.size else self.C.shape[1]


def random_polytope(rng, d, m_eq, m_ineq, *, box=True, two_sided=True, infs=True):
    """A random polytope that contains a strictly feasible point.

    Some inequality and box bounds are +-inf when `infs`, so one-sided rows appear.
    """
    y0 = rng.uniform(-0.5, 0.5, size=d)
    E = rng.normal(size=(m_eq, d))
    b = E @ y0
    C = rng.normal(size=(m_ineq, d))
    Cy = C @ y0
    upper = Cy + rng.uniform(0.05, 1.0, size=m_ineq)
    lower = (
        Cy - rng.uniform(0.05, 1.0, size=m_ineq)
        if two_sided
        else np.full(m_ineq, -np.inf)
    )
    if box:
        lb = y0 - rng.uniform(0.1, 1.0, size=d)
        ub = y0 + rng.uniform(0.1, 1.0, size=d)
    else:
        lb, ub = np.full(d, -np.inf), np.full(d, np.inf)
    if infs:
        upper[rng.random(m_ineq) < 0.2] = np.inf
        lb[rng.random(d) < 0.3] = -np.inf
        ub[rng.random(d) < 0.3] = np.inf
    return Polytope(E, b, C, lower, upper, lb, ub, y0)


def constraints_of(poly: Polytope, *, parameters=()):
    """Constraint list for a `Polytope`; names in `parameters` become Parameters."""

    def val(name, v):
        return pe.Parameter(name) if name in parameters else v

    out = []
    if poly.E.shape[0]:
        out.append(pe.Equality(poly.E, val("b", poly.b)))
    if poly.C.shape[0]:
        out.append(
            pe.AffineInequality(
                poly.C, lower=val("lower", poly.lower), upper=val("upper", poly.upper)
            )
        )
    if np.isfinite(poly.lb).any() or np.isfinite(poly.ub).any():
        out.append(pe.Box(val("lb", poly.lb), val("ub", poly.ub)))
    return out


def clarabel_project(y_raw, poly: Polytope, **overrides):
    """Euclidean projection of `y_raw` onto `poly` by cvxpy + Clarabel (ground truth).

    `overrides` replaces `b`, `lower`, `upper`, `lb` or `ub`.
    """
    import cvxpy as cp

    data = {**dataclasses.asdict(poly), **overrides}
    y = cp.Variable(poly.d)
    cons = []
    if poly.E.shape[0]:
        cons.append(poly.E @ y == data["b"])
    for row, lo, up in zip(poly.C, data["lower"], data["upper"]):
        if np.isfinite(lo):
            cons.append(row @ y >= lo)
        if np.isfinite(up):
            cons.append(row @ y <= up)
    fin_lb = np.isfinite(data["lb"])
    fin_ub = np.isfinite(data["ub"])
    if fin_lb.any():
        cons.append(y[np.flatnonzero(fin_lb)] >= data["lb"][fin_lb])
    if fin_ub.any():
        cons.append(y[np.flatnonzero(fin_ub)] <= data["ub"][fin_ub])
    prob = cp.Problem(cp.Minimize(cp.sum_squares(y - np.asarray(y_raw))), cons)
    prob.solve(
        solver="CLARABEL",
        tol_gap_abs=1e-12,
        tol_gap_rel=1e-12,
        tol_feas=1e-12,
        max_iter=500,
    )
    assert prob.status == "optimal", prob.status
    return y.value


def central_difference(f, x, v, eps=1e-6):
    """Directional derivative <grad f(x), v> by central differences."""
    return (f(x + eps * v) - f(x - eps * v)) / (2 * eps)


def assert_close(actual, expected, atol, rtol=0.0, what=""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    err = np.max(np.abs(actual - expected)) if actual.size else 0.0
    bound = atol + rtol * (np.max(np.abs(expected)) if expected.size else 0.0)
    assert err <= bound, f"{what}: max abs error {err:.3e} > {bound:.3e}"
