"""Train (or set up), score, time and record one method, identically for all.

A method is a module (or object) with `default_config(data) -> Config` and
`fit(data, config, seed, run) -> Trained`; `train_and_save` runs it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pathlib
import time
from collections.abc import Callable

import numpy as np
from tqdm.auto import tqdm

from .provenance import command_line, machine, peak_rss_gb
from .timing import InferenceTiming, time_inference


@dataclasses.dataclass
class Trained:
    """A trained method: `predict(X) -> Y` on a NumPy batch, `predict_single(x)`
    (default: `predict` on a batch of one), `info` to record, the `model` (not
    written) and how to time its inference."""

    predict: Callable
    predict_single: Callable | None = None
    info: dict = dataclasses.field(default_factory=dict)
    model: object = None
    timing: InferenceTiming = InferenceTiming()


class Registry:
    """A suite's methods, imported on demand: `name: (description, where)`,
    `where` a module of `package` (`"_pinet"`) or an attribute (`"_solvers:SCS"`)."""

    def __init__(self, package: str, methods: dict[str, tuple[str, str]]):
        self.package = package
        self.descriptions = {name: text for name, (text, _) in methods.items()}
        self._where = {name: where for name, (_, where) in methods.items()}

    def get(self, name: str):
        """The module (or object) implementing method `name`."""
        if name not in self._where:
            raise ValueError(
                f"Unknown method {name!r}; choose one of {tuple(self.descriptions)}."
            )
        module, _, attribute = self._where[name].partition(":")
        module = importlib.import_module(f"{self.package}.{module}")
        return getattr(module, attribute) if attribute else module


class Run:
    """Progress bar, wall clock and validation learning curve of one training run.

    The clock starts with the `Run` (setup and JIT count as training time);
    validation, on the first `n_valid` contexts, pauses it."""

    def __init__(self, data, description="", n_valid: int | None = None, disable=False):
        self.data, self.curve, self.steps = data, [], 0
        self.n_valid = len(data.X_valid) if n_valid is None else n_valid
        self._paused, self._start = 0.0, time.perf_counter()
        bar = dict(unit="step", disable=disable, dynamic_ncols=True)
        self._bar = tqdm(desc=description, **bar)
        self._last_loss = None
        self.first_step_s = None  # the first optimiser step, compilation included

    def set_total(self, total_steps: int) -> None:
        """Set the number of optimiser steps once the method knows it."""
        self._bar.total = total_steps
        self._bar.refresh()

    def elapsed(self) -> float:
        """Training seconds so far (validation excluded)."""
        return time.perf_counter() - self._start - self._paused

    def step(self, loss=None) -> None:
        """Count an optimiser step; `loss` (a scalar) is shown now and then."""
        self.steps += 1
        self._bar.update(1)
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

    def validate(self, predict: Callable, epoch: float | None = None) -> dict:
        """Evaluate `predict` on the validation contexts and add a curve point."""
        pause = time.perf_counter()
        time_s = pause - self._start - self._paused
        X = self.data.X_valid[: self.n_valid]
        Y = np.asarray(predict(X), np.float64)
        rs = self.data.relative_suboptimality(Y, self.data.J_valid[: self.n_valid], X)
        cv = self.data.violation(Y, X)
        point = {"time_s": time_s, "epoch": epoch, "step": self.steps}
        point.update(rs_mean=float(rs.mean()), rs_median=float(np.median(rs)))
        point.update(cv_max=float(cv.max()), cv_mean=float(cv.mean()))
        self.curve.append(point)
        self._bar.set_postfix_str(self._postfix())
        self._paused += time.perf_counter() - pause
        return point

    def close(self) -> float:
        """Close the bar and return the training time in seconds."""
        self._bar.close()
        return self.elapsed()


def write_results(folder: pathlib.Path, record: dict, rs, cv) -> pathlib.Path:
    """Write `results.json` and `per_instance.csv` (test RS and CV) to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(record, indent=2))
    table = np.column_stack([np.arange(len(rs)), rs, cv])
    csv = dict(delimiter=",", header="index,rs,cv", comments="")
    np.savetxt(folder / "per_instance.csv", table, fmt=["%d", "%.6e", "%.6e"], **csv)
    return folder


def train_and_save(
    registry: Registry,
    method: str,
    data,
    *,
    problem: str,
    size: str,
    prog: str,
    out: pathlib.Path | str,
    seed: int = 0,
    overrides: dict | None = None,
    label: str | None = None,
    repeats: int = 20,
    quiet: bool = False,
    start: float | None = None,
    extra: Callable | None = None,
):
    """Configure (`overrides`; an unknown key is an error), train, score in
    float64 and time `method` on `data`, and write its results to
    `out/{data.name}/{label or method}/seed{seed}`, with `extra(trained)` added
    to the record. Returns the record, its folder and the `Trained`."""
    import jax

    start = time.perf_counter() if start is None else start
    module = registry.get(method)
    config = module.default_config(data).with_overrides(overrides, method)
    label = label or method
    load_start = list(os.getloadavg())
    n_valid = getattr(config, "n_valid", None)
    run = Run(data, f"{label} {data.name}", n_valid, disable=quiet)
    trained = module.fit(data, config, seed, run)
    train_s = run.close()
    # Slow solvers may evaluate a prefix of the test set only.
    n_test = getattr(config, "test_rows", None) or len(data.X_test)
    metrics = data.test_metrics(trained.predict(data.X_test[:n_test]))
    inference = time_inference(trained, data, repeats=repeats)
    dataset = {"name": data.name, "problem": problem, "size": size, **data.sizes}
    # A method that computes in its own precision (a solver) says so.
    precision = trained.info.get("precision", 64 if jax.config.jax_enable_x64 else 32)
    timing = {"train_s": train_s, "first_step_s": run.first_step_s}
    timing.update(total_s=time.perf_counter() - start, inference=inference)
    record = {
        "method": method,
        "label": label,
        "dataset": {**dataset, "source": data.source},
        "seed": seed,
        "precision": precision,
        "config": config.as_dict(),
        "info": trained.info,
        "metrics": metrics.summary(),
        "timing": timing,
        "curve": run.curve,
        "machine": {**machine(), "load_avg_start": load_start},
        "command": command_line(prog),
    }
    record["machine"]["peak_rss_gb"] = peak_rss_gb()
    if extra is not None:
        record.update(extra(trained))
    folder = pathlib.Path(out) / data.name / label / f"seed{seed}"
    write_results(folder, record, metrics.rs, metrics.cv)
    if not quiet:
        _summary(record, folder)
    return record, folder, trained


def _summary(record: dict, folder: pathlib.Path) -> None:
    m, inference = record["metrics"], record["timing"]["inference"]
    print(
        f"{record['label']} on {record['dataset']['name']} (seed {record['seed']}): "
        f"mean RS {m['rs_mean']:.2e}, max CV {m['cv_max']:.1e}, optimal "
        f"{m['optimal_pct']:.1f}%, training {record['timing']['train_s']:.1f} s, "
        f"batch-{inference['batch_size']} inference "
        f"{1e3 * inference['batch']['median']:.1f} ms (median)\n-> {folder}"
    )
