r"""The measurements: target A (speed), target B (overhead) and the forms of
the partial sum, all float64, and the helpers they share.

A layer maps a batch `(Y, params)` (raw points (B, n), per-instance parameter
values by name) to its projections. Each has `forward(Y, params) -> X` and
`forward_backward(Y, params)`, the value and gradient of $\sum_{ij} W_{ij}
X_{ij}$ ($W$ fixed, random) with respect to the raw points and every
parameter. Ours are jitted; cvxpylayers' cannot be (its solves are in Python),
so its calls run eagerly, as a user calls them.

`measure_speed` (A), on the issue's problem: `ours_train` (`pe.from_cvxpy` at
the defaults, training mode: the target's layer), `ours_inference`,
`cvxpylayers` (its defaults: diffcp with SCS) and `cvxpylayers_clarabel` (the
reference gradients), timed, their outputs against Clarabel at 1e-10.

`measure_dc3` and `measure_native_sets` (B): `from_cvxpy` against
`benchmarks/dc3`'s hand-built projector on the DC3 polytope, and the default
`native_sets=True` (a `Box`, an `L1NormCone`) against `native_sets=False`
(cvxpy's rows and auxiliary coordinates) on the issue's problem: both modes
timed in turns, outputs compared, inference iterations recorded.

`measure_partial_sums`, no timing: `cp.cumsum(x)[:10] <= 0.5` and `L @ x <=
0.5` define the same set, but cvxpy canonicalises `cumsum` with 30 auxiliary
variables, which `from_cvxpy` keeps; `cp.sum(x[:15]) <= 0.5` (target A's) is
one row. For each: the distance to Clarabel's projection and the iterations.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import pinet_eqx as pe

from .._common.problems import dc3_projector
from .._common.provenance import log
from .._common.timing import time_first
from . import _problems

TARGET_A, TARGET_B = 0.1, 1.2  # ours / cvxpylayers; from_cvxpy / hand-built
MODES = ("train", "inference")


def measure_dc3(size: str, batch: int, repeats: int) -> dict:
    """Target B on DC3 `size` (`_problems.DC3_SIZES`)."""
    data = _problems.dc3(size, batch)
    log(f"[B] building DC3 {size} projectors (batch {batch})")
    builders = {
        "hand_built": lambda: dc3_projector(data.A, data.G, data.h),
        "from_cvxpy": lambda: _problems.dc3_from_cvxpy(data),
    }
    out = _pairs(builders, data.inst, repeats)
    out["problem"] = {"size": size, "n_var": data.A.shape[1], "n_eq": data.A.shape[0]}
    out["problem"]["n_ineq"] = data.G.shape[0]
    return out


def measure_native_sets(batch: int, repeats: int) -> dict:
    """`native_sets=False` against the default on the issue's problem."""
    problem = _problems.issue_problem("sum")
    inst = _problems.issue_instances(problem, batch)
    log(
        f"[B] building the issue's problem with and without native sets (batch {batch})"
    )
    constraints, x = problem.constraints, problem.x
    builders = {
        "native_sets": lambda: pe.from_cvxpy(constraints, x),
        "rows": lambda: pe.from_cvxpy(constraints, x, native_sets=False),
    }
    return _pairs(builders, inst, repeats)


def _pairs(builders: dict, inst, repeats: int) -> dict:
    """Builds the projectors of `builders` (baseline, candidate), times and compares."""
    base, cand = builders
    projectors, setup = {}, {}
    for name, build in builders.items():
        projectors[name], setup[name] = build_twice(build)
    args = as_jax(inst)
    calls, layers = {}, {}
    for name, proj in projectors.items():
        for mode in MODES:
            layer = ours(proj.with_settings(inference=mode == "inference"), inst.W)
            layers[f"{name}/{mode}"] = layer
            for kind in ("forward", "forward_backward"):
                calls[f"{name}/{mode}/{kind}"] = layer[kind]
    log(f"[B] timing {len(calls)} calls, {repeats} interleaved repeats")
    timing = time_all(calls, args, repeats)

    ratio, difference, iters = {}, {}, {}
    for mode in MODES:
        for kind in ("forward", "forward_backward"):
            a, b = timing[f"{cand}/{mode}/{kind}"], timing[f"{base}/{mode}/{kind}"]
            ratio[f"{mode}/{kind}"] = a["median"] / b["median"]
        X = {n: layers[f"{n}/{mode}"]["forward"](*args) for n in projectors}
        difference[mode] = max_abs(X[base], X[cand])
    for name, proj in projectors.items():
        iters[name] = iterations(inference_solve(proj, args))
    out = dict(batch=inst.batch, repeats=repeats, baseline=base, candidate=cand)
    out["structure"] = {name: structure(p) for name, p in projectors.items()}
    out.update(setup_s=setup, timing=timing, ratio=ratio, max_abs_difference=difference)
    return {**out, "inference_iterations": iters}


def measure_partial_sums(batch: int) -> dict:
    """The accuracy of each form of `_problems.PARTIAL_SUMS` on `batch` instances."""
    out = {}
    for partial, description in _problems.PARTIAL_SUMS.items():
        log(f"[partial sums] {partial}")
        problem = _problems.issue_problem(partial)
        inst = _problems.issue_instances(problem, batch)
        args = as_jax(inst)
        proj = pe.from_cvxpy(problem.constraints, problem.x)
        train_y = jax.jit(jax.vmap(lambda y, p: proj(y, **p)))(*args)
        solution = inference_solve(proj, args)
        ref = _problems.reference(problem, inst)
        out[partial] = {
            "description": description,
            "structure": structure(proj),
            "train": accuracy(problem, inst, train_y, ref),
            "inference": accuracy(problem, inst, solution.y, ref),
            "inference_iterations": iterations(solution),
            "batch": batch,
        }
    return out


def measure_speed(batch: int, repeats: int, clarabel: bool = True) -> dict:
    """Every measurement of target A on `batch` instances, `repeats` timed
    repeats; `clarabel=False` leaves out the Clarabel cvxpylayers."""
    problem = _problems.issue_problem("sum")
    inst = _problems.issue_instances(problem, batch)
    args = as_jax(inst)

    log(f"[A] building from_cvxpy projector and cvxpylayers (batch {batch})")
    proj, build_s = build_twice(lambda: pe.from_cvxpy(problem.constraints, problem.x))
    layers = {
        "ours_train": ours(proj, inst.W),
        "ours_inference": ours(proj.with_settings(inference=True), inst.W),
    }

    def make():
        prob, y_raw = problem.projection_problem()
        return prob, y_raw, [problem.b, problem.r], problem.x

    layers["cvxpylayers"] = cvxpylayers(make, inst.W)
    if clarabel:
        layers["cvxpylayers_clarabel"] = cvxpylayers(
            make, inst.W, {"solve_method": "Clarabel"}
        )
    setup = {name: f["setup_s"] for name, f in layers.items() if "setup_s" in f}
    setup = {"ours": build_s, **setup}

    calls = {
        f"{name}/{kind}": layer[kind]
        for name, layer in layers.items()
        for kind in ("forward", "forward_backward")
    }
    log(f"[A] timing {len(calls)} calls, {repeats} interleaved repeats")
    timing = time_all(calls, args, repeats)

    log("[A] accuracy against Clarabel at 1e-10")
    ref = _problems.reference(problem, inst)
    outputs = {name: layer["forward"](*args) for name, layer in layers.items()}
    grads = {name: f["forward_backward"](*args)[1] for name, f in layers.items()}
    errors = {name: accuracy(problem, inst, X, ref) for name, X in outputs.items()}
    sanity = max_abs(outputs["ours_inference"], outputs["cvxpylayers"])
    grad_ref = "cvxpylayers_clarabel" if clarabel else "cvxpylayers"
    grad_error = {
        name: gradient_error(g, grads[grad_ref])
        for name, g in grads.items()
        if name != grad_ref
    }
    return {
        "batch": batch,
        "repeats": repeats,
        "problem": {
            "n_var": _problems.N_VAR,
            "partial": _problems.PARTIAL_SUMS[problem.partial],
            **structure(proj),
            "active_share": _problems.activity(problem, inst, ref),
        },
        "setup_s": setup,
        "timing": timing,
        "ratio": ratios(timing),
        "accuracy_vs_clarabel_1e-10": errors,
        "clarabel_1e-8_vs_1e-10": max_abs(
            _problems.reference(problem, inst, 1e-8), ref
        ),
        "sanity_max_abs_ours_inference_vs_cvxpylayers": sanity,
        "gradient_error_vs": grad_ref,
        "gradient_error": grad_error,
        "inference_iterations": iterations(inference_solve(proj, args)),
    }


def ratios(timing: dict) -> dict:
    """Our median over cvxpylayers' (each variant), per mode and call."""
    out = {}
    for mine in ("ours_train", "ours_inference"):
        for theirs in ("cvxpylayers", "cvxpylayers_clarabel"):
            for kind in ("forward", "forward_backward"):
                a, b = f"{mine}/{kind}", f"{theirs}/{kind}"
                if a in timing and b in timing:
                    ratio = timing[a]["median"] / timing[b]["median"]
                    out[f"{mine}/{theirs}/{kind}"] = ratio
    return out


def _pair(forward: Callable, W, wrap: Callable = lambda f: f) -> dict:
    """`forward` and `forward_backward` (the value and gradient of `W . forward`),
    each passed through `wrap`."""
    W = jnp.asarray(W)

    def loss(Y, params):
        return jnp.sum(W * forward(Y, params))

    backward = jax.value_and_grad(loss, argnums=(0, 1))
    return {"forward": wrap(forward), "forward_backward": wrap(backward)}


def ours(projector, W) -> dict[str, Callable]:
    """`forward` and `forward_backward` of a `pe.Projector`, jitted."""

    def forward(Y, params):
        return jax.vmap(lambda y, p: projector(y, **p))(Y, params)

    return _pair(forward, W, jax.jit)


def build_twice(build: Callable) -> tuple[object, dict]:
    """`build()` twice: the second result and the seconds of both (`cold`, with
    the one-off costs of a process's first build, such as imports, and `warm`)."""
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        out = build()
        seconds.append(time.perf_counter() - start)
    return out, {"cold": seconds[0], "warm": seconds[1]}


def cvxpylayers(make: Callable, W, solver_args=None) -> dict:
    """`forward`, `forward_backward` and `setup_s` (`build_twice`) of a
    `CvxpyLayer` of `make() -> (problem, y_raw, params, x)`, a fresh problem each
    time (cvxpy caches its canonicalisation on it), `params` passed by name."""
    from cvxpylayers.jax import CvxpyLayer

    def build():
        problem, y_raw, params, x = make()
        layer = CvxpyLayer(
            problem, parameters=[y_raw, *params], variables=[x], solver_args=solver_args
        )
        return layer, [p.name() for p in params]

    (layer, names), setup_s = build_twice(build)

    def forward(Y, values):
        return layer(Y, *(values[name] for name in names))[0]

    return {**_pair(forward, W), "setup_s": setup_s}


def as_jax(inst) -> tuple:
    """The batch `(Y, params)` of an `Instances` as JAX arrays (float64)."""
    return jnp.asarray(inst.Y), {k: jnp.asarray(v) for k, v in inst.params.items()}


def time_all(calls: dict[str, Callable], args: tuple, repeats: int) -> dict:
    """`timing.time_first` of each of `calls` (`name: fn`) on `args`."""
    return time_first(
        {n: functools.partial(fn, *args) for n, fn in calls.items()}, repeats
    )


def accuracy(problem, inst, X, ref) -> dict:
    """Outputs `X` against Clarabel's `ref`: `max_abs`, the largest objective
    difference (`objective_excess`, ours minus Clarabel's), our `violation` and
    Clarabel's (`ref_violation`)."""
    excess = _problems.objective(inst, X) - _problems.objective(inst, ref)
    return {
        "max_abs": max_abs(X, ref),
        "objective_excess": float(excess.max()),
        "violation": float(_problems.violation(problem, inst, X).max()),
        "ref_violation": float(_problems.violation(problem, inst, ref).max()),
    }


def structure(proj) -> dict:
    """What a projector was built as: its coordinates, rows, form and iterations."""
    P = proj.problem
    out = dict(n_aux=proj.n_aux, n_eq=P.n_eq, n_ineq=P.n_ineq, n_cone=P.n_cone)
    out.update(n_boxed=len(P.box_index), affine_form=type(proj.op).__name__)
    return {**out, "n_iter": proj.solver.n_iter}


def inference_solve(proj, args):
    """The `ProjectionSolution`s of `proj` in inference mode on `(Y, params)`."""
    infer = proj.with_settings(inference=True)
    return jax.jit(jax.vmap(lambda y, p: infer.solve(y, **p)))(*args)


def iterations(solution) -> dict:
    """Median and max iterations of a batch of solutions, and how many succeeded."""
    n_iter = np.asarray(solution.n_iter)
    return {
        "median": float(np.median(n_iter)),
        "max": int(n_iter.max()),
        "successful": int((solution.result == pe.RESULTS.successful).sum()),
    }


def gradient_error(g, g_ref) -> dict:
    """`max` and `median` over instances of $\\|g_i - g_{ref,i}\\| /
    \\|g_{ref,i}\\|$, gradient pytrees with leading axis B, all leaves together."""

    def flat(tree):
        leaves = jax.tree_util.tree_leaves(tree)
        B = leaves[0].shape[0]
        return np.concatenate([np.asarray(a).reshape(B, -1) for a in leaves], axis=1)

    a, b = flat(g), flat(g_ref)
    err = np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-300)
    return {"max": float(err.max()), "median": float(np.median(err))}


def max_abs(X, Y) -> float:
    """$\\max |X - Y|$ over every entry, in float64."""
    return float(np.abs(np.asarray(X, np.float64) - np.asarray(Y, np.float64)).max())
