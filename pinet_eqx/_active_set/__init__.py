"""The active face: the exact derivative from it, and the finish onto it.

The active-set derivative of polyhedral sets (`derivative`), the face's tangent
map for dense, sparse and fixed rows (`face`, `fixed_rows`, `rowsolve`), the
device-side polish and iterative refinement (`refine`), the host-side finish of
sparse sets (`host_polish` with its `host_rounds`, `host_kkt`, `host_ipm`,
`host_dual` with `host_working`, `host_neighbours` and `host_parallel`), and
the finishing phase of the forward pass (`finish`). It
may import `_linalg`, `_problem` and `_solver`.
"""

from .derivative import Forward as Forward, Inputs as Inputs
from .face import SparseRows as SparseRows
from .fixed_rows import FixedRows as FixedRows
