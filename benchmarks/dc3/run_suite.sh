#!/usr/bin/env bash
# The runs behind benchmarks/dc3/RESULTS.md, one at a time, in
# order of priority (the small non-convex problem carries the paper's headline
# comparison). Needs `pip install -e ".[bench]"` and, for the reference,
# `pip install --no-deps pinet-hcnn==0.2.0 beartype`.
#
#   bash benchmarks/dc3/run_suite.sh [OUT] [STAGES]
#
# OUT defaults to results/dc3; STAGES to "nonconvex-small convex-small
# nonconvex-large convex-large". On a CPU the slow baselines, and every training
# run on the large problems, run under a training-time budget
# (`--set max_time_s=...`); results.json records the epochs run. Set
# DC3_INSTANCES to the folder of the paper's DC3 .npz files to also score ours on
# them (default ../shared/data/dc3, skipped when absent).
set -euo pipefail
out="${1:-results/dc3}"
stages="${2:-nonconvex-small convex-small nonconvex-large convex-large}"
train() { python -m benchmarks.dc3 train --out "$out" "$@"; }

for stage in $stages; do
  problem="${stage%-*}"
  size="${stage#*-}"
  common=(--problem "$problem" --size "$size")
  if [ "$size" = large ]; then
    # About 10 minutes of training each on a 2-core CPU, and fewer timed repeats.
    common+=(--repeats 3)
    budget=(--set max_time_s=480)
  else
    common+=(--repeats 10)
    budget=()
  fi
  paper=()
  if [ "$size" = small ] && [ -d "${DC3_INSTANCES:-../shared/data/dc3}" ]; then
    paper=(--instances "${DC3_INSTANCES:-../shared/data/dc3}")
  fi
  # Ours and the reference back to back, same data, same machine.
  train "${common[@]}" --method pinet --seed 0 "${budget[@]}" "${paper[@]}"
  train "${common[@]}" --method reference --seed 0 "${budget[@]}"
  if [ "$size" = small ]; then
    # Ours with the paper's exact configuration, to show what our defaults change.
    train "${common[@]}" --method pinet --seed 0 --label pinet-paper-config \
      --set batch_size=2048 --set n_iter_test=50 --set refine=false \
      --set ineq_margin=0.0
  fi
  train "${common[@]}" --method solver --seed 0
  if [ "$problem" = convex ]; then
    train "${common[@]}" --method solver --seed 0 --label solver-parametric \
      --set mode=\"parametric\"
  fi
  train "${common[@]}" --method dc3 --seed 0 --set max_time_s=$([ "$size" = small ] && echo 600 || echo 300)
  if [ "$size" = small ]; then
    if [ "$problem" = nonconvex ]; then
      train "${common[@]}" --method jaxopt --seed 0 --set max_time_s=300
      # cvxpylayers solves every instance on the CPU: one step of a 2048 batch
      # took 279 s and 24 GB of memory here, so batches of 128 for 120 s.
      train "${common[@]}" --method cvxpylayers --seed 0 --set max_time_s=120 \
        --set batch_size=128 --set timing_repeats=1
      train "${common[@]}" --method soft --seed 0
      for seed in 1 2; do
        train "${common[@]}" --method pinet --seed "$seed"
        train "${common[@]}" --method reference --seed "$seed"
      done
    fi
  fi
  python -m benchmarks.dc3 report "$out"
done
ablations=(python -m benchmarks.dc3 ablations --size small --problem nonconvex
  --out "${out}-ablations")
"${ablations[@]}" --which sigma_omega --which vjp --which cv_iters
# The training studies with 15 epochs, to fit a CPU budget.
"${ablations[@]}" --epochs 15 --which config --which n_iter_test
