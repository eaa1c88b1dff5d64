r"""A thin harness around the published reference implementation of Pinet.

The reference is the PyPI package `pinet-hcnn` (import name `pinet`). We use it
only as a baseline to time against, never as a source of code. Install it without
its heavy dependencies (torch, wandb, cvxpylayers), which the layer does not need:

    pip install --no-deps pinet-hcnn==0.2.0 beartype

The harness wraps the reference's projection onto the DC3 polytope
$\{y : A y = x,\ G y \le h\}$, where only the context $x$ changes per instance.
Everything is batched: `Y` has shape `(B, n_var)` and `X` shape `(B, n_eq)`.

From the repository root, `python -m benchmarks._common.reference` times the
reference on the small DC3 problem in float32, and
`python -m benchmarks._common.reference --check` checks the harness against cvxpy
and Clarabel in float64.
"""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np

from pinet_eqx.problems import dc3_violation, make_dc3

from .problems import PAPER_SIGMA
from .timing import time_calls

REFERENCE_MISSING = (
    "The reference implementation `pinet` is not installed. Install it with "
    "`pip install --no-deps pinet-hcnn==0.2.0 beartype`."
)


def reference_available() -> bool:
    """Whether the reference implementation (`pinet-hcnn`) can be imported.

    **Returns:**

    `True` if `import pinet` gives the reference's `Project` class.
    """
    if importlib.util.find_spec("pinet") is None:
        return False
    try:
        import pinet
    except ImportError:
        # For example beartype, which the reference imports but `--no-deps` skips.
        return False
    return hasattr(pinet, "Project") and hasattr(pinet, "ProjectionInstance")


class _ReferenceLayer:
    """The reference's projection as batched, jitted functions.

    Subclasses call `_setup` (which imports the reference, as `self._pinet`) and
    build `self._project` (a reference `Project`). `_instance(Y, P)` maps a batch
    `Y` of shape `(B, n_var)` and the per-instance data `P` (DC3: the contexts `X`;
    else a dict of `(B, ...)` arrays, as our `jax.vmap(lambda y, p: proj(y, **p))`
    takes: `b`, and `E` where the matrix changes too) to the reference's
    `ProjectionInstance`, with the specifications `self._nl` of any non-linear
    constraints.
    """

    _nl = None

    def _setup(self, sigma, omega, dtype):
        try:
            import pinet
        except ImportError as e:
            raise ImportError(REFERENCE_MISSING) from e
        self._pinet = pinet
        self.sigma, self.omega = sigma, omega
        self.dtype = jnp.zeros(()).dtype if dtype is None else dtype

    def _instance(self, Y, P):
        pinet = self._pinet
        P = P if isinstance(P, dict) else {"b": P}
        eq = {"b": jnp.asarray(P["b"], self.dtype)[..., None]}
        if "E" in P:
            eq["a_mat"] = jnp.asarray(P["E"], self.dtype)
        return pinet.ProjectionInstance(
            x=jnp.asarray(Y, self.dtype)[..., None],
            eq=pinet.EqualityConstraintsSpecification(**eq),
            nl=self._nl,
        )

    def _call(self, Y, P, n_iter: int, n_iter_bwd: int, s0=None):
        y_instance, s_next = self._project.call(
            y_raw=self._instance(Y, P),
            s0=s0,
            sigma=self.sigma,
            omega=self.omega,
            n_iter=n_iter,
            n_iter_bwd=n_iter_bwd,
            fpi=False,
        )
        return y_instance.x[..., 0], s_next

    def projection(self, n_iter: int, n_iter_bwd: int = 25):
        """`(Y, P) -> Y_proj`, differentiable and not jitted, for a caller that builds
        its own loss around the layer: `n_iter` forward iterations, `n_iter_bwd` of the
        reference's backward linear solve.
        """
        return lambda Y, P: self._call(Y, P, n_iter, n_iter_bwd)[0]

    def make_forward(self, n_iter: int):
        """A jitted `(Y, P) -> Y_proj` with `n_iter` Douglas-Rachford iterations.

        Call it once to compile before timing it.
        """
        # n_iter_bwd matters only for the backward pass; any value is fine here.
        return jax.jit(self.projection(n_iter, 1))

    def initial_state(self, Y, P):
        """The reference's starting governing sequence for a batch (a pytree), to
        pass to a function from `make_continuation`."""
        return self._project.initialize(self._instance(Y, P))

    def make_continuation(self, n_iter: int):
        """A jitted `(Y, P, S) -> (Y_proj, S_next)` running `n_iter` iterations from
        the state `S` (`initial_state` or an earlier call's): the same iterate as one
        longer run, so a benchmark can follow the violation without recompiling.
        """
        return jax.jit(lambda Y, P, S: self._call(Y, P, n_iter, 1, s0=S))

    def make_vjp(self, n_iter: int, n_iter_bwd: int = 25):
        r"""A jitted `(Y, P, V) -> grad`, $\nabla_Y \sum_{ij} V_{ij}\, \Pi(Y)_{ij}$, by
        the reference's implicit backward (`n_iter` forward iterations, `n_iter_bwd` of
        its backward linear solve).
        """
        projection = self.projection(n_iter, n_iter_bwd)

        def loss(Y, P, V):
            return jnp.sum(V * projection(Y, P))

        return jax.jit(jax.grad(loss))


class ReferenceDC3Projector(_ReferenceLayer):
    r"""The reference's Douglas-Rachford projection onto $\{y : A y = x,\ G y \le h\}$
    (Grontas et al., 2025; we give it $-\infty$ as the lower bound), with its step
    `sigma`, relaxation `omega` and optional Ruiz equilibration; `dtype` defaults to
    JAX's default float.
    """

    def __init__(
        self,
        A,
        G,
        h,
        sigma: float,
        omega: float = 1.7,
        equilibrate: bool = True,
        equilibration_max_iter: int = 25,
        equilibration_tol: float = 1e-3,
        dtype=None,
    ):
        self._setup(sigma, omega, dtype)
        pinet, dtype = self._pinet, self.dtype
        A = jnp.asarray(A, dtype=dtype)
        G = jnp.asarray(G, dtype=dtype)
        h = jnp.asarray(h, dtype=dtype)
        if A.ndim != 2 or G.ndim != 2 or h.shape != (G.shape[0],):
            raise ValueError(
                "`ReferenceDC3Projector(A, G, h, ...)` expects A of shape "
                "(n_eq, n_var), G of shape (n_ineq, n_var) and h of shape "
                f"(n_ineq,), but got {A.shape}, {G.shape} and {h.shape}."
            )
        if G.shape[1] != A.shape[1]:
            raise ValueError(
                f"`ReferenceDC3Projector` got A with {A.shape[1]} columns and G "
                f"with {G.shape[1]}; both must have n_var columns."
            )
        n_eq = A.shape[0]
        # Every vector is (batch, n, 1) and every matrix (batch or 1, m, n) in the
        # reference. The placeholder b is replaced per call (`var_b=True`).
        eq = pinet.EqualityConstraint(
            a_mat=A[None],
            b=jnp.zeros((1, n_eq, 1), dtype),
            method=None,
            var_b=True,
        )
        ineq = pinet.AffineInequalityConstraint(
            c_mat=G[None],
            lb=jnp.full((1, G.shape[0], 1), -jnp.inf, dtype),
            ub=h[None, :, None],
        )
        # The reference's default, max_iter=0, switches equilibration off.
        params = pinet.EquilibrationParams(
            max_iter=equilibration_max_iter if equilibrate else 0,
            tol=equilibration_tol,
        )
        self._project = pinet.Project(
            eq_constraint=eq, ineq_constraint=ineq, equilibration_params=params
        )


class ReferenceSOCProjector(_ReferenceLayer):
    r"""The reference's projection onto the second-order-cone set of App. B.4.

    The set is $\{y = (y_1, y_2) : A y_1 + y_2 = b,\ \|y_{2,:-1}\|_2 \le
    y_{2,-1}\}$ with $A$ of shape `(d2, d1)` fixed and $b$ per instance. It goes
    through the reference's public non-linear path: an `EqualityConstraint` with
    `var_b=True` for $[A\ I] y = b$ and a `NonLinearConstraint` of type `SOCType`
    for $\|S y + 0\|_2 \le e^\top y + 0$, with $S$ selecting $y_{2,:-1}$ and $e$
    the last unit vector. The reference lifts $S y$ and $e^\top y$ into $d_2$
    auxiliary variables and, on this path, never equilibrates.

    `P = {"b": (B, d2)}`.
    """

    def __init__(self, A, sigma: float, omega: float = 1.7, dtype=None):
        self._setup(sigma, omega, dtype)
        pinet, dtype = self._pinet, self.dtype
        A = np.asarray(A, np.float64)
        d2, d1 = A.shape
        d = d1 + d2
        E = np.hstack([A, np.eye(d2)])
        S = np.eye(d)[d1 : d - 1]
        e = np.eye(d)[d - 1 :]
        eq = pinet.EqualityConstraint(
            a_mat=jnp.asarray(E[None], dtype),
            b=jnp.zeros((1, d2, 1), dtype),
            method=None,
            var_b=True,
        )
        spec = pinet.NonLinearSpecification(
            nl_type=pinet.SOCType,
            a_mat=jnp.asarray(S[None], dtype),
            a=jnp.zeros((1, d2 - 1, 1), dtype),
            f=jnp.asarray(e[None], dtype),
            b=jnp.zeros((1, 1, 1), dtype),
        )
        self._project = pinet.Project(
            eq_constraint=eq,
            nl_constraints=[pinet.NonLinearConstraint(spec=spec)],
        )
        self._nl = [spec]


class ReferenceAxProjector(_ReferenceLayer):
    r"""The reference's projection onto $\{y : E y = b,\ \ell \le y \le u\}$
    with both $E$ and $b$ per instance.

    It uses `EqualityConstraint(var_a_mat=True, var_b=True)` and a fixed
    `BoxConstraint`; the per-instance matrices enter through
    `EqualityConstraintsSpecification(a_mat=..., b=...)`. On this path the
    reference computes a batched pseudo-inverse inside every call and does not
    equilibrate.

    `P = {"E": (B, m, d), "b": (B, m)}`.
    """

    def __init__(self, m: int, d: int, lower, upper, sigma, omega=1.7, dtype=None):
        self._setup(sigma, omega, dtype)
        pinet, dtype = self._pinet, self.dtype
        # The matrix given here is only a shape placeholder: with var_a_mat=True
        # the reference takes the matrix of every call from the instance.
        eq = pinet.EqualityConstraint(
            a_mat=jnp.zeros((1, m, d), dtype).at[0, :, :m].set(jnp.eye(m, dtype=dtype)),
            b=jnp.zeros((1, m, 1), dtype),
            method=None,
            var_b=True,
            var_a_mat=True,
        )
        lower = jnp.broadcast_to(jnp.asarray(lower, dtype), (d,))
        upper = jnp.broadcast_to(jnp.asarray(upper, dtype), (d,))
        box = pinet.BoxConstraint(
            pinet.BoxConstraintSpecification(
                lb=lower[None, :, None], ub=upper[None, :, None]
            )
        )
        self._project = pinet.Project(eq_constraint=eq, box_constraint=box)


# (equilibrate, sigma) of the stand-alone check and timing: the paper's two
# configurations, and the plain iteration.
_SETTINGS = ((True, PAPER_SIGMA["small"]), (True, PAPER_SIGMA["large"]), (False, 1.0))


def _cv(problem, Y, X) -> float:
    """The largest violation of the points `Y` for the contexts `X`, in float64."""
    P = problem
    return float(dc3_violation(np.asarray(Y, np.float64), X, P.A, P.G, P.h).max())


def _median_time(fn, *args) -> float:
    return time_calls(lambda: fn(*args), repeats=10, warmup=1)["median"]


def _check(n_instances: int = 8) -> None:
    # Needs `jax_enable_x64`, set by the caller before any array is created.
    import cvxpy as cp

    from .solvers import clarabel

    problem = make_dc3(n_examples=n_instances)
    Y = np.random.RandomState(0).normal(size=(n_instances, problem.n_var))
    expected = []
    for y, x in zip(Y, problem.X):
        z = cp.Variable(problem.n_var)
        constraints = [problem.A @ z == x, problem.G @ z <= problem.h]
        clarabel(cp.Problem(cp.Minimize(cp.sum_squares(z - y)), constraints), 1e-12)
        expected.append(z.value)
    expected = np.stack(expected)
    for equilibrate, sigma in _SETTINGS:
        reference = ReferenceDC3Projector(
            problem.A, problem.G, problem.h, sigma=sigma, equilibrate=equilibrate
        )
        Y_proj = np.asarray(reference.make_forward(2000)(Y, problem.X))
        error = np.abs(Y_proj - expected).max()
        cv = _cv(problem, Y_proj, problem.X)
        print(
            f"float64, equilibrate={equilibrate}, sigma={sigma}, n_iter=2000: "
            f"max |reference - clarabel| = {error:.1e}, cv = {cv:.1e}"
        )


def _time(batch: int = 1024, n_iters=(25, 50, 100, 200)) -> None:
    problem = make_dc3()
    _, _, X = problem.split(n_test=batch)
    Y = np.random.RandomState(0).normal(size=(batch, problem.n_var))
    Yj, Xj = jnp.asarray(Y, jnp.float32), jnp.asarray(X, jnp.float32)
    for equilibrate, sigma in _SETTINGS:
        reference = ReferenceDC3Projector(
            problem.A, problem.G, problem.h, sigma=sigma, equilibrate=equilibrate
        )
        print(f"float32, batch {batch}, equilibrate={equilibrate}, sigma={sigma}:")
        for n_iter in n_iters:
            forward = reference.make_forward(n_iter)
            seconds = _median_time(forward, Yj, Xj)
            cv = _cv(problem, forward(Yj, Xj), X)
            print(f"  n_iter={n_iter:4d}: {1e3 * seconds:8.2f} ms, cv = {cv:.1e}")
    reference = ReferenceDC3Projector(
        problem.A, problem.G, problem.h, sigma=PAPER_SIGMA["small"]
    )
    vjp = reference.make_vjp(n_iter=50, n_iter_bwd=25)
    V = jnp.asarray(np.random.RandomState(1).normal(size=Y.shape), jnp.float32)
    seconds = _median_time(vjp, Yj, Xj, V)
    print(
        f"float32, batch {batch}, paper small config, forward and implicit VJP: "
        f"{1e3 * seconds:.2f} ms"
    )


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="check the harness against cvxpy and Clarabel in float64, then exit",
    )
    args = parser.parse_args()
    if not reference_available():
        raise SystemExit(REFERENCE_MISSING)
    if args.check:
        jax.config.update("jax_enable_x64", True)
        _check()
    else:
        _time()
