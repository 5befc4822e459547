"""Is a figure drawn honestly from its data? Checks on a drawn matplotlib Figure, one line per problem.

:func:`figure_problems` lays the figure out on an Agg canvas in memory (matplotlib's draw without rasterizing) and
inspects what its axes hold:

* **values**: no infinite or absurd (``|v| > ABSURD``) value handed to an axes (a diverged run drawn as 7.7e304
  empties its panel), and no series that draws nothing (all NaN);
* **limits**: every finite plotted value lies inside the axis limits (nothing cut off: a bar axis starting at
  0.5 hides the bars' base) and the limits run at most ``LINEAR_MARGIN`` times the data's span (linear axes) or
  ``LOG_MARGIN_DECADES`` decades (log axes) beyond the data on either side (no 1e-13 floor under data near
  1e-2), except on a linear axis whose data are one value up to rounding (matplotlib pads a constant by
  5%); an inverted axis (limits in falling order) is a problem unless it was asked for (:func:`invert_on_purpose`);
* **legends**: in a figure with a legend, every drawn series (line, marker set, bar set, band, reference line) is
  labelled and its label is an entry of a legend that covers its axes, and every entry names a drawn series of
  the axes it covers (no "tau=1" entry over a panel that draws tau=15); two entries of one legend never look
  alike (same colour, line style and marker);
* **text**: every visible text (tick labels, axis labels, titles, legends, annotations) lies inside the figure
  (no clipped label).

:func:`render_png` gives the bytes :func:`trainscale.common.io.save_figure` would write, and :func:`render_rgba` their
pixels (without encoding them), so that a caller can also check that a committed PNG is what its dataset draws
(:func:`png_pixels_differ`).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable

import numpy as np

__all__ = ["figure_problems", "render_png", "render_rgba", "png_pixels_differ", "invert_on_purpose", "guide", "ABSURD",
           "LINEAR_MARGIN", "LOG_MARGIN_DECADES"]

#: a value larger than this in magnitude is a diverged run or a sentinel, never a quantity to draw
ABSURD = 1e100
#: linear axes: the limits may run this multiple of the data's span beyond the data on each side (the data fill
#: at least a third of the axis)
LINEAR_MARGIN = 1.0
#: log axes: the limits may run this many decades beyond the data on each side
LOG_MARGIN_DECADES = 1.0
_PIXEL_TOLERANCE = 1.0
_GUIDE = "trainscale-guide"
#: the IEND chunk that ends every PNG (length 0, type, CRC)
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def render_png(fig, dpi: int = 150) -> bytes:
    """The PNG bytes of ``fig`` as :func:`trainscale.common.io.save_figure` writes them (without closing it)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()


def render_rgba(fig, dpi: int = 150) -> tuple[tuple[int, int], bytes]:
    """``(width, height)`` in pixels and the RGBA pixels of ``fig`` as :func:`render_png` draws them (the same
    ``savefig`` and layout passes, without the PNG encoding: about 8% of verify's redrawing of the 79 figures,
    51.9 against 47.5 CPU-s, measured 2026-12-07)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="raw", dpi=dpi)
    shown_dpi = fig.dpi
    fig.set_dpi(dpi)
    try:
        width, height = fig.canvas.get_width_height(physical=True)  # the size of the canvas savefig drew
    finally:
        fig.set_dpi(shown_dpi)
    rgba = buffer.getvalue()
    if len(rgba) != 4 * width * height:
        raise RuntimeError(f"render_rgba: {len(rgba)} bytes drawn, not 4 x {width} x {height} pixels")
    return (width, height), rgba


def png_pixels_differ(path, size: tuple[int, int], rgba: bytes, dpi: int = 150) -> str | None:
    """Why the PNG at ``path`` is not the picture ``(size, rgba)`` of :func:`render_rgba` at ``dpi``, as a phrase,
    or None when it is: same size, resolution and pixels (a PNG holds its pixels losslessly), no metadata but the
    resolution (as :func:`trainscale.common.io.save_figure` writes) and nothing after the PNG's end."""
    from PIL import Image

    if not Path(path).read_bytes().endswith(_PNG_END):
        return "bytes after the PNG's end, or no end"
    with Image.open(path) as image:
        if image.format != "PNG" or image.mode != "RGBA":
            return f"a {image.format} {image.mode} image, not an RGBA PNG"
        if set(image.info) - {"dpi"}:
            return f"metadata {sorted(set(image.info) - {'dpi'})} that save_figure does not write"
        if image.size != tuple(size):
            return f"{image.size[0]}x{image.size[1]} pixels, drawn {size[0]}x{size[1]}"
        saved_dpi = image.info.get("dpi", (None,))[0]
        if saved_dpi is None or abs(saved_dpi - dpi) > 0.5:
            return f"saved at {saved_dpi} dpi, drawn at {dpi}"
        if image.tobytes() != rgba:
            return "other pixels"
    return None


def invert_on_purpose(ax, axis: str = "y") -> None:
    """Invert ``ax``'s ``axis`` ("x" or "y") and record that it was meant (a table read top to bottom), so that
    :func:`figure_problems` does not report it."""
    (ax.invert_xaxis if axis == "x" else ax.invert_yaxis)()
    ax._trainscale_inverted = set(getattr(ax, "_trainscale_inverted", ())) | {axis}


def guide(*artists):
    """Mark artists as guides (group separators, a reference line the axis label explains), not data series: a
    legend need not name them. Returns the first artist."""
    for artist in artists:
        artist.set_gid(_GUIDE)
    return artists[0] if artists else None


def figure_problems(fig, name: str = "figure", dpi: int = 150, drawn: bool = False) -> list[str]:
    """Every problem of a drawn figure, one line each, prefixed with ``name`` and the panel's title; laid out at the
    ``dpi`` it is saved at (text grows a little faster than the figure with the dpi). ``drawn``: the figure was just
    drawn at that dpi on its Agg canvas (:func:`render_png`, as :func:`trainscale.common.io.save_figure` draws it),
    so it is read as drawn, not laid out again (a constrained layout moves a little at each pass)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
        drawn = False
    shown_dpi = fig.dpi
    fig.set_dpi(dpi)
    try:
        if not drawn:
            fig.draw_without_rendering()  # the layout and every artist's place, without rasterizing
        return _problems(fig, fig.canvas.get_renderer(), name)
    finally:
        fig.set_dpi(shown_dpi)


def _problems(fig, renderer, name) -> list[str]:
    problems = []
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.name == "rectilinear"]
    for k, ax in enumerate(axes):
        where = f"{name} panel {k + 1}" + (f" ({ax.get_title()!r})" if ax.get_title() else "")
        series = _series(ax)
        problems += _value_problems(series, where)
        problems += _limit_problems(ax, series, where)
    problems += _legend_problems(fig, axes, name)
    problems += _text_problems(fig, renderer, name)
    return problems


# ---------------------------------------------------------------------------------------------- what is drawn

class _Series:
    """One drawn thing: its label, its x and y values in data coordinates (None where the coordinate is in
    axes units, as for a reference line), and a look (colour, line style, marker) for legend comparisons."""

    def __init__(self, artist, label, x, y):
        self.artist, self.label, self.x, self.y = artist, label, x, y


def _coords(ax, transform):
    """Which coordinates of an artist are data: (x is data, y is data)."""
    if transform is ax.transData:
        return True, True
    if transform is ax.get_xaxis_transform():
        return True, False
    if transform is ax.get_yaxis_transform():
        return False, True
    return False, False


def _container_labels(ax) -> dict:
    """Bars and error bars carry their label on the container, not on each patch."""
    labels = {}
    for container in ax.containers:
        for child in container.get_children():
            labels[id(child)] = container.get_label()
    return labels


def _series(ax) -> list[_Series]:
    from matplotlib.collections import Collection, PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    by_container = _container_labels(ax)
    out = []
    for artist in [*ax.lines, *ax.collections, *ax.patches]:
        if not artist.get_visible():
            continue
        xs, ys = _coords(ax, artist.get_transform())
        if isinstance(artist, Line2D):
            points = np.asarray(artist.get_xydata(), dtype=float).reshape(-1, 2)
        elif isinstance(artist, PathCollection):  # a scatter: the markers' positions
            points = np.asarray(artist.get_offsets(), dtype=float).reshape(-1, 2)
            xs, ys = _coords(ax, artist.get_offset_transform())
        elif isinstance(artist, Collection):  # a band (fill_between), segments (vlines): their vertices
            points = _collection_points(artist)
        elif isinstance(artist, Patch):
            points = _patch_points(artist)
            xs, ys = _coords(ax, artist.get_data_transform())
        else:
            continue
        label = by_container.get(id(artist), artist.get_label())
        out.append(_Series(artist, label, points[:, 0] if xs else None, points[:, 1] if ys else None))
    return out


def _collection_points(artist) -> np.ndarray:
    vertices = [np.asarray(p.vertices, dtype=float).reshape(-1, 2) for p in artist.get_paths()]
    return np.concatenate(vertices) if vertices else np.empty((0, 2))


def _patch_points(artist) -> np.ndarray:
    from matplotlib.patches import Rectangle

    if isinstance(artist, Rectangle):
        x, y, w, h = artist.get_x(), artist.get_y(), artist.get_width(), artist.get_height()
        return np.array([[x, y], [x + w, y + h]], dtype=float)
    path = artist.get_path().transformed(artist.get_patch_transform())
    return np.asarray(path.vertices, dtype=float)


# ---------------------------------------------------------------------------------------------- the checks

def _value_problems(series: list[_Series], where: str) -> list[str]:
    problems = []
    for s in series:
        values = np.concatenate([v for v in (s.x, s.y) if v is not None] or [np.empty(0)])
        bad = values[np.isinf(values) | (np.abs(np.nan_to_num(values)) > ABSURD)]
        if bad.size:
            problems.append(f"{where}: series {s.label!r} plots {bad.size} diverged value(s) "
                            f"(e.g. {bad[0]:.3g}); mask them and say so")
        elif any(v is not None and v.size and not np.isfinite(v).any() for v in (s.x, s.y)):
            problems.append(f"{where}: series {s.label!r} draws nothing (every value is NaN)")
    return problems


def _data_range(series: list[_Series], axis: str, log: bool):
    values = [getattr(s, axis) for s in series if getattr(s, axis) is not None]
    if not values:
        return None
    values = np.concatenate(values)
    values = values[np.isfinite(values) & (np.abs(values) <= ABSURD)]
    if log:
        values = values[values > 0]
    return (float(values.min()), float(values.max())) if values.size else None


def _limit_problems(ax, series, where) -> list[str]:
    problems = []
    for axis, limits, scale in (("x", ax.get_xlim(), ax.get_xscale()), ("y", ax.get_ylim(), ax.get_yscale())):
        if limits[0] > limits[1] and axis not in getattr(ax, "_trainscale_inverted", ()):
            problems.append(f"{where}: {axis}-axis runs from {limits[0]:.3g} down to {limits[1]:.3g} (inverted)")
        lo, hi = sorted(limits)
        log = scale == "log"
        data = _data_range(series, axis, log)
        if data is None:
            continue
        problems += _range_problem(where, axis, (lo, hi), data, log)
    return problems


def _range_problem(where, axis, limits, data, log) -> list[str]:
    lo, hi = limits
    dlo, dhi = data
    f = np.log10 if log else (lambda v: v)
    span = f(dhi) - f(dlo)
    slack = 1e-9 * max(abs(f(hi)), abs(f(lo)), 1.0) + 1e-6 * span
    if f(dlo) < f(lo) - slack or f(dhi) > f(hi) + slack:
        return [f"{where}: {axis}-axis shows {lo:.3g}..{hi:.3g} but the data run {dlo:.3g}..{dhi:.3g} "
                f"(data cut off)"]
    margin = LOG_MARGIN_DECADES if log else LINEAR_MARGIN * span
    if span > 1e-9 * max(abs(f(dlo)), abs(f(dhi)), 1.0) or log:  # a constant (up to rounding) has no span
        if f(lo) < f(dlo) - margin - slack or f(hi) > f(dhi) + margin + slack:
            unit = f"{LOG_MARGIN_DECADES:g} decade(s)" if log else f"{LINEAR_MARGIN:g} of the data's span"
            return [f"{where}: {axis}-axis shows {lo:.3g}..{hi:.3g}, more than {unit} beyond the data "
                    f"{dlo:.3g}..{dhi:.3g}"]
    return []


def _legends(fig, axes) -> list[tuple[object, list]]:
    """Each legend with the axes whose series it names (its own axes, or all for a figure legend)."""
    out = [(ax.get_legend(), [ax]) for ax in axes if ax.get_legend() is not None]
    return out + [(legend, list(axes)) for legend in fig.legends]


def _labelled(label) -> bool:
    return bool(label) and not str(label).startswith("_")


def _legend_problems(fig, axes, name) -> list[str]:
    legends = _legends(fig, axes)
    if not legends:
        return []
    problems = []
    named = {id(ax): [] for ax in axes}  # (label, look) of the entries of the legends covering each axes
    for legend, covered in legends:
        entries = [(t.get_text(), _look(h)) for t, h in zip(legend.get_texts(), legend.legend_handles)]
        drawn = [s for ax in covered for s in _series(ax)]
        problems += [f"{name}: legend entry {label!r} names no series drawn in the panel(s) it covers"
                     for label, look in entries if not any(_matches(s, label, look) for s in drawn)]
        problems += _lookalike_problems(entries, name)
        for ax in covered:
            named[id(ax)] += entries
    for k, ax in enumerate(axes):
        for s in _series(ax):
            if s.artist.get_gid() == _GUIDE or any(_matches(s, label, look) for label, look in named[id(ax)]):
                continue
            what = f"series {s.label!r}" if _labelled(s.label) else f"an unlabelled {type(s.artist).__name__}"
            problems.append(f"{name} panel {k + 1}: {what} is drawn but no legend covering it names it "
                            f"(label it, or mark it a guide)")
    return sorted(set(problems), key=problems.index)


def _matches(series: _Series, label: str, look: tuple) -> bool:
    """A legend entry names a series by its label, or, for a key of proxy handles (colours of a category), an
    unlabelled series by its look."""
    if _labelled(series.label):
        return series.label == label
    return _look(series.artist)[1:] == look[1:] if look[0] == "Line2D" else bool(
        set(_colours(series.artist)) & set(_colours_of_look(look)))


def _colours(artist) -> list[str]:
    from matplotlib.colors import to_hex

    out = []
    for get in ("get_color", "get_facecolor", "get_edgecolor"):
        value = getattr(artist, get, lambda: None)()
        if value is None or isinstance(value, str) and value == "none" or not np.size(value):
            continue
        rows = [value] if isinstance(value, str) or np.ndim(value) == 1 else list(value)
        out += [to_hex(c) for c in rows[:1]]
    return out


def _colours_of_look(look) -> list[str]:
    return [c for c in look[1:] if isinstance(c, str) and c.startswith("#")]


def _look(handle) -> tuple:
    """What a reader tells a series by: its kind and colours (and line style and marker for a line)."""
    from matplotlib.colors import to_hex
    from matplotlib.lines import Line2D

    if isinstance(handle, Line2D):
        face = handle.get_markerfacecolor()
        return ("Line2D", to_hex(handle.get_color()), str(handle.get_linestyle()), str(handle.get_marker()),
                "none" if isinstance(face, str) and face == "none" else to_hex(face))
    return ("Patch", *_colours(handle))


def _lookalike_problems(entries, name) -> list[str]:
    seen, problems = {}, []
    for label, look in entries:
        if look in seen:
            problems.append(f"{name}: legend entries {seen[look]!r} and {label!r} look alike (colour {look[1]})")
        seen.setdefault(look, label)
    return problems


def _drawn_texts(fig) -> Iterable:
    """The visible, non-empty texts matplotlib draws: tick labels only of the ticks inside the view."""
    from matplotlib.text import Text

    tick_labels = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            tick_labels.update(id(t) for tick in axis.get_major_ticks() + axis.get_minor_ticks()
                               for t in (tick.label1, tick.label2))
            drawn = axis._update_ticks() if ax.get_visible() else []  # the ticks inside the view
            tick_labels.difference_update(id(t) for tick in drawn for t in (tick.label1, tick.label2))
    return (t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in tick_labels)


def _text_problems(fig, renderer, name) -> list[str]:
    width, height = fig.bbox.width, fig.bbox.height
    problems = []
    for text in _drawn_texts(fig):
        box = text.get_window_extent(renderer)
        if (box.x0 < -_PIXEL_TOLERANCE or box.y0 < -_PIXEL_TOLERANCE or box.x1 > width + _PIXEL_TOLERANCE
                or box.y1 > height + _PIXEL_TOLERANCE):
            problems.append(f"{name}: text {text.get_text()!r} runs outside the figure (clipped)")
    return problems
