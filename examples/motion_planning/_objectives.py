"""The fleet-level objectives of paper App. B.3: effort, preference and coverage.

Each takes one fleet's trajectories `Y`, `(N, 6T + 4)`, and returns a scalar; they
are JAX functions (differentiable almost everywhere), batched with `jax.vmap`. As
in the paper, effort and preference are sums over vehicles and time steps (not
means), and coverage is a mean over pixels in $[-1, 0]$; so with $\\nu = 1$ the
coverage term is small next to the effort of a fleet (tens), and bends the
trajectories only a little.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from ._problem import Problem, split


def effort(Y, problem: Problem):
    """Input effort $\\sum_{i=1}^N \\sum_{t=0}^{T-1} \\|a_i[t]\\|^2$."""
    _, _, a = split(Y, problem)
    return jnp.sum(a**2)


def ishigami(p):
    """The scaled Ishigami potential $\\psi$ of the paper, at positions `p`,
    `(..., 2)`.

    $\\psi(z / 1.25) = 0.05\\,(\\sin z_1 + 7 \\sin^2 z_2 + 0.1\\,((z_1 + z_2)/2)^4
    \\sin z_1)$, i.e. $\\psi(p)$ is that expression at $z = 1.25\\,p$.
    """
    z1 = 1.25 * p[..., 0]
    z2 = 1.25 * p[..., 1]
    return 0.05 * (
        jnp.sin(z1) + 7.0 * jnp.sin(z2) ** 2 + 0.1 * ((z1 + z2) / 2) ** 4 * jnp.sin(z1)
    )


def preference(Y, problem: Problem):
    """Preference $\\sum_{i=1}^N \\sum_{t=0}^{T} \\psi(p_i[t])$ (`ishigami`)."""
    p, _, _ = split(Y, problem)
    return jnp.sum(ishigami(p))


@dataclasses.dataclass(frozen=True)
class Coverage:
    """Settings of the coverage image (the paper's values as defaults).

    **Arguments:**

    - `pixels`: $H = W$, the image's side.
    - `amplitude`: $A$, the peak of one footprint.
    - `sigma`: $\\sigma_x = \\sigma_y$, in pixels.
    - `rho`: the footprints' correlation $\\rho$.
    - `clip`: the image is $\\min(\\sum G, \\mathrm{clip})$ and the score is
        normalised by `clip`.
    """

    pixels: int = 16
    amplitude: float = 200.0
    sigma: float = 1.0
    rho: float = 0.0
    clip: float = 255.0


def coverage_image(Y, problem: Problem, settings: Coverage = Coverage()):
    """The clipped sum of Gaussian footprints of every position of the fleet.

    Position $p_i[t]$ maps to the continuous pixel coordinates $u = (p_1 +
    p_{max}) / (2 p_{max})\\,W$ (columns, left to right) and $v = H - (p_2 +
    p_{max}) / (2 p_{max})\\,H$ (rows, top to bottom), and puts the footprint
    $G(u', v') = A \\exp(-\\frac{1}{2(1 - \\rho^2)}[\\frac{(u' - u)^2}{\\sigma^2} +
    \\frac{(v' - v)^2}{\\sigma^2} - \\frac{2\\rho (u' - u)(v' - v)}{\\sigma^2}])$ on
    every pixel, evaluated at the pixel's centre $(q + \\tfrac12, r + \\tfrac12)$.
    The paper sums "the $N$ kernels" of the vehicles' trajectories; we sum the
    footprints of all $N (T + 1)$ positions, which is what the sweep over time
    means. The image is $I = \\min(\\sum G, 255)$.

    **Returns:** $I$, `(H, W)`, row 0 at the top of the workspace.
    """
    p, _, _ = split(Y, problem)
    p = p.reshape(-1, 2)
    n = settings.pixels
    span = 2.0 * problem.p_max
    u = (p[:, 0] + problem.p_max) / span * n
    v = n - (p[:, 1] + problem.p_max) / span * n
    centres = jnp.arange(n, dtype=p.dtype) + 0.5
    du = (centres[None, :] - u[:, None]) / settings.sigma  # (points, columns)
    dv = (centres[None, :] - v[:, None]) / settings.sigma  # (points, rows)
    rho = settings.rho
    quad = (
        du[:, None, :] ** 2
        + dv[:, :, None] ** 2
        - 2.0 * rho * du[:, None, :] * dv[:, :, None]
    )
    G = settings.amplitude * jnp.exp(-quad / (2.0 * (1.0 - rho**2)))
    return jnp.minimum(jnp.sum(G, axis=0), settings.clip)


def coverage(Y, problem: Problem, settings: Coverage = Coverage()):
    """Coverage $-\\frac{1}{HW} \\sum_{r,q} I(r, q) / 255$, in $[-1, 0]$ (lower is
    more of the workspace swept), with $I$ from `coverage_image`."""
    return -jnp.mean(coverage_image(Y, problem, settings)) / settings.clip


def fleet_objective(
    problem: Problem, lam: float = 0.0, nu: float = 0.0, settings: Coverage = Coverage()
) -> Callable:
    """$\\varphi = \\mathrm{effort} + \\lambda\\,\\mathrm{preference} +
    \\nu\\,\\mathrm{coverage}$ of one fleet, as a function of `Y`, `(N, 6T + 4)`
    (and of the backbone input `x`, which these terms ignore, as `train` passes
    it).

    Terms with a zero weight are left out of the graph, so the effort-only
    objective is exactly the convex quadratic that the QP baseline solves.
    """

    def phi(Y, x=None):
        value = effort(Y, problem)
        if lam:
            value = value + lam * preference(Y, problem)
        if nu:
            value = value + nu * coverage(Y, problem, settings)
        return value

    return phi
