"""Fine-tuning: give a pretrained network hard constraints, then train through them.

A network trained without constraints can be made feasible after the fact by
appending a projection layer, but its outputs were never meant to be projected, so
the result is suboptimal (the paper's "Pinet-inf", App. H.4). This example starts
from such a network and fine-tunes it through the projection.

1. Pretrain an MLP on the convex DC3 problem (minimise 1/2 y'Qy + p'y subject to
   A y = x and G y <= h, as in `quickstart.py`) with a soft penalty:
   loss = objective + lambda (|A y - x|^2 + |max(G y - h, 0)|^2).
2. Wrap it in `pinet_eqx.HardConstrainedNet` with a `Projector`. This alone is
   Pinet-inf: feasible, but suboptimal.
3. Freeze the first layer (`trainable_filter(net, frozen=...)`) and fine-tune the
   other layers through the projection, on the objective alone.

It reports the relative suboptimality (RS, against OSQP) and constraint violation
(CV, in float64 on the original data) of the raw MLP, of Pinet-inf and of the
fine-tuned network; and, for comparison, of the same network trained through the
projection from a random initialisation for as many epochs (`--no-scratch` skips
it). It writes `metrics.json` and `finetune.png` (validation RS during training)
to `--out`.

    python examples/finetune.py [--pretrain-epochs 50] [--finetune-epochs 10]
        [--seed 0] [--out results/finetune]
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import pinet_eqx as pe
from pinet_eqx.problems import dc3_objective, dc3_violation, make_dc3, solve_dc3_convex

DTYPE = jnp.float32


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-epochs", type=int, default=50)
    parser.add_argument("--finetune-epochs", type=int, default=10)
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the initialisation and batches"
    )
    parser.add_argument("--out", default="results/finetune", help="output folder")
    parser.add_argument(
        "--penalty", type=float, default=10.0, help="soft-penalty weight lambda"
    )
    parser.add_argument("--pretrain-lr", type=float, default=1e-3)
    parser.add_argument("--pretrain-batch-size", type=int, default=200)
    parser.add_argument("--finetune-lr", type=float, default=5e-4)
    parser.add_argument("--finetune-batch-size", type=int, default=32)
    parser.add_argument(
        "--no-scratch",
        action="store_true",
        help="skip training the same network through the projection from scratch",
    )
    parser.add_argument(
        "--n-train", type=int, default=None, help="training contexts (default: all)"
    )
    parser.add_argument("--n-valid", type=int, default=256)
    parser.add_argument("--n-test", type=int, default=1024)
    return parser.parse_args(argv)


def make_projector(problem):
    """The feasible set {y : A y = x, G y <= h}, with the context x passed as `b`."""
    return pe.Projector(
        [
            pe.Equality(problem.A, pe.Parameter("b")),
            pe.AffineInequality(problem.G, upper=problem.h),
        ],
        n_iter=50,  # Douglas-Rachford iterations while training...
        n_iter_test=100,  # ...and in inference mode.
        # One exact step of equality refinement at the end, so that float32 outputs
        # satisfy A y = x to the rounding of y itself (about 1e-6, not 5e-6).
        refine=True,
    )


def make_mlp(problem, key):
    return eqx.nn.MLP(
        in_size=problem.n_eq,
        out_size=problem.n_var,
        width_size=200,
        depth=2,
        activation=jax.nn.relu,
        dtype=DTYPE,
        key=key,
    )


def batches(rng, X, batch_size):
    """The rows of `X` in a random order, as full batches (the remainder is dropped)."""
    order = rng.permutation(X.shape[0])
    for i in range(X.shape[0] // batch_size):
        yield X[order[i * batch_size : (i + 1) * batch_size]]


def fit(
    params,
    static,
    loss_fn,
    X,
    *,
    epochs,
    batch_size,
    lr,
    rng,
    desc,
    on_eval,
    evals_per_epoch,
):
    """Adam with a cosine-decayed learning rate on `loss_fn(params, static, X)`.

    `on_eval(params, step, seconds)` is called before the first step and
    `evals_per_epoch` times per epoch; `seconds` is the training time so far
    (compilation included, the evaluations themselves excluded). Returns the
    trained `params` and the training time in seconds.
    """
    n_batches = X.shape[0] // batch_size
    if n_batches == 0:
        raise ValueError(
            f"{desc}: {X.shape[0]} training contexts are fewer than one batch of "
            f"{batch_size}; pass a smaller batch size or more contexts."
        )
    schedule = optax.cosine_decay_schedule(lr, epochs * n_batches)
    optim = optax.adam(schedule)
    opt_state = optim.init(params)

    @eqx.filter_jit
    def step(params, opt_state, X):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(params, static, X)
        updates, opt_state = optim.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    eval_every = max(n_batches // evals_per_epoch, 1)
    seconds, steps = 0.0, 0
    on_eval(params, steps, seconds)
    bar = tqdm(total=epochs * n_batches, desc=desc, unit="step")
    for _ in range(epochs):
        for batch in batches(rng, X, batch_size):
            t = time.perf_counter()
            params, opt_state, loss = step(params, opt_state, batch)
            loss = float(loss)  # waits for the step, so that the timing is honest
            seconds += time.perf_counter() - t
            steps += 1
            bar.update()
            if steps % eval_every == 0 or steps == epochs * n_batches:
                postfix = on_eval(params, steps, seconds)
                bar.set_postfix_str(f"loss {loss:.3f}{postfix}")
    bar.close()
    return params, seconds


def metrics(Y, X, J_star, problem, objective):
    """RS against the optimal values `J_star` and CV, in float64 on the original data.

    The RS of an infeasible point can be small, or zero, because it may beat the
    optimum by violating the constraints: read it together with the CV.
    """
    Y64 = np.asarray(Y, np.float64)
    rs = np.asarray(pe.relative_suboptimality(objective(Y64), J_star))
    cv = dc3_violation(Y64, X, problem.A, problem.G, problem.h)
    return {
        "rs_mean": float(rs.mean()),
        "rs_median": float(np.median(rs)),
        "rs_max": float(rs.max()),
        "cv_max": float(cv.max()),
        "cv_mean": float(cv.mean()),
        "optimal_fraction": float(np.mean((cv <= 1e-3) & (rs <= 0.05))),
    }


def main(argv=None):
    """Run the example.

    **Returns:** a dict with the `metrics` written to `metrics.json`, the
    `pretrained` MLP, `net_inf` (it with a projection layer), the `finetuned`
    network, the `problem` and the test contexts `X_test`.
    """
    args = parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    # The published DC3 data; the validation and test sets are the published ones
    # (or their first rows).
    problem = make_dc3()
    X_train, X_valid, X_test = problem.split()
    X_train = X_train[: args.n_train]
    X_valid, X_test = X_valid[: args.n_valid], X_test[: args.n_test]
    Q, p = (jnp.asarray(a, DTYPE) for a in (problem.Q, problem.p))
    A, G, h = (jnp.asarray(a, DTYPE) for a in (problem.A, problem.G, problem.h))
    objective = jax.vmap(lambda y: dc3_objective(y, Q, p))

    def objective64(Y):  # in NumPy, so that it is float64 whatever JAX's precision
        Y = np.asarray(Y, np.float64)
        return 0.5 * np.sum((Y @ problem.Q) * Y, axis=-1) + Y @ problem.p

    print("Solving the validation and test contexts with OSQP, for reference...")
    J_valid = objective64(solve_dc3_convex(problem, X_valid))
    J_test = objective64(solve_dc3_convex(problem, X_test))
    X_train_j, X_valid_j, X_test_j = (
        jnp.asarray(X, DTYPE) for X in (X_train, X_valid, X_test)
    )

    projector = make_projector(problem)
    key_pretrain, key_scratch = jax.random.split(jax.random.key(args.seed))
    rng = np.random.default_rng(args.seed)

    @eqx.filter_jit
    def predict(model, X):
        return jax.vmap(model)(X, b=X)

    def valid_rs(net):
        # Inference mode: the projector runs n_iter_test iterations.
        Y = predict(eqx.nn.inference_mode(net), X_valid_j)
        return float(jnp.mean(pe.relative_suboptimality(objective(Y), J_valid)))

    # 1. Pretraining without constraints, on a soft penalty (the paper's Pinet-inf).
    @jax.vmap
    def penalty(y, x):
        return jnp.sum((A @ y - x) ** 2) + jnp.sum(jnp.maximum(G @ y - h, 0.0) ** 2)

    def penalised_loss(mlp, static, X):
        Y = jax.vmap(eqx.combine(mlp, static))(X)
        return jnp.mean(objective(Y) + args.penalty * penalty(Y, X))

    mlp0, mlp_static = eqx.partition(make_mlp(problem, key_pretrain), eqx.is_array)

    def on_pretrain_eval(mlp, steps, seconds):
        net = pe.HardConstrainedNet(eqx.combine(mlp, mlp_static), projector)
        return f", val RS with projection {valid_rs(net):.1e}"

    mlp, pretrain_s = fit(
        mlp0,
        mlp_static,
        penalised_loss,
        X_train_j,
        epochs=args.pretrain_epochs,
        batch_size=args.pretrain_batch_size,
        lr=args.pretrain_lr,
        rng=rng,
        desc="pretrain (soft penalty)",
        on_eval=on_pretrain_eval,
        evals_per_epoch=1,
    )
    pretrained = eqx.combine(mlp, mlp_static)

    # 2. Pinet-inf: the pretrained MLP with a projection layer, nothing retrained.
    net_inf = pe.HardConstrainedNet(pretrained, projector)

    # 3. Fine-tuning through the projection, on the objective alone, with the first
    # layer frozen: it never reaches the optimiser, so it stays bit-identical.
    def loss_fn(params, static, X):
        model = eqx.combine(params, static)
        return jnp.mean(objective(jax.vmap(model)(X, b=X)))

    def train_through_projection(net, frozen, desc):
        spec = pe.trainable_filter(net, frozen=frozen)
        params, static = eqx.partition(net, spec)
        curve = {"step": [], "train_s": [], "val_rs": []}

        def on_eval(params, steps, seconds):
            rs = valid_rs(eqx.combine(params, static))
            curve["step"].append(steps)
            curve["train_s"].append(seconds)
            curve["val_rs"].append(rs)
            return f", val RS {rs:.1e}"

        params, seconds = fit(
            params,
            static,
            loss_fn,
            X_train_j,
            epochs=args.finetune_epochs,
            batch_size=args.finetune_batch_size,
            lr=args.finetune_lr,
            rng=rng,
            desc=desc,
            on_eval=on_eval,
            evals_per_epoch=4,
        )
        return eqx.combine(params, static), seconds, curve

    finetuned, finetune_s, finetune_curve = train_through_projection(
        net_inf, lambda m: m.backbone.layers[0], "fine-tune (first layer frozen)"
    )
    if not args.no_scratch:
        scratch = pe.HardConstrainedNet(make_mlp(problem, key_scratch), projector)
        scratch, scratch_s, scratch_curve = train_through_projection(
            scratch, None, "from scratch (for comparison)"
        )

    # Test metrics. The CV is computed in float64 from A, G and h, independently of
    # the projector.
    def test_metrics(net):
        return metrics(predict(net, X_test_j), X_test, J_test, problem, objective64)

    results = {
        "raw": metrics(
            jax.vmap(pretrained)(X_test_j), X_test, J_test, problem, objective64
        ),
        "inf": test_metrics(eqx.nn.inference_mode(net_inf)),
        "finetuned": test_metrics(eqx.nn.inference_mode(finetuned)),
        "pretrain_s": pretrain_s,
        "finetune_s": finetune_s,
        "finetune_curve": finetune_curve,
    }
    if not args.no_scratch:
        results["scratch"] = test_metrics(eqx.nn.inference_mode(scratch))
        results["scratch_s"] = scratch_s
        results["scratch_curve"] = scratch_curve
    results["total_s"] = time.perf_counter() - start

    rows = [
        ("raw MLP (soft penalty)", "raw"),
        ("+ projection at inference (Pinet-inf)", "inf"),
        ("fine-tuned through the projection", "finetuned"),
    ]
    if not args.no_scratch:
        rows.append(("trained from scratch (same epochs)", "scratch"))
    print(f"Test set, {len(X_test)} contexts:")
    print(f"  {'':40s} {'mean RS':>9s} {'max CV':>9s} {'optimal':>8s}")
    for label, name in rows:
        m = results[name]
        print(
            f"  {label:40s} {m['rs_mean']:9.2e} {m['cv_max']:9.1e} "
            f"{100 * m['optimal_fraction']:7.1f}%"
        )
    print(f"  pretraining {pretrain_s:.1f} s, fine-tuning {finetune_s:.1f} s", end="")
    print(f", from scratch {scratch_s:.1f} s" if not args.no_scratch else "")

    with open(out / "metrics.json", "w") as f:
        json.dump(
            {
                "args": vars(args),
                "command": shlex.join(
                    ["python", *sys.argv]
                    if argv is None
                    else ["python", __file__, *argv]
                ),
                "machine": {
                    "platform": platform.platform(),
                    "cpu_count": os.cpu_count(),
                    "jax": jax.__version__,
                    "backend": jax.default_backend(),
                    # Load averages (1, 5, 15 min) at the end: the machine may be
                    # shared, and the timings are only as good as its load allows.
                    "load_average": os.getloadavg(),
                },
                "date": datetime.datetime.now(datetime.UTC).isoformat(
                    timespec="seconds"
                ),
                **results,
            },
            f,
            indent=2,
        )
    plot(results, out / "finetune.png")
    print(f"Wrote {out / 'metrics.json'} and {out / 'finetune.png'}.")
    return {
        "metrics": results,
        "pretrained": pretrained,
        "net_inf": net_inf,
        "finetuned": finetuned,
        "problem": problem,
        "X_test": X_test,
        "J_test": J_test,
    }


def plot(results, path):
    """Validation RS against training time, with the Pinet-inf level as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ft = results["finetune_curve"]
    ax.plot(ft["train_s"], ft["val_rs"], "o-", ms=3, label="pretrained, fine-tuned")
    if "scratch_curve" in results:
        sc = results["scratch_curve"]
        ax.plot(sc["train_s"], sc["val_rs"], "s-", ms=3, label="trained from scratch")
    ax.axhline(
        ft["val_rs"][0],
        color="k",
        ls="--",
        label="pretrained, projection at inference only",
    )
    ax.set_yscale("log")
    ax.set_xlabel("training time through the projection [s]")
    ax.set_ylabel("mean validation RS")
    ax.set_title("Convex DC3: fine-tuning through the projection")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
