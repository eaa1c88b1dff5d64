"""The training and evaluation harness shared by every method.

A method's `fit(data, config, run)` trains a model and returns a `Trained`: a
jitted batch predictor and a single-instance predictor. The harness times the
training (setup and JIT included), records validation learning curves, evaluates
the test metrics in float64 and times inference, identically for every method.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import resource
import sys
import time
from collections.abc import Callable

import numpy as np
from tqdm.auto import tqdm

from .._machine import cpu_model, git_commit
from ._data import Dataset

CV_OPTIMAL = 1e-3  # the paper's thresholds for an "optimal" instance
RS_OPTIMAL = 0.05
METRICS = (
    "rs_mean",
    "rs_median",
    "rs_max",
    "cv_mean",
    "cv_median",
    "cv_max",
    "eq_cv_max",
    "ineq_cv_max",
    "optimal_pct",
    "test_rows",
)
TIMING_STATS = ("median", "lq", "uq", "min", "max", "repeats")


@dataclasses.dataclass
class Trained:
    """What a method returns after training.

    **Fields:**

    - `predict`: maps contexts `X` (a NumPy array of shape `(n, n_eq)`) to
        predictions `Y` of shape `(n, n_var)`. For network methods it is the whole
        jitted model, applied to the batch; the harness blocks on the result.
    - `predict_single`: maps one context `x` of shape `(n_eq,)` to one `y`; by
        default `predict` on a batch of one.
    - `info`: anything worth recording (tuned hyperparameters, solver statistics).
    - `model`: the trained model, where there is one (for ablations that
        re-evaluate it with other settings); not written to the results.
    """

    predict: Callable
    predict_single: Callable | None = None
    info: dict = dataclasses.field(default_factory=dict)
    model: object = None


class Run:
    """Progress bar, wall clock and validation learning curve of one training run.

    The clock starts when the `Run` is created, so setup (equilibration,
    factorisation, auto-tuning) and JIT compilation count as training time.
    Validation pauses it: the curve's times are training time only.

    **Arguments:**

    - `data`: the `Dataset`, or any object with `X_valid`, `J_valid` (optimal
        values), `relative_suboptimality(Y, J_star, X)` and `violation(Y, X)`.
    - `total_steps`: the number of optimiser steps, for the progress bar.
    - `description`: the bar's label.
    - `n_valid`: how many validation contexts to evaluate at each `validate`.
    - `disable`: hide the progress bar.
    """

    def __init__(
        self,
        data: Dataset,
        total_steps: int | None = None,
        description: str = "",
        n_valid: int | None = None,
        disable: bool = False,
    ):
        self.data = data
        self.n_valid = len(data.X_valid) if n_valid is None else n_valid
        self.curve: list[dict] = []
        self.steps = 0
        self._paused = 0.0
        self._start = time.perf_counter()
        self._bar = tqdm(
            total=total_steps,
            desc=description,
            unit="step",
            disable=disable,
            dynamic_ncols=True,
        )
        self._last_loss = None
        # Seconds of the first optimiser step (trace, compile and one run), when
        # the method reports it with `first_step`.
        self.first_step_s = None

    def first_step(self, seconds: float) -> None:
        """Record the duration of the first optimiser step (its compilation)."""
        self.first_step_s = seconds

    def set_total(self, total_steps: int) -> None:
        """Set the number of optimiser steps once the method knows it."""
        self._bar.total = total_steps
        self._bar.refresh()

    def elapsed(self) -> float:
        """Training seconds so far (validation excluded)."""
        return time.perf_counter() - self._start - self._paused

    def step(self, loss=None, n: int = 1) -> None:
        """Count `n` optimiser steps; `loss` (a scalar) is shown now and then."""
        self.steps += n
        self._bar.update(n)
        if loss is not None:
            # Converting the loss syncs with the device, so only now and then.
            self._last_loss = loss
            if self.steps % 20 == 0:
                self._bar.set_postfix_str(self._postfix(), refresh=False)

    def _postfix(self) -> str:
        loss = self._last_loss
        text = "" if loss is None else f"loss {float(loss):.3g}, "
        if self.curve:
            last = self.curve[-1]
            text += f"val RS {last['rs_mean']:.1e}, CV {last['cv_max']:.0e}"
        return text.rstrip(", ")

    def validate(self, predict: Callable, epoch: int | None = None) -> dict:
        """Evaluate `predict` on the validation contexts and add a curve point."""
        pause = time.perf_counter()
        time_s = pause - self._start - self._paused
        X = self.data.X_valid[: self.n_valid]
        Y = np.asarray(predict(X), np.float64)
        rs = self.data.relative_suboptimality(Y, self.data.J_valid[: self.n_valid], X)
        cv = self.data.violation(Y, X)
        point = {
            "time_s": time_s,
            "epoch": epoch,
            "step": self.steps,
            "rs_mean": float(rs.mean()),
            "rs_median": float(np.median(rs)),
            "cv_max": float(cv.max()),
            "cv_mean": float(cv.mean()),
        }
        self.curve.append(point)
        self._bar.set_postfix_str(self._postfix())
        self._paused += time.perf_counter() - pause
        return point

    def close(self) -> float:
        """Close the bar and return the training time in seconds."""
        self._bar.close()
        return self.elapsed()


def test_metrics(data: Dataset, Y) -> tuple[dict, np.ndarray, np.ndarray]:
    """The paper's test metrics, in float64, and the per-instance RS and CV.

    `Y` holds predictions for the first `len(Y)` test contexts (all of them,
    except for solvers too slow to solve 1024 large instances).
    """
    P = data.problem
    Y = np.asarray(Y, np.float64)
    n = len(Y)
    rs = data.relative_suboptimality(Y, data.J_test[:n])
    eq = np.abs(Y @ P.A.T - data.X_test[:n]).max(axis=1)
    ineq = np.maximum(Y @ P.G.T - P.h, 0.0).max(axis=1)
    cv = np.maximum(eq, ineq)
    metrics = summary_metrics(rs, cv, {"eq": eq, "ineq": ineq})
    return metrics, rs, cv


def summary_metrics(rs, cv, parts: dict[str, np.ndarray]) -> dict:
    """Mean, median and max of the per-instance RS and CV, the largest violation
    of each named part of the constraints (`{name}_cv_max`), the percentage of
    "optimal" instances (CV and RS within the paper's thresholds) and the row
    count: the metrics every suite reports."""
    return {
        "rs_mean": float(rs.mean()),
        "rs_median": float(np.median(rs)),
        "rs_max": float(rs.max()),
        "cv_mean": float(cv.mean()),
        "cv_median": float(np.median(cv)),
        "cv_max": float(cv.max()),
        **{f"{name}_cv_max": float(part.max()) for name, part in parts.items()},
        "optimal_pct": float(100 * np.mean((cv <= CV_OPTIMAL) & (rs <= RS_OPTIMAL))),
        "test_rows": len(rs),
    }


def time_calls(call: Callable, repeats: int, warmup: int = 2) -> dict:
    """Median, quartiles, min and max seconds of `call()` after `warmup` calls.

    `call` must block until its result is ready (e.g. `jax.block_until_ready`).
    """
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    t = np.asarray(times)
    lq, median, uq = np.percentile(t, [25, 50, 75])
    return {
        "median": float(median),
        "lq": float(lq),
        "uq": float(uq),
        "min": float(t.min()),
        "max": float(t.max()),
        "repeats": repeats,
    }


def timing_batch(data: Dataset, batch_size: int) -> np.ndarray:
    """The first `batch_size` test contexts, tiled when there are fewer."""
    X = data.X_test[:batch_size]
    if len(X) < batch_size:
        X = np.resize(X, (batch_size, X.shape[1]))
    return X


def _blocking(fn: Callable) -> Callable:
    import jax

    return lambda *a: jax.block_until_ready(fn(*a))


def time_inference(
    trained: Trained,
    data: Dataset,
    repeats: int = 20,
    batch_size: int = 1024,
    single_repeats: int | None = None,
    warmup: int = 2,
) -> dict:
    """Single-instance and batch inference times, each after `warmup` calls."""
    predict = _blocking(trained.predict)
    single = trained.predict_single
    single = (lambda x: predict(x[None])) if single is None else _blocking(single)
    X = timing_batch(data, batch_size)
    x = data.X_test[0]
    return {
        "single": time_calls(
            lambda: single(x), single_repeats or 5 * repeats, warmup=warmup
        ),
        "batch": time_calls(lambda: predict(X), repeats, warmup=warmup),
        "batch_size": batch_size,
    }


def machine() -> dict:
    """The machine and software that produced a result, and how busy it was.

    `load_avg` is `os.getloadavg()` (1, 5 and 15 minutes) when the record is
    made: other jobs on the machine inflate every time in the record.
    """
    import jax

    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "git": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_avg": list(os.getloadavg()),
    }


def write_results(folder: pathlib.Path, record: dict, rs, cv) -> pathlib.Path:
    """Write `results.json` and `per_instance.csv` (test RS and CV) to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "results.json", "w") as f:
        json.dump(record, f, indent=2)
    table = np.column_stack([np.arange(len(rs)), rs, cv])
    np.savetxt(
        folder / "per_instance.csv",
        table,
        delimiter=",",
        header="index,rs,cv",
        comments="",
        fmt=["%d", "%.6e", "%.6e"],
    )
    return folder


def command_line(prog: str = "python -m benchmarks.dc3") -> str:
    """The command that is running (`prog` and the arguments), for the record."""
    return " ".join([prog, *sys.argv[1:]])


def configure(module, data, method: str, overrides: dict | None) -> dict:
    """`module.default_config(data)` updated with `overrides`.

    **Raises:** `ValueError` naming the unknown keys if `overrides` has a key
    that the method's configuration lacks.
    """
    config = module.default_config(data)
    unknown = set(overrides or {}) - set(config)
    if unknown:
        raise ValueError(
            f"Method {method!r} has no hyperparameter(s) {sorted(unknown)}; its "
            f"hyperparameters are {sorted(config)}."
        )
    config.update(overrides or {})
    return config


def run_method(
    module,
    data,
    config: dict,
    *,
    method: str,
    label: str,
    seed: int,
    dataset: dict,
    metrics: Callable,
    repeats: int = 20,
    quiet: bool = False,
    prog: str = "python -m benchmarks.dc3",
    start: float | None = None,
) -> tuple[dict, np.ndarray, np.ndarray, Trained]:
    """Train (or set up) a method, score it on the test set and time inference.

    **Arguments:**

    - `module`: the method (`default_config`, `fit`, optionally `time_inference`).
    - `data`: the data set (`X_test`, and what `Run` and the method need).
    - `config`: the method's configuration; `test_rows` (if set) limits the
        test metrics to the first rows, `n_valid` the validation contexts.
    - `method`, `label`, `seed`, `dataset`: recorded as such.
    - `metrics`: `metrics(Y) -> (dict, rs, cv)` for predictions of the first
        `len(Y)` test contexts.
    - `repeats`: timed repeats of batch inference (single inference: 5x).
    - `quiet`: hide the progress bar.
    - `prog`: the command recorded with the arguments.
    - `start`: `time.perf_counter()` when the run began (default: now).

    **Returns:** the result record, the per-instance test RS and CV, and the
    `Trained` model. `machine` holds the load average at the start and the end
    and the process's peak memory.
    """
    import jax

    start = time.perf_counter() if start is None else start
    load_start = list(os.getloadavg())
    run = Run(
        data,
        description=f"{label} {data.name}",
        n_valid=config.get("n_valid"),
        disable=quiet,
    )
    trained = module.fit(data, config, seed, run)
    train_s = run.close()
    # Slow solvers may evaluate a prefix of the test set only.
    n_test = config.get("test_rows") or len(data.X_test)
    scores, rs, cv = metrics(trained.predict(data.X_test[:n_test]))
    timer = getattr(module, "time_inference", time_inference)
    inference = timer(trained, data, repeats=repeats)
    record = {
        "method": method,
        "label": label,
        "dataset": dataset,
        "seed": seed,
        # A method that computes in its own precision (a solver) says so.
        "precision": trained.info.get(
            "precision", 64 if jax.config.jax_enable_x64 else 32
        ),
        "config": config,
        "info": trained.info,
        "metrics": scores,
        "timing": {
            "train_s": train_s,
            "first_step_s": run.first_step_s,
            "total_s": time.perf_counter() - start,
            "inference": inference,
        },
        "curve": run.curve,
        "machine": {
            **machine(),
            "load_avg_start": load_start,
            # Peak resident memory of this process (Linux reports KiB).
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        },
        "command": command_line(prog),
    }
    return record, rs, cv, trained


def save_run(folder: pathlib.Path, record: dict, rs, cv, quiet: bool = False) -> None:
    """`write_results`, then (unless `quiet`) a one-line summary of the run."""
    write_results(folder, record, rs, cv)
    if quiet:
        return
    m, inference = record["metrics"], record["timing"]["inference"]
    print(
        f"{record['label']} on {record['dataset']['name']} (seed {record['seed']}): "
        f"mean RS {m['rs_mean']:.2e}, max CV {m['cv_max']:.1e}, optimal "
        f"{m['optimal_pct']:.1f}%, training {record['timing']['train_s']:.1f} s, "
        f"batch-{inference['batch_size']} inference "
        f"{1e3 * inference['batch']['median']:.1f} ms (median)\n-> {folder}"
    )
