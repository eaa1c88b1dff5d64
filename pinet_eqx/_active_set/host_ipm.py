"""An interior-point method for the projection onto a sparse polyhedral set, on
the host: it names the face where the raw output lies far from the set.

The polish's active-set rounds (`_host_polish`) change the face a few rows at
a time, so their cost grows with the distance from $y_{raw}$ to the set, while
an interior-point method's is set by its number of iterations, which hardly
depends on where it starts. This one solves

$$\\min_y \\tfrac12 \\|y - r\\|^2 \\quad\\text{s.t.}\\quad E y = q,\\quad
\\ell \\le G y \\le u,\\qquad G = [I; C],$$

by Mehrotra's predictor-corrector method with Gondzio's centrality correctors
and primal and dual steps of their own lengths, from an infeasible start. Each
bound is one slack $s_i = \\sigma_i g_i^\\top y - \\beta_i \\ge 0$ with its
multiplier $z_i$ ($\\sigma_i = 1$, $\\beta_i = \\ell_i$ for a lower bound,
$\\sigma_i = -1$, $\\beta_i = -u_i$ for an upper one), and each iteration
solves with $K(Z S^{-1})$ on the set's fixed pattern (`_host_kkt`). The method
stops at a modest accuracy: it only has to name the face, whose projection the
polish's rounds then compute and certify (`_host_rounds.face_rounds`).

Where the set is empty the multipliers grow without bound, and their direction
is a Farkas certificate: `_Iterate.proves_empty` checks it (`interior_point`
then stops and says so), so that the polish does not search for a projection
that does not exist.
"""

from __future__ import annotations

import numpy as np

from .host_kkt import FINE_DELTA, KKTPattern

# Stop when the residuals (relative to the data) and the complementarity
# (relative to the objective) are below these: enough to name the face...
_RESIDUAL_TOL = 1e-5
_GAP_TOL = 1e-9
# ... once the complementarity resolves the narrowest bound interval, of
# width w: below (this fraction of w)^2.
_WIDTH_FRACTION = 1e-1
# Stop, keeping the best iterate, where the residuals grow this much past it.
_GROWTH = 100.0
# Once the complementarity has fallen below the narrowest interval's floor
# (see `_Iterate.mu_floor`) and the gap test, stop at this residual, not only
# at `_RESIDUAL_TOL`: the solves' accuracy, not the method, then sets the
# residual, which drifts and can blow up while the face stays the same (hours
# of the ACTIVSg2000 proxy, and one case2869pegase instance at 1x the spread
# whose residual was 1e-2 there, ran on to the iteration cap on one face). A
# blown-up iterate, whose flags mean little, is not taken.
_SETTLED_RESIDUAL_TOL = 1e-1
# The ratio z / s above which a bound is taken as binding.
_ACTIVE_RATIO = 100.0
# The most iterations (factorisations) of one run.
MAX_ITERATIONS = 60
# Gondzio's centrality correctors per iteration (each one solve, no factorisation).
_CORRECTORS = 2
# ... each kept only where it lengthens the step by this factor.
_CORRECTOR_GAIN = 1.01
# The fraction of the way to the boundary each step goes.
_STEP_FRACTION = 0.99
# The start's multipliers, all equal: by default this, and where a face's
# multipliers are known (the polish's rounds), their median magnitude clipped
# to [_DUAL_START, _DUAL_START_MAX]. The method's multipliers grow by a
# bounded factor per iteration, so a start far below the projection's costs
# iterations: a trained proxy's faces on ACTIVSg2000 hold multipliers of
# 1e2-1e7, and from 1 it took about twice as many. Near the set the faces'
# multipliers are small and the start stays 1 (measured: see
# benchmarks/dcopf/RESULTS.md).
_DUAL_START = 1.0
_DUAL_START_MAX = 100.0
# The Farkas certificate is checked at every other iteration from this one on
# where the residuals stopped falling fast (`_check_empty`), until the iterate
# meets the stopping test (infeasible hours of ACTIVSg2000: it holds from the
# third; each check costs a fifth of an iteration), and holds with this
# relative margin over the rounding of its terms.
_FIRST_CHECK = 2
_CERTIFICATE_MARGIN = 1e-9
_CORRECTION_STEPS = 2
# The residuals stall when, below `_STALL_LEVEL`, they fall by less than
# `_STALL_RATIO` over `_STALL_LAG` iterations; the systems then switch to the
# smaller shift `FINE_DELTA` (see `interior_point`).
_STALL_LEVEL = 1e-2
_STALL_RATIO = 0.5
_STALL_LAG = 2


def interior_point(
    pattern: KKTPattern,
    r: np.ndarray,
    q: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    max_iter: int = MAX_ITERATIONS,
    y0: np.ndarray | None = None,
    delta: float | None = None,
    z0: float = _DUAL_START,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, bool]:
    """The projection of `r` onto $\\{y : E y = q,\\ \\ell \\le [y; C y] \\le u\\}$,
    to the accuracy that names its face.

    **Arguments:**

    - `pattern`: the set's `KKTPattern`.
    - `r`: the point projected (float64); `q` the equality right-hand side.
    - `lower`, `upper`: the bounds of $[y; C y]$ in the layout of
        `_host_polish` (coordinates, then rows), infinite where absent.
    - `max_iter`: the most iterations (factorisations).
    - `y0`: where to start (default `r`); any point, feasible or not.
    - `delta`: the regularisation of its systems (default: the pattern's, see
        `KKTPattern.factorise`, until the residuals stall, then `FINE_DELTA`).
    - `z0`: the start's multipliers (see `dual_start`).

    **Returns:** `(y, hi, lo, iterations, empty)`: the last iterate, the flags
    of the bounds it finds binding (see `_Iterate.flags`), in the layout of
    `lower`, the number of factorisations, and whether its multipliers proved
    the set empty (`_Iterate.proves_empty`; the rest then means nothing).
    """
    # Far from the set the last iterations can overflow; the method checks
    # its steps for that itself (and stops), so numpy's warnings say nothing.
    with np.errstate(all="ignore"):
        state = _Iterate(pattern, r, q, lower, upper, y0, delta, z0)
        it, best, history = 0, None, []
        for it in range(max_iter + 1):
            res, gap, mu = state.residuals()
            history.append(float(res))
            if state.delta is None and _stalled(history):
                # Near a face whose multipliers are huge (an hour close to
                # infeasible), the default shift's error, about delta times
                # the multipliers, outgrows what refinement removes: the
                # residuals stall. The smaller shift resolves them (measured:
                # see benchmarks/dcopf/RESULTS.md).
                state.delta = FINE_DELTA
            settled = gap < _GAP_TOL and mu < state.mu_floor
            if settled and res < _SETTLED_RESIDUAL_TOL:
                break
            if res < _RESIDUAL_TOL and gap < _GAP_TOL:
                if best is not None and res > _GROWTH * best[0]:
                    # Past the solves' accuracy (the weights span many orders
                    # of magnitude near the end): the best iterate names the
                    # face as well as any later one would.
                    state.restore(best[1])
                    break
                if best is None or res < best[0]:
                    best = (res, state.saved())
            elif best is not None:
                state.restore(best[1])
                break
            elif _check_empty(it, history) and state.proves_empty():
                return state.y, *state.flags(), it, True
            if it == max_iter or not state.advance(mu):
                break
        return state.y, *state.flags(), it, False


class _Iterate:
    """The interior-point method's iterate: $y$, the equalities' multipliers
    $\\lambda$, the slacks $s$ and their multipliers $z$, with the data in
    the scaled units of the pattern."""

    def __init__(self, P: KKTPattern, r, q, lower, upper, y0, delta, z0):
        self.P, self.r, self.q, self.delta = P, r, q / P.e_norms, delta
        scale = np.concatenate([np.ones(P.d), P.c_norms])
        lo_b, up_b = lower / scale, upper / scale
        self.box = (lo_b[: P.d], up_b[: P.d])
        self.free = np.flatnonzero(np.isinf(lo_b[: P.d]) & np.isinf(up_b[: P.d]))
        L, U = np.flatnonzero(np.isfinite(lo_b)), np.flatnonzero(np.isfinite(up_b))
        self.rows = np.concatenate([L, U])
        self.sign = np.concatenate([np.ones(L.size), -np.ones(U.size)])
        self.beta = np.concatenate([lo_b[L], -up_b[U]])
        self.y = r.copy() if y0 is None else np.array(y0, dtype=np.float64)
        # An infeasible start whose slacks are at least the bounds' violation:
        # the steps then shrink every residual at a similar rate.
        self.s = np.abs(self._slack_rows(self.y)) + 1.0
        self.z = np.full(self.rows.size, z0)
        self.lam = np.zeros(P.m_eq)
        # Far from the set the objective, and with it the complementarity the
        # gap test allows, is large; a bound whose interval is narrow (an
        # angle difference of 1e-3 rad on a strong line) is only told active
        # from inactive once its products s z are far below its width squared.
        # (Equal bounds are active on every face: they need no telling.)
        width = up_b - lo_b
        width = width[np.isfinite(width) & (width > 0)]
        self.mu_floor = (_WIDTH_FRACTION * min(1.0, width.min(initial=1.0))) ** 2
        self.scales = (1.0 + np.abs(r).max(initial=0.0), 1.0 + np.abs(self.q).max())

    def _slack_rows(self, y, gy=None):
        """$\\sigma_i g_i^\\top y - \\beta_i$ for every bound (`gy`: $G y$)."""
        gy = self.P.G @ y if gy is None else gy
        return self.sign * gy[self.rows] - self.beta

    def _scatter(self, values):
        """Per-bound `values` summed onto the rows of $G$."""
        return np.bincount(self.rows, values, self.P.G.shape[0])

    def residuals(self):
        """`(res, gap, mu)`: the largest scaled residual, the complementarity
        relative to the objective, and the mean complementarity; the residuals
        themselves are kept for the next step."""
        P, y = self.P, self.y
        pull = P.GT @ self._scatter(self.sign * self.z)
        self.rd = y - self.r + P.ET @ self.lam - pull
        self.rp = P.E @ y - self.q
        gy = P.G @ y
        self.rs = self._slack_rows(y, gy) - self.s
        mu = self.s @ self.z / max(self.s.size, 1)
        res = max(
            np.abs(self.rd).max() / self.scales[0],
            np.abs(self.rp).max(initial=0.0) / self.scales[1],
            np.abs(self.rs).max(initial=0.0) / (1.0 + np.abs(gy).max()),
        )
        gap = self.s @ self.z / (1.0 + 0.5 * np.sum((y - self.r) ** 2))
        return res, gap, mu

    def proves_empty(self) -> bool:
        """Whether the multipliers prove that no $y$ satisfies the constraints.

        For a feasible $y$, the slacks of the rows of $C$ weighted by their
        multipliers $z \\ge 0$ and the equalities weighted by $\\lambda$ give
        $y^\\top v \\ge b$, with $v = C^\\top (\\sigma z) - E^\\top \\lambda$ and
        $b = \\sum z_i \\beta_i - \\lambda^\\top q$; the coordinates' bounds give
        $y^\\top v \\le h = \\sum_j \\max(v_j \\ell_j, v_j u_j)$. So $h < b$
        proves the set empty. $\\lambda$ is first corrected (least norm) so that
        $v$ vanishes on the coordinates without bounds, where $h$ would
        otherwise be infinite: the multipliers of an iterate are a certificate
        only up to $y - r$, which the growing multipliers dwarf.
        """
        P, d = self.P, self.P.d
        lo, up = self.box
        on_rows = self.rows >= d
        mu = np.bincount(
            self.rows[on_rows], (self.sign * self.z)[on_rows], P.G.shape[0]
        )
        lam = self.lam
        v = P.GT @ mu - P.ET @ lam
        if self.free.size:
            E_free, lu = P.free_lu(self.free)
            if lu is None:  # the free coordinates' columns are dependent
                return False
            # Refined once: E_F^T E_F squares the condition number of E_F (a
            # grid's susceptances), and one solve leaves too much of v there.
            for _ in range(_CORRECTION_STEPS):
                correction = E_free @ lu.solve(v[self.free])
                lam, v = lam + correction, v - P.ET @ correction
        b_terms = np.concatenate([(self.z * self.beta)[on_rows], -lam * self.q])
        b = np.sum(b_terms)
        h_terms = np.where(v > 0, v * up, np.where(v < 0, v * lo, 0.0))
        bounded = np.isfinite(h_terms)
        # Mostly the case (a set with a point never passes): decided without
        # the rounding analysis below, as the remaining terms only add to h.
        if b <= np.sum(h_terms[bounded]):
            return False
        size = P.GT_abs @ np.abs(mu) + P.ET_abs @ np.abs(lam)
        # What rounding leaves of a zero entry of v: no bound is needed there.
        zero = np.abs(v) <= _CERTIFICATE_MARGIN * size
        if np.any(~bounded & ~zero):
            return False
        h_terms = np.where(bounded, h_terms, 0.0)
        h = np.sum(h_terms)
        scale = np.sum(np.abs(b_terms)) + np.sum(np.abs(h_terms))
        return bool(b - h > _CERTIFICATE_MARGIN * scale)

    def saved(self):
        return (self.y, self.s, self.z)

    def restore(self, saved) -> None:
        self.y, self.s, self.z = saved

    def advance(self, mu) -> bool:
        """One predictor-corrector step; `False` where the solves failed."""
        solve = self.P.factorise(self._scatter(self.z / self.s), self.delta)
        s, z = self.s, self.z

        def direction(target, homogeneous=False, refine=True):
            """The Newton direction `(dy, dlam, ds, dz)` for complementarity
            products `target` (a corrector's, on zero residuals); `refine`
            as `KKTPattern.factorise`'s solve."""
            rs = 0.0 if homogeneous else self.rs
            t = self._scatter(self.sign * (target - z * rs) / s)
            rhs = self.P.GT @ t
            if homogeneous:
                rhs = np.concatenate([rhs, np.zeros(self.P.m_eq)])
            else:
                rhs = np.concatenate([rhs - self.rd, -self.rp])
            sol = solve(rhs, refine)
            dy, dlam = sol[: self.P.d], sol[self.P.d :]
            ds = self.sign * (self.P.G @ dy)[self.rows] + rs
            return dy, dlam, ds, (target - z * ds) / s

        # The predictor only sets the centring and the corrector's second-order
        # term, and Gondzio's correctors only shape the step: one solve each
        # is enough (the step's own direction is refined), and the residuals
        # are recomputed from the iterate at every iteration.
        affine = direction(-s * z, refine=False)
        a = min(_longest(s, affine[2]), _longest(z, affine[3]))
        mu_affine = (s + a * affine[2]) @ (z + a * affine[3]) / max(s.size, 1)
        sigma = (mu_affine / mu) ** 3
        step = direction(sigma * mu - s * z - affine[2] * affine[3])
        step = _gondzio(step, direction, s, z, sigma * mu)
        if not all(np.all(np.isfinite(v)) for v in step):
            return False  # the iterate so far names the face
        # Primal and dual steps of their own lengths: some 15% fewer
        # iterations on the grids than one common step.
        a_p = _STEP_FRACTION * _longest(s, step[2])
        a_d = _STEP_FRACTION * _longest(z, step[3])
        self.y, self.s = self.y + a_p * step[0], s + a_p * step[2]
        self.lam, self.z = self.lam + a_d * step[1], z + a_d * step[3]
        return True

    def flags(self):
        """`(hi, lo)`: each bound's ratio $z / s$ is large where it binds; a
        row is flagged on the side where it exceeds `_ACTIVE_RATIO`, the larger
        side where both do. Rows left out join the face in the rounds once
        violated, which is cheaper than releasing rows wrongly flagged (each
        release round may free only the wrongly signed among dependent rows).
        """
        n = self.P.G.shape[0]
        ratio = self.z / self.s
        lower = self.sign > 0
        ratio_lo = np.zeros(n)
        ratio_hi = np.zeros(n)
        ratio_lo[self.rows[lower]] = ratio[lower]
        ratio_hi[self.rows[~lower]] = ratio[~lower]
        lo = (ratio_lo > _ACTIVE_RATIO) & (ratio_lo >= ratio_hi)
        hi = (ratio_hi > _ACTIVE_RATIO) & (ratio_hi > ratio_lo)
        return hi, lo


def dual_start(multipliers: np.ndarray | None) -> float:
    """The interior-point method's start multipliers from those of a face
    near the projection's (any sign, zero off the face): their median
    magnitude on the face, within `[_DUAL_START, _DUAL_START_MAX]`."""
    if multipliers is None or not np.any(multipliers):
        return _DUAL_START
    scale = np.median(np.abs(multipliers[multipliers != 0]))
    return float(np.clip(scale, _DUAL_START, _DUAL_START_MAX))


def _halved(history: list[float]) -> bool:
    """Whether the residuals (`history`, at least `_STALL_LAG + 1` of them)
    fell below `_STALL_RATIO` of theirs `_STALL_LAG` iterations before."""
    return history[-1] < _STALL_RATIO * history[-1 - _STALL_LAG]


def _stalled(history: list[float]) -> bool:
    """Whether the residuals, once small, stopped falling (`_halved`)."""
    return (
        len(history) > _STALL_LAG
        and history[-1] < _STALL_LEVEL
        and not _halved(history)
    )


def _check_empty(it: int, history: list[float]) -> bool:
    """Whether iteration `it` checks the Farkas certificate: every other one
    from `_FIRST_CHECK`, except where the residuals `_halved`. The residuals
    of an empty set cannot vanish, and a method on its way to the projection
    of a set with points skips most checks (a fifth of an iteration each)."""
    if it < max(_FIRST_CHECK, _STALL_LAG) or it % 2:
        return False
    return not _halved(history)


def _longest(v, dv) -> float:
    """The longest step in [0, 1] along `dv` that keeps `v` (positive)
    positive: $\\min(1, \\min_{dv_i < 0} -v_i / dv_i)$. The bound that limits
    it is found as the largest $-dv_i / v_i$, without selecting the entries
    where $dv < 0$ (that took a tenth of the method's time, at nine calls an
    iteration); its ratio is then taken as before."""
    if not v.size:
        return 1.0
    i = int(np.argmax(-dv / v))
    return min(1.0, float(-v[i] / dv[i])) if dv[i] < 0 else 1.0


def _gondzio(step, direction, s, z, target):
    """Gondzio's centrality correctors: push the complementarity products that
    the step would leave far from `target` back towards it, while that
    lengthens the step."""

    def length(step):
        return min(_longest(s, step[2]), _longest(z, step[3]))

    current = length(step)
    for _ in range(_CORRECTORS):
        if _CORRECTOR_GAIN * current > 1.0:
            break  # no corrector can lengthen it enough to be kept
        trial = min(1.0, 1.5 * current + 0.1)
        products = (s + trial * step[2]) * (z + trial * step[3])
        fix = np.clip(products, 0.1 * target, 10 * target) - products
        extra = direction(np.maximum(fix, -10 * target), homogeneous=True, refine=False)
        candidate = tuple(a + b for a, b in zip(step, extra))
        new = length(candidate)
        if new < _CORRECTOR_GAIN * current:
            break
        step, current = candidate, new
    return step
