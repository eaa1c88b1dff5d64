"""Quickstart: train a network whose outputs always satisfy hard linear constraints.

The task is the convex DC3 benchmark (Donti, Rolnick and Kolter, 2021). Each context
x in R^50 defines a quadratic programme: minimise 1/2 y'Qy + p'y over y in R^100
subject to A y = x and G y <= h. An MLP maps x to a raw guess, and a
`pinet_eqx.Projector` maps that guess onto {y : A y = x, G y <= h}, so every output
is feasible by construction. Training is self-supervised: the loss is the objective
itself, and no solver is needed. At the end, the test contexts are compared with
the optima that OSQP computes.

    python examples/quickstart.py [--epochs 10] [--seed 0] [--out results.json]
"""

import argparse
import json
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import pinet_eqx as pe
from pinet_eqx.problems import dc3_objective, dc3_violation, make_dc3, solve_dc3_convex


def make_net(problem, seed: int) -> pe.HardConstrainedNet:
    """The DC3 network: an MLP from the context x to a raw guess, projected onto
    {y : A y = x, G y <= h}."""
    # The context x is the right-hand side of A y = x: a Parameter, passed per call.
    projector = pe.Projector(
        [
            pe.Equality(problem.A, pe.Parameter("b")),
            pe.AffineInequality(problem.G, upper=problem.h),
        ],
        n_iter=50,  # Douglas-Rachford iterations while training...
        n_iter_test=100,  # ...and in inference mode, for a smaller violation.
    )
    backbone = eqx.nn.MLP(
        in_size=problem.n_eq,
        out_size=problem.n_var,
        width_size=200,
        depth=2,
        activation=jax.nn.relu,
        key=jax.random.key(seed),
    )
    return pe.HardConstrainedNet(backbone, projector)


def make_train_step(objective, optim):
    """The jitted training step: the mean objective of the projected outputs on a
    batch of contexts $X$ (each context is also the equality's right-hand side
    $b = x$), and one `optim` update of the trainable part.

    **Returns:** `train_step(params, static, opt_state, X) -> (params, opt_state,
    loss)`.
    """

    def loss_fn(params, static, X):
        model = eqx.combine(params, static)
        return jnp.mean(objective(jax.vmap(model)(X, b=X)))

    @eqx.filter_jit
    def train_step(params, static, opt_state, X):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(params, static, X)
        updates, opt_state = optim.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    return train_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the initialisation and batches"
    )
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam learning rate")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", help="if given, write the test metrics to this JSON")
    args = parser.parse_args()
    start = time.perf_counter()

    # The published DC3 data: 7952 training, 1024 validation and 1024 test contexts.
    problem = make_dc3()
    X_train, X_valid, X_test = problem.split()
    X_valid = X_valid[:256]  # enough for a live validation curve
    Q = jnp.asarray(problem.Q, jnp.float32)
    p = jnp.asarray(problem.p, jnp.float32)
    objective = jax.vmap(lambda y: dc3_objective(y, Q, p))

    print("Solving the validation and test contexts with OSQP, for reference...")
    J_valid = objective(jnp.asarray(solve_dc3_convex(problem, X_valid), jnp.float32))
    t = time.perf_counter()
    J_test = objective(jnp.asarray(solve_dc3_convex(problem, X_test), jnp.float32))
    osqp_time = time.perf_counter() - t

    net = make_net(problem, args.seed)
    projector = net.projector

    # Only the backbone is trained; the projector's factorisation stays fixed.
    params, static = eqx.partition(net, pe.trainable_filter(net))
    optim = optax.adam(args.lr)
    opt_state = optim.init(params)

    train_step = make_train_step(objective, optim)

    @eqx.filter_jit
    def predict(model, X):
        return jax.vmap(model)(X, b=X)

    def evaluate(params, X, J_star):
        # Inference mode: the projector runs n_iter_test iterations.
        model = eqx.nn.inference_mode(eqx.combine(params, static))
        Y = predict(model, X)
        rs = pe.relative_suboptimality(objective(Y), J_star)
        cv = jax.vmap(projector.violation)(Y, b=X)
        return model, Y, rs, cv

    X_train_j, X_valid_j, X_test_j = (
        jnp.asarray(X, jnp.float32) for X in (X_train, X_valid, X_test)
    )
    rng = np.random.default_rng(args.seed)
    n_batches = len(X_train) // args.batch_size
    bar = tqdm(total=args.epochs * n_batches, unit="step")
    val = ""
    for epoch in range(args.epochs):
        bar.set_description(f"epoch {epoch + 1}/{args.epochs}")
        order = rng.permutation(len(X_train))
        for i in range(n_batches):
            batch = X_train_j[order[i * args.batch_size : (i + 1) * args.batch_size]]
            params, opt_state, loss = train_step(params, static, opt_state, batch)
            bar.update()
            if i % 50 == 0:
                bar.set_postfix_str(f"loss {float(loss):.3f}{val}", refresh=False)
        _, _, rs, cv = evaluate(params, X_valid_j, J_valid)
        val = f", val RS {float(rs.mean()):.1e}, val CV {float(cv.max()):.0e}"
        bar.set_postfix_str(f"loss {float(loss):.3f}{val}")
    bar.close()

    # Test: relative suboptimality against OSQP and the violation, checked in
    # float64 on the original data, independently of the projector.
    test_net, Y, rs, _ = evaluate(params, X_test_j, J_test)
    rs = np.asarray(rs)
    Y = np.asarray(Y, np.float64)
    cv = dc3_violation(Y, X_test, problem.A, problem.G, problem.h)
    optimal = (cv <= 1e-3) & (rs <= 0.05)

    # Inference time of the jitted network (compiled above by `evaluate`).
    times = []
    for _ in range(20):
        t = time.perf_counter()
        predict(test_net, X_test_j).block_until_ready()
        times.append(time.perf_counter() - t)

    results = {
        "rs_mean": float(rs.mean()),
        "rs_max": float(rs.max()),
        "cv_max": float(cv.max()),
        "optimal_fraction": float(optimal.mean()),
        "batch_inference_s": float(np.median(times)),
        "osqp_s": osqp_time,
        "total_s": time.perf_counter() - start,
    }
    print(f"Test set, {len(X_test)} contexts:")
    print(f"  relative suboptimality   mean {rs.mean():.2e}, max {rs.max():.2e}")
    print(f"  constraint violation     max {cv.max():.1e}")
    print(f"  optimal (CV <= 1e-3 and RS <= 5%): {100 * optimal.mean():.1f}%")
    print(
        f"  inference, batch of {len(X_test)}: "
        f"{1e3 * results['batch_inference_s']:.1f} ms (median of {len(times)} runs)"
    )
    print(f"  OSQP, one context at a time: {osqp_time:.1f} s")
    print(f"Total time {results['total_s']:.0f} s.")
    if args.out is not None:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), **results}, f, indent=2)


if __name__ == "__main__":
    main()
