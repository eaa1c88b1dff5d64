"""Variables of cvxpy's cone program that can be eliminated, so that they do
not become auxiliary coordinates: norm epigraphs (native $\\ell_1$ and
$\\ell_\\infty$ norm cones), second-order heads, and variables that
equalities define (`substitute_defined`).

cvxpy writes $\\|u\\|_1 \\le \\beta$ (with $u = W x + h$) as nonnegative rows
$c_j t_j \\pm u_j \\ge 0$ and $\\beta - \\kappa \\sum_j t_j \\ge 0$, with new
variables $t$; and $\\|u\\|_\\infty \\le \\beta$ with one $t$: $c_j t \\pm u_j
\\ge 0$ and $\\beta - \\kappa t \\ge 0$. Eliminating $t$ gives the same set in
$x$: $\\|\\mathrm{diag}(1/c)\\,u\\| \\le \\beta / \\kappa$. A native cone keeps
the projector's closed-form derivative and polish for polyhedral sets, and
saves the auxiliary coordinates.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp


@dataclasses.dataclass(frozen=True)
class NormEpigraph:
    """$\\|\\mathrm{diag}(1/c)\\,(W x + h)\\| \\le (f^\\top x + r)/\\kappa$.

    `kind` is `"l1"` or `"linf"`; `pairs` the rows $c_j t + u_j \\ge 0$ (one
    per entry of $u$: its $x$ part is $W_j$ and its offset $h_j$); `scale`
    the $c_j$; `budget` the row $f^\\top x + r - \\kappa \\sum t \\ge 0$ and
    `kappa` its $\\kappa$; `columns` the eliminated $t$.
    """

    kind: str
    pairs: np.ndarray
    scale: np.ndarray
    budget: int
    kappa: float
    columns: np.ndarray


def find_norm_epigraphs(A, b0, rows, candidates, fixed) -> list[NormEpigraph]:
    """The norm epigraphs among the nonnegative `rows` of the cone program.

    **Arguments:**

    - `A`, `b0`: the constant matrix and offset of the rows $A x + b \\ge 0$.
    - `rows`: the nonnegative rows.
    - `candidates`: boolean mask of the columns that may be eliminated (not
        requested, in no other cone, in no parameter-dependent row).
    - `fixed`: boolean mask of the rows whose coefficients are fixed.

    **Returns:** a list of `NormEpigraph`s on disjoint columns and rows.
    """
    sub = A[rows]
    cand = np.flatnonzero(candidates)
    budget_of, pairs_of, scale_of = {}, {}, {}
    for t in cand:
        col = sub[:, t]
        pos, neg = np.flatnonzero(col > 0), np.flatnonzero(col < 0)
        if neg.size != 1 or pos.size == 0 or pos.size % 2:
            continue
        # Positive rows: t's only candidate, fixed, in pairs of opposite u.
        if np.any(np.count_nonzero(sub[pos][:, cand], axis=1) != 1):
            continue
        if not fixed[rows[pos]].all() or not fixed[rows[neg[0]]]:
            continue
        pairs = _pairs(sub, b0[rows], pos, t)
        if pairs is None:
            continue
        budget_of[t] = int(neg[0])
        pairs_of[t] = pairs
        scale_of[t] = col[pairs]
    by_budget: dict[int, list[int]] = {}
    for t, r in budget_of.items():
        by_budget.setdefault(r, []).append(t)
    out = []
    for r, ts in by_budget.items():
        coef = sub[r, cand]
        # The budget row's candidates are exactly these t, with one coefficient.
        if set(cand[coef != 0]) != set(ts) or np.ptp(sub[r, ts]) != 0:
            continue
        if len(ts) == 1:
            kind, pairs = "linf", pairs_of[ts[0]]
            scale = scale_of[ts[0]]
        elif all(pairs_of[t].size == 1 for t in ts):
            kind = "l1"
            pairs = np.array([pairs_of[t][0] for t in ts])
            scale = np.array([scale_of[t][0] for t in ts])
        else:
            continue
        out.append(
            NormEpigraph(
                kind=kind,
                pairs=rows[pairs],
                scale=scale,
                budget=int(rows[r]),
                kappa=float(-sub[r, ts[0]]),
                columns=np.asarray(ts),
            )
        )
    return out


def _pairs(sub, b, pos, t) -> np.ndarray | None:
    """One row of each pair among `pos` (rows $c t + u \\ge 0$ and $c t - u
    \\ge 0$), or `None` if they do not pair up."""
    rest = np.concatenate([sub[pos], b[pos, None]], axis=1)
    rest[:, t] = 0.0
    keys = {}
    for i, row in zip(pos, rest):
        keys.setdefault(bytes(np.round(row, 12) + 0.0), []).append(i)
    first = []
    for i, row in zip(pos, rest):
        partner = keys.get(bytes(np.round(-row, 12) + 0.0), [])
        if len(partner) != 1 or sub[partner[0], t] != sub[i, t]:
            return None
        if i < partner[0]:
            first.append(i)
    return np.asarray(first) if 2 * len(first) == pos.size else None


@dataclasses.dataclass(frozen=True)
class ConeHead:
    """A second-order block whose head is $c\\,t$ for a variable $t$ bounded
    only by the row $f^\\top x + r - \\kappa t \\ge 0$ (cvxpy's
    $\\|u\\|_2 \\le f^\\top x + r$): the block's head becomes $(c/\\kappa)
    (f^\\top x + r)$, and $t$ is eliminated."""

    block: int
    head: int
    budget: int
    scale: float
    kappa: float
    column: int


def find_cone_heads(A, b0, blocks, rows, candidates, fixed) -> list[ConeHead]:
    """The second-order `blocks` (arrays of rows) with an eliminable head.

    `rows` are the nonnegative rows; `candidates` the columns that may be
    eliminated (not requested, in no zero row, in no parameter-dependent
    row); `fixed` the rows whose coefficients are fixed.
    """
    out = []
    soc_rows = np.concatenate(blocks) if blocks else np.zeros(0, int)
    for k, block in enumerate(blocks):
        head = block[0]
        nz = np.flatnonzero(A[head])
        if nz.size != 1 or b0[head] != 0 or not fixed[head]:
            continue
        t = nz[0]
        if not candidates[t] or A[head, t] <= 0:
            continue
        if np.count_nonzero(A[soc_rows, t]) != 1:
            continue  # t is in another block, or elsewhere in this one
        col = A[rows, t]
        neg = np.flatnonzero(col < 0)
        if neg.size != 1 or np.count_nonzero(col) != 1 or not fixed[rows[neg[0]]]:
            continue
        budget = int(rows[neg[0]])
        if np.count_nonzero(A[budget, candidates]) != 1:
            continue  # other eliminable columns in the budget row
        out.append(
            ConeHead(
                block=k,
                head=int(head),
                budget=budget,
                scale=float(A[head, t]),
                kappa=float(-A[budget, t]),
                column=int(t),
            )
        )
    return out


def substitute_defined(T, m: int, n: int, z: int, candidates) -> tuple:
    """Eliminate variables that zero rows define: `(T', columns)`.

    With $U$ the `candidates` (fixed coefficients wherever they appear) that
    appear in the zero rows $R$ (the first `z` rows), and $K = A_{R,U}$ square
    and well conditioned, $u = -K^{-1}(A_{R,\\bar U} x + b_R)$. Each other row
    $i$ then reads $(A_{i,\\bar U} - C_i A_{R,\\bar U})\\,x + b_i - C_i b_R$
    with $C = A_{\\cdot,U} K^{-1}$, which is a linear map $S$ of the rows of
    the tensor $T$ (offsets that depend on parameters included); the rows $R$
    and the columns $U$ are emptied. cvxpy introduces such variables for
    `cumsum` and other atoms, and as auxiliary coordinates they slow the
    iteration down; returns `(T, empty)` where the conditions do not hold.
    """
    const = np.asarray(T[:, -1].todense()).ravel()
    A = const[: m * n].reshape((m, n), order="F")
    U = np.flatnonzero(candidates & np.any(A[:z] != 0, axis=0))
    none = (T, np.zeros(0, int))
    if U.size == 0:
        return none
    R = np.flatnonzero(np.any(A[:z][:, U] != 0, axis=1))
    if R.size != U.size:
        return none
    K = A[np.ix_(R, U)]
    if np.linalg.cond(K) > 1e8:
        return none
    others = np.setdiff1d(np.flatnonzero(np.any(A[:, U] != 0, axis=1)), R)
    C = np.linalg.solve(K.T, A[np.ix_(others, U)].T).T  # A_{i,U} K^{-1}
    keep_cols = np.setdiff1d(np.arange(n + 1), U)  # x's columns and the offset
    i_idx, r_idx = np.nonzero(C)
    rows, cols, vals = [], [], []
    for j in keep_cols:
        rows.append(j * m + others[i_idx])
        cols.append(j * m + R[r_idx])
        vals.append(-C[i_idx, r_idx])
    size = m * (n + 1)
    S = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(size, size),
    )
    keep = np.ones(size)
    keep[(U[:, None] * m + np.arange(m)[None, :]).ravel()] = 0.0  # columns U
    keep[(np.arange(n + 1)[:, None] * m + R[None, :]).ravel()] = 0.0  # rows R
    S = sp.diags(keep) @ (sp.identity(size, format="csr") + S)
    return sp.csr_matrix(S @ T), U
