"""The DC3 benchmark problems (Donti, Rolnick and Kolter, 2021, §5.1).

Only NumPy is imported at module level, so that generating data costs nothing more
than NumPy. JAX and the optional solver OSQP are imported inside the functions
that need them.
"""

import dataclasses
from typing import Literal

import numpy as np

_OSQP_MISSING = (
    "`pinet_eqx.problems.solve_dc3_convex(..., solver='osqp')` needs the optional "
    'dependency `osqp`. Install it with `pip install "pinet_eqx[examples]"`.'
)


def _check_shape(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    if array.shape != shape:
        raise ValueError(
            f"`DC3Problem` got `{name}` with shape {array.shape}, but expected shape "
            f"{shape} from the other fields. Build it with `make_dc3` or pass arrays "
            "of consistent shapes."
        )


def _frozen_float64(array) -> np.ndarray:
    # The dataclass is frozen, but a frozen field can still be written in place.
    # Read-only copies make a generated problem truly immutable, so that a problem
    # reused across experiments cannot be silently changed by one of them.
    out = np.array(array, dtype=np.float64, copy=True)
    out.flags.writeable = False
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class DC3Problem:
    r"""One DC3 problem: fixed data $Q, p, A, G, h$ and a set of contexts $X$.

    Each context $x$ (a row of `X`) defines the instance
    $\min_y \tfrac12 y^\top Q y + p^\top y$ (or $p^\top \sin y$ for the
    non-convex variant) subject to $A y = x$ and $G y \le h$. All arrays are
    read-only `float64` NumPy arrays.

    **Fields:**

    - `Q`: the diagonal, positive semidefinite cost matrix, shape `(n_var, n_var)`.
    - `p`: the linear cost, shape `(n_var,)`.
    - `A`: the equality matrix, shape `(n_eq, n_var)`.
    - `G`: the inequality matrix, shape `(n_ineq, n_var)`.
    - `h`: the inequality bound, shape `(n_ineq,)`.
    - `X`: the contexts (right-hand sides of $A y = x$), shape `(n_examples, n_eq)`.
    - `seed`: the seed that generated the problem, or `None` if it was built by hand.
    """

    Q: np.ndarray
    p: np.ndarray
    A: np.ndarray
    G: np.ndarray
    h: np.ndarray
    X: np.ndarray
    seed: int | None = None

    def __post_init__(self):
        for name in ("Q", "p", "A", "G", "h", "X"):
            object.__setattr__(self, name, _frozen_float64(getattr(self, name)))
        if self.A.ndim != 2:
            raise ValueError(
                f"`DC3Problem` got `A` with shape {self.A.shape}, but expected a "
                "matrix of shape (n_eq, n_var)."
            )
        n_eq, n_var = self.A.shape
        n_ineq = self.G.shape[0] if self.G.ndim == 2 else -1
        _check_shape("Q", self.Q, (n_var, n_var))
        _check_shape("p", self.p, (n_var,))
        _check_shape("G", self.G, (n_ineq, n_var))
        _check_shape("h", self.h, (n_ineq,))
        _check_shape("X", self.X, (self.X.shape[0], n_eq))

    @property
    def n_var(self) -> int:
        """The number of decision variables $d$."""
        return self.A.shape[1]

    @property
    def n_eq(self) -> int:
        """The number of equality constraints."""
        return self.A.shape[0]

    @property
    def n_ineq(self) -> int:
        """The number of inequality constraints."""
        return self.G.shape[0]

    @property
    def n_examples(self) -> int:
        """The number of contexts, that is, of rows of `X`."""
        return self.X.shape[0]

    def split(
        self, n_train: int | None = None, n_valid: int = 1024, n_test: int = 1024
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Split the contexts into training, validation and test sets.

        The test set is the last `n_test` rows of `X`, the validation set the
        `n_valid` rows before it, and the training set the first `n_train` rows.
        With the defaults and 10000 contexts this gives rows `[0, 7952)`,
        `[7952, 8976)` and `[8976, 10000)`: the validation and test sets are then
        exactly those of the published DC3 and Pinet data files (see `make_dc3`).

        **Arguments:**

        - `n_train`: the number of training contexts. Defaults to every row not
            used for validation or testing.
        - `n_valid`: the number of validation contexts.
        - `n_test`: the number of test contexts.

        **Returns:**

        A tuple `(X_train, X_valid, X_test)` of read-only views into `X`.
        """
        n_held_out = n_valid + n_test
        if n_train is None:
            n_train = self.n_examples - n_held_out
        if min(n_train, n_valid, n_test) < 0 or n_train + n_held_out > self.n_examples:
            raise ValueError(
                f"`DC3Problem.split(n_train={n_train}, n_valid={n_valid}, "
                f"n_test={n_test})` needs non-negative sizes whose sum is at most "
                f"the number of contexts, {self.n_examples}. Pass smaller sizes or "
                "generate more contexts with `make_dc3(n_examples=...)`."
            )
        stop_valid = self.n_examples - n_test
        start_valid = stop_valid - n_valid
        return (
            self.X[:n_train],
            self.X[start_valid:stop_valid],
            self.X[stop_valid:],
        )


def make_dc3(
    n_var: int = 100,
    n_eq: int = 50,
    n_ineq: int = 50,
    n_examples: int = 10000,
    seed: int = 17,
) -> DC3Problem:
    r"""Generate a DC3 problem with the recipe of Donti et al. (2021, §5.1).

    The data are $Q = \mathrm{diag}(q)$ with $q \sim U[0, 1)^d$, $p \sim U[0, 1)^d$,
    $A \sim N(0, 1)^{n_{eq} \times d}$, contexts $x \sim U[-1, 1]^{n_{eq}}$,
    $G \sim N(0, 1)^{n_{ineq} \times d}$ and $h_i = \sum_j |(G A^+)_{ij}|$.
    Since every $|x_j| \le 1$, the last choice makes $y = A^+ x$ feasible for every
    context, with $G A^+ x \le h$ strictly unless $x$ lies on a vertex of the cube.

    Draws come from the legacy `np.random.RandomState(seed)`, in the order
    $q, p, A, X, G$. With the defaults this reproduces the published DC3 data
    (`dc3_random_simple_dataset_var100_ineq50_eq50_ex10000`, also used by Pinet):
    $Q$, $p$, $A$ and all 10000 contexts match bit for bit, $G$ to one unit in the
    last place (2 of its 5000 entries differ by at most 1.1e-16, presumably from
    the platform's `log` in the legacy Gaussian sampler), and $h$ to 1e-14 (the
    pseudo-inverse's rounding). Drawing $G$ before $X$ gives different data. The
    published validation and test sets are rows `[7952, 8976)` and
    `[8976, 10000)` of $X$, as returned by `DC3Problem.split()`. Since $X$ is drawn
    before $G$, the matrix $G$ (and so $h$) depends on `n_examples`: keep the
    default 10000 to get the published problem, and take subsets with `split`.

    **Arguments:**

    - `n_var`: the number of decision variables $d$.
    - `n_eq`: the number of equality constraints; must not exceed `n_var`.
    - `n_ineq`: the number of inequality constraints.
    - `n_examples`: the number of contexts.
    - `seed`: the seed of the random number generator. DC3 used 17.

    **Returns:**

    A `DC3Problem`.
    """
    if not 0 < n_eq <= n_var or n_ineq < 0 or n_examples < 0:
        raise ValueError(
            f"`make_dc3(n_var={n_var}, n_eq={n_eq}, n_ineq={n_ineq}, "
            f"n_examples={n_examples})` needs 0 < n_eq <= n_var and non-negative "
            "n_ineq and n_examples, so that A (n_eq, n_var) has full row rank almost "
            "surely."
        )
    # The legacy generator, not `np.random.default_rng`, because only it reproduces
    # the published instances; its streams are also frozen across NumPy versions.
    rng = np.random.RandomState(seed)
    q = rng.random_sample(n_var)
    p = rng.random_sample(n_var)
    A = rng.normal(loc=0.0, scale=1.0, size=(n_eq, n_var))
    X = rng.uniform(-1.0, 1.0, size=(n_examples, n_eq))
    G = rng.normal(loc=0.0, scale=1.0, size=(n_ineq, n_var))
    h = np.sum(np.abs(G @ np.linalg.pinv(A)), axis=1)
    return DC3Problem(Q=np.diag(q), p=p, A=A, G=G, h=h, X=X, seed=seed)


def dc3_objective(y, Q, p, nonconvex: bool = False):
    r"""The DC3 objective for one instance.

    This is $\tfrac12 y^\top Q y + p^\top y$ for the convex problem and
    $\tfrac12 y^\top Q y + p^\top \sin(y)$ for the non-convex one. The factor
    $\tfrac12$ is the one in DC3's code, and the one its published optimal
    solutions use (checked in `benchmarks/RESULTS.md`).

    Use `jax.vmap` over `y` for a batch.

    **Arguments:**

    - `y`: the decision variable, shape `(n_var,)`.
    - `Q`: the cost matrix, shape `(n_var, n_var)`.
    - `p`: the linear cost, shape `(n_var,)`.
    - `nonconvex`: whether to use the non-convex objective.

    **Returns:**

    The objective value, a JAX scalar.
    """
    import jax.numpy as jnp

    y = jnp.asarray(y)
    linear_term = jnp.sin(y) if nonconvex else y
    return 0.5 * jnp.dot(y, jnp.dot(Q, y)) + jnp.dot(p, linear_term)


def dc3_violation(Y, X, A, G, h) -> np.ndarray:
    r"""The constraint violation of each instance, in NumPy.

    For each row $y$ of `Y` and $x$ of `X` this is
    $\max(\|A y - x\|_\infty, \|\max(G y - h, 0)\|_\infty)$.

    **Arguments:**

    - `Y`: the points, shape `(n, n_var)`.
    - `X`: the contexts, shape `(n, n_eq)`.
    - `A`: the equality matrix, shape `(n_eq, n_var)`.
    - `G`: the inequality matrix, shape `(n_ineq, n_var)`.
    - `h`: the inequality bound, shape `(n_ineq,)`.

    **Returns:**

    The violations, a NumPy array of shape `(n,)`.
    """
    Y, X, A, G, h = (np.asarray(a) for a in (Y, X, A, G, h))
    eq = np.abs(Y @ A.T - X).max(axis=1, initial=0.0)
    ineq = np.maximum(Y @ G.T - h, 0.0).max(axis=1, initial=0.0)
    return np.maximum(eq, ineq)


def solve_dc3_convex(
    problem: DC3Problem,
    X=None,
    *,
    solver: Literal["osqp"] = "osqp",
    eps: float = 1e-9,
) -> np.ndarray:
    r"""Solve the convex DC3 problem for each context, to high accuracy.

    For each context $x$ this solves the quadratic programme
    $\min_y \tfrac12 y^\top Q y + p^\top y$ subject to $A y = x$, $G y \le h$.

    OSQP is set up once, in parametric mode: only the bounds change between
    contexts, so its factorisation is reused, and each solve is warm-started from
    the last and finished by solution polishing. On the default 100/50/50 problem
    the result matches the published DC3 solutions to 1e-14, and 1024 contexts take
    about 6 s on one CPU core.

    **Arguments:**

    - `problem`: the `DC3Problem`.
    - `X`: the contexts, shape `(n, n_eq)`. Defaults to `problem.X`.
    - `solver`: the solver; only `"osqp"`, an optional dependency, is supported.
    - `eps`: OSQP's absolute and relative tolerances, before polishing.

    **Returns:**

    The optimal points, a NumPy `float64` array of shape `(n, n_var)`.

    **Raises:**

    `ImportError` if OSQP is not installed, and `RuntimeError` if it does not solve
    some context.
    """
    X = _contexts(problem, X, solver)
    try:
        # An optional extra: pyright checks the package without it.
        import osqp  # pyright: ignore[reportMissingImports]
    except ImportError as e:
        raise ImportError(_OSQP_MISSING) from e
    import scipy.sparse as sp

    n_eq = problem.n_eq
    P = sp.csc_matrix(np.triu(problem.Q))
    C = sp.csc_matrix(np.concatenate([problem.A, problem.G], axis=0))
    lower = np.concatenate([np.zeros(n_eq), np.full(problem.n_ineq, -np.inf)])
    upper = np.concatenate([np.zeros(n_eq), problem.h])
    qp = osqp.OSQP()
    qp.setup(
        P,
        problem.p,
        C,
        lower,
        upper,
        eps_abs=eps,
        eps_rel=eps,
        max_iter=1_000_000,
        polishing=True,
        warm_starting=True,
        verbose=False,
    )
    Y = np.empty((X.shape[0], problem.n_var))
    for i, x in enumerate(X):
        lower[:n_eq] = x
        upper[:n_eq] = x
        qp.update(l=lower, u=upper)
        # The status is checked below, to name the failing context in the error.
        result = qp.solve(raise_error=False)
        if result.info.status != "solved":
            raise RuntimeError(
                f"OSQP stopped with status '{result.info.status}' on context {i} "
                f"(row {i} of `X`) in `solve_dc3_convex`. Try a larger `eps`."
            )
        Y[i] = result.x
    return Y


def _contexts(problem: DC3Problem, X, solver: str) -> np.ndarray:
    """`solve_dc3_convex`'s `X` and `solver` checked: the contexts, one a row."""
    if solver != "osqp":
        raise ValueError(
            f"`solve_dc3_convex` got `solver={solver!r}`, but only 'osqp' is supported."
        )
    X = problem.X if X is None else np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != problem.n_eq:
        raise ValueError(
            f"`solve_dc3_convex` got `X` with shape {X.shape}, but expected shape "
            f"(n, {problem.n_eq}): one context per row. For a single context `x`, "
            "pass `x[None]`."
        )
    return X
