"""The planning problem of one vehicle: layout, dynamics, constraints, contexts.

Paper App. B.3 (after Augugliaro et al., 2012). Vehicle $i$ moves in the plane
($m = 2$) over $T$ steps of length $h$ with the discretised double integrator

$$v[t+1] = v[t] + h\\,a[t], \\qquad p[t+1] = p[t] + h\\,v[t] + \\tfrac{h^2}{2} a[t],$$

and its decision variable is $y_i = (p[0..T], v[0..T], a[0..T-1]) \\in
\\mathbb{R}^{6T + 4}$, each block flattened time-major, $(x, y)$ within a step.
The constraints are decoupled across vehicles, so one `pinet_eqx.Projector` for
one vehicle, batched with `jax.vmap` over vehicles and contexts, projects the
whole fleet. Everything here is parametrised by $T$ and $h$, so the long-horizon
single-vehicle case ($H = 750$) reuses it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import pinet_eqx as pe

M = 2  # the plane


@dataclasses.dataclass(frozen=True)
class Problem:
    """Sizes and limits of the fleet planning problem (the paper's values).

    **Arguments:**

    - `n_vehicles`: $N$.
    - `horizon`: $T$, the number of steps; positions and velocities have $T + 1$
        samples, accelerations $T$.
    - `h`: the step length.
    - `p_max`, `v_max`, `a_max`: the boxes $|p| \\le p_{max}$ (the workspace
        $[-p_{max}, p_{max}]^2$), $|v| \\le v_{max}$, $|a| \\le a_{max}$, per
        coordinate.
    - `j_max`: the jerk limit $|a[t+1] - a[t]| / h \\le j_{max}$, per coordinate.
    """

    n_vehicles: int = 5
    horizon: int = 25
    h: float = 0.25
    p_max: float = 5.0
    v_max: float = 20.0
    a_max: float = 5.0
    j_max: float = 1.5

    def __post_init__(self):
        if self.n_vehicles < 1 or self.horizon < 2:
            raise ValueError(
                f"Problem(n_vehicles={self.n_vehicles}, horizon={self.horizon}): "
                "need at least one vehicle and a horizon of at least 2 steps."
            )
        limits = (self.h, self.p_max, self.v_max, self.a_max, self.j_max)
        if min(limits) <= 0:
            raise ValueError(
                f"Problem: h, p_max, v_max, a_max and j_max must be positive, got "
                f"{limits}."
            )

    @property
    def dim(self) -> int:
        """$d = 6T + 4$, the size of one vehicle's $y_i$."""
        return 6 * self.horizon + 4

    @property
    def axis_dim(self) -> int:
        """$3T + 2$, the size of one coordinate's part of $y_i$ (`to_axes`)."""
        return 3 * self.horizon + 2

    @property
    def slices(self) -> tuple[slice, slice, slice]:
        """The slices of $p$, $v$ and $a$ in $y_i$."""
        n = M * (self.horizon + 1)
        return slice(0, n), slice(n, 2 * n), slice(2 * n, self.dim)


def split(y, problem: Problem):
    """Positions `(..., T + 1, 2)`, velocities `(..., T + 1, 2)` and accelerations
    `(..., T, 2)` of trajectories `y`, `(..., 6T + 4)`; NumPy or JAX."""
    lead = y.shape[:-1]
    T = problem.horizon
    sp, sv, sa = problem.slices
    return (
        y[..., sp].reshape(*lead, T + 1, M),
        y[..., sv].reshape(*lead, T + 1, M),
        y[..., sa].reshape(*lead, T, M),
    )


def join(p, v, a):
    """The inverse of `split`: `y`, `(..., 6T + 4)`; NumPy or JAX."""
    xp = jnp if isinstance(p, jax.Array) else np
    lead = p.shape[:-2]
    return xp.concatenate(
        [p.reshape(*lead, -1), v.reshape(*lead, -1), a.reshape(*lead, -1)], axis=-1
    )


def to_axes(y):
    """Trajectories `(..., 6T + 4)` as their two coordinates' parts `(..., 2,
    3T + 2)`: `[..., k, :]` is $(p_k[0..T], v_k[0..T], a_k[0..T-1])$.

    Every block of $y$ starts at an even offset and interleaves $(x, y)$, so
    coordinate $k$ is the entries of parity $k$. NumPy or JAX.
    """
    lead = y.shape[:-1]
    return y.reshape(*lead, y.shape[-1] // M, M).swapaxes(-1, -2)


def from_axes(z):
    """The inverse of `to_axes`: `(..., 2, 3T + 2)` to `(..., 6T + 4)`."""
    lead = z.shape[:-2]
    return z.swapaxes(-1, -2).reshape(*lead, -1)


def rollout(start, acc, h: float):
    """Positions and velocities of the dynamics from rest at `start`.

    Simulates $v[t+1] = v[t] + h a[t]$, $p[t+1] = p[t] + h v[t] + \\tfrac{h^2}{2}
    a[t]$ from $p[0] =$ `start`, $v[0] = 0$ with `jax.lax.scan` (so it is cheap
    to trace for long horizons).

    **Arguments:**

    - `start`: the initial position, `(2,)`.
    - `acc`: the accelerations $a[0..T-1]$, `(T, 2)`.
    - `h`: the step length.

    **Returns:** `(p, v)`, each `(T + 1, 2)`.
    """

    def step(carry, a):
        p, v = carry
        nxt = (p + h * v + (0.5 * h * h) * a, v + h * a)
        return nxt, nxt

    start = jnp.asarray(start)
    zero = jnp.zeros_like(start)
    _, (p, v) = jax.lax.scan(step, (start, zero), jnp.asarray(acc, start.dtype))
    return jnp.concatenate([start[None], p]), jnp.concatenate([zero[None], v])


def constraint_matrices(problem: Problem) -> dict[str, np.ndarray]:
    """The constraint data of one vehicle, from the paper's formulation.

    **Returns:** a dict of float64 arrays:

    - `"dynamics"`: $A_{dyn}$, `(4T, d)`, with $A_{dyn} y = 0$ the dynamics (for
        each step, the $v$ rows then the $p$ rows).
    - `"start"`, `"goal"`: `(2, d)`, selecting $p[0]$ and $p[T]$ (their
        right-hand sides are the context).
    - `"rest"`: `(4, d)`, selecting $v[0]$ and $v[T]$ (right-hand side 0).
    - `"jerk"`: $C$, `(2(T-1), d)`, with rows $(a[t+1] - a[t]) / h$.
    - `"lower"`, `"upper"`: the boxes on $y$, `(d,)`.
    """
    T, h, d = problem.horizon, problem.h, problem.dim
    sp, sv, sa = problem.slices

    def col(block, t, k):
        return block.start + M * t + k

    dyn = np.zeros((2 * M * T, d))
    for t in range(T):
        for k in range(M):
            r = 2 * M * t + k
            dyn[r, col(sv, t + 1, k)] = 1.0
            dyn[r, col(sv, t, k)] = -1.0
            dyn[r, col(sa, t, k)] = -h
            r += M
            dyn[r, col(sp, t + 1, k)] = 1.0
            dyn[r, col(sp, t, k)] = -1.0
            dyn[r, col(sv, t, k)] = -h
            dyn[r, col(sa, t, k)] = -0.5 * h * h
    start = np.zeros((M, d))
    goal = np.zeros((M, d))
    rest = np.zeros((2 * M, d))
    for k in range(M):
        start[k, col(sp, 0, k)] = 1.0
        goal[k, col(sp, T, k)] = 1.0
        rest[k, col(sv, 0, k)] = 1.0
        rest[M + k, col(sv, T, k)] = 1.0
    jerk = np.zeros((M * (T - 1), d))
    for t in range(T - 1):
        for k in range(M):
            jerk[M * t + k, col(sa, t + 1, k)] = 1.0 / h
            jerk[M * t + k, col(sa, t, k)] = -1.0 / h
    upper = np.concatenate(
        [
            np.full(sp.stop - sp.start, problem.p_max),
            np.full(sv.stop - sv.start, problem.v_max),
            np.full(sa.stop - sa.start, problem.a_max),
        ]
    )
    return dict(
        dynamics=dyn, start=start, goal=goal, rest=rest, jerk=jerk,
        lower=-upper, upper=upper,
    )  # fmt: skip


def make_projector(
    problem: Problem, *, per_axis: bool = False, **settings
) -> pe.Projector:
    """The projector onto one vehicle's feasible trajectories.

    The sets are the paper's: the dynamics and $v[0] = v[T] = 0$ as equalities,
    $p[0]$ and $p[T]$ equal to the `Parameter`s `"start"` and `"goal"` (each
    `(2,)`), the boxes, and the jerk limit as a two-sided `pe.AffineInequality`.
    Project a fleet with `jax.vmap(proj)(Y_raw, start=starts, goal=goals)` and a
    batch of fleets with a second `jax.vmap`.

    Every constraint involves one coordinate only, and the squared distance is a
    sum over coordinates, so the projection splits into two identical problems
    of size $3T + 2$. `per_axis=True` builds that smaller projector, for the
    parts `to_axes(y)` (with `"start"` and `"goal"` of shape `(1,)`): the lifted
    matrix is half as large each way, so its factorisation takes about 8 times
    fewer flops and 4 times less memory, and each iteration half the flops, for
    the same projection. At $T = 750$ it is what keeps construction reasonable
    (measured in `benchmarks/RESULTS.md`).

    **Arguments:**

    - `problem`: the `Problem`.
    - `per_axis`: build the projector of one coordinate's part.
    - `**settings`: passed to `pe.Projector` (`n_iter`, `n_iter_test`, `sigma`...).

    **Returns:** a `pe.Projector` for `y` of shape `(6T + 4,)`, or `(3T + 2,)`
    with `per_axis`.
    """
    c = constraint_matrices(problem)
    if per_axis:
        c = {
            k: (v[0::M, 0::M] if v.ndim == 2 else v[0::M]) for k, v in c.items()
        }  # the rows and columns of coordinate 0, as in `to_axes`
    j = problem.j_max
    constraints = [
        pe.Equality(c["dynamics"], np.zeros(len(c["dynamics"]))),
        pe.Equality(c["rest"], np.zeros(len(c["rest"]))),
        pe.Equality(c["start"], pe.Parameter("start")),
        pe.Equality(c["goal"], pe.Parameter("goal")),
        pe.Box(c["lower"], c["upper"]),
        pe.AffineInequality(c["jerk"], lower=-j, upper=j),
    ]
    return pe.Projector(constraints, **settings)


def violations(Y, starts, goals, problem: Problem) -> dict[str, np.ndarray]:
    """Constraint violations of trajectories, in float64, from the definitions.

    Written from the problem statement (a simulation of each step, the limits),
    not from `constraint_matrices` or the projector, so it checks both.

    **Arguments:**

    - `Y`: trajectories, `(..., 6T + 4)`.
    - `starts`, `goals`: their prescribed $p[0]$ and $p[T]$, `(..., 2)`.
    - `problem`: the `Problem`.

    **Returns:** a dict of arrays of shape `Y.shape[:-1]`: the largest violation of
    the `"dynamics"`, of the `"boundary"` conditions (start, goal, zero initial
    and final velocity), of the `"box"` limits and of the `"jerk"` limit, and
    `"cv"`, their maximum.
    """
    Y = np.asarray(Y, np.float64)
    starts = np.asarray(starts, np.float64)
    goals = np.asarray(goals, np.float64)
    h = problem.h
    p, v, a = split(Y, problem)
    dv = v[..., 1:, :] - v[..., :-1, :] - h * a
    dp = p[..., 1:, :] - p[..., :-1, :] - h * v[..., :-1, :] - 0.5 * h * h * a
    out = {
        "dynamics": np.maximum(np.abs(dv).max((-2, -1)), np.abs(dp).max((-2, -1))),
        "boundary": np.max(
            np.abs(
                np.stack(
                    [
                        p[..., 0, :] - starts,
                        p[..., -1, :] - goals,
                        v[..., 0, :],
                        v[..., -1, :],
                    ],
                    axis=-2,
                )  # fmt: skip
            ),
            axis=(-2, -1),
        ),
        "box": np.maximum.reduce(
            [
                (np.abs(p) - problem.p_max).max((-2, -1)),
                (np.abs(v) - problem.v_max).max((-2, -1)),
                (np.abs(a) - problem.a_max).max((-2, -1)),
                np.zeros(Y.shape[:-1]),
            ]
        ),
        "jerk": np.maximum(
            (np.abs(np.diff(a, axis=-2)) / h - problem.j_max).max((-2, -1)), 0.0
        ),
    }
    out["cv"] = np.maximum.reduce(list(out.values()))
    return out


# ------------------------------------------------------------------ contexts


def _ramp(T: int) -> np.ndarray:
    """The acceleration shape $s[t] = 1 - 2t / (T - 1)$, $t = 0..T-1$: linear,
    antisymmetric ($\\sum_t s[t] = 0$, so a vehicle at rest stops again)."""
    return 1.0 - 2.0 * np.arange(T) / (T - 1)


def _ramp_limits(problem: Problem) -> tuple[float, float]:
    """`(unit, c_max)`: the displacement of the accelerations $a = s$ from rest
    over $T$ steps, and the largest $c$ for which $c s$ meets the acceleration,
    jerk and velocity limits."""
    T, h = problem.horizon, problem.h
    s = _ramp(T)
    # p[T] - p[0] = h^2 sum_t (T - t - 1/2) a[t] from rest.
    unit = h * h * float(np.sum((T - np.arange(T) - 0.5) * s))
    v_peak = h * float(np.max(np.cumsum(s)))
    c_max = min(
        problem.a_max, problem.j_max * h * (T - 1) / 2.0, problem.v_max / v_peak
    )
    return unit, c_max


def reach(problem: Problem) -> float:
    """The largest per-coordinate displacement $|\\bar p[T] - \\bar p[0]|_k$ that
    `feasible_trajectory` can certify: a vehicle can go from rest to rest over
    any such displacement within the limits."""
    unit, c_max = _ramp_limits(problem)
    return unit * c_max


def feasible_trajectory(start, goal, problem: Problem) -> np.ndarray:
    """A feasible trajectory from `start` to `goal`, a certificate of feasibility.

    The vehicle moves along the straight segment with accelerations $a[t] =
    (\\bar p[T] - \\bar p[0])\\, s[t] / \\mathrm{unit}$, where $s$ ramps linearly
    from 1 to -1. As $s$ is antisymmetric the vehicle stops at the goal; its
    velocity never changes sign, so it stays on the segment, inside the
    workspace; and its acceleration, jerk and velocity are within the limits
    whenever each coordinate of the displacement is at most `reach(problem)`.
    It is also the effort-optimal trajectory then: minimising $\\sum_t
    \\|a[t]\\|^2$ under the two terminal equalities per coordinate makes $a$
    affine in $t$, and the ramp is the affine sequence that meets them.

    **Arguments:**

    - `start`, `goal`: `(2,)`, inside the workspace.
    - `problem`: the `Problem`.

    **Returns:** $y$, `(6T + 4,)`, float64. Raises `ValueError` if the
    displacement exceeds `reach(problem)`.
    """
    start = np.asarray(start, np.float64)
    goal = np.asarray(goal, np.float64)
    unit, c_max = _ramp_limits(problem)
    c = (goal - start) / unit
    if np.abs(c).max() > c_max * (1 + 1e-12):
        raise ValueError(
            f"feasible_trajectory(start={start}, goal={goal}): the displacement "
            f"exceeds reach(problem) = {unit * c_max:.3g} per coordinate for "
            f"T = {problem.horizon}, h = {problem.h}."
        )
    a = c[None, :] * _ramp(problem.horizon)[:, None]
    # Simulated in NumPy float64, whatever JAX's precision setting.
    h = problem.h
    p = [start]
    v = [np.zeros(M)]
    for a_t in a:
        p.append(p[-1] + h * v[-1] + 0.5 * h * h * a_t)
        v.append(v[-1] + h * a_t)
    p, v = np.stack(p), np.stack(v)
    return join(p, v, a)


def _formation(rng, n: int, center, p_max: float) -> np.ndarray:
    """`n` points evenly along a random line segment or circle around `center`."""
    if rng.random() < 0.5:
        length = rng.uniform(0.3, 0.7) * p_max
        angle = rng.uniform(0.0, np.pi)
        s = np.linspace(-0.5, 0.5, n) if n > 1 else np.zeros(1)
        offsets = length * s[:, None] * np.array([np.cos(angle), np.sin(angle)])
    else:
        radius = rng.uniform(0.15, 0.35) * p_max
        angle = rng.uniform(0.0, 2 * np.pi) + 2 * np.pi * np.arange(n) / n
        offsets = radius * np.stack([np.cos(angle), np.sin(angle)], axis=-1)
    return np.asarray(center)[None, :] + offsets


def sample_contexts(
    rng: np.random.Generator, n: int, problem: Problem, max_tries: int = 1000
) -> tuple[np.ndarray, np.ndarray]:
    """Random start and goal fleet configurations, each certified feasible.

    Each configuration places the $N$ vehicles evenly along a random line segment
    or circle; starts are centred in the left part of the workspace ($x \\in
    [-0.65, -0.45]\\,p_{max}$), goals in the right part, and the goals are
    assigned to the vehicles in a random order. A draw is kept only if every
    vehicle is at least $0.1\\,p_{max}$ inside the workspace and its displacement
    is within `reach(problem)`, so `feasible_trajectory` certifies it.

    **Arguments:**

    - `rng`: a NumPy `Generator`.
    - `n`: the number of contexts.
    - `problem`: the `Problem`.
    - `max_tries`: draws allowed per context before giving up.

    **Returns:** `(starts, goals)`, each `(n, N, 2)`, float64.
    """
    N, p_max = problem.n_vehicles, problem.p_max
    limit = reach(problem)
    starts = np.empty((n, N, M))
    goals = np.empty((n, N, M))
    for i in range(n):
        for _ in range(max_tries):
            cy = rng.uniform(-0.3, 0.3, size=2) * p_max
            cx = rng.uniform(0.45, 0.65, size=2) * p_max
            s = _formation(rng, N, (-cx[0], cy[0]), p_max)
            g = _formation(rng, N, (cx[1], cy[1]), p_max)[rng.permutation(N)]
            inside = max(np.abs(s).max(), np.abs(g).max()) <= 0.9 * p_max
            if inside and np.abs(g - s).max() <= limit:
                starts[i], goals[i] = s, g
                break
        else:
            raise RuntimeError(
                f"sample_contexts: no feasible configuration in {max_tries} draws: "
                f"the start and goal regions are about {p_max:.3g} apart but "
                f"reach(problem) = {limit:.3g} for T = {problem.horizon}, "
                f"h = {problem.h}. Increase the horizon or the step length."
            )
    return starts, goals


def context_features(starts, goals, problem: Problem):
    """The backbone's input: all starts and goals, flattened and divided by
    $p_{max}$, `(..., 4N)`."""
    lead = starts.shape[:-2]
    x = jnp.concatenate(
        [jnp.reshape(starts, (*lead, -1)), jnp.reshape(goals, (*lead, -1))], axis=-1
    )
    return x / problem.p_max
