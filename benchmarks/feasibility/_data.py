"""The instances of one case, their float32 rounding and the shared settings."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

from .._common.problems import linear_violation

# The repository's root, where worker processes run.
ROOT = pathlib.Path(__file__).resolve().parents[2]

NEAR_SCALE = 0.01  # standard deviation of the noise around the optimum, near
FAR_SCALE = 5.0  # and far (an untrained backbone's outputs)
F32_REL_TARGET = 1e-6  # float32 max CV <= this * max(1, ||data||_inf)
FLOOR_FACTOR = 1.5  # ... and <= this * the float32 rounding floor
F64_TARGET = 1e-9
KINDS = ("near", "far")
DTYPES = ("float32", "float64")
TIMING_BATCH = 1024


def float32_grid(a) -> np.ndarray:
    """`a` rounded to float32, held in float64."""
    return np.asarray(a, np.float64).astype(np.float32).astype(np.float64)


@dataclasses.dataclass(frozen=True, eq=False)
class CaseData:
    r"""One case's instances in float64: instance $i$'s set is $\{y : E y = q_i,\
    \ell \le C y \le u,\ \|S y\|_2 \le f^\top y\}$ (no rows of `S` without a
    cone), the form of the CV and the exact projection; the projector is built
    from `spec`, with the per-instance `params`. Also the raw outputs `near` and
    `far` and how the instances were made (`info`).
    """

    name: str
    E: np.ndarray
    q: np.ndarray
    C: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    S: np.ndarray
    f: np.ndarray
    params: dict
    near: np.ndarray
    far: np.ndarray
    spec: dict
    info: dict

    @property
    def n(self) -> int:
        return len(self.near)

    @property
    def dim(self) -> int:
        return self.E.shape[1]

    def raw(self, kind: str) -> np.ndarray:
        return self.near if kind == "near" else self.far

    def violation(self, Y, q=None) -> np.ndarray:
        """The CV of each row of `Y` for the right-hand sides `q` (default: all
        the instances'), float64: the largest of $|E y - q|$, the bounds' excess
        and the cone's $(\\|S y\\| - f^\\top y)_+$."""
        Y = np.asarray(Y, np.float64)
        q = self.q if q is None else q
        out = linear_violation(Y, self.E, q, self.C, self.lower, self.upper)
        if len(self.S):
            cone = np.linalg.norm(Y @ self.S.T, axis=1) - Y @ self.f
            out = np.maximum(out, cone)
        return np.maximum(out, 0.0)

    def data_norm(self) -> float:
        """$\\|\\text{data}\\|_\\infty$: the largest entry of the constraint data
        (matrices, right-hand sides, finite bounds) over all instances."""
        parts = [self.E, self.q, self.C, self.S, self.f]
        bounds = np.concatenate([self.lower, self.upper])
        parts.append(bounds[np.isfinite(bounds)])
        return float(max(np.abs(p).max(initial=0.0) for p in parts))

    def save(self, path) -> None:
        arrays = {
            k: getattr(self, k)
            for k in ("E", "q", "C", "lower", "upper", "S", "f", "near", "far")
        }
        arrays |= {f"param:{k}": v for k, v in self.params.items()}
        arrays |= {f"spec:{k}": np.asarray(v) for k, v in self.spec.items()}
        np.savez(path, **arrays)
        pathlib.Path(path).with_suffix(".json").write_text(
            json.dumps({"name": self.name, "info": self.info})
        )

    @classmethod
    def load(cls, path) -> CaseData:
        meta = json.loads(pathlib.Path(path).with_suffix(".json").read_text())
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        params = {k[6:]: v for k, v in arrays.items() if k.startswith("param:")}
        spec = {k[5:]: v for k, v in arrays.items() if k.startswith("spec:")}
        plain = {k: v for k, v in arrays.items() if ":" not in k}
        return cls(meta["name"], **plain, params=params, spec=spec, info=meta["info"])


def case_data(
    name, E, q, C, lower, upper, optimum, params, spec, info, seed, S=None, f=None
):
    """`CaseData` with near and far raw outputs drawn around `optimum`; the raw
    outputs and the per-instance data are rounded to float32."""
    rng = np.random.default_rng([seed, 15])
    d = E.shape[1]
    noise = rng.normal(size=(2, *optimum.shape))
    return CaseData(
        name=name,
        E=np.asarray(E, np.float64),
        q=float32_grid(q),
        C=np.asarray(C, np.float64),
        lower=np.asarray(lower, np.float64),
        upper=np.asarray(upper, np.float64),
        S=np.zeros((0, d)) if S is None else np.asarray(S, np.float64),
        f=np.zeros(d) if f is None else np.asarray(f, np.float64),
        params={k: float32_grid(v) for k, v in params.items()},
        near=float32_grid(optimum + NEAR_SCALE * noise[0]),
        far=float32_grid(optimum + FAR_SCALE * noise[1]),
        spec=spec,
        info={**info, "near": f"optimum + {NEAR_SCALE} N(0, I)",
              "far": f"optimum + {FAR_SCALE} N(0, I)"},
    )  # fmt: skip
