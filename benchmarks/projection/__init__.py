r"""Time our projection layer against the reference (`pinet-hcnn` 0.2.0).

Both project a batch of $y_{raw} \sim N(0, I)$ onto the DC3 polytopes
$\{y : A y = x,\ G y \le h\}$ (the context $x$ is `pe.Parameter("b")` for us) at
the paper's configurations (Ruiz equilibration, $\omega = 1.7$, the tuned $\sigma$
for small, 100/50/50, and large, 1000/500/500): a) the forward pass with 50
iterations; b) the time to a violation tolerance (1e-4 in float32, 1e-6 in
float64), the reference at its smallest sufficient iteration count, ours both so
and with its in-jit stopping rule (`tol=`); c) the forward pass plus the implicit
VJP with 25 backward iterations. Each timing is a whole jitted call, warmed up,
ours and the reference taking turns; the violation (CV) is computed in float64
in the original coordinates.

    python -m benchmarks.projection                     # everything
    python -m benchmarks.projection --quick             # small problem, 3 repeats
    python -m benchmarks.projection --sizes small --precision f32
    python -m benchmarks.projection --family soc        # App. B.4 cone, see _families
    python -m benchmarks.projection --family ax         # per-instance E(x) with a box

Each precision runs in its own process (`jax_enable_x64` is global); the results
are printed and written as the family's record in `benchmarks/projection/records/`.
Modules: `_measure` (what every family measures alike), `_dc3` and `_families`.
"""
