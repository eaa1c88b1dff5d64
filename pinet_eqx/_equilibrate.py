"""Modified Ruiz equilibration (paper App. H.1, Algorithm 'Modified Ruiz')."""

from __future__ import annotations

from typing import Literal

import numpy as np


def _safe_inv_sqrt(norms: np.ndarray) -> np.ndarray:
    # An all-zero row or column carries no information to balance; leave it alone
    # instead of dividing by zero.
    return np.where(norms > 0, 1.0 / np.sqrt(np.where(norms > 0, norms, 1.0)), 1.0)


def _spread(norms: np.ndarray) -> float:
    norms = norms[norms > 0]
    if norms.size == 0:
        return 0.0
    return 1.0 - norms.min() / norms.max()


def equilibrate(
    M: np.ndarray,
    *,
    max_iter: int = 25,
    tol: float = 1e-3,
    mode: Literal["gauss_seidel", "jacobi"] = "gauss_seidel",
) -> tuple[np.ndarray, np.ndarray]:
    """Diagonal scalings $D_r, D_c$ that balance the row and column norms of `M`.

    Each sweep divides every row, then (Gauss-Seidel) or simultaneously (Jacobi)
    every column, by the square root of its 2-norm, so that $D_r M D_c$ tends to
    have unit row and column norms. It stops after `max_iter` sweeps or once
    $1 - \\min_i d_i / \\max_i d_i < \\varepsilon$ for both rows and columns.

    **Arguments:**

    - `M`: matrix of shape `(m, n)`, on the host.
    - `max_iter`: maximum number of sweeps $K$ (paper: 25).
    - `tol`: tolerance $\\varepsilon$ on the spread of the norms (paper: 1e-3).
    - `mode`: `"gauss_seidel"` (paper's choice) or `"jacobi"`.

    **Returns:**

    `(d_r, d_c)`, the diagonals of $D_r$ (shape `(m,)`) and $D_c$ (shape `(n,)`).
    """
    if mode not in ("gauss_seidel", "jacobi"):
        raise ValueError(
            f"equilibrate(mode={mode!r}): mode must be 'gauss_seidel' or 'jacobi'."
        )
    M = np.asarray(M, dtype=np.float64)
    m, n = M.shape
    d_r = np.ones(m)
    d_c = np.ones(n)
    scaled = M.copy()
    for _ in range(max_iter):
        if mode == "gauss_seidel":
            r = _safe_inv_sqrt(np.linalg.norm(scaled, axis=1))
            d_r *= r
            scaled *= r[:, None]
            c = _safe_inv_sqrt(np.linalg.norm(scaled, axis=0))
            d_c *= c
            scaled *= c[None, :]
        else:
            r = _safe_inv_sqrt(np.linalg.norm(scaled, axis=1))
            c = _safe_inv_sqrt(np.linalg.norm(scaled, axis=0))
            d_r *= r
            d_c *= c
            scaled *= r[:, None] * c[None, :]
        if (
            _spread(np.linalg.norm(scaled, axis=1)) < tol
            and _spread(np.linalg.norm(scaled, axis=0)) < tol
        ):
            break
    return d_r, d_c
