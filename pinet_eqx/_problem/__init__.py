"""The lifted problem $\\mathcal{A} \\cap \\mathcal{K}$ of paper Sec. 2.1.

The projections onto simple sets (`primitives`), the cones of $\\mathcal{K}$ one
class each (`cones`) and their grouped layout (`blocks`), the named per-instance
data (`parameter`, `parameter_map`), what a constraint contributes
(`pieces`), its float64 host data (`host_data`) and the stacked, per-instance
assembled `LiftedProblem` (`segments`, `lifting`). It may import `_linalg` only.

Its public names (the cones, `Parameter`, `ConeBlock`, `LiftedPieces` and the
primitive projections) are re-exported by `pinet_eqx` alone, from the modules
that define them.
"""
