r"""DC-OPF problem data (`GridCase`) and its `.npz` format; numpy and scipy only
(no pandapower, so the saved fixtures `tests/data/dcopf_*.npz` load without it).

The variables are $y = (p_g, \theta)$, per unit (MW / `base_mva`, radians), and
the feasible set for the bus loads $p_d$ is $E y = q(p_d)$, $\ell_f \le C y \le
u_f$, $p_{\min} \le p_g \le p_{\max}$: the rows of $E$ are the bus balances
$A_g p_g - B_{bus} \theta$ and $\theta_{ref} = 0$, those of $C$ the branch flows
$B_f \theta$. The DC model's constant injections (shunts, phase shifters) enter
through `p_fixed` in $q$ and `f_shift` in the flow limits (`NOTES_data.md`).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import scipy.sparse as sp

_MATRICES = ("E", "C")
_SCALARS = {"base_mva": float, "n_gen": int, "n_bus": int, "ref_bus": int}
# The array fields by their length: one entry per generator, bus or branch.
_PER = {
    "gen": ("p_min", "p_max", "cost_quad", "cost_lin", "gen_bus"),
    "bus": ("p_d", "p_fixed"),
    "branch": ("f_max", "f_shift", "branch_from", "branch_to"),
}
_ARRAYS = tuple(field for fields in _PER.values() for field in fields)


@dataclasses.dataclass(frozen=True, eq=False)
class GridCase:
    r"""One DC-OPF grid, per unit throughout: `name` (e.g. `"case118"`),
    `base_mva`, `n_gen`, `n_bus`, the reference bus `ref_bus`, `E` (CSR, `(n_bus
    + 1, dim)`) and `C` (CSR, `(n_branch, dim)`); per branch `f_max`, `f_shift`
    (the flow of branch $k$ is $(C y)_k$ + `f_shift[k]`), `branch_from`,
    `branch_to`; per generator `p_min`, `p_max`, `cost_quad`, `cost_lin` (the
    cost $\sum_g c_{2,g} p_g^2 + c_{1,g} p_g$ in per-unit $p_g$) and `gen_bus`;
    per bus the base loads `p_d` and the constant withdrawals `p_fixed`.
    """

    name: str
    base_mva: float
    n_gen: int
    n_bus: int
    ref_bus: int
    E: sp.csr_matrix
    C: sp.csr_matrix
    f_max: np.ndarray
    f_shift: np.ndarray
    p_min: np.ndarray
    p_max: np.ndarray
    p_d: np.ndarray
    p_fixed: np.ndarray
    cost_quad: np.ndarray
    cost_lin: np.ndarray
    gen_bus: np.ndarray
    branch_from: np.ndarray
    branch_to: np.ndarray

    def __post_init__(self) -> None:
        """`ValueError` naming the first field whose shape does not fit."""
        n_branch = self.C.shape[0]
        size = {"gen": self.n_gen, "bus": self.n_bus, "branch": n_branch}
        expected = {"E": (self.n_bus + 1, self.dim), "C": (n_branch, self.dim)}
        expected |= {f: (size[k],) for k, fields in _PER.items() for f in fields}
        for field, shape in expected.items():
            got = getattr(self, field).shape
            if got != shape:
                raise ValueError(
                    f"GridCase '{self.name}': `{field}` has shape {got}, but "
                    f"expected {shape} (n_gen={self.n_gen}, n_bus={self.n_bus}, "
                    f"n_branch={n_branch})."
                )

    @property
    def dim(self) -> int:
        return self.n_gen + self.n_bus

    @property
    def n_branch(self) -> int:
        return self.C.shape[0]

    @property
    def lower(self) -> np.ndarray:
        """Bounds on `y`: `p_min`, then `-inf` per angle (`upper`: `p_max`, `+inf`)."""
        return np.concatenate([self.p_min, np.full(self.n_bus, -np.inf)])

    @property
    def upper(self) -> np.ndarray:
        return np.concatenate([self.p_max, np.full(self.n_bus, np.inf)])

    @property
    def flow_lower(self) -> np.ndarray:
        """The lower limits on `C y` (`flow_upper`: `f_max - f_shift`)."""
        return -self.f_max - self.f_shift

    @property
    def flow_upper(self) -> np.ndarray:
        return self.f_max - self.f_shift

    def q(self, p_d: np.ndarray) -> np.ndarray:
        """`q` of `E y = q` for the loads `p_d` (`(..., n_bus)`): `p_d + p_fixed`,
        then 0 for the reference-angle row."""
        p_d = np.asarray(p_d, dtype=np.float64)
        if p_d.shape[-1:] != (self.n_bus,):
            raise ValueError(
                f"GridCase '{self.name}'.q got loads of shape {p_d.shape}, but "
                f"expected (..., {self.n_bus}): one load per bus."
            )
        zero = np.zeros((*p_d.shape[:-1], 1))
        return np.concatenate([p_d + self.p_fixed, zero], axis=-1)

    def cost(self, p_g: np.ndarray) -> np.ndarray:
        """The generation cost of the outputs `p_g` (`(..., n_gen)`), per row."""
        return np.sum(self.cost_quad * p_g**2 + self.cost_lin * p_g, axis=-1)

    def residuals(self, y: np.ndarray, p_d: np.ndarray) -> tuple[float, float]:
        """`(eq, ineq)`: the largest `|E y - q(p_d)|` and the largest violation of
        the flow limits and generator bounds (0 when they hold), per unit."""
        y = np.asarray(y, dtype=np.float64)
        eq = float(np.max(np.abs(self.E @ y - self.q(p_d))))
        flow, p_g = self.C @ y, y[: self.n_gen]
        excess = (flow - self.flow_upper, self.flow_lower - flow)
        excess += (p_g - self.p_max, self.p_min - p_g)
        return eq, max(float(np.max(v, initial=0.0)) for v in excess)


def dc_case(gen_bus: np.ndarray, ref_bus: int, B_bus, B_f, **fields) -> GridCase:
    """The `GridCase` of MATPOWER's DC model: `E` from the generators' buses
    `gen_bus`, $B_{bus}$ and the reference row, `C` from $B_f$ (in the $\\theta$
    columns); `fields`: the others."""
    n_bus, n_gen = B_bus.shape[0], len(gen_bus)
    A_g = sp.csr_matrix((np.ones(n_gen), (gen_bus, np.arange(n_gen))), (n_bus, n_gen))
    ref_row = sp.csr_matrix(([1.0], ([0], [n_gen + ref_bus])), (1, n_gen + n_bus))
    E = sp.vstack([sp.hstack([A_g, -B_bus]), ref_row], format="csr")
    C = sp.hstack([sp.csr_matrix((B_f.shape[0], n_gen)), B_f], format="csr")
    sizes = dict(n_gen=n_gen, n_bus=n_bus, ref_bus=ref_bus, gen_bus=gen_bus)
    return GridCase(E=E, C=C, **sizes, **fields)


def save_case(case: GridCase, path: str | os.PathLike, **extra: np.ndarray) -> None:
    """Writes `case` to the compressed `.npz` file `path` that `load_saved` reads
    (the matrices as their CSR arrays, `E_data`, ...), with the `extra` arrays."""
    arrays: dict[str, np.ndarray] = {"name": np.array(case.name)}
    for key in _MATRICES:
        matrix = sp.csr_matrix(getattr(case, key))
        arrays[f"{key}_data"] = matrix.data.astype(np.float64)
        arrays[f"{key}_indices"] = matrix.indices.astype(np.int32)
        arrays[f"{key}_indptr"] = matrix.indptr.astype(np.int32)
        arrays[f"{key}_shape"] = np.array(matrix.shape, dtype=np.int64)
    for key in (*_SCALARS, *_ARRAYS):
        arrays[key] = np.asarray(getattr(case, key))
    np.savez_compressed(path, **arrays, **extra)


def load_saved(path: str | os.PathLike) -> GridCase:
    """Reads a `GridCase` written by `save_case` (float64, int64 bus indices)."""
    with np.load(path, allow_pickle=False) as data:
        fields: dict[str, object] = {"name": str(data["name"])}
        for key in _MATRICES:
            csr = [data[f"{key}_{part}"] for part in ("data", "indices", "indptr")]
            shape = tuple(int(n) for n in data[f"{key}_shape"])
            fields[key] = sp.csr_matrix((csr[0].astype(np.float64), *csr[1:]), shape)
        for key, kind in _SCALARS.items():
            fields[key] = kind(data[key])
        for key in _ARRAYS:
            integer = key in ("gen_bus", "branch_from", "branch_to")
            fields[key] = data[key].astype(np.int64 if integer else np.float64)
    return GridCase(**fields)  # type: ignore[arg-type]


def sample_loads(case: GridCase, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` random loads: `case.p_d` times a `U(0.85, 1.0)` factor per row and a
    `U(0.95, 1.05)` one per bus and row."""
    overall = rng.uniform(0.85, 1.0, size=(n, 1))
    per_bus = rng.uniform(0.95, 1.05, size=(n, case.n_bus))
    return case.p_d[None, :] * overall * per_bus
