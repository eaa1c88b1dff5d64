#!/usr/bin/env bash
# The runs behind the DC3 section of benchmarks/RESULTS.md, one at a time, in
# order of priority (the small non-convex problem carries the paper's headline
# comparison).
#
#   bash benchmarks/dc3/run_suite.sh [OUT] [STAGES]
#
# OUT defaults to results/dc3; STAGES to "nonconvex-small nonconvex-large
# convex-small convex-large". The slow baselines run under a training-time budget
# (`--set max_time_s=...`) on a CPU; their results.json records the epochs run.
set -euo pipefail
out="${1:-results/dc3}"
stages="${2:-nonconvex-small nonconvex-large convex-small convex-large}"
train() { python -m benchmarks.dc3 train --out "$out" --repeats 10 "$@"; }

for stage in $stages; do
  problem="${stage%-*}"
  size="${stage#*-}"
  common=(--problem "$problem" --size "$size")
  # The paper's exact small test instances, where they are (never required).
  paper=()
  if [ "$size" = small ] && [ -d "${DC3_INSTANCES:-../shared/data/dc3}" ]; then
    paper=(--instances "${DC3_INSTANCES:-../shared/data/dc3}")
  fi
  # Ours and the reference back to back, same data, same machine.
  train "${common[@]}" --method pinet --seed 0 "${paper[@]}"
  train "${common[@]}" --method reference --seed 0
  # Ours with the paper's exact configuration, to show what our defaults change.
  train "${common[@]}" --method pinet --seed 0 --label pinet-paper-config \
    --set batch_size=2048 --set n_iter_test=50 --set refine=false \
    --set ineq_margin=0.0
  train "${common[@]}" --method solver --seed 0
  if [ "$problem" = convex ]; then
    train "${common[@]}" --method solver --seed 0 --label solver-parametric \
      --set mode=\"parametric\"
  fi
  train "${common[@]}" --method dc3 --seed 0 --set max_time_s=600
  if [ "$size" = small ]; then
    train "${common[@]}" --method jaxopt --seed 0 --set max_time_s=300
    if [ "$problem" = nonconvex ]; then
      train "${common[@]}" --method cvxpylayers --seed 0 --set max_time_s=300
      train "${common[@]}" --method soft --seed 0
      for seed in 1 2; do
        train "${common[@]}" --method pinet --seed "$seed"
        train "${common[@]}" --method reference --seed "$seed"
      done
    fi
  fi
  python -m benchmarks.dc3 report "$out"
done
