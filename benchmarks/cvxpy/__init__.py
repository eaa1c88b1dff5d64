r"""The cvxpy front end (`pinet_eqx.from_cvxpy`) against cvxpylayers and against
hand-built sets (issue 31).

Two targets, both timed on the CPU in float64 (`jax_enable_x64`):

- **A, speed** (`_speed`): the issue's problem, 30 variables with a
  parametrised equality, an $\ell_1$ ball of parametrised radius, a
  second-order cone, a box and a partial-sum inequality (`_problems`). The
  projection layer $\min_x \|x - y_{raw}\|^2$ over that set, by
  `pe.from_cvxpy(constraints, x)` at the library's defaults (training mode,
  and inference mode) and by `cvxpylayers.jax.CvxpyLayer` at its defaults
  (diffcp with SCS) and with Clarabel. Timed: forward+backward of a fixed
  random weighting of the batch's outputs, gradients with respect to $y_{raw}$
  and the per-instance parameters $b$ and $r$; and the forward pass alone.
  Target: ours at most 0.1x cvxpylayers' time at batch 64. Sanity: every
  layer's outputs against a Clarabel solve to 1e-10, and the gradients
  against cvxpylayers with Clarabel.
- **B, overhead** (`_overhead`): the DC3 small polytope $\{y : A y = x,\ G y
  \le h\}$ (100 variables, 50 equalities, 50 inequalities) as `from_cvxpy`
  builds it and as the hand-built `pe.Projector([pe.Equality(A,
  pe.Parameter("b")), pe.AffineInequality(G, upper=h)])` of
  `benchmarks/dc3` (its library-defaults form). Target: from_cvxpy's time at
  most 1.2x the hand-built one's, forward and forward+backward, in training
  and inference mode. The same comparison for `native_sets=False` (variable
  bounds and norm epigraphs kept as the rows cvxpy gives, with their
  auxiliary coordinates) against the default on problem A.

`_partial_sums` measures, without timing, how the form of the partial-sum
constraint changes the accuracy: `cp.cumsum` introduces auxiliary variables.

Run from the repository root:

    python -m benchmarks.cvxpy                  # full run, results/cvxpy
    python -m benchmarks.cvxpy --quick --out /tmp/cvxpy

Modules: `_problems` (the problems, their instances and reference solutions),
`_calls` (the timed calls and the first-call timing), `_inspect` (structure,
iterations and comparisons), `_speed`, `_overhead`, `_partial_sums` (the
measurements), `_accuracy` (the accuracy target: five families against
Clarabel and derivatives against central differences, the `accuracy` part)
and `_report` (the Markdown tables).
"""
