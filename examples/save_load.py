"""Save, load and ship a trained constrained network.

Two ways, each checked in a fresh Python process:

- Leaves file (recommended), with `pinet_eqx.save` and `pinet_eqx.load`. One
  file: a line of JSON whose hyperparameters hold everything needed to rebuild
  the network's skeleton (MLP sizes, projector settings, how to regenerate the
  constraint data), then the arrays, written by `eqx.tree_serialise_leaves`.
  `pe.load` passes the hyperparameters to `make_net` as keywords, checks every
  stored array against the skeleton it returns, and reads the arrays into it;
  this script then checks that the hyperparameters regenerate the constraints
  the network was saved with. The file holds no code, so it is safe to load and
  survives refactors of the code, as long as the skeleton can still be rebuilt.
- Pickle. The whole object, code included: nothing to rebuild, but tied to the
  versions of Python and of the libraries that wrote it, and never to be loaded
  from an untrusted source (unpickling can run arbitrary code). The standard
  `pickle` cannot write an `eqx.nn.MLP`: it stores functions by reference, by
  name, and neither `jax.nn.relu` (a `custom_jvp` object that is "not the same
  object as jax._src.nn.functions.relu") nor the MLP's default final activation
  (a lambda) can be found again by name. `cloudpickle` writes such functions by
  value; the result is read back with the standard `pickle.load`, as long as
  `cloudpickle` is installed.

The task is a small convex DC3 problem (20 variables, 10 equalities, 10
inequalities), trained briefly through the projection.

    python examples/save_load.py                  # save, then load both ways
    python examples/save_load.py save [--out DIR] [--steps 300] [--seed 0]
    python examples/save_load.py load DIR/net.eqx [--reference DIR/reference.npz]
    python examples/save_load.py unpickle DIR/net.pkl [--reference ...]

`save` writes `net.eqx`, `net.pkl` and `reference.npz` (fixed inputs and the
outputs the network gave for them at save time); `load` and `unpickle` exit with
status 0 only if the loaded network reproduces those outputs bit for bit, and
`load` with status 2 if the file cannot be loaded (the reason is printed). Load
in the precision the file was saved in: this script runs in JAX's default
float32, and `pe.load` says what to do otherwise.
"""

import argparse
import functools
import pathlib
import pickle
import subprocess
import sys
import time

import cloudpickle
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import pinet_eqx as pe
from pinet_eqx.problems import dc3_objective, make_dc3

# The header names the activation; the leaves file never stores functions.
ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jax.nn.tanh}


class HeaderMismatchError(ValueError):
    """The file's hyperparameters are not this script's, or do not regenerate the
    constraints the network was saved with."""


def default_hyperparameters():
    """Everything needed to rebuild the network's skeleton: `pe.save` stores it in
    the file's header, and `pe.load` passes it back to `make_net` as keywords."""
    return {
        # The constraint data are regenerated, not read: make_dc3(**problem).
        "problem": {
            "n_var": 20,
            "n_eq": 10,
            "n_ineq": 10,
            "n_examples": 1000,
            "seed": 17,
        },
        "mlp": {"width_size": 64, "depth": 2, "activation": "relu"},
        # `pe.Projector` keywords (plain JSON: the solver's shorthands).
        "projector": {"n_iter": 50, "n_iter_test": 100},
        "dtype": "float32",
    }


def make_net(*, problem, mlp, projector, dtype, key=None):
    """Build the network from its hyperparameters (`default_hyperparameters()`,
    as keywords).

    With a `key`, the MLP's weights are random. Without one, it is a skeleton to
    load into: the MLP's arrays are only shapes and dtypes (`jax.ShapeDtypeStruct`,
    from `eqx.filter_eval_shape`), since `pe.load` overwrites them anyway. The
    projector is built for real: `load` projects with it to check the constraints.

    **Returns:** the `HardConstrainedNet`.
    """
    dc3 = make_dc3(**problem)
    proj = pe.Projector(
        [
            pe.Equality(dc3.A, pe.Parameter("b")),
            pe.AffineInequality(dc3.G, upper=dc3.h),
        ],
        **projector,
    )
    make_mlp = functools.partial(
        eqx.nn.MLP,
        in_size=dc3.n_eq,
        out_size=dc3.n_var,
        width_size=mlp["width_size"],
        depth=mlp["depth"],
        activation=ACTIVATIONS[mlp["activation"]],
        dtype=jnp.dtype(dtype),
    )
    if key is None:
        backbone = eqx.filter_eval_shape(make_mlp, key=jax.random.key(0))
    else:
        backbone = make_mlp(key=key)
    return pe.HardConstrainedNet(backbone, proj)


def load(path):
    """`pe.load` the network in `path`, then check that its hyperparameters
    regenerate the constraints it was saved with.

    **Returns:** `(net, hyperparameters)`.

    **Raises:** `ValueError` from `pe.load` if the file is not a `pe.save` file,
    was saved in the other precision, or holds other arrays than the skeleton
    built from its hyperparameters (in number, shape or dtype);
    `HeaderMismatchError` if the hyperparameters are not this script's, or
    regenerate other constraints than those the network was saved with.
    """
    rebuilt = {}

    def make(**hp):
        expected = set(default_hyperparameters())
        if set(hp) != expected:
            raise HeaderMismatchError(
                f"{path}: the file's hyperparameters {sorted(hp)} are not this "
                f"script's {sorted(expected)}; was it written by `save`?"
            )
        rebuilt["hp"], rebuilt["skeleton"] = hp, make_net(**hp)
        return rebuilt["skeleton"]

    net = pe.load(path, make)
    hp, skeleton = rebuilt["hp"], rebuilt["skeleton"]
    # The file also stores the projector's constraint data, so the shapes alone
    # cannot tell whether the hyperparameters regenerate the same constraints.
    # Project a few points with both projectors: the factorisation itself need not
    # match bit for bit across machines, the projection must.
    dc3 = make_dc3(**hp["problem"])
    X = jnp.asarray(dc3.X[:8], hp["dtype"])
    Y_raw = jax.random.normal(jax.random.key(0), (8, dc3.n_var), hp["dtype"])
    project = eqx.filter_jit(lambda proj: jax.vmap(proj)(Y_raw, b=X))
    Y_file, Y_header = project(net.projector), project(skeleton.projector)
    gap = float(jnp.max(jnp.abs(Y_file - Y_header)))
    if not gap <= 1e-3 * (1.0 + float(jnp.max(jnp.abs(Y_header)))):
        raise HeaderMismatchError(
            f"{path}: the constraints regenerated from the hyperparameters "
            f"({hp['problem']}) are not those the network was saved with (their "
            f"projections differ by {gap:.2e})."
        )
    return net, hp


@eqx.filter_jit
def predict(net, X):
    """Outputs of `net` in inference mode, for a batch of contexts."""
    return jax.vmap(eqx.nn.inference_mode(net))(X, b=X)


def train(net, problem, steps, seed):
    """Self-supervised training through the projection, on the DC3 objective."""
    Q, p = (jnp.asarray(a, jnp.float32) for a in (problem.Q, problem.p))
    X_train = jnp.asarray(problem.split(n_valid=0, n_test=16)[0], jnp.float32)
    params, static = eqx.partition(net, pe.trainable_filter(net))
    optim = optax.adam(1e-3)
    opt_state = optim.init(params)

    def loss_fn(params, X):
        model = eqx.combine(params, static)
        Y = jax.vmap(model)(X, b=X)
        return jnp.mean(jax.vmap(lambda y: dc3_objective(y, Q, p))(Y))

    @eqx.filter_jit
    def step(params, opt_state, X):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(params, X)
        updates, opt_state = optim.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(seed)
    for i in range(steps):
        batch = X_train[rng.choice(X_train.shape[0], size=64, replace=False)]
        params, opt_state, loss = step(params, opt_state, batch)
        if i + 1 == steps:
            print(f"trained {steps} steps, final loss {float(loss):.4f}")
    return eqx.combine(params, static)


def cmd_save(args):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hp = default_hyperparameters()
    problem = make_dc3(**hp["problem"])
    net = make_net(**hp, key=jax.random.key(args.seed))
    net = train(net, problem, args.steps, args.seed)
    # Fixed inputs: the 16 contexts held out from training.
    X = np.asarray(problem.split(n_valid=0, n_test=16)[2], np.float32)
    Y = np.asarray(predict(net, jnp.asarray(X)))
    np.savez(out / "reference.npz", X=X, Y=Y)
    pe.save(out / "net.eqx", net, hp)
    try:
        pickle.dumps(net)
        print("(the standard pickle can write this network too)")
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        print(f"the standard pickle cannot write this network: {e}")
    with open(out / "net.pkl", "wb") as f:
        cloudpickle.dump(net, f)
    for name in ("net.eqx", "net.pkl", "reference.npz"):
        print(f"wrote {out / name} ({(out / name).stat().st_size} bytes)")


def check_reference(net, reference):
    """Exit status 0 if `net` reproduces the recorded outputs bit for bit, else 1."""
    ref = np.load(reference)
    Y = np.asarray(predict(net, jnp.asarray(ref["X"])))
    same = Y.dtype == ref["Y"].dtype and Y.tobytes() == ref["Y"].tobytes()
    diff = float(np.max(np.abs(Y.astype(np.float64) - ref["Y"])))
    print(
        f"outputs on {len(Y)} fixed inputs: "
        + ("bit-identical" if same else f"DIFFERENT (max abs difference {diff:.2e})")
    )
    return 0 if same else 1


def cmd_load(args):
    t = time.perf_counter()
    try:
        net, hp = load(args.path)
    except ValueError as e:  # pe.load's errors, and HeaderMismatchError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"loaded {args.path} in {time.perf_counter() - t:.2f} s "
        f"(hyperparameters: MLP {hp['mlp']}, projector {hp['projector']})"
    )
    return check_reference(net, args.reference)


def cmd_unpickle(args):
    t = time.perf_counter()
    with open(args.path, "rb") as f:
        net = pickle.load(f)  # only ever unpickle files you trust
    print(f"unpickled {args.path} in {time.perf_counter() - t:.2f} s")
    return check_reference(net, args.reference)


def cmd_demo(args):
    """Save, then load both ways, each in a fresh Python process."""
    cmd_save(args)
    out = pathlib.Path(args.out)
    status = 0
    for command, name in (("load", "net.eqx"), ("unpickle", "net.pkl")):
        print(f"\n$ python {__file__} {command} {out / name}")
        status |= subprocess.run(
            [sys.executable, __file__, command, str(out / name)],
            check=False,
        ).returncode
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    for name in ("demo", "save"):
        p = sub.add_parser(name)
        p.add_argument("--out", default="results/save_load", help="output folder")
        p.add_argument("--steps", type=int, default=300, help="training steps")
        p.add_argument("--seed", type=int, default=0)
    for name in ("load", "unpickle"):
        p = sub.add_parser(name)
        p.add_argument("path")
        p.add_argument(
            "--reference",
            help="outputs recorded at save time (default: reference.npz beside path)",
        )
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["demo", *argv]
    args = parser.parse_args(argv)
    if args.command in ("load", "unpickle") and args.reference is None:
        args.reference = pathlib.Path(args.path).with_name("reference.npz")
    command = {
        "demo": cmd_demo,
        "save": cmd_save,
        "load": cmd_load,
        "unpickle": cmd_unpickle,
    }[args.command]
    return command(args) or 0


if __name__ == "__main__":
    sys.exit(main())
