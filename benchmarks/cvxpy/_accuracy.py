"""Accuracy of `from_cvxpy` projections and their derivatives, at the defaults.

For each family (a cvxpy set with parameters), `n_instances` raw points, half
near the set and half far, are projected in inference mode (float64) and
compared with Clarabel's projection at 1e-12 (relative infinity norm). Where
Clarabel stops at "optimal_inaccurate", our point counts as exact if it is
feasible (cvxpy's residuals, 1e-9) and no farther from the raw point
(`Family.no_worse`). Directional derivatives are compared with central
differences (`_gradient_errors`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._common.solvers import clarabel


@dataclasses.dataclass
class Family:
    """A cvxpy set: its projected `variables`, its `constraints` and one
    parameter value per cvxpy parameter name (`values`). Shared with
    `tests/test_cvxpy.py`."""

    variables: list
    constraints: list
    values: dict

    @property
    def dim(self) -> int:
        return sum(v.size for v in self.variables)

    def project(self, y_raw, values=None, with_status=False):
        """Clarabel's projection (tolerances 1e-12), the variables stacked
        column-major, and, `with_status`, whether Clarabel reached its
        tolerances (`"optimal"`, not `"optimal_inaccurate"`)."""
        import cvxpy as cp

        self._set_parameters(self.values if values is None else values)
        terms = [cp.sum_squares(v - target) for v, target in self._split(y_raw)]
        problem = cp.Problem(cp.Minimize(sum(terms)), self.constraints)
        status = clarabel(problem, 1e-12, max_iter=500)
        assert status in ("optimal", "optimal_inaccurate"), status
        y = np.concatenate([np.ravel(v.value, order="F") for v in self.variables])
        return (y, status == "optimal") if with_status else y

    def no_worse(self, y, other, y_raw, values=None) -> bool:
        """Whether `y` satisfies the constraints (cvxpy's residuals, to 1e-9;
        unprojected variables found by Clarabel) with an objective no larger than
        `other`'s: then it is at least as close to the projection."""
        import cvxpy as cp

        self._set_parameters(self.values if values is None else values)
        y = np.asarray(y, float)
        fixed = self._split(y)
        ids = {v.id for v in self.variables}
        if any(v.id not in ids for c in self.constraints for v in c.variables()):
            pinned = [v == value for v, value in fixed]
            problem = cp.Problem(cp.Minimize(0), [*self.constraints, *pinned])
            status = clarabel(problem, 1e-12, max_iter=500)
            if status not in ("optimal", "optimal_inaccurate"):
                return False
        for v, value in fixed:  # the residuals are evaluated at y itself
            v.value = value
        feasible = all(np.max(c.violation()) <= 1e-9 for c in self.constraints)
        return feasible and np.sum((y - y_raw) ** 2) <= np.sum((other - y_raw) ** 2)

    def _split(self, y) -> list[tuple]:
        """`(variable, value)` of each variable, from `y` stacked column-major."""
        out, start = [], 0
        for v in self.variables:
            out.append((v, np.reshape(y[start : start + v.size], v.shape, order="F")))
            start += v.size
        return out

    def _set_parameters(self, values: dict) -> None:
        import cvxpy as cp

        for p in cp.Problem(cp.Minimize(0), self.constraints).parameters():
            p.value = np.asarray(values[p.name()])


def families(seed: int = 0) -> dict[str, Family]:
    """The accuracy families: the sets, parameters and variables the issue lists."""
    import cvxpy as cp

    rng = np.random.default_rng(seed)
    out = {}
    n = 30
    x = cp.Variable(n, name="x")
    b, r = cp.Parameter(5, name="b"), cp.Parameter(name="r", nonneg=True)
    A = rng.standard_normal((5, n))
    x0 = rng.uniform(-0.1, 0.1, n)
    out["l1_equality_box"] = Family(
        [x],
        [A @ x == b, cp.norm(x, 1) <= r, x >= -1, x <= 1],
        {"b": A @ x0, "r": 5.0},
    )
    x = cp.Variable(n, name="x")
    g, s = cp.Parameter(8, name="g"), cp.Parameter(name="s")
    F, f = rng.standard_normal((8, n)) / np.sqrt(n), 0.1 * rng.standard_normal(n)
    out["linf_soc"] = Family(
        [x],
        [cp.norm(F @ x + g, 2) <= f @ x + 1.0, cp.norm(x - 0.1, "inf") <= s],
        {"g": 0.1 * rng.standard_normal(8), "s": 0.6},
    )
    x = cp.Variable(n, name="x")
    total, c = cp.Parameter(name="total"), cp.Parameter(n, name="c")
    out["simplex_l2"] = Family(
        [x],
        [x >= 0, cp.sum(x) == total, cp.norm(x - c, 2) <= 0.5],
        {"total": 2.0, "c": rng.uniform(0.03, 0.1, n)},
    )
    x = cp.Variable(20, name="x")
    M = cp.Parameter((10, 20), name="M")
    out["matrix_parameter"] = Family(
        [x],
        [M @ x <= 1.0, cp.abs(x) <= 2.0],
        {"M": rng.standard_normal((10, 20))},
    )
    x, Y = cp.Variable(6, name="x"), cp.Variable((3, 4), name="Y")
    rad = cp.Parameter(name="rad", nonneg=True)
    out["two_variables"] = Family(
        [x, Y],
        [cp.sum(Y, axis=0) == x[:4], Y >= 0, Y <= 0.5, cp.norm(x, 2) <= rad],
        {"rad": 1.5},
    )
    # The same with a quadratic constraint through an unprojected variable z:
    # two auxiliary coordinates remain (z, and cvxpy's for sum_squares).
    x, Y = cp.Variable(6, name="x"), cp.Variable((3, 4), name="Y")
    z = cp.Variable(name="z")
    rad = cp.Parameter(name="rad", nonneg=True)
    out["two_variables_aux"] = Family(
        [x, Y],
        [
            cp.sum(Y, axis=0) == x[:4],
            Y >= 0,
            cp.norm(x, 2) <= rad,
            cp.sum_squares(Y) <= 2 * z,
            z <= 1.0,
        ],
        {"rad": 1.5},
    )
    return out


def run(n_instances: int = 32, n_gradients: int = 4, seed: int = 0) -> list[dict]:
    """One row per family: projection errors, status and derivative errors."""
    import jax
    import jax.numpy as jnp

    import pinet_eqx as pe

    rows = []
    for name, fam in families(seed).items():
        rng = np.random.default_rng(seed + 1)
        proj = pe.from_cvxpy(fam.constraints, fam.variables)
        proj = proj.with_settings(inference=True)
        values = {k: jnp.asarray(v, float) for k, v in fam.values.items()}
        solve = jax.jit(jax.vmap(lambda y, p: proj.solve(y, **p), in_axes=(0, None)))
        scale = np.where(np.arange(n_instances) < n_instances // 2, 0.3, 3.0)
        Y = scale[:, None] * rng.standard_normal((n_instances, fam.dim))
        sols = solve(Y, values)
        errors, certified = [], 0
        for y_raw, y in zip(Y, np.asarray(sols.y)):
            ref, exact = fam.project(y_raw, with_status=True)
            err = np.max(np.abs(y - ref)) / max(1.0, np.max(np.abs(ref)))
            if err > 1e-6 and not exact and fam.no_worse(y, ref, y_raw):
                certified += 1  # Clarabel is the inaccurate one
                err = 0.0
            errors.append(err)
        grad = _gradient_errors(proj, fam, values, rng, n_gradients)
        successful = float(np.mean(sols.result == pe.RESULTS.successful))
        row = dict(family=name, dim=fam.dim, n_aux=proj.n_aux, instances=n_instances)
        row.update(successful=successful, max_error=float(np.max(errors)))
        row.update(median_error=float(np.median(errors)), clarabel_inaccurate=certified)
        row["gradient_error_vs_ours"] = float(np.max(grad["ours"]))
        row["gradient_error_vs_clarabel"] = float(np.max(grad["clarabel"]))
        row["gradient_error_vs_clarabel_median"] = float(np.median(grad["clarabel"]))
        rows.append(row)
    return rows


def _gradient_errors(proj, fam: Family, values, rng, n: int) -> dict[str, list]:
    """Relative errors of directional derivatives of w . y (random directions of
    y_raw and each parameter) against central differences of our forward pass at
    1e-13 (step 1e-6) and of Clarabel's projection (step 1e-4)."""
    import jax
    import jax.numpy as jnp

    tight = proj.with_settings(tol_test=1e-13, n_iter_test_max=100_000)
    errors: dict[str, list] = {"ours": [], "clarabel": []}
    for _ in range(n):
        y_raw = rng.standard_normal(fam.dim)
        w = rng.standard_normal(fam.dim)
        grads = jax.jit(
            jax.grad(lambda y, p: jnp.dot(w, proj(y, **p)), argnums=(0, 1))
        )(y_raw, values)
        ours = jax.jit(lambda y, p: jnp.dot(w, tight(y, **p)))
        cases = [("y_raw", grads[0], rng.standard_normal(fam.dim))]
        cases += [
            (k, grads[1][k], rng.standard_normal(np.shape(v)))
            for k, v in fam.values.items()
        ]
        for key, grad, v in cases:
            derivative = float(np.sum(np.asarray(grad) * v))
            for which, eps in (("ours", 1e-6), ("clarabel", 1e-4)):
                f = _line(
                    fam, values, y_raw, key, v, ours if which == "ours" else None, w
                )
                fd = (f(eps) - f(-eps)) / (2 * eps)
                errors[which].append(abs(derivative - fd) / max(abs(fd), 1e-3))
    return errors


def _line(fam: Family, values, y_raw, key, v, ours, w):
    """`e -> w . y` at the point moved by `e v` along `key` (y_raw or a
    parameter), by our tight forward (`ours`) or by Clarabel."""

    def f(e):
        if key == "y_raw":
            y, p = y_raw + e * v, values
        else:
            y, p = y_raw, {**values, key: values[key] + e * v}
        if ours is not None:
            return float(ours(y, p))
        return float(w @ fam.project(y, {k: np.asarray(x) for k, x in p.items()}))

    return f
