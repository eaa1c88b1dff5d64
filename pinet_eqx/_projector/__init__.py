"""The projection layer, `Projector`: built once, then called per instance.

What is computed once on the host (`build`), the frozen arrays that hold it
(`frozen`), one instance's forward pass, phase by phase (`forward`), running
per instance under sharding (`mesh`), settings and deprecated keywords
(`settings`, `compat`), and the `Projector` itself (`projector`). It may import
every subpackage below it: `_linalg`, `_problem`, `_sets`, `_solver`,
`_active_set` and `_adjoint`.
"""

from .projector import Projector as Projector
