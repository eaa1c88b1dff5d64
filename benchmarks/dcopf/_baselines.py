"""The training baselines of the DC-OPF suite, where they fit: cvxpylayers and the
reference (pinet-hcnn).

Each is measured as `_train` would use it: value and gradient of a fixed random
weighting of a batch of projections at the suite's near raw outputs, with
respect to them and the loads' right-hand side; its accuracy against Clarabel's
projection (relative infinity norm) and its violation, in float64; and the
suite's 300 training steps at batch 64 extrapolated from one step
(`train_300_steps_s_estimate`; the issue's budget is 10 minutes).

- **cvxpylayers**: `CvxpyLayer` at its defaults (diffcp with SCS), float64.
- **The reference** (`pip install --no-deps pinet-hcnn==0.2.0 beartype`),
  float32, dense matrices only: the inequalities become one-sided rows
  $[C; -C; I; -I]$ (infinite bounds dropped), Ruiz equilibration, 50 forward
  and 25 backward iterations, $\\sigma = 10^{-3}$ (the issue's best).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from .._common import provenance, timing
from ._data import _inequalities, project_clarabel
from ._fixture import GridCase, sample_loads
from ._projection import NEAR, raw_outputs

TRAIN_STEPS, TRAIN_BATCH = 300, 64


def run(case: GridCase, layer: str, *, batch: int = 8, repeats: int = 2) -> dict:
    """Measure one baseline (`"cvxpylayers"` or `"reference"`) on `case`;
    returns a JSON-able record."""
    rng = np.random.default_rng(0)
    loads = sample_loads(case, batch, rng)
    y_center = project_clarabel(case, np.zeros(case.dim), loads[0])[0]
    Y = raw_outputs(case, loads, rng, NEAR, y_center)
    Q = case.q(loads)
    W = rng.normal(size=Y.shape)
    rss0 = provenance.peak_rss_gb()
    start = time.perf_counter()
    if layer == "cvxpylayers":
        forward, dtype = _cvxpylayers(case), jnp.float64
    elif layer == "reference":
        forward, dtype = _reference(case), jnp.float32
    else:
        raise ValueError(f"layer={layer!r}: pass 'cvxpylayers' or 'reference'.")
    build_s = time.perf_counter() - start

    def loss(Y, Q):
        return jnp.sum(jnp.asarray(W, dtype) * forward(Y, Q))

    step = jax.value_and_grad(loss, argnums=(0, 1))
    if layer == "reference":
        step = jax.jit(step)
    args = (jnp.asarray(Y, dtype), jnp.asarray(Q, dtype))
    start = time.perf_counter()
    jax.block_until_ready(step(*args))
    first_s = time.perf_counter() - start
    t = timing.time_calls(lambda: step(*args), repeats=repeats, warmup=0)
    ys = np.asarray(forward(*args), np.float64)
    errors, viols = [], []
    for i in range(batch):
        ref = project_clarabel(case, Y[i], loads[i])[0]
        errors.append(np.abs(ys[i] - ref).max() / np.abs(ref).max())
        viols.append(max(case.residuals(ys[i], loads[i])))
    per_instance = t["median"] / batch
    return dict(
        case=case.name,
        layer=layer,
        dtype=jnp.dtype(dtype).name,
        batch=batch,
        build_s=build_s,
        peak_rss_gb_after_build=provenance.peak_rss_gb(),
        peak_rss_gb_before=rss0,
        first_step_s=first_s,
        step_s=t,
        train_300_steps_s_estimate=TRAIN_STEPS * TRAIN_BATCH * per_instance,
        rel_err_max=float(np.max(errors)),
        rel_err_median=float(np.median(errors)),
        violation_max=float(np.max(viols)),
        machine=provenance.machine(),
    )


def _cvxpylayers(case: GridCase):
    """`(Y, Q) -> projections` by a `CvxpyLayer` at its defaults."""
    import cvxpy as cp

    from ..cvxpy._calls import cvxpylayers

    def make():
        y = cp.Variable(case.dim, name="y")
        y_raw = cp.Parameter(case.dim, name="y_raw")
        q = cp.Parameter(case.E.shape[0], name="q")
        G, h = _inequalities(case)
        cons = [case.E @ y == q, G @ y <= h]
        problem = cp.Problem(cp.Minimize(cp.sum_squares(y - y_raw)), cons)
        return problem, y_raw, [q], y

    layer = cvxpylayers(make, np.zeros(case.dim))
    return lambda Y, Q: layer["forward"](Y, {"q": Q})


def _reference(case: GridCase):
    """`(Y, Q) -> projections` by the reference, as the module says."""
    from .._common.reference import ReferenceDC3Projector

    G, h = _inequalities(case)
    ref = ReferenceDC3Projector(
        case.E.toarray(), G.toarray(), h, sigma=1e-3, dtype=jnp.float32
    )
    return ref.projection(n_iter=50, n_iter_bwd=25)
