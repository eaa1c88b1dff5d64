r"""The cvxpy front end (`pinet_eqx.from_cvxpy`) against cvxpylayers and against
hand-built sets (issue 31), timed on the CPU in float64 (`_measure`). Target A:
ours at most 0.1x cvxpylayers' time at batch 64 on the issue's problem
(`_problems`: 30 variables, a parametrised equality, an $\ell_1$ ball of
parametrised radius, a second-order cone, a box and a partial sum). Target B:
`from_cvxpy` at most 1.2x the hand-built projector's time. Also the accuracy
of three forms of the partial sum, and (`_accuracy`) of five families against
Clarabel, with derivatives against central differences.

Run from the repository root:

    python -m benchmarks.cvxpy                  # full run, results/cvxpy
    python -m benchmarks.cvxpy --quick --out /tmp/cvxpy
"""
