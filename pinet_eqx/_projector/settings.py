"""`Projector.with_settings`: a copy with other settings, the factorisation kept."""

from __future__ import annotations

import copy
import dataclasses

from .._adjoint.adjoint import check_adjoint
from .._solver.settings import DouglasRachford
from . import compat as _compat
from .build import check_polish

# Settings that `with_settings` changes on the `DouglasRachford` solver.
_SOLVER_FIELDS = frozenset(f.name for f in dataclasses.fields(DouglasRachford))
_OTHER_SETTINGS = frozenset(
    {"adjoint", "check_inputs", "inference", "polish", "refine"}
)


def with_settings(proj, settings: dict):
    """A copy of the `Projector` `proj` with `settings` (see
    `Projector.with_settings`)."""
    valid = _SOLVER_FIELDS | _OTHER_SETTINGS
    unknown = sorted(set(settings) - valid - set(_compat.ADJOINT_KEYWORDS))
    if unknown:
        raise TypeError(
            f"Projector.with_settings: unknown setting(s) {unknown}; valid "
            f"settings are {sorted(valid)}. Constraint data and equilibration "
            "need a new Projector."
        )
    solver = dataclasses.replace(
        proj.solver, **{k: v for k, v in settings.items() if k in _SOLVER_FIELDS}
    )
    adjoint = _compat.adjoint(
        settings.get("adjoint", proj.adjoint), "adjoint" in settings, settings
    )
    check_adjoint(adjoint, solver.tol)
    new = copy.copy(proj)
    changes: dict[str, object] = dict(solver=solver, adjoint=adjoint)
    for k in ("check_inputs", "inference"):
        if k in settings:
            changes[k] = bool(settings[k])
    if "refine" in settings:
        changes.update(_refine_settings(proj, settings["refine"]))
    if "polish" in settings:
        changes["polish"] = check_polish(settings["polish"], "Projector.with_settings")
    for k, v in changes.items():
        # Modules are frozen dataclasses; this is a fresh shallow copy, so
        # setting its fields changes nothing other references can see.
        object.__setattr__(new, k, v)
    return new


def _refine_settings(proj, refine) -> dict[str, object]:
    """The fields that `with_settings(refine=refine)` changes."""
    if refine not in (True, False, "auto"):
        raise ValueError(
            f"Projector.with_settings(refine={refine!r}): must be True, False "
            "or 'auto'."
        )
    if refine is False:
        return dict(refinement=None, refine_always=False, polish=False)
    if proj.refinement is None:
        raise ValueError(
            f"Projector.with_settings(refine={refine!r}): this projector has no "
            "refinement to switch on (it was built with refine=False, or has "
            "no constraint rows to refine); build a new Projector(..., "
            f"refine={refine!r})."
        )
    return dict(refine_always=refine is True)
