"""Deprecated `Projector` keywords, mapped onto the settings objects for one
release, with a `DeprecationWarning`."""

from __future__ import annotations

import dataclasses
import warnings

from .._adjoint.adjoint import AbstractAdjoint, ImplicitAdjoint, UnrolledAdjoint
from .._linalg.equilibration import Equilibration

# Old keyword -> field of `ImplicitAdjoint` (`unroll` selects `UnrolledAdjoint`).
ADJOINT_KEYWORDS = {
    "unroll": None,
    "n_iter_bwd": "max_steps",
    "bwd_rtol": "rtol",
    "bwd_atol": "atol",
    "bwd_failure": "on_failure",
}
# Old keyword -> field of `Equilibration`.
EQUILIBRATION_KEYWORDS = {
    "equilibrate_iters": "n_iter",
    "equilibrate_tol": "tol",
    "equilibrate_mode": "mode",
    "equilibrate_y": "y",
}
DEPRECATED = frozenset(ADJOINT_KEYWORDS) | frozenset(EQUILIBRATION_KEYWORDS)


def _warn(old: dict, replacement: str) -> None:
    warnings.warn(
        f"Projector({', '.join(sorted(old))}=...) is deprecated and will be removed "
        f"in the next release: use {replacement}.",
        DeprecationWarning,
        stacklevel=4,
    )


def adjoint(base: AbstractAdjoint, explicit: bool, old: dict) -> AbstractAdjoint:
    """`base`, adjusted by the deprecated backward keywords in `old`."""
    old = {k: v for k, v in old.items() if k in ADJOINT_KEYWORDS and v is not None}
    if not old:
        return base
    if explicit:
        raise ValueError(
            f"Projector: pass either `adjoint=` or the deprecated {sorted(old)}, "
            "not both."
        )
    _warn(
        old,
        "`adjoint=pinet_eqx.UnrolledAdjoint()` instead of `unroll=True`, and "
        "`adjoint=pinet_eqx.ImplicitAdjoint(max_steps=..., rtol=..., atol=..., "
        "on_failure=...)` instead of `n_iter_bwd`, `bwd_rtol`, `bwd_atol` and "
        "`bwd_failure`",
    )
    if old.pop("unroll", False):
        return UnrolledAdjoint()
    start = base if isinstance(base, ImplicitAdjoint) else ImplicitAdjoint()
    return dataclasses.replace(
        start, **{ADJOINT_KEYWORDS[k]: v for k, v in old.items()}
    )


def equilibration(base: Equilibration | None, old: dict) -> Equilibration | None:
    """`base`, adjusted by the deprecated `equilibrate_*` keywords in `old`."""
    old = {k: v for k, v in old.items() if k in EQUILIBRATION_KEYWORDS}
    if not old:
        return base
    _warn(old, "`equilibrate=pinet_eqx.Equilibration(n_iter=, tol=, mode=, y=)`")
    if base is None:
        return None
    return dataclasses.replace(
        base, **{EQUILIBRATION_KEYWORDS[k]: v for k, v in old.items()}
    )
