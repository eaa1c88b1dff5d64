"""Train, evaluate and time one method on one SOC data set, and write the results."""

from __future__ import annotations

import pathlib
import time

import jax

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
    config = module.default_config(data)
    unknown = set(overrides or {}) - set(config)
    if unknown:
        raise ValueError(
            f"Method {method!r} has no hyperparameter(s) {sorted(unknown)}; its "
            f"hyperparameters are {sorted(config)}."
        )
    config.update(overrides or {})
    label = label or method
    load_start = _harness.machine()["load_avg"]

    run = _harness.Run(
        data,
        description=f"{label} {data.name}",
        n_valid=config.get("n_valid"),
        disable=quiet,
    )
    trained = module.fit(data, config, seed, run)
    train_s = run.close()

    # Slow solvers on the large size evaluate a prefix of the test set only.
    n_test = config.get("test_rows") or len(data.X_test)
    Y = trained.predict(data.X_test[:n_test])
    metrics, rs, cv = data.test_metrics(Y)
    timer = getattr(module, "time_inference", _harness.time_inference)
    inference = timer(trained, data, repeats=repeats)
    machine = _harness.machine()
    machine["load_avg_start"] = load_start
    record = {
        "method": method,
        "label": label,
        "dataset": {
            "name": data.name,
            "problem": "soc",
            "size": size,
            **data.sizes,
            "source": data.source,
        },
        "seed": seed,
        "precision": 64 if jax.config.jax_enable_x64 else 32,
        "config": config,
        "info": trained.info,
        "metrics": metrics,
        "timing": {
            "train_s": train_s,
            "total_s": time.perf_counter() - start,
            "inference": inference,
        },
        "curve": run.curve,
        "machine": machine,
        "command": _harness.command_line(PROG),
    }
    folder = pathlib.Path(out) / data.name / label / f"seed{seed}"
    _harness.write_results(folder, record, rs, cv)
    if not quiet:
        m, b = metrics, inference["batch"]
        print(
            f"{label} on {data.name} (seed {seed}): mean RS {m['rs_mean']:.2e}, "
            f"max CV {m['cv_max']:.1e}, optimal {m['optimal_pct']:.1f}%, "
            f"training {train_s:.1f} s, batch-{inference['batch_size']} inference "
            f"{1e3 * b['median']:.1f} ms (median)\n-> {folder}"
        )
    return record, folder, trained
