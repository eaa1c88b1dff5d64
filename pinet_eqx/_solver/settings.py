"""The forward solver's settings: `DouglasRachford`."""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

# sigma * gmean(d_y^2) for the "auto" step (see `DouglasRachford`); the sweep that
# chose it is in benchmarks/RESULTS.md ("Default sigma").
_AUTO_SIGMA = 0.2


class DouglasRachford(eqx.Module):
    """How the projection is computed: Douglas-Rachford splitting (paper Alg. 1).

    Each step is $z = \\Pi_{\\mathcal{A}}(s)$, $t = \\mathrm{prox}_{\\sigma
    h}(2z - s)$, $s \\leftarrow s + \\omega (t - z)$, in the equilibrated
    coordinates.

    **Arguments:**

    - `sigma`: the scaling $\\sigma > 0$, or `"auto"` (default):
        $\\sigma = 0.2 / \\mathrm{gmean}(d_y^2)$ with $d_y$ the equilibration's
        column scaling of $y$. In equilibrated coordinates the prox sees
        $\\sigma d_i^2$, so this makes the step invariant to how $y$ is scaled.
        With per-instance matrices it is computed per instance.
    - `omega`: the relaxation $\\omega \\in (0, 2)$.
    - `n_iter`: iterations in training mode (the cap, when `tol` is set).
    - `n_iter_test`: iterations in inference mode (`eqx.nn.inference_mode`);
        `None` (default) means `n_iter`, whatever `n_iter` is later set to;
        on sparse polyhedral sets, whose inference finishes with the host's
        active-set polish from the iterate's face, at most 10 (that finish
        needs a nearby face, not convergence; see the inference guide).
    - `tol`: if set, each instance stops as soon as its constraint violation and
        fixed-point residual (user units) are both at most `tol`, checked every 5
        iterations, with the iteration count (rounded up to a multiple of 5) as
        the cap, in training and in inference mode. `None` (default) runs the
        training iteration count exactly.
    - `tol_test`: inference mode's tolerance when `tol` is `None`, in user
        units; `"auto"` (default) is `1e-4` in single (or lower) precision and
        `1e-9` in double precision (`inference_tol`), so that a float64 output
        is as accurate as float64 users expect. After its `n_iter_test`
        iterations, each instance whose violation or fixed-point residual still
        exceeds it (one far from the set, say) goes on iterating, checked every
        5 iterations, up to `n_iter_test_max` in all. Instances that are
        already there cost one check. The refinement then takes the output to
        the rounding floor where it applies. `None` runs `n_iter_test`
        iterations exactly.
    - `n_iter_test_max`: the cap of inference mode's iterations under
        `tol_test` (default 1000).

    `ProjectionSolution.result` is `successful` when both residuals are at most
    the tolerance in force (`tol`, or `tol_test` in inference mode), or, for a
    fixed iteration count, at most `default_tol(dtype)`; an instance stopped by
    the cap is `max_steps_reached`. Every tolerance is raised, where needed, to
    $10\\,\\varepsilon \\max(1, \\|(y, C y)\\|_\\infty)$ ($\\varepsilon$ the dtype's
    machine epsilon): no iteration count resolves residuals below the rounding
    of the point itself.
    """

    # A leaf, not static: `pinet_eqx.autotune` sweeps it as a traced value.
    sigma: float | Literal["auto"] = "auto"
    omega: float = eqx.field(static=True, default=1.7)
    n_iter: int = eqx.field(static=True, default=50)
    n_iter_test: int | None = eqx.field(static=True, default=None)
    tol: float | None = eqx.field(static=True, default=None)
    tol_test: float | Literal["auto"] | None = eqx.field(static=True, default="auto")
    n_iter_test_max: int = eqx.field(static=True, default=1000)

    def __check_init__(self):
        sigma = self.sigma
        if not (_is_auto(sigma) or _positive(sigma)):
            raise ValueError(
                f"DouglasRachford(sigma={sigma!r}): sigma must be a float > 0 or "
                "'auto'."
            )
        if not (_real(self.omega) and 0 < self.omega < 2):
            raise ValueError(
                f"DouglasRachford(omega={self.omega!r}): omega must lie in (0, 2); "
                "1.7 is a good default."
            )
        if not _count(self.n_iter):
            raise ValueError(
                f"DouglasRachford(n_iter={self.n_iter!r}): must be an int >= 1."
            )
        if self.n_iter_test is not None and not _count(self.n_iter_test):
            raise ValueError(
                f"DouglasRachford(n_iter_test={self.n_iter_test!r}): must be an int "
                ">= 1, or None for the same as n_iter."
            )
        if self.tol is not None and not _positive(self.tol):
            raise ValueError(
                f"DouglasRachford(tol={self.tol!r}): must be a float > 0, or None "
                "for a fixed iteration count."
            )

        tol_test = self.tol_test
        if not (tol_test is None or _is_auto(tol_test) or _positive(tol_test)):
            raise ValueError(
                f"DouglasRachford(tol_test={tol_test!r}): must be a float > 0, "
                "'auto', or None for exactly n_iter_test iterations in inference "
                "mode."
            )
        if not _count(self.n_iter_test_max):
            raise ValueError(
                f"DouglasRachford(n_iter_test_max={self.n_iter_test_max!r}): must be "
                "an int >= 1."
            )

    def schedule(self, inference: bool, dtype) -> tuple[int, int, float | None]:
        """`(n_min, n_max, tol)` for arrays of `dtype`: every instance runs
        `n_min` iterations, then those above `tol` go on up to `n_max`
        (`tol=None`: exactly `n_max`)."""
        tol_test = self.inference_tol(dtype)
        if not inference or self.tol is not None or tol_test is None:
            return 0, self.steps(inference), self.tol
        n_min = self.steps(True)
        return n_min, max(n_min, self.n_iter_test_max), tol_test

    def inference_tol(self, dtype) -> float | None:
        """`tol_test` for arrays of `dtype`, with `"auto"` resolved: `1e-4` in
        single (or lower) precision, `default_tol(dtype)` (1e-9) in double."""
        if isinstance(self.tol_test, str):  # checked: the only string is "auto"
            return 1e-4 if jnp.finfo(dtype).bits < 64 else self.default_tol(dtype)
        return self.tol_test

    def steps(self, inference: bool) -> int:
        """The iteration count (or cap) in training or inference mode."""
        if inference and self.n_iter_test is not None:
            return self.n_iter_test
        return self.n_iter

    def step_size(self, d_y) -> float | Array | np.ndarray:
        """$\\sigma$ for an equilibration column scaling `d_y` of $y$ (a NumPy
        or JAX array): `sigma` itself unless it is `"auto"`."""
        if not isinstance(self.sigma, str):  # checked: the only string is "auto"
            return self.sigma
        xp = np if isinstance(d_y, np.ndarray) else jnp
        return _AUTO_SIGMA / xp.exp(xp.mean(xp.log(d_y**2)))

    @staticmethod
    def default_tol(dtype) -> float:
        """The accuracy `result` asks of a fixed-count run (`tol=None`): 1e-5
        in single (or lower) precision and 1e-9 in double precision."""
        return 1e-9 if jnp.finfo(dtype).bits >= 64 else 1e-5


def solver_from_keywords(
    solver: DouglasRachford | None, shorthands: dict
) -> DouglasRachford:
    """`solver`, or one built from `Projector`'s shorthand keywords (not both)."""
    given = {k: v for k, v in shorthands.items() if v is not None}
    if solver is None:
        return DouglasRachford(**given)
    if not isinstance(solver, DouglasRachford):
        raise TypeError(
            f"Projector(solver={solver!r}): must be a pinet_eqx.DouglasRachford."
        )
    if given:
        raise ValueError(
            f"Projector: pass either `solver=` or {sorted(given)}, not both (they "
            "are fields of the solver)."
        )
    return solver


def _is_auto(sigma) -> bool:
    return isinstance(sigma, str) and sigma == "auto"


def _real(x) -> bool:
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(
        x, bool
    )


def _positive(x) -> bool:
    return bool(_real(x) and x > 0)


def _count(n) -> bool:
    return bool(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1)
