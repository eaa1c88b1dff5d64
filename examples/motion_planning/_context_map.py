"""Contextual coverage: one vehicle seeks a Gaussian shown to it as an image.

Paper App. B.3, "Contextual coverage and long-horizon planning". The context is
the start, the goal and a map $m$: a `res` x `res` image of a Gaussian of
standard deviation 2 over the workspace $[-5, 5]^2$, centred at one of the four
`CENTERS`. The cost is minus the map's mean value along the trajectory,
bilinearly interpolated at the positions. A small CNN reads the map into four
softmax weights, which join the start and goal at the input of the planner's
MLP; both are trained together through the projection. The two cases of the
paper are $H = 100$, `res = 1024`, $D = 4$ (a context of a million pixels) and
$H = 750$, `res = 64`, $D = 2$ (4504 variables per vehicle).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._model import FleetPlanner, raw_size
from ._problem import (
    M,
    Problem,
    context_features,
    make_projector,
    sample_contexts,
    split,
)

CENTERS = np.array([(-2.5, -2.5), (-2.5, 2.5), (2.5, -2.5), (2.5, 2.5)])
"""The four centres of the maps' Gaussian, as in the paper."""

MAP_STD = 2.0


def gaussian_map(
    center, res: int, *, std: float = MAP_STD, p_max: float = 5.0
) -> np.ndarray:
    """A map: $m[r, q] = \\exp(-\\|z_{rq} - c\\|^2 / (2 \\cdot 2^2))$ on the grid
    $z_{rq} = (x_q, y_r)$ of `res` uniformly spaced nodes per axis over
    $[-p_{max}, p_{max}]$ (nodes on both edges), row $r$ along $y$.

    **Arguments:**

    - `center`: $c$, `(2,)`.
    - `res`: the number of nodes per axis, at least 2.
    - `std`: the Gaussian's standard deviation.
    - `p_max`: the workspace's half-width.

    **Returns:** $m$, `(res, res)`, float64, peak 1 at $c$.
    """
    if res < 2:
        raise ValueError(f"gaussian_map(res={res}): need at least 2 nodes per axis.")
    grid = np.linspace(-p_max, p_max, res)
    dx = grid[None, :] - center[0]
    dy = grid[:, None] - center[1]
    return np.exp(-(dx**2 + dy**2) / (2.0 * std**2))


def map_value(m, p, p_max: float = 5.0):
    """The map's value at positions `p`, `(..., 2)`, by bilinear interpolation.

    Position $x$ falls at the fractional node index $u = (x + p_{max}) /
    (2 p_{max}) (\\mathrm{res} - 1)$ (clipped to the grid); the value is the
    average of the four surrounding nodes weighted by the opposite areas. It is
    differentiable in `p`, with the gradient of the interpolant.

    **Returns:** `p.shape[:-1]`.
    """
    res = m.shape[-1]
    u = jnp.clip((p + p_max) / (2.0 * p_max) * (res - 1), 0.0, res - 1)
    i0 = jnp.clip(jnp.floor(u), 0, res - 2).astype(jnp.int32)
    f = u - i0
    ix, iy = i0[..., 0], i0[..., 1]
    fx, fy = f[..., 0], f[..., 1]
    return (
        (1 - fx) * (1 - fy) * m[iy, ix]
        + fx * (1 - fy) * m[iy, ix + 1]
        + (1 - fx) * fy * m[iy + 1, ix]
        + fx * fy * m[iy + 1, ix + 1]
    )


def map_cost(Y, x, problem: Problem):
    """Minus the map's mean along the trajectories, $-\\frac{1}{N (T + 1)}
    \\sum_{i, t} m(p_i[t])$, in $[-1, 0]$; lower is closer to the Gaussian.

    **Arguments:**

    - `Y`: one fleet's trajectories, `(N, 6T + 4)`.
    - `x`: the backbone's input `(map, features)` (`MapTable`).
    - `problem`: the `Problem`.
    """
    p, _, _ = split(Y, problem)
    return -jnp.mean(map_value(x[0], p, problem.p_max))


class MapTable(eqx.Module):
    """The distinct maps, looked up inside the jitted step.

    The data set stores a map index per context, not a million-pixel image, and
    `train` and `predict` call this on a batch to form the backbone's inputs.
    The maps are passed as an argument (not closed over), so they are not baked
    into the compiled program as constants.

    **Arguments:**

    - `maps`: `(k, res, res)`.
    """

    maps: Float[Array, "k res res"]

    def __call__(self, x):
        """`(map_ids, features)` to `(maps[map_ids], features)`."""
        ids, features = x
        return self.maps[ids], features


def make_map_table(res: int, problem: Problem) -> MapTable:
    """The `MapTable` of the four `CENTERS` at resolution `res`, in JAX's
    default float type (float32, or float64 with x64 on)."""
    maps = np.stack([gaussian_map(c, res, p_max=problem.p_max) for c in CENTERS])
    return MapTable(jnp.asarray(maps, jnp.result_type(float)))


class MapBackbone(eqx.Module):
    """CNN on the map, then the MLP on its softmax weights and the start and goal.

    $f(m, s) = \\mathrm{MLP}([\\mathrm{softmax}(W \\phi(m) + b),\\ s])$, with
    $\\phi$ three ReLU convolutions of stride $D$ (16 features each), as in the
    paper; its output is the fleet's accelerations.

    **Arguments:**

    - `convs`: the convolutions, applied in order.
    - `head`: the linear layer from the flattened features to 4 logits.
    - `mlp`: the planner's MLP, from 4 weights plus the features to the
        accelerations.
    """

    convs: tuple[eqx.nn.Conv2d, ...]
    head: eqx.nn.Linear
    mlp: eqx.nn.MLP

    def weights(self, m: Float[Array, "res res"]) -> Float[Array, " 4"]:
        """The CNN's softmax weights for one map."""
        h = m[None]
        for conv in self.convs:
            h = jax.nn.relu(conv(h))
        return jax.nn.softmax(self.head(jnp.ravel(h)))

    def __call__(self, x):
        """Raw accelerations for one context `x = (map, features)`."""
        m, features = x
        return self.mlp(jnp.concatenate([self.weights(m), features]))


def make_map_backbone(
    problem: Problem,
    res: int,
    downsample: int,
    *,
    key,
    features: int = 16,
    width: int = 256,
    depth: int = 2,
    raw_from: str = "acceleration",
) -> MapBackbone:
    """The paper's map backbone.

    Each convolution has kernel and stride `downsample` (non-overlapping
    patches), so three of them shrink the map by $D^3$ per side.

    **Arguments:**

    - `problem`: the `Problem` (its $N T m$ accelerations are the output, or
        $N (6T + 4)$ numbers for `raw_from="trajectory"`, see `FleetPlanner`).
    - `res`: the map's side; a multiple of `downsample**3`.
    - `downsample`: $D$.
    - `key`: a JAX PRNG key.
    - `features`: channels of each convolution.
    - `width`, `depth`: the MLP's hidden layers.
    - `raw_from`: what the MLP predicts, as in `FleetPlanner`.
    """
    if downsample < 1 or res % downsample**3:
        raise ValueError(
            f"make_map_backbone(res={res}, downsample={downsample}): three layers "
            f"of stride D need res to be a multiple of D**3 = {downsample**3}; "
            f"pick res = {max(downsample**3, res // downsample**3 * downsample**3)}."
        )
    k = jax.random.split(key, 5)
    convs = tuple(
        eqx.nn.Conv2d(
            1 if i == 0 else features,
            features,
            downsample,
            stride=downsample,
            key=k[i],
        )  # fmt: skip
        for i in range(3)
    )
    side = res // downsample**3
    n = problem.n_vehicles
    head = eqx.nn.Linear(features * side * side, len(CENTERS), key=k[3])
    mlp = eqx.nn.MLP(
        len(CENTERS) + 2 * M * n, raw_size(problem, raw_from), width_size=width,
        depth=depth, activation=jax.nn.relu, key=k[4],
    )  # fmt: skip
    return MapBackbone(convs, head, mlp)


def make_map_planner(
    problem: Problem,
    *,
    res: int,
    downsample: int,
    width: int = 256,
    depth: int = 2,
    seed: int = 0,
    per_axis: bool = True,
    raw_from: str = "acceleration",
    **projector_settings,
) -> FleetPlanner:
    """The contextual-coverage planner: `MapBackbone` and the projector (one
    coordinate's, by default), as `FleetPlanner(backbone, projector, problem,
    per_axis, raw_from)`; `res`, `downsample`, `width`, `depth` and `raw_from`
    go to `make_map_backbone`, `seed` makes its key, and `**projector_settings`
    go to `make_projector`."""
    backbone = make_map_backbone(
        problem, res, downsample, key=jax.random.key(seed), width=width,
        depth=depth, raw_from=raw_from,
    )  # fmt: skip
    projector = make_projector(problem, per_axis=per_axis, **projector_settings)
    return FleetPlanner(backbone, projector, problem, per_axis, raw_from)


def sample_map_contexts(
    rng: np.random.Generator, n: int, problem: Problem
) -> tuple[Int[np.ndarray, " n"], np.ndarray, np.ndarray]:
    """Random contexts: a map index in `CENTERS`, uniformly, and a start and goal
    from `sample_contexts`.

    **Returns:** `(map_ids, starts, goals)`, `(n,)`, `(n, N, 2)`, `(n, N, 2)`.
    """
    starts, goals = sample_contexts(rng, n, problem)
    return rng.integers(len(CENTERS), size=n), starts, goals


def map_inputs(map_ids, starts, goals, problem: Problem):
    """The stored inputs `(map_ids, features)` for `MapTable`."""
    return jnp.asarray(map_ids), context_features(starts, goals, problem)
