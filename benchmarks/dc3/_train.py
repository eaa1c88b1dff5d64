"""Train, evaluate and time one method on one DC3 data set, and write the results."""

from __future__ import annotations

import pathlib
import time

import numpy as np

from .._common.harness import Trained, train_and_save
from . import _data
from ._methods import REGISTRY

PROG = "python -m benchmarks.dc3"


def _paper_metrics(data: _data.Dataset, trained, instances: pathlib.Path) -> dict:
    problem = "nonconvex" if data.nonconvex else "convex"
    paper = _data.load_instances(instances, problem)
    P, Q = data.problem, paper.problem
    same = all(
        getattr(P, k).shape == getattr(Q, k).shape
        and np.allclose(getattr(P, k), getattr(Q, k), rtol=0, atol=1e-12)
        for k in ("Q", "p", "A", "G", "h")
    )
    if not same:
        raise ValueError(
            f"`--instances {instances}` holds a different problem than {data.name}: "
            "the paper's files are the small problem generated with seed 17."
        )
    return paper.test_metrics(trained.predict(paper.X_test)).summary()


def train(
    problem: str,
    size: str,
    method: str,
    *,
    out: pathlib.Path | str = "results/dc3",
    data_seed: int = 17,
    instances: pathlib.Path | None = None,
    cache_dir: pathlib.Path | str | None = None,
    quiet: bool = False,
    **options,
) -> tuple[dict, pathlib.Path, Trained]:
    """Train `method` on the `problem`/`size` data set (generator seed
    `data_seed`) and write its results (`_common.harness.train_and_save`, with
    `options`); with `instances` (the paper's `.npz` folder), also score those."""
    start = time.perf_counter()
    data = _data.load(
        problem, size, seed=data_seed, cache_dir=cache_dir, verbose=not quiet
    )

    def paper_metrics(trained) -> dict:
        if instances is None:
            return {}
        return {"metrics_paper_instances": _paper_metrics(data, trained, instances)}

    where = dict(problem=problem, size=size, prog=PROG, out=out, start=start)
    extra = dict(quiet=quiet, extra=paper_metrics)
    return train_and_save(REGISTRY, method, data, **where, **extra, **options)
