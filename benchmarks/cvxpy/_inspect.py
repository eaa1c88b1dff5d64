"""What a projector was built as, and how its outputs and gradients compare.

`structure` reads a projector's lifted problem; `inference_solve` and
`iterations` run its inference mode for the iterations it takes; `accuracy`,
`max_abs` and `gradient_error` compare outputs and gradients, in float64 NumPy.
"""

from __future__ import annotations

import jax
import numpy as np

import pinet_eqx as pe

from . import _problems


def accuracy(problem, inst, X, ref) -> dict:
    """Outputs `X` against Clarabel's `ref`: the largest distance (`max_abs`),
    the largest objective difference (`objective_excess`, ours minus
    Clarabel's; negative where ours is closer to `y_raw`) and our largest
    constraint violation (`violation`; Clarabel's is `ref_violation`)."""
    excess = _problems.objective(inst, X) - _problems.objective(inst, ref)
    return {
        "max_abs": max_abs(X, ref),
        "objective_excess": float(excess.max()),
        "violation": float(_problems.violation(problem, inst, X).max()),
        "ref_violation": float(_problems.violation(problem, inst, ref).max()),
    }


def structure(proj) -> dict:
    """What a projector was built as: its auxiliary coordinates, rows, cone
    coordinates, boxed coordinates, affine form and iterations."""
    P = proj.problem
    return {
        "n_aux": proj.n_aux,
        "n_eq": P.n_eq,
        "n_ineq": P.n_ineq,
        "n_cone": P.n_cone,
        "n_boxed": len(P.box_index),
        "affine_form": type(proj.op).__name__,
        "n_iter": proj.solver.n_iter,
    }


def inference_solve(proj, args):
    """`proj.solve` in inference mode on the batch `args` (`(Y, params)`),
    jitted: the `ProjectionSolution`s, with the iterations each instance took
    to its tolerance."""
    infer = proj.with_settings(inference=True)
    return jax.jit(jax.vmap(lambda y, p: infer.solve(y, **p)))(*args)


def iterations(solution) -> dict:
    """Median and max iterations of a batch of `ProjectionSolution`s, and the
    number of instances reported successful."""
    n_iter = np.asarray(solution.n_iter)
    return {
        "median": float(np.median(n_iter)),
        "max": int(n_iter.max()),
        "successful": int((solution.result == pe.RESULTS.successful).sum()),
    }


def gradient_error(g, g_ref) -> dict:
    """Per-instance relative error of gradient pytrees `g` against `g_ref` (each
    `(dY, dparams)` with leading axis B): `max` and `median` over instances of
    $\\|g_i - g_{ref,i}\\| / \\|g_{ref,i}\\|$, all leaves of an instance together."""

    def flat(tree):
        leaves = jax.tree_util.tree_leaves(tree)
        B = leaves[0].shape[0]
        return np.concatenate([np.asarray(a).reshape(B, -1) for a in leaves], axis=1)

    a, b = flat(g), flat(g_ref)
    err = np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-300)
    return {"max": float(err.max()), "median": float(np.median(err))}


def max_abs(X, Y) -> float:
    """$\\max |X - Y|$ over every entry, in float64."""
    return float(np.abs(np.asarray(X, np.float64) - np.asarray(Y, np.float64)).max())
