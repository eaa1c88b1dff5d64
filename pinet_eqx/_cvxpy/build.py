"""Our sets from cvxpy's parametrised cone program (see `_cvxpy`).

The program is $A(p)\\,x + b(p) \\in \\mathcal{K}$ with $\\mathrm{vec}([A\\
b]) = T\\,[p;\\ 1]$ (column-major). Zero rows become an `Equality`,
nonnegative rows `AffineInequality` rows (a row and its negative joined into
one two-sided row), `Box` bounds (rows on one coordinate) or, where they are
the epigraph of an $\\ell_1$ or $\\ell_\\infty$ norm, an `L1NormCone` or
`LInfNormCone` (`_cvxpy_eliminate`); second-order blocks become
`SecondOrderCone`s. Data that depend on $p$ become `Parameter`s whose values
are rows of $T\\,[p;\\ 1]$, collected in `targets` and `maps`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._problem.parameter import Parameter
from .._projector.build import SPARSE_MIN_SIZE
from .._sets import (
    AffineInequality,
    Box,
    Equality,
    L1NormCone,
    LInfNormCone,
    SecondOrderCone,
)
from .eliminate import (
    ConeHead,
    NormEpigraph,
    find_cone_heads,
    find_norm_epigraphs,
    substitute_defined,
)


class _Layout:
    """Where cvxpy's columns go in $y = (x, u)$: the requested variables first,
    in order (absent ones are free coordinates), then the other columns, less
    the `dropped` ones (eliminated: `col_of` is -1 there)."""

    def __init__(self, prog, variables, dropped):
        n = prog.x.size
        self.col_of = np.full(n, -1)
        d_out = 0
        for v in variables:
            start = prog.var_id_to_col.get(v.id)
            if start is not None:
                self.col_of[start : start + v.size] = d_out + np.arange(v.size)
            d_out += v.size
        free = self.col_of < 0
        free[dropped] = False
        rest = np.flatnonzero(free)
        self.col_of[rest] = d_out + np.arange(rest.size)
        self.n_aux = int(rest.size)
        self.dim = d_out + self.n_aux
        self.n_cols = n
        self.keep = self.col_of >= 0


class ConeProgramBuilder:
    """Our sets from the tensor $T$ of cvxpy's cone data, one cone kind at a
    time (see the module's docstring).

    **Arguments:**

    - `prog`: cvxpy's `ParamConeProg`.
    - `variables`: the projected cvxpy variables, in order.
    - `native_sets`: map bounds to `Box`es and norm epigraphs to norm cones
        (else they stay rows, with their auxiliary variables).
    """

    def __init__(self, prog, variables, native_sets: bool):
        self.native = native_sets
        self.dims = prog.cone_dims
        n = prog.x.size
        rows, cols = prog.A.shape
        self.m = m = rows // (n + 1)
        self.n_params = cols - 1
        self._read(sp.csr_matrix(prog.A), n)
        defined = np.zeros(0, int)
        if native_sets:
            # Variables that equalities define are substituted first.
            fixed_cols = ~self.entry_param.any(axis=0)
            free = self._not_requested(prog, variables) & fixed_cols
            T, defined = substitute_defined(self.T, m, n, self.dims.zero, free)
            self._read(T, n)
        self.norms, self.heads = self._eliminations(prog, variables)
        dropped = [c for ep in self.norms for c in ep.columns]
        dropped += [h.column for h in self.heads.values()] + list(defined)
        self.layout = _Layout(prog, variables, np.asarray(dropped, int))
        self.targets: list[tuple[str, tuple[int, ...]]] = []
        self.maps: list[sp.csr_matrix] = []
        self.sparse = self.layout.dim + m >= SPARSE_MIN_SIZE

    def _read(self, T, n: int) -> None:
        """Take the tensor `T`: its constant data, and which entries depend on
        a parameter."""
        m = self.m
        self.T = T
        depends = np.asarray(abs(T[:, : self.n_params]).sum(axis=1)).ravel() > 0
        const = np.asarray(T[:, self.n_params].todense()).ravel()
        self.A0 = const[: m * n].reshape((m, n), order="F")
        self.b0 = const[m * n :]
        self.entry_param = depends[: m * n].reshape((m, n), order="F")
        self.row_param: np.ndarray = np.asarray(self.entry_param.any(axis=1))
        self.b_param: np.ndarray = np.asarray(depends[m * n :])

    @staticmethod
    def _not_requested(prog, variables) -> np.ndarray:
        """Mask of cvxpy's columns that are not the projected variables'."""
        mask = np.ones(prog.x.size, bool)
        for v in variables:
            start = prog.var_id_to_col.get(v.id)
            if start is not None:
                mask[start : start + v.size] = False
        return mask

    def _eliminations(self, prog, variables):
        """The norm epigraphs and second-order heads whose variables are
        eliminated (none without `native`)."""
        if not self.native:
            return [], {}
        z, nn = self.dims.zero, self.dims.nonneg
        candidates = self._not_requested(prog, variables)
        candidates &= ~self.entry_param.any(axis=0)
        candidates &= ~np.any(self.A0[:z] != 0, axis=0)
        rows, fixed = z + np.arange(nn), ~self.row_param
        starts = z + nn + np.cumsum([0] + list(self.dims.soc))
        blocks = [np.arange(a, b) for a, b in zip(starts[:-1], starts[1:])]
        heads = find_cone_heads(self.A0, self.b0, blocks, rows, candidates, fixed)
        in_soc = np.any(self.A0[z + nn :] != 0, axis=0)
        norms = find_norm_epigraphs(self.A0, self.b0, rows, candidates & ~in_soc, fixed)
        return norms, {h.block: h for h in heads}

    # ------------------------------------------------------------ pieces

    def _parameter(
        self, flat_rows, shape, scale: float | np.ndarray = 1.0
    ) -> Parameter:
        """A new `Parameter` whose value is `scale` times the entries
        `flat_rows` of $T\\,[p;\\ 1]$ (-1: zero)."""
        flat_rows = np.asarray(flat_rows)
        keep = np.flatnonzero(flat_rows >= 0)
        scale = np.broadcast_to(np.asarray(scale, float), flat_rows.shape)
        select = sp.csr_matrix(
            (scale[keep], (keep, flat_rows[keep])),
            shape=(flat_rows.size, self.T.get_shape()[0]),
        )
        name = f"_cvxpy{len(self.targets)}"
        self.targets.append((name, tuple(shape)))
        self.maps.append(sp.csr_matrix(select @ self.T))
        return Parameter(name, shape=tuple(shape) if len(shape) == 2 else None)

    def _matrix(self, rows):
        """Rows of $A$ in our coordinates: fixed (dense or CSR) or a matrix
        `Parameter`."""
        d, m, keep = self.layout.dim, self.m, self.layout.keep
        if self.row_param[rows].any():
            # Entry (i, j) of ours, column-major, is T's entry (rows[i], col).
            src = np.full((len(rows), d), -1)
            cols = np.flatnonzero(keep)
            src[:, self.layout.col_of[cols]] = cols[None, :] * m + rows[:, None]
            return self._parameter(src.ravel(order="F"), (len(rows), d))
        return self._fixed(rows)

    def _fixed(self, rows, scale: float | np.ndarray = 1.0):
        """Fixed rows of $A$ times `scale`, in our coordinates."""
        keep = self.layout.keep
        A = np.zeros((len(rows), self.layout.dim))
        scale = np.broadcast_to(np.asarray(scale, float), (len(rows),))
        A[:, self.layout.col_of[keep]] = self.A0[rows][:, keep] * scale[:, None]
        return sp.csr_matrix(A) if self.sparse else A

    def _scalar(self, value):
        """A length-1 offset as a scalar: an array of shape `()`, or the last
        `Parameter` made, redeclared as a scalar."""
        if isinstance(value, Parameter):
            name, _ = self.targets[-1]
            self.targets[-1] = (name, ())
            return value
        return np.asarray(value).reshape(())

    def _offset(self, rows, scale: float | np.ndarray = 1.0):
        """$b$ on `rows`, times `scale`: fixed, or a vector `Parameter`."""
        if self.b_param[rows].any():
            flat = self.m * self.layout.n_cols + np.asarray(rows)
            return self._parameter(flat, (len(rows),), scale)
        return scale * self.b0[rows]

    # -------------------------------------------------------------- sets

    def sets(self) -> list:
        z, nn = self.dims.zero, self.dims.nonneg
        zero = self._nonempty(np.arange(z))
        sets = []
        if zero.size:
            sets.append(Equality(self._matrix(zero), self._offset(zero, -1.0)))
        nonneg = z + np.arange(nn)
        # Rows on eliminated columns went into norm cones and cone heads.
        used = np.any(self.A0[nonneg][:, ~self.layout.keep] != 0, axis=1)
        nonneg = nonneg[~used]
        sets += [self._norm(ep) for ep in self.norms]
        sets += self._nonneg(self._nonempty(nonneg))
        start = z + nn
        for k, size in enumerate(self.dims.soc):
            rows = np.arange(start, start + size)
            sets.append(self._soc(rows, self.heads.get(k)))
            start += size
        return sets

    def _nonempty(self, rows):
        """`rows` less those with no coefficient at all (constant conditions,
        which cvxpy checks itself when it solves; a fixed infeasible one
        makes the set empty)."""
        empty = ~self.row_param[rows] & ~np.any(self.A0[rows] != 0, axis=1)
        bad = empty & ~self.b_param[rows] & (self.b0[rows] < 0)
        if bad.any():
            raise ValueError(
                "from_cvxpy: a constraint reduces to a false constant inequality "
                "(such as 0 >= 1); the set is empty."
            )
        return rows[~empty]

    def _nonneg(self, rows) -> list:
        """$a^\\top x + b \\ge 0$ rows: a `Box` bound where the row has one
        fixed coefficient (with `native`), else an `AffineInequality`, with
        two rows that are negatives of each other (a two-sided constraint,
        which cvxpy splits) joined into one two-sided row."""
        single = np.zeros(rows.size, bool)
        if self.native and rows.size:
            nnz = np.count_nonzero(self.A0[rows], axis=1)
            single = (nnz == 1) & ~self.row_param[rows]
        general = rows[~single]
        varying = general[self.row_param[general]]
        sets = []
        if varying.size:
            lower = self._offset(varying, -1.0)
            sets.append(AffineInequality(self._matrix(varying), lower=lower))
        sets += self._two_sided(general[~self.row_param[general]])
        return sets + self._boxes(rows[single])

    def _two_sided(self, rows) -> list:
        """Fixed rows as $\\ell \\le c^\\top x \\le u$: a row $a = s c$ ($s > 0$,
        $c$ scaled to a largest entry of 1, first nonzero positive) gives
        $\\ell = -b/s$, its negative $a = -s c$ gives $u = b/s$."""
        A = self.A0[rows]
        big = np.max(np.abs(A), axis=1) if rows.size else np.zeros(0)
        first = A[np.arange(rows.size), np.argmax(A != 0, axis=1)]
        s = np.sign(first) * big
        keys = A / s[:, None]
        lower_of, upper_of, order, seen = {}, {}, [], set()
        spill = []  # rows whose side is taken already: a set of their own
        # (+ 0.0 turns -0.0 into 0.0, whose bytes differ.)
        for i, key in enumerate(map(bytes, np.round(keys, 12) + 0.0)):
            side = lower_of if s[i] > 0 else upper_of
            if key in side:
                spill.append(i)
                continue
            side[key] = i
            if key not in seen:
                seen.add(key)
                order.append(key)
        sets = []
        groups: dict[tuple, list] = {}
        for key in order:
            lo, up = lower_of.get(key), upper_of.get(key)
            flags = tuple(
                None if i is None else bool(self.b_param[rows[i]]) for i in (lo, up)
            )
            groups.setdefault(flags, []).append((lo, up))
        for (lo_flag, up_flag), pairs in groups.items():
            ref = np.array([lo if lo is not None else up for lo, up in pairs])
            C = np.zeros((len(pairs), self.layout.dim))
            keep = self.layout.keep
            C[:, self.layout.col_of[keep]] = keys[ref][:, keep]
            kw = {}
            if lo_flag is not None:
                i = np.array([lo for lo, _ in pairs])
                kw["lower"] = self._offset(rows[i], -1.0 / s[i])
            if up_flag is not None:
                i = np.array([up for _, up in pairs])
                kw["upper"] = self._offset(rows[i], -1.0 / s[i])
            sets.append(AffineInequality(sp.csr_matrix(C) if self.sparse else C, **kw))
        if spill:
            sets += self._two_sided(rows[np.array(spill)])
        return sets

    def _boxes(self, rows) -> list[Box]:
        """Bounds $x_j \\ge -b/a$ ($a > 0$) or $x_j \\le -b/a$ ($a < 0$), as
        one-sided `Box`es with at most one bound per coordinate each."""
        if not rows.size:
            return []
        cols = np.argmax(self.A0[rows] != 0, axis=1)
        coef = self.A0[rows, cols]
        ours = self.layout.col_of[cols]
        boxes = []
        for lower in (True, False):
            for param in (False, True):
                pick = ((coef > 0) == lower) & (self.b_param[rows] == param)
                r, j, a = rows[pick], ours[pick], coef[pick]
                while r.size:
                    # One bound per coordinate in each Box: first occurrences.
                    _, first = np.unique(j, return_index=True)
                    mask = np.zeros(self.layout.dim, bool)
                    mask[j[first]] = True
                    order = first[np.argsort(j[first])]  # mask order
                    value = self._offset(r[order], -1.0 / a[order])
                    kw = {"lower" if lower else "upper": value}
                    boxes.append(Box(mask=mask, **kw))
                    rest = np.setdiff1d(np.arange(r.size), first)
                    r, j, a = r[rest], j[rest], a[rest]
        return boxes

    def _soc(self, rows, head: ConeHead | None = None) -> SecondOrderCone:
        """$\\|A x + a\\|_2 \\le f^\\top x + b$ from the block $(f^\\top x + b,
        A x + a)$."""
        if head is not None:
            # The head c t, with f^T x + r - kappa t >= 0: c (f^T x + r) / kappa.
            budget, ratio = np.array([head.budget]), head.scale / head.kappa
            return SecondOrderCone(
                self._matrix(rows[1:]),
                a=self._offset(rows[1:]),
                f=self._vector(self._fixed(budget, ratio)),
                b=self._scalar(self._offset(budget, ratio)),
            )
        head, tail = rows[:1], rows[1:]
        f = self._matrix(head)
        if isinstance(f, Parameter):
            # A one-row matrix parameter becomes a vector parameter of length d.
            name, (_, d) = self.targets[-1]
            self.targets[-1] = (name, (d,))
            f = Parameter(name)
        else:
            f = self._vector(f)
        b = self._scalar(self._offset(head))
        return SecondOrderCone(self._matrix(tail), a=self._offset(tail), f=f, b=b)

    def _norm(self, ep: NormEpigraph) -> L1NormCone | LInfNormCone | AffineInequality:
        """$\\|W x + h\\| \\le f^\\top x + r$ from a norm epigraph, its
        auxiliary variables eliminated (a two-sided row where it is one fixed
        absolute value)."""
        kind = L1NormCone if ep.kind == "l1" else LInfNormCone
        budget = np.array([ep.budget])
        one = ep.pairs.size == 1 and not self.A0[ep.budget][self.layout.keep].any()
        if one and not (self.b_param[ep.pairs].any() or self.b_param[ep.budget]):
            # |w x + h| <= r is the two-sided row -r - h <= w x <= r - h.
            r, h = self.b0[ep.budget] / ep.kappa, self.b0[ep.pairs] / ep.scale
            C = self._fixed(ep.pairs, 1 / ep.scale)
            return AffineInequality(C, lower=-r - h, upper=r - h)
        return kind(
            self._fixed(ep.pairs, 1 / ep.scale),
            a=self._offset(ep.pairs, 1 / ep.scale),
            f=self._vector(self._fixed(budget, 1 / ep.kappa)),
            b=self._scalar(self._offset(budget, 1 / ep.kappa)),
        )

    @staticmethod
    def _vector(row) -> np.ndarray | None:
        """A fixed one-row matrix as a vector, or `None` if it is zero."""
        f = sp.csr_matrix(row).toarray().ravel()
        return f if np.any(f) else None
