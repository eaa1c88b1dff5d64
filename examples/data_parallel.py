"""Data-parallel training: the quickstart's DC3 network, each batch split across
all visible devices.

The network is the one of `examples/quickstart.py` (an MLP and a projector onto
{y : A y = x, G y <= h}). Its weights are replicated on every device, and each
batch of contexts is split along its leading axis with `pinet_eqx.shard_batch`:
every device projects its own instances, and the only communication of a step is
the all-reduce of the backbone's gradient, which `jax.jit` inserts by itself. The
script is the same on one CPU, on N virtual CPU devices and on N GPUs:

    python examples/data_parallel.py                      # every visible device
    XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
        python examples/data_parallel.py                  # 4 virtual CPU devices

On several hosts, start one copy per host with `--distributed`: it calls
`jax.distributed.initialize()` (which reads the cluster's environment, e.g.
SLURM), every process reads the same data, and each passes its own rows of every
batch to `shard_batch`. The global batch (`--batch-size`) must be a multiple of
the number of devices.

    python examples/data_parallel.py [--epochs 2] [--batch-size 64] [--out r.json]
"""

from __future__ import annotations

import argparse
import json
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import pinet_eqx as pe
from pinet_eqx.problems import dc3_objective, dc3_violation, make_dc3, solve_dc3_convex

try:  # run as a script, with examples/ on sys.path
    from quickstart import make_net, make_train_step
except ImportError:  # imported as examples.data_parallel
    from examples.quickstart import make_net, make_train_step


def local_rows(X):
    """This process's share of a global batch (all of it on one host)."""
    n = jax.process_count()
    rows = len(X) // n
    return X[jax.process_index() * rows : (jax.process_index() + 1) * rows]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=5e-4, help="Adam learning rate")
    parser.add_argument(
        "--batch-size", type=int, default=64, help="global batch, over all devices"
    )
    parser.add_argument("--n-train", type=int, help="default: all 7952 contexts")
    parser.add_argument("--n-test", type=int, default=1024)
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="call jax.distributed.initialize() first (one process per host)",
    )
    parser.add_argument("--out", help="if given, write the results to this JSON")
    args = parser.parse_args(argv)
    if args.distributed:
        jax.distributed.initialize()
    start = time.perf_counter()

    # One mesh axis, "data", over every device of every process.
    mesh = pe.data_mesh()
    print(
        f"{jax.device_count()} devices ({jax.devices()[0].device_kind}), "
        f"{jax.process_count()} process(es); global batch {args.batch_size}, "
        f"{args.batch_size // mesh.size} per device."
    )

    problem = make_dc3()
    X_train, _, X_test = problem.split(n_train=args.n_train, n_test=args.n_test)
    Q = jnp.asarray(problem.Q, jnp.float32)
    p = jnp.asarray(problem.p, jnp.float32)
    objective = jax.vmap(lambda y: dc3_objective(y, Q, p))

    net = make_net(problem, args.seed)
    params, static = eqx.partition(net, pe.trainable_filter(net))
    optim = optax.adam(args.lr)
    # The weights and the optimiser state, whole on every device.
    params = pe.replicate(mesh, params)
    opt_state = pe.replicate(mesh, optim.init(params))

    # The quickstart's step: the sharding of its inputs is all that makes it
    # data-parallel. The mean over the sharded batch becomes a local sum on each
    # device and one all-reduce, and so does the backbone's gradient.
    train_step = make_train_step(objective, optim)

    @eqx.filter_jit
    def evaluate(model, X, J_star):
        # Reduced to scalars on the devices, so that no process needs the others'
        # outputs.
        Y = jax.vmap(model)(X, b=X)
        rs = pe.relative_suboptimality(objective(Y), J_star)
        cv = jax.vmap(model.projector.violation)(Y, b=X)
        return jnp.mean(rs), jnp.max(cv), Y

    X_train = np.asarray(X_train, np.float32)
    rng = np.random.default_rng(args.seed)  # the same order in every process
    n_batches = len(X_train) // args.batch_size
    losses = []
    t_train = time.perf_counter()
    for epoch in range(args.epochs):
        order = rng.permutation(len(X_train))
        for i in range(n_batches):
            batch = X_train[order[i * args.batch_size : (i + 1) * args.batch_size]]
            X = pe.shard_batch(mesh, local_rows(batch))
            params, opt_state, loss = train_step(params, static, opt_state, X)
        losses.append(float(loss))
        print(f"epoch {epoch + 1}/{args.epochs}: last batch loss {losses[-1]:.4f}")
    train_s = time.perf_counter() - t_train

    # The test contexts, sharded the same way (their number must divide evenly).
    J_test = objective(jnp.asarray(solve_dc3_convex(problem, X_test), jnp.float32))
    X_t, J_t = pe.shard_batch(mesh, local_rows(np.asarray(X_test, np.float32)), J_test)
    model = eqx.nn.inference_mode(eqx.combine(params, static))
    rs_mean, cv_max, Y = evaluate(model, X_t, J_t)
    results = {
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "batch_size": args.batch_size,
        "losses": losses,
        "rs_mean": float(rs_mean),
        "cv_max": float(cv_max),
        "output_sharding": str(Y.sharding.spec),
        "train_s": train_s,
        "total_s": time.perf_counter() - start,
    }
    if jax.process_count() == 1:
        # Checked in float64 on the original data, independently of the projector.
        cv = dc3_violation(
            np.asarray(Y, np.float64), X_test, problem.A, problem.G, problem.h
        )
        results["cv_max_float64"] = float(cv.max())
    print(
        f"Test set, {len(X_test)} contexts: relative suboptimality mean "
        f"{results['rs_mean']:.2e}, constraint violation max {results['cv_max']:.1e}."
    )
    print(f"Training {train_s:.0f} s, total {results['total_s']:.0f} s.")
    if args.out is not None and jax.process_index() == 0:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), **results}, f, indent=2)
    return results


if __name__ == "__main__":
    main()
