r"""jaxopt's OSQP as the projection layer: the paper's "JAXopt" baseline.

The backbone is the shared MLP (two hidden layers of 200 ReLU units). Its output
$y_{\text{raw}}$ is projected by solving the QP
$\min_y \tfrac12\|y - y_{\text{raw}}\|^2$ s.t. $Ay = x$, $Gy \le h$ with
`jaxopt.OSQP` (tolerance $10^{-3}$, as in the paper), vmapped over the batch and
differentiated implicitly (jaxopt's OSQP always differentiates through the KKT
conditions). Training is self-supervised (the mean objective of the projected
outputs) with the shared loop (`benchmarks._common.training`); the whole model,
solver included, is one jitted function.
"""

from __future__ import annotations

import dataclasses
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp

from .._common.config import PaperTrainingConfig
from .._common.harness import Run, Trained
from .._common.training import backbone, fit_model
from ._data import Dataset

_TOL = 1e-3  # the paper's OSQP tolerance for this baseline


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(PaperTrainingConfig):
    """The hyperparameters of the JAXopt baseline.

    The optimiser is the paper's Pinet configuration (as for the reference
    method), but the paper trains this baseline for 12 epochs only, "in the
    interest of training time". `max_time_s` (seconds of training time, `None` for
    no limit) stops it after the epoch that reaches it, which matters on a CPU.
    `tol` is OSQP's tolerance and `maxiter` its iteration cap (jaxopt's default).
    """

    epochs: int = 12
    tol: float = _TOL
    maxiter: int = 4000


def default_config(data: Dataset) -> Config:
    """The hyperparameters of the JAXopt baseline (the same for every data set)."""
    del data
    return Config()


def make_projection(A, G, h, tol: float = _TOL, maxiter: int = 4000):
    r"""A differentiable projection onto $\{y : Ay = x, Gy \le h\}$ by jaxopt.OSQP
    (absolute tolerance `tol`, `maxiter` iterations), for one `(r, x)`: gradients by
    jaxopt's implicit differentiation of the KKT conditions at the inexact
    solution. Returns `project(r, x) -> y`; vmap it for a batch.
    """
    with warnings.catch_warnings():
        # jaxopt warns on import that it is unmaintained; we use it as the paper did.
        warnings.filterwarnings("ignore", "JAXopt is no longer maintained")
        from jaxopt import OSQP

    # No `implicit_diff` argument: jaxopt.OSQP hard-codes implicit_diff=True and
    # raises a TypeError if it is passed again.
    solver = OSQP(tol=tol, maxiter=maxiter)
    eye = jnp.eye(A.shape[1], dtype=A.dtype)

    def project(r, x):
        step = solver.run(params_obj=(eye, -r), params_eq=(A, x), params_ineq=(G, h))
        return step.params.primal

    return project


class _Model(eqx.Module):
    """The MLP backbone followed by the OSQP projection, for one context."""

    mlp: eqx.nn.MLP
    project: object = eqx.field(static=True)

    def __call__(self, x):
        return self.project(self.mlp(x), x)


def fit(data: Dataset, config: Config, seed: int, run: Run) -> Trained:
    """Train the shared backbone through the OSQP projection (`fit_model`); the
    `Trained`'s `predict` is the whole model jitted on a batch.
    """
    dtype = jnp.result_type(float)
    P = data.problem
    A, G, h = (jnp.asarray(M, dtype) for M in (P.A, P.G, P.h))
    project = make_projection(A, G, h, config.tol, config.maxiter)
    model = _Model(backbone(P.n_eq, P.n_var, seed, dtype), project)
    # Row by row: the batched form broadcasts (n,) against (B, n), which
    # jax_numpy_rank_promotion='raise' (our tests' setting) rejects.
    objective = jax.vmap(data.objective_jax(dtype))

    def loss(model, X):
        return jnp.mean(objective(jax.vmap(model)(X)))

    trained = fit_model(
        model,
        data,
        config,
        seed,
        run,
        loss,
        lambda model, X: jax.vmap(model)(X),
        lambda model, x: model(x),
        info={
            "solver": "jaxopt.OSQP",
            "tol": config.tol,
            "maxiter": config.maxiter,
            "implicit_diff": True,
        },
        filter_spec=eqx.is_inexact_array,
    )
    trained.info["epochs_done"] = run.curve[-1]["epoch"]
    return trained
