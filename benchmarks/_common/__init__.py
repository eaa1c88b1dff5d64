"""The shared benchmark harness: what every suite in `benchmarks/` builds on.

The suites (`dc3`, `soc`, `projection`, `training_step`, `autotune`,
`sigma_sweep`) import from this package and from their own only.

- `config`: typed per-method configuration that rejects unknown keys.
- `provenance`: the machine, software versions and command behind a result;
  progress logging, worker processes and writing JSON records.
- `timing`: the timing helper (warm-up, first call, interleaved repeats, median
  and spread, and their formatting) and the inference timing of trained methods.
- `metrics`: the metrics record (RS, CV, share of optimal instances).
- `harness`: train (or set up), score, time and record one method.
- `training`: the paper's backbone, Adam and the one training loop.
- `pinet_method`: our method's projector settings, auto-tuning and record.
- `solvers`: the per-instance solver baselines' plumbing, and Clarabel's solve.
- `layers`: cvxpylayers as a projection layer.
- `cli`: the command-line plumbing of the training suites.
- `report`: figures and tables from a folder of results.
- `records`: the committed records, their pages, and the Markdown table writer.
- `problems`: the problems several suites share, and the paper's settings.
- `reference`: the published reference implementation (`pinet-hcnn`).
"""
