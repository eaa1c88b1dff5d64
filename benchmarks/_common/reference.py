r"""A thin harness around the published reference implementation of Pinet.

The reference is the PyPI package `pinet-hcnn` (import name `pinet`). We use it
only as a baseline to time against, never as a source of code. Install it without
its heavy dependencies (torch, wandb, cvxpylayers), which the layer does not need:

    pip install --no-deps pinet-hcnn==0.2.0 beartype

The harness wraps the reference's projections (the DC3 polytope, the App. B.4
cone, a per-instance $E(x)$ with a box) as batched functions of `(Y, P)`.
"""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np

REFERENCE_MISSING = (
    "The reference implementation `pinet` is not installed. Install it with "
    "`pip install --no-deps pinet-hcnn==0.2.0 beartype`."
)


def reference_available() -> bool:
    """Whether `import pinet` gives the reference (`pinet-hcnn`)."""
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

    Subclasses call `_setup` and build `self._project` (a reference `Project`).
    `P` is the per-instance data: the contexts `X` (DC3), or a dict of `(B, ...)`
    arrays `b` and, where the matrix changes too, `E`."""

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
        steps = dict(sigma=self.sigma, omega=self.omega, n_iter=n_iter, fpi=False)
        y_raw, steps["n_iter_bwd"] = self._instance(Y, P), n_iter_bwd
        out, s_next = self._project.call(y_raw=y_raw, s0=s0, **steps)
        return out.x[..., 0], s_next

    def projection(self, n_iter: int, n_iter_bwd: int = 25):
        """`(Y, P) -> Y_proj`, differentiable, not jitted: `n_iter` forward
        iterations, `n_iter_bwd` of the reference's backward linear solve."""
        return lambda Y, P: self._call(Y, P, n_iter, n_iter_bwd)[0]

    def make_forward(self, n_iter: int):
        """A jitted `(Y, P) -> Y_proj` with `n_iter` Douglas-Rachford iterations."""
        # n_iter_bwd matters only for the backward pass; any value is fine here.
        return jax.jit(self.projection(n_iter, 1))

    def initial_state(self, Y, P):
        """The reference's starting state for a batch, for `make_continuation`."""
        return self._project.initialize(self._instance(Y, P))

    def make_continuation(self, n_iter: int):
        """A jitted `(Y, P, S) -> (Y_proj, S_next)`: `n_iter` more iterations from
        the state `S` (`initial_state` or an earlier call's)."""
        return jax.jit(lambda Y, P, S: self._call(Y, P, n_iter, 1, s0=S))

    def make_vjp(self, n_iter: int, n_iter_bwd: int = 25):
        r"""A jitted `(Y, P, V) -> grad`, $\nabla_Y \sum_{ij} V_{ij}\, \Pi(Y)_{ij}$, by
        the reference's implicit backward (as for `projection`)."""
        projection = self.projection(n_iter, n_iter_bwd)

        def loss(Y, P, V):
            return jnp.sum(V * projection(Y, P))

        return jax.jit(jax.grad(loss))


class ReferenceDC3Projector(_ReferenceLayer):
    r"""The reference's Douglas-Rachford projection onto $\{y : A y = x,\ G y \le h\}$
    (Grontas et al., 2025; we give it $-\infty$ as the lower bound), with its step
    `sigma`, relaxation `omega` and optional Ruiz equilibration; `dtype` defaults to
    JAX's default float."""

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
        A, G, h = (jnp.asarray(a, dtype=dtype) for a in (A, G, h))
        if h.ndim != 1 or A.ndim != 2 or G.shape != (len(h), A.shape[1]):
            raise ValueError(
                "`ReferenceDC3Projector(A, G, h, ...)` expects A of shape "
                "(n_eq, n_var), G of shape (n_ineq, n_var) and h of shape "
                f"(n_ineq,), but got {A.shape}, {G.shape} and {h.shape}."
            )
        # Every vector is (batch, n, 1) and every matrix (batch or 1, m, n) in the
        # reference. The placeholder b is replaced per call (`var_b=True`).
        b = jnp.zeros((1, A.shape[0], 1), dtype)
        eq = pinet.EqualityConstraint(a_mat=A[None], b=b, method=None, var_b=True)
        ineq = pinet.AffineInequalityConstraint(
            c_mat=G[None],
            lb=jnp.full((1, G.shape[0], 1), -jnp.inf, dtype),
            ub=h[None, :, None],
        )
        # The reference's default, max_iter=0, switches equilibration off.
        max_iter = equilibration_max_iter if equilibrate else 0
        params = pinet.EquilibrationParams(max_iter=max_iter, tol=equilibration_tol)
        self._project = pinet.Project(
            eq_constraint=eq, ineq_constraint=ineq, equilibration_params=params
        )


class ReferenceSOCProjector(_ReferenceLayer):
    r"""The reference's projection onto the App. B.4 set
    $\{y = (y_1, y_2) : A y_1 + y_2 = b,\ \|y_{2,:-1}\|_2 \le y_{2,-1}\}$, $A$
    `(d2, d1)` fixed, `P = {"b": (B, d2)}`: its non-linear `SOCType` path
    ($\|S y\|_2 \le e^\top y$, $S$ selecting $y_{2,:-1}$), which never equilibrates."""

    def __init__(self, A, sigma: float, omega: float = 1.7, dtype=None):
        self._setup(sigma, omega, dtype)
        pinet, dtype = self._pinet, self.dtype
        A = np.asarray(A, np.float64)
        d2, d1 = A.shape
        d = d1 + d2
        E = np.hstack([A, np.eye(d2)])
        S = np.eye(d)[d1 : d - 1]
        e = np.eye(d)[d - 1 :]
        b = jnp.zeros((1, d2, 1), dtype)
        E = jnp.asarray(E[None], dtype)
        eq = pinet.EqualityConstraint(a_mat=E, b=b, method=None, var_b=True)
        spec = pinet.NonLinearSpecification(
            nl_type=pinet.SOCType,
            a_mat=jnp.asarray(S[None], dtype),
            a=jnp.zeros((1, d2 - 1, 1), dtype),
            f=jnp.asarray(e[None], dtype),
            b=jnp.zeros((1, 1, 1), dtype),
        )
        nl = [pinet.NonLinearConstraint(spec=spec)]
        self._project = pinet.Project(eq_constraint=eq, nl_constraints=nl)
        self._nl = [spec]


class ReferenceAxProjector(_ReferenceLayer):
    r"""The reference's projection onto $\{y : E y = b,\ \ell \le y \le u\}$,
    `P = {"E": (B, m, d), "b": (B, m)}`: its `var_a_mat=True` path, a batched
    pseudo-inverse in every call and no equilibration."""

    def __init__(self, m: int, d: int, lower, upper, sigma, omega=1.7, dtype=None):
        self._setup(sigma, omega, dtype)
        pinet, dtype = self._pinet, self.dtype
        # The matrix given here is only a shape placeholder: with var_a_mat=True
        # the reference takes the matrix of every call from the instance.
        E = jnp.zeros((1, m, d), dtype).at[0, :, :m].set(jnp.eye(m, dtype=dtype))
        b = jnp.zeros((1, m, 1), dtype)
        eq = pinet.EqualityConstraint(
            a_mat=E, b=b, method=None, var_b=True, var_a_mat=True
        )
        lb, ub = (jnp.broadcast_to(jnp.asarray(a, dtype), (d,)) for a in (lower, upper))
        box = pinet.BoxConstraintSpecification(
            lb=lb[None, :, None], ub=ub[None, :, None]
        )
        box = pinet.BoxConstraint(box)
        self._project = pinet.Project(eq_constraint=eq, box_constraint=box)
