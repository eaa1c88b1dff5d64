"""The paper's figures (Sec. 3.2 Fig. 4, App. B.3 Figs. 7-9) as PNGs."""

from __future__ import annotations

import numpy as np

from ._objectives import Coverage, coverage_image, ishigami
from ._problem import Problem, split


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _workspace(ax, problem: Problem, pad: float = 0.3):
    b = problem.p_max
    ax.plot([-b, b, b, -b, -b], [-b, -b, b, b, -b], "r--", lw=1)
    ax.set_xlim(-b - pad, b + pad)
    ax.set_ylim(-b - pad, b + pad)
    ax.set_aspect("equal")


def _fleet(ax, Y, start, goal, problem: Problem):
    """One fleet's paths, a colour per vehicle, starts as circles, goals as
    crosses."""
    p, _, _ = split(np.asarray(Y), problem)
    colours = _pyplot().get_cmap("viridis")(np.linspace(0, 1, len(p)))
    for k, path in enumerate(p):
        ax.plot(path[:, 0], path[:, 1], "-", color=colours[k], lw=1.2, alpha=0.9)
        ax.plot(path[:, 0], path[:, 1], ".", color=colours[k], ms=2)
    ax.plot(start[:, 0], start[:, 1], "o", mfc="none", mec="k", ms=6)
    ax.plot(goal[:, 0], goal[:, 1], "x", color="k", ms=6)


def plot_trajectories(path, problem: Problem, starts, goals, runs, contexts=(0,)):
    """Trajectories of several trained planners side by side.

    **Arguments:**

    - `path`: the PNG to write.
    - `problem`: the `Problem`.
    - `starts`, `goals`: the test contexts, `(n, N, 2)`.
    - `runs`: `{title: Y}` with `Y` of shape `(n, N, 6T + 4)`, one column each
        (e.g. the three weightings).
    - `contexts`: the test contexts to show, one row each.
    """
    plt = _pyplot()
    rows, cols = len(contexts), len(runs)
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.6 * cols, 3.6 * rows), squeeze=False
    )
    for r, i in enumerate(contexts):
        for c, (title, Y) in enumerate(runs.items()):
            ax = axes[r, c]
            _workspace(ax, problem)
            _fleet(ax, Y[i], starts[i], goals[i], problem)
            if r == 0:
                ax.set_title(title, fontsize=10)
            ax.tick_params(labelsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.text(
        0.5,
        0.01,
        "○ start, × goal, one colour per vehicle; red dashed: the workspace",
        ha="center",
        fontsize=9,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_preference(path, problem: Problem, Y=None, start=None, goal=None):
    """The preference landscape $\\psi$ over (a margin around) the workspace, the
    workspace as a red dashed box, and optionally one fleet's paths on top."""
    plt = _pyplot()
    b = 1.1 * problem.p_max
    grid = np.linspace(-b, b, 301)
    P = np.stack(np.meshgrid(grid, grid), axis=-1)
    psi = np.asarray(ishigami(P))
    fig, ax = plt.subplots(figsize=(4.6, 4))
    im = ax.imshow(
        psi, extent=(-b, b, -b, b), origin="lower", cmap="magma", aspect="equal"
    )
    fig.colorbar(im, ax=ax, label=r"$\psi(p)$")
    if Y is not None:
        _fleet(ax, Y, start, goal, problem)
    _workspace(ax, problem, pad=b - problem.p_max)
    ax.set_title("Preference landscape (scaled Ishigami)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_coverage(path, problem: Problem, Y, start, goal, settings=Coverage()):
    """One fleet's coverage image $I$ (left) next to its trajectories (right)."""
    plt = _pyplot()
    image = np.asarray(coverage_image(np.asarray(Y), problem, settings))
    fig, axes = plt.subplots(1, 2, figsize=(8.2, 4))
    b = problem.p_max
    # Row 0 of the image is the top of the workspace, as imshow's default.
    im = axes[0].imshow(
        image, extent=(-b, b, -b, b), cmap="gray", vmin=0, vmax=settings.clip
    )
    fig.colorbar(im, ax=axes[0], label="I")
    score = -image.mean() / settings.clip
    axes[0].set_title(f"Coverage image (coverage = {score:.3f})", fontsize=10)
    _workspace(axes[1], problem)
    _fleet(axes[1], Y, start, goal, problem)
    axes[1].set_title("Trajectories", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_context_maps(
    path, problem: Problem, maps, Y, starts, goals, map_ids, per_map: int = 4,
    reference=None,
):  # fmt: skip
    """Contextual coverage: for each map, its Gaussian and the planned paths.

    One panel per map, with up to `per_map` test trajectories of contexts shown
    that map over the map itself, so one sees whether the paths go for the
    Gaussian's peak.

    **Arguments:**

    - `path`: the PNG to write.
    - `problem`: the `Problem` (one vehicle).
    - `maps`: the distinct maps, `(k, res, res)`, row 0 at $y = -p_{max}$.
    - `Y`: the planned trajectories, `(n, 1, 6T + 4)`.
    - `starts`, `goals`: `(n, 1, 2)`.
    - `map_ids`: `(n,)`, which map each context shows.
    - `per_map`: trajectories per panel.
    - `reference`: optional trajectories `(n, 1, 6T + 4)` drawn dashed (e.g.
        the effort-optimal straight paths, which ignore the map).
    """
    plt = _pyplot()
    maps = np.asarray(maps)
    k = len(maps)
    fig, axes = plt.subplots(1, k, figsize=(3.4 * k, 3.6), squeeze=False)
    b = problem.p_max
    for j, ax in enumerate(axes[0]):
        ax.imshow(
            maps[j], origin="lower", extent=(-b, b, -b, b), cmap="Greens",
            vmin=0.0, vmax=1.0,
        )  # fmt: skip
        _workspace(ax, problem)
        for i in np.flatnonzero(np.asarray(map_ids) == j)[:per_map]:
            if reference is not None:
                p_ref, _, _ = split(np.asarray(reference[i]), problem)
                ax.plot(p_ref[0, :, 0], p_ref[0, :, 1], "--", color="0.5", lw=0.8)
            _fleet(ax, Y[i], starts[i], goals[i], problem)
        ax.set_title(f"map {j}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(
        f"Contextual coverage, H = {problem.horizon}, res = {maps.shape[-1]}"
        + (" (dashed: effort-optimal, map-blind)" if reference is not None else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
