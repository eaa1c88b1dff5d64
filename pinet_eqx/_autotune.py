"""Auto-tuning of the Douglas-Rachford scaling and iteration count (paper App. H.2)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float, Int

from ._adjoint.adjoint import ImplicitAdjoint
from ._projector.projector import Projector

DEFAULT_SIGMAS = np.logspace(-3, np.log10(5.05), 100)
DEFAULT_N_ITERS = (50, 100, 150, 200, 250, 300, 350, 400)


@dataclasses.dataclass(frozen=True)
class AutotuneResult:
    """What `pinet_eqx.autotune` chose, and the scores it chose from.

    **Fields:**

    - `projector`: the input projector with the chosen `sigma` and `n_iter`; its
        inference count `n_iter_test` is the larger of the chosen count and the
        input projector's, so that inference stays at least as accurate.
    - `sigma`, `n_iter`: the chosen values.
    - `sigmas`, `sigma_violation`, `sigma_suboptimality`: the $\\sigma$ grid and,
        for each value, the largest constraint violation and the mean relative
        suboptimality $|\\|z_K - y_{raw}\\| / \\|\\Pi(y_{raw}) - y_{raw}\\| - 1|$
        over the tuning points, after `tune_iter` iterations.
    - `n_iters`, `n_iter_violation`, `n_iter_suboptimality`: the same for each
        iteration count (sorted, without repeats), at the chosen $\\sigma$.
    - `seconds`: wall-clock time of the whole search, compilation included.
    """

    projector: Projector
    sigma: float
    n_iter: int
    sigmas: Float[np.ndarray, " s"]
    sigma_violation: Float[np.ndarray, " s"]
    sigma_suboptimality: Float[np.ndarray, " s"]
    n_iters: tuple[int, ...]
    n_iter_violation: Float[np.ndarray, " k"]
    n_iter_suboptimality: Float[np.ndarray, " k"]
    seconds: float


def _scores(projector: Projector, Y, params, reference_distance, s0=None):
    """(max violation, mean relative suboptimality, final iterates) of a batch of
    projections, each starting from its row of `s0` (`None`: the default start)."""

    def one(y_raw, s, p):
        # Unrefined, the solution's primal residual is `projector.violation`.
        sol = projector.solve(y_raw, s0=s, **p)
        return sol.primal_residual, jnp.linalg.norm(sol.y - y_raw), sol.s

    viol, dist, s = jax.vmap(one)(Y, s0, params)
    return jnp.max(viol), jnp.mean(jnp.abs(dist / reference_distance - 1)), s


_score_from = eqx.filter_jit(_scores)

# Violations below this fraction of `violation_tol` count as ties (rounding noise).
_TIE_FLOOR = 1e-3


@eqx.filter_jit
def _score_sigmas(base, sigma_values, Y, params, reference_distance, batch: int):
    """`_scores` for each sigma in `sigma_values`, `batch` of them at a time under
    `jax.vmap`; sigma is a traced leaf, so the grid is one compiled call. The data
    are arguments, not closed-over constants, so XLA does not constant-fold them."""

    def score(sigma):
        proj = eqx.tree_at(lambda p: p.solver.sigma, base, sigma)
        return _scores(proj, Y, params, reference_distance)[:2]

    return jax.lax.map(score, sigma_values, batch_size=batch)


def _choose(violation, suboptimality, violation_tol, suboptimality_tol, first):
    """Index of the chosen candidate: among those within both tolerances, the first
    (`first=True`) or the one with the smallest violation; if none qualifies, the
    smallest violation overall."""
    ok = (violation <= violation_tol) & (suboptimality <= suboptimality_tol)
    if not ok.any():
        return int(np.nanargmin(violation))
    if first:
        return int(np.flatnonzero(ok)[0])
    return int(np.flatnonzero(ok)[np.nanargmin(violation[ok])])


def autotune(
    projector: Projector,
    y_raw: Float[ArrayLike, "b d"],
    params: dict[str, ArrayLike] | None = None,
    *,
    sigmas: Sequence[float] | Float[np.ndarray, " s"] | None = None,
    n_iters: Sequence[int] | Int[np.ndarray, " n"] = DEFAULT_N_ITERS,
    tune_iter: int = 100,
    violation_tol: float = 1e-4,
    suboptimality_tol: float = 1e-3,
    sigma_batch: int = 10,
) -> AutotuneResult:
    """Tune `sigma` and `n_iter` of a projector on sample points (paper App. H.2).

    First every $\\sigma$ on the grid runs `tune_iter` iterations on the points;
    among the values whose largest constraint violation is at most `violation_tol`
    and whose mean relative suboptimality
    $|\\|z_K - y_{raw}\\| / \\|\\Pi(y_{raw}) - y_{raw}\\| - 1|$ is at most
    `suboptimality_tol`, the one with the smallest violation wins (values that all
    reach rounding level are re-scored with half the iterations, still subject to
    both tolerances, until one leads).
    Then, at that $\\sigma$, the smallest iteration count in `n_iters` meeting both
    tolerances is chosen (the paper's "smallest violation" rule would always pick
    the largest count). If no candidate meets the tolerances, the smallest
    violation is taken.
    The exact projection $\\Pi(y_{raw})$ is computed once, by running the projector
    to a tolerance of 1e-9 (5000 iterations at most).

    Scores are of the iteration itself: the projector's refinement, if any, is
    left out while scoring (it would take every candidate to rounding level) and
    kept in the tuned projector. The $\\sigma$ grid is evaluated in batches of
    `sigma_batch` values with `jax.vmap`, and each iteration count continues from
    the iterates of the count before it (sorted), so the whole search is a
    handful of compiled calls.

    **Arguments:**

    - `projector`: the `Projector` to tune.
    - `y_raw`: tuning points, shape `(b, d)`; the paper uses 150 standard-normal
        points as a stand-in for an untrained backbone's output.
    - `params`: the projector's parameters for each point, each of shape
        `(b, ...)` (for example 150 validation contexts).
    - `sigmas`: the grid (default: 100 log-spaced values from 1e-3 to 5.05).
    - `n_iters`: candidate iteration counts (default 50, 100, ..., 400).
    - `tune_iter`: iterations used to score each $\\sigma$ (default 100).
    - `violation_tol`, `suboptimality_tol`: the tolerances above.
    - `sigma_batch`: how many $\\sigma$ values to evaluate at once.

    **Returns:** an `AutotuneResult`, whose `projector` carries the chosen settings.
    """
    start = time.perf_counter()
    Y, arrays, grid, n_iters = _checked(projector, y_raw, params, sigmas, n_iters)
    plain, reference_distance = _reference(projector, Y, arrays)
    tols = (violation_tol, suboptimality_tol)
    sigma, viol, subopt = _tune_sigma(
        plain, Y, arrays, reference_distance, grid, tune_iter, tols, sigma_batch
    )
    n_iter, n_viol, n_subopt = _tune_n_iter(
        plain, sigma, Y, arrays, reference_distance, n_iters, tols
    )

    # Inference keeps at least the iterations it had: tuning for the training
    # budget must not make inference less accurate.
    n_test = max(n_iter, projector.n_iter_test)
    tuned = projector.with_settings(sigma=sigma, n_iter=n_iter, n_iter_test=n_test)
    return AutotuneResult(
        projector=tuned,
        sigma=sigma,
        n_iter=n_iter,
        sigmas=grid,
        sigma_violation=viol,
        sigma_suboptimality=subopt,
        n_iters=n_iters,
        n_iter_violation=n_viol,
        n_iter_suboptimality=n_subopt,
        seconds=time.perf_counter() - start,
    )


def _checked(projector, y_raw, params, sigmas, n_iters):
    """`autotune`'s arguments checked: `(Y, params, sigma grid, sorted n_iters)`."""
    Y = jnp.asarray(y_raw)
    if Y.ndim != 2 or Y.shape[1] != projector.dim:
        raise ValueError(
            f"autotune(projector, y_raw): `y_raw` must have shape (b, "
            f"{projector.dim}) (a batch of points), got {Y.shape}."
        )
    arrays = {k: jnp.asarray(v) for k, v in (params or {}).items()}
    for name, value in arrays.items():
        if value.shape[:1] != Y.shape[:1]:
            raise ValueError(
                f"autotune(projector, y_raw, params): parameter `{name}` must have "
                f"one row per point ({Y.shape[0]}), got shape {value.shape}."
            )
    grid = np.asarray(DEFAULT_SIGMAS if sigmas is None else sigmas, np.float64)
    n_iters = tuple(sorted({int(n) for n in n_iters}))
    if grid.ndim != 1 or grid.size == 0 or np.any(grid <= 0):
        raise ValueError(
            "autotune(sigmas=...): must be a non-empty list of floats > 0."
        )
    if not n_iters or min(n_iters) < 1:
        raise ValueError(
            "autotune(n_iters=...): must be a non-empty list of ints >= 1."
        )
    return Y, arrays, grid, n_iters


def _tune_sigma(plain, Y, arrays, reference_distance, grid, tune_iter, tols, batch):
    """The grid's best $\\sigma$ after `tune_iter` iterations, ties re-scored
    with fewer: `(sigma, violations, suboptimalities)` of the grid."""
    violation_tol, suboptimality_tol = tols

    def score_grid(sigma_values, iters):
        base = plain.with_settings(sigma=1.0, n_iter=iters, tol=None)
        values = jnp.asarray(sigma_values, Y.dtype)
        out = _score_sigmas(base, values, Y, arrays, reference_distance, batch)
        return tuple(np.asarray(o, np.float64) for o in out)

    viol, subopt = score_grid(grid, tune_iter)
    best = _choose(viol, subopt, violation_tol, suboptimality_tol, first=False)
    # Once several candidates are at the noise floor their violations no longer
    # rank them; re-score those with half the iterations until one leads.
    ok = (viol <= violation_tol) & (subopt <= suboptimality_tol)
    tied = np.flatnonzero(ok & (viol <= _TIE_FLOOR * violation_tol))
    iters = tune_iter
    while tied.size > 1 and iters > 5:
        iters //= 2
        v, sub = score_grid(grid[tied], iters)
        # Only values that still meet both tolerances compete (a tiny sigma
        # converges fast to a feasible point that is not the projection).
        passing = (v <= violation_tol) & (sub <= suboptimality_tol)
        if not passing.any():
            break
        best = int(tied[passing][np.nanargmin(v[passing])])
        tied = tied[passing & (v <= _TIE_FLOOR * violation_tol)]
    sigma = float(grid[best])
    return sigma, viol, subopt


def _tune_n_iter(plain, sigma, Y, arrays, reference_distance, n_iters, tols):
    """The smallest count in `n_iters` meeting `tols` at `sigma`:
    `(n_iter, violations, suboptimalities)` of the counts."""
    violation_tol, suboptimality_tol = tols
    # Each count continues from the iterates of the one before (the iteration
    # is a fixed map of its state), so the counts cost the largest one in all,
    # and one compiled call per distinct step between them.
    n_viol, n_subopt = [], []
    s, done = None, 0
    for n in n_iters:
        proj = plain.with_settings(sigma=sigma, n_iter=n - done, tol=None)
        v, sub, s = _score_from(proj, Y, arrays, reference_distance, s)
        n_viol.append(float(v))
        n_subopt.append(float(sub))
        done = n
    n_viol, n_subopt = np.asarray(n_viol), np.asarray(n_subopt)
    n_iter = n_iters[_choose(n_viol, n_subopt, violation_tol, suboptimality_tol, True)]
    return n_iter, n_viol, n_subopt


def _reference(projector, Y, arrays):
    """The projector that is scored, `plain`, and each point's distance to its
    exact projection (1e-9 accurate, and at least 1e-12)."""
    # Scores measure the iteration itself: a refinement would take every sigma's
    # output to rounding level and leave nothing to rank. Nothing is
    # differentiated here, so the adjoint is the one that allows a tolerance.
    plain = projector.with_settings(
        refine=False, inference=False, adjoint=ImplicitAdjoint()
    )
    exact = plain.with_settings(tol=1e-9, n_iter=5000)
    Pi = eqx.filter_jit(jax.vmap(lambda y, p: exact(y, **p)))(Y, arrays)
    reference_distance = jnp.linalg.norm(Pi - Y, axis=1)
    # A point already in the set has distance 0; score it against a tiny distance
    # instead of dividing by zero.
    reference_distance = jnp.maximum(reference_distance, 1e-12)
    return plain, reference_distance
