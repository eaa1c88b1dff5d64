"""The sparse polish's dual active-set method on a bordered factor
(`_active_set.host_dual`) and the batch's neighbour faces
(`_active_set.host_neighbours`), in float64 against dense linear algebra."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp

from pinet_eqx._active_set import host_dual, host_working
from pinet_eqx._active_set.host_kkt import KKTPattern
from pinet_eqx._active_set.host_neighbours import NeighbourFaces


def _random_rows(seed: int, d: int = 40, m_eq: int = 6, m: int = 24):
    """Sparse equality and inequality rows, and bounds on $[y; C y]$ of which
    some are equal (units that must stay equalities)."""
    rng = np.random.default_rng(seed)
    E = sp.random(m_eq, d, density=0.2, rng=rng, format="csr")
    E = E + sp.eye(m_eq, d, format="csr")  # no empty row
    C = sp.random(m, d, density=0.15, rng=rng, format="csr")
    C = C + sp.eye(m, d, k=m_eq, format="csr")
    lower = -rng.uniform(0.5, 1.5, d + m)
    upper = rng.uniform(0.5, 1.5, d + m)
    fixed = rng.choice(d, 3, replace=False)
    lower[fixed] = upper[fixed] = 0.25
    return E, C, lower, upper, rng


def _dense_working_rows(P: KKTPattern, lower, upper, hi, lo) -> np.ndarray:
    """The working set's unit rows as `working_face` means them: the
    equalities, the equal-bound units, then each flagged row of $G$ signed."""
    fixed = lower == upper
    G = P.G.toarray()
    flagged = (hi | lo) & ~fixed
    signs = np.where(hi, 1.0, -1.0)[flagged][:, None]
    return np.vstack([P.E.toarray(), G[fixed], signs * G[flagged]])


def _working_index(work, rng) -> int:
    """A random working inequality row, in `leave`'s indexing."""
    base = np.flatnonzero(work.alive[work.m_e :])
    joined = work.N0.shape[0] - work.m_e + np.flatnonzero(work.b_add[: work.k])
    return int(rng.choice(np.concatenate([base, joined])))


@pytest.mark.parametrize("borders", [3, 120])
def test_bordered_solves_match_the_working_gram_matrix(monkeypatch, borders):
    """After rows join and leave (some of them starting rows, so the factor
    is bordered both ways, and folded into a new one every `borders`
    changes), a solve with the working set's Gram matrix projects onto its
    rows' span as dense least squares does."""
    monkeypatch.setattr(host_working, "_BORDERS", borders)
    E, C, lower, upper, rng = _random_rows(0)
    P = KKTPattern(E, C)
    d = P.d
    total = P.G.shape[0]
    hi = np.zeros(total, bool)
    hi[rng.choice(d, 8, replace=False)] = True
    r, q = rng.normal(size=d), rng.normal(size=E.shape[0])
    work = host_working.WorkingSet(P, r, q, lower, upper, hi, np.zeros(total, bool))
    assert work.ok
    for step in range(14):
        if step % 3 == 2:
            assert work.leave(_working_index(work, rng))
        else:
            p = int(rng.choice(np.flatnonzero(~work.in_work)))
            s_p = float(rng.choice([-1.0, 1.0]))
            row = s_p * host_dual._row(P.G, p)
            assert work.enter(p, s_p, row, 0.0, None)
        t = rng.normal(size=d)
        u0, ub, _ = work.solve(work.N0 @ t, work.RA[: work.k] @ t, steps=2)
        hi_w, lo_w = work.flags()
        N = _dense_working_rows(P, lower, upper, hi_w, lo_w)
        expected = N.T @ np.linalg.lstsq(N @ N.T, N @ t, rcond=None)[0]
        actual = work.transpose_times(u0, ub)
        np.testing.assert_allclose(actual, expected, atol=1e-9, err_msg=f"step {step}")


def _kkt_point(P: KKTPattern, r, q, lower, upper, hi, lo):
    """The projection onto the face of `hi`, `lo` by dense least squares, and
    whether it is the projection onto the whole set: feasible, every
    inequality multiplier of the right sign."""
    fixed = lower == upper
    N = _dense_working_rows(P, lower, upper, hi, lo)
    scale = np.concatenate([np.ones(P.d), P.c_norms])
    flagged = (hi | lo) & ~fixed
    bound = np.where(hi, upper, -lower)[flagged] / scale[flagged]
    b = np.concatenate([q / P.e_norms, upper[fixed] / scale[fixed], bound])
    u = np.linalg.lstsq(N @ N.T, N @ r - b, rcond=None)[0]
    y = r - N.T @ u
    value = P.G @ y
    feasible = np.all(value <= upper / scale + 1e-9) and np.all(
        value >= lower / scale - 1e-9
    )
    signs_ok = np.all(u[P.E.shape[0] + fixed.sum() :] >= -1e-9)
    return y, feasible and signs_ok


@pytest.mark.parametrize("borders", [2, 120])
def test_working_face_from_a_neighbours_face(monkeypatch, borders):
    """From the empty face and from the face of a nearby point's projection,
    the method ends on a face whose projection satisfies the KKT conditions
    (checked densely), the same point both ways; from the neighbour's face in
    fewer changes. Folding the borders every `borders` changes changes
    nothing."""
    monkeypatch.setattr(host_working, "_BORDERS", borders)
    E, C, lower, upper, rng = _random_rows(1)
    P = KKTPattern(E, C)
    total = P.G.shape[0]
    none = np.zeros(total, bool)
    # Raw outputs far outside the set: many bounds bind.
    r = 4.0 * rng.normal(size=P.d)
    q = 0.1 * rng.normal(size=E.shape[0])
    changes = []
    original = host_working.WorkingSet.ratio_test

    def counted(self, *args):
        changes[-1] += 1
        return original(self, *args)

    monkeypatch.setattr(host_working.WorkingSet, "ratio_test", counted)
    changes.append(0)
    face = host_dual.working_face(P, r, q, lower, upper, none, none)
    assert face is not None
    y, optimal = _kkt_point(P, r, q, lower, upper, *face)
    assert optimal
    r_near = r + 0.05 * rng.normal(size=P.d)
    changes.append(0)
    near = host_dual.working_face(P, r_near, q, lower, upper, *face)
    changes.append(0)
    cold = host_dual.working_face(P, r_near, q, lower, upper, none, none)
    assert near is not None and cold is not None
    y_near, optimal = _kkt_point(P, r_near, q, lower, upper, *near)
    assert optimal
    y_cold, _ = _kkt_point(P, r_near, q, lower, upper, *cold)
    np.testing.assert_allclose(y_near, y_cold, atol=1e-9)
    assert changes[1] < changes[2], changes


def test_working_face_stops_at_its_budget():
    E, C, lower, upper, rng = _random_rows(1)
    P = KKTPattern(E, C)
    none = np.zeros(P.G.shape[0], bool)
    r = 4.0 * rng.normal(size=P.d)
    q = 0.1 * rng.normal(size=E.shape[0])
    assert host_dual.working_face(P, r, q, lower, upper, none, none, 1) is None


def test_neighbours_are_the_nearest_earlier_by_the_lag():
    """Each instance's neighbour is the nearest (by its parameters, infinite
    entries ignored) among those at least `lag` before it; the first `lag`
    have none."""
    keys = np.array(
        [[0.0, np.inf, 1.0], [5.0, np.inf, 1.0], [0.2, np.inf, 1.0], [4.0, 1.0, 1.0]]
    )
    raw = np.zeros((4, 2))
    faces = NeighbourFaces(keys, raw, lag=2)
    np.testing.assert_array_equal(faces.neighbour, [-1, -1, 0, 1])
    lag_one = NeighbourFaces(keys, raw, lag=1).neighbour
    np.testing.assert_array_equal(lag_one, [-1, 0, 0, 1])


def test_neighbour_faces_wait_for_their_neighbour():
    """`take` returns the neighbour's face once it is put, waiting for it;
    `None` where the neighbour failed, or where the raw outputs are further
    apart than the neighbour's raw output is from its projection."""
    raw = np.array([[0.0, 0.0], [0.5, 0.0], [0.0, 3.0], [1.0, 3.0]])
    faces = NeighbourFaces(np.arange(4.0)[:, None], raw, lag=1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(faces.take(1)))
    waiter.start()
    waiter.join(0.05)
    assert waiter.is_alive() and not got  # instance 0 not done yet
    face = (np.ones(2, bool), np.zeros(2, bool))
    faces.put(0, face + (np.array([1.0, 0.0]),))  # 1 from its raw output
    waiter.join(5.0)
    assert len(got) == 1 and got[0] is not None
    assert all(np.array_equal(a, b) for a, b in zip(got[0], face))
    faces.put(1, face + (np.array([0.5, 1.0]),))
    assert faces.take(2) is None  # 3.04 apart, 1 from its projection
    faces.put(2, None)
    assert faces.take(3) is None  # failed
