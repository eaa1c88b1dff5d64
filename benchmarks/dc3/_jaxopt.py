r"""jaxopt's OSQP as the projection layer, the paper's "JAXopt" baseline: the
shared MLP, then $\min_y \tfrac12\|y - y_{\text{raw}}\|^2$ s.t. $Ay = x$,
$Gy \le h$ by `jaxopt.OSQP` (tolerance 1e-3, as in the paper), differentiated
implicitly; the whole model is one jitted function.
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
    """The paper's optimiser and its 12 epochs for this baseline; OSQP's `tol`
    and `maxiter` (jaxopt's default)."""

    epochs: int = 12
    tol: float = _TOL
    maxiter: int = 4000


def default_config(data: Dataset) -> Config:
    """The same for every data set."""
    del data
    return Config()


def make_projection(A, G, h, tol: float = _TOL, maxiter: int = 4000):
    r"""`project(r, x) -> y` onto $\{y : Ay = x, Gy \le h\}$ by jaxopt.OSQP, for
    one `(r, x)`, differentiated implicitly through the KKT conditions."""
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
    """Train the shared backbone through the OSQP projection (`fit_model`)."""
    dtype = jnp.result_type(float)
    P = data.problem
    A, G, h = (jnp.asarray(M, dtype) for M in (P.A, P.G, P.h))
    project = make_projection(A, G, h, config.tol, config.maxiter)
    model = _Model(backbone(P.n_eq, P.n_var, seed, dtype), project)
    # Row by row: the batched form broadcasts (n,) against (B, n), which
    # jax_numpy_rank_promotion='raise' (our tests' setting) rejects.
    objective = jax.vmap(data.objective_jax(dtype))

    def apply(model, X):
        return jax.vmap(model)(X)

    def loss(model, X):
        return jnp.mean(objective(apply(model, X)))

    def single(model, x):
        return model(x)

    info = dict(solver="jaxopt.OSQP", tol=config.tol, maxiter=config.maxiter)
    info["implicit_diff"] = True
    where = (data, config, seed, run)
    spec = eqx.is_inexact_array
    trained = fit_model(model, *where, loss, apply, single, info=info, filter_spec=spec)
    trained.info["epochs_done"] = run.curve[-1]["epoch"]
    return trained
