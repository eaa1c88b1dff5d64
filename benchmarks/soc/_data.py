r"""The second-order-cone programs of the paper's App. B.4, with known optima.

$\min c^\top y_1$ s.t. $A y_1 + y_2 = b$, $\|y_{2,:-1}\|_2 \le y_{2,-1}$, generated
as in O'Donoghue et al. (2016, §6.6): $A \sim U[-1, 1]^{d_2 \times d_1}$ fixed, and
per instance $z$, $y_1^\star \sim U[-1, 1]$, $y_2^\star = \Pi_{\mathcal{K}}(z)$,
$b = A y_1^\star + y_2^\star$, $c = -A^\top (y_2^\star - z)$: then
$\lambda = y_2^\star - z$ satisfies the KKT conditions at $y^\star$, so the optima
need no solver. The context is $x = (b, c)$.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._common import metrics
from .._common.problems import soc_instances

# name: (d1, d2)
SIZES = {"small": (25, 25), "large": (500, 500)}
N_VALID = 1024  # validation contexts (learning curves)
N_TEST = 1024  # held-out test contexts (the reported metrics)
METRICS = (*metrics.METRICS, "rs_signed_mean", "rs_signed_min")
METRICS += ("eq_cv_max", "cone_cv_max")


def generate(A: np.ndarray, rng: np.random.Generator, n: int):
    """`n` instances for `A` drawn with `rng`: contexts `X = (b, c)`, optimal
    values `J` and solutions `Y = (y1, y2)`, float64."""
    d2, d1 = A.shape
    z = rng.uniform(-1.0, 1.0, (n, d2))
    y1 = rng.uniform(-1.0, 1.0, (n, d1))
    b, c, y2 = soc_instances(A, z, y1)
    return np.hstack([b, c]), np.sum(c * y1, axis=1), np.hstack([y1, y2])


@dataclasses.dataclass(frozen=True, eq=False)
class SocData:
    """One App. B.4 data set (`name`, e.g. `"soc-small"`); no fixed training set:
    each epoch draws a fresh batch with `sample_train`, as in the paper."""

    name: str
    A: np.ndarray
    X_valid: np.ndarray
    J_valid: np.ndarray
    X_test: np.ndarray
    J_test: np.ndarray
    Y_test: np.ndarray
    source: dict
    X_train = None

    @property
    def d1(self) -> int:
        return self.A.shape[1]

    @property
    def d2(self) -> int:
        return self.A.shape[0]

    @property
    def E(self) -> np.ndarray:
        """The equality matrix $[A\\ I]$ of $E y = b$."""
        return np.hstack([self.A, np.eye(self.d2)])

    @property
    def sizes(self) -> dict:
        d1, d2 = self.d1, self.d2
        return {"d1": d1, "d2": d2, "n_var": d1 + d2, "n_eq": d2, "n_context": d1 + d2}

    def sample_train(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` fresh training contexts drawn with `rng`."""
        return generate(self.A, rng, n)[0]

    def split(self, X):
        """The parts `(b, c)` of contexts `X`."""
        X = np.asarray(X, np.float64)
        return X[..., : self.d2], X[..., self.d2 :]

    def objective(self, Y, X) -> np.ndarray:
        """$c^\\top y_1$ for each row, float64."""
        _, c = self.split(X)
        return np.sum(c * np.asarray(Y, np.float64)[:, : self.d1], axis=1)

    def signed_rs(self, Y, J_star, X) -> np.ndarray:
        """$(c^\\top \\hat y_1 - J^\\star) / |J^\\star|$ for each row, float64."""
        return (self.objective(Y, X) - J_star) / np.abs(J_star)

    def relative_suboptimality(self, Y, J_star, X) -> np.ndarray:
        """RS of each row, clipped at 0 (`signed_rs` keeps the sign)."""
        return np.maximum(0.0, self.signed_rs(Y, J_star, X))

    def violations(self, Y, X) -> tuple[np.ndarray, np.ndarray]:
        """The equality and cone violations of each row:
        $\\|A y_1 + y_2 - b\\|_\\infty$ and $(\\|y_{2,:-1}\\| - y_{2,-1})_+$."""
        Y = np.asarray(Y, np.float64)
        b, _ = self.split(X)
        y1, y2 = Y[:, : self.d1], Y[:, self.d1 :]
        eq = np.abs(y1 @ self.A.T + y2 - b).max(axis=1)
        cone = np.maximum(np.linalg.norm(y2[:, :-1], axis=1) - y2[:, -1], 0.0)
        return eq, cone

    def violation(self, Y, X) -> np.ndarray:
        """CV of each row: the larger of the two `violations`."""
        return np.maximum(*self.violations(Y, X))

    def test_metrics(self, Y) -> metrics.Metrics:
        """The float64 test metrics of `Y` for the first `len(Y)` test contexts."""
        Y = np.asarray(Y, np.float64)
        n = len(Y)
        X, J = self.X_test[:n], self.J_test[:n]
        signed = self.signed_rs(Y, J, X)
        eq, cone = self.violations(Y, X)
        return metrics.Metrics(
            np.maximum(0.0, signed),
            np.maximum(eq, cone),
            {"eq": eq, "cone": cone},
            signed_rs=signed,
        )


def load(size: str = "small", *, seed: int = 0) -> SocData:
    """The `size` data set for `seed`: `A`, validation and test instances from
    streams (`default_rng([seed, k])`) that the training batches never reproduce."""
    if size not in SIZES:
        raise ValueError(f"`size` must be one of {tuple(SIZES)}, got {size!r}.")
    d1, d2 = SIZES[size]
    A = np.random.default_rng([seed, 0]).uniform(-1.0, 1.0, (d2, d1))
    X_valid, J_valid, _ = generate(A, np.random.default_rng([seed, 1]), N_VALID)
    X_test, J_test, Y_test = generate(A, np.random.default_rng([seed, 2]), N_TEST)
    source = {"generator": "O'Donoghue et al. 2016, sec. 6.6 (paper App. B.4)"}
    source.update(size=size, seed=seed, n_valid=N_VALID, n_test=N_TEST)
    source["train"] = "a fresh batch every epoch, from the run's seed"
    valid, test = (X_valid, J_valid), (X_test, J_test, Y_test)
    return SocData(f"soc-{size}", A, *valid, *test, source)
