r"""How long `pinet_eqx.autotune` takes, what it picks, and what that buys.

For DC3 small and large (the paper's App. H.2 setting: 150 contexts, 150
standard-normal points) and the App. B.4 cone problem (large), run `pe.autotune`
with its defaults (100 values of $\sigma$ from 1e-3 to 5.05 at 100 iterations, then
$n_{iter} \in \{50, \dots, 400\}$), and compare the iterations to reach a
violation and fixed-point residual of 1e-6 (in-jit stopping, largest count over 16
fresh points) at the tuned $\sigma$ and at `sigma="auto"`.

    python -m benchmarks.autotune [--precision f64|f32]

Prints a Markdown table; its current numbers are the record
`benchmarks/records/autotune.json` ("Auto-tuning" in `benchmarks/RESULTS.md`).
"""

from __future__ import annotations

import argparse


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=("f64", "f32"), default="f64")
    args = parser.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", args.precision == "f64")
    import equinox as eqx
    import jax.numpy as jnp
    import numpy as np

    import pinet_eqx as pe
    from pinet_eqx.problems import make_dc3

    from ._common.problems import dc3_projector, soc_batch, soc_projector
    from ._common.provenance import command_line, describe, machine

    dtype = jnp.float64 if args.precision == "f64" else jnp.float32
    rng = np.random.default_rng(0)

    def dc3(n_var, n_eq, n_ineq):
        prob = make_dc3(n_var, n_eq, n_ineq, n_examples=166, seed=17)
        proj = dc3_projector(prob.A, prob.G, prob.h)
        Y = rng.normal(size=(166, n_var))
        return proj, Y, {"b": prob.X}

    def soc():
        # The projection benchmark's large App. B.4 instances.
        A, b = soc_batch(500, 500, 166)
        Y = np.random.RandomState(0).normal(size=(166, 1000))
        return soc_projector(np.hstack([A, np.eye(500)]), 500), Y, {"b": b}

    cases = {
        "DC3 small 100/50/50": lambda: dc3(100, 50, 50),
        "DC3 large 1000/500/500": lambda: dc3(1000, 500, 500),
        "SOC large (App. B.4) 500+500": soc,
    }
    tol = 1e-6 if args.precision == "f64" else 1e-4
    rows = []
    for name, make in cases.items():
        proj, Y, P = make()
        Y = jnp.asarray(Y, dtype)
        P = {k: jnp.asarray(v, dtype) for k, v in P.items()}
        tune = (Y[:150], {k: v[:150] for k, v in P.items()})
        test = (Y[150:], {k: v[150:] for k, v in P.items()})
        result = pe.autotune(proj, *tune, violation_tol=tol)

        def steps(p):
            p = p.with_settings(tol=tol, n_iter=3000)
            sol = eqx.filter_jit(jax.vmap(lambda y, prm: p.solve(y, **prm)))(*test)
            return int(sol.n_iter.max())

        rows.append(
            f"| {name} | {result.sigma:.3g} | {result.n_iter} | "
            f"{result.seconds:.1f} | {steps(result.projector)} | "
            f"{proj.sigma:.3g} ({steps(proj)}) |"
        )
        print(rows[-1], flush=True)
    command = command_line("python -m benchmarks.autotune", argv)
    print(
        f"\nCommand: `{command}`. Machine: {describe(machine())}. Tolerance {tol:g}.\n"
        "\n| problem | tuned σ | tuned n_iter | autotune s | steps to tol, tuned σ "
        "| auto σ (steps to tol) |\n|---|---|---|---|---|---|"
    )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
