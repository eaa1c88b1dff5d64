"""Shared test helpers: random feasible sets, an independent projection oracle
(cvxpy + Clarabel), and finite differences."""

from __future__ import annotations

import contextlib
import dataclasses
import re

import jaxtyping
import numpy as np
import pytest

import pinet_eqx as pe

# Re-exported for the tests (the random-polytope benchmark uses them too).
from benchmarks._common.problems import (
    Polytope,
    constraints_of as constraints_of,
    random_polytope as random_polytope,
)
from benchmarks._common.reference import reference_available

# For tests that run the published reference: it cannot be a pip extra.
needs_reference = pytest.mark.skipif(
    not reference_available(),
    reason="pinet-hcnn is not installed (pip install --no-deps pinet-hcnn==0.2.0 "
    "beartype); it cannot be a pip extra",
)


@contextlib.contextmanager
def raises_for(argument: str, exception: type[Exception], match: str):
    """`pytest.raises` for a bad argument: our own `exception` with a message
    matching `match`, or, since the tests run under jaxtyping's runtime type
    checker, its `TypeCheckError` (which rejects an argument of the wrong type or
    shape before our check runs) naming `argument`."""
    with pytest.raises((exception, jaxtyping.TypeCheckError)) as info:
        yield info
    message = str(info.value)
    if isinstance(info.value, jaxtyping.TypeCheckError):
        assert f"parameter '{argument}'" in message, message
    else:
        assert re.search(match, message), message


def clarabel_project(y_raw, poly: Polytope, **overrides):
    """Euclidean projection of `y_raw` onto `poly` by cvxpy + Clarabel (ground truth).

    `overrides` replaces `b`, `lower`, `upper`, `lb` or `ub`.
    """
    import cvxpy as cp

    y = cp.Variable(poly.d)
    cons = polytope_constraints(y, poly, **overrides)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(y - np.asarray(y_raw))), cons)
    status = clarabel_solve(prob)
    assert status == "optimal", status
    return y.value


def polytope_constraints(y, poly: Polytope, **overrides) -> list:
    """The cvxpy constraints of `poly` on the variable `y` (finite bounds only);
    `overrides` as for `clarabel_project`."""
    data = {**dataclasses.asdict(poly), **overrides}
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
    return cons


def central_difference(f, x, v, eps=1e-6):
    """Directional derivative <grad f(x), v> by central differences."""
    return (f(x + eps * v) - f(x - eps * v)) / (2 * eps)


def assert_close(actual, expected, atol, rtol=0.0, what=""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    err = np.max(np.abs(actual - expected)) if actual.size else 0.0
    bound = atol + rtol * (np.max(np.abs(expected)) if expected.size else 0.0)
    assert err <= bound, f"{what}: max abs error {err:.3e} > {bound:.3e}"


# ---------------------------------------------------------------------------------
# General convex sets (cones, simplices, polytopes): one plain description drives
# both the pinet_eqx constraint objects and the cvxpy + Clarabel ground truth.
#
# A "spec" is a list of the items below. `parameters` maps a Parameter name to the
# (item index, field name) whose value it carries, e.g. {"a": (0, "a")}.
# ---------------------------------------------------------------------------------

_CONE_ORD = {"soc": 2, "l1": 1, "linf": np.inf}


@dataclasses.dataclass
class ConeSpec:
    """{y : ||A y + a||_p <= f^T y + b}, p = 2 ("soc"), 1 ("l1") or inf ("linf")."""

    kind: str
    A: np.ndarray
    a: np.ndarray
    f: np.ndarray
    b: np.ndarray  # shape ()


@dataclasses.dataclass
class SimplexSpec:
    """{y : y_S >= 0, sum(y_S) = total}."""

    indices: np.ndarray
    total: np.ndarray  # shape ()


@dataclasses.dataclass
class EqualitySpec:
    E: np.ndarray
    b: np.ndarray


@dataclasses.dataclass
class InequalitySpec:
    C: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


@dataclasses.dataclass
class BoxSpec:
    lb: np.ndarray
    ub: np.ndarray


def _cone_norm(kind, v):
    return float(np.linalg.norm(v, ord=_CONE_ORD[kind]))


def _unit_in_norm(rng, kind, k):
    u = rng.normal(size=k)
    return u / _cone_norm(kind, u)


def _draw_cone_data(rng, k, d):
    return dict(
        A=rng.normal(size=(k, d)),
        a=0.5 * rng.normal(size=k),
        f=0.3 * rng.normal(size=d) / np.sqrt(d),
    )


def random_set_spec(
    rng, d, kinds, *, cone_rows=4, m_eq=2, m_ineq=3, simplex_size=4, infs=True
):
    """A random spec with one item per entry of `kinds` ("soc", "l1", "linf",
    "simplex", "eq", "ineq", "box"), all strictly feasible at a common point.

    Returns `(spec, y0)`: y0 satisfies the equalities (and simplex sums) exactly and
    every inequality with a slack of at least 0.05. Several simplices get disjoint
    index sets; a box leaves simplex coordinates free (it bounds "the others").
    """
    y0 = rng.uniform(-0.5, 0.5, size=d)
    n_simplex = list(kinds).count("simplex")
    free = rng.permutation(d)
    simplex_sets = []
    for j in range(n_simplex):
        idx = free[j * simplex_size : (j + 1) * simplex_size]
        assert idx.size == simplex_size, "not enough coordinates for the simplices"
        total = rng.uniform(0.5, 2.0)
        y0[idx] = total * rng.dirichlet(5.0 * np.ones(simplex_size))
        simplex_sets.append((idx, total))
    in_simplex = np.zeros(d, dtype=bool)
    for idx, _ in simplex_sets:
        in_simplex[idx] = True

    spec = []
    for kind in kinds:
        if kind in _CONE_ORD:
            data = _draw_cone_data(rng, cone_rows, d)
            s = _cone_norm(kind, data["A"] @ y0 + data["a"])
            b = s + rng.uniform(0.2, 1.0) - data["f"] @ y0
            spec.append(ConeSpec(kind, b=np.asarray(b), **data))
        elif kind == "simplex":
            idx, total = simplex_sets.pop(0)
            spec.append(SimplexSpec(np.asarray(idx), np.asarray(total)))
        elif kind == "eq":
            E = rng.normal(size=(m_eq, d))
            spec.append(EqualitySpec(E, E @ y0))
        elif kind == "ineq":
            C = rng.normal(size=(m_ineq, d))
            w = C @ y0
            lower = w - rng.uniform(0.05, 1.0, size=m_ineq)
            upper = w + rng.uniform(0.05, 1.0, size=m_ineq)
            if infs:
                upper[rng.random(m_ineq) < 0.2] = np.inf
                lower[rng.random(m_ineq) < 0.2] = -np.inf
            spec.append(InequalitySpec(C, lower, upper))
        elif kind == "box":
            lb = y0 - rng.uniform(0.1, 1.0, size=d)
            ub = y0 + rng.uniform(0.1, 1.0, size=d)
            if infs:
                lb[rng.random(d) < 0.2] = -np.inf
                ub[rng.random(d) < 0.2] = np.inf
            lb[in_simplex], ub[in_simplex] = -np.inf, np.inf
            spec.append(BoxSpec(lb, ub))
        else:
            raise ValueError(f"unknown kind {kind!r}")
    assert_strictly_feasible(y0, spec, slack=0.05)
    return spec, y0


def spec_residuals(y, spec):
    """(max equality residual, min inequality slack) of `y`; slack > 0 is strict."""
    y = np.asarray(y, dtype=np.float64)
    eq, slack = [0.0], [np.inf]
    for it in spec:
        if isinstance(it, ConeSpec):
            slack.append(it.f @ y + it.b - _cone_norm(it.kind, it.A @ y + it.a))
        elif isinstance(it, SimplexSpec):
            eq.append(abs(y[it.indices].sum() - it.total))
            slack.append(y[it.indices].min())
        elif isinstance(it, EqualitySpec):
            eq.append(np.abs(it.E @ y - it.b).max())
        elif isinstance(it, InequalitySpec):
            w = it.C @ y
            slack += [(w - it.lower).min(), (it.upper - w).min()]
        elif isinstance(it, BoxSpec):
            slack += [(y - it.lb).min(), (it.ub - y).min()]
    return float(max(eq)), float(min(slack))


def assert_strictly_feasible(y, spec, slack=1e-3):
    eq, s = spec_residuals(y, spec)
    assert eq <= 1e-9 * (1 + np.abs(y).max()), f"equality residual {eq:.3e}"
    assert s >= slack, f"inequality slack {s:.3e} < {slack}"


def spec_violation(y, spec):
    """Maximum absolute constraint violation of `y`, computed in numpy from the
    original data: |E y - b|, (lower - C y)_+, (C y - upper)_+, box terms,
    (||A y + a||_p - f^T y - b)_+ per cone, and |sum y_S - total|, (-y_S)_+ per
    simplex."""
    y = np.asarray(y, dtype=np.float64)
    out = [0.0]
    for it in spec:
        if isinstance(it, ConeSpec):
            out.append(_cone_norm(it.kind, it.A @ y + it.a) - it.f @ y - it.b)
        elif isinstance(it, SimplexSpec):
            out += [abs(y[it.indices].sum() - it.total), (-y[it.indices]).max()]
        elif isinstance(it, EqualitySpec):
            out.append(np.abs(it.E @ y - it.b).max())
        elif isinstance(it, InequalitySpec):
            w = it.C @ y
            out += [(it.lower - w).max(), (w - it.upper).max()]
        elif isinstance(it, BoxSpec):
            out += [(it.lb - y).max(), (y - it.ub).max()]
    return float(max(0.0, max(out)))


def _cvxpy_constraints(y, spec):
    import cvxpy as cp

    cons = []
    for it in spec:
        if isinstance(it, ConeSpec):
            lhs = it.A @ y + it.a
            norm = {"soc": cp.norm2, "l1": cp.norm1, "linf": cp.norm_inf}[it.kind]
            cons.append(norm(lhs) <= it.f @ y + float(it.b))
        elif isinstance(it, SimplexSpec):
            idx = np.asarray(it.indices)
            cons += [y[idx] >= 0, cp.sum(y[idx]) == float(it.total)]
        elif isinstance(it, EqualitySpec):
            cons.append(it.E @ y == it.b)
        elif isinstance(it, (InequalitySpec, BoxSpec)):
            if isinstance(it, InequalitySpec):
                M, lo, up = it.C, it.lower, it.upper
            else:
                M, lo, up = np.eye(y.shape[0]), it.lb, it.ub
            fin_lo, fin_up = np.isfinite(lo), np.isfinite(up)
            if fin_lo.any():
                cons.append(M[fin_lo] @ y >= lo[fin_lo])
            if fin_up.any():
                cons.append(M[fin_up] @ y <= up[fin_up])
        else:
            raise TypeError(type(it))
    return cons


def clarabel_solve(prob, **settings):
    prob.solve(
        solver="CLARABEL",
        tol_gap_abs=1e-12,
        tol_gap_rel=1e-12,
        tol_feas=1e-12,
        max_iter=500,
        **settings,
    )
    return prob.status


def _kkt_pieces(spec, d):
    """The set as `E y = q`, `G y <= h` and smooth `g(y) = ||A y + a||_2 - f^T y - b
    <= 0` (one per second-order cone). The l1 and linf cones are polyhedral: every
    sign pattern s gives a row s^T (A y + a) <= f^T y + b (2^k rows for l1, 2k for
    linf)."""
    import itertools

    E, q, G, h, socs = [], [], [], [], []
    eye = np.eye(d)
    for it in spec:
        if isinstance(it, ConeSpec) and it.kind == "soc":
            socs.append(it)
        elif isinstance(it, ConeSpec):
            k = it.A.shape[0]
            if it.kind == "l1":
                signs = np.array(list(itertools.product([-1.0, 1.0], repeat=k)))
            else:
                signs = np.concatenate([np.eye(k), -np.eye(k)])
            G.append(signs @ it.A - it.f[None, :])
            h.append(it.b - signs @ it.a)
        elif isinstance(it, SimplexSpec):
            E.append(eye[it.indices].sum(0, keepdims=True))
            q.append(np.atleast_1d(it.total))
            G.append(-eye[it.indices])
            h.append(np.zeros(len(it.indices)))
        elif isinstance(it, EqualitySpec):
            E.append(it.E)
            q.append(it.b)
        elif isinstance(it, (InequalitySpec, BoxSpec)):
            if isinstance(it, InequalitySpec):
                M, lo, up = it.C, it.lower, it.upper
            else:
                M, lo, up = eye, it.lb, it.ub
            G += [M[np.isfinite(up)], -M[np.isfinite(lo)]]
            h += [up[np.isfinite(up)], -lo[np.isfinite(lo)]]

    def cat(xs, shape):
        return np.concatenate(xs) if xs else np.zeros(shape)

    return cat(E, (0, d)), cat(q, (0,)), cat(G, (0, d)), cat(h, (0,)), socs


def _soc_terms(c, y):
    """Value, gradient and Hessian of ||A y + a||_2 - f^T y - b."""
    w = c.A @ y + c.a
    nw = np.linalg.norm(w)
    grad = c.A.T @ w / nw - c.f
    hess = c.A.T @ (np.eye(w.size) / nw - np.outer(w, w) / nw**3) @ c.A
    return nw - c.f @ y - c.b, grad, hess, nw


def polish_projection(y, y_raw, spec, active_tol=1e-5, max_iter=50):
    """Refine an approximate projection `y` of `y_raw` (from Clarabel) and certify it.

    Interior-point solutions of second-order-cone problems are only accurate to
    about sqrt(duality gap) in y (up to ~3e-5 here), which is too coarse for 1e-6
    comparisons. The constraints active at `y` (slack <= active_tol) are taken as
    equalities and the KKT system of the projection is solved by Newton's method
    (least-squares steps, so dependent active rows are fine). The result is then
    certified optimal independently of how it was found: it is feasible, and
    y_raw - y is a non-negative combination of the active constraints' normals (plus
    any equality normal), found by NNLS, up to a residual r; then y is the exact
    projection of y_raw - r, so it is within |r| of the projection of y_raw.
    Raises AssertionError if the certificate fails (e.g. a projection onto a cone's
    apex, where the norm is not differentiable): choose another instance.
    """
    import scipy.optimize

    y_raw = np.asarray(y_raw, dtype=np.float64)
    y = np.array(y, dtype=np.float64)
    d = y.shape[0]
    E, q, G, h, socs = _kkt_pieces(spec, d)
    act = h - G @ y <= active_tol * (1.0 + np.abs(h))
    Ga, ha = G[act], h[act]
    socs = [c for c in socs if _soc_terms(c, y)[0] >= -active_tol]
    n_e, n_a, n_s = E.shape[0], Ga.shape[0], len(socs)

    def normals(y):
        terms = [_soc_terms(c, y) for c in socs]
        N = np.concatenate(
            [E.T, Ga.T, np.array([t[1] for t in terms]).reshape(n_s, d).T], axis=1
        )
        return N, terms

    N, _ = normals(y)
    lam = np.linalg.lstsq(N, y_raw - y, rcond=None)[0]
    scale = 1.0 + np.abs(y_raw).max()
    for _ in range(max_iter):
        N, terms = normals(y)
        H = np.eye(d) + sum(
            (lam[n_e + n_a + j] * t[2] for j, t in enumerate(terms)), np.zeros((d, d))
        )
        F = np.concatenate(
            [
                y - y_raw + N @ lam,
                E @ y - q,
                Ga @ y - ha,
                np.array([t[0] for t in terms]),
            ]
        )
        if np.abs(F).max() <= 1e-15 * scale:
            break
        J = np.block([[H, N], [N.T, np.zeros((n_e + n_a + n_s, n_e + n_a + n_s))]])
        step = np.linalg.lstsq(J, -F, rcond=None)[0]
        y, lam = y + step[:d], lam + step[d:]

    # Certificate.
    N, terms = normals(y)
    assert all(t[3] > 1e-6 for t in terms), "projection at a second-order cone apex"
    viol = spec_violation(y, spec)
    assert viol <= 1e-11 * scale, f"polished point infeasible by {viol:.2e}"
    slack = np.concatenate([ha - Ga @ y, [-t[0] for t in terms]])
    assert np.abs(slack).max(initial=0.0) <= 1e-11 * scale, "active set not tight"
    cone_gens = np.concatenate([E.T, -E.T, N[:, n_e:]], axis=1)
    _, res = scipy.optimize.nnls(cone_gens, y_raw - y, maxiter=50 * cone_gens.shape[1])
    assert res <= 1e-10 * scale, f"KKT certificate fails: residual {res:.2e}"
    return y


def clarabel_project_sets(y_raw, spec):
    """Euclidean projection of `y_raw` onto the set described by `spec`: cvxpy +
    Clarabel (tolerances 1e-12), then `polish_projection`, which certifies the
    answer through the KKT conditions (ground truth to ~1e-10)."""
    import warnings

    import cvxpy as cp

    y_raw = np.asarray(y_raw, dtype=np.float64)
    y = cp.Variable(y_raw.shape[0])
    prob = cp.Problem(
        cp.Minimize(cp.sum_squares(y - y_raw)), _cvxpy_constraints(y, spec)
    )
    # Shorter interior-point steps keep Clarabel accurate on second-order cones;
    # "optimal_inaccurate" is accepted because the polish certifies the result.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        status = clarabel_solve(prob, max_step_fraction=0.9)
    assert status in ("optimal", "optimal_inaccurate"), status
    return polish_projection(y.value, y_raw, spec)


def clarabel_is_feasible(spec, d):
    """Whether the set described by `spec` is non-empty (cvxpy + Clarabel)."""
    import cvxpy as cp

    y = cp.Variable(d)
    status = clarabel_solve(cp.Problem(cp.Minimize(0), _cvxpy_constraints(y, spec)))
    assert status in ("optimal", "infeasible"), status
    return status == "optimal"


def to_pinet(spec, parameters=None):
    """The pinet_eqx constraint list for `spec`.

    Fields named in `parameters` ({name: (item index, field)}) become
    `pe.Parameter(name)`, with `shape=` given for matrices (2-D values).
    """
    where = {loc: name for name, loc in (parameters or {}).items()}

    def val(i, field, value):
        name = where.get((i, field))
        if name is None:
            return value
        value = np.asarray(value)
        if value.ndim == 2:
            return pe.Parameter(name, shape=value.shape)
        return pe.Parameter(name)

    out = []
    for i, it in enumerate(spec):
        if isinstance(it, ConeSpec):
            cls = {
                "soc": pe.SecondOrderCone,
                "l1": pe.L1NormCone,
                "linf": pe.LInfNormCone,
            }[it.kind]
            out.append(
                cls(
                    val(i, "A", it.A),
                    a=val(i, "a", it.a),
                    f=val(i, "f", it.f),
                    b=val(i, "b", float(it.b)),
                )
            )
        elif isinstance(it, SimplexSpec):
            out.append(pe.Simplex(it.indices, total=val(i, "total", float(it.total))))
        elif isinstance(it, EqualitySpec):
            out.append(pe.Equality(val(i, "E", it.E), val(i, "b", it.b)))
        elif isinstance(it, InequalitySpec):
            out.append(
                pe.AffineInequality(
                    val(i, "C", it.C),
                    lower=val(i, "lower", it.lower),
                    upper=val(i, "upper", it.upper),
                )
            )
        elif isinstance(it, BoxSpec):
            out.append(pe.Box(val(i, "lb", it.lb), val(i, "ub", it.ub)))
        else:
            raise TypeError(type(it))
    return out


def values_of(spec, parameters):
    """{name: value} for the parameterised fields of a concrete `spec`."""
    return {
        name: np.asarray(getattr(spec[i], field), dtype=np.float64)
        for name, (i, field) in parameters.items()
    }


def stack_values(instances):
    """Stack a list of {name: value} dicts along a new leading (batch) axis."""
    return {k: np.stack([v[k] for v in instances]) for k in instances[0]}


def _rank_one_fix(M, y0, target):
    """M + (target - M y0) y0^T / |y0|^2, so that the result maps y0 to target."""
    return M + np.outer(target - M @ y0, y0) / (y0 @ y0)


def random_instance(rng, spec, y0, parameters, jitter=0.0):
    """A fresh instance of `spec`: the fields named in `parameters` are redrawn (the
    others stay fixed) so that the instance is strictly feasible.

    Returns `(spec_i, y0_i)`, with y0_i strictly feasible for spec_i. The interior
    point moves by up to `jitter` per coordinate outside the simplices (so that, e.g.,
    a parameterised equality right-hand side changes), and a parameterised simplex
    `total` rescales it on the simplex coordinates; fixed items must stay strictly
    feasible at the moved point (this is asserted).
    """
    fields = {}
    for i, field in parameters.values():
        fields.setdefault(i, set()).add(field)
    out = [dataclasses.replace(it) for it in spec]
    y0 = np.array(y0, dtype=np.float64)
    movable = np.ones(y0.shape[0], dtype=bool)
    for it in out:
        if isinstance(it, SimplexSpec):
            movable[it.indices] = False
    y0 += movable * rng.uniform(-jitter, jitter, size=y0.shape[0])
    for i, it in enumerate(out):
        if isinstance(it, SimplexSpec) and "total" in fields.get(i, ()):
            total = rng.uniform(0.5, 2.5)
            y0[it.indices] *= total / it.total
            it.total = np.asarray(total)
    for i, it in enumerate(out):
        F = fields.get(i, set())
        if not F or isinstance(it, SimplexSpec):
            continue
        if isinstance(it, ConeSpec):
            k, d = it.A.shape
            new = _draw_cone_data(rng, k, d)
            for field in F & {"A", "a", "f"}:
                setattr(it, field, new[field])
            s = _cone_norm(it.kind, it.A @ y0 + it.a)
            margin = rng.uniform(0.2, 1.0)
            if "b" in F:
                it.b = np.asarray(s + margin - it.f @ y0)
            elif "f" in F:
                it.f = it.f + (s + margin - it.b - it.f @ y0) * y0 / (y0 @ y0)
            else:
                rhs = it.f @ y0 + it.b
                assert rhs > 0, "fixed f, b leave no room at y0"
                w = rng.uniform(0.3, 0.8) * rhs * _unit_in_norm(rng, it.kind, k)
                if "a" in F:
                    it.a = w - it.A @ y0
                else:
                    it.A = _rank_one_fix(it.A, y0, w - it.a)
        elif isinstance(it, EqualitySpec):
            if "E" in F:
                it.E = rng.normal(size=it.E.shape)
                if "b" not in F:
                    it.E = _rank_one_fix(it.E, y0, it.b)
            if "b" in F:
                it.b = it.E @ y0
        elif isinstance(it, InequalitySpec):
            m = it.C.shape[0]
            if "C" in F:
                C = rng.normal(size=it.C.shape)
                lo = it.lower if "lower" not in F else np.full(m, -np.inf)
                up = it.upper if "upper" not in F else np.full(m, np.inf)
                t = C @ y0
                both = np.isfinite(lo) & np.isfinite(up)
                t = np.where(np.isfinite(up), up - rng.uniform(0.05, 0.5, m), t)
                t = np.where(np.isfinite(lo), lo + rng.uniform(0.05, 0.5, m), t)
                t = np.where(both, 0.5 * (lo + up), t)
                it.C = _rank_one_fix(C, y0, t)
            w = it.C @ y0
            if "lower" in F:
                it.lower = w - rng.uniform(0.05, 1.0, m)
            if "upper" in F:
                it.upper = w + rng.uniform(0.05, 1.0, m)
        elif isinstance(it, BoxSpec):
            d = y0.shape[0]
            if "lb" in F:
                lb = y0 - rng.uniform(0.1, 1.0, d)
                it.lb = np.where(np.isfinite(it.lb), lb, -np.inf)
            if "ub" in F:
                ub = y0 + rng.uniform(0.1, 1.0, d)
                it.ub = np.where(np.isfinite(it.ub), ub, np.inf)
    assert_strictly_feasible(y0, out, slack=1e-2)
    return out, y0


def badly_scale(spec, y0, seed, rows=(1e-2, 1e2), cols=(1e-2, 1e2)):
    """The same kind of set with badly scaled data: every cone (as a whole: A, a, f,
    b), equality row and inequality row is multiplied by a positive factor from
    `rows` (log-spaced over the range, shuffled; this leaves the set unchanged),
    and the coordinates are substituted y = D z with D drawn log-uniformly in
    `cols` (this changes the geometry of the projection). Deterministic in `seed`,
    so fixed items get the same factors across instances.

    Returns `(spec_z, z0, D)` with z0 = y0 / D strictly feasible for spec_z.
    Simplices are left unscaled and their coordinates keep D = 1.
    """
    rng = np.random.default_rng(seed)
    d = y0.shape[0]
    D = np.exp(rng.uniform(np.log(cols[0]), np.log(cols[1]), size=d))
    for it in spec:
        if isinstance(it, SimplexSpec):
            D[it.indices] = 1.0
    # Row factors: log-spaced over the whole range (so both extremes occur), shuffled.
    n_rows = [
        1
        if isinstance(it, ConeSpec)
        else getattr(it, "E", getattr(it, "C", np.zeros((0, 0)))).shape[0]
        for it in spec
    ]
    factors = rng.permutation(
        np.geomspace(rows[0], rows[1], max(sum(n_rows), 1))
    ).tolist()

    def factor(size=None):
        vals = np.array([factors.pop() for _ in range(1 if size is None else size)])
        return vals[0] if size is None else vals

    out = []
    for it in spec:
        if isinstance(it, ConeSpec):
            c = factor()
            out.append(
                ConeSpec(it.kind, c * it.A * D, c * it.a, c * it.f * D, c * it.b)
            )
        elif isinstance(it, EqualitySpec):
            r = factor(it.E.shape[0])
            out.append(EqualitySpec(r[:, None] * it.E * D, r * it.b))
        elif isinstance(it, InequalitySpec):
            r = factor(it.C.shape[0])
            C = r[:, None] * it.C * D
            out.append(InequalitySpec(C, r * it.lower, r * it.upper))
        elif isinstance(it, BoxSpec):
            out.append(BoxSpec(it.lb / D, it.ub / D))
        else:
            out.append(dataclasses.replace(it))
    z0 = y0 / D
    eq, _ = spec_residuals(z0, out)
    assert eq <= 1e-8 * rows[1] * cols[1], eq
    return out, z0, D


def slow_except(cases, *fast, unpack=False):
    """`cases` as pytest parameters, all but those in `fast` marked `slow`: the
    fast tier (`pytest`) keeps a representative few, `pytest -m slow` runs the rest.
    With `unpack=True` each case is a tuple of the values of several names."""

    def param(case, marks=()):
        return pytest.param(*(case if unpack else (case,)), marks=marks)

    return [param(c) if c in fast else param(c, pytest.mark.slow) for c in cases]
