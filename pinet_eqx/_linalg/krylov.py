"""Krylov solvers for the implicit backward pass, as `lineax` linear solvers.

Both solve one instance's system; under `jax.vmap` every instance keeps its own
scalars and its own stopping test (a converged instance is frozen by the batched
`while_loop`), so one instance can never change another's gradient. Both stop on
the Euclidean residual, $\\|b - A x\\|_2 \\le \\mathrm{rtol}\\,\\|b\\|_2 +
\\mathrm{atol}$, and never return a non-finite iterate.

They report non-convergence themselves (`on_failure`), and tell lineax the solve
succeeded: lineax transposes a solve for reverse-mode AD with `throw=True`
unconditionally, which would otherwise turn every unconverged backward solve into
an error.
"""

from __future__ import annotations

import abc
import warnings
from typing import Any, Literal

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import lineax as lx

BWD_NOT_CONVERGED = (
    "pinet_eqx: the implicit backward linear solve did not reach its tolerance "
    "within its step limit for at least one instance, so the returned gradient is "
    "approximate. Give the adjoint's solver more steps, e.g. "
    "`adjoint=pe.ImplicitAdjoint(linear_solver=pe.BiCGStab(max_steps=...))`, "
    "increase `n_iter` so the forward pass is closer to the fixed point, or pass "
    "`ImplicitAdjoint(on_failure='ignore')` to silence this."
)

BWD_NOT_CONVERGED_RAISE = (
    "pinet_eqx: the implicit backward linear solve did not converge within its "
    "step limit. Give the adjoint's solver more steps (its `max_steps`) or "
    "increase `n_iter`, or pass `ImplicitAdjoint(on_failure='warn')`."
)


OnFailure = Literal["warn", "raise", "ignore"]
_ON_FAILURE = ("warn", "raise", "ignore")


class BackwardNotConvergedWarning(RuntimeWarning):
    """The implicit backward solve stopped at its step limit before its tolerance."""


def _warn():
    warnings.warn(BWD_NOT_CONVERGED, BackwardNotConvergedWarning, stacklevel=2)


def default_rtol(dtype) -> float:
    """A relative tolerance near the dtype's attainable accuracy: 1e-6 in float32,
    1e-11 in float64."""
    return 1e-6 if jnp.finfo(dtype).bits <= 32 else 1e-11


def _report(x, converged, on_failure: str):
    """Apply `on_failure` to an unconverged solve; returns `x` (possibly wrapped)."""
    failed = jnp.logical_not(converged)
    if on_failure == "raise":
        return eqx.error_if(x, failed, BWD_NOT_CONVERGED_RAISE)
    if on_failure == "warn":
        # `unvmap_any` reduces over every vmapped axis, so the host callback fires
        # at most once per solve (not once per instance), and only on failure.
        jax.lax.cond(
            eqxi.unvmap_any(failed), lambda: jax.debug.callback(_warn), lambda: None
        )
    return x


class _AbstractKrylov(lx.AbstractLinearSolver):
    """Shared settings and lineax plumbing of the two solvers."""

    rtol: float | None = None
    atol: float = 0.0
    max_steps: int | None = None
    on_failure: str = eqx.field(default="warn", static=True)

    def __check_init__(self):
        if self.rtol is not None and not self.rtol >= 0:
            raise ValueError(
                f"{type(self).__name__}(rtol={self.rtol!r}): must be >= 0."
            )
        if not self.atol >= 0:
            raise ValueError(
                f"{type(self).__name__}(atol={self.atol!r}): must be >= 0."
            )
        if self.max_steps is not None and not (
            isinstance(self.max_steps, int) and self.max_steps >= 1
        ):
            raise ValueError(
                f"{type(self).__name__}(max_steps={self.max_steps!r}): must be an int "
                ">= 1 or None."
            )
        if self.on_failure not in _ON_FAILURE:
            raise ValueError(
                f"{type(self).__name__}(on_failure={self.on_failure!r}): must be one "
                f"of {_ON_FAILURE}."
            )

    def init(self, operator: lx.AbstractLinearOperator, options: dict[str, Any]):
        del options
        if operator.in_size() != operator.out_size():
            raise ValueError(f"{type(self).__name__} needs a square operator.")
        return operator

    def transpose(self, state, options):
        del options
        return state.transpose(), {}

    def conj(self, state, options):
        del options
        return state, {}

    def assume_full_rank(self):
        return True

    def compute(self, state, vector, options):
        del options
        b = _ravel(vector)
        rtol = default_rtol(b.dtype) if self.rtol is None else self.rtol
        max_steps = b.size + 10 if self.max_steps is None else self.max_steps
        threshold = rtol * jnp.linalg.norm(b) + self.atol
        x, converged, steps = self._iterate(state, b, threshold, max_steps)
        # Failure is reported here (warn/raise/ignore), and lineax is told
        # "successful": it transposes solves with `throw=True` unconditionally.
        x = _report(x, converged, self.on_failure)
        return x, lx.RESULTS.successful, {"num_steps": steps, "converged": converged}

    @abc.abstractmethod
    def _iterate(
        self, operator, b, threshold, max_steps
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Solve `operator x = b` to the 2-norm residual `threshold`.

        **Returns:** `(x, converged, steps)`, with `x` finite.
        """


def _ravel(vector):
    if not isinstance(vector, jax.Array) or vector.ndim != 1:
        raise ValueError("pinet_eqx's Krylov solvers take a single 1-D array.")
    return vector


class ConjugateGradient(_AbstractKrylov):
    """Conjugate gradients for a symmetric positive semi-definite system.

    Exact in at most as many steps as the operator has distinct eigenvalues, so a
    masked active-set system (identity on the inactive rows) needs at most one
    step more than its number of active rows.

    **Arguments:**

    - `rtol`, `atol`: stop when $\\|b - A x\\|_2 \\le \\mathrm{rtol}\\|b\\|_2 +
        \\mathrm{atol}$. `rtol=None` picks one for the dtype (see `default_rtol`).
    - `max_steps`: step limit; `None` means the system size plus 10.
    - `on_failure`: `"warn"`, `"raise"` or `"ignore"` when the limit is reached first.
    """

    def _iterate(self, operator, b, threshold, max_steps):
        tiny = jnp.finfo(b.dtype).tiny

        def cond(carry):
            _, r, _, _, k, done = carry
            return (k < max_steps) & ~done

        def body(carry):
            x, r, p, gamma, k, _ = carry
            Ap = operator.mv(p)
            curvature = jnp.dot(p, Ap)
            # A non-positive curvature means p is (numerically) in the null space
            # or the solve has stagnated: stop with the current finite iterate.
            ok = (curvature > tiny) & jnp.isfinite(curvature)
            alpha = jnp.where(ok, gamma / jnp.where(ok, curvature, 1), 0)
            x = x + alpha * p
            r = r - alpha * Ap
            gamma_new = jnp.dot(r, r)
            beta = gamma_new / jnp.where(gamma > tiny, gamma, 1)
            p = r + beta * p
            done = ~ok | (jnp.sqrt(gamma_new) <= threshold)
            return x, r, p, gamma_new, k + 1, done

        x0 = jnp.zeros_like(b)
        gamma0 = jnp.dot(b, b)
        init = (x0, b, b, gamma0, jnp.asarray(0), jnp.sqrt(gamma0) <= threshold)
        x, _, _, gamma, steps, _ = jax.lax.while_loop(cond, body, init)
        return x, jnp.sqrt(gamma) <= threshold, steps


class BiCGStab(_AbstractKrylov):
    """Stabilised bi-conjugate gradients for a general square system.

    Breakdowns are detected on the magnitudes of $\\rho$, $\\alpha$ and $\\omega$
    (they are legitimately signed) and handled by restarting from the current
    iterate with a fresh shadow residual, inside the same loop.

    **Arguments:**

    - `rtol`, `atol`: stop when $\\|b - A x\\|_2 \\le \\mathrm{rtol}\\|b\\|_2 +
        \\mathrm{atol}$. `rtol=None` picks one for the dtype (see `default_rtol`).
    - `max_steps`: step limit (each step costs two operator products); `None`
        means the system size plus 10.
    - `on_failure`: `"warn"`, `"raise"` or `"ignore"` when the limit is reached first.
    """

    def _iterate(self, operator, b, threshold, max_steps):
        eps = jnp.finfo(b.dtype).eps

        def cond(carry):
            k, done = carry[-2:]
            return (k < max_steps) & ~done

        def body(carry):
            x, r, r_hat, p, v, rho, alpha, omega, k, _ = carry
            rho_new = jnp.dot(r_hat, r)
            # Breakdown when the shadow residual has become (nearly) orthogonal
            # to r: restart with r_hat = r.
            scale = jnp.linalg.norm(r_hat) * jnp.linalg.norm(r)
            restart = jnp.abs(rho_new) <= eps * scale
            r_hat = jnp.where(restart, r, r_hat)
            rho_new = jnp.where(restart, jnp.dot(r, r), rho_new)
            beta = jnp.where(
                restart, 0.0, (rho_new / _safe(rho)) * (alpha / _safe(omega))
            )
            p = r + beta * (p - omega * v)
            v = operator.mv(p)
            denom = jnp.dot(r_hat, v)
            ok = jnp.abs(denom) > eps * jnp.linalg.norm(r_hat) * jnp.linalg.norm(v)
            alpha = jnp.where(ok, rho_new / _safe(denom), 0.0)
            s = r - alpha * v
            t = operator.mv(s)
            tt = jnp.dot(t, t)
            omega = jnp.where(tt > 0, jnp.dot(t, s) / _safe(tt), 0.0)
            x_new = x + alpha * p + omega * s
            r_new = s - omega * t
            finite = jnp.all(jnp.isfinite(x_new)) & jnp.all(jnp.isfinite(r_new))
            x = jnp.where(finite, x_new, x)
            r = jnp.where(finite, r_new, r)
            done = ~finite | (jnp.linalg.norm(r) <= threshold)
            # omega = 0 would zero beta next step: restart instead.
            omega = jnp.where(jnp.abs(omega) > eps, omega, 1.0)
            return x, r, r_hat, p, v, rho_new, alpha, omega, k + 1, done

        zero = jnp.zeros_like(b)
        one = jnp.ones((), b.dtype)
        init = (
            zero,
            b,
            b,
            zero,
            zero,
            one,
            one,
            one,
            jnp.asarray(0),
            jnp.linalg.norm(b) <= threshold,
        )
        x, r, *_, steps, _ = jax.lax.while_loop(cond, body, init)
        return x, jnp.linalg.norm(r) <= threshold, steps


def _safe(x):
    """`x`, with exact zeros replaced by one (for divisions that a `where` masks)."""
    return jnp.where(x == 0, jnp.ones_like(x), x)
