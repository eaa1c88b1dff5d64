"""The forward iteration: Douglas-Rachford on the lifted problem (paper Alg. 1).

Its settings (`DouglasRachford`, in `settings`), the affine projections onto
$\\mathcal{A}$, dense (`affine`) and sparse (`sparse_affine`), the iteration
itself (`douglas_rachford`), and the phases of one instance's forward pass that
are the iteration's: preparing the instance (`instance`) and certifying its
outcome (`certify`, with `solution`'s `ProjectionSolution`). It may import
`_linalg` and `_problem`.
"""

from .settings import DouglasRachford as DouglasRachford
from .solution import RESULTS as RESULTS, ProjectionSolution as ProjectionSolution
