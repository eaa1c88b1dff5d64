r"""cvxpylayers (JAX interface) as the projection layer: the paper's baseline.

The backbone is the shared MLP; its output $y_{\text{raw}}$ is projected by a
`cvxpylayers.jax.CvxpyLayer` around the DPP problem
$\min_y \tfrac12\|y - y_{\text{raw}}\|^2$ s.t. $[A\ I]\, y = b$,
$\|y_{2,:-1}\| \le y_{2,-1}$, with $y_{\text{raw}}$ and $b$ as parameters, solved
per instance by diffcp with Clarabel (ECOS, diffcp's default, is not installed)
and differentiated by diffcp's adjoint. Training uses the DC3 suite's eager loop
(`benchmarks.dc3._cvxpylayers.fit_eager`): the same plan, fresh batches and
validation points as ours, without jit around the layer.

In the DC3 suite the layer's memory grew by hundreds of MB per step, so training
runs under a time budget (`max_time_s`, default 300 s). On the large size a single
step would take many minutes: there `epochs` defaults to 0 (the untrained MLP and
the layer are only timed) and the batch time is extrapolated from
`timing_batch_rows` instances.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..dc3 import _harness
from ..dc3._cvxpylayers import fit_eager, projection_layer
from ..dc3._harness import Run, Trained
from ..dc3._training import backbone
from ._data import SocData

_SOLVE_METHOD = "Clarabel"


def default_config(data: SocData) -> dict:
    """The baseline's hyperparameters: ours (`_pinet.default_config`) where they
    mean the same (batch, epochs, Adam at 1e-2 with a cosine decay over the 1000
    epochs, which the time budget cuts short)."""
    large = data.d1 >= 500
    return {
        "epochs": 0 if large else 1000,
        "batch_size": 128,
        "lr": 1e-2,
        "lr_schedule": "cosine",
        "validate_every": 20,
        "n_valid": 256,
        "max_time_s": 300.0,
        "solve_method": _SOLVE_METHOD,
        "timing_repeats": 3,
        "timing_batch_rows": 32 if large else None,
        "test_rows": 64 if large else None,
    }


def make_projection(A: np.ndarray, solve_method: str = _SOLVE_METHOD):
    r"""A differentiable projection onto the App. B.4 set by cvxpylayers
    (`benchmarks.dc3._cvxpylayers.projection_layer`).

    **Returns:** `project(R, B) -> Y` for batches of raw outputs `R` (B, d1 + d2)
    and right-hand sides `B` (B, d2); eager (not under `jax.jit`).
    """
    import cvxpy as cp

    A = np.asarray(A, np.float64)
    d2, d1 = A.shape
    d = d1 + d2
    E = np.hstack([A, np.eye(d2)])
    return projection_layer(
        d, d2, lambda y, b: [E @ y == b, cp.SOC(y[d - 1], y[d1 : d - 1])], solve_method
    )


def fit(data: SocData, config: dict, seed: int, run: Run) -> Trained:
    """Train the shared backbone through the cvxpylayers projection with Adam."""
    dtype = jnp.result_type(float)
    d1, d2 = data.d1, data.d2
    project_b = make_projection(data.A, config["solve_method"])

    def project(R, X):
        return project_b(R, X[:, :d2])

    def loss(Y, X):
        return jnp.mean(jnp.sum(X[:, d2:] * Y[:, :d1], axis=1))

    return fit_eager(
        backbone(d1 + d2, d1 + d2, seed, dtype),
        project,
        loss,
        data,
        config,
        seed,
        run,
        info={
            "solver": f"cvxpylayers (diffcp, {config['solve_method']})",
            "timing_batch_rows": config["timing_batch_rows"],
        },
    )


def time_inference(
    trained: Trained,
    data: SocData,
    repeats: int = 20,
    batch_size: int = 1024,
    single_repeats: int | None = None,
) -> dict:
    """Single-instance and batch inference times, as `_harness.time_inference`,
    after one warm-up, at most `timing_repeats` batches; with `timing_batch_rows`
    set, the batch is that many rows and its times are scaled to `batch_size`."""
    repeats = min(repeats, trained.info["timing_repeats"])
    rows = trained.info["timing_batch_rows"] or batch_size
    result = _harness.time_inference(
        trained, data, repeats, rows, single_repeats, warmup=1
    )
    if rows < batch_size:
        for key in ("median", "lq", "uq", "min", "max"):
            result["batch"][key] *= batch_size / rows
        result["batch_size"] = batch_size
        result["batch_extrapolated_from"] = rows
    return result
