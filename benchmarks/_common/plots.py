"""The figures' shared frame: a `Figure` on the Agg canvas (outside `pyplot`) and
the tail every figure ends with."""

from __future__ import annotations

import pathlib


def new(width: float, height: float, nrows: int = 1, ncols: int = 1, **kw):
    """`(fig, axes)`: a figure and its `nrows x ncols` grid of axes (an array,
    `squeeze=False`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), **kw)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def finish(
    fig,
    ax,
    path: pathlib.Path,
    *,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    log: str = "",
    legend: float | None = 7,
    dpi: int = 120,
) -> pathlib.Path:
    """Labels `ax` (log scale on the axes in `log`), draws its legend (font size
    `legend`, or none), lays the figure out and saves it to `path`."""
    for axis in log:  # "x", "y" or both
        getattr(ax, f"set_{axis}scale")("log")
    ax.set(xlabel=xlabel, ylabel=ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    if legend:
        ax.legend(fontsize=legend)
    return save(fig, path, dpi)


def save(fig, path: pathlib.Path, dpi: int = 120) -> pathlib.Path:
    """Lays `fig` out and saves it to `path`."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return pathlib.Path(path)
