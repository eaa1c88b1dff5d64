"""pinet_eqx: hard convex constraints on neural-network outputs, in JAX/Equinox."""

import importlib.metadata

# Registers the module paths of the flat layout, which old pickles name.
from . import _moved as _moved
from ._adjoint import (
    AbstractAdjoint as AbstractAdjoint,
    ImplicitAdjoint as ImplicitAdjoint,
    UnrolledAdjoint as UnrolledAdjoint,
)
from ._autotune import AutotuneResult as AutotuneResult, autotune as autotune
from ._cvxpy import from_cvxpy as from_cvxpy
from ._linalg import (
    BackwardNotConvergedWarning as BackwardNotConvergedWarning,
    BiCGStab as BiCGStab,
    ConjugateGradient as ConjugateGradient,
    Equilibration as Equilibration,
    equilibrate as equilibrate,
)
from ._metrics import relative_suboptimality as relative_suboptimality
from ._net import (
    HardConstrainedNet as HardConstrainedNet,
    trainable_filter as trainable_filter,
)
from ._problem.cones import (
    AbstractCone as AbstractCone,
    AbstractPolishableCone as AbstractPolishableCone,
    L1Cone as L1Cone,
    L2Cone as L2Cone,
    LInfCone as LInfCone,
    ScaledSimplex as ScaledSimplex,
)
from ._problem.parameter import Parameter as Parameter
from ._problem.pieces import ConeBlock as ConeBlock, LiftedPieces as LiftedPieces
from ._problem.primitives import (
    project_box as project_box,
    project_l1_norm_cone as project_l1_norm_cone,
    project_linf_norm_cone as project_linf_norm_cone,
    project_second_order_cone as project_second_order_cone,
    project_simplex as project_simplex,
)
from ._projector import Projector as Projector
from ._serialise import load as load, save as save
from ._sets import (
    AbstractConstraint as AbstractConstraint,
    AffineInequality as AffineInequality,
    Box as Box,
    Equality as Equality,
    L1NormCone as L1NormCone,
    LInfNormCone as LInfNormCone,
    SecondOrderCone as SecondOrderCone,
    Simplex as Simplex,
)
from ._sharding import (
    data_mesh as data_mesh,
    replicate as replicate,
    shard_batch as shard_batch,
)
from ._solver import (
    RESULTS as RESULTS,
    DouglasRachford as DouglasRachford,
    ProjectionSolution as ProjectionSolution,
)

try:
    __version__ = importlib.metadata.version("pinet_eqx")
except importlib.metadata.PackageNotFoundError:  # running from a source checkout
    __version__ = "0.0.0+unknown"
