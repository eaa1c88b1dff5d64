"""The exact derivative of a polyhedral projection, from its active set.

For $\\mathcal{C} = \\{y : E y = q,\\ \\ell \\le C y \\le u,\\ \\ell_y \\le y \\le
u_y\\}$, the projection $y = \\Pi_{\\mathcal{C}}(y_{raw})$ is piecewise affine.
Where the active set is stable it is the projection onto $\\{M y = h\\}$, with $M$
the equality rows and the active rows of $C$ and of the identity (the box), and
$h$ their right-hand sides. Differentiating its optimality conditions
$y + M^\\top \\lambda = y_{raw}$, $M y = h$ gives the tangent

$$\\dot y = r - M^\\top \\zeta,\\qquad M M^\\top \\zeta = M r - \\dot h
+ \\dot M y,\\qquad r = \\dot y_{raw} - \\dot M^\\top \\lambda,$$

one symmetric positive (semi-)definite solve, done with conjugate gradients
through `lineax`. The map is linear in the tangents, so JAX transposes it for
reverse mode: the cotangents of $y_{raw}$, $h$ and $M$ come from one solve too.

With fixed matrices the equality rows are eliminated once, on the host, with an
orthonormal basis $N$ of $\\ker E$: $\\dot y = E^+ \\dot q + N (v - B_N^\\top \\zeta)$
with $v = N^\\top r$ and $B_N$ the inequality and box rows times $N$, so the
per-instance system involves only the inequality and box rows, masked by the
active set (identity on the inactive rows). The rows are scaled to unit length,
which is Jacobi preconditioning of that system.

The active set is read off the Douglas-Rachford iterate: a row is active when its
prox argument lies outside its bounds, which is where the iteration's own
Jacobian vanishes (the implicit derivative of the fixed point, in closed form).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._problem.lifting import InstanceData
from .._solver import douglas_rachford as dr
from .._solver.affine import AbstractAffineProjection
from .face import SparseRows, face_tangent
from .fixed_rows import FixedRows, fixed_multipliers


class Inputs(eqx.Module):
    """What the projection is differentiated with respect to (one instance).

    `data.E` and `data.C` are `None` when they are fixed (their derivative is then
    in `FixedRows`).
    """

    y_raw: Float[Array, " d"]
    data: InstanceData


class Forward(eqx.Module):
    """The non-differentiated data of the forward Douglas-Rachford iteration."""

    op: AbstractAffineProjection
    s0: Float[Array, " n"]
    sigma: Float[Array, ""]


def _zeros_if_none(tangent, like):
    if like is None:
        return None
    return jnp.zeros_like(like) if tangent is None else tangent


@eqx.filter_custom_jvp
def project(
    inputs: Inputs, *, forward: Forward, fixed: FixedRows | SparseRows | None, cfg
):
    """$y = \\Pi_{\\mathcal{C}}(y_{raw})$ by Douglas-Rachford, differentiated
    exactly through its active set.

    **Arguments:**

    - `inputs`: the differentiated data.
    - `forward`: the iteration's affine projection, start and $\\sigma$.
    - `fixed`: the host factorisation for fixed matrices (`SparseRows` for
        sparse ones), else `None`.
    - `cfg`: static `(omega, (n_min, n_max), tol, solver, box_index)`: the
        iteration's schedule (see `_douglas_rachford.iterate`), with `box_index`
        the tuple of the bounded coordinates of $y$.

    **Returns:** `(y, (s, n_iter, fixed_point_residual, upper_active,
    lower_active))`, the activity flags for $y$'s coordinates then the
    inequality rows.
    """
    omega, (n_min, n_max), tol, _, _ = cfg
    op = forward.op
    P = dr.prepare(inputs.y_raw, inputs.data, op, forward.sigma)
    s, n_iter, fp = dr.iterate(forward.s0, P, op, omega, n_max, tol, n_min)
    z = op.project(s, P.part)
    y = op.d_y * z[: inputs.y_raw.shape[0]]
    return y, (s, n_iter, fp, *activity(s, P, op, z))


def activity(s, P: dr.Prepared, op: AbstractAffineProjection, z=None):
    """Which clipped coordinates ($y$, then the inequality rows) are active at
    the iterate $s$: their prox argument lies above the upper bound (first
    flags) or below the lower one (second), where the clip's derivative
    vanishes."""
    pre = _prox_argument(s, P, op, z)
    return pre > P.upper, pre < P.lower


def strength(s, P: dr.Prepared, op: AbstractAffineProjection, z=None):
    """How far past its nearer bound each clipped coordinate's prox argument
    lies at the iterate $s$ (negative inside its bounds; infinite for equal
    bounds): for the flags of `activity`, about the step size times the
    multiplier, so the least firmly held flags are the weakly active ones."""
    pre = _prox_argument(s, P, op, z)
    excess = jnp.maximum(pre - P.upper, P.lower - pre)
    return jnp.where(P.upper > P.lower, excess, jnp.inf)


def _prox_argument(s, P: dr.Prepared, op: AbstractAffineProjection, z=None):
    z = op.project(s, P.part) if z is None else z
    return P.a + P.c * (2 * z - s)[: P.a.shape[0]]


@project.def_jvp
def _project_jvp(primals, tangents, *, forward, fixed, cfg):
    (inputs,) = primals
    (t_in,) = tangents
    out = project(inputs, forward=forward, fixed=fixed, cfg=cfg)
    y, (_, _, _, hi, lo) = out
    return out, (_face_jvp(inputs, t_in, y, hi, lo, fixed, cfg), (None,) * 5)


@eqx.filter_custom_jvp
def on_face(inputs: Inputs, *, value, flags, fixed: FixedRows | SparseRows | None, cfg):
    """`value`, differentiated as the projection of $y_{raw}$ onto the face of
    `flags` (`(hi, lo)`, as `activity` returns them) is: for a point that is
    that projection, such as a polished one whose face differs from the
    iterate's (`_host_polish`). Arguments as for `project`."""
    del inputs, flags, fixed, cfg
    return value


@on_face.def_jvp
def _on_face_jvp(primals, tangents, *, value, flags, fixed, cfg):
    (inputs,) = primals
    (t_in,) = tangents
    hi, lo = flags
    return value, _face_jvp(inputs, t_in, value, hi, lo, fixed, cfg)


def _face_jvp(inputs: Inputs, t_in: Inputs, y, hi, lo, fixed, cfg):
    """The tangent of the projection $y$ of `inputs` onto the face of the
    flags `hi`, `lo`, along `t_in` (see `project`)."""
    solver, box = cfg[3], np.asarray(cfg[4], np.int32)
    # Symbolic-zero tangents (data that is not differentiated) become zeros.
    t = jax.tree.map(_zeros_if_none, t_in, inputs, is_leaf=lambda x: x is None)
    hi, lo, dh = _pinned(hi, lo, t.data, box)
    if fixed is not None:
        dy, _ = fixed.tangent(hi | lo, t.y_raw, t.data.q, dh, box, solver)
    else:
        moving = t_in.data.E is not None or t_in.data.C is not None
        dy, _ = _general_tangent(inputs, t, y, hi | lo, dh, box, moving, solver)
    return dy


def _pinned(hi, lo, data: InstanceData, box):
    """The activity flags ($y$'s coordinates, then the inequality rows) in the
    layout of `_rows`, and each row's bound in `data` where it is pinned to
    one (0 elsewhere)."""
    d = data.lb_y.shape[0]
    hi = _rows(hi[:d], hi[d:], box)
    lo = _rows(lo[:d], lo[d:], box)
    bound = jnp.where(
        hi,
        _rows(data.ub_y, data.ub_w, box),
        jnp.where(lo, _rows(data.lb_y, data.lb_w, box), 0.0),
    )
    return hi, lo, bound


def _rows(y_part, w_part, box):
    """A quantity per row of the active-set system: the inequality rows, then
    the bounded coordinates `box` of $y$."""
    return jnp.concatenate([w_part, y_part[box]])


def _general_tangent(inputs: Inputs, t: Inputs, y, active, dh, box, moving, solver):
    """The tangent with per-instance matrices; returns $(\\dot y, \\zeta)$.

    See `face_tangent`, with the rows $M = [E; C]$ of the instance. With
    `moving` rows the multipliers $\\lambda$ of the projection enter too:
    $r = \\dot y_{raw} - \\dot M^\\top \\lambda$, with the right-hand
    sides moved by $\\dot M y$.

    Without `moving` rows the map is affine in its arguments' values too, as
    `_fixed_rows.fixed_tangent` is (see `polish`)."""
    # Only reached without `FixedRows`, i.e. with per-instance (dense) matrices.
    E, C = inputs.data.dense_matrices()
    M = jnp.concatenate([E, C])
    m_eq = E.shape[0]
    lam_dM = None
    if moving:
        dE, dC = t.data.dense_matrices()  # `None` tangents became zeros
        lam_dM = (inputs.y_raw - y, jnp.concatenate([dE, dC]), y)
    return face_tangent(M, m_eq, t.y_raw, t.data.q, active, dh, box, solver, lam_dM)


def refine(r, fixed: FixedRows, y, inputs: Inputs, hi, lo, box, solver):
    """One step of iterative refinement onto the active constraints.

    $y \\leftarrow y - \\delta$, with $\\delta$ the minimum-norm solution of
    $E \\delta = E y - q$ and $B_a \\delta = B_a y - h_a$ over the rows $a$ that
    are active or violated at $y$, their residuals computed nearly exactly. In
    float32 this brings the active rows from the rounding of the products that
    made $y$ down to the rounding of $y$ itself.

    **Arguments:**

    - `r`: $[E; C] y - (q, h)$ for the stacked fixed matrices, computed nearly
        exactly (see `_residual.RowResidual`), with `inputs`' inequality bounds
        offset by the same $h$.
    - `fixed`: the `FixedRows` of the same matrices.
    - `y`: the point to refine; `inputs` its data; `hi`, `lo` the activity flags
        returned by `project`; `box` the bounded coordinates; `solver` the
        linear solver (symmetric positive semi-definite).

    **Returns:** the refined point.
    """
    assert fixed.lift is not None  # built with refine=True
    m_eq = inputs.data.q.shape[0]
    dh, active = clip_rows(y, r[m_eq:], inputs.data, hi, lo, box)
    active = active & fixed.usable
    # `_fixed_rows.fixed_tangent` without a y_raw tangent,
    # delta = E^+ r_E - N B_N^T zeta, in one product with `lift`.
    zeta = fixed_multipliers(fixed, active, r[:m_eq], dh, solver)
    return y - jnp.concatenate([r[:m_eq], zeta]) @ fixed.lift.astype(y.dtype)


def polish(
    fixed: FixedRows | SparseRows | None, y_raw, data: InstanceData, hi, lo, box, solver
):
    """The projection of $y_{raw}$ onto the face of the active set, and how far
    its multipliers are from the signs of an optimum.

    On the face $\\{E y = q,\\ B_a y = h_a\\}$ of the rows flagged active at
    the iterate (`hi`, `lo`, see `activity`), the projection is
    $y_{raw} - E^\\top \\mu - B_a^\\top \\lambda_a$, one solve of the
    active-row system: the tangent map (`_fixed_rows.fixed_tangent` for fixed
    matrices, `fixed`, else `_general_tangent` with the rows of `data`) applied to the
    values rather than to tangents. It is the projection onto the whole set
    exactly when it is feasible and every multiplier has the sign of its bound:
    $\\lambda_i \\ge 0$ on a row pinned to its upper bound, $\\le 0$ on the
    lower one (the KKT conditions; the caller checks feasibility).

    **Returns:** `(y, wrong_sign, hi, lo)`: the point, the largest multiplier
    of the wrong sign (0 if none), in the units of $y$ (rows scaled to unit
    length, in $\\ker E$ for fixed matrices), and the flags of its face: those
    given, except for sparse rows, whose polish moves to another face where
    the iterate's is not optimal (`SparseRows.polish`).
    """
    if isinstance(fixed, SparseRows):
        return fixed.polish(y_raw, data, hi, lo)
    y, signed = face_point(fixed, y_raw, data, hi, lo, box, solver)
    return y, jnp.max(-signed, initial=0.0), hi, lo


def face_point(
    fixed: FixedRows | None, y_raw, data: InstanceData, hi, lo, box, solver,
    homogeneous=False,
):  # fmt: skip
    """`polish`'s face projection for dense rows, with each flag's multiplier,
    signed so that it is positive where its sign is right (0 on the entries
    the face leaves free), in the layout of `hi`, `lo`: $y$'s coordinates,
    then the inequality rows.

    With `homogeneous`, the face's right-hand sides are taken as zero: the
    multipliers are then those that express `y_raw` (a row, say) by the
    face's rows, and the point its part orthogonal to them.

    **Returns:** `(y, signed)`.
    """
    d = hi.shape[0] - data.lb_w.shape[0]
    box = np.asarray(box, np.int32)
    hi, lo, bound = _pinned(hi, lo, data, box)
    q = data.q
    if homogeneous:
        q, bound = jnp.zeros_like(q), jnp.zeros_like(bound)
    if fixed is not None:
        y, zeta = fixed.tangent(hi | lo, y_raw, q, bound, box, solver)
        zeta = zeta[zeta.shape[0] - hi.shape[0] :]
    else:
        values = Inputs(y_raw, data)
        t = Inputs(y_raw, dataclasses.replace(data, q=q))
        y, zeta = _general_tangent(values, t, y_raw, hi | lo, bound, box, False, solver)
        zeta = zeta[q.shape[0] :]
    # The solve leaves zeta = 0 on the rows it leaves out.
    signed = jnp.where(hi, zeta, jnp.where(lo, -zeta, 0.0))
    # From `_rows`' layout (inequality rows, then the bounded coordinates).
    m = data.lb_w.shape[0]
    on_y = jnp.zeros((d,), signed.dtype).at[box].set(signed[m:])
    return y, jnp.concatenate([on_y, signed[:m]])


def clip_rows(y, w, data: InstanceData, hi, lo, box):
    """The residuals of the inequality and box rows that are active or violated
    at $y$, for iterative refinement.

    **Arguments:**

    - `y`: the point; `w` its inequality rows $C y$ (computed nearly exactly).
    - `data`: the instance's bounds.
    - `hi`, `lo`: the activity flags returned by `project` (or `activity`).
    - `box`: the bounded coordinates of $y$.

    **Returns:** `(dh, active)`: per row of `_rows`' layout, the excess over the
    bound it is pinned to (zero elsewhere), and whether it is pinned.
    """
    d = y.shape[0]
    box = np.asarray(box, np.int32)
    value = _rows(y, w, box)
    lower = _rows(data.lb_y, data.lb_w, box)
    upper = _rows(data.ub_y, data.ub_w, box)
    hi = _rows(hi[:d], hi[d:], box) | (value > upper)
    lo = (_rows(lo[:d], lo[d:], box) | (value < lower)) & ~hi
    dh = jnp.where(hi, value - upper, jnp.where(lo, value - lower, 0.0))
    return dh, hi | lo
