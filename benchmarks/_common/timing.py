"""The one timing helper of the benchmarks, and the inference timing of a method.

`time_interleaved` warms each call up, then the calls take turns, repeat by
repeat, so that background load hits every one alike; each result is waited for
with `jax.block_until_ready`. Statistics are in seconds.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import numpy as np

TIMING_STATS = ("median", "lq", "uq", "min", "max", "repeats")


def stats(seconds) -> dict:
    """Median, quartiles (`lq`, `uq`), `min`, `max` and `repeats` of `seconds`."""
    t = np.asarray(seconds, np.float64)
    lq, median, uq = np.percentile(t, [25, 50, 75])
    values = map(float, (median, lq, uq, t.min(), t.max()))
    return {**dict(zip(TIMING_STATS, values)), "repeats": int(t.size)}


def fmt(s: dict, spec=".3g", form="{median} [{lq}, {uq}]", scale=1.0) -> str:
    """Timing `stats` as text: `form` with each statistic (`median`, `lq`, `uq`,
    `min`, `max`) times `scale` (1e3: milliseconds) in the format `spec`."""
    keys = [k for k in TIMING_STATS[:5] if k in s]
    return form.format(**{k: format(scale * s[k], spec) for k in keys})


def time_interleaved(
    calls: dict[str, Callable[[], object]], repeats: int, warmup: int = 2
) -> dict:
    """`stats` of each of `calls` (`name: call()`) over `repeats` turns (the order
    reversing each repeat) after `warmup` calls, and `load` (1-minute average)."""
    import jax

    for call in calls.values():
        for _ in range(warmup):
            jax.block_until_ready(call())
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    load_before = os.getloadavg()[0]
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            jax.block_until_ready(calls[name]())
            times[name].append(time.perf_counter() - start)
    out: dict = {name: stats(t) for name, t in times.items()}
    out["load"] = max(load_before, os.getloadavg()[0])
    return out


def time_calls(call: Callable[[], object], repeats: int, warmup: int = 2) -> dict:
    """`stats` of `call()`'s seconds over `repeats` calls, after `warmup` calls."""
    return time_interleaved({"call": call}, repeats, warmup)["call"]


def time_first(
    calls: dict[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict:
    """`time_interleaved` of `calls`, with `first_s`: the seconds of each first
    call (compilation included), timed on its own."""
    import jax

    first = {}
    for name, call in calls.items():
        start = time.perf_counter()
        jax.block_until_ready(call())
        first[name] = time.perf_counter() - start
    out = time_interleaved(calls, repeats, warmup)
    for name in calls:
        out[name]["first_s"] = first[name]
    return out


@dataclasses.dataclass(frozen=True)
class InferenceTiming:
    """How `time_inference` times a method: at most `max_repeats` batch repeats,
    `warmup` calls; `batch_rows` (else as many as take `budget_s` at
    `info["solve_s_mean"]`, at least 8) rows timed and scaled to the batch."""

    max_repeats: int | None = None
    warmup: int = 2
    batch_rows: int | None = None
    budget_s: float | None = None


def timing_batch(X: np.ndarray, batch_size: int) -> np.ndarray:
    """The first `batch_size` rows of `X`, tiled when there are fewer."""
    X = X[:batch_size]
    if len(X) < batch_size:
        X = np.resize(X, (batch_size, X.shape[1]))
    return X


def _rows(trained, x, batch_size: int) -> int:
    """How many rows of the batch `time_inference` solves (see `InferenceTiming`)."""
    policy = trained.timing
    rows = policy.batch_rows
    if rows is None and policy.budget_s is not None:
        if "solve_s_mean" not in trained.info:
            trained.predict_single(x)
        rows = max(8, int(policy.budget_s / trained.info["solve_s_mean"]))
    return batch_size if rows is None else min(rows, batch_size)


def time_inference(trained, data, repeats=20, batch_size=1024, single_repeats=None):
    """`batch` and `single` inference `stats` of `trained` on the first
    `batch_size` test contexts of `data` and on its first (`single_repeats`,
    default 5x `repeats`); `batch_extrapolated_from` where fewer rows were timed."""
    policy = trained.timing
    if policy.max_repeats is not None:
        repeats = min(repeats, policy.max_repeats)
    x = data.X_test[0]
    rows = _rows(trained, x, batch_size)
    subset = timing_batch(data.X_test, batch_size)[:rows]
    single = trained.predict_single or (lambda x: trained.predict(x[None]))
    single_repeats = single_repeats or 5 * repeats
    result = {"single": time_calls(lambda: single(x), single_repeats, policy.warmup)}
    result["batch"] = time_calls(
        lambda: trained.predict(subset), repeats, policy.warmup
    )
    result["batch_size"] = batch_size
    if rows < batch_size:
        for key in TIMING_STATS[:5]:
            result["batch"][key] *= batch_size / rows
        result["batch_extrapolated_from"] = rows
    return result
