r"""The networks of the DC-OPF proxy benchmark, and the grid algebra their losses need.

Every method shares one backbone: an `eqx.nn.MLP` from the bus loads, standardised
with the training hours' mean and spread (`Standardised`). What follows it:

- **ours** (`pe.HardConstrainedNet`): the backbone proposes $y = (p_g, \theta)$
  around a centre, and the projection layer returns the nearest dispatch and
  angles that balance every bus and keep every line and generator within its
  limits.
- **E2ELR** (Chen, Tanneau and Van Hentenryck, "End-to-end feasible
  optimization proxies for large-scale economic dispatch", IEEE Trans. Power
  Syst. 2023, Sec. III): the backbone's outputs pass a sigmoid into the
  generator bounds, then the *power-balance repair layer*, a proportional
  response: if the dispatch falls short of the total load $D$, every unit
  moves the same fraction $\eta$ of the way to its maximum, and if it exceeds
  $D$, the same fraction of the way to its minimum, with $\eta$ chosen in
  closed form so that $\sum_g p_g = D$. Line limits are not enforced: the loss
  penalises overloads (`E2ELR` below).
- **MLP with penalties**: the backbone's output is the dispatch itself, and
  the loss penalises the power imbalance, the generator bounds and the
  overloads.

Line flows of a dispatch come from the PTDF (`ptdf`): with the reference bus as
slack, $C y = M (A_g p_g - q)$.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from jaxtyping import Array, Float

import pinet_eqx as pe

from ._fixture import GridCase
from ._projection import projector

METHODS = ("ours", "ours-dist", "ours-sup", "e2elr", "mlp")


class Scaling(eqx.Module):
    """Fixed input and output scalings of a backbone (never trained: they are
    kept from the optimiser by `frozen`, see `make_model`)."""

    x_mean: Float[Array, " n_in"]
    x_std: Float[Array, " n_in"]
    y_center: Float[Array, " n_out"]
    y_scale: Float[Array, " n_out"]


class Standardised(eqx.Module):
    r"""MLP between fixed scalings: $c + s \odot \mathrm{MLP}((x - \mu) / \sigma)$."""

    mlp: eqx.nn.MLP
    scaling: Scaling

    def __call__(self, x):
        s = self.scaling
        return s.y_center + s.y_scale * self.mlp((x - s.x_mean) / s.x_std)


class E2ELR(eqx.Module):
    """E2ELR's proxy: backbone, sigmoid into the bounds, power-balance repair.

    The repair (Sec. III-B of the paper) targets the total load `demand`, the
    sum of the equality right-hand side over the buses ($\\sum_i q_i$: loads
    plus the grid's fixed withdrawals)."""

    backbone: Standardised
    p_min: Float[Array, " n_gen"]
    p_max: Float[Array, " n_gen"]
    fixed: Float[Array, ""]

    def __call__(self, x):
        p = self.p_min + jax.nn.sigmoid(self.backbone(x)) * (self.p_max - self.p_min)
        return repair(p, self.p_min, self.p_max, jnp.sum(x) + self.fixed)


def repair(p, p_min, p_max, demand):
    r"""E2ELR's proportional response: $p + \eta (p_{max} - p)$ when $\sum p <
    D$, $p - \eta (p - p_{min})$ when $\sum p > D$, with $\eta \in [0, 1]$ the
    fraction that closes the gap (1 when it cannot be closed)."""
    short = demand - jnp.sum(p)
    room_up = jnp.sum(p_max - p)
    room_down = jnp.sum(p - p_min)
    # The `where`s keep a zero room from dividing by zero (and its gradient NaN).
    eta_up = jnp.clip(short / jnp.where(room_up > 0, room_up, 1.0), 0.0, 1.0)
    eta_down = jnp.clip(-short / jnp.where(room_down > 0, room_down, 1.0), 0.0, 1.0)
    return jnp.where(short >= 0, p + eta_up * (p_max - p), p - eta_down * (p - p_min))


def _reduced(case: GridCase) -> tuple[np.ndarray, sp.csc_matrix]:
    """`(keep, B_red)`: the buses other than the reference one, and $B_{bus}$
    restricted to them (the reference bus as slack)."""
    keep = np.flatnonzero(np.arange(case.n_bus) != case.ref_bus)
    B_bus = -case.E[: case.n_bus, case.n_gen :]
    return keep, sp.csc_matrix(B_bus[keep][:, keep])


def ptdf(case: GridCase) -> np.ndarray:
    """The `(n_branch, n_bus)` matrix $M$ with $C y = M (A_g p_g - q)$ for every
    $y$ that balances the buses, the reference bus as slack (its column zero)."""
    keep, B_red = _reduced(case)
    B_f = case.C[:, case.n_gen :].tocsc()[:, keep]
    M = np.zeros((case.n_branch, case.n_bus))
    M[:, keep] = spla.splu(B_red).solve(B_f.T.toarray()).T
    return M


def injections_matrix(case: GridCase) -> np.ndarray:
    """`A_g`, `(n_bus, n_gen)`: the bus of each generator."""
    return case.E[: case.n_bus, : case.n_gen].toarray()


def center(case: GridCase, mean_load: np.ndarray) -> np.ndarray:
    """A starting point for the raw outputs, from no solver: the dispatch that
    shares the mean total load in proportion to each unit's range (E2ELR's
    repair of the lower bounds), and the DC power flow's angles for it."""
    q = case.q(mean_load)[: case.n_bus]
    p = np.asarray(
        repair(case.p_min, case.p_min, case.p_max, float(np.sum(q))), np.float64
    )
    keep, B_red = _reduced(case)
    theta = np.zeros(case.n_bus)
    theta[keep] = spla.spsolve(B_red, (injections_matrix(case) @ p - q)[keep])
    return np.concatenate([p, theta])


def make_model(
    case: GridCase,
    method: str,
    *,
    width: int,
    depth: int,
    key,
    scaling: dict | None = None,
):
    """The untrained float32 network of `method` for `case` (an MLP of `depth`
    hidden layers of `width`, initialised from `key`) and the `frozen` selector for
    `pe.trainable_filter`. It maps one hour's loads to $y$ (ours, called with `q=`)
    or to $p_g$ (E2ELR, MLP). `scaling` holds `x_mean`, `x_std`, `y_center`,
    `y_scale` (`None`: placeholders, for `pe.load`'s skeleton).
    """
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}, not {method!r}.")
    n_out = case.dim if method.startswith("ours") else case.n_gen
    if scaling is None:
        scaling = dict(
            x_mean=np.zeros(case.n_bus),
            x_std=np.ones(case.n_bus),
            y_center=np.zeros(n_out),
            y_scale=np.ones(n_out),
        )
    f32 = {k: jnp.asarray(v, jnp.float32) for k, v in scaling.items()}
    mlp = eqx.nn.MLP(case.n_bus, n_out, width, depth, activation=jax.nn.relu, key=key)
    backbone = Standardised(mlp, Scaling(**f32))
    if method.startswith("ours"):
        net = pe.HardConstrainedNet(backbone, projector(case))
        return net, lambda m: m.backbone.scaling
    if method == "e2elr":
        model = E2ELR(
            backbone,
            jnp.asarray(case.p_min, jnp.float32),
            jnp.asarray(case.p_max, jnp.float32),
            jnp.asarray(np.sum(case.p_fixed), jnp.float32),
        )
        return model, lambda m: (m.backbone.scaling, m.p_min, m.p_max, m.fixed)
    return backbone, lambda m: m.scaling


def scalings(case: GridCase, method: str, train_loads, train_optima=None) -> dict:
    """The fixed scalings of `method`'s backbone from the training hours.

    Inputs: the loads' mean and standard deviation per bus (1 where a bus's load
    never changes). Outputs: logits around 0 for E2ELR; otherwise around
    `center` (or the mean optimum, for the supervised recipe), in steps of a
    tenth of each unit's range and of the angles' spread.
    """
    x_mean = train_loads.mean(axis=0)
    x_std = train_loads.std(axis=0)
    x_std = np.where(x_std > 1e-9 * max(float(x_std.max()), 1.0), x_std, 1.0)
    if method == "e2elr":
        out = dict(y_center=np.zeros(case.n_gen), y_scale=np.ones(case.n_gen))
    else:
        y_c = center(case, x_mean)
        if method == "ours-sup" and train_optima is not None:
            y_c = np.asarray(train_optima, np.float64).mean(axis=0)
        p_scale = 0.1 * np.maximum(case.p_max - case.p_min, 1e-3)
        theta_scale = np.full(case.n_bus, 0.1 * max(np.std(y_c[case.n_gen :]), 1e-3))
        y_scale = np.concatenate([p_scale, theta_scale])
        if method == "mlp":
            y_c, y_scale = y_c[: case.n_gen], p_scale
        out = dict(y_center=y_c, y_scale=y_scale)
    return dict(x_mean=x_mean, x_std=x_std, **out)
