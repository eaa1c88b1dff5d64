"""Train, evaluate and time one method on one SOC data set, and write the results."""

from __future__ import annotations

import pathlib
import time

from .._common.harness import Trained, train_and_save
from . import _data
from ._methods import REGISTRY

PROG = "python -m benchmarks.soc"


def train(
    size: str,
    method: str,
    *,
    out: pathlib.Path | str = "results/soc",
    data_seed: int = 0,
    **options,
) -> tuple[dict, pathlib.Path, Trained]:
    """Train `method` on the `size` data set (`data_seed` seeds `A` and the
    validation and test instances) and write its results
    (`_common.harness.train_and_save`, with `options`)."""
    start = time.perf_counter()
    data = _data.load(size, seed=data_seed)
    where = dict(problem="soc", size=size, prog=PROG, out=out, start=start)
    return train_and_save(REGISTRY, method, data, **where, **options)
