"""Shared figure style for the study notebooks, and :func:`save_and_show` for figures a study module draws."""

from __future__ import annotations

from typing import Any

from cycler import cycler

__all__ = ["apply_style", "label", "save_and_show", "STYLE"]

# A colour-blind-safe cycle (Okabe & Ito 2008), then greys.
_COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]

STYLE: dict[str, Any] = {
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],  # ships with matplotlib: same glyphs on every machine
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.grid.which": "major",
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "axes.prop_cycle": cycler(color=_COLORS),
    "lines.linewidth": 1.5,
    "lines.markersize": 4,
    "figure.dpi": 100,
    "figure.constrained_layout.use": True,
    "savefig.dpi": 150,
    "image.cmap": "viridis",
    "svg.hashsalt": "trainscale",  # deterministic ids if a figure is ever saved as SVG
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
}


def apply_style() -> None:
    """Apply the trainscale figure style to matplotlib's global rcParams."""
    import matplotlib as mpl

    mpl.rcParams.update(STYLE)


def label(da, default: str | None = None) -> str:
    """Axis label ``"long_name [units]"`` from a DataArray's attrs.

    Falls back to the variable's name (or ``default``) when ``long_name`` is missing, and omits
    the brackets when ``units`` is missing, empty or dimensionless (``"1"``).
    """
    attrs = getattr(da, "attrs", {}) or {}
    name = attrs.get("long_name") or default or getattr(da, "name", None) or ""
    units = attrs.get("units")
    if units in (None, "", "1"):
        return str(name)
    return f"{name} [{units}]"


def save_and_show(fig, path):
    """Save ``fig`` with :func:`trainscale.common.io.save_figure` (byte-reproducible, closed), printing each problem
    :func:`trainscale.common.figurecheck.figure_problems` finds in it as drawn for the file, and show the saved PNG in
    a notebook."""
    from pathlib import Path

    from . import figurecheck
    from . import io as tsio

    def report(drawn):
        for problem in figurecheck.figure_problems(drawn, Path(path).name, drawn=True):
            print(f"figure check: {problem}")

    path = tsio.save_figure(fig, path, after_draw=report)
    try:
        from IPython.display import Image, display
    except ImportError:  # not in IPython: the file is the figure
        return path
    display(Image(filename=str(path)))
    return path
