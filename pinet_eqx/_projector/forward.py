"""One projection, end to end: the forward pass of a `Projector` for one instance.

The pipeline of paper Algorithm 1 for one point, one function per phase, each in
the subpackage of its concern, with the data that travels between them in one
object:

1. `_solver.instance.prepare`: assemble the instance's data, factorise
    per-instance matrices, start from $y_{raw}$ lifted (an `Instance`);
2. `_adjoint.iterate.iterate`: iterate under the adjoint's derivative rule (the
    active set, the fixed point, or unrolled), and read out $y$ (an `Iterated`);
3. `_active_set.finish.finish`: polish and refine onto the active set, where
    that is on;
4. `_solver.certify.certify`: report the status (a `ProjectionSolution`).
"""

from __future__ import annotations

from .._active_set.finish import finish
from .._adjoint.iterate import iterate
from .._solver.certify import certify, clip
from .._solver.instance import prepare
from .frozen import thaw


def solve(proj, y_raw, s0, params: dict, diagnostics: bool):
    """Project one checked point `y_raw` with `proj` (a `Projector`).

    **Returns:** with `diagnostics`, a `ProjectionSolution`; else only $y$.
    """
    frozen = thaw((proj.problem, proj.op, proj.active_rows, proj.refinement))
    instance = prepare(proj, frozen, y_raw, s0, params)
    if instance.only_boxes:
        return clip(instance, diagnostics)
    iterated = iterate(instance, diagnostics)
    y, viol, polished, empty = finish(instance, iterated)
    if not diagnostics:
        return y[: y_raw.shape[0]]
    return certify(instance, iterated, y, viol, polished, empty)
