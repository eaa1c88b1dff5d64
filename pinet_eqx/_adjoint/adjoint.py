"""How a `Projector` is differentiated: the adjoint objects (optimistix style)."""

from __future__ import annotations

import dataclasses
from typing import Literal

import equinox as eqx
import lineax as lx

from .._linalg.krylov import _ON_FAILURE, BiCGStab, ConjugateGradient

_METHODS = ("auto", "active_set", "fixed_point")

# Step limit of the default BiCGStab on the fixed-point system (each step costs
# two Jacobian products); the active-set CG is exact in (active rows + 1) steps.
_FIXED_POINT_MAX_STEPS = 100


class AbstractAdjoint(eqx.Module):
    """How gradients (and tangents) of the projection are computed."""


class ImplicitAdjoint(AbstractAdjoint):
    """Differentiate the projection implicitly, at the solution the forward pass
    found, without storing or unrolling its iterations (the default).

    Two derivatives are available; both are exact at an exact solution:

    - `"active_set"`: for polyhedral sets (`Equality`, `AffineInequality`, `Box`),
        the projection is locally the projection onto the active constraints
        $\\{M y = h\\}$, with tangent $\\dot y = r - M^\\top (M M^\\top)^{-1}
        (M r - \\dot h + \\dot M y)$, $r = \\dot y_{raw} - \\dot M^\\top \\lambda$:
        one symmetric positive-definite solve over the active inequality and box
        rows (fixed equality rows are eliminated once, at construction).
    - `"fixed_point"`: the implicit function theorem at the Douglas-Rachford
        fixed point, $(I - \\partial_s \\Phi)\\,\\dot s = \\partial_\\theta \\Phi\\,
        \\dot\\theta$ (paper eq. 8-9), a non-symmetric solve. Works for every set.

    `"auto"` (default) uses `"active_set"` when every set is polyhedral and
    `"fixed_point"` otherwise. Both are `jax.custom_jvp` rules around a
    `lineax.linear_solve`, so forward mode (`jax.jvp`, `jax.jacfwd`,
    `jax.hessian`) works as well as reverse mode, and every instance of a
    `jax.vmap`ped batch is solved on its own.

    **Arguments:**

    - `method`: `"auto"`, `"active_set"` or `"fixed_point"`.
    - `rtol`, `atol`, `max_steps`: settings of the default solvers
        (`pinet_eqx.ConjugateGradient` for the active set, `pinet_eqx.BiCGStab`
        with at most 100 steps for the fixed point). `rtol=None` picks one for
        the dtype.
    - `linear_solver`: any `lineax.AbstractLinearSolver` instead of the defaults
        (then leave `rtol`, `atol` and `max_steps` unset).
    - `on_failure`: when the solve stops at its step limit: `"warn"` (a
        `BackwardNotConvergedWarning`, once per solve), `"raise"` or `"ignore"`.
        Applies to pinet_eqx's own solvers; lineax's raise.
    """

    method: Literal["auto", "active_set", "fixed_point"] = eqx.field(
        default="auto", static=True
    )
    rtol: float | None = eqx.field(default=None, static=True)
    atol: float | None = eqx.field(default=None, static=True)
    max_steps: int | None = eqx.field(default=None, static=True)
    linear_solver: lx.AbstractLinearSolver | None = None
    on_failure: Literal["warn", "raise", "ignore"] = eqx.field(
        default="warn", static=True
    )

    def __check_init__(self):
        if self.method not in _METHODS:
            raise ValueError(
                f"ImplicitAdjoint(method={self.method!r}): must be one of {_METHODS}."
            )
        if self.on_failure not in _ON_FAILURE:
            raise ValueError(
                f"ImplicitAdjoint(on_failure={self.on_failure!r}): must be one of "
                f"{_ON_FAILURE}."
            )
        if self.linear_solver is not None:
            if not isinstance(self.linear_solver, lx.AbstractLinearSolver):
                raise TypeError(
                    "ImplicitAdjoint(linear_solver=...): must be a lineax linear "
                    f"solver, got {type(self.linear_solver).__name__}."
                )
            given = [
                k for k in ("rtol", "atol", "max_steps") if getattr(self, k) is not None
            ]
            if given:
                raise ValueError(
                    f"ImplicitAdjoint: {given} configure the default solvers; with "
                    "`linear_solver=` set them on that solver instead."
                )
        # Validates rtol/atol/max_steps with the solvers' own checks.
        self._default_solver(active_set=True)
        self._default_solver(active_set=False)

    def uses_active_set(self, polyhedral: bool) -> bool:
        """Whether the closed-form active-set derivative is used."""
        if self.method == "active_set" and not polyhedral:
            raise ValueError(
                "ImplicitAdjoint(method='active_set') needs polyhedral sets only "
                "(Equality, AffineInequality, Box); use method='fixed_point' or "
                "'auto' with cones and simplices."
            )
        return polyhedral and self.method != "fixed_point"

    def solver(self, polyhedral: bool) -> lx.AbstractLinearSolver:
        """The linear solver of the tangent system."""
        if self.linear_solver is not None:
            solver = self.linear_solver
            if isinstance(solver, (ConjugateGradient, BiCGStab)):
                solver = dataclasses.replace(solver, on_failure=self.on_failure)
            return solver
        return self._default_solver(self.uses_active_set(polyhedral))

    def _default_solver(self, active_set: bool) -> lx.AbstractLinearSolver:
        atol = 0.0 if self.atol is None else self.atol
        if active_set:
            return ConjugateGradient(
                rtol=self.rtol,
                atol=atol,
                max_steps=self.max_steps,
                on_failure=self.on_failure,
            )
        max_steps = _FIXED_POINT_MAX_STEPS if self.max_steps is None else self.max_steps
        return BiCGStab(
            rtol=self.rtol, atol=atol, max_steps=max_steps, on_failure=self.on_failure
        )


class UnrolledAdjoint(AbstractAdjoint):
    """Differentiate by unrolling the forward iterations (reverse or forward mode
    through every step). Memory grows with the iteration count; meant for
    ablations and as a second opinion. Needs a fixed iteration count (`tol=None`).
    """


def check_adjoint(adjoint, tol: float | None) -> None:
    """Raise unless `adjoint` is an adjoint that works with the stopping `tol`."""
    if not isinstance(adjoint, AbstractAdjoint):
        raise TypeError(
            f"Projector(adjoint={adjoint!r}): must be pinet_eqx.ImplicitAdjoint() or "
            "pinet_eqx.UnrolledAdjoint()."
        )
    if isinstance(adjoint, UnrolledAdjoint) and tol is not None:
        raise ValueError(
            "Projector(adjoint=UnrolledAdjoint(), tol=...): unrolled differentiation "
            "needs a fixed iteration count; set tol=None."
        )
