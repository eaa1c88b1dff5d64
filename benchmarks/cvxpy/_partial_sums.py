r"""How the form of the issue's partial-sum constraint changes the accuracy.

`cp.cumsum(x)[:10] <= 0.5` and `L @ x <= 0.5` (L the first rows of the
lower-triangular ones matrix) define the same set, but cvxpy canonicalises
`cumsum` with 30 auxiliary variables $s = \mathrm{cumsum}(x)$ tied to $x$ by
equalities, which `from_cvxpy` keeps as auxiliary coordinates; `cp.sum(x[:15])
<= 0.5` (target A's form) is one row. For each form: the largest distance of
our outputs (training and inference mode, library defaults) to Clarabel's
projection at 1e-10, and the iterations inference mode took to its tolerance.
No timing.
"""

from __future__ import annotations

import jax

import pinet_eqx as pe

from .._common.provenance import log
from . import _calls, _inspect, _problems


def measure(batch: int) -> dict:
    """The accuracy of each form of `_problems.PARTIAL_SUMS` on `batch`
    instances."""
    out = {}
    for partial, description in _problems.PARTIAL_SUMS.items():
        log(f"[partial sums] {partial}")
        problem = _problems.issue_problem(partial)
        inst = _problems.issue_instances(problem, batch)
        args = _calls.as_jax(inst)
        proj = pe.from_cvxpy(problem.constraints, problem.x)
        train_y = jax.jit(jax.vmap(lambda y, p: proj(y, **p)))(*args)
        solution = _inspect.inference_solve(proj, args)
        ref = _problems.reference(problem, inst)
        out[partial] = {
            "description": description,
            "structure": _inspect.structure(proj),
            "train": _inspect.accuracy(problem, inst, train_y, ref),
            "inference": _inspect.accuracy(problem, inst, solution.y, ref),
            "inference_iterations": _inspect.iterations(solution),
            "batch": batch,
        }
    return out
