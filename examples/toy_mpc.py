"""Toy MPC: learn a model-predictive controller whose plans satisfy hard constraints.

The paper's App. A. A 2-D single integrator x_{k+1} = x_k + u_k is steered towards
the target (3, -12), which lies outside the state box [-10, 10]^2, with inputs in
[-1, 1]^2, over N = 20 steps. The plan y = (x_0, ..., x_20, u_0, ..., u_19) in R^82
minimises J(y) = sum_{k=0}^{N} |x_k - target|^2 + sum_{k=0}^{N-1} |u_k|^2 subject to
x_0 = the context (the initial state), the dynamics and the boxes (`--paper-sum`
stops the state sum at N - 1, as the paper does; see `cost`). An MLP maps the
initial state to a raw plan and a `pinet_eqx.Projector` makes it feasible; training
is self-supervised on J. The comparison is the same MLP trained without projection
on J + lambda (EQCV + INEQCV), for lambda = 1 and 0.001. All are scored against
OSQP on test initial states, and their plans from one initial state are plotted
like the paper's figure.

    python examples/toy_mpc.py [--epochs 50] [--n-test 1000] [--seed 0] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import pinet_eqx as pe

HORIZON = 20
TARGET = np.array([3.0, -12.0])
STATE_BOUND = 10.0
INPUT_BOUND = 1.0
N_STATES = 2 * (HORIZON + 1)
N_VAR = N_STATES + 2 * HORIZON  # 82
FIGURE_STATE = np.array([-8.0, 8.0])  # the initial state of the figure's main panel


def split(y):
    """States `(..., N + 1, 2)` and inputs `(..., N, 2)` of plans `y`, `(..., 82)`."""
    lead = y.shape[:-1]
    states = y[..., :N_STATES].reshape(*lead, HORIZON + 1, 2)
    inputs = y[..., N_STATES:].reshape(*lead, HORIZON, 2)
    return states, inputs


def cost(y, terminal=True):
    """$J(y) = \\sum_{k=0}^{N} \\|x_k - \\hat x\\|^2 + \\sum_{k=0}^{N-1}
    \\|u_k\\|^2$ of plans `y`, `(..., 82)`, NumPy or JAX.

    With `terminal=False` the state sum stops at $k = N - 1$, as in the paper
    (App. A). Then $x_N$ enters the problem only through $x_N = x_{N-1} + u_{N-1}$,
    and a network whose raw $x_N$ lands far away gets $u_{N-1}$ pinned to its
    bound, where the projection's Jacobian in that direction is zero, so the cost
    cannot pull it back. With the defaults that gives mean RS 2.2e-3, against
    7.8e-6 with the terminal term (in a 30-epoch run, 99% of the gap was
    $\\|u_{N-1}\\|^2$).
    """
    states, inputs = split(y)
    # The target gets the rank of `states`, for `jax_numpy_rank_promotion="raise"`.
    target = TARGET.reshape((1,) * (states.ndim - 1) + (2,))
    tracked = states if terminal else states[..., :HORIZON, :]
    tracking = ((tracked - target) ** 2).sum((-2, -1))
    return tracking + (inputs**2).sum((-2, -1))


def violations(y, x0):
    """(EQCV, INEQCV) of plans `y`, `(..., 82)`, for initial states `x0`, `(..., 2)`:
    the largest violation of $x_0 = \\mathrm{x}$ and of the dynamics, and of the
    state and input boxes. Written from the problem statement, not from the
    constraint matrices, so it checks them; NumPy or JAX."""
    xp = jnp if isinstance(y, jax.Array) else np
    states, inputs = split(y)
    eq = xp.concatenate(
        [
            xp.abs(states[..., 0, :] - x0),
            xp.abs(states[..., 1:, :] - states[..., :-1, :] - inputs).reshape(
                *y.shape[:-1], 2 * HORIZON
            ),
        ],
        axis=-1,
    ).max(-1)
    ineq = xp.maximum(
        (xp.abs(states) - STATE_BOUND).max((-2, -1)),
        (xp.abs(inputs) - INPUT_BOUND).max((-2, -1)),
    )
    return eq, xp.maximum(ineq, 0.0)


def problem_data():
    """The constraints as matrices: `(E0, E_dyn, lower, upper)` with
    $x_0 = E_0 y$, dynamics $E_{dyn} y = 0$ (rows $x_{k+1} - x_k - u_k$) and the
    box $\\mathrm{lower} \\le y \\le \\mathrm{upper}$."""
    E0 = np.zeros((2, N_VAR))
    E0[:, :2] = np.eye(2)
    E_dyn = np.zeros((2 * HORIZON, N_VAR))
    for k in range(HORIZON):
        rows = slice(2 * k, 2 * k + 2)
        E_dyn[rows, 2 * (k + 1) : 2 * (k + 2)] = np.eye(2)  # x_{k+1}
        E_dyn[rows, 2 * k : 2 * k + 2] = -np.eye(2)  # - x_k
        E_dyn[rows, N_STATES + 2 * k : N_STATES + 2 * k + 2] = -np.eye(2)  # - u_k
    upper = np.concatenate(
        [np.full(N_STATES, STATE_BOUND), np.full(2 * HORIZON, INPUT_BOUND)]
    )
    return E0, E_dyn, -upper, upper


def make_projector(n_iter=100, n_iter_test=1000, sigma=0.01):
    """The projector onto the feasible plans; the initial state is the parameter
    `x0`.

    `pe.autotune` on 150 random raw plans picks sigma = 0.0102 and 100 iterations
    (the default `"auto"` sigma, 0.026, needs over twice as many). Trained nets put
    their raw plans far outside the box, where Douglas-Rachford is slower, so
    inference runs 1000 iterations (0.3-0.4 s a batch of 1000 on a 2-core CPU; it
    brings the violation from about 3e-3 at 300 iterations to 5e-6);
    `refine=True` polishes the equalities in float32.
    """
    E0, E_dyn, lower, upper = problem_data()
    constraints = [
        pe.Equality(E0, pe.Parameter("x0")),
        pe.Equality(E_dyn, np.zeros(2 * HORIZON)),
        pe.Box(lower, upper),
    ]
    return pe.Projector(
        constraints,
        sigma=sigma,
        n_iter=n_iter,
        n_iter_test=n_iter_test,
        refine=True,
    )


def make_mlp(key):
    """The paper's backbone: 2 -> 200 -> 200 -> 82, ReLU."""
    return eqx.nn.MLP(
        2, N_VAR, width_size=200, depth=2, activation=jax.nn.relu, key=key
    )


def solve_osqp(X0, terminal=True, eps=1e-9):
    """Optimal plans for the initial states `X0`, `(n, 2)`, by OSQP (polished).

    The quadratic programme is $\\tfrac12 y^\\top P y + q^\\top y$ with
    $P = 2\\,\\mathrm{diag}(w)$, $w = 1$ on the tracked states and the inputs
    ($w = 0$ on $x_N$ when not `terminal`), and $q = -2 (\\hat x, \\dots, \\hat x,
    0, \\dots)$ on the tracked states: $J(y)$ of `cost(y, terminal)` less a constant.
    Set up once; only the bounds of $x_0 = \\mathrm{x}$ change between initial
    states. Returns `(Y, seconds)`.
    """
    import osqp
    import scipy.sparse as sp

    tracked = HORIZON + 1 if terminal else HORIZON
    E0, E_dyn, lower, upper = problem_data()
    weight = np.ones(N_VAR)
    weight[2 * tracked : N_STATES] = 0.0
    q = np.zeros(N_VAR)
    q[: 2 * tracked] = -2.0 * np.tile(TARGET, tracked)
    A = sp.csc_matrix(np.concatenate([E0, E_dyn, np.eye(N_VAR)]))
    lo = np.concatenate([np.zeros(2 + 2 * HORIZON), lower])
    up = np.concatenate([np.zeros(2 + 2 * HORIZON), upper])
    qp = osqp.OSQP()
    qp.setup(
        sp.diags(2.0 * weight, format="csc"),
        q,
        A,
        lo,
        up,
        eps_abs=eps,
        eps_rel=eps,
        max_iter=1_000_000,
        polishing=True,
        verbose=False,
    )
    Y = np.empty((len(X0), N_VAR))
    start = time.perf_counter()
    for i, x0 in enumerate(np.asarray(X0, np.float64)):
        lo[:2] = up[:2] = x0
        qp.update(l=lo, u=up)
        result = qp.solve(raise_error=False)
        if result.info.status != "solved":
            raise RuntimeError(
                f"OSQP stopped with status '{result.info.status}' on initial state "
                f"{i} ({x0}) in `solve_osqp`; try a larger `eps`."
            )
        Y[i] = result.x
    return Y, time.perf_counter() - start


def sample_states(rng, n):
    """`n` initial states drawn uniformly from the state box."""
    return rng.uniform(-STATE_BOUND, STATE_BOUND, size=(n, 2))


def hard_net(key, **projector_settings):
    """Ours: the MLP followed by the projection."""
    return pe.HardConstrainedNet(make_mlp(key), make_projector(**projector_settings))


def predict(model, X0):
    """Plans of `model` (a `HardConstrainedNet` or a bare MLP) for `X0`, `(n, 2)`."""
    X0 = jnp.asarray(X0)
    inputs = X0 / STATE_BOUND  # the network sees the state scaled to [-1, 1]^2
    if isinstance(model, pe.HardConstrainedNet):
        return jax.vmap(lambda s, x0: model(s, x0=x0))(inputs, X0)
    return jax.vmap(model)(inputs)


def loss_fn(model, X0, lam=None, terminal=True):
    """Mean cost of the batch; `lam` adds the soft penalty lam (EQCV + INEQCV)."""
    Y = predict(model, X0)
    loss = cost(Y, terminal)
    if lam is not None:
        eq, ineq = violations(Y, X0)
        loss = loss + lam * (eq + ineq)
    return jnp.mean(loss)


def train(model, X_train, *, epochs, lr, batch_size, seed, desc="train", **loss_args):
    """Train `model` with Adam (cosine decay) on `loss_fn(..., **loss_args)`.

    Only the trainable arrays (`pe.trainable_filter`) reach the optimiser.
    Returns `(model, seconds, skipped)`: the training time, compilation
    included, and the number of steps skipped for a non-finite gradient.
    """
    params, static = eqx.partition(model, pe.trainable_filter(model))
    n_batches = max(len(X_train) // batch_size, 1)
    schedule = optax.cosine_decay_schedule(lr, epochs * n_batches, alpha=0.01)
    # A non-finite gradient skips its step instead of ruining the weights; such
    # steps are counted and reported.
    optim = optax.apply_if_finite(optax.adam(schedule), max_consecutive_errors=10)
    opt_state = optim.init(params)

    @eqx.filter_jit
    def step(params, opt_state, X0):
        def f(params):
            return loss_fn(eqx.combine(params, static), X0, **loss_args)

        loss, grads = jax.value_and_grad(f)(params)
        updates, opt_state = optim.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    X_train = jnp.asarray(X_train)
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    with tqdm(total=epochs * n_batches, desc=desc, unit="step") as bar:
        for _ in range(epochs):
            order = rng.permutation(len(X_train))
            for i in range(n_batches):
                batch = X_train[order[i * batch_size : (i + 1) * batch_size]]
                params, opt_state, loss = step(params, opt_state, batch)
                bar.update()
            bar.set_postfix_str(f"loss {float(loss):.2f}")
    seconds = time.perf_counter() - start
    return eqx.combine(params, static), seconds, int(opt_state.total_notfinite)


def evaluate(model, X0, J_star, terminal=True):
    """Test metrics of `model`'s plans (in inference mode) against the optima.

    Returns `(metrics, Y)`: `score`'s metrics and the median time of a batch.
    """
    model = eqx.nn.inference_mode(model)
    run = eqx.filter_jit(predict)
    Y = np.asarray(run(model, X0).block_until_ready(), np.float64)
    times = []
    for _ in range(10):
        t = time.perf_counter()
        run(model, X0).block_until_ready()
        times.append(time.perf_counter() - t)
    metrics = score(Y, X0, J_star, terminal)
    metrics["batch_inference_s"] = float(np.median(times))
    return metrics, Y


def score(Y, X0, J_star, terminal=True):
    """RS and CV metrics of plans `Y` (NumPy, float64) against optimal costs.

    RS is $(J(y) - J^\\star) / |J^\\star|$: `rs_*` clip it at 0
    (`pe.relative_suboptimality`, the paper's definition) and `rs_signed_mean`
    does not, so that an infeasible plan cheaper than the optimum shows. CV is
    max(EQCV, INEQCV), from `violations`, in float64.
    """
    J = cost(Y, terminal)
    gap = (J - J_star) / np.abs(J_star)
    rs = np.asarray(pe.relative_suboptimality(J, J_star))
    eq, ineq = violations(Y, np.asarray(X0, np.float64))
    cv = np.maximum(eq, ineq)
    return {
        "rs_mean": float(rs.mean()),
        "rs_median": float(np.median(rs)),
        "rs_max": float(rs.max()),
        "rs_signed_mean": float(gap.mean()),
        "cv_max": float(cv.max()),
        "cv_mean": float(cv.mean()),
        "eqcv_max": float(eq.max()),
        "ineqcv_max": float(ineq.max()),
        "pct_cv_le_1e-3": float(100.0 * (cv <= 1e-3).mean()),
    }


SOLVER = "Solver (OSQP)"
OURS = "Ours (projection)"


def soft_label(lam):
    return f"Soft, λ = {lam:g}"


def plot(path, plans, x0, extra=None):
    """The paper-style figure: state trajectories from `x0` for each method.

    `plans` maps a label to its plan, `(82,)`; the legend gives each plan's
    constraint violation. `extra`, if given, is `(X0, {label: plans})` for a second
    panel with more initial states.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {
        SOLVER: dict(color="black", ls="-", marker="x", lw=3, ms=6),
        OURS: dict(color="tab:blue", ls="--", marker="o", lw=1.5, ms=3),
    }
    soft_styles = [
        dict(color="tab:orange", marker="^"),
        dict(color="tab:green", marker="v"),
        dict(color="tab:purple", marker="D"),
        dict(color="tab:brown", marker="s"),
    ]
    soft = [label for label in plans if label not in styles]
    for label, style in zip(soft, soft_styles * len(soft)):
        styles[label] = dict(ls="-", lw=1, ms=5, zorder=4, **style)
    n_panels = 1 if extra is None else 2
    fig, axes = plt.subplots(1, n_panels, figsize=(5.5 * n_panels, 6), squeeze=False)

    def frame(ax):
        b = STATE_BOUND
        ax.plot([-b, b, b, -b, -b], [-b, -b, b, b, -b], "r--", lw=1, label="state box")
        # Under the plans: the soft networks' plans gather on the target.
        ax.plot(*TARGET, "*", color="gold", mec="k", ms=16, label="target", zorder=1)
        ax.set_aspect("equal")
        ax.set_xlim(-11.5, 11.5)
        ax.set_ylim(-14, 11)
        ax.set_xlabel("$x_1$")
        ax.set_ylabel("$x_2$")

    ax = axes[0, 0]
    frame(ax)
    for label, y in plans.items():
        states, _ = split(np.asarray(y))
        cv = max(violations(np.asarray(y), x0))
        label_cv = f"{label}, CV {cv:.0e}" if cv > 1e-9 else label
        ax.plot(states[:, 0], states[:, 1], label=label_cv, **styles[label])
    ax.plot(*x0, "s", color="k", mfc="none", ms=10, label="initial state", zorder=5)
    ax.set_title("Plans from one initial state")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8)
    if extra is not None:
        X0, more = extra
        ax = axes[0, 1]
        frame(ax)
        for label, Y in more.items():
            for i, y in enumerate(Y):
                states, _ = split(np.asarray(y))
                label_i = label if i == 0 else None
                ax.plot(states[:, 0], states[:, 1], label=label_i, **styles[label])
        ax.plot(X0[:, 0], X0[:, 1], "s", color="k", mfc="none", ms=8)
        ax.set_title("Ours and the solver, more initial states")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--n-train", type=int, default=4096, help="training states")
    parser.add_argument("--n-test", type=int, default=1000, help="test states")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    parser.add_argument(
        "--lambdas",
        type=float,
        nargs="+",
        default=[1.0, 0.001],
        help="soft-penalty weights of the unprojected networks",
    )
    parser.add_argument(
        "--paper-sum",
        action="store_true",
        help="sum the state cost over k = 0..N-1 as in the paper, not k = 0..N",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/toy_mpc", help="output folder")
    return parser.parse_args(argv)


def main(argv=None):
    """Run the example; returns the summary written to JSON, the test states and
    every method's test plans (for the tests)."""
    args = parse_args(argv)
    terminal = not args.paper_sum
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    X_train = sample_states(rng, args.n_train)
    X_test = sample_states(rng, args.n_test)

    print(f"Solving {args.n_test} test problems with OSQP...")
    Y_star, osqp_s = solve_osqp(X_test, terminal)
    J_star = cost(Y_star, terminal)

    # One initialisation for every network: the comparison is the training.
    init = hard_net(jax.random.key(args.seed))
    settings = dict(
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        terminal=terminal,
    )
    models = {OURS: train(init, X_train, desc="ours", **settings)}
    for lam in args.lambdas:
        models[soft_label(lam)] = train(
            init.backbone, X_train, lam=lam, desc=f"soft λ={lam:g}", **settings
        )

    results = {SOLVER: {**score(Y_star, X_test, J_star, terminal), "solve_s": osqp_s}}
    test_plans = {SOLVER: Y_star}
    for label, (model, seconds, skipped) in models.items():
        metrics, Y = evaluate(model, X_test, J_star, terminal)
        results[label] = {**metrics, "train_s": seconds, "skipped_steps": skipped}
        test_plans[label] = Y

    # The figure: every method from one initial state, and ours against the
    # solver from the first few test states.
    x0 = FIGURE_STATE[None]
    plans = {SOLVER: solve_osqp(x0, terminal)[0][0]}
    for label, (model, _, _) in models.items():
        test_model = eqx.nn.inference_mode(model)
        plans[label] = np.asarray(eqx.filter_jit(predict)(test_model, x0))[0]
    n_more = min(6, args.n_test)
    more = {label: test_plans[label][:n_more] for label in (SOLVER, OURS)}
    png = os.path.join(args.out, "toy_mpc.png")
    plot(png, plans, FIGURE_STATE, extra=(X_test[:n_more], more))

    state_sum = "N" if terminal else "N-1"
    summary = {
        "args": vars(args),
        "problem": {
            "horizon": HORIZON,
            "n_var": N_VAR,
            "target": TARGET.tolist(),
            "cost": f"sum_(k=0..{state_sum}) |x_k - target|^2 + sum_(k=0..N-1) |u_k|^2",
            "J_star_mean": float(J_star.mean()),
        },
        "results": results,
        "dtype": str(jnp.asarray(0.0).dtype),
        "jax": jax.__version__,
        "machine": f"{platform.machine()} {platform.processor()}".strip(),
        "total_s": time.perf_counter() - start,
    }
    with open(os.path.join(args.out, "toy_mpc.json"), "w") as f:
        json.dump(summary, f, indent=2)

    print(f"Test set, {args.n_test} initial states:")
    print(f"  {'method':<20} {'mean RS':>9} {'CV<=1e-3':>9} {'max CV':>9} {'train':>7}")
    for label, m in results.items():
        train_s = f"{m['train_s']:.0f} s" if "train_s" in m else "-"
        print(
            f"  {label:<20} {m['rs_mean']:9.2e} {m['pct_cv_le_1e-3']:8.1f}% "
            f"{m['cv_max']:9.1e} {train_s:>7}"
        )
    print(
        f"Wrote {args.out}/toy_mpc.json and toy_mpc.png ({summary['total_s']:.0f} s)."
    )
    return {"summary": summary, "X_test": X_test, "plans": test_plans}


if __name__ == "__main__":
    main()
