"""Our method: an MLP followed by `pinet_eqx.Projector`, trained end to end.

The projection is onto $\\{y : A y = x,\\ G y \\le h\\}$ with the context $x$ as the
`Parameter` `"b"`. The defaults are the paper's configuration (App. B.2): the
tuned $\\sigma$, 50 iterations, Ruiz equilibration, $\\omega = 1.7$, Adam at 1e-2
and 50 epochs, with our changes, each measured in `benchmarks/RESULTS.md`:
batches of 256 instead of 2048 (eight times the steps for the same epochs), 100
iterations at inference (App. H.4 shows more test iterations are safe), the
equality refinement (`Projector(refine=True)`) and, in float32, a 1e-5 margin on
the inequalities, so that float32 outputs are feasible to the rounding of $y$
itself. The backward pass is `pinet_eqx.ImplicitAdjoint()`'s default, an exact
active-set solve for these polyhedral sets, in place of the paper's 25 BiCGStab
steps on the fixed point (`bwd_max_steps` caps its steps).
"""

from __future__ import annotations

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import pinet_eqx as pe

from ._data import Dataset
from ._harness import Run, Trained
from ._training import backbone, fit_network

# The paper's tuned sigma (App. B.2), for the equilibrated problems.
PAPER_SIGMA = {"small": 0.068068, "large": 0.161069}


def default_config(data: Dataset) -> dict:
    """The paper's configuration for `data`, plus our inference iterations."""
    size = data.source.get("size", "small")
    return {
        "sigma": PAPER_SIGMA.get(size, "auto"),
        "omega": 1.7,
        "n_iter": 50,
        "n_iter_test": 100,
        # Step limit of the implicit backward solve (the paper's 25 BiCGStab
        # steps); None: the adjoint's default, an exact active-set solve here.
        "bwd_max_steps": None,
        "equilibrate": True,
        "refine": True,
        # In float32 the arithmetic noise of y reaches a few 1e-6 on the active
        # inequalities; projecting onto G y <= h - margin keeps them satisfied.
        "ineq_margin": 1e-5 if jnp.result_type(float) == jnp.float32 else 0.0,
        # The paper tuned sigma for small and large; other sizes are auto-tuned.
        "autotune": size not in PAPER_SIGMA,
        "autotune_points": 150,
        "epochs": 50,
        "batch_size": 256,
        "lr": 1e-2,
        "lr_schedule": "constant",
        "validate_every": 1,
        "max_time_s": None,
        # True: `pe.Projector(constraints)` with every library default (sigma,
        # iterations, adjoint, no refinement, no margin, no autotuning); the
        # projector settings above are then ignored.
        "library_defaults": False,
    }


def make_projector(data: Dataset, config: dict) -> pe.Projector:
    """The projection layer onto $\\{y : A y = x, G y \\le h\\}$ for `config`."""
    P = data.problem
    if config.get("library_defaults"):
        return pe.Projector(
            [pe.Equality(P.A, pe.Parameter("b")), pe.AffineInequality(P.G, upper=P.h)]
        )
    return pe.Projector(
        [
            pe.Equality(P.A, pe.Parameter("b")),
            pe.AffineInequality(P.G, upper=P.h - config["ineq_margin"]),
        ],
        sigma=config["sigma"],
        omega=config["omega"],
        n_iter=config["n_iter"],
        n_iter_test=config["n_iter_test"],
        adjoint=pe.ImplicitAdjoint(max_steps=config["bwd_max_steps"]),
        equilibrate=config["equilibrate"],
        refine=config["refine"],
    )


def tune(projector: pe.Projector, data: Dataset, config: dict, seed: int):
    """Run `pinet_eqx.autotune` as in App. H.2: validation contexts, normal points."""
    n = min(config["autotune_points"], len(data.X_valid))
    dtype = jnp.result_type(float)
    X = jnp.asarray(data.X_valid[:n], dtype)
    Y = jax.random.normal(jax.random.key(seed), (n, data.problem.n_var), dtype)
    return pe.autotune(projector, Y, {"b": X})


def fit(data: Dataset, config: dict, seed: int, run: Run) -> Trained:
    """Set up the projector (and auto-tune it if asked), then train the network."""
    dtype = jnp.result_type(float)
    info = {}
    start = time.perf_counter()
    projector = make_projector(data, config)
    info["setup_s"] = time.perf_counter() - start
    if config["autotune"] and not config.get("library_defaults"):
        result = tune(projector, data, config, seed)
        projector = result.projector.with_settings(
            n_iter_test=max(result.n_iter, config["n_iter_test"])
        )
        info.update(autotune_s=result.seconds, sigma=result.sigma, n_iter=result.n_iter)
    info["sigma_used"] = float(projector.sigma)
    info["n_iter_used"] = int(projector.n_iter)
    info["n_iter_test_used"] = int(projector.n_iter_test)
    net = pe.HardConstrainedNet(
        backbone(data.problem.n_eq, data.problem.n_var, seed, dtype), projector
    )
    objective = data.objective_jax(dtype)

    def loss(model, X):
        return jnp.mean(objective(jax.vmap(model)(X, b=X)))

    @eqx.filter_jit
    def batch_predict(model, X):
        return jax.vmap(model)(X, b=X)

    def predict(model, X):
        return batch_predict(model, jnp.asarray(X, dtype))

    net = fit_network(net, data, config, seed, run, loss, predict)
    model = eqx.nn.inference_mode(net)

    # The model is an argument, not a closed-over constant, so that its arrays are
    # not folded into the compiled program.
    single = eqx.filter_jit(lambda model, x: model(x, b=x))

    return Trained(
        predict=lambda X: predict(model, X),
        predict_single=lambda x: single(model, jnp.asarray(np.asarray(x), dtype)),
        info=info,
        model=model,
    )
