"""The polish of sparse polyhedral sets: a primal-dual active-set finish on the
host, from the face that Douglas-Rachford identified.

On badly scaled sparse sets (power grids: susceptances of $10^4$ beside line
limits of 1) Douglas-Rachford finds nearly the right active set long before it
converges, but conjugate gradients on the face's row system stall, so the
dense forms' polish (one iterative solve) cannot finish it. Here each face is
solved directly: with $M = [E; C_A]$ over the free coordinates $F$ (those not
pinned to a bound), $y_F = r_F - M^\\top \\lambda$ with $M M^\\top \\lambda =
M r_F - h$, by a sparse LU of $M M^\\top$ in float64. Rows whose multiplier
has the wrong sign leave the face, violated rows and coordinates join it, and
the face is solved again (a primal-dual active-set method; rows are released
before any are added; should that cycle, as it can far from the set,
Goldfarb and Idnani's dual method, `_host_dual`, finds the face). When no row
changes, the point satisfies the KKT conditions in float64: it is the
projection, and in float32 it is returned rounded, the rounding of $y$ itself.

The solves run on the host through `jax.pure_callback` (one call per batch,
instances in turn), so they work under `jit` and `vmap` on every backend; on a
GPU the batch travels to the host and back. No derivative flows through them:
they return the flags of the face they end on, whose tangent the caller
differentiates (`_active_set.on_face`); the iterate's face may differ.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import scipy.sparse as sp

from .._linalg import host_processes
from .._linalg.host_solve import ByContent, Stages, instances, pool, pool_size
from .host_dual import WARM_CHANGES, WARM_VIOLATED, working_face
from .host_ipm import MAX_ITERATIONS, dual_start, interior_point
from .host_kkt import FINEST_DELTA, KKTPattern
from .host_neighbours import NeighbourFaces
from .host_parallel import merge_bounds, parallel_rows, unmerged_flags
from .host_rounds import face_rounds

# Active-set rounds: from Douglas-Rachford's face, a handful of rows move.
_MAX_ROUNDS = 30
# Rounds from the iterate's face before the interior-point method takes over.
# Most raw outputs near the set finish in one to eight (PEGASE grids), but
# some need up to twelve (a trained proxy's, after the few iterations of
# `_solver.instance.HOST_FINISH_STEPS`), and an interior-point start costs more
# than those rounds. Far from the set the rounds stop early on `_NEAR_MOVES`,
# so the extra rounds cost them nothing (factorisation counts: DC-OPF results).
_NEAR_ROUNDS = 12
# ... and the most rows one of those rounds may move: this many, or this share
# of the bounds if more (PEGASE grids: tens near the set, hundreds far from it).
# The rounds from the interior-point method's face are held to it too: from
# there they move a few rows, and more means that they wander on a nearly
# dependent face, which the saddle-point try then settles at once.
_NEAR_MOVES = 50
_NEAR_MOVES_SHARE = 0.02
# The rounds of an interior-point face's second try (see `_active_set_method`).
_SADDLE_ROUNDS = 4
# `_active_set_method`'s `fail` where the interior-point method proved the set
# empty (`_host_ipm._Iterate.proves_empty`); `polish` returns NaN for it.
EMPTY = 2.0


# How many finishes each stage of `_active_set_method` settled (by its name
# in `STAGE_NAMES`; "failed", "empty"), in this process: the worker processes
# keep their own. For benchmarks that replay captured finishes on one thread
# (`benchmarks/dcopf/_replay.py`), and tests.
SETTLED = Stages()
# The stages of `_active_set_method`, in the order it tries them
# (`docs/concepts/inference.md`).
STAGE_NAMES = (
    "neighbour", "near", "from_near", "interior", "interior_one_row",
    "interior_finest", "dual", "iterate", "empty_face",
)  # fmt: skip


def polish(E, C, y_raw, q, lb_y, ub_y, lb_w, ub_w, hi, lo):
    """`(y, wrong_sign, hi, lo)`: the active-set finish of one instance or a
    batch, and the flags of its face.

    **Arguments:**

    - `E`, `C`: the fixed rows, `SparseMatrix`es.
    - `y_raw`: the point projected; `q` the equality right-hand side;
        `lb_y, ub_y, lb_w, ub_w` the bounds on $y$ and on $C y$.
    - `hi`, `lo`: the iterate's activity flags, $y$'s coordinates then the
        rows of $C$ (see `_active_set.activity`).

    **Returns:** the point, in the dtype of `y_raw`; 0 where the rounds
    ended in a KKT point, certified in float64 (else `inf`, which fails the
    caller's sign test, or NaN where a Farkas certificate proved the set
    empty, which fails it too); and the flags of the face the point is the projection
    onto, in the layout of `hi`, `lo` (of the rows of `C` that are parallel,
    only one carries a flag: the one whose bound binds; see
    `_host_parallel.parallel_rows`).
    """
    dtype = y_raw.dtype
    batch = y_raw.shape[:-1]
    out = (
        jax.ShapeDtypeStruct(y_raw.shape, dtype),
        jax.ShapeDtypeStruct(batch, dtype),
        jax.ShapeDtypeStruct(batch + hi.shape[-1:], bool),
        jax.ShapeDtypeStruct(batch + lo.shape[-1:], bool),
    )
    matrices = (E.rows, E.cols, E.values, C.rows, C.cols, C.values)
    shapes = (E.shape, C.shape)
    return jax.pure_callback(
        lambda *a: _host(shapes, *a),
        out,
        *matrices,
        y_raw,
        q,
        lb_y,
        ub_y,
        lb_w,
        ub_w,
        hi,
        lo,
        vmap_method="expand_dims",
    )


def _host(shapes, er, ec, ev, cr, cc, cv, y_raw, q, lb_y, ub_y, lb_w, ub_w, hi, lo):
    (m_eq, d), (m, _) = shapes
    dtype = y_raw.dtype
    batch, n, rows = instances(y_raw, q, lb_y, ub_y, lb_w, ub_w, hi, lo)
    key, (E, C_unique, group, factor, pattern) = _matrices(
        shapes, er, ec, ev, cr, cc, cv
    )
    k = C_unique.shape[0]
    lb_rows = rows(lb_w, m).astype(np.float64)
    ub_rows = rows(ub_w, m).astype(np.float64)
    lower_w, upper_w = merge_bounds(lb_rows, ub_rows, group, factor, k)
    # The iterate's flags, its rows' carried over to the merged rows (a
    # negative factor swaps the sides).
    hi_y, lo_y = np.zeros((n, d + k), bool), np.zeros((n, d + k), bool)
    hi_all, lo_all = rows(hi, d + m), rows(lo, d + m)
    hi_y[:, :d], lo_y[:, :d] = hi_all[:, :d], lo_all[:, :d]
    neg = factor < 0
    row_hi = np.where(neg, lo_all[:, d:], hi_all[:, d:])
    row_lo = np.where(neg, hi_all[:, d:], lo_all[:, d:])
    np.logical_or.at(hi_y[:, d:].T, group, row_hi.T)
    np.logical_or.at(lo_y[:, d:].T, group, row_lo.T)
    args = [
        rows(y_raw, d).astype(np.float64),
        rows(q, m_eq).astype(np.float64),
        rows(lb_y, d).astype(np.float64),
        rows(ub_y, d).astype(np.float64),
        lower_w,
        upper_w,
        hi_y,
        lo_y,
    ]
    ys, fails = np.empty((n, d)), np.empty(n)
    hi_out, lo_out = np.zeros((n, d + m), bool), np.zeros((n, d + m), bool)

    exact = np.dtype(dtype) == np.float64

    # Each instance starts from its nearest earlier one's face, by the
    # parameters: loads, then bounds (`_host_neighbours`).
    starts = NeighbourFaces(np.concatenate(args[1:6], axis=1), args[0], pool_size())

    def done(i, out):
        ys[i], fails[i], up, down = out
        starts.put(i, None if fails[i] else (up, down, ys[i]))
        hi_out[i, :d], lo_out[i, :d] = up[:d], down[:d]
        hi_out[i, d:], lo_out[i, d:] = unmerged_flags(
            up[d:], down[d:], lb_rows[i], ub_rows[i], group, factor,
            lower_w[i], upper_w[i],
        )  # fmt: skip

    def task(i):
        return _solve, (tuple(a[i] for a in args), exact, starts.take(i))

    # Worker processes where the batch is large enough (`_linalg.host_processes`:
    # the rounds' Python steps hold the GIL), else threads; both give the same
    # result, each instance's start fixed by its index.
    in_processes = host_processes.wanted(n) and host_processes.run(
        n, key, (_context, (E, C_unique)), task, starts.ready, done,
    )  # fmt: skip
    if not in_processes:

        def one(i):
            out = None
            try:
                out = _solve((E, C_unique, pattern), *task(i)[1])
            finally:  # (instances waiting on this one go on without its face)
                if out is None:
                    starts.put(i, None)
            done(i, out)

        # The factorisations release the GIL, and JAX waits on this callback:
        # the instances share the cores.
        list(pool().map(one, range(n)))
    wrong = np.where(fails == EMPTY, np.nan, np.where(fails > 0, np.inf, 0.0))
    return (
        ys.reshape(batch + (d,)).astype(dtype),
        wrong.reshape(batch).astype(dtype),
        hi_out.reshape(batch + (d + m,)),
        lo_out.reshape(batch + (d + m,)),
    )


# The host form of the fixed matrices, by their entries.
_MATRICES = ByContent()


def _matrices(shapes, er, ec, ev, cr, cc, cv) -> tuple:
    """`(key, (E, C_unique, group, factor, pattern))`: the matrices' content
    key (which names them to the worker processes), $E$ as float64 CSR, $C$'s
    rows merged up to a factor (`_host_parallel.parallel_rows`) and the fixed
    `KKTPattern` of the two, built once per set of matrices."""
    return _MATRICES.get(
        shapes, (er, ec, ev, cr, cc, cv), functools.partial(_host_matrices, shapes)
    )


def _context(E, C) -> tuple:
    """A worker's `(E, C, pattern)` (`_solve`'s first argument)."""
    return E, C, KKTPattern(E, C)


def _solve(context, arguments, exact, neighbour) -> tuple:
    """`_active_set_method` for one instance's arguments, on `context`."""
    E, C, pattern = context
    return _active_set_method(
        E, C, pattern, *arguments, exact=exact, neighbour=neighbour
    )


def _host_matrices(shapes, er, ec, ev, cr, cc, cv) -> tuple:
    (m_eq, d), (m, _) = shapes
    er, ec, ev, cr, cc, cv = (a.ravel() for a in (er, ec, ev, cr, cc, cv))
    E = sp.csr_matrix((ev.astype(np.float64), (er, ec)), (m_eq, d))
    C = sp.csr_matrix((cv.astype(np.float64), (cr, cc)), (m, d))
    C_unique, group, factor = parallel_rows(C)
    return E, C_unique, group, factor, KKTPattern(E, C_unique)


def _active_set_method(
    E, C, pattern, r, q, lb_y, ub_y, lb_w, ub_w, hi, lo, exact=False,
    neighbour: tuple[np.ndarray, np.ndarray] | None = None,
):  # fmt: skip
    """The active-set rounds for one instance (float64), from a sequence of
    starting faces, each only where the one before did not settle: that of
    Goldfarb and Idnani's dual method (`_host_dual`) from `neighbour`, a
    nearby instance's face (`_host_neighbours`), if given; the iterate's
    bounded coordinates; the dual method's from the face where those rounds
    stopped, unless a round would have moved too many rows; an interior-point
    method's face
    (`_host_ipm.interior_point`), then again releasing one row per round; a
    second run's on more accurate systems; the dual method's from the first
    run's face; the iterate's whole face; and the empty face (the stages of
    `docs/concepts/inference.md`). `exact` asks for the float64 accuracy of
    the Gram solves (see `_host_rounds.face_rounds`).

    Returns `(y, fail, hi, lo)`: the point, 0 where it is certified (else 1,
    or `EMPTY` where the set has no point), and the flags of its face (those
    given, where it failed)."""
    d = r.shape[0]
    hi_y, lo_y = hi.copy(), lo.copy()
    # Rows not seeded first: before convergence the iterate flags many nearly
    # parallel rows (lines of one corridor), whose face lies far from the
    # projection; rows join once violated (measured: see RESULTS).
    hi_y[d:] = lo_y[d:] = False
    bounds = (lb_y, ub_y, lb_w, ub_w)
    lower, upper = np.concatenate([lb_y, lb_w]), np.concatenate([ub_y, ub_w])
    none = np.zeros_like(hi)
    half = _MAX_ROUNDS // 2

    named = {}
    interior = functools.partial(_interior, pattern, r, q, lower, upper, named)
    fine = functools.partial(interior, FINEST_DELTA)

    dual = functools.partial(working_face, pattern, r, q, lower, upper)
    # Far from the set the rounds from the iterate's face soon move hundreds
    # of rows at once (near it, tens): they are left as soon as they do.
    near_moves = max(_NEAR_MOVES, int(_NEAR_MOVES_SHARE * hi.shape[0]))
    warm = functools.partial(dual, max_changes=WARM_CHANGES, max_violated=WARM_VIOLATED)

    def from_neighbour():
        return neighbour and warm(*neighbour)

    def near():
        return hi_y, lo_y

    def from_near():
        return warm(*named["near"]) if "near" in named else None

    # (start, rounds, most moves per round, release one row per round)
    attempts = (
        (from_neighbour, _SADDLE_ROUNDS, None, False),
        (near, _NEAR_ROUNDS, near_moves, False),
        (from_near, _SADDLE_ROUNDS, None, False),
        (interior, half, near_moves, False),  # capped too: see `_NEAR_MOVES`
        # Where the rounds from that face wander: the face has a row too many,
        # whose pull flips the signs of dependent rows' multipliers (not where
        # that run hit its cap: its face is then further off).
        (lambda: None if named["capped"] else named["face"], half, None, True),
        # Where the face is further off: the first run's systems could not
        # resolve the balance rows' weak directions (`_host_kkt.FINEST_DELTA`).
        (fine, half, None, False),
        # Where those cycle (dependent rows flagged): from the first run's
        # face (from the second one's it took longer where both fail).
        (lambda: dual(*named.get("face", (hi_y, lo_y))), half, None, False),
        (lambda: (hi, lo), half, None, False),
        (lambda: (none, none), _MAX_ROUNDS, None, False),
    )
    rounds_from = functools.partial(
        face_rounds, E, C, r, q, bounds, pattern=pattern, exact=exact
    )
    # Where the saddle-point system is tried: second, after the fixed
    # pattern; first from the finest interior-point face, which is reached
    # where the faces are nearly dependent (on the replayed ACTIVSg2000 proxy
    # hours that reach it, the pattern's rounds never settled it, and cost
    # several times the saddle-point rounds that did).
    tries = {start: (False, True) for start in (interior, from_neighbour, from_near)}
    tries[fine] = (True, False)
    return _first_settled(attempts, tries, near, rounds_from, named, r, hi, lo)


def _first_settled(attempts, tries, near, rounds_from, named, r, hi, lo):
    """The attempts of `_active_set_method` in turn, until one settles; its
    result, counted in `SETTLED` by the attempt's name in `STAGE_NAMES`.
    `tries[start]` orders a start's tries on the fixed pattern (`False`) and
    on the saddle-point system (`True`), one try on the pattern if absent;
    where the rounds from `near` stop short of their cap on moves, their last
    face is kept as `named["near"]`. Only the rounds from `near` explore
    (`face_rounds`): from the faces of the later starts, rounds that chose
    their moves by the pattern's unmet solves took longer or did not settle
    (a case2869pegase instance at 100 times the spread)."""
    y = r
    for name, (start, rounds, moves, one) in zip(STAGE_NAMES, attempts, strict=True):
        flags = start()
        if named.get("empty"):
            SETTLED.add("empty")
            return y, EMPTY, hi, lo
        if flags is None:
            continue
        for saddle in tries.get(start, (False,)):
            # The saddle-point try (nearly dependent faces solved accurately)
            # leaves the point and multipliers that the attempts that follow
            # start from to the pattern's try.
            out = rounds_from(
                flags[0], flags[1], _SADDLE_ROUNDS if saddle else rounds, moves,
                release_one=one, saddle=saddle, explore=start is near,
            )  # fmt: skip
            if not out[1]:
                SETTLED.add(name)
                return out[0], 0.0, out[2], out[3]
            if not saddle:
                y, named["multipliers"] = out[0], out[4]
                if start is near and not out[5]:
                    named["near"] = out[2], out[3]
        named["point"] = y
    SETTLED.add("failed")
    return y, 1.0, hi, lo


def _interior(pattern, r, q, lower, upper, named: dict, delta=None):
    """The flags of the face that `interior_point` names, kept as
    `named["face"]` if the first (and whether it stopped at its iteration cap
    as `named["capped"]`); `None` where it proves the set empty
    (`named["empty"]` then set)."""
    # The first run starts from the last rounds' point, which satisfies
    # E y = q and the iterate's bounded coordinates: some 20% fewer iterations
    # than from r far from the set. The second (`delta` given) starts from r:
    # from the point the rounds left on a nearly dependent face it ran to its
    # cap where from r it converged (ACTIVSg2000 proxy hours). The first's
    # multipliers start at the scale of the rounds' face's (`dual_start`).
    first = delta is None
    start = named.get("point") if first else None
    z0 = dual_start(named.get("multipliers") if first else None)
    _, hi, lo, iterations, empty = interior_point(
        pattern, r, q, lower, upper, y0=start, delta=delta, z0=z0
    )
    if empty:
        named["empty"] = True
        return None
    if "face" not in named:
        named["face"], named["capped"] = (hi, lo), iterations >= MAX_ITERATIONS
    return hi, lo
