"""The projection layer: `Projector`."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from . import _douglas_rachford as dr
from ._affine import AbstractAffineProjection, build_affine_projection
from ._constraints import AbstractConstraint
from ._constraints._base import check_bounds_order
from ._errors import (
    BAD_DIM,
    EMPTY_CONSTRAINTS,
    INCONSISTENT_EQUALITY,
    NAN_Y_RAW,
    NO_DIM,
    NOT_A_CONSTRAINT,
    PARAM_BOUNDS_CROSSED,
)
from ._implicit import fixed_point
from ._parameter import Parameter
from ._solution import RESULTS, ProjectionSolution

# A vector assembled at call time from fixed pieces and named parameters.
_Segments = tuple  # tuple[Float[Array, " k"] | Parameter, ...]


_max_abs = dr.max_abs


class Projector(eqx.Module):
    """Orthogonal projection onto a convex set, as a differentiable layer.

    Computes $y = \\Pi_{\\mathcal{C}}(y_{raw}) = \\arg\\min_{z \\in \\mathcal{C}}
    \\|z - y_{raw}\\|^2$ for $\\mathcal{C}$ the intersection of the given constraint
    sets, by Douglas-Rachford splitting on the lifted form $\\mathcal{C} =
    \\Pi_d(\\mathcal{A} \\cap \\mathcal{K})$ (paper Sec. 2.1-2.2, Algorithm 1), with
    modified Ruiz equilibration (App. H.1). Gradients use the implicit function
    theorem at the fixed point (paper eq. 8-9), solved with `lineax.BiCGStab`.

    Everything that does not depend on the instance (lifting, equilibration,
    factorisation of the affine projection) happens once, here, in float64 on the
    host. The output always satisfies the equality constraints up to rounding,
    whatever the number of iterations; inequalities converge linearly.

    **Arguments:**

    - `constraints`: a constraint set or a non-empty list of them (`Equality`,
        `AffineInequality`, `Box`). Their intersection is projected onto.
    - `sigma`: Douglas-Rachford scaling $\\sigma > 0$, or `"auto"` (default):
        $\\sigma = 0.2 / \\mathrm{gmean}(d_y^2)$, with $d_y$ the equilibration's
        column scaling of $y$. In equilibrated coordinates the prox sees
        $\\sigma d_i^2$, so this makes the step invariant to how $y$ is scaled; on
        the paper's DC3 problems it gives 0.062 (small) and 0.145 (large), next to
        the paper's tuned 0.068 and 0.161, and on other problems it avoids the
        10-50x slow-downs of a fixed value.
    - `omega`: relaxation $\\omega \\in (0, 2)$.
    - `n_iter`: forward iterations in training mode.
    - `n_iter_test`: forward iterations in inference mode
        (`eqx.nn.inference_mode`).
    - `n_iter_bwd`: maximum BiCGStab steps in the backward pass.
    - `tol`: if given, each instance stops as soon as its constraint violation and
        fixed-point residual (user units) are at most `tol`, checked every 5
        iterations, with the iteration count (rounded up to a multiple of 5) as a
        cap. Also the threshold for `ProjectionSolution.result`; when `None`
        (fixed iteration count), `result` is judged against `1e-5`.
    - `equilibrate`: run modified Ruiz equilibration on the lifted matrix.
    - `equilibrate_iters`, `equilibrate_tol`, `equilibrate_mode`: its $K$,
        $\\varepsilon$ and update mode (`"gauss_seidel"` or `"jacobi"`).
    - `affine_form`: how the affine projection is factorised: `"nullspace"`
        ($2k(d+m)$ flops per iteration, $k = d - \\mathrm{rank}(E)$),
        `"eliminated"` ($d^2 + 2md$), or `"auto"` (the cheaper). Both are exact.
    - `unroll`: differentiate by unrolling the iterations instead of implicitly
        (for ablations and as a second opinion; needs `tol=None`).
    - `bwd_rtol`, `bwd_atol`: BiCGStab tolerances.
    - `bwd_failure`: what to do when BiCGStab stops at `n_iter_bwd` before its
        tolerance: `"warn"` (a `BackwardNotConvergedWarning`, once), `"raise"`, or
        `"ignore"`.
    - `check_inputs`: check at run time that `y_raw` is finite and that
        parameterised bounds are ordered (`eqx.error_if`).
    - `dim`: the output dimension $d$, only needed when no constraint implies it.
    - `inference`: start in inference mode.
    """

    dim: int = eqx.field(static=True)
    n_eq: int = eqx.field(static=True)
    n_ineq: int = eqx.field(static=True)
    sigma: float
    omega: float
    n_iter: int = eqx.field(static=True)
    n_iter_test: int = eqx.field(static=True)
    n_iter_bwd: int = eqx.field(static=True)
    tol: float | None = eqx.field(static=True)
    bwd_rtol: float = eqx.field(static=True)
    bwd_atol: float = eqx.field(static=True)
    bwd_failure: str = eqx.field(static=True)
    unroll: bool = eqx.field(static=True)
    check_inputs: bool = eqx.field(static=True)
    equilibrated: bool = eqx.field(static=True)
    parameters: tuple[tuple[str, int], ...] = eqx.field(static=True)
    dropped_equality_rows: tuple[int, ...] = eqx.field(static=True)
    inference: bool
    op: AbstractAffineProjection
    C: Float[Array, "m_ineq d"]
    q: _Segments
    ineq_lower: _Segments
    ineq_upper: _Segments
    box_lower: Float[Array, " d"]
    box_upper: Float[Array, " d"]
    box_params: tuple  # tuple[(Int[Array, " k"], lower, upper), ...]

    def __init__(
        self,
        constraints: AbstractConstraint | Sequence[AbstractConstraint],
        *,
        sigma: float | Literal["auto"] = "auto",
        omega: float = 1.7,
        n_iter: int = 50,
        n_iter_test: int | None = None,
        n_iter_bwd: int = 50,
        tol: float | None = None,
        equilibrate: bool = True,
        equilibrate_iters: int = 25,
        equilibrate_tol: float = 1e-3,
        equilibrate_mode: Literal["gauss_seidel", "jacobi"] = "gauss_seidel",
        affine_form: Literal["auto", "nullspace", "eliminated"] = "auto",
        unroll: bool = False,
        bwd_rtol: float = 1e-5,
        bwd_atol: float = 1e-7,
        bwd_failure: Literal["warn", "raise", "ignore"] = "warn",
        check_inputs: bool = True,
        dim: int | None = None,
        inference: bool = False,
    ):
        if isinstance(constraints, AbstractConstraint):
            constraints = [constraints]
        constraints = list(constraints)
        if len(constraints) == 0:
            raise ValueError(EMPTY_CONSTRAINTS)
        for i, c in enumerate(constraints):
            if not isinstance(c, AbstractConstraint):
                raise TypeError(NOT_A_CONSTRAINT.format(index=i, kind=type(c).__name__))
        _check_settings(
            sigma=1.0 if sigma == "auto" else sigma,
            omega=omega,
            n_iter=n_iter,
            n_iter_test=n_iter_test,
            n_iter_bwd=n_iter_bwd,
            tol=tol,
            unroll=unroll,
            bwd_failure=bwd_failure,
            bwd_rtol=bwd_rtol,
            bwd_atol=bwd_atol,
        )

        # Output dimension: from `dim=` or from the first constraint that knows it.
        for i, c in enumerate(constraints):
            cd = c.dim()
            if cd is None:
                continue
            if dim is None:
                dim = cd
            elif cd != dim:
                raise ValueError(
                    BAD_DIM.format(index=i, kind=type(c).__name__, got=cd, expected=dim)
                )
        if dim is None:
            raise ValueError(NO_DIM)

        eq_rows, ineq_rows, boxes = [], [], []
        for c in constraints:
            pieces = c.lift(dim)
            eq_rows += pieces.eq
            ineq_rows += pieces.ineq
            boxes += pieces.box

        E = (
            np.concatenate([e for e, _ in eq_rows], 0)
            if eq_rows
            else np.zeros((0, dim))
        )
        C = (
            np.concatenate([c for c, _, _ in ineq_rows], 0)
            if ineq_rows
            else np.zeros((0, dim))
        )
        op, info = build_affine_projection(
            E,
            C,
            equilibrate=equilibrate,
            eq_max_iter=equilibrate_iters,
            eq_tol=equilibrate_tol,
            eq_mode=equilibrate_mode,
            form=affine_form,
        )

        params: dict[str, int] = {}

        def segments(items) -> _Segments:
            out = []
            for value, size in items:
                if isinstance(value, Parameter):
                    _register(params, value.name, size)
                    out.append(value)
                else:
                    out.append(jnp.asarray(value))
            return tuple(out)

        q_items = [(b, e.shape[0]) for e, b in eq_rows]
        if q_items and not any(isinstance(b, Parameter) for b, _ in q_items):
            _check_consistent(E, np.concatenate([b for b, _ in q_items]), info)

        # Fixed boxes are intersected now; parameterised ones at call time.
        box_lower = np.full((dim,), -np.inf)
        box_upper = np.full((dim,), np.inf)
        box_params = []
        for idx, lo, up in boxes:
            if isinstance(lo, Parameter) or isinstance(up, Parameter):
                lo_seg = segments([(lo, idx.size)])[0]
                up_seg = segments([(up, idx.size)])[0]
                box_params.append((jnp.asarray(idx), lo_seg, up_seg))
            if not isinstance(lo, Parameter):
                box_lower[idx] = np.maximum(box_lower[idx], lo)
            if not isinstance(up, Parameter):
                box_upper[idx] = np.minimum(box_upper[idx], up)
        check_bounds_order(
            box_lower, box_upper, "Projector(constraints): the Box constraints together"
        )

        self.dim = int(dim)
        self.n_eq = int(E.shape[0])
        self.n_ineq = int(C.shape[0])
        if sigma == "auto":
            d_y = np.asarray(info.d_y)
            sigma = float(_AUTO_SIGMA / np.exp(np.mean(np.log(d_y**2))))
        self.sigma = float(sigma)
        self.omega = omega
        self.n_iter = int(n_iter)
        self.n_iter_test = int(n_iter if n_iter_test is None else n_iter_test)
        self.n_iter_bwd = int(n_iter_bwd)
        self.tol = None if tol is None else float(tol)
        self.bwd_rtol = float(bwd_rtol)
        self.bwd_atol = float(bwd_atol)
        self.bwd_failure = bwd_failure
        self.unroll = bool(unroll)
        self.check_inputs = bool(check_inputs)
        self.equilibrated = bool(equilibrate)
        self.dropped_equality_rows = tuple(int(i) for i in info.dropped_rows)
        self.inference = inference
        self.op = op
        self.C = jnp.asarray(C)
        self.q = segments(q_items)
        self.ineq_lower = segments([(lo, c.shape[0]) for c, lo, _ in ineq_rows])
        self.ineq_upper = segments([(up, c.shape[0]) for c, _, up in ineq_rows])
        self.box_lower = jnp.asarray(box_lower)
        self.box_upper = jnp.asarray(box_upper)
        self.box_params = tuple(box_params)
        self.parameters = tuple(sorted(params.items()))

    def with_settings(self, **settings) -> Projector:
        """A copy with different solver settings; the factorisation is reused.

        Accepts `sigma`, `omega`, `n_iter`, `n_iter_test`, `n_iter_bwd`, `tol`,
        `unroll`, `bwd_rtol`, `bwd_atol`, `bwd_failure`, `check_inputs` and
        `inference`. (The static settings cannot be changed with `eqx.tree_at`.)

        **Returns:** a new `Projector`.
        """
        unknown = sorted(set(settings) - _SETTINGS)
        if unknown:
            raise TypeError(
                f"Projector.with_settings: unknown setting(s) {unknown}; valid "
                f"settings are {sorted(_SETTINGS)}. Constraint data and "
                "equilibration need a new Projector."
            )
        _check_settings(**{**{k: getattr(self, k) for k in _SETTINGS}, **settings})
        new = copy.copy(self)
        for k, v in settings.items():
            # Equinox modules are frozen dataclasses; this is a fresh copy, so
            # setting its fields bypasses nothing that other references can see.
            object.__setattr__(new, k, v)
        return new

    # ------------------------------------------------------------------ calls

    def __call__(self, y_raw: Float[ArrayLike, " d"], **params) -> Float[Array, " d"]:
        """Project one point: $y = \\Pi_{\\mathcal{C}}(y_{raw})$.

        **Arguments:**

        - `y_raw`: the point to project, shape `(d,)`. Batch with `jax.vmap`.
        - `**params`: one value per `Parameter` name, each of shape `(k,)`.

        **Returns:** the projected point, shape `(d,)`.
        """
        return self.solve(y_raw, **params).y

    def solve(
        self, y_raw: Float[ArrayLike, " d"], s0=None, **params
    ) -> ProjectionSolution:
        """Project one point and return the solution with its diagnostics.

        **Arguments:**

        - `y_raw`: the point to project, shape `(d,)`.
        - `s0`: optional warm start for the governing sequence (for example
            `solution.s` from a nearby instance), shape `(d + n_ineq,)`. By default
            `y_raw` lifted to $(y_{raw}, C y_{raw})$ in the internal coordinates. No
            gradient flows through it.
        - `**params`: one value per `Parameter` name.

        **Returns:** a `ProjectionSolution`.
        """
        y_raw = self._check_y(y_raw, "y_raw")
        dtype = y_raw.dtype
        values = self._resolve(params, dtype)
        data = self._data(values, dtype)
        theta = dict(data, y_raw=y_raw)
        op = jax.tree.map(lambda a: jax.lax.stop_gradient(a).astype(dtype), self.op)
        n = self.dim + self.n_ineq
        if s0 is None:
            # Start from y_raw lifted into the internal coordinates; this saves a
            # few iterations over the paper's s0 = 0 and changes no fixed point.
            s0 = jnp.concatenate(
                [y_raw / op.d_y, (y_raw @ self.C.T.astype(dtype)) / op.d_w]
            )
        else:
            s0 = jnp.asarray(s0, dtype)
            if s0.shape != (n,):
                raise ValueError(
                    f"Projector.solve(y_raw, s0): `s0` must have shape ({n},) (the "
                    f"lifted dimension d + n_ineq), got {s0.shape}. Pass "
                    "`solution.s` from an earlier call."
                )
        s0 = jax.lax.stop_gradient(s0)
        n_max = self.n_iter_test if self.inference else self.n_iter
        sigma, omega = self.sigma, self.omega
        if self.n_eq + self.n_ineq == 0:
            # Only boxes: the projection is a clip, exact in one step.
            y = jnp.clip(y_raw, theta["lb_y"], theta["ub_y"])
            zero = jnp.zeros((), dtype)
            return ProjectionSolution(
                y=y,
                s=s0,
                n_steps=jnp.asarray(0),
                primal_residual=jax.lax.stop_gradient(self._violation(y, data)),
                fixed_point_residual=zero,
                result=RESULTS.successful,
            )
        if self.unroll:
            if self.tol is not None:
                raise ValueError(
                    "Projector(unroll=True) differentiates through a fixed number of "
                    "iterations, so it needs `tol=None`."
                )
            P = dr.prepare(theta, op, sigma)
            s, n_steps, fp = dr.iterate(s0, P, op, omega, n_max, None)
        else:
            cfg = dr.Config(
                bwd_rtol=self.bwd_rtol,
                bwd_atol=self.bwd_atol,
                n_iter_bwd=self.n_iter_bwd,
                bwd_failure=self.bwd_failure,
            )
            s, n_steps, fp = fixed_point(
                theta, s0, op, (sigma, omega), cfg, n_max, self.tol
            )
        P = dr.prepare(theta, op, sigma)
        y = dr.output(s, P, op)
        viol = jax.lax.stop_gradient(self._violation(y, data))
        fp = jax.lax.stop_gradient(fp)
        tol = 1e-5 if self.tol is None else self.tol
        result = RESULTS.where(
            (viol <= tol) & (fp <= tol), RESULTS.successful, RESULTS.max_steps_reached
        )
        return ProjectionSolution(
            y=y,
            s=s,
            n_steps=jnp.asarray(n_steps),
            primal_residual=viol,
            fixed_point_residual=fp,
            result=result,
        )

    def violation(self, y: Float[ArrayLike, " d"], **params) -> Float[Array, ""]:
        """Maximum absolute constraint violation of `y`, in the user's coordinates.

        $\\max(\\|E y - q\\|_\\infty, \\|(\\ell - C y)_+\\|_\\infty,
        \\|(C y - u)_+\\|_\\infty, \\text{box terms})$, computed from the original
        (unscaled) data, whatever the equilibration.

        **Arguments:**

        - `y`: a point, shape `(d,)`.
        - `**params`: one value per `Parameter` name.

        **Returns:** a scalar.
        """
        y = self._check_y(y, "y", check_finite=False)
        values = self._resolve(params, y.dtype)
        return self._violation(y, self._data(values, y.dtype))

    # -------------------------------------------------------------- internals

    def _check_y(self, y, argname, check_finite=True):
        y = jnp.asarray(y)
        if not jnp.issubdtype(y.dtype, jnp.floating):
            y = y.astype(jnp.result_type(float))
        if y.shape != (self.dim,):
            hint = (
                " To project a batch, use `jax.vmap(proj)(Y, **params)`."
                if y.ndim == 2 and y.shape[-1] == self.dim
                else ""
            )
            raise ValueError(
                f"Projector: `{argname}` must have shape ({self.dim},) (one instance),"
                f" got {y.shape}.{hint}"
            )
        if check_finite and self.check_inputs:
            y = eqx.error_if(y, ~jnp.all(jnp.isfinite(y)), NAN_Y_RAW)
        return y

    def _resolve(self, params: dict, dtype) -> dict:
        expected = dict(self.parameters)
        missing = sorted(set(expected) - set(params))
        unknown = sorted(set(params) - set(expected))
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if unknown:
                parts.append(f"unknown {unknown}")
            raise TypeError(
                f"Projector: parameter mismatch ({'; '.join(parts)}). This projector "
                f"expects exactly {sorted(expected) or 'no parameters'} as keyword "
                "arguments."
            )
        values = {}
        for name, size in expected.items():
            v = jnp.asarray(params[name])
            if v.shape != (size,):
                hint = (
                    " To batch, vmap over instances instead of passing a batch."
                    if v.ndim == 2
                    else ""
                )
                raise ValueError(
                    f"Projector: parameter `{name}` must have shape ({size},) for one "
                    f"instance, got {v.shape}.{hint}"
                )
            values[name] = v.astype(dtype)
        return values

    def _assemble(self, segments, values, dtype):
        parts = [
            values[s.name] if isinstance(s, Parameter) else s.astype(dtype)
            for s in segments
        ]
        if not parts:
            return jnp.zeros((0,), dtype)
        return jnp.concatenate(parts)

    def _data(self, values, dtype):
        """The per-instance constraint data `q, lb_y, ub_y, lb_w, ub_w`, assembled
        from fixed pieces and parameter values, in the user's coordinates."""
        lb = self.box_lower.astype(dtype)
        ub = self.box_upper.astype(dtype)
        for idx, lo, up in self.box_params:
            if isinstance(lo, Parameter):
                lb = lb.at[idx].max(values[lo.name])
            if isinstance(up, Parameter):
                ub = ub.at[idx].min(values[up.name])
        l_w = self._assemble(self.ineq_lower, values, dtype)
        u_w = self._assemble(self.ineq_upper, values, dtype)
        if self.check_inputs and self._has_bound_params():
            crossed = jnp.any(lb > ub) | jnp.any(l_w > u_w)
            lb = eqx.error_if(lb, crossed, PARAM_BOUNDS_CROSSED)
        return dict(
            q=self._assemble(self.q, values, dtype),
            lb_y=lb,
            ub_y=ub,
            lb_w=l_w,
            ub_w=u_w,
        )

    def _has_bound_params(self):
        return bool(self.box_params) or any(
            isinstance(s, Parameter) for s in self.ineq_lower + self.ineq_upper
        )

    def _violation(self, y, data):
        dtype = y.dtype
        w = self.C.astype(dtype) @ y
        return jnp.max(
            jnp.stack(
                [
                    _max_abs(self.op.E.astype(dtype) @ y - data["q"]),
                    _max_abs(jnp.maximum(data["lb_y"] - y, 0)),
                    _max_abs(jnp.maximum(y - data["ub_y"], 0)),
                    _max_abs(jnp.maximum(data["lb_w"] - w, 0)),
                    _max_abs(jnp.maximum(w - data["ub_w"], 0)),
                ]
            )
        )


# sigma * gmean(d_y^2) at the best sigma: 0.18 (DC3 small), about 0.25 (DC3 large),
# 0.03-0.3 on random polytopes (see benchmarks/RESULTS.md).
_AUTO_SIGMA = 0.2

_SETTINGS = frozenset(
    {
        "sigma",
        "omega",
        "n_iter",
        "n_iter_test",
        "n_iter_bwd",
        "tol",
        "unroll",
        "bwd_rtol",
        "bwd_atol",
        "bwd_failure",
        "check_inputs",
        "inference",
    }
)


def _register(params: dict, name: str, size: int) -> None:
    if name in params and params[name] != size:
        raise ValueError(
            f"Projector(constraints): Parameter({name!r}) is used for vectors of "
            f"size {params[name]} and {size}; one name must always have one shape."
        )
    params[name] = size


def _check_consistent(E, q, info) -> None:
    y0 = info.particular_solution(q)
    res = np.abs(E @ y0 - q)
    scale = 1.0 + np.max(np.abs(q)) + np.max(np.abs(E)) * np.max(np.abs(y0))
    bad = np.flatnonzero(res > 1e-9 * scale * max(E.shape))
    if bad.size:
        raise ValueError(
            INCONSISTENT_EQUALITY.format(
                dropped=info.dropped_rows.size,
                rows=bad[:10].tolist(),
                residual=float(res.max()),
            )
        )


def _check_settings(
    *,
    sigma,
    omega,
    n_iter,
    n_iter_test,
    n_iter_bwd,
    tol,
    unroll,
    bwd_failure,
    bwd_rtol,
    bwd_atol,
    **_,
):
    if not (isinstance(sigma, (int, float)) and sigma > 0):
        raise ValueError(f"Projector(sigma={sigma!r}): sigma must be a float > 0.")
    if not (isinstance(omega, (int, float)) and 0 < omega < 2):
        raise ValueError(
            f"Projector(omega={omega!r}): omega must lie in (0, 2); 1.7 is a good "
            "default."
        )
    for name, v in (("n_iter", n_iter), ("n_iter_bwd", n_iter_bwd)):
        if not (isinstance(v, int) and v >= 1):
            raise ValueError(f"Projector({name}={v!r}): must be an int >= 1.")
    if n_iter_test is not None and not (
        isinstance(n_iter_test, int) and n_iter_test >= 1
    ):
        raise ValueError(
            f"Projector(n_iter_test={n_iter_test!r}): must be an int >= 1 or None "
            "(same as n_iter)."
        )
    if tol is not None and not (isinstance(tol, (int, float)) and tol > 0):
        raise ValueError(f"Projector(tol={tol!r}): must be a float > 0 or None.")
    if unroll and tol is not None:
        raise ValueError(
            "Projector(unroll=True, tol=...): unrolled differentiation needs a fixed "
            "iteration count; set tol=None."
        )
    for name, v in (("bwd_rtol", bwd_rtol), ("bwd_atol", bwd_atol)):
        if not (isinstance(v, (int, float)) and v >= 0):
            raise ValueError(f"Projector({name}={v!r}): must be a float >= 0.")
    if bwd_failure not in ("warn", "raise", "ignore"):
        raise ValueError(
            f"Projector(bwd_failure={bwd_failure!r}): must be 'warn', 'raise' or "
            "'ignore'."
        )
