"""`from_cvxpy`: a `Projector` from constraints written in cvxpy.

cvxpy canonicalises the constraints (with a zero objective) into its
parametrised cone program, $A(p)\\,x + b(p) \\in \\mathcal{K}$, with
$\\mathcal{K}$ a product of zero, nonnegative and second-order cones and
$(A, b)$ affine in the parameters $p$ (DPP). Each block becomes a set of
ours: zero rows an `Equality`, nonnegative rows an `AffineInequality` (or,
for a row on one coordinate, a `Box` bound), second-order blocks a
`SecondOrderCone`. Data that depends on $p$ becomes our `Parameter`s, filled
per call by an `AffineParameterMap` evaluated in JAX. Variables that
canonicalisation introduces are the projector's auxiliary coordinates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from ._build import SPARSE_MIN_SIZE
from ._constraints import AffineInequality, Box, Equality, SecondOrderCone
from ._parameter import RESERVED_NAMES, Parameter
from ._parameter_map import AffineParameterMap
from ._projector import Projector

_SUPPORTED = (
    "pinet_eqx supports constraints that canonicalise to zero, nonnegative and "
    "second-order cones: affine equalities and inequalities, bounds, l1, l2 and "
    "l-infinity norms, quad_form, sum_squares and the other SOC-representable "
    "atoms, on continuous variables, with parameters entering affinely (DPP)"
)


def from_cvxpy(
    constraints, variables, *, native_sets: bool = True, **projector_kwargs
) -> Projector:
    """A `Projector` onto the set that cvxpy `constraints` define.

    Projects onto $\\{x : \\exists u,\\ (x, u) \\text{ satisfies the
    constraints}\\}$, $x$ the given `variables` and $u$ every other variable
    (the constraints' own, and those cvxpy's canonicalisation introduces, for
    example for `cp.norm(x, 1)`): $u$ becomes auxiliary coordinates that the
    objective ignores (`Projector(n_aux=...)`), and only $x$ is returned.
    Requires DPP; each cvxpy `Parameter` is passed by its name at call time,
    `proj(y_raw, b=..., r=...)`, and derivatives reach every one of them.

    **Arguments:**

    - `constraints`: a list of cvxpy constraints.
    - `variables`: one `cp.Variable` or a sequence of them. $y$ is their
        concatenation in this order, each flattened column-major (as `cp.vec`
        flattens it).
    - `native_sets`: map rows that bound one coordinate to `Box` bounds
        (`True`, default); `False` keeps them as inequality rows, as cvxpy
        gives them (to compare).
    - `**projector_kwargs`: passed to `Projector` (`sigma`, `n_iter`,
        `affine_form`, ...).

    **Returns:** a `Projector` whose `dim` is the total size of `variables`.

    **Raises:** `ValueError` naming the constraint for what pinet_eqx cannot
    project onto: exponential, power and semidefinite cones, non-DCP or
    non-DPP constraints, integer or boolean variables.
    """
    cp = _import_cvxpy()
    constraints, variables = _check_arguments(cp, constraints, variables)
    problem = cp.Problem(cp.Minimize(0), constraints)
    _check_supported(cp, problem, constraints)
    prog = _cone_program(cp, problem, constraints)
    layout = _Layout(prog, variables)
    tensor = sp.csr_matrix(prog.A)
    builder = _Builder(tensor, prog, layout, native_sets)
    sets = builder.sets()
    if not sets:
        raise ValueError(
            "from_cvxpy(constraints, variables): the constraints put no condition "
            "on the variables; there is nothing to project onto."
        )
    sources = [
        (p.name(), tuple(p.shape), prog.param_id_to_col.get(p.id, -1))
        for p in problem.parameters()
    ]
    mapping = AffineParameterMap(sources, builder.targets, builder.maps)
    return Projector(
        sets,
        dim=layout.dim,
        n_aux=layout.n_aux,
        parameter_map=mapping if builder.targets else None,
        **projector_kwargs,
    )


def _import_cvxpy():
    try:
        import cvxpy
    except ImportError as e:  # pragma: no cover - the test extra installs it
        raise ImportError(
            "from_cvxpy needs cvxpy: `pip install pinet_eqx[cvxpy]`."
        ) from e
    return cvxpy


def _check_arguments(cp, constraints, variables):
    if isinstance(constraints, cp.constraints.constraint.Constraint):
        constraints = [constraints]
    constraints = list(constraints)
    if not constraints:
        raise ValueError("from_cvxpy(constraints, variables): `constraints` is empty.")
    for i, c in enumerate(constraints):
        if not isinstance(c, cp.constraints.constraint.Constraint):
            raise TypeError(
                f"from_cvxpy(constraints, variables): constraints[{i}] is a "
                f"{type(c).__name__}, not a cvxpy constraint (write it as, e.g., "
                "`A @ x == b` or `cp.norm(x, 1) <= r`)."
            )
    if isinstance(variables, cp.Variable):
        variables = [variables]
    if not isinstance(variables, Sequence) or not variables:
        raise TypeError(
            "from_cvxpy(constraints, variables): `variables` must be a cp.Variable "
            "or a non-empty sequence of them."
        )
    for i, v in enumerate(variables):
        if not isinstance(v, cp.Variable):
            raise TypeError(
                f"from_cvxpy(constraints, variables): variables[{i}] is a "
                f"{type(v).__name__}, not a cp.Variable."
            )
    if len({v.id for v in variables}) != len(variables):
        raise ValueError(
            "from_cvxpy(constraints, variables): a variable is listed twice."
        )
    return constraints, list(variables)


def _check_supported(cp, problem, constraints) -> None:
    """Raise, naming the constraint, for what canonicalisation cannot give us."""
    for i, c in enumerate(constraints):
        for v in c.variables():
            kind = [a for a in ("integer", "boolean") if v.attributes.get(a)]
            if kind:
                raise ValueError(
                    f"from_cvxpy: constraint {i} (`{c}`) uses the {kind[0]} "
                    f"variable `{v.name()}`; a projection needs a convex set, "
                    f"so variables must be continuous. {_SUPPORTED}."
                )
        if not c.is_dcp():
            raise ValueError(
                f"from_cvxpy: constraint {i} (`{c}`) is not DCP, so cvxpy cannot "
                f"canonicalise it. {_SUPPORTED}."
            )
        if not c.is_dcp(dpp=True):
            raise ValueError(
                f"from_cvxpy: constraint {i} (`{c}`) is not DPP: its parameters "
                "do not enter affinely (for example a product of two parameters), "
                "so the cone data is not an affine map of them. Introduce a new "
                "parameter for the product. See cvxpy's DPP rules."
            )
    names = [p.name() for p in problem.parameters()]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(
                f"from_cvxpy: two cvxpy Parameters are named {name!r}; parameters "
                "are passed by name, so give each a unique `name=`."
            )
        if not name.isidentifier() or name in RESERVED_NAMES:
            raise ValueError(
                f"from_cvxpy: the cvxpy Parameter {name!r} cannot be passed as a "
                f"keyword (names must be identifiers other than "
                f"{sorted(RESERVED_NAMES)}); rename it with `name=`."
            )


def _cone_program(cp, problem, constraints):
    """cvxpy's parametrised cone program, checked for unsupported cones."""
    data, _, _ = problem.get_problem_data(cp.CLARABEL)
    prog = data[cp.settings.PARAM_PROB]
    if _unsupported(prog.cone_dims) or prog.lb_tensor is not None:
        for i, c in enumerate(constraints):
            sub = cp.Problem(cp.Minimize(0), [c]).get_problem_data(cp.CLARABEL)[0]
            kinds = _unsupported(sub[cp.settings.PARAM_PROB].cone_dims)
            if kinds:
                raise ValueError(
                    f"from_cvxpy: constraint {i} (`{c}`) canonicalises to "
                    f"{' and '.join(kinds)} cones, which pinet_eqx cannot project "
                    f"onto. {_SUPPORTED}."
                )
        raise ValueError(
            "from_cvxpy: the constraints canonicalise to cones or variable "
            f"bounds that pinet_eqx cannot map. {_SUPPORTED}."
        )
    known = {p.id for p in problem.parameters()}
    if any(p.id not in known for p in prog.parameters):
        raise ValueError(
            "from_cvxpy: a cvxpy Parameter with a structural attribute (symmetric, "
            "diag, PSD, sparsity) was reduced by cvxpy; declare it without the "
            "attribute."
        )
    return prog


def _unsupported(dims) -> list[str]:
    kinds = []
    if dims.exp:
        kinds.append("exponential")
    if dims.psd:
        kinds.append("semidefinite")
    if dims.p3d or getattr(dims, "pnd", None):
        kinds.append("power")
    return kinds


class _Layout:
    """Where cvxpy's columns go in $y = (x, u)$: the requested variables first,
    in order (absent ones are free coordinates), then the other columns."""

    def __init__(self, prog, variables):
        n = prog.x.size
        self.col_of = np.full(n, -1)
        d_out = 0
        for v in variables:
            start = prog.var_id_to_col.get(v.id)
            if start is not None:
                self.col_of[start : start + v.size] = d_out + np.arange(v.size)
            d_out += v.size
        rest = np.flatnonzero(self.col_of < 0)
        self.col_of[rest] = d_out + np.arange(rest.size)
        self.n_aux = int(rest.size)
        self.dim = d_out + self.n_aux
        self.n_cols = n


class _Builder:
    """Our sets from the tensor $T$ of cvxpy's cone data, $\\mathrm{vec}([A\\
    b]) = T\\,[p;\\ 1]$ (column-major), one cone kind at a time."""

    def __init__(self, tensor, prog, layout: _Layout, native_sets: bool):
        self.T, self.layout, self.native = tensor, layout, native_sets
        self.m = tensor.shape[0] // (layout.n_cols + 1)
        self.n_params = tensor.shape[1] - 1
        # Which flattened entries depend on a parameter, and the constant data.
        depends = np.asarray(abs(tensor[:, : self.n_params]).sum(axis=1)).ravel() > 0
        const = np.asarray(tensor[:, self.n_params].todense()).ravel()
        m, n = self.m, layout.n_cols
        self.A0 = const[: m * n].reshape((m, n), order="F")
        self.b0 = const[m * n :]
        self.row_param: np.ndarray = np.asarray(
            depends[: m * n].reshape((m, n), order="F").any(axis=1)
        )
        self.b_param: np.ndarray = np.asarray(depends[m * n :])
        self.dims = prog.cone_dims
        self.targets: list[tuple[str, tuple[int, ...]]] = []
        self.maps: list[sp.csr_matrix] = []
        self.sparse = layout.dim + self.m >= SPARSE_MIN_SIZE

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
            shape=(flat_rows.size, self.T.shape[0]),
        )
        name = f"_cvxpy{len(self.targets)}"
        self.targets.append((name, tuple(shape)))
        self.maps.append(sp.csr_matrix(select @ self.T))
        return Parameter(name, shape=tuple(shape) if len(shape) == 2 else None)

    def _matrix(self, rows):
        """Rows of $A$ in our coordinates: fixed (dense or CSR) or a matrix
        `Parameter`."""
        d, m = self.layout.dim, self.m
        if self.row_param[rows].any():
            # Entry (i, j) of ours, column-major, is T's entry (rows[i], col).
            src = np.full((len(rows), d), -1)
            ours = self.layout.col_of
            src[:, ours] = np.arange(self.layout.n_cols)[None, :] * m + rows[:, None]
            return self._parameter(src.ravel(order="F"), (len(rows), d))
        A = np.zeros((len(rows), d))
        A[:, self.layout.col_of] = self.A0[rows]
        return sp.csr_matrix(A) if self.sparse else A

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
        sets += self._nonneg(self._nonempty(z + np.arange(nn)))
        start = z + nn
        for size in self.dims.soc:
            sets.append(self._soc(np.arange(start, start + size)))
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
            C[:, self.layout.col_of] = keys[ref]
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

    def _soc(self, rows) -> SecondOrderCone:
        """$\\|A x + a\\|_2 \\le f^\\top x + b$ from the block $(f^\\top x + b,
        A x + a)$."""
        head, tail = rows[:1], rows[1:]
        f = self._matrix(head)
        if isinstance(f, Parameter):
            # A one-row matrix parameter becomes a vector parameter of length d.
            name, (_, d) = self.targets[-1]
            self.targets[-1] = (name, (d,))
            f = Parameter(name)
        else:
            f = sp.csr_matrix(f).toarray().ravel()
            f = f if np.any(f) else None
        b = self._offset(head)
        if isinstance(b, Parameter):
            name, _ = self.targets[-1]
            self.targets[-1] = (name, ())
        else:
            b = np.asarray(b).reshape(())
        return SecondOrderCone(self._matrix(tail), a=self._offset(tail), f=f, b=b)
