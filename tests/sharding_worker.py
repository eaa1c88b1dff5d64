"""Sharded runs for `test_sharding.py`, in a process of their own.

Virtual CPU devices exist only if `XLA_FLAGS=--xla_force_host_platform_device_count`
is set before JAX starts, and the test process has started JAX already; so the
tests run this script in a subprocess. It has two commands:

    python tests/sharding_worker.py cases OUT.json [--case ID ...] [--optimise]
    python tests/sharding_worker.py process OUT.npz --process-id I --port P [--optimise]

`cases` runs each case (set, adjoint, mode) sharded over all devices and on one
device, and writes their largest differences; an exception fails only its own
case and is recorded with it. `process` is one of the two processes of the
multi-process test: it joins `jax.distributed` on loopback and trains a few steps
of a `HardConstrainedNet` with the batch split across the devices of both.

Importing this module sets nothing: the tests import it for the problems, the
models and the single-device training run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import sys
import traceback

import numpy as np

COMPUTATIONS = ("forward", "vjp", "step", "inference", "solve")
SETS = ("polytope", "cone", "per_instance")
ADJOINTS = ("implicit", "unrolled")
MODES = ("auto", "explicit", "shard_map")
BATCH = 8  # two instances per device on four devices
DIM = 6
N_EQ = 2
N_INEQ = 3
N_STEPS = 3  # training steps of the multi-process test
# The projector asks for `jax.shard_map(..., check_vma=False)`: equinox's runtime
# checks and lineax's solves do not carry the varying-axes type yet.
CHECK_VMA = False


def case_id(set_name: str, adjoint: str, mode: str) -> str:
    return f"{set_name}-{adjoint}-{mode}"


def all_cases() -> list[str]:
    return [case_id(*c) for c in itertools.product(SETS, ADJOINTS, MODES)]


# ------------------------------------------------------------------ problems


@dataclasses.dataclass
class Problem:
    """A projector's constraints and a batch: raw points `Y`, contexts `X` (the
    backbone's inputs), per-instance parameters `params` and a cotangent `V`."""

    constraints: list
    Y: np.ndarray
    X: np.ndarray
    params: dict
    V: np.ndarray


def make_problem(set_name: str, batch: int = BATCH, seed: int = 0) -> Problem:
    """A small, feasible instance of `set_name` (`SETS`), with `batch` contexts.

    Every context has a strictly feasible point `y0`; the raw points are spread
    wide enough that some inequalities, bounds and cones are active.
    """
    import pinet_eqx as pe

    rng = np.random.default_rng(seed)
    d = DIM
    y0 = rng.uniform(-0.2, 0.2, size=(batch, d))
    E = rng.normal(size=(N_EQ, d))
    C = rng.normal(size=(N_INEQ, d)) / np.sqrt(d)
    Y = 1.5 * rng.normal(size=(batch, d))
    V = rng.normal(size=(batch, d))
    if set_name == "polytope":
        constraints = [
            pe.Equality(E, pe.Parameter("b")),
            pe.AffineInequality(C, lower=-0.5, upper=0.5),
            pe.Box(-1.0, 1.0),
        ]
        X = y0 @ E.T
        params = {"b": X}
    elif set_name == "cone":
        A = rng.normal(size=(3, d)) / np.sqrt(d)
        constraints = [
            pe.SecondOrderCone(A, b=0.6),
            pe.Equality(E, pe.Parameter("b")),
        ]
        X = y0 @ E.T
        params = {"b": X}
    elif set_name == "per_instance":
        Es = E + 0.3 * rng.normal(size=(batch, N_EQ, d))
        Cs = C + 0.1 * rng.normal(size=(batch, N_INEQ, d))
        constraints = [
            pe.Equality(pe.Parameter("E", shape=(N_EQ, d)), pe.Parameter("b")),
            pe.AffineInequality(pe.Parameter("C", shape=(N_INEQ, d)), upper=0.5),
            pe.Box(-1.0, 1.0),
        ]
        X = np.einsum("bij,bj->bi", Es, y0)
        params = {"b": X, "E": Es, "C": Cs}
    else:
        raise ValueError(f"unknown set {set_name!r}; expected one of {SETS}")
    return Problem(constraints, Y, X, params, V)


def make_projector(problem: Problem, adjoint: str, n_iter: int = 40):
    import pinet_eqx as pe

    adj = {"implicit": pe.ImplicitAdjoint(), "unrolled": pe.UnrolledAdjoint()}
    return pe.Projector(problem.constraints, n_iter=n_iter, adjoint=adj[adjoint])


def make_net(problem: Problem, adjoint: str, seed: int = 0):
    """A `HardConstrainedNet`: a small MLP from the context to the raw point."""
    import equinox as eqx
    import jax

    import pinet_eqx as pe

    backbone = eqx.nn.MLP(
        in_size=problem.X.shape[1],
        out_size=DIM,
        width_size=16,
        depth=1,
        activation=jax.nn.tanh,
        key=jax.random.key(seed),
    )
    return pe.HardConstrainedNet(backbone, make_projector(problem, adjoint))


# ------------------------------------------------------------------ the computations
# Each is one jitted function of the model and the batch, the same for the
# sharded and the single-device runs: only where its inputs live differs.


def _functions(optimiser):
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    def forward(proj, Y, P):
        return jax.vmap(proj)(Y, **P)

    def objective(y):
        return jnp.sum(0.5 * y**2 + y)

    def loss_sum(params, static, X, P):
        # The sum over this batch of the per-instance loss; divided by the global
        # batch size it is the mean (under `shard_map` each device sums its own).
        model = eqx.combine(params, static)
        return jnp.sum(jax.vmap(objective)(jax.vmap(model)(X, **P)))

    def vjp(proj, Y, P, V):
        def f(Y, P):
            return jnp.sum(V * forward(proj, Y, P))

        return jax.value_and_grad(f, argnums=(0, 1))(Y, P)

    def update(params, opt_state, loss, grads):
        updates, opt_state = optimiser.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss, grads

    def step(params, static, opt_state, X, P):
        n = X.shape[0]
        loss, grads = jax.value_and_grad(lambda p: loss_sum(p, static, X, P) / n)(
            params
        )
        return update(params, opt_state, loss, grads)

    def inference(proj, Y, P):
        return jax.vmap(eqx.nn.inference_mode(proj))(Y, **P)

    def solve(proj, Y, P):
        import pinet_eqx as pe

        sol = jax.vmap(proj.solve)(Y, **P)
        return sol.y, sol.n_iter, sol.result == pe.RESULTS.successful

    return dict(
        forward=forward,
        vjp=vjp,
        step=step,
        update=update,
        loss_sum=loss_sum,
        inference=inference,
        solve=solve,
    )


def shard_mapped(fns, mesh, axis="data"):
    """The computations as `shard_map` over the batch axis: each device runs the
    single-instance code on its own rows; the training step sums the loss and the
    gradient across devices with `psum`, the data-parallel all-reduce."""
    import equinox as eqx
    import jax
    from jax.sharding import PartitionSpec as P

    batch, whole = P(axis), P()

    def per_device(f, out_specs):
        # The model's arrays enter whole on every device; its static part is
        # closed over (it is Python metadata, not traced).
        def wrapped(model, *args):
            arrays, static = eqx.partition(model, eqx.is_array)

            def body(arrays, *args):
                return f(eqx.combine(arrays, static), *args)

            in_specs = (whole, *([batch] * len(args)))
            return jax.shard_map(
                body,
                mesh=mesh,
                in_specs=in_specs,
                out_specs=out_specs,
                check_vma=CHECK_VMA,
            )(arrays, *args)

        return wrapped

    def vjp(proj, Y, P, V):
        # Each device's value is the sum over its own rows; the gradients are
        # per instance, so they stay where they are.
        value, grads = fns["vjp"](proj, Y, P, V)
        return jax.lax.psum(value, axis), grads

    def step(params, static, opt_state, X, P):
        n = X.shape[0]
        arrays, arr_static = eqx.partition(params, eqx.is_array)

        def body(arrays, X, P):
            params = eqx.combine(arrays, arr_static)
            loss, grads = jax.value_and_grad(
                lambda p: fns["loss_sum"](p, static, X, P) / n
            )(params)
            return jax.lax.psum((loss, grads), axis)

        loss, grads = jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(whole, batch, batch),
            out_specs=whole,
            check_vma=CHECK_VMA,
        )(arrays, X, P)
        return fns["update"](params, opt_state, loss, grads)

    return dict(
        forward=per_device(fns["forward"], batch),
        vjp=per_device(vjp, (whole, (batch, batch))),
        step=step,
        inference=per_device(fns["inference"], batch),
        solve=per_device(fns["solve"], batch),
    )


def run_all(fns, problem: Problem, proj, net, optimiser, with_eval: bool) -> dict:
    """Every computation of a case, with `fns`, on `problem`'s batch as given
    (already sharded, or not).

    **Returns:** `{name: pytree of NumPy arrays}`, or `{name: "Error: message"}`
    for a computation that raised, so that one failure hides no other.
    """
    import equinox as eqx
    import jax

    import pinet_eqx as pe

    Y, X, P, V = problem.Y, problem.X, problem.params, problem.V
    params, static = eqx.partition(net, pe.trainable_filter(net))
    jit = {name: eqx.filter_jit(f) for name, f in fns.items() if name in COMPUTATIONS}

    def step():
        new_params, _, loss, grads = jit["step"](
            params, static, optimiser.init(params), X, P
        )
        return {"loss": loss, "grads": grads, "params": new_params}

    calls = {
        "forward": lambda: jit["forward"](proj, Y, P),
        "vjp": lambda: jit["vjp"](proj, Y, P, V),
        "step": step,
    }
    if with_eval:
        calls["inference"] = lambda: jit["inference"](proj, Y, P)
        # With a tolerance, so that the status and the iteration count vary
        # from instance to instance.
        solving = proj.with_settings(tol=1e-6, n_iter=300)
        calls["solve"] = lambda: jit["solve"](solving, Y, P)
    out = {}
    for name, call in calls.items():
        try:
            result = eqx.filter(call(), eqx.is_array)
            out[name] = jax.tree.map(np.asarray, result)
        except Exception as e:  # recorded: one failure must not hide the others
            out[name] = f"{type(e).__name__}: {e}"
            print(traceback.format_exc(limit=-15), file=sys.stderr)
    return out


def compare(result: dict, reference: dict) -> dict:
    """For each computation: the error it raised, or the largest absolute
    difference from the reference, the reference's largest magnitude, and
    whether every array is bit-identical."""
    import jax

    out = {}
    for name, ref in reference.items():
        got = result[name]
        if isinstance(got, str):
            out[name] = {"error": got}
            continue
        la, lb = jax.tree.leaves(got), jax.tree.leaves(ref)
        assert len(la) == len(lb), name
        diff, magnitude, identical = 0.0, 0.0, True
        for x, y in zip(la, lb):
            assert x.shape == y.shape, (name, x.shape, y.shape)
            identical &= bool(np.array_equal(x, y))
            if x.size:
                x, y = x.astype(np.float64), y.astype(np.float64)
                diff = max(diff, float(np.max(np.abs(x - y))))
                magnitude = max(magnitude, float(np.max(np.abs(y))))
        out[name] = {
            "max_abs_diff": diff,
            "magnitude": magnitude,
            "bit_identical": identical,
        }
    return out


def forward_collectives(fn, proj, Y, P) -> list[str]:
    """Cross-device collectives in the compiled sharded forward pass: a
    per-instance computation needs none, so any one means instances travel."""
    import equinox as eqx
    import jax

    arrays, static = eqx.partition(proj, eqx.is_array)
    compiled = jax.jit(lambda a, Y, P: fn(eqx.combine(a, static), Y, P))
    text = compiled.lower(arrays, Y, P).compile().as_text()
    names = ("all-gather", "all-reduce", "all-to-all", "collective-permute")
    return sorted(
        {name for name in names if f" {name}(" in text or f"{name}-start(" in text}
    )


_REFERENCES: dict = {}


def run_case(cid: str) -> dict:
    """One case, sharded over all devices, compared with one device."""
    import jax
    import optax

    import pinet_eqx as pe

    set_name, adjoint, mode = cid.split("-")
    problem = make_problem(set_name)
    proj = make_projector(problem, adjoint)
    net = make_net(problem, adjoint)
    optimiser = optax.adam(1e-2)
    # Inference and `solve` do not depend on the adjoint.
    with_eval = adjoint == "implicit"
    fns = _functions(optimiser)
    if (set_name, adjoint) not in _REFERENCES:
        _REFERENCES[set_name, adjoint] = run_all(
            fns, problem, proj, net, optimiser, with_eval
        )
    reference = _REFERENCES[set_name, adjoint]

    mesh = pe.data_mesh(explicit=mode == "explicit")
    Y, X, V, P = pe.shard_batch(mesh, problem.Y, problem.X, problem.V, problem.params)
    sharded = dataclasses.replace(problem, Y=Y, X=X, V=V, params=P)
    record: dict = {}
    if mode == "shard_map":
        fns = {**fns, **shard_mapped(fns, mesh)}
        record["computations"] = compare(
            run_all(fns, sharded, proj, net, optimiser, with_eval), reference
        )
        return record
    context = jax.set_mesh(mesh) if mode == "explicit" else contextlib.nullcontext()
    with context:
        result = run_all(fns, sharded, proj, net, optimiser, with_eval)
        try:
            record["collectives"] = forward_collectives(fns["forward"], proj, Y, P)
            # Again without the runtime input checks, to tell their collectives
            # (`eqx.error_if` reduces its predicate over the batch) from the
            # projection's own.
            unchecked = proj.with_settings(check_inputs=False)
            record["collectives_unchecked"] = forward_collectives(
                fns["forward"], unchecked, Y, P
            )
        except Exception as e:
            record["collectives"] = f"{type(e).__name__}: {e}"
    record["computations"] = compare(result, reference)
    return record


def cases_main(out: str, cases: list[str]) -> None:
    import jax

    results: dict = {"devices": len(jax.devices())}
    for cid in cases:
        try:
            results[cid] = run_case(cid)
        except Exception as e:  # recorded per case: one failure must not hide others
            tb = traceback.format_exc(limit=-6)
            results[cid] = {"error": f"{type(e).__name__}: {e}", "traceback": tb}
        print(cid, file=sys.stderr, flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


# ------------------------------------------------------------------ multi-process


def train(net, X, P, n_steps: int = N_STEPS, lr: float = 1e-2):
    """`n_steps` Adam steps of `net` on the whole batch `(X, P)`, as given
    (sharded or not); returns the losses, the gradients and the parameters of
    every step and the final outputs, as NumPy."""
    import equinox as eqx
    import jax
    import optax

    import pinet_eqx as pe

    optimiser = optax.adam(lr)
    fns = _functions(optimiser)
    step = eqx.filter_jit(fns["step"])
    params, static = eqx.partition(net, pe.trainable_filter(net))
    opt_state = optimiser.init(params)
    history = []
    for _ in range(n_steps):
        params, opt_state, loss, grads = step(params, static, opt_state, X, P)
        history.append({"loss": loss, "grads": grads, "params": params})
    Y = eqx.filter_jit(lambda m, X, P: jax.vmap(m)(X, **P))(
        eqx.combine(params, static), X, P
    )
    return history, Y


def flatten_history(history, Y) -> dict[str, np.ndarray]:
    """`train`'s result as named NumPy arrays, gathered to this process."""
    import equinox as eqx
    import jax
    from jax.experimental import multihost_utils

    def gather(x):
        if jax.process_count() > 1:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    out = {}
    for i, h in enumerate(history):
        leaves = jax.tree.leaves(eqx.filter(h, eqx.is_array))
        for j, leaf in enumerate(leaves):
            out[f"step{i}_{j}"] = gather(leaf)
    out["Y"] = gather(Y)
    return out


def process_main(out: str, process_id: int, port: int) -> None:
    import jax

    import pinet_eqx as pe

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=60,
    )
    assert jax.process_count() == 2 and jax.device_count() == 4, jax.devices()
    problem = make_problem("polytope")
    net = make_net(problem, "implicit")
    mesh = pe.data_mesh()
    # Each process holds only its own half of the batch.
    rows = slice(process_id * BATCH // 2, (process_id + 1) * BATCH // 2)
    local = {k: v[rows] for k, v in problem.params.items()}
    X, P = pe.shard_batch(mesh, problem.X[rows], local)
    history, Y = train(pe.replicate(mesh, net), X, P)
    result = flatten_history(history, Y)
    if process_id == 0:
        np.savez(out, **result)
    jax.distributed.shutdown()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cases = sub.add_parser("cases")
    cases.add_argument("out")
    cases.add_argument("--case", action="append", choices=all_cases())
    cases.add_argument(
        "--optimise", action="store_true", help="keep XLA's optimisations"
    )
    proc = sub.add_parser("process")
    proc.add_argument("out")
    proc.add_argument("--process-id", type=int, required=True)
    proc.add_argument("--port", type=int, required=True)
    proc.add_argument(
        "--optimise", action="store_true", help="keep XLA's optimisations"
    )
    args = parser.parse_args(argv)

    import jax

    # The settings of tests/conftest.py.
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_numpy_rank_promotion", "raise")
    # The fast tier's setting (tests/conftest.py): the problems are tiny, and
    # their time goes to XLA compiling them.
    if not args.optimise:
        jax.config.update("jax_disable_most_optimizations", True)
    if args.command == "cases":
        cases_main(args.out, args.case or all_cases())
    else:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        process_main(args.out, args.process_id, args.port)


if __name__ == "__main__":
    if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        sys.exit("Set XLA_FLAGS=--xla_force_host_platform_device_count=N first.")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
