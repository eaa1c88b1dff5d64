"""The cases: each builds its instances, our projector and the reference's."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ._data import CaseData, case_data, float32_grid
from ._exact import slack_system


def _dc3_problem(size: str, problem: str, instances):
    """The DC3 problem, test contexts and their optima: from the paper's files
    (`instances`, small only) or generated (`make_dc3`) and solved here."""
    from pinet_eqx.problems import make_dc3

    from .._common.problems import DC3_SIZES, read_paper_instances

    if instances is not None and size == "small":
        paper = read_paper_instances(instances, problem)
        return paper.problem, paper.X_test, paper.Y_test, f"paper files in {instances}"
    n_var, n_eq, n_ineq, n_examples, _, n_test = DC3_SIZES[size]
    dc3 = make_dc3(n_var, n_eq, n_ineq, n_examples)
    X = dc3.split(n_test=n_test, n_valid=0)[2]
    return dc3, X, None, "pinet_eqx.problems.make_dc3, test contexts"


def _dc3_case(size: str, problem: str):
    def build(n: int, seed: int, instances) -> CaseData:
        dc3, X, Y, source = _dc3_problem(size, problem, instances)
        X = float32_grid(X[:n])
        if Y is not None:
            Y, how = Y[:n], "the files' Ystar"
        elif problem == "nonconvex":
            from ..dc3._solvers import solve_nonconvex

            Y, how = solve_nonconvex(dc3, X, progress=False), "IPOPT (local optima)"
        else:
            slack = slack_system(dc3.A, dc3.G, dc3.h)
            Q = np.diag(dc3.Q)
            Y = np.stack([slack.minimise(x, Q, dc3.p)[0] for x in X])
            how = "active-set QP solve in float64"
        info = {"source": source, "optimum": how, "size": size, "problem": problem,
                "n_var": dc3.n_var, "n_eq": dc3.n_eq, "n_ineq": dc3.n_ineq}  # fmt: skip
        return case_data(
            f"dc3-{size}-{problem}", dc3.A, X, dc3.G, np.full(dc3.n_ineq, -np.inf),
            dc3.h, Y, {"b": X}, {"A": dc3.A, "G": dc3.G, "h": dc3.h}, info, seed,
        )  # fmt: skip

    def projector(data: CaseData, **settings):
        from .._common.problems import dc3_projector

        s = data.spec
        return dc3_projector(s["A"], s["G"], s["h"], **settings)

    def reference(data: CaseData):
        from .._common import reference as pinet_hcnn
        from .._common.problems import PAPER_SIGMA

        if size not in PAPER_SIGMA:
            return None
        if not pinet_hcnn.reference_available():
            return None, {"skipped": pinet_hcnn.REFERENCE_MISSING}
        s, sigma = data.spec, PAPER_SIGMA[size]
        ref = pinet_hcnn.ReferenceDC3Projector(s["A"], s["G"], s["h"], sigma=sigma)
        settings = {"sigma": sigma, "n_iter": 50, "omega": ref.omega}
        return ref.make_forward(50), {**settings, "equilibrate": True}

    return build, projector, reference


def _soc_case():
    from .._common.problems import soc_projector

    def build(n: int, seed: int, instances) -> CaseData:
        from ..soc._data import load

        data = load("small", seed=seed)
        d1, d2 = data.d1, data.d2
        b, _ = data.split(data.X_test[:n])
        E = data.E
        d = E.shape[1]
        info = {"source": "benchmarks.soc._data.load('small')", "optimum": "analytic",
                "d1": d1, "d2": d2}  # fmt: skip
        return case_data(
            "soc-small", E, b, np.zeros((0, d)), np.zeros(0), np.zeros(0),
            data.Y_test[:n], {"b": b}, {"E": E, "d1": d1}, info, seed,
            S=np.eye(d)[d1 : d - 1], f=np.eye(d)[d - 1],
        )  # fmt: skip

    def projector(data: CaseData, **settings):
        return soc_projector(data.spec["E"], int(data.spec["d1"]), **settings)

    return build, projector, lambda data: None


def _mpc_case():
    def build(n: int, seed: int, instances) -> CaseData:
        from examples import toy_mpc

        X0 = float32_grid(toy_mpc.sample_states(np.random.default_rng([seed, 0]), n))
        Y, _ = toy_mpc.solve_osqp(X0)
        E0, E_dyn, lower, upper = toy_mpc.problem_data()
        d = E0.shape[1]
        q = np.hstack([X0, np.zeros((n, len(E_dyn)))])
        info = {"source": "examples/toy_mpc.py: problem_data, sample_states",
                "optimum": "OSQP (polished)", "n_var": d}  # fmt: skip
        return case_data(
            "toy-mpc", np.vstack([E0, E_dyn]), q, np.eye(d), lower, upper, Y,
            {"x0": X0}, {}, info, seed,
        )  # fmt: skip

    def projector(data: CaseData, **settings):
        import pinet_eqx as pe
        from examples import toy_mpc

        E0, E_dyn, lower, upper = toy_mpc.problem_data()
        dynamics = pe.Equality(E_dyn, np.zeros(len(E_dyn)))
        constraints = [
            pe.Equality(E0, pe.Parameter("x0")),
            dynamics,
            pe.Box(lower, upper),
        ]
        return pe.Projector(constraints, **settings)

    return build, projector, lambda data: None


MOTION_HORIZON = 100


def _motion_case():
    def problem():
        from examples import motion_planning as mp

        return mp.Problem(n_vehicles=1, horizon=MOTION_HORIZON)

    def build(n: int, seed: int, instances) -> CaseData:
        from examples import motion_planning as mp
        from examples.motion_planning._problem import (
            constraint_matrices,
            feasible_trajectory,
            sample_contexts,
            to_axes,
        )

        prob = problem()
        # One instance per coordinate of each context, as the per-axis projector
        # of `python -m examples.motion_planning context` sees them.
        n_ctx = -(-n // 2)
        starts, goals = sample_contexts(np.random.default_rng([seed, 0]), n_ctx, prob)
        starts, goals = float32_grid(starts[:, 0]), float32_grid(goals[:, 0])
        Y = np.stack([feasible_trajectory(s, g, prob) for s, g in zip(starts, goals)])
        Y = to_axes(Y).reshape(2 * n_ctx, -1)[:n]
        start = starts.reshape(-1, 1)[:n]
        goal = goals.reshape(-1, 1)[:n]
        c = {k: (v[0::2, 0::2] if v.ndim == 2 else v[0::2])
             for k, v in constraint_matrices(prob).items()}  # fmt: skip
        E = np.vstack([c["dynamics"], c["rest"], c["start"], c["goal"]])
        zeros = np.zeros((n, len(c["dynamics"]) + len(c["rest"])))
        d = E.shape[1]
        j = prob.j_max
        info = {"source": "examples.motion_planning (Problem(1, horizon=100), "
                "make_projector(per_axis=True)), sample_contexts",
                "optimum": "feasible_trajectory (effort-optimal)", "n_var": d,
                "module": mp.__name__}  # fmt: skip
        return case_data(
            f"motion-h{MOTION_HORIZON}", E, np.hstack([zeros, start, goal]),
            np.vstack([np.eye(d), c["jerk"]]),
            np.concatenate([c["lower"], np.full(len(c["jerk"]), -j)]),
            np.concatenate([c["upper"], np.full(len(c["jerk"]), j)]),
            Y, {"start": start, "goal": goal}, {}, info, seed,
        )  # fmt: skip

    def projector(data: CaseData, **settings):
        from examples.motion_planning._problem import make_projector

        return make_projector(problem(), per_axis=True, **settings)

    return build, projector, lambda data: None


@dataclasses.dataclass(frozen=True)
class Case:
    """A case: `n` instances, `n_floor` of them (`None`: all) with exact
    projections by `exact` (`"slack"` or `"clarabel"`); `make() -> (build(n,
    seed, instances), projector(data, **settings), reference(data))`, the last
    `(forward or None, settings)` or `None`; the timed repeats (single: 10x)."""

    description: str
    n: int
    n_floor: int | None
    exact: str
    make: Callable
    timing_repeats: int = 20
    time_far: bool = True
    time_unrefined: bool = True


CASES = {
    "dc3-tiny-convex": Case("DC3 tiny convex, 20/10/10 (generated)", 100, None,
                            "slack", lambda: _dc3_case("tiny", "convex"), 5),
    "dc3-small-convex": Case("DC3 small convex, 100/50/50", 512, None, "slack",
                             lambda: _dc3_case("small", "convex")),
    "dc3-small-nonconvex": Case("DC3 small non-convex, 100/50/50", 512, None, "slack",
                                lambda: _dc3_case("small", "nonconvex")),
    "dc3-large-convex": Case("DC3 large convex, 1000/500/500 (generated)", 64, 32,
                             "slack", lambda: _dc3_case("large", "convex"), 2,
                             time_far=False, time_unrefined=False),
    "soc-small": Case("SOC benchmark (App. B.4), d1 = d2 = 25", 512, 64,
                      "clarabel", _soc_case),
    "toy-mpc": Case("Toy MPC (App. A), 82 variables", 512, 64, "clarabel", _mpc_case),
    "motion-h100": Case("Motion planning H = 100, per axis, 302 variables", 256, 64,
                        "clarabel", _motion_case, 10),
}  # fmt: skip
DEFAULT_CASES = tuple(c for c in CASES if c != "dc3-tiny-convex")
