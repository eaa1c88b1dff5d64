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
    """Train `method` on the `size` data set and write its results.

    **Arguments:**

    - `size`: `"small"` (25/25) or `"large"` (500/500).
    - `method`: a key of `benchmarks.soc._methods.METHODS`.
    - `out`: the results root; the run goes to `out/soc-{size}/{label}/seed{seed}`
        (an earlier run there is overwritten, so a method can be re-run alone).
    - `data_seed`: the seed of `A` and of the validation and test instances.
    - `options`: `seed`, `overrides`, `label`, `repeats` and `quiet`, as for
        `benchmarks._common.harness.train_and_save`.

    **Returns:** the result record (also in `results.json`), its folder and the
    `Trained` model.
    """
    start = time.perf_counter()
    data = _data.load(size, seed=data_seed)
    return train_and_save(
        REGISTRY,
        method,
        data,
        problem="soc",
        size=size,
        prog=PROG,
        out=out,
        start=start,
        **options,
    )
