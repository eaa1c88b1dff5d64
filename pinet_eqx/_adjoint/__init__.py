"""How a projection is differentiated: the adjoint objects and their rules.

The adjoint classes (`adjoint`: `ImplicitAdjoint`, `UnrolledAdjoint`), the
implicit function theorem at the Douglas-Rachford fixed point (`implicit`), and
the iterating phase of the forward pass, which runs the iteration under the
derivative rule the adjoint chooses (`iterate`). It may import `_linalg`,
`_problem`, `_solver` and `_active_set`.
"""

from .adjoint import (
    AbstractAdjoint as AbstractAdjoint,
    ImplicitAdjoint as ImplicitAdjoint,
    UnrolledAdjoint as UnrolledAdjoint,
)
