r"""Time our projection layer against the reference (`pinet-hcnn` 0.2.0).

Both project a batch of points $y_{raw} \sim N(0, I)$ onto the DC3 polytopes
$\{y : A y = x,\ G y \le h\}$, where the context $x$ changes per instance (for us
it is `pe.Parameter("b")`). Both use the paper's configurations: Ruiz equilibration
with 25 iterations, $\omega = 1.7$, $\sigma = 0.068068$ (small, 100/50/50) or
$\sigma = 0.161069$ (large, 1000/500/500). Three measurements:

- a) the forward pass with 50 iterations, and the violation it reaches;
- b) the time to reach a violation tolerance (1e-4 in float32, 1e-6 in float64):
  the reference with the smallest fixed iteration count that reaches it, ours both
  with its in-jit stopping rule (`tol=`) and with the smallest fixed count;
- c) the forward pass with 50 iterations plus the implicit vector-Jacobian product
  with 25 backward iterations.

Every timing is a whole jitted call on the batch, compiled and run once before
timing, then timed with `block_until_ready`. Ours and the reference alternate
repeat by repeat, so that background load hits both alike. The constraint
violation (CV) is computed here, in float64 NumPy and in the original
coordinates: the largest over instances of
$\max(\|A y - x\|_\infty, \|\max(G y - h, 0)\|_\infty)$.

From the repository root:

    python -m benchmarks.projection                     # everything
    python -m benchmarks.projection --quick             # small problem, 3 repeats
    python -m benchmarks.projection --sizes small --precision f32
    python -m benchmarks.projection --family soc        # App. B.4 cone, see _families
    python -m benchmarks.projection --family ax         # per-instance E(x) with a box

Float32 and float64 run in separate subprocesses, since `jax_enable_x64` is global.
The results are printed and written as the family's record in
`benchmarks/projection/records/`, rendered to `benchmarks/projection/RESULTS.md`.

Modules: `_measure` (what every family measures the same way: the timing, the
search for the iterations to a tolerance, the backward pass, the worker processes
and the record), `_dc3` (the DC3 polytopes) and `_families` (the cone and the
per-instance matrix, with their ground truth).
"""
