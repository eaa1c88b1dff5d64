"""Train, evaluate and time one method on one SOC data set, and write the results."""

from __future__ import annotations

import pathlib
import time

from ..dc3 import _harness
from . import _data, _methods

PROG = "python -m benchmarks.soc"


def train(
    size: str,
    method: str,
    *,
    seed: int = 0,
    overrides: dict | None = None,
    out: pathlib.Path | str = "results/soc",
    label: str | None = None,
    data_seed: int = 0,
    repeats: int = 20,
    quiet: bool = False,
) -> tuple[dict, pathlib.Path, _harness.Trained]:
    """Train `method` on the `size` data set and write its results.

    **Arguments:**

    - `size`: `"small"` (25/25) or `"large"` (500/500).
    - `method`: a key of `benchmarks.soc._methods.METHODS`.
    - `seed`: seeds the initialisation and the training batches.
    - `overrides`: hyperparameters replacing the method's defaults.
    - `out`: the results root; the run goes to `out/soc-{size}/{label}/seed{seed}`
        (an earlier run there is overwritten, so a method can be re-run alone).
    - `label`: the results sub-folder, default the method's name.
    - `data_seed`: the seed of `A` and of the validation and test instances.
    - `repeats`: timed repeats of batch inference (single inference: 5x).
    - `quiet`: hide the progress bar and the summary.

    **Returns:** the result record (also in `results.json`), its folder and the
    `Trained` model.
    """
    start = time.perf_counter()
    data = _data.load(size, seed=data_seed)
    module = _methods.get(method)
    config = _harness.configure(module, data, method, overrides)
    label = label or method
    record, rs, cv, trained = _harness.run_method(
        module,
        data,
        config,
        method=method,
        label=label,
        seed=seed,
        dataset={
            "name": data.name,
            "problem": "soc",
            "size": size,
            **data.sizes,
            "source": data.source,
        },
        metrics=data.test_metrics,
        repeats=repeats,
        quiet=quiet,
        prog=PROG,
        start=start,
    )
    folder = pathlib.Path(out) / data.name / label / f"seed{seed}"
    _harness.save_run(folder, record, rs, cv, quiet)
    return record, folder, trained
