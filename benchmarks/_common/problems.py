r"""The problems several suites share, and the paper's settings: DC3 (sizes,
tuned settings, the paper's instance files), the App. B.4 cone
$\{y = (y_1, y_2) : A y_1 + y_2 = b,\ \|y_{2,:-1}\|_2 \le y_{2,-1}\}$, and
random polytopes with an interior point.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from pinet_eqx.problems import DC3Problem

# name: (n_var, n_eq, n_ineq, n_examples, n_valid, n_test)
DC3_SIZES = {
    "tiny": (20, 10, 10, 600, 100, 100),
    "small": (100, 50, 50, 10000, 1024, 1024),
    "large": (1000, 500, 500, 10000, 1024, 1024),
}
DC3_PROBLEMS = ("convex", "nonconvex")
# The paper's configuration of the projection (App. B.2): its tuned sigma per
# size, with Ruiz equilibration; 50 forward and 25 backward iterations.
PAPER_SIGMA = {"small": 0.068068, "large": 0.161069}
PAPER_OMEGA = 1.7
PAPER_N_ITER = 50
PAPER_N_ITER_BWD = 25
PAPER_RUIZ_ITERS = 25


@dataclasses.dataclass(frozen=True, eq=False)
class PaperInstances:
    """The paper's DC3 problem and its validation and test contexts and optima."""

    problem: DC3Problem
    X_valid: np.ndarray
    Y_valid: np.ndarray
    X_test: np.ndarray
    Y_test: np.ndarray


def read_paper_instances(
    path: str | pathlib.Path, problem: str = "nonconvex"
) -> PaperInstances:
    """Read the paper's instances from the folder `path` of DC3-layout files
    `dc3_random_{simple,nonconvex}_dataset_*{valid,test}.npz`."""
    if problem not in DC3_PROBLEMS:
        raise ValueError(f"`problem` must be one of {DC3_PROBLEMS}, got {problem!r}.")
    stem = "simple" if problem == "convex" else "nonconvex"
    folder = pathlib.Path(path)
    files = {}
    for label in ("valid", "test"):
        matches = sorted(folder.glob(f"dc3_random_{stem}_dataset_*{label}.npz"))
        if not matches:
            raise FileNotFoundError(
                f"`--instances {folder}`: no file dc3_random_{stem}_dataset_*"
                f"{label}.npz there. Point it at the folder of the DC3 .npz files."
            )
        files[label] = np.load(matches[0])
    f = files["test"]
    X = np.concatenate([files[k]["X"][..., 0] for k in ("valid", "test")])
    matrices = dict(Q=f["Q"][0], p=f["p"][0, :, 0], A=f["A"][0], G=f["G"][0])
    dc3 = DC3Problem(**matrices, h=f["h"][0, :, 0], X=X, seed=None)
    splits = [files[k][v][..., 0] for k in ("valid", "test") for v in ("X", "Ystar")]
    return PaperInstances(dc3, *splits)


def soc_project(Z):
    """Euclidean projection of each row of `Z` onto $\\{(u, t) : \\|u\\| \\le t\\}$
    (the last entry is $t$)."""
    Z = np.asarray(Z, np.float64)
    u, t = Z[:, :-1], Z[:, -1]
    nu = np.linalg.norm(u, axis=1)
    out = np.zeros_like(Z)
    inside = nu <= t
    out[inside] = Z[inside]
    mid = ~inside & (nu > -t)  # the rest (nu <= -t) goes to the apex, 0
    scale = (t[mid] + nu[mid]) / 2
    out[mid, :-1] = scale[:, None] * u[mid] / nu[mid, None]
    out[mid, -1] = scale
    return out


def soc_instances(A: np.ndarray, z: np.ndarray, y1: np.ndarray):
    r"""App. B.4 instances for `A` from the rows of $z$ and $y_1^\star$: `b`, `c`
    and $y_2^\star = \Pi_{\mathcal{K}}(z)$, with $b = A y_1^\star + y_2^\star$ and
    $c = -A^\top (y_2^\star - z)$, so that $y^\star$ minimises $c^\top y_1$."""
    y2 = soc_project(z)
    return y1 @ A.T + y2, -(y2 - z) @ A, y2


def soc_batch(d1: int, d2: int, n: int, seed: int = 17):
    """The projection benchmarks' App. B.4 data: `A` `(d2, d1)` and `n` right-hand
    sides `b`, one NumPy stream per array (instance `i` does not depend on `n`)."""
    A = np.random.RandomState(seed).uniform(-1, 1, (d2, d1))
    z = np.random.RandomState(seed + 1).uniform(-1, 1, (n, d2))
    y1 = np.random.RandomState(seed + 2).uniform(-1, 1, (n, d1))
    return A, soc_instances(A, z, y1)[0]


def dc3_projector(A, G, h, **settings):
    """Our projector onto the DC3 polytope $\\{y : A y = x,\\ G y \\le h\\}$, with
    the context $x$ the `Parameter` `"b"` (`settings` go to `pe.Projector`)."""
    import pinet_eqx as pe

    constraints = [pe.Equality(A, pe.Parameter("b")), pe.AffineInequality(G, upper=h)]
    return pe.Projector(constraints, **settings)


def soc_projector(E, d1: int, **settings):
    """Our projector onto $\\{y : E y = b,\\ \\|y_{d_1:-1}\\| \\le y_{-1}\\}$, with
    `b` the `Parameter` `"b"` (`settings` go to `pe.Projector`)."""
    import pinet_eqx as pe

    d = E.shape[1]
    S = np.eye(d)[d1 : d - 1]
    e = np.eye(d)[d - 1]
    return pe.Projector(
        [pe.Equality(E, pe.Parameter("b")), pe.SecondOrderCone(S, f=e)], **settings
    )


@dataclasses.dataclass
class Polytope:
    """{y : E y = b, lower <= C y <= upper, lb <= y <= ub}, with an interior point."""

    E: np.ndarray
    b: np.ndarray
    C: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    y_feas: np.ndarray

    @property
    def d(self):
        return self.E.shape[1] if self.E.size else self.C.shape[1]

    def violation(self, Y) -> np.ndarray:
        """The largest constraint violation of each row of `Y`, in float64."""
        C = np.vstack([self.C, np.eye(self.d)])
        lower = np.concatenate([self.lower, self.lb])
        upper = np.concatenate([self.upper, self.ub])
        return linear_violation(Y, self.E, self.b, C, lower, upper)


def linear_violation(Y, E, q, C, lower, upper) -> np.ndarray:
    """Per row $y$ of `Y`, in float64: the largest of $|E y - q|$ and of the
    excess of $C y$ over $[\\ell, u]$ (infinite bounds are never violated),
    at least 0."""
    Y = np.asarray(Y, np.float64)
    out = np.abs(Y @ E.T - q).max(axis=1, initial=0.0)
    W = Y @ C.T
    with np.errstate(invalid="ignore"):
        excess = np.maximum(W - upper, lower - W)
    out = np.maximum(out, np.nan_to_num(excess, nan=0.0).max(axis=1, initial=0.0))
    return np.maximum(out, 0.0)


def random_polytope(rng, d, m_eq, m_ineq, *, box=True, two_sided=True, infs=True):
    """A random polytope with a strictly feasible point (some bounds infinite
    with `infs`)."""
    y0 = rng.uniform(-0.5, 0.5, size=d)
    E = rng.normal(size=(m_eq, d))
    b = E @ y0
    C = rng.normal(size=(m_ineq, d))
    Cy = C @ y0
    upper = Cy + rng.uniform(0.05, 1.0, size=m_ineq)
    lower = np.full(m_ineq, -np.inf)
    if two_sided:
        lower = Cy - rng.uniform(0.05, 1.0, size=m_ineq)
    if box:
        lb = y0 - rng.uniform(0.1, 1.0, size=d)
        ub = y0 + rng.uniform(0.1, 1.0, size=d)
    else:
        lb, ub = np.full(d, -np.inf), np.full(d, np.inf)
    if infs:
        upper[rng.random(m_ineq) < 0.2] = np.inf
        lb[rng.random(d) < 0.3] = -np.inf
        ub[rng.random(d) < 0.3] = np.inf
    return Polytope(E, b, C, lower, upper, lb, ub, y0)


def constraints_of(poly: Polytope, *, parameters=()):
    """Constraint list for a `Polytope`; names in `parameters` become Parameters."""
    import pinet_eqx as pe

    def val(name, v):
        return pe.Parameter(name) if name in parameters else v

    out = []
    if poly.E.shape[0]:
        out.append(pe.Equality(poly.E, val("b", poly.b)))
    if poly.C.shape[0]:
        bounds = dict(lower=val("lower", poly.lower), upper=val("upper", poly.upper))
        out.append(pe.AffineInequality(poly.C, **bounds))
    if np.isfinite(poly.lb).any() or np.isfinite(poly.ub).any():
        out.append(pe.Box(val("lb", poly.lb), val("ub", poly.ub)))
    return out
