"""The result of a projection, with its diagnostics."""

from __future__ import annotations

import warnings

import equinox as eqx
import equinox.internal as eqxi
from jaxtyping import Array, Float, Int


class RESULTS(eqxi.Enumeration):
    """Outcome of the forward Douglas-Rachford iteration."""

    successful = ""
    max_steps_reached = (
        "The projection did not reach `tol` (constraint violation and fixed-point "
        "residual) within the iteration budget. Increase `n_iter`/`n_iter_test` or "
        "tune `sigma`."
    )
    infeasible = (
        "The constraint set is empty for this instance: the Douglas-Rachford "
        "iterates diverge, and their displacement certifies that the affine part and "
        "the cones/bounds do not intersect. `y` is finite but infeasible; "
        "`primal_residual` reports its true violation."
    )


class ProjectionSolution(eqx.Module):
    """What `Projector.solve` returns for one instance.

    **Fields:**

    - `y`: the projected point, shape `(d,)`.
    - `s`: the final governing sequence $s_K$ of Douglas-Rachford, in the projector's
        internal (equilibrated, lifted) coordinates; pass it back as `s0=` to warm
        start a nearby instance.
    - `n_iter`: number of iterations run (`n_steps` is its deprecated name).
    - `primal_residual`: maximum absolute constraint violation of `y` in the user's
        original coordinates (the same number as `Projector.violation`).
    - `fixed_point_residual`: $\\max |t_K - z_K|$ in the user's coordinates: how far
        the iteration is from a fixed point.
    - `result`: `RESULTS.successful` when both residuals are at most `tol`,
        or when the inference polish certified `y` as the projection (it meets
        the optimality conditions to `tol`; polyhedral sets, see
        `Projector`'s `refine`); otherwise `RESULTS.infeasible` when the
        iterates certify that the constraint set is empty, else
        `RESULTS.max_steps_reached`.
    - `aux`: the auxiliary coordinates that go with `y` (those of
        `Projector(n_aux=...)`, or the variables that `from_cvxpy`'s
        canonicalisation introduced), shape `(n_aux,)`; empty without them.
        `Projector.violation` of `concatenate([y, aux])` is `primal_residual`.
    """

    y: Float[Array, " d"]
    aux: Float[Array, " n_aux"]
    s: Float[Array, " n"]
    n_iter: Int[Array, ""]
    primal_residual: Float[Array, ""]
    fixed_point_residual: Float[Array, ""]
    result: RESULTS

    @property
    def n_steps(self) -> Int[Array, ""]:
        """Deprecated name of `n_iter`."""
        warnings.warn(
            "ProjectionSolution.n_steps is deprecated; use n_iter (the name used for "
            "iteration counts throughout pinet_eqx).",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.n_iter
