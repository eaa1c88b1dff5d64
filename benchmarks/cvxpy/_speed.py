r"""Target A: `pe.from_cvxpy` against cvxpylayers on the issue's problem.

Layers (all float64, the same batch):

- `ours_train`: `pe.from_cvxpy(constraints, x)` at the library's defaults, in
  training mode (the mode a user trains in; the target's layer);
- `ours_inference`: the same projector `.with_settings(inference=True)`;
- `cvxpylayers`: `CvxpyLayer(problem, parameters=[y_raw, b, r],
  variables=[x])` at its defaults (diffcp, whose default cone solver is SCS);
- `cvxpylayers_clarabel`: the same with `solver_args={"solve_method":
  "Clarabel"}` (an interior-point solve to high accuracy, as the DC3 suite's
  cvxpylayers baseline; it also gives the reference gradients).

Each layer's `forward` and `forward_backward` (`_calls`) is timed, first
call and steady state. The outputs are compared with a Clarabel solve at
tolerance 1e-10 (`_problems.reference`); the gradients with
`cvxpylayers_clarabel`'s.
"""

from __future__ import annotations

import pinet_eqx as pe

from .._common.provenance import log
from . import _calls, _inspect, _problems

TARGET_RATIO = 0.1


def measure(batch: int, repeats: int, clarabel: bool = True) -> dict:
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
        name: _inspect.accuracy(problem, inst, X, ref) for name, X in outputs.items()
    }
    sanity = _inspect.max_abs(outputs["ours_inference"], outputs["cvxpylayers"])
    grad_ref = "cvxpylayers_clarabel" if clarabel else "cvxpylayers"
    grad_error = {
        name: _inspect.gradient_error(g, grads[grad_ref])
        for name, g in grads.items()
        if name != grad_ref
    }
    return {
        "batch": batch,
        "repeats": repeats,
        "problem": {
            "n_var": _problems.N_VAR,
            "partial": _problems.PARTIAL_SUMS[problem.partial],
            **_inspect.structure(proj),
            "active_share": _problems.activity(problem, inst, ref),
        },
        "setup_s": setup,
        "timing": timing,
        "ratio": ratios(timing),
        "accuracy_vs_clarabel_1e-10": accuracy,
        "clarabel_1e-8_vs_1e-10": _inspect.max_abs(
            _problems.reference(problem, inst, 1e-8), ref
        ),
        "sanity_max_abs_ours_inference_vs_cvxpylayers": sanity,
        "gradient_error_vs": grad_ref,
        "gradient_error": grad_error,
        "inference_iterations": _inspect.iterations(
            _inspect.inference_solve(proj, args)
        ),
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
