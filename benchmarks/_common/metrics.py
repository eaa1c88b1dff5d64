"""The metrics record of the training suites (RS, CV, share of optimal instances);
NumPy only."""

from __future__ import annotations

import dataclasses

import numpy as np

CV_OPTIMAL = 1e-3  # the paper's thresholds for an "optimal" instance
RS_OPTIMAL = 0.05
# The keys of every summary; each part of the constraints adds `{part}_cv_max`.
METRICS = ("rs_mean", "rs_median", "rs_max", "cv_mean", "cv_median", "cv_max")
METRICS += ("optimal_pct", "test_rows")


@dataclasses.dataclass(frozen=True, eq=False)
class Metrics:
    """Per-instance test metrics: `rs` (clipped at 0), `cv`, the violation of each
    of the `parts` (`eq`, `ineq`, `cone`) and, where reported, `signed_rs`."""

    rs: np.ndarray
    cv: np.ndarray
    parts: dict[str, np.ndarray]
    signed_rs: np.ndarray | None = None

    def summary(self) -> dict:
        """The record's `metrics` (the keys of `METRICS`, `{part}_cv_max` and,
        with `signed_rs`, its mean and min)."""
        rs, cv = self.rs, self.cv
        out = {
            f"{name}_{stat}": float(f(a))
            for name, a in (("rs", rs), ("cv", cv))
            for stat, f in (("mean", np.mean), ("median", np.median), ("max", np.max))
        }
        out.update({f"{name}_cv_max": float(a.max()) for name, a in self.parts.items()})
        optimal = (cv <= CV_OPTIMAL) & (rs <= RS_OPTIMAL)
        out.update(optimal_pct=float(100 * np.mean(optimal)), test_rows=len(rs))
        if self.signed_rs is not None:
            out.update(
                rs_signed_mean=float(self.signed_rs.mean()),
                rs_signed_min=float(self.signed_rs.min()),
            )
        return out
