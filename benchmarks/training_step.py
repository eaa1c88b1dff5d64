r"""Training-step benchmark: the projection forward and forward+backward, ours
against the published reference, with gradient accuracy against an exact VJP.

    python -m benchmarks.training_step                  # small and large, f32 and f64
    python -m benchmarks.training_step --sizes small --dtypes float32 --repeats 20
    python -m benchmarks.training_step --quick          # tiny problem (CI smoke test)

DC3 small (100/50/50, batch 2048) and large (1000/500/500, batch 1024), each
float dtype, both layers side by side in one process: **ours**, `pe.Projector` at
its library defaults, `jax.vmap(proj)(Y, b=X)` with its arrays as arguments of the
jitted function; **the reference**, `pinet-hcnn` 0.2.0 at the paper's
configuration (App. B.2: tuned $\sigma$, 50 iterations, Ruiz equilibration with
25 iterations, $\omega = 1.7$, 25 backward iterations). Timed: the jitted
projection (`fwd`) and `jax.value_and_grad` of $\sum_{ij} V_{ij} \Pi(Y)_{ij}$ in
$Y$ (`fwd+bwd`); the first call is `compile`, then `--repeats` calls.

Raw inputs $Y = A^+ x + 0.5\,N(0, I)$: near the set, with some inequalities
violated (the active rows are in `ground_truth`). $Y$, $X$ and $V$ are rounded
to float32 once, so both dtypes share one ground truth: for the first
`--n-grad-check` instances, the exact projection by a primal-dual active-set
method in float64 NumPy (`ExactProjection`, certified by KKT; cross-checked with
Clarabel on the small problems), whose VJP is $g$ projected onto the null space
of the active rows. An instance with a weakly active row (slack and multiplier
below 1e-7) has no derivative and is left out of the error statistics.

The float32 runs execute under `jax.enable_x64(False)`, as float32 training
would (with x64 on, the reference promotes float32 inputs to float64).
`JAX_DEFAULT_MATMUL_PRECISION` is recorded (TF32 on a GPU, for the reference).
Writes a Markdown table to stdout and a JSON record (default
`benchmarks/_out/training_step.json`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import pathlib
import sys
import time
import warnings
from collections import Counter

import numpy as np
import scipy.linalg

from pinet_eqx.problems import DC3Problem, dc3_violation, make_dc3

from ._common import problems, records
from ._common.provenance import command_line, log, machine, now, save
from ._common.reference import reference_available
from ._common.solvers import clarabel
from ._common.timing import fmt, time_first

DEFAULT_OUT = pathlib.Path(__file__).resolve().parent / "_out" / "training_step.json"
PROG = "python -m benchmarks.training_step"
BATCH = {"tiny": 64, "small": 2048, "large": 1024}
DTYPES = ("float32", "float64")
RAW_NOISE = 0.5
# The reference at the paper's configuration (App. B.2); sigma is per size.
REFERENCE_CONFIG = dict(
    omega=problems.PAPER_OMEGA,
    n_iter=problems.PAPER_N_ITER,
    n_iter_bwd=problems.PAPER_N_ITER_BWD,
    equilibrate=True,
    equilibration_max_iter=problems.PAPER_RUIZ_ITERS,
)
# A row with slack and multiplier both below this is weakly active: the
# projection is not differentiable there.
WEAK_TOL = 1e-7
CLARABEL_MAX_VAR = 200  # Clarabel takes ~20 s per large instance; skip it there.


@dataclasses.dataclass(frozen=True)
class Case:
    """One problem and its batch, float64: contexts `X`, raw points `Y`,
    cotangent `V` and the data's `source`."""

    size: str
    problem: DC3Problem
    X: np.ndarray
    Y: np.ndarray
    V: np.ndarray
    source: dict


def make_case(size: str, batch=None, instances=None, seed: int = 0) -> Case:
    """The problem and batch of `size` (default batch `BATCH[size]`), rounded to
    float32 values; `instances` (the paper's `.npz` folder) gives the small one."""
    batch = BATCH[size] if batch is None else batch
    n_var, n_eq, n_ineq, n_examples = problems.DC3_SIZES[size][:4]
    if instances is not None and size == "small":
        problem = problems.read_paper_instances(instances, "nonconvex").problem
        source = {"instances": str(instances)}
    else:
        problem = make_dc3(n_var, n_eq, n_ineq, n_examples=n_examples, seed=17)
        source = {"generator": "make_dc3", "seed": 17, "n_examples": n_examples}
    # The last rows: for the small problem these are the published validation and
    # test contexts, the same 2048 as in the instance files.
    X = _f32_grid(np.resize(problem.X[::-1], (batch, problem.n_eq))[::-1])
    rng = np.random.RandomState(seed)
    noise = RAW_NOISE * rng.normal(size=(batch, problem.n_var))
    Y = _f32_grid(X @ np.linalg.pinv(problem.A).T + noise)
    V = _f32_grid(rng.normal(size=(batch, problem.n_var)))
    source.update(batch=batch, raw=f"A^+ x + {RAW_NOISE} N(0, I)", seed=seed)
    return Case(size, problem, X, Y, V, source)


def _f32_grid(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).astype(np.float64)


class ExactProjection:
    r"""The exact projection onto $\{z : A z = x,\ G z \le h\}$ in float64 NumPy.

    With $N$ a basis of null($A$) and $z_0$ the projection onto $\{A z = x\}$,
    the projection onto $\{A z = x,\ G_S z = h_S\}$ is $z_0 - N K^\top \lambda_S$,
    $K = G_S N$, $K K^\top \lambda_S = G_S z_0 - h_S$ (a QR of $K^\top$)."""

    def __init__(self, A, G, h):
        self.A, self.G, self.h = (np.asarray(a, np.float64) for a in (A, G, h))
        m = self.A.shape[0]
        # A^T = Q R: A^+ = Q_1 R_1^{-T}, and the last columns of Q span null(A).
        Q, R = scipy.linalg.qr(self.A.T)
        self._Q1, self._R1, self.N = Q[:, :m], R[:m], Q[:, m:]
        self._GN = self.G @ self.N

    def restricted(self, y, x, active):
        r"""The projection onto $\{A z = x,\ G_S z = h_S\}$, $S$ = `active`: `(z,
        lam, Q)`, the multipliers (zero off $S$) and a basis `Q` of rows($G_S N$)."""
        z = y - self._Q1 @ scipy.linalg.solve_triangular(
            self._R1, self.A @ y - x, trans="T"
        )
        lam = np.zeros(self.G.shape[0])
        if not active.any():
            return z, lam, np.zeros((self.N.shape[1], 0))
        K = self._GN[active]
        # K^T = Q R gives K K^T = R^T R without squaring the condition number.
        Q, R = scipy.linalg.qr(K.T, mode="economic")
        rhs = self.G[active] @ z - self.h[active]
        lam[active] = scipy.linalg.solve_triangular(
            R, scipy.linalg.solve_triangular(R, rhs, trans="T")
        )
        return z - self.N @ (K.T @ lam[active]), lam, Q

    def project(self, y, x, max_steps: int = 100):
        """Project `y` by a primal-dual active-set method (drop negative
        multipliers, add violated rows until the set repeats): `(z, active, lam,
        slack, Q)`, or `None` if it did not settle within `max_steps`."""
        active = np.zeros(self.G.shape[0], bool)
        tol = 1e-12 * (1.0 + np.abs(self.h))
        for _ in range(max_steps):
            z, lam, Q = self.restricted(y, x, active)
            slack = self.h - self.G @ z
            new = (active & (lam > -tol)) | (~active & (slack < -tol))
            if np.array_equal(new, active):
                return z, active, lam, slack, Q
            active = new
        return None

    def vjp(self, g, Q):
        """$J^\top g$ for the projection with the active rows whose basis is `Q`:
        $g$ projected onto the null space of $[A; G_S]$."""
        w = self.N.T @ g
        return self.N @ (w - Q @ (Q.T @ w))


def _clarabel(problem: DC3Problem):
    # One parametrised cvxpy problem, so that each solve skips canonicalisation.
    import cvxpy as cp

    n = problem.n_var
    y, x, z = cp.Parameter(n), cp.Parameter(problem.n_eq), cp.Variable(n)
    cons = [problem.A @ z == x, problem.G @ z <= problem.h]
    qp = cp.Problem(cp.Minimize(cp.sum_squares(z - y)), cons)

    def solve(y_value, x_value):
        """Clarabel's projection and its active rows (slack and multiplier)."""
        y.value, x.value = y_value, x_value
        clarabel(qp, 1e-12)
        # cvxpy's multiplier of `G z <= h` for the objective ||z - y||^2 is twice
        # that of the projection's KKT system with 1/2 ||z - y||^2.
        lam = cons[1].dual_value / 2
        return z.value, (problem.h - problem.G @ z.value < WEAK_TOL) & (lam > WEAK_TOL)

    return solve


def exact_vjp(case: Case, n: int, clarabel: bool | None = None, progress=True):
    """The exact projection and VJP of the first `n` instances: `y`, `vjp`,
    `well_defined` and `summary`; `clarabel` cross-checks each one
    (default: with cvxpy and `n_var <= CLARABEL_MAX_VAR`)."""
    from tqdm.auto import tqdm

    P = case.problem
    n = min(n, len(case.Y))
    have_cvxpy = importlib.util.find_spec("cvxpy") is not None
    if clarabel is None:
        clarabel = P.n_var <= CLARABEL_MAX_VAR and have_cvxpy
    solve = _clarabel(P) if clarabel else None
    exact = ExactProjection(P.A, P.G, P.h)
    Z, VJP = np.zeros((n, P.n_var)), np.zeros((n, P.n_var))
    well_defined, n_active = np.ones(n, bool), np.zeros(n, int)
    kkt, clarabel_gap, clarabel_mismatch, fallbacks = 0.0, 0.0, 0, 0
    start = time.perf_counter()
    bar = dict(disable=not progress, file=sys.stderr, leave=False)
    for i in tqdm(range(n), desc=f"{case.size}: exact VJP", **bar):
        y, x, g = case.Y[i], case.X[i], case.V[i]
        found = exact.project(y, x)
        if found is None:
            # Rare; fall back to Clarabel's active set (solved now if needed), or,
            # without cvxpy, leave the instance out.
            fallbacks += 1
            if not have_cvxpy:
                well_defined[i] = False
                continue
            solve = solve or _clarabel(P)
            active = solve(y, x)[1]
            z, lam, Q = exact.restricted(y, x, active)
            found = z, active, lam, P.h - P.G @ z, Q
        z, active, lam, slack, Q = found
        negative = np.maximum(-np.concatenate([slack, lam]), 0).max(initial=0.0)
        kkt = max(kkt, float(np.abs(P.A @ z - x).max()), float(negative))
        weak = (np.where(active, lam, slack) < WEAK_TOL).any()
        well_defined[i] = not weak
        n_active[i] = int(active.sum())
        Z[i] = z
        VJP[i] = exact.vjp(g, Q)
        if solve is not None and clarabel:
            z_c, active_c = solve(y, x)
            clarabel_gap = max(clarabel_gap, float(np.abs(z_c - z).max()))
            clarabel_mismatch += int(not np.array_equal(active_c, active))
    summary = {
        "n_instances": n,
        "n_well_defined": int(well_defined.sum()),
        "active_rows_mean": float(n_active.mean()) if n else 0.0,
        "active_rows_max": int(n_active.max(initial=0)),
        "kkt_residual_max": kkt,
        "active_set_fallbacks": fallbacks,
        "clarabel_checked": bool(clarabel),
        "clarabel_max_abs_diff": clarabel_gap if clarabel else None,
        "clarabel_active_set_mismatches": clarabel_mismatch if clarabel else None,
        "seconds": time.perf_counter() - start,
    }
    return dict(y=Z, vjp=VJP, well_defined=well_defined, summary=summary)


def _cholesky() -> dict:
    import lineax as lx

    import pinet_eqx as pe

    return {"adjoint": pe.ImplicitAdjoint(linear_solver=lx.Cholesky())}


# Candidates to time beside the defaults (`--variants`, whose help says what
# each is), as the `pe.Projector` keywords they set; the targets are met with
# the defaults. `n_iter20` is the `train_iterations` ablation's recipe.
VARIANTS = {
    "cholesky": _cholesky,
    "dense": lambda: {"affine_form": "dense"},
    "n_iter20": lambda: {"n_iter": 20},
    "n_iter20-polish": lambda: {"n_iter": 20, "polish": True},
}


def _ours(case: Case, variant: str | None = None):
    """Our projector at its defaults, or with the keywords of `variant`:
    `(project(params, Y, X), params, settings)`."""
    import equinox as eqx
    import jax

    P = case.problem
    keywords = {} if variant is None else VARIANTS[variant]()
    proj = problems.dc3_projector(P.A, P.G, P.h, **keywords)
    params, static = eqx.partition(proj, eqx.is_array)

    def project(params, Y, X):
        return jax.vmap(eqx.combine(params, static))(Y, b=X)

    settings = dict(
        sigma=float(proj.sigma), omega=float(proj.omega), n_iter=proj.n_iter
    )
    settings.update(adjoint=repr(proj.adjoint), equilibrate=proj.equilibrated)
    note = "library defaults; no setting passed to pe.Projector"
    settings["note"] = note if variant is None else f"variant {variant!r}: {keywords!r}"
    return project, params, settings


def _reference(case: Case, dtype):
    """The reference at the paper's configuration: `(project, params, settings)`."""
    from ._common.reference import ReferenceDC3Projector

    P, cfg = case.problem, REFERENCE_CONFIG
    sigma = problems.PAPER_SIGMA.get(case.size, 1.0)
    settings = {k: cfg[k] for k in ("omega", "equilibrate", "equilibration_max_iter")}
    layer = ReferenceDC3Projector(P.A, P.G, P.h, sigma=sigma, dtype=dtype, **settings)
    fn = layer.projection(cfg["n_iter"], cfg["n_iter_bwd"])
    return (lambda params, Y, X: fn(Y, X)), None, {"sigma": sigma, **cfg}


def _timed(fn, args, repeats: int) -> tuple[object, dict]:
    """The first call's seconds as `compile_s`, then `time_calls` statistics."""
    stats = time_first({"fn": lambda: fn(*args)}, repeats)["fn"]
    return fn(*args), {"compile_s": stats.pop("first_s"), **stats}


def measure(project, params, case: Case, dtype, repeats: int):
    """Time `project(params, Y, X)`'s forward and forward+backward on `case` in
    `dtype`: `(times, y, grad)`, `times` holding `fwd`, `fwd_bwd` and the
    warnings raised, counted by message, and the outputs in float64."""
    import jax
    import jax.numpy as jnp

    Y, X, V = (jnp.asarray(a, dtype) for a in (case.Y, case.X, case.V))

    def loss(Y, params, X, V):
        return jnp.sum(V * project(params, Y, X))

    forward = jax.jit(project)
    step = jax.jit(jax.value_and_grad(loss))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y, fwd = _timed(forward, (params, Y, X), repeats)
        (_, grad), fwd_bwd = _timed(step, (Y, params, X, V), repeats)
    counts = Counter(f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught)
    if y.dtype != dtype or grad.dtype != dtype:
        raise RuntimeError(
            f"asked for {dtype.__name__}, the layer returned {y.dtype} and a "
            f"gradient of {grad.dtype}"
        )
    times = {"fwd": fwd, "fwd_bwd": fwd_bwd, "warnings": dict(counts)}
    return times, np.asarray(y, np.float64), np.asarray(grad, np.float64)


def accuracy(y, grad, case: Case, truth: dict) -> dict:
    r"""Errors against the ground truth: `grad_rel_err_{worst,median}`
    ($\|g - g^\star\| / \|g^\star\|$), `y_err_max` and the batch's `cv_max`."""
    n = len(truth["y"])
    ok = truth["well_defined"]
    g, g_true = grad[:n][ok], truth["vjp"][ok]
    rel = np.linalg.norm(g - g_true, axis=1) / np.linalg.norm(g_true, axis=1)
    P = case.problem
    cv = dc3_violation(y, case.X, P.A, P.G, P.h)
    return {
        "grad_rel_err_worst": float(rel.max()) if rel.size else float("nan"),
        "grad_rel_err_median": float(np.median(rel)) if rel.size else float("nan"),
        "grad_checked": int(ok.sum()),
        "y_err_max": float(np.abs(y[:n][ok] - truth["y"][ok]).max()),
        "cv_max": float(cv.max()),
    }


def run_case(case: Case, truth: dict, dtype_name: str, repeats, with_ref, variants=()):
    """Both layers and any `variants` of ours on one case and dtype: an entry
    per layer (`reference` `None` without it) and the `ratio` ours/reference."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype_name).type
    entry = {"size": case.size, "dtype": dtype_name, "batch": len(case.Y)}
    layers = [("ours", _ours)]
    layers += [(f"ours[{v}]", lambda c, v=v: _ours(c, v)) for v in variants]
    if with_ref:
        layers.append(("reference", lambda c: _reference(c, dtype)))
    for name, build in layers:
        # With x64 on, the reference promotes float32 inputs to float64; a float32
        # training run would have x64 off, so the float32 runs do too.
        with jax.enable_x64(dtype_name == "float64"):
            project, params, settings = build(case)
            log(f"{case.size} {dtype_name} {name}: compiling and timing")
            times, y, grad = measure(project, params, case, dtype, repeats)
        warned = times.pop("warnings")
        errors = accuracy(y, grad, case, truth)
        entry[name] = {"settings": settings, **times, **errors, "warnings": warned}
        log(f"  {_row(name, entry[name])}")
    entry.setdefault("reference", None)
    entry["ratio"] = _ratio(entry, "ours")
    return entry


def _ratio(entry: dict, name: str) -> dict:
    """Layer `name` / the reference, median times of `fwd` and `fwd_bwd` (`None`
    without the reference)."""
    ref = entry["reference"]
    return {
        key: (entry[name][key]["median"] / ref[key]["median"] if ref else None)
        for key in ("fwd", "fwd_bwd")
    }


def _ms(t: dict) -> str:
    return fmt(t, ".3g", scale=1e3)


def _row(name: str, r: dict) -> str:
    return (
        f"{name} | {r['fwd']['compile_s']:.1f} | {_ms(r['fwd'])} | "
        f"{r['fwd_bwd']['compile_s']:.1f} | {_ms(r['fwd_bwd'])} | "
        f"{r['grad_rel_err_worst']:.1e} / {r['grad_rel_err_median']:.1e} | "
        f"{r['y_err_max']:.1e} | {r['cv_max']:.1e}"
    )


def _layers(entry: dict) -> list[str]:
    """The layers timed in one result entry: ours, its variants, the reference."""
    return ["ours", *(k for k in entry if k.startswith("ours[")), "reference"]


def markdown(record: dict) -> str:
    """The results (`main`'s record) as Markdown: per layer, then the ratios
    ours/reference."""
    m, results = record["machine"], record["results"]
    columns = "size|dtype|batch|layer|compile fwd|fwd|compile fwd+bwd|fwd+bwd|"
    columns += "grad err worst / median|y err|CV"
    rows = [
        [e["size"], e["dtype"], e["batch"], *_row(name, e[name]).split(" | ")]
        for e in results
        for name in _layers(e)
        if e[name] is not None
    ]
    lines = [
        f"Training step, {m['device_kind']} ({m['cpu']}), jax {m['jax']}, matmul "
        f"precision {m['matmul_precision']}, commit {m['git']}.",
        "Times in ms: median [lower quartile, upper quartile] of "
        f"{record['settings']['repeats']} calls; compile = first call in s. "
        "Gradient error: ||g - g*|| / ||g*|| (worst / median) against the exact "
        "float64 VJP; y err: max |y - y*|; CV: max violation over the batch.",
        "",
        records.table(columns.split("|"), rows),
    ]
    ratios = [
        [e["size"], e["dtype"], name, f"{r['fwd']:.2f}", f"{r['fwd_bwd']:.2f}"]
        for e in results
        if e["reference"] is not None
        for name in _layers(e)[:-1]
        for r in [_ratio(e, name)]
    ]
    if ratios:
        columns = ["size", "dtype", "layer", "ours/reference fwd"]
        lines += ["", records.table([*columns, "ours/reference fwd+bwd"], ratios)]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--sizes", nargs="+", choices=tuple(BATCH))
    add("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    add("--repeats", type=int, help="default 10")
    checked = "instances checked against the exact VJP (default 64)"
    add("--n-grad-check", type=int, help=checked)
    add(
        "--batch", type=int, help="override the batch (default: small 2048, large 1024)"
    )
    instances = "folder of the paper's DC3 .npz files, used for the small problem"
    add("--instances", type=pathlib.Path, help=instances)
    add("--out", type=pathlib.Path, default=DEFAULT_OUT)
    add("--no-reference", action="store_true", help="time ours only")
    quick = "the tiny problem, 3 repeats, 8 checked instances (smoke test)"
    add("--quick", action="store_true", help=quick)
    add(
        "--variants",
        nargs="+",
        choices=tuple(VARIANTS),
        default=[],
        help="also time these variants of ours (cholesky: a direct solve in the "
        "backward pass instead of the default conjugate gradients; dense: the "
        "affine projection as one (d + m)^2 matrix product per iteration "
        "instead of two thin ones; n_iter20: 20 training iterations instead of "
        "50, whose outputs are less accurate: see the y err and CV columns; "
        "n_iter20-polish: the same, polished in training mode too)",
    )
    add("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print the table, write the JSON record to `--out` and
    return it."""
    import jax

    jax.config.update("jax_enable_x64", True)
    args = _parser().parse_args(argv)
    quick = args.quick
    sizes = args.sizes or (["tiny"] if quick else ["small", "large"])
    repeats = args.repeats or (3 if quick else 10)
    n_check = args.n_grad_check if args.n_grad_check is not None else 8 if quick else 64
    with_ref = not args.no_reference and reference_available()
    if not with_ref and not args.no_reference:
        log("The reference (pinet-hcnn) is not installed: timing ours only.")
    command = command_line(PROG, argv)
    m = {**machine(devices=True), "command": command}
    log(f"{command}\n{m['device_kind']}, jax {m['jax']}")
    record = {
        "machine": m,
        "settings": {
            "sizes": sizes,
            "dtypes": args.dtypes,
            "repeats": repeats,
            "n_grad_check": n_check,
            "reference": with_ref,
            "variants": args.variants,
            "raw_inputs": f"Y = A^+ x + {RAW_NOISE} N(0, I), rounded to float32",
            "loss": "sum(V * project(Y, X)), V ~ N(0, I); gradient w.r.t. Y",
        },
        "ground_truth": {},
        "results": [],
    }
    for size in sizes:
        if args.instances is not None and size != "small":
            log(f"--instances holds the small problem; {size} is generated.")
        case = make_case(size, args.batch, args.instances)
        truth = exact_vjp(case, n_check, progress=not args.quiet)
        record["ground_truth"][size] = {**truth["summary"], "source": case.source}
        log(f"{size}: ground truth {json.dumps(truth['summary'])}")
        for dtype in args.dtypes:
            entry = run_case(case, truth, dtype, repeats, with_ref, args.variants)
            record["results"].append(entry)
    m["finished"] = now()
    print(markdown(record))
    log(f"wrote {save(args.out, record, indent=2)}")
    return record


if __name__ == "__main__":
    main()
