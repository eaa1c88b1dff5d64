"""The cvxpy front end: `from_cvxpy` builds a `Projector` from cvxpy constraints.

The entry point and its checks (`front_end`), the variables it eliminates
(`eliminate`), and our sets built from cvxpy's cone program (`build`). cvxpy is
imported only inside `from_cvxpy`'s call, so the package imports without it. It
may import every subpackage below it, `_projector` included.
"""

from .front_end import from_cvxpy as from_cvxpy
