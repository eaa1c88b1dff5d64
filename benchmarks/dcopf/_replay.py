"""Captured host finishes, replayed on one thread: where a batch's finish
spends its time, and whether a change of the library moves it.

A batch's finish runs in worker processes, each instance from a neighbour's
face that depends on the batch (`pinet_eqx._active_set.host_neighbours`), so
its wall time mixes the instances and the cores. `capture` records what each
instance's finish received (its arguments and the neighbour's face it was
given) and returned; `replay` runs those finishes again, in turn, in this
process, with the library as it is now: CPU time, host factorisations and the
stage that settled each, and whether each output is the captured one to the
bit. Capture once, then replay the file at two commits to compare them on the
same inputs.

    python -m benchmarks.dcopf finish --checkpoint results/dcopf/proxy/X.eqx \\
        --save capture.pkl
    python -m benchmarks.dcopf finish --replay capture.pkl
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
import time
from dataclasses import dataclass

import numpy as np

from pinet_eqx._active_set import host_polish
from pinet_eqx._linalg.host_processes import ENVIRONMENT
from pinet_eqx._linalg.host_solve import FACTORISATIONS


@dataclass
class Capture:
    """One batch's host finishes: the set's matrices `(E, C)` as the finish
    holds them, and per instance `(arguments, exact, neighbour, output)` in
    the order they finished."""

    matrices: tuple
    instances: list

    def save(self, path) -> None:
        with open(path, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load(path) -> Capture:
        # Only files this module wrote: pickle runs what the file says.
        with open(path, "rb") as f:
            return pickle.load(f)


@contextlib.contextmanager
def _in_process():
    """The finish in this process's threads (`ENVIRONMENT` set to 0), where
    `_solve` can be watched; the variable restored afterwards."""
    before = os.environ.get(ENVIRONMENT)
    os.environ[ENVIRONMENT] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[ENVIRONMENT]
        else:
            os.environ[ENVIRONMENT] = before


def capture(call) -> Capture:
    """Runs `call()` (a jitted inference call on a sparse set, compiled
    already) with its finish in this process, and records each instance's
    finish. Raises `ValueError` where the call finished nothing on the host."""
    solve, lock = host_polish._solve, threading.Lock()
    matrices, instances = [], []

    def watched(context, arguments, exact, neighbour):
        out = solve(context, arguments, exact, neighbour)
        with lock:
            matrices[:] = [context[:2]]
            instances.append((arguments, exact, neighbour, out[:2]))
        return out

    host_polish._solve = watched
    try:
        with _in_process():
            call()
    finally:
        host_polish._solve = solve
    if not instances:
        raise ValueError(
            "`call` ran no host finish: pass an inference-mode call on a sparse "
            "polyhedral set (`affine_form='sparse'`)."
        )
    return Capture(matrices[0], instances)


def replay(captured: Capture) -> dict:
    """Each captured finish again, in turn, on this thread: per instance its
    CPU time (ms), host factorisations, the stage that settled it
    (`host_polish.STAGE_NAMES`) and whether its point and flag are the
    captured ones exactly; and their summary."""
    context = host_polish._context(*captured.matrices)
    FACTORISATIONS.reset()
    host_polish.SETTLED.reset()
    rows = []
    for arguments, exact, neighbour, (y, fail) in captured.instances:
        start = time.process_time()
        out = host_polish._solve(context, arguments, exact, neighbour)
        cpu_ms = 1e3 * (time.process_time() - start)
        (stage,) = host_polish.SETTLED.reset()
        rows.append(
            dict(
                cpu_ms=cpu_ms,
                factorisations=FACTORISATIONS.reset(),
                stage=stage,
                same=bool(np.array_equal(out[0], y) and out[1] == fail),
                neighbour=neighbour is not None,
            )
        )
    return dict(summary=summarise(rows), instances=rows)


def summarise(rows: list[dict]) -> dict:
    """Totals, quantiles and per-stage counts of `replay`'s rows."""
    ms = np.array([r["cpu_ms"] for r in rows])
    stages: dict = {}
    for r in rows:
        empty = dict(instances=0, cpu_ms=0.0, factorisations=0)
        s = stages.setdefault(r["stage"], empty)
        s["instances"] += 1
        s["cpu_ms"] += r["cpu_ms"]
        s["factorisations"] += r["factorisations"]
    return dict(
        instances=len(rows),
        cpu_ms_total=float(ms.sum()),
        cpu_ms=dict(
            mean=float(ms.mean()), median=float(np.median(ms)),
            p90=float(np.quantile(ms, 0.9)), max=float(ms.max()),
        ),
        factorisations_per_instance=float(np.mean([r["factorisations"] for r in rows])),
        same_as_captured=int(sum(r["same"] for r in rows)),
        stages=stages,
    )  # fmt: skip


def describe(summary: dict) -> str:
    """`summarise`'s numbers, as lines to print."""
    ms = summary["cpu_ms"]
    lines = [
        f"{summary['instances']} finishes replayed on one thread: "
        f"{summary['cpu_ms_total']:.0f} ms of CPU, per instance mean "
        f"{ms['mean']:.1f}, median {ms['median']:.1f}, p90 {ms['p90']:.1f}, "
        f"max {ms['max']:.1f} ms; {summary['factorisations_per_instance']:.2f} "
        f"factorisations per instance; {summary['same_as_captured']} outputs "
        "the same as captured",
    ]
    for name, s in summary["stages"].items():
        lines.append(
            f"  settled by {name}: {s['instances']} instances, "
            f"{s['cpu_ms']:.0f} ms, {s['factorisations'] / s['instances']:.1f} "
            "factorisations each"
        )
    return "\n".join(lines)
