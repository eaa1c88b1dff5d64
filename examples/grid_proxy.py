"""Train a DC optimal power flow proxy that never overloads a line.

For readers who know MATPOWER or pandapower. A proxy is a neural network that
maps the hour's bus loads to a generator dispatch, in a millisecond instead of
an OPF solve. Here its last layer is a projection onto the DC-OPF's feasible
set, so every dispatch it returns balances every bus and keeps every generator
and every line within its limits, whatever the weights, and the training loss
is simply the generation cost (no solver in the loop, no penalty weights).

The grid is MATPOWER's `case_ACTIVSg200` (200 buses, 38 units, 245 branches,
real ratings and quadratic costs) with one week of its 2017 hourly loads,
stored in `tests/data/activsg200.npz` (MATPOWER is not needed to read it). The
first five days train, the sixth validates, the seventh tests. The proxy is
checked against Clarabel's DC-OPF, saved with `pe.save`, loaded back and run.

    python examples/grid_proxy.py [--steps 400] [--out DIR]

It prints the test day's optimality gap against Clarabel and the largest line
loading and constraint violation, and takes about a minute on a laptop CPU.
"""

import argparse
import pathlib
import tempfile
import time

import clarabel
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.sparse as sp

import pinet_eqx as pe
from benchmarks.dcopf._activsg import load_fixture

FIXTURE = pathlib.Path(__file__).parent.parent / "tests" / "data" / "activsg200.npz"


def load_grid():
    r"""The grid and its hourly loads. The variables are $y = (p_g, \theta)$ in
    per unit: what `makeBdc` gives MATPOWER's DC model. `E y = q(p_d)` are the
    bus balances $A_g p_g - B_{bus} \theta = p_d + G_s$ and $\theta_{ref} = 0$;
    `C y` are the branch flows $B_f \theta$ (limits `flow_lower/upper`, from
    `RATE_A`); `lower <= y <= upper` are `PMIN`, `PMAX` (angles free)."""
    data, loads, hours = load_fixture(FIXTURE)
    return data.case, loads, hours


def make_net(hidden: int = 128, depth: int = 2, key=jax.random.key(0)):
    """The proxy: an MLP from the loads to $y_{raw}$, then the projection.

    Everything the skeleton needs comes from the fixture file and these sizes,
    so `pe.load` can rebuild it; the standardisation of the loads and the centre
    and scale of $y_{raw}$ are arrays inside the network (saved with it)."""
    case, loads, _ = load_grid()
    projector = pe.Projector(
        [
            pe.Equality(case.E, pe.Parameter("q")),  # the bus balances, per hour
            pe.AffineInequality(case.C, case.flow_lower, case.flow_upper),
            pe.Box(case.lower, case.upper),  # PMIN <= p_g <= PMAX
        ]
    )
    mlp = eqx.nn.MLP(case.n_bus, case.dim, hidden, depth, key=key)
    return pe.HardConstrainedNet(
        Backbone(mlp, *_scalings(case, loads[:120])), projector
    )


class Backbone(eqx.Module):
    """Standardised loads in, a dispatch and angles out (around a centre)."""

    mlp: eqx.nn.MLP
    x_mean: jax.Array
    x_std: jax.Array
    y_center: jax.Array
    y_scale: jax.Array

    def __call__(self, p_d):
        return self.y_center + self.y_scale * self.mlp((p_d - self.x_mean) / self.x_std)


def _scalings(case, train_loads):
    """Fixed scalings from the training hours: each bus's mean load and spread;
    the outputs start at PMIN plus an even share of the headroom, in steps of
    a tenth of each unit's range (angles: 0.1 rad)."""
    x_mean, x_std = train_loads.mean(0), train_loads.std(0)
    x_std = np.where(x_std > 1e-9, x_std, 1.0)
    share = (x_mean.sum() - case.p_min.sum()) / (case.p_max - case.p_min).sum()
    p0 = case.p_min + share * (case.p_max - case.p_min)
    y_center = np.concatenate([p0, np.zeros(case.n_bus)])
    y_scale = np.concatenate(
        [0.1 * (case.p_max - case.p_min) + 1e-3, np.full(case.n_bus, 0.1)]
    )
    return [jnp.asarray(a, jnp.float32) for a in (x_mean, x_std, y_center, y_scale)]


def train(net, case, loads, steps: int, seed: int = 0):
    """Adam on the dispatch cost of the projected outputs; the loads of the
    training hours get 3 % per-bus noise (only 120 hours to learn from)."""
    c2 = jnp.asarray(case.cost_quad, jnp.float32)
    c1 = jnp.asarray(case.cost_lin, jnp.float32)

    # The backbone's scalings stay fixed; the projector's data are frozen anyway.
    def frozen(m):
        return (
            m.backbone.x_mean,
            m.backbone.x_std,
            m.backbone.y_center,
            m.backbone.y_scale,
        )

    params, static = eqx.partition(net, pe.trainable_filter(net, frozen))
    optim = optax.adam(optax.cosine_decay_schedule(3e-3, steps, alpha=0.05))
    state = optim.init(params)

    def loss_fn(params, p_d, q):
        y = jax.vmap(lambda x, q: eqx.combine(params, static)(x, q=q))(p_d, q)
        p_g = y[:, : case.n_gen]
        return jnp.mean(jnp.sum(c2 * p_g**2 + c1 * p_g, axis=1))

    @eqx.filter_jit
    def step(params, state, p_d, q):
        value, grads = jax.value_and_grad(loss_fn)(params, p_d, q)
        updates, state = optim.update(grads, state, params)
        return eqx.apply_updates(params, updates), state, value

    rng = np.random.default_rng(seed)
    for k in range(steps):
        p_d = loads[rng.integers(0, len(loads), 32)]
        p_d = p_d * np.exp(rng.normal(0, 0.03, p_d.shape))
        x, q = jnp.asarray(p_d, jnp.float32), jnp.asarray(case.q(p_d), jnp.float32)
        params, state, value = step(params, state, x, q)
        if k % 100 == 0 or k == steps - 1:
            print(f"step {k:4d}  mean cost {float(value):.1f}")
    return eqx.combine(params, static)


def clarabel_dcopf(case, p_d):
    """The DC-OPF of one hour with Clarabel (tolerances 1e-8): the optimal cost."""
    n = case.dim
    finite = np.isfinite(case.upper)
    eye = sp.eye(n, format="csr")
    G = sp.vstack([case.C, -case.C, eye[finite], -eye[finite]], format="csc")
    h = np.concatenate(
        [case.flow_upper, -case.flow_lower, case.upper[finite], -case.lower[finite]]
    )
    P = sp.diags(np.concatenate([2 * case.cost_quad, np.zeros(case.n_bus)]))
    c = np.concatenate([case.cost_lin, np.zeros(case.n_bus)])
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = settings.tol_gap_rel = settings.tol_feas = 1e-8
    cones = [clarabel.ZeroConeT(case.E.shape[0]), clarabel.NonnegativeConeT(G.shape[0])]
    A = sp.vstack([case.E, G], format="csc")
    b = np.concatenate([case.q(p_d), h])
    solver = clarabel.DefaultSolver(sp.triu(P, format="csc"), c, A, b, cones, settings)
    solution = solver.solve()
    assert solution.status == clarabel.SolverStatus.Solved, solution.status
    p_g = np.asarray(solution.x)[: case.n_gen]
    return float(np.sum(case.cost_quad * p_g**2 + case.cost_lin * p_g))


def predict(net, case, loads):
    """The proxy's answers for a batch of hours, in inference mode: the
    projection's `ProjectionSolution`, whose `result` flags each hour."""
    net = eqx.nn.inference_mode(net)
    solve = jax.jit(jax.vmap(lambda x, q: net.projector.solve(net.backbone(x), q=q)))
    q = jnp.asarray(case.q(loads), jnp.float32)
    return solve(jnp.asarray(loads, jnp.float32), q)


def check(net, case, loads):
    """Test-day gaps against Clarabel, largest line loading and violation (MW)."""
    sol = predict(net, case, loads)
    y = np.asarray(sol.y, np.float64)
    p_g = y[:, : case.n_gen]
    cost = np.sum(case.cost_quad * p_g**2 + case.cost_lin * p_g, axis=1)
    best = np.array([clarabel_dcopf(case, p) for p in loads])
    gaps = (cost - best) / best
    flows = y @ case.C.T + case.f_shift
    violation = max(case.residuals(y[i], loads[i])[0] for i in range(len(y)))
    bounds = np.maximum(p_g - case.p_max, 0) + np.maximum(case.p_min - p_g, 0)
    print(f"test day: mean gap {100 * gaps.mean():.3f} %, max {100 * gaps.max():.3f} %")
    print(f"largest line loading {np.max(np.abs(flows) / case.f_max):.4f}")
    print(
        f"worst bus imbalance {violation * case.base_mva:.2e} MW, worst bound "
        f"violation {bounds.max() * case.base_mva:.2e} MW, every output "
        f"successful: {bool(np.all(sol.result == pe.RESULTS.successful))}"
    )
    return gaps, y


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    case, loads, hours = load_grid()
    train_hours, test_hours = np.arange(0, 120), np.arange(144, 168)
    start = time.perf_counter()
    net = train(make_net(), case, loads[train_hours], args.steps)
    print(f"trained in {time.perf_counter() - start:.0f} s (compilation included)")
    _, y = check(net, case, loads[test_hours])

    out = args.out or pathlib.Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    path = out / "grid_proxy.eqx"
    pe.save(path, net, {"hidden": 128, "depth": 2})
    loaded = pe.load(path, make_net)  # a skeleton rebuilt, then its arrays read
    y_loaded = np.asarray(predict(loaded, case, loads[test_hours]).y, np.float64)
    same = np.array_equal(y_loaded, y)
    print(f"saved to {path}; the loaded proxy reproduces the test day: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
