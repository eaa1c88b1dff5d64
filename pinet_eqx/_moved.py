"""The module paths of the flat layout (before the subpackages), still importable.

A pickle stores every class by its module path, such as
`pinet_eqx._lifting.LiftedProblem`, so a model pickled before the move names
modules that no longer exist as files. When `pinet_eqx` is imported, each old
path is put in `sys.modules` as the module that now holds its contents or, where
those contents were split, as a module object holding the names of all its parts.
`pe.save` files hold no paths, so they need none of this. Old paths that are now
packages (`_solver`, `_adjoint`, `_projector`, `_active_set`, `_cvxpy`) resolve
through the names those packages re-export.
"""

from __future__ import annotations

import sys
import types

from . import _sets
from ._active_set import (
    face,
    fixed_rows,
    host_dual,
    host_ipm,
    host_kkt,
    host_parallel,
    host_polish,
    refine,
    rowsolve,
)
from ._adjoint import implicit
from ._cvxpy import build as cvxpy_build, eliminate as cvxpy_eliminate
from ._linalg import equilibration, host_solve, krylov, precision, residual, sparse
from ._problem import (
    blocks,
    cones,
    host_data,
    lifting,
    parameter,
    parameter_map,
    pieces,
    primitives,
    segments,
)
from ._projector import build, compat, forward, frozen, mesh, settings
from ._sets import (
    base as sets_base,
    box,
    cones as sets_cones,
    equality,
    inequality,
    simplex,
)
from ._solver import affine, douglas_rachford, solution, sparse_affine

# Old module (below `pinet_eqx`) -> the module(s) now holding its contents.
OLD_PATHS: dict[str, tuple[types.ModuleType, ...]] = {
    "_affine": (affine,),
    "_blocks": (blocks,),
    "_build": (build,),
    "_compat": (compat,),
    "_constraints": (_sets,),
    "_cones": (cones,),
    "_constraints._base": (sets_base,),
    "_constraints.box": (box,),
    "_constraints.cones": (sets_cones,),
    "_constraints.equality": (equality,),
    "_constraints.inequality": (inequality,),
    "_constraints.simplex": (simplex,),
    "_cvxpy_build": (cvxpy_build,),
    "_cvxpy_eliminate": (cvxpy_eliminate,),
    "_douglas_rachford": (douglas_rachford,),
    "_equilibrate": (equilibration,),
    "_face": (face,),
    "_fixed_rows": (fixed_rows,),
    "_forward": (forward,),
    "_frozen": (frozen,),
    "_host_data": (host_data, pieces),
    "_host_dual": (host_dual,),
    "_host_ipm": (host_ipm,),
    "_host_kkt": (host_kkt,),
    "_host_parallel": (host_parallel,),
    "_host_polish": (host_polish,),
    "_host_solve": (host_solve,),
    "_implicit": (implicit,),
    "_krylov": (krylov,),
    "_lifting": (lifting, pieces),
    "_mesh": (mesh,),
    "_parameter": (parameter,),
    "_parameter_map": (parameter_map,),
    "_precision": (precision,),
    "_primitives": (primitives,),
    "_refine": (refine,),
    "_residual": (residual,),
    "_rowsolve": (rowsolve,),
    "_segments": (segments,),
    "_settings": (settings,),
    "_solution": (solution,),
    "_sparse": (sparse,),
    "_sparse_affine": (sparse_affine,),
}


def _register() -> None:
    """Put every old module path in `sys.modules` (where it is not already)."""
    for old, modules in OLD_PATHS.items():
        name = f"{__package__}.{old}"
        if len(modules) == 1:
            sys.modules.setdefault(name, modules[0])
            continue
        parts = ", ".join(m.__name__ for m in modules)
        alias = types.ModuleType(name, f"The old path of {parts}.")
        for module in modules:
            for key, value in vars(module).items():
                if not key.startswith("__"):
                    alias.__dict__.setdefault(key, value)
        sys.modules.setdefault(name, alias)


# At import, so that `import pinet_eqx` is all a pickle needs.
_register()
