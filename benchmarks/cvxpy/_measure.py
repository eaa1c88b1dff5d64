r"""The measurements: target A (speed), target B (overhead) and the forms of
the partial sum, all float64, every layer's calls built by `_calls`.

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

import jax

import pinet_eqx as pe

from .._common.problems import dc3_projector
from .._common.provenance import log
from . import _calls, _problems

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
    builders = {
        "native_sets": lambda: pe.from_cvxpy(problem.constraints, problem.x),
        "rows": lambda: pe.from_cvxpy(
            problem.constraints, problem.x, native_sets=False
        ),
    }
    return _pairs(builders, inst, repeats)


def _pairs(builders: dict, inst, repeats: int) -> dict:
    """Build the two projectors of `builders` (`baseline`, then `candidate`),
    time both modes' calls in turns and compare their outputs."""
    base, cand = builders
    projectors, setup = {}, {}
    for name, build in builders.items():
        projectors[name], setup[name] = _calls.build_twice(build)
    args = _calls.as_jax(inst)
    calls, layers = {}, {}
    for name, proj in projectors.items():
        for mode in MODES:
            layer = _calls.ours(
                proj.with_settings(inference=mode == "inference"), inst.W
            )
            layers[f"{name}/{mode}"] = layer
            for kind in ("forward", "forward_backward"):
                calls[f"{name}/{mode}/{kind}"] = layer[kind]
    log(f"[B] timing {len(calls)} calls, {repeats} interleaved repeats")
    timing = _calls.time_all(calls, args, repeats)

    ratio, difference, iterations = {}, {}, {}
    for mode in MODES:
        for kind in ("forward", "forward_backward"):
            a, b = timing[f"{cand}/{mode}/{kind}"], timing[f"{base}/{mode}/{kind}"]
            ratio[f"{mode}/{kind}"] = a["median"] / b["median"]
        X = {n: layers[f"{n}/{mode}"]["forward"](*args) for n in projectors}
        difference[mode] = _calls.max_abs(X[base], X[cand])
    for name, proj in projectors.items():
        iterations[name] = _calls.iterations(_calls.inference_solve(proj, args))
    return {
        "batch": inst.batch,
        "repeats": repeats,
        "baseline": base,
        "candidate": cand,
        "structure": {name: _calls.structure(p) for name, p in projectors.items()},
        "setup_s": setup,
        "timing": timing,
        "ratio": ratio,
        "max_abs_difference": difference,
        "inference_iterations": iterations,
    }


def measure_partial_sums(batch: int) -> dict:
    """The accuracy of each form of `_problems.PARTIAL_SUMS` on `batch` instances."""
    out = {}
    for partial, description in _problems.PARTIAL_SUMS.items():
        log(f"[partial sums] {partial}")
        problem = _problems.issue_problem(partial)
        inst = _problems.issue_instances(problem, batch)
        args = _calls.as_jax(inst)
        proj = pe.from_cvxpy(problem.constraints, problem.x)
        train_y = jax.jit(jax.vmap(lambda y, p: proj(y, **p)))(*args)
        solution = _calls.inference_solve(proj, args)
        ref = _problems.reference(problem, inst)
        out[partial] = {
            "description": description,
            "structure": _calls.structure(proj),
            "train": _calls.accuracy(problem, inst, train_y, ref),
            "inference": _calls.accuracy(problem, inst, solution.y, ref),
            "inference_iterations": _calls.iterations(solution),
            "batch": batch,
        }
    return out


def measure_speed(batch: int, repeats: int, clarabel: bool = True) -> dict:
    """Every measurement of target A on `batch` instances, `repeats` timed
    repeats; `clarabel=False` leaves out the Clarabel cvxpylayers."""
    problem = _problems.issue_problem("sum")
    inst = _problems.issue_instances(problem, batch)
    args = _calls.as_jax(inst)

    log(f"[A] building from_cvxpy projector and cvxpylayers (batch {batch})")
    proj, build_s = _calls.build_twice(
        lambda: pe.from_cvxpy(problem.constraints, problem.x)
    )
    layers = {
        "ours_train": _calls.ours(proj, inst.W),
        "ours_inference": _calls.ours(proj.with_settings(inference=True), inst.W),
    }

    def make():
        prob, y_raw = problem.projection_problem()
        return prob, y_raw, [problem.b, problem.r], problem.x

    layers["cvxpylayers"] = _calls.cvxpylayers(make, inst.W)
    if clarabel:
        layers["cvxpylayers_clarabel"] = _calls.cvxpylayers(
            make, inst.W, {"solve_method": "Clarabel"}
        )
    setup = {"ours": build_s} | {
        name: layer["setup_s"] for name, layer in layers.items() if "setup_s" in layer
    }

    calls = {
        f"{name}/{kind}": layer[kind]
        for name, layer in layers.items()
        for kind in ("forward", "forward_backward")
    }
    log(f"[A] timing {len(calls)} calls, {repeats} interleaved repeats")
    timing = _calls.time_all(calls, args, repeats)

    log("[A] accuracy against Clarabel at 1e-10")
    ref = _problems.reference(problem, inst)
    outputs = {name: layer["forward"](*args) for name, layer in layers.items()}
    grads = {
        name: layer["forward_backward"](*args)[1] for name, layer in layers.items()
    }
    accuracy = {
        name: _calls.accuracy(problem, inst, X, ref) for name, X in outputs.items()
    }
    sanity = _calls.max_abs(outputs["ours_inference"], outputs["cvxpylayers"])
    grad_ref = "cvxpylayers_clarabel" if clarabel else "cvxpylayers"
    grad_error = {
        name: _calls.gradient_error(g, grads[grad_ref])
        for name, g in grads.items()
        if name != grad_ref
    }
    return {
        "batch": batch,
        "repeats": repeats,
        "problem": {
            "n_var": _problems.N_VAR,
            "partial": _problems.PARTIAL_SUMS[problem.partial],
            **_calls.structure(proj),
            "active_share": _problems.activity(problem, inst, ref),
        },
        "setup_s": setup,
        "timing": timing,
        "ratio": ratios(timing),
        "accuracy_vs_clarabel_1e-10": accuracy,
        "clarabel_1e-8_vs_1e-10": _calls.max_abs(
            _problems.reference(problem, inst, 1e-8), ref
        ),
        "sanity_max_abs_ours_inference_vs_cvxpylayers": sanity,
        "gradient_error_vs": grad_ref,
        "gradient_error": grad_error,
        "inference_iterations": _calls.iterations(_calls.inference_solve(proj, args)),
    }


def ratios(timing: dict) -> dict:
    """Our median over cvxpylayers' (each variant), per mode and call."""
    out = {}
    for ours in ("ours_train", "ours_inference"):
        for theirs in ("cvxpylayers", "cvxpylayers_clarabel"):
            for kind in ("forward", "forward_backward"):
                a, b = f"{ours}/{kind}", f"{theirs}/{kind}"
                if a in timing and b in timing:
                    ratio = timing[a]["median"] / timing[b]["median"]
                    out[f"{ours}/{theirs}/{kind}"] = ratio
    return out
