"""The planner: a backbone predicts the fleet's accelerations jointly, the dynamics
roll them out into raw trajectories, and one projector per vehicle makes them
feasible (paper Sec. 3.2, Fig. 4)."""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

import pinet_eqx as pe

from ._problem import M, Problem, from_axes, join, make_projector, rollout, to_axes

RAW_FROM = ("acceleration", "trajectory")


def raw_size(problem: Problem, raw_from: str = "acceleration") -> int:
    """The backbone's output size for `FleetPlanner(..., raw_from=...)`."""
    per_vehicle = problem.dim if raw_from == "trajectory" else problem.horizon * M
    return problem.n_vehicles * per_vehicle


class FleetPlanner(eqx.Module):
    """Maps a context to feasible trajectories of the whole fleet.

    $y_i = \\Pi_{\\mathcal{C}(\\bar p_i[0], \\bar p_i[T])}(\\mathrm{rollout}(\\bar
    p_i[0], a_i))$ for $(a_1, \\dots, a_N) = f_\\theta(x)$: the backbone sees the
    whole context and predicts all accelerations at once (so it can optimise a
    fleet-level objective), the raw trajectory of each vehicle is its dynamics
    rolled out from rest at its start, and the projection runs per vehicle, under
    `jax.vmap`, because the constraints are decoupled. It is `HardConstrainedNet`
    with a rollout between the backbone and a vehicle-wise projector.

    **Arguments:**

    - `backbone`: a callable Module mapping one input `x` (any PyTree, e.g. the
        flattened starts and goals, or a map and them) to $N T m$ raw
        accelerations (or $N (6T + 4)$ numbers with `raw_from="trajectory"`).
    - `projector`: the projector of one vehicle (`make_projector`), with
        `Parameter`s `"start"` and `"goal"`.
    - `problem`: the `Problem`.
    - `per_axis`: `projector` is the one coordinate's projector of
        `make_projector(..., per_axis=True)`; it is applied to both parts
        `to_axes(y)` of each vehicle.
    - `raw_from`: `"acceleration"` (the paper's: roll the predicted accelerations
        out) or `"trajectory"`: the backbone predicts each vehicle's whole raw
        $y_i$ (positions in units of $p_{max}$) and the projection alone makes
        it consistent. Rollouts are ill-conditioned over long horizons: an
        error $\\epsilon$ in every acceleration moves $p[T]$ by $h^2 T^2
        \\epsilon / 2$, about $1.8 \\cdot 10^4 \\epsilon$ at $T = 750$.
    """

    backbone: Callable
    projector: pe.Projector
    problem: Problem = eqx.field(static=True)
    per_axis: bool = eqx.field(static=True, default=False)
    raw_from: str = eqx.field(static=True, default="acceleration")

    def __check_init__(self):
        if self.raw_from not in RAW_FROM:
            raise ValueError(
                f"FleetPlanner(raw_from={self.raw_from!r}): use one of {RAW_FROM}."
            )
        if self.per_axis:
            expected, what = self.problem.axis_dim, "3T + 2 (per_axis=True)"
        else:
            expected, what = self.problem.dim, "6T + 4"
        if self.projector.dim != expected:
            raise ValueError(
                f"FleetPlanner: the projector's dimension {self.projector.dim} is not "
                f"the problem's {what} = {expected}. Build it with "
                f"make_projector(problem, per_axis={self.per_axis})."
            )

    def raw(self, x, starts):
        """The raw trajectories, before projection, `(N, 6T + 4)`.

        **Arguments:**

        - `x`: the backbone's input for one context.
        - `starts`: the initial positions, `(N, 2)`.
        """
        N, T = self.problem.n_vehicles, self.problem.horizon
        if self.raw_from == "trajectory":
            Y = jnp.reshape(self.backbone(x), (N, self.problem.dim))
            n_p = self.problem.slices[0].stop
            return Y.at[:, :n_p].multiply(self.problem.p_max)
        acc = jnp.reshape(self.backbone(x), (N, T, M))
        p, v = jax.vmap(lambda s, a: rollout(s, a, self.problem.h))(starts, acc)
        return join(p, v, acc)

    def project(self, Y_raw, starts, goals):
        """Each vehicle's raw trajectory projected onto its feasible set,
        `(N, 6T + 4)`."""
        Z = self._per_vehicle(self.projector, Y_raw, starts, goals)
        return from_axes(Z) if self.per_axis else Z

    def __call__(self, x, starts, goals):
        """Feasible trajectories of one fleet, `(N, 6T + 4)`.

        **Arguments:**

        - `x`: the backbone's input for one context (batch with `jax.vmap`).
        - `starts`, `goals`: the prescribed $p_i[0]$ and $p_i[T]$, `(N, 2)`.
        """
        return self.project(self.raw(x, starts), starts, goals)

    def violation(self, Y, starts, goals):
        """The projector's own violation of each vehicle's trajectory, `(N,)`
        (for monitoring; `violations` is the independent check)."""
        cv = self._per_vehicle(self.projector.violation, Y, starts, goals)
        return jnp.max(cv, axis=-1) if self.per_axis else cv

    def _per_vehicle(self, fn, Y, starts, goals):
        """`fn(y, start=..., goal=...)` of each vehicle, or of each vehicle's
        coordinate (`to_axes`, a trailing axis of 2) with `per_axis`."""
        if self.per_axis:
            per_coordinate = jax.vmap(jax.vmap(fn))
            return per_coordinate(
                to_axes(Y), start=starts[..., None], goal=goals[..., None]
            )
        return jax.vmap(fn)(Y, start=starts, goal=goals)


def make_mlp(problem: Problem, *, width: int = 256, depth: int = 2, key):
    """The backbone of the paper's planner: an MLP with ReLU from the flattened
    context, $4N$ inputs, to the fleet's $N T m$ accelerations."""
    N, T = problem.n_vehicles, problem.horizon
    return eqx.nn.MLP(
        2 * M * N, N * T * M, width_size=width, depth=depth, activation=jax.nn.relu,
        key=key,
    )  # fmt: skip


def make_planner(
    problem: Problem,
    *,
    key,
    width: int = 256,
    depth: int = 2,
    per_axis: bool = False,
    **projector_settings,
) -> FleetPlanner:
    """A `FleetPlanner` with the MLP backbone and the vehicle projector (of one
    coordinate with `per_axis`)."""
    return FleetPlanner(
        make_mlp(problem, width=width, depth=depth, key=key),
        make_projector(problem, per_axis=per_axis, **projector_settings),
        problem,
        per_axis,
    )
