r"""Target B: what building the sets through cvxpy costs at run time.

- **DC3** (`measure_dc3`): the DC3 polytope as `pe.from_cvxpy([A @ y == b, G @
  y <= h], y)` and as the hand-built projector of `benchmarks/dc3`, both at the
  library's defaults, in training and in inference mode.
- **Native sets** (`measure_native_sets`): the issue's problem (target A) by
  `pe.from_cvxpy(..., native_sets=True)` (the default: the bounds
  $-1 \le x \le 1$ become a `Box`, and the epigraph rows of $\|x\|_1 \le r$
  an `L1NormCone` with cvxpy's epigraph variables eliminated) and by
  `native_sets=False` (rows and auxiliary coordinates as cvxpy gives them),
  in both modes.

Each projector's `forward` and `forward_backward` (`_calls`) run on the same
batch in the same process, all timed in turns; the outputs of each pair are
compared (max abs difference) and the ratio of medians is ours-via-cvxpy over
the baseline. In inference mode the iterations stop at a tolerance, so the
iterations each projector took are recorded with the times.
"""

from __future__ import annotations

import pinet_eqx as pe

from .._common.provenance import log
from . import _calls, _inspect, _problems

TARGET_RATIO = 1.2
MODES = ("train", "inference")


def measure_dc3(size: str, batch: int, repeats: int) -> dict:
    """Target B on DC3 `size` (`_problems.DC3_SIZES`)."""
    data = _problems.dc3(size, batch)
    log(f"[B] building DC3 {size} projectors (batch {batch})")
    builders = {
        "hand_built": lambda: _problems.dc3_hand_built(data),
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
        difference[mode] = _inspect.max_abs(X[base], X[cand])
    for name, proj in projectors.items():
        iterations[name] = _inspect.iterations(_inspect.inference_solve(proj, args))
    return {
        "batch": inst.batch,
        "repeats": repeats,
        "baseline": base,
        "candidate": cand,
        "structure": {name: _inspect.structure(p) for name, p in projectors.items()},
        "setup_s": setup,
        "timing": timing,
        "ratio": ratio,
        "max_abs_difference": difference,
        "inference_iterations": iterations,
    }
