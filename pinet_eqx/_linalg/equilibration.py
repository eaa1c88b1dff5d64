"""Modified Ruiz equilibration (paper App. H.1, Algorithm 'Modified Ruiz').

One sweep is written once, for NumPy (fixed matrices, on the host in float64) and
for JAX (per-instance matrices, traced and batched with `jax.vmap`).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

_MODES = ("gauss_seidel", "jacobi")


class Equilibration(eqx.Module):
    """Settings of the modified Ruiz equilibration of the lifted matrix (paper
    App. H.1), which a `Projector` runs before factorising it.

    **Arguments:**

    - `n_iter`: the maximum number of sweeps $K$ (paper: 25).
    - `tol`: the tolerance $\\varepsilon$ on the spread of the row and column
        norms (paper: 1e-3).
    - `mode`: `"gauss_seidel"` (paper's choice) or `"jacobi"`; see `equilibrate`.
    - `y`: `"shared"` (default) gives every coordinate of $y$ one column scale,
        so the projection's objective $\\|y - y_{raw}\\|^2$ stays isotropic in
        the scaled coordinates and $\\sigma$ has one meaning for all of them;
        rows and auxiliary variables are still balanced freely. `"per_column"`
        is the paper's variant, one scale per column.
    """

    n_iter: int = eqx.field(static=True, default=25)
    tol: float = eqx.field(static=True, default=1e-3)
    mode: Literal["gauss_seidel", "jacobi"] = eqx.field(
        static=True, default="gauss_seidel"
    )
    y: Literal["shared", "per_column"] = eqx.field(static=True, default="shared")

    def __check_init__(self):
        if not (isinstance(self.n_iter, int) and self.n_iter >= 0):
            raise ValueError(
                f"Equilibration(n_iter={self.n_iter!r}): must be an int >= 0."
            )
        if not (isinstance(self.tol, (int, float)) and self.tol >= 0):
            raise ValueError(f"Equilibration(tol={self.tol!r}): must be a float >= 0.")
        if self.mode not in _MODES:
            raise ValueError(
                f"Equilibration(mode={self.mode!r}): must be 'gauss_seidel' or "
                "'jacobi'."
            )
        if self.y not in ("shared", "per_column"):
            raise ValueError(
                f"Equilibration(y={self.y!r}): must be 'shared' or 'per_column'."
            )


def _safe_inv_sqrt(xp, norms):
    # An all-zero row or column carries no information to balance; leave it alone
    # instead of dividing by zero.
    positive = norms > 0
    return xp.where(positive, 1.0 / xp.sqrt(xp.where(positive, norms, 1.0)), 1.0)


def _column_norms(xp, scaled, groups, n_groups):
    return _group_rms(xp, xp.sqrt(xp.sum(scaled * scaled, axis=0)), groups, n_groups)


def _group_rms(xp, norms, groups, n_groups):
    if groups is None:
        return norms
    # Columns coupled by one cone block must share one scale, or the scaling would
    # distort the cone; give each group the RMS of its members' norms.
    sq = norms * norms
    if xp is np:
        total = np.bincount(groups, weights=sq, minlength=n_groups)
        count = np.bincount(groups, minlength=n_groups)
    else:
        total = jax.ops.segment_sum(sq, groups, num_segments=n_groups)
        count = jax.ops.segment_sum(jnp.ones_like(sq), groups, num_segments=n_groups)
    return xp.sqrt(total[groups] / count[groups])


def lifted_start(xp, C, m_eq: int, d: int, groups, n_groups: int):
    r"""Starting scalings of the lifted matrix $[E\ 0;\ C\ -I]$ that undo any
    row scaling of $C$: inequality row $i$ and its auxiliary column are scaled by
    $1/\|C_i\|$ and $\|C_i\|$ (the RMS over a column group), so the row starts
    as $[C_i / \|C_i\|,\ -1]$.

    Ruiz's square-root steps would take over 100 sweeps to undo rows scaled over
    $10^{\pm 5}$ (the auxiliary column couples each row to its own scale); the
    iteration then converges to the projection far too slowly.

    **Returns:** `(d_r0, d_c0)`, of shapes `(m_eq + m,)` and `(d + m,)`.
    """
    norms = xp.sqrt(xp.sum(C * C, axis=1))
    norms = xp.where(norms > 0, norms, 1.0)
    if groups is not None:
        padded = xp.concatenate([xp.ones(d, C.dtype), norms])[None, :]
        norms = _column_norms(xp, padded, groups, n_groups)[d:]
    d_r0 = xp.concatenate([xp.ones(m_eq, C.dtype), 1.0 / norms])
    return d_r0, xp.concatenate([xp.ones(d, C.dtype), norms])


def equilibrate_lifted(
    xp, lifted, C, m_eq: int, d: int, groups, n_groups: int, settings: Equilibration
):
    """Ruiz scalings of the lifted matrix $[E\\ 0;\\ C\\ -I]$ (`lifted`),
    started from `lifted_start`: $D_r = D_r' D_{r,0}$, $D_c = D_c' D_{c,0}$ with
    $D_r', D_c'$ the sweeps' scalings of $D_{r,0} M D_{c,0}$.

    With `xp` NumPy the sweeps run on the host (`equilibrate`); with `jax.numpy`
    they are traced (`equilibrate_traced`). `groups` are labels `0..n_groups-1`
    (see `group_labels`) or `None`.

    **Returns:** `(d_r, d_c)`, of shapes `(m_eq + m,)` and `(d + m,)`.
    """
    d_r0, d_c0 = lifted_start(xp, C, m_eq, d, groups, n_groups)
    start = d_r0[:, None] * lifted * d_c0[None, :]
    sweeps: dict[str, Any] = dict(
        n_iter=settings.n_iter, tol=settings.tol, mode=settings.mode
    )
    if xp is np:
        d_r, d_c = equilibrate(start, column_groups=groups, **sweeps)
    else:
        d_r, d_c = equilibrate_traced(
            start, column_groups=groups, n_groups=n_groups, **sweeps
        )
    return d_r * d_r0, d_c * d_c0


def _sweep(xp, scaled, d_r, d_c, mode, groups, n_groups):
    if mode == "gauss_seidel":
        r = _safe_inv_sqrt(xp, xp.sqrt(xp.sum(scaled * scaled, axis=1)))
        scaled = scaled * r[:, None]
        c = _safe_inv_sqrt(xp, _column_norms(xp, scaled, groups, n_groups))
        scaled = scaled * c[None, :]
    else:
        r = _safe_inv_sqrt(xp, xp.sqrt(xp.sum(scaled * scaled, axis=1)))
        c = _safe_inv_sqrt(xp, _column_norms(xp, scaled, groups, n_groups))
        scaled = scaled * r[:, None] * c[None, :]
    return scaled, d_r * r, d_c * c


def _spread(xp, norms):
    positive = norms > 0
    hi = xp.max(xp.where(positive, norms, 0.0), initial=0.0)
    lo = xp.min(xp.where(positive, norms, xp.inf), initial=xp.inf)
    return xp.where(hi > 0, 1.0 - lo / xp.where(hi > 0, hi, 1.0), 0.0)


def _converged(xp, scaled, tol, groups, n_groups):
    rows = xp.sqrt(xp.sum(scaled * scaled, axis=1))
    cols = _column_norms(xp, scaled, groups, n_groups)
    return (_spread(xp, rows) < tol) & (_spread(xp, cols) < tol)


def group_labels(column_groups, n: int):
    """Validate column group labels; return them as `0..n_groups-1` and the count
    (`(None, 0)` when every column is its own group)."""
    if column_groups is None:
        return None, 0
    groups = np.asarray(column_groups)
    if groups.shape != (n,) or not np.issubdtype(groups.dtype, np.integer):
        raise ValueError(
            f"equilibrate(column_groups=...): must be an integer vector of shape "
            f"({n},) (one group label per column), got shape {groups.shape}."
        )
    _, labels = np.unique(groups, return_inverse=True)
    return labels.astype(np.int32), int(labels.max()) + 1 if n else 0


def equilibrate(
    M: np.ndarray,
    *,
    n_iter: int = 25,
    tol: float = 1e-3,
    mode: Literal["gauss_seidel", "jacobi"] = "gauss_seidel",
    column_groups: np.ndarray | None = None,
    max_iter: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Diagonal scalings $D_r, D_c$ that balance the row and column norms of `M`.

    Each sweep divides every row, then (Gauss-Seidel) or simultaneously (Jacobi)
    every column, by the square root of its 2-norm, so that $D_r M D_c$ tends to
    have unit row and column norms. It stops after `n_iter` sweeps or once
    $1 - \\min_i d_i / \\max_i d_i < \\varepsilon$ for both rows and columns.
    Columns with the same `column_groups` label share one scale (the RMS of their
    norms), as the columns of one cone block must.

    **Arguments:**

    - `M`: matrix of shape `(m, n)`, on the host.
    - `n_iter`: maximum number of sweeps $K$ (paper: 25).
    - `tol`: tolerance $\\varepsilon$ on the spread of the norms (paper: 1e-3).
    - `mode`: `"gauss_seidel"` (paper's choice) or `"jacobi"`.
    - `column_groups`: optional integer label per column; `None` scales every
        column on its own.
    - `max_iter`: deprecated name of `n_iter`.

    **Returns:**

    `(d_r, d_c)`, the diagonals of $D_r$ (shape `(m,)`) and $D_c$ (shape `(n,)`).
    """
    if max_iter is not None:
        warnings.warn(
            "equilibrate(max_iter=...) is deprecated; use n_iter=... (the name "
            "used for iteration counts throughout pinet_eqx).",
            DeprecationWarning,
            stacklevel=2,
        )
        n_iter = max_iter
    if mode not in _MODES:
        raise ValueError(
            f"equilibrate(mode={mode!r}): mode must be 'gauss_seidel' or 'jacobi'."
        )
    M = np.asarray(M, dtype=np.float64)
    m, n = M.shape
    groups, n_groups = group_labels(column_groups, n)
    d_r, d_c, scaled = np.ones(m), np.ones(n), M.copy()
    for _ in range(n_iter):
        scaled, d_r, d_c = _sweep(np, scaled, d_r, d_c, mode, groups, n_groups)
        if _converged(np, scaled, tol, groups, n_groups):
            break
    return d_r, d_c


def equilibrate_traced(M, *, n_iter, tol, mode, column_groups, n_groups):
    """`equilibrate` for a traced matrix (per-instance data, inside jit/vmap).

    `column_groups` must already be labels `0..n_groups-1` (see `group_labels`). The
    scalings carry no gradient: they change the iteration's metric, not the
    projection it converges to.
    """
    M = jax.lax.stop_gradient(M)
    m, n = M.shape
    dtype = M.dtype

    def cond(carry):
        k, done, *_ = carry
        return (k < n_iter) & ~done

    def body(carry):
        k, _, scaled, d_r, d_c = carry
        scaled, d_r, d_c = _sweep(jnp, scaled, d_r, d_c, mode, column_groups, n_groups)
        done = _converged(jnp, scaled, tol, column_groups, n_groups)
        return k + 1, done, scaled, d_r, d_c

    init = (0, jnp.asarray(False), M, jnp.ones(m, dtype), jnp.ones(n, dtype))
    *_, d_r, d_c = jax.lax.while_loop(cond, body, init)
    return d_r, d_c


def equilibrate_sparse(
    M, *, n_iter: int, tol: float, mode: str, column_groups: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """`equilibrate` for a `scipy.sparse` matrix, never formed densely.

    The norms of $D_r M D_c$ are read from the entrywise square $S = M \\odot M$:
    the row norms are $d_{r,i} (S d_c^2)_i^{1/2}$ and the column norms
    $d_{c,j} (S^\\top d_r^2)_j^{1/2}$, so a sweep costs two sparse products.
    Same sweeps, groups and stopping rule as `equilibrate`.
    """
    S = M.multiply(M).tocsr()
    m, n = M.shape
    groups, n_groups = group_labels(column_groups, n)
    d_r, d_c = np.ones(m), np.ones(n)

    def norms(d_r, d_c):
        rows = d_r * np.sqrt(S @ (d_c * d_c))
        cols = _group_rms(np, d_c * np.sqrt(S.T @ (d_r * d_r)), groups, n_groups)
        return rows, cols

    for _ in range(n_iter):
        rows, cols = norms(d_r, d_c)
        r = _safe_inv_sqrt(np, rows)
        if mode == "gauss_seidel":
            cols = norms(d_r * r, d_c)[1]
        d_r, d_c = d_r * r, d_c * _safe_inv_sqrt(np, cols)
        rows, cols = norms(d_r, d_c)
        if (_spread(np, rows) < tol) & (_spread(np, cols) < tol):
            break
    return d_r, d_c
