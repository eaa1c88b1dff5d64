"""Train, evaluate and time one method on one DC3 data set, and write the results."""

from __future__ import annotations

import pathlib
import time

import numpy as np

from . import _data, _harness, _methods


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
    Y = trained.predict(paper.X_test)
    metrics, _, _ = _harness.test_metrics(paper, Y)
    return metrics


def train(
    problem: str,
    size: str,
    method: str,
    *,
    seed: int = 0,
    overrides: dict | None = None,
    out: pathlib.Path | str = "results/dc3",
    label: str | None = None,
    data_seed: int = 17,
    repeats: int = 20,
    instances: pathlib.Path | None = None,
    quiet: bool = False,
    cache_dir: pathlib.Path | str | None = None,
) -> tuple[dict, pathlib.Path, _harness.Trained]:
    """Train `method` on the `problem`/`size` data set and write its results.

    **Arguments:**

    - `problem`, `size`: the data set (see `benchmarks.dc3._data.load`).
    - `method`: a key of `benchmarks.dc3._methods.METHODS`.
    - `seed`: seeds the initialisation, shuffling and tuning points.
    - `overrides`: hyperparameters replacing the method's defaults.
    - `out`: the results root; the run goes to `out/{data}/{label}/seed{seed}`.
    - `label`: the results sub-folder, default the method's name.
    - `data_seed`: the DC3 generator's seed.
    - `repeats`: timed repeats of batch inference (single inference: 5x).
    - `instances`: a folder of the paper's DC3 `.npz` files to evaluate on too.
    - `quiet`: hide the progress bar and the summary.
    - `cache_dir`: where the optimal solutions are cached (see `_data.load`).

    **Returns:** the result record (also in `results.json`), its folder and the
    `Trained` model.
    """
    start = time.perf_counter()
    data = _data.load(
        problem, size, seed=data_seed, cache_dir=cache_dir, verbose=not quiet
    )
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
            "problem": problem,
            "size": size,
            **data.sizes,
            "source": data.source,
        },
        metrics=lambda Y: _harness.test_metrics(data, Y),
        repeats=repeats,
        quiet=quiet,
        start=start,
    )
    if instances is not None:
        record["metrics_paper_instances"] = _paper_metrics(data, trained, instances)
    folder = pathlib.Path(out) / data.name / label / f"seed{seed}"
    _harness.save_run(folder, record, rs, cv, quiet)
    return record, folder, trained
