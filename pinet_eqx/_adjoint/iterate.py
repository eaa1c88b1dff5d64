"""The second phase of one instance's forward pass: the iteration, run under the
derivative rule its adjoint chooses.

`UnrolledAdjoint` runs a fixed count of Douglas-Rachford steps, which reverse
mode differentiates step by step; on polyhedral sets `ImplicitAdjoint` takes
the active-set path (`_active_set.derivative`), whose derivative is the active
face's; elsewhere the implicit function theorem at the fixed point
(`implicit`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .._active_set import derivative as active_set
from .._solver import douglas_rachford as dr
from .._solver.instance import Instance, Iterated
from .._solver.settings import DouglasRachford
from .adjoint import UnrolledAdjoint
from .implicit import fixed_point


def iterate(instance: Instance, diagnostics: bool) -> Iterated:
    """Phase two: iterate `instance` from its start, and read out $y$ (and,
    with `diagnostics`, what the status needs)."""
    problem, data, op = instance.problem, instance.data, instance.op
    adjoint, omega, sigma = instance.adjoint, instance.omega, instance.sigma
    y_raw, s0, polyhedral = instance.y_raw, instance.s0, instance.polyhedral
    n_min, n_max, tol = instance.n_min, instance.n_max, instance.tol
    # Derivative rules see the matrices only through a per-instance `op`.
    theta_data = dataclasses.replace(data, E=None, C=None)
    flags = None  # the active set, where the iteration reports it
    inputs = None  # the differentiated data, on the active-set path
    cfg = None
    y = None
    if isinstance(adjoint, UnrolledAdjoint):
        # A fixed count, which reverse mode can unroll (inference mode too: its
        # `n_iter_test` iterations, without `tol_test`'s extra ones).
        n_max, tol = instance.n_steps, None
        P = dr.prepare(y_raw, data, op, sigma, problem.groups)
        s, n_iter, fp = dr.iterate(s0, P, op, omega, n_max, None)
    elif adjoint.uses_active_set(polyhedral):
        if problem.per_instance:
            inputs = active_set.Inputs(y_raw, data)
        else:
            inputs = active_set.Inputs(y_raw, theta_data)
        # Keyword arguments of a custom_jvp carry no tangents.
        forward = jax.lax.stop_gradient(
            active_set.Forward(op=op, s0=s0, sigma=jnp.asarray(sigma, y_raw.dtype))
        )
        cfg = (
            omega,
            (n_min, n_max),
            tol,
            adjoint.solver(polyhedral),
            problem.box_index,
        )
        y, (s, n_iter, fp, *flags) = active_set.project(
            inputs, forward=forward, fixed=instance.rows, cfg=cfg
        )
    else:
        theta = (y_raw, theta_data, op if problem.per_instance else None)
        s, n_iter, fp = fixed_point(
            theta,
            s0,
            None if problem.per_instance else op,
            (sigma, omega),
            groups=problem.groups,
            n_max=n_max,
            tol=tol,
            solver=adjoint.solver(polyhedral),
            n_min=n_min,
        )
    # On the active-set path y already is D_y [Pi_A(s)]_y; otherwise it is
    # computed here, and the same z (and t, which only the status needs)
    # feeds the infeasibility certificate.
    P = z = t = None
    if y is None or diagnostics:
        P = dr.prepare(y_raw, data, op, sigma, problem.groups)
        z, t = dr.z_and_t(s, P, op)
        if y is None:
            y = op.d_y * z[: problem.dim]
    return Iterated(
        s=s,
        n_iter=n_iter,
        fp=fp,
        y=y,
        flags=flags,
        inputs=inputs,
        cfg=cfg,
        P=P,
        z=z,
        t=t,
        status_tol=DouglasRachford.default_tol(y_raw.dtype) if tol is None else tol,
    )
