"""The lifted problem $\\mathcal{A} \\cap \\mathcal{K}$ of paper Sec. 2.1.

The projections onto simple sets (`primitives`), the cones of $\\mathcal{K}$ one
class each (`cones`) and their grouped layout (`blocks`), the named per-instance
data (`parameter`, `parameter_map`), what a constraint contributes
(`pieces`), its float64 host data (`host_data`) and the stacked, per-instance
assembled `LiftedProblem` (`segments`, `lifting`). It may import `_linalg` only.
"""

from .cones import (
    AbstractCone as AbstractCone,
    AbstractPolishableCone as AbstractPolishableCone,
    L1Cone as L1Cone,
    L2Cone as L2Cone,
    LInfCone as LInfCone,
    ScaledSimplex as ScaledSimplex,
)
from .parameter import Parameter as Parameter
from .pieces import ConeBlock as ConeBlock, LiftedPieces as LiftedPieces
from .primitives import (
    project_box as project_box,
    project_l1_norm_cone as project_l1_norm_cone,
    project_linf_norm_cone as project_linf_norm_cone,
    project_second_order_cone as project_second_order_cone,
    project_simplex as project_simplex,
)
