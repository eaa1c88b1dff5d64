r"""How many Douglas-Rachford iterations each $\sigma$ needs, and where "auto" lands.

For a handful of polytopes (the paper's DC3 small problem and random ones of other
shapes), project 64 standard-normal points with in-jit stopping at a violation and
fixed-point residual of 1e-6 (float64), for $\sigma$ on a log grid, and report the
largest iteration count over the batch. Next to it: the count at the old fixed
default 0.068 and at `sigma="auto"` ($0.2 / \mathrm{gmean}(d_y^2)$).

    python -m benchmarks.sigma_sweep

Prints a Markdown table; its current numbers are the record
`benchmarks/projection/records/sigma.json` ("Default sigma" on that page).
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pinet_eqx as pe  # noqa: E402
from pinet_eqx.problems import make_dc3  # noqa: E402

CAP = 3000
SIGMAS = np.logspace(-3, 1, 17)


def _random_case(d, m_eq, m_ineq, box, seed):
    rng = np.random.default_rng(seed)
    y0 = rng.uniform(-0.5, 0.5, size=d)
    E = rng.normal(size=(m_eq, d))
    C = rng.normal(size=(m_ineq, d))
    cons = []
    if m_eq:
        cons.append(pe.Equality(E, E @ y0))
    if m_ineq:
        cons.append(pe.AffineInequality(C, upper=C @ y0 + rng.uniform(0.05, 1, m_ineq)))
    if box:
        cons.append(pe.Box(y0 - rng.uniform(0.1, 1, d), y0 + rng.uniform(0.1, 1, d)))
    return cons, {}


def _cases():
    prob = make_dc3(n_examples=64)
    dc3 = [pe.Equality(prob.A, pe.Parameter("b"))]
    dc3.append(pe.AffineInequality(prob.G, upper=prob.h))
    yield "DC3 small 100/50/50", dc3, {"b": jnp.asarray(prob.X)}, 100
    for d, m_eq, m_ineq, box in [
        (10, 3, 5, True),
        (40, 15, 20, True),
        (60, 0, 30, False),
        (100, 50, 0, False),
        (30, 10, 10, False),
    ]:
        cons, params = _random_case(d, m_eq, m_ineq, box, seed=d)
        name = f"random {d}/{m_eq}/{m_ineq}{' + box' if box else ''}"
        yield name, cons, params, d


def _max_steps(proj, Y, params):
    in_axes = (0, 0 if params else None)
    solve = jax.jit(jax.vmap(lambda y, kw: proj.solve(y, **kw), in_axes=in_axes))
    return int(solve(Y, params).n_iter.max())


def main():
    print("| problem | best sigma (steps) | steps at 0.068 | auto sigma (steps) |")
    print("|---|---|---|---|")
    for name, cons, params, d in _cases():
        proj = pe.Projector(cons, n_iter=CAP, tol=1e-6)
        Y = jnp.asarray(np.random.default_rng(1).normal(size=(64, d)))
        steps = [
            _max_steps(proj.with_settings(sigma=float(s)), Y, params) for s in SIGMAS
        ]
        i = int(np.argmin(steps))
        fixed = _max_steps(proj.with_settings(sigma=0.068), Y, params)
        auto = _max_steps(proj, Y, params)
        cap = lambda n: f">{CAP}" if n >= CAP else str(n)  # noqa: E731
        print(
            f"| {name} | {SIGMAS[i]:.4f} ({cap(steps[i])}) | {cap(fixed)} | "
            f"{proj.sigma:.4f} ({cap(auto)}) |"
        )


if __name__ == "__main__":
    main()
