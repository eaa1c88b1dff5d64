"""Save, load and ship a trained constrained network.

Two ways, each checked in a fresh Python process:

- Leaves file (recommended). One file: a line of JSON with everything needed to
  rebuild the network's skeleton (MLP sizes, projector settings, how to regenerate
  the constraint data), then the arrays, written by `eqx.tree_serialise_leaves`.
  Loading rebuilds the skeleton from the header and reads the arrays into it. The
  file holds no code, so it is safe to load and survives refactors of the code, as
  long as the skeleton can still be rebuilt.
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
status 0 only if the loaded network reproduces those outputs bit for bit.
"""

import argparse
import functools
import json
import pathlib
import pickle
import subprocess
import sys
import time

import cloudpickle
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax

import pinet_eqx as pe
from pinet_eqx.problems import dc3_objective, make_dc3

FORMAT = "pinet_eqx-example-net"
FORMAT_VERSION = 1

# The header names the activation; the leaves file never stores functions.
ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jax.nn.tanh}


class HeaderMismatchError(ValueError):
    """The file's header does not describe the arrays stored after it."""


def default_hyperparameters():
    """Everything needed to rebuild the network's skeleton; stored as the header."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "pinet_eqx_version": pe.__version__,
        # The constraint data are regenerated, not stored: make_dc3(**problem).
        "problem": {
            "n_var": 20,
            "n_eq": 10,
            "n_ineq": 10,
            "n_examples": 1000,
            "seed": 17,
        },
        "mlp": {"width_size": 64, "depth": 2, "activation": "relu"},
        "projector": {"n_iter": 50, "n_iter_test": 100},
        "dtype": "float32",
    }


def projector_settings(settings):
    """The `pe.Projector` keywords of a header's `"projector"` entry.

    Headers written before `adjoint=` existed store the implicit backward pass's
    step limit as `n_iter_bwd`; it becomes `pe.ImplicitAdjoint(max_steps=...)`. The
    adjoint holds no arrays, so the stored leaves are the same either way.
    """
    settings = dict(settings)
    if "n_iter_bwd" in settings:
        max_steps = settings.pop("n_iter_bwd")
        settings["adjoint"] = pe.ImplicitAdjoint(max_steps=max_steps)
    return settings


def make_net(hyperparameters, key=None):
    """Build the network from its hyperparameters.

    With a `key`, the MLP's weights are random. Without one, it is a skeleton to
    load into: its arrays are only shapes and dtypes (`jax.ShapeDtypeStruct`, from
    `eqx.filter_eval_shape`), since they will be overwritten anyway.

    **Returns:** `(net, problem)`: the `HardConstrainedNet` and the `DC3Problem`
    whose constraints it enforces.
    """
    hp = hyperparameters
    problem = make_dc3(**hp["problem"])
    projector = pe.Projector(
        [
            pe.Equality(problem.A, pe.Parameter("b")),
            pe.AffineInequality(problem.G, upper=problem.h),
        ],
        **projector_settings(hp["projector"]),
    )
    make_mlp = functools.partial(
        eqx.nn.MLP,
        in_size=problem.n_eq,
        out_size=problem.n_var,
        width_size=hp["mlp"]["width_size"],
        depth=hp["mlp"]["depth"],
        activation=ACTIVATIONS[hp["mlp"]["activation"]],
        dtype=jnp.dtype(hp["dtype"]),
    )
    if key is None:
        mlp = eqx.filter_eval_shape(make_mlp, key=jax.random.key(0))
    else:
        mlp = make_mlp(key=key)
    return pe.HardConstrainedNet(mlp, projector), problem


def save(path, net, hyperparameters):
    """Write `hyperparameters` as one line of JSON, then the leaves of `net`."""
    with open(path, "wb") as f:
        f.write((json.dumps(hyperparameters) + "\n").encode())
        eqx.tree_serialise_leaves(f, net)


def load(path):
    """Rebuild the skeleton from the header of `path`, then read the arrays into it.

    **Returns:** `(net, problem, hyperparameters)`.

    **Raises:** `HeaderMismatchError` if the file is not in this format, if the
    skeleton's arrays do not have the shapes of the stored ones, if the number of
    stored arrays differs, or if the header regenerates other constraints than
    those the network was saved with.
    """
    with open(path, "rb") as f:
        try:
            hp = json.loads(f.readline().decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise HeaderMismatchError(
                f"{path}: the first line is not a JSON header; was this file written "
                "by `save`?"
            ) from e
        if hp.get("format") != FORMAT or hp.get("format_version") != FORMAT_VERSION:
            raise HeaderMismatchError(
                f"{path}: header format {hp.get('format')!r} version "
                f"{hp.get('format_version')!r}, but this script reads {FORMAT!r} "
                f"version {FORMAT_VERSION}."
            )
        skeleton, problem = make_net(hp)

        def is_stored(x):
            return isinstance(x, jax.ShapeDtypeStruct) or eqx.is_array_like(x)

        paths = [
            jtu.keystr(p)
            for p, leaf in jtu.tree_leaves_with_path(skeleton)
            if is_stored(leaf)
        ]
        count = iter(range(len(paths)))

        def read_leaf(f, x):
            # Equinox reads whatever comes next in the file, whatever its shape: check
            # it against the skeleton, so that a wrong header fails here, by name,
            # and not later with an unrelated shape error.
            if not is_stored(x):
                return x
            i = next(count)
            try:
                y = eqx.default_deserialise_filter_spec(f, x)
            except (EOFError, ValueError) as e:
                raise HeaderMismatchError(
                    f"{path}: the file ends before array {i} ({paths[i]}): it is "
                    "truncated, or the header describes a larger network than the "
                    "one stored."
                ) from e
            if np.shape(y) != np.shape(x):
                raise HeaderMismatchError(
                    f"{path}: array {i} ({paths[i]}) has shape {np.shape(y)} in the "
                    f"file, but the skeleton built from the header expects "
                    f"{np.shape(x)}. The header does not match the stored network."
                )
            return y

        try:
            net = eqx.tree_deserialise_leaves(f, skeleton, filter_spec=read_leaf)
        except Exception as e:
            # Recent Equinox wraps errors raised while reading a leaf; raise ours as
            # it is, since it already names the leaf.
            cause = e
            while cause is not None and not isinstance(cause, HeaderMismatchError):
                cause = cause.__cause__
            if cause is None:
                raise
            raise cause from None
        if f.read(1):
            raise HeaderMismatchError(
                f"{path}: bytes are left after the {len(paths)} arrays the header "
                "describes: the stored network is larger than the header says."
            )
    # The projector's arrays come from the file. Check that the header regenerates
    # the same constraints, by projecting a few points with both: the factorisation
    # itself need not match bit for bit across machines, the projection must.
    X = jnp.asarray(problem.X[:8], hp["dtype"])
    Y_raw = jax.random.normal(jax.random.key(0), (8, problem.n_var), hp["dtype"])
    project = eqx.filter_jit(lambda proj: jax.vmap(proj)(Y_raw, b=X))
    Y_file, Y_header = project(net.projector), project(skeleton.projector)
    gap = float(jnp.max(jnp.abs(Y_file - Y_header)))
    if not gap <= 1e-3 * (1.0 + float(jnp.max(jnp.abs(Y_header)))):
        raise HeaderMismatchError(
            f"{path}: the constraints regenerated from the header "
            f"({hp['problem']}) are not those the network was saved with (their "
            f"projections differ by {gap:.2e})."
        )
    return net, problem, hp


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
    net, problem = make_net(hp, jax.random.key(args.seed))
    net = train(net, problem, args.steps, args.seed)
    # Fixed inputs: the 16 contexts held out from training.
    X = np.asarray(problem.split(n_valid=0, n_test=16)[2], np.float32)
    Y = np.asarray(predict(net, jnp.asarray(X)))
    np.savez(out / "reference.npz", X=X, Y=Y)
    save(out / "net.eqx", net, hp)
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
        net, _, hp = load(args.path)
    except HeaderMismatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"loaded {args.path} in {time.perf_counter() - t:.2f} s "
        f"(header: MLP {hp['mlp']}, projector {hp['projector']})"
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
