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
    python -m examples.motion_planning context --horizon 100 --res 1024 --downsample 4
    python -m examples.motion_planning context --horizon 750 --res 64 --downsample 2 \\
        --raw trajectory --sigma 0.002 --epochs 40
    python -m examples.motion_planning construction --horizons 25 100 750

`context` is the paper's contextual coverage and long-horizon planning: one
vehicle, a map seen by a CNN, the map's mean along the path as the cost
(`_context_map`). `construction` times and measures the build of the projector,
joint and split by coordinate (`make_projector(..., per_axis=True)`).

`train` writes its folder (DIR_00 for lambda = nu = 0, and so on) under
`results/motion_planning/`; `python -m examples.motion_planning COMMAND --help`
lists every option. Modules:
`_problem` (layout, dynamics, constraints, projector, contexts, independent
violation check), `_objectives`, `_context_map` (maps, CNN backbone, map cost),
`_model` (the planner), `_train`, `_baseline` (OSQP), `_figures` and `_cli`.
"""

from ._baseline import (
    relative_suboptimality as relative_suboptimality,
    solve_effort_qp as solve_effort_qp,
)
from ._context_map import (
    CENTERS as CENTERS,
    MapBackbone as MapBackbone,
    MapTable as MapTable,
    gaussian_map as gaussian_map,
    make_map_backbone as make_map_backbone,
    make_map_planner as make_map_planner,
    make_map_table as make_map_table,
    map_cost as map_cost,
    map_inputs as map_inputs,
    map_value as map_value,
    sample_map_contexts as sample_map_contexts,
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
    from_axes as from_axes,
    join as join,
    make_projector as make_projector,
    reach as reach,
    rollout as rollout,
    sample_contexts as sample_contexts,
    split as split,
    to_axes as to_axes,
    violations as violations,
)
from ._train import predict as predict, train as train
