"""The metrics record of the training suites: RS, CV and the share of optimal
instances, from per-instance values in float64.

NumPy only, so that the report can import it without JAX.
"""

from __future__ import annotations

import dataclasses

import numpy as np

CV_OPTIMAL = 1e-3  # the paper's thresholds for an "optimal" instance
RS_OPTIMAL = 0.05
# The keys of every summary; each part of the constraints adds `{part}_cv_max`.
METRICS = (
    "rs_mean",
    "rs_median",
    "rs_max",
    "cv_mean",
    "cv_median",
    "cv_max",
    "optimal_pct",
    "test_rows",
)


@dataclasses.dataclass(frozen=True, eq=False)
class Metrics:
    """Per-instance test metrics of one method's predictions: `rs` (relative
    suboptimality, clipped at 0), `cv` (largest violation), `parts` (the violation
    of each named part, e.g. `eq`, `ineq`, `cone`) and `signed_rs` (unclipped, where
    a suite reports it: an infeasible output can beat the optimum).
    """

    rs: np.ndarray
    cv: np.ndarray
    parts: dict[str, np.ndarray]
    signed_rs: np.ndarray | None = None

    def summary(self) -> dict:
        """The record's `metrics`: mean, median and max of RS and CV, each part's
        largest violation (`{part}_cv_max`), the percentage of optimal instances
        (CV and RS within the paper's thresholds), the row count and, with
        `signed_rs`, its mean and min (`rs_signed_mean`, `rs_signed_min`)."""
        rs, cv = self.rs, self.cv
        out = {
            "rs_mean": float(rs.mean()),
            "rs_median": float(np.median(rs)),
            "rs_max": float(rs.max()),
            "cv_mean": float(cv.mean()),
            "cv_median": float(np.median(cv)),
            "cv_max": float(cv.max()),
            **{
                f"{name}_cv_max": float(part.max()) for name, part in self.parts.items()
            },
            "optimal_pct": float(
                100 * np.mean((cv <= CV_OPTIMAL) & (rs <= RS_OPTIMAL))
            ),
            "test_rows": len(rs),
        }
        if self.signed_rs is not None:
            out.update(
                rs_signed_mean=float(self.signed_rs.mean()),
                rs_signed_min=float(self.signed_rs.min()),
            )
        return out
