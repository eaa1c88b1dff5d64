"""Multi-vehicle motion planning with hard constraints (paper Sec. 3.2, App. B.3).

N vehicles with double-integrator dynamics move from a start to a goal fleet
configuration over T = 25 steps of h = 0.25, within position, velocity,
acceleration and jerk limits. An MLP maps the context (all starts and goals) to
the whole fleet's accelerations; they are rolled out with the dynamics into raw
trajectories, which one `pinet_eqx.Projector` per vehicle (under `jax.vmap`)
makes feasible. Training is self-supervised on the fleet-level objective
phi = effort + lambda * preference + nu * coverage, which may be non-convex. For
the convex effort-only objective, OSQP gives the optimum to score against.

    python -m examples.motion_planning train --vehicles 5 --lam 1 --nu 0
    python -m examples.motion_planning baseline --run DIR_00
    python -m examples.motion_planning figures --runs DIR_00 DIR_10 DIR_11
    python -m examples.motion_planning suite --vehicles 5 15 --epochs 30

`train` writes its folder (DIR_00 for lambda = nu = 0, and so on) under
`results/motion_planning/`; `python -m examples.motion_planning COMMAND --help`
lists every option. Modules:
`_problem` (layout, dynamics, constraints, projector, contexts, independent
violation check), `_objectives`, `_model` (the planner), `_train`, `_baseline`
(OSQP), `_figures` and `_cli`.
"""

from ._baseline import (
    relative_suboptimality as relative_suboptimality,
    solve_effort_qp as solve_effort_qp,
)
from ._model import (
    FleetPlanner as FleetPlanner,
    make_mlp as make_mlp,
    make_planner as make_planner,
)
from ._objectives import (
    Coverage as Coverage,
    coverage as coverage,
    coverage_image as coverage_image,
    effort as effort,
    fleet_objective as fleet_objective,
    ishigami as ishigami,
    preference as preference,
)
from ._problem import (
    Problem as Problem,
    constraint_matrices as constraint_matrices,
    context_features as context_features,
    feasible_trajectory as feasible_trajectory,
    join as join,
    make_projector as make_projector,
    reach as reach,
    rollout as rollout,
    sample_contexts as sample_contexts,
    split as split,
    violations as violations,
)
from ._train import predict as predict, train as train
