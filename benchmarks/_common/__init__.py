"""The shared benchmark harness that the suites (`dc3`, `soc`, `projection`,
`training_step`, `autotune`, `sigma_sweep`, ...) build on: typed configuration
(`config`), provenance and JSON records (`provenance`), timing (`timing`),
metrics (`metrics`), the per-method harness (`harness`), the training loop
(`training`), our method's settings (`pinet_method`), the solver and cvxpylayers
baselines (`solvers`, `layers`), the command line (`cli`), the training suites'
report (`report`), the committed records and pages (`records`), shared problems
(`problems`) and the published reference (`reference`).
"""
