"""The studies' figures, interactive (the second part of ``notebooks/explore.ipynb``): :func:`interactive_figure`
draws a study's main figure (the first figure it declares in ``OUTPUTS``; :data:`MAIN_FIGURES` says how) from its
committed dataset in ``figures/<study>/``, with hover and zoom; :func:`trace_expected` reads back what a trace
draws, :func:`log_ticks` labels a log axis with full values. Plain functions that take values and return
figures, testable without a browser. Also the plotly style the explorer's charts share (:data:`PALETTE`,
:data:`LEGEND_BELOW`, text wrapped to a width); the model's two charts and the widgets are
:mod:`trainscale.interface.explore`.

Plotting library: plotly (https://plotly.com/python/, MIT, maintained by Plotly Inc.). A plotly figure is a
JSON document rendered by plotly.js: it works in JupyterLab (the ``jupyterlab-plotly`` renderer ships inside
the plotly wheel, no extension to build), in a static HTML page or an exported notebook without a server or a
kernel (``fig.write_html(path)``: one file holding plotly.js and the data), and its traces hold plain
arrays, so a test can compare a figure's data with the dataset directly. hvplot/panel would need a Bokeh
server or a live kernel for most of their interactivity and pull in a larger stack.

This module reads the studies' datasets through ``trainscale.common``; it never imports ``trainscale.kernels``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["FigureSpec", "MAIN_FIGURES", "NoInteractiveFigure", "interactive_figure", "interactive_figures",
           "find_figures_dir", "trace_expected", "log_ticks"]


# --------------------------------------------------------------------------- the plotly style the explorer shares
# the colour-blind-safe cycle of trainscale.common.plotting (Okabe & Ito 2008), then greys
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000", "#999999")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def _wrap(text: str, chars: int) -> str:
    """``text`` broken at spaces into lines of at most ``chars`` characters, joined by ``<br>`` (plotly's line
    break); a word longer than that stays whole. Existing ``<br>`` breaks are kept."""
    import textwrap

    return "<br>".join(line for part in str(text).split("<br>")
                       for line in (textwrap.wrap(part, max(int(chars), 8), break_long_words=False,
                                                  break_on_hyphens=False) or [""]))


# the legend under the chart, laid out in rows: a chart keeps the notebook's full width for its data however
# many entries there are ("container" keeps it below the axis titles and pushes the bottom margin to fit it)
LEGEND_BELOW = dict(orientation="h", yref="container", yanchor="bottom", y=0.0, x=0.0, xanchor="left",
                    font=dict(size=10))


# --------------------------------------------------------------------------- the studies' figures
class NoInteractiveFigure(LookupError):
    """A study has no interactive main figure here (unknown study, no committed dataset); the message
    says which and why."""


@dataclass(frozen=True)
class FigureSpec:
    """How to draw a study's main figure from one of its datasets.

    ``y``: the variables drawn; ``x``: a coordinate or variable (selected like ``y``); ``color``, ``dash``:
    one trace per value (a dimension, or a coordinate along one: e.g. validation's ``dataset``);
    ``facet_col``/``facet_row``: one panel per value; ``sel``: fixed selections; ``reduce``: dimensions
    reduced away (``"geomean"`` or ``"mean"``); ``kind``: ``line``, ``markers``, ``bar`` (grouped),
    ``stack`` (stacked bars), ``parity`` (markers with a y = x line) or ``gantt``."""

    dataset: str
    figure: str
    y: tuple[str, ...]
    x: str
    color: str | None = None
    dash: str | None = None
    facet_col: str | None = None
    facet_row: str | None = None
    sel: Mapping[str, Any] = field(default_factory=dict)
    reduce: Mapping[str, str] = field(default_factory=dict)
    kind: str = "line"
    log_x: bool = False
    log_y: bool = False
    title: str = ""


#: Each study's main figure (the first figure in its OUTPUTS), as an interactive figure of its dataset.
MAIN_FIGURES: dict[str, FigureSpec] = {
    "validation": FigureSpec("validation.nc", "parity.png", ("predicted",), "measured", color="dataset",
                             facet_col="metric", kind="parity", log_x=True, log_y=True,
                             title="predicted vs measured, every published run"),
    "hardware-scaling": FigureSpec("hardware_scaling.nc", "throughput_per_gpu.png", ("tokens_per_s_per_gpu",),
                                   "gpus", color="system", dash="strategy", facet_col="model", log_x=True,
                                   title="throughput per GPU at the best plan of each strategy"),
    "pipeline-planning": FigureSpec("timelines.nc", "gantt.png", ("start_s", "end_s"), "device",
                                    color="op", facet_row="schedule", kind="gantt",
                                    title="pipeline schedules: one step, every GPU"),
    "heterogeneous-cluster": FigureSpec("mix.nc", "fraction_of_sum.png", ("fraction_of_sum", "even_fraction_of_sum"),
                                        "fraction", color="bandwidth_GBps",
                                        title="mixed cluster throughput / sum of the parts alone (solid: planner, "
                                              "dashed: even split; colour: link between the types, GB/s)"),
    "geo-distributed": FigureSpec("geo_pipeline.nc", "throughput.png", ("tokens_per_s",), "bandwidth_GBps",
                                  color="approach", reduce={"draw": "geomean"}, log_x=True, log_y=True,
                                  title="pipeline throughput over the slowest link (geometric mean over the draws)"),
    "gradient-compression": FigureSpec("ist_vs_compression.nc", "suboptimality_vs_steps.png", ("suboptimality",),
                                       "step", color="method", facet_col="heterogeneity", log_y=True,
                                       title="suboptimality over the iterations"),
    "hierarchical-local-sgd": FigureSpec("comparison.nc", "loss_vs_time.png", ("loss",), "time_s",
                                         color="method", log_x=True, title="training loss over wall-clock time"),
    "low-communication": FigureSpec("low_communication.nc", "tokens_per_s.png", ("tokens_per_s",),
                                    "bandwidth_GBps", color="method", log_x=True, log_y=True,
                                    title="throughput over the inter-cluster bandwidth"),
    "batch-size": FigureSpec("batch_size.nc", "steps_to_target.png", ("best_steps", "fitted_steps"),
                             "global_batch", kind="markers", log_x=True, log_y=True,
                             title="steps to the target loss over the global batch"),
    "parallelism-strategies": FigureSpec("strategies.nc", "tflops_vs_gpus.png", ("hardware_tflops_per_gpu",),
                                         "gpus", color="strategy", facet_col="model", log_x=True,
                                         title="hardware TFLOP/s per GPU at the best plan of each strategy"),
    "overlap": FigureSpec("overlap.nc", "step_time.png", ("step_time_s",), "system", color="mode",
                          facet_col="model", facet_row="precision", sel={"power_cap": 1.0}, kind="bar",
                          title="step time: sequential, overlapped, ideal (full power)"),
    "job-profile": FigureSpec("decomposition.nc", "decomposition.png", ("time_s",), "gpus", color="component",
                              facet_col="precision", kind="stack", title="iteration time by component"),
    "inference-overlap": FigureSpec("inference_overlap.nc", "savings.png", ("savings",), "prompt_tokens",
                                    color="system", facet_col="tp", log_x=True,
                                    title="prefill time saved by ISO at the best split"),
    "chiplet-scaling": FigureSpec("chiplet_scaling.nc", "compute_comm_ratio.png", ("compute_comm_ratio",),
                                  "chiplets", color="chiplet", dash="scheme", log_x=True, log_y=True,
                                  title="compute time / communication time over the mesh size"),
    "datacenter-design": FigureSpec("datacenter_design.nc", "mfu_vs_domain.png", ("mfu_domain",), "domain",
                                    color="model", dash="network", log_x=True,
                                    title="MFU at the best plan over the scale-up domain"),
    "big-model-scheduling": FigureSpec("accuracy.nc", "accuracy.png", ("test_accuracy",), "n_features",
                                       color="sigma", reduce={"feature_seed": "mean"}, log_x=True,
                                       title="test accuracy over the number of random features (mean over draws)"),
    "heterogeneous-swarm": FigureSpec("petals.nc", "parity.png", ("predicted",), "published", color="metric",
                                      kind="parity", log_x=True, log_y=True,
                                      title="PETALS' placement and route: predicted vs PETALS' measured rates"),
    "distributed-mpc": FigureSpec("runtime.nc", "runtime.png", ("parallel_s_per_iter",), "n_subsystems",
                                  color="schedule", dash="threads", facet_col="locality_d", log_x=True, log_y=True,
                                  title="DLMPC: wall time per ADMM iteration of the parallel schedules (this CPU)"),
    "survey-map": FigureSpec("survey_map.nc", "survey_map.png", ("studies_per_area",), "area", color="stage",
                             kind="bar", title="studies covering each area of the survey (0: a gap)"),
    "recsys-meta-learning": FigureSpec("scaling.nc", "scaling.png", ("samples_per_s",), "gpus", color="rows_per_table",
                                       dash="schedule", sel={"embedding_dim": 64, "bandwidth_GBps": 25.0},
                                       log_x=True, log_y=True,
                                       title="meta-learning throughput: data-parallel vs G-Meta's hybrid (dim 64, 25 GB/s)"),
    "model-parallel-gear": FigureSpec("training.nc", "convergence.png", ("loss",), "step", color="schedule",
                                      facet_col="lr", reduce={"seed": "mean"}, log_y=True,
                                      title="gear training vs synchronous and asynchronous SGD: held-out loss over steps"),
    "pruning": FigureSpec("mixing.nc", "losses.png", ("loss",), "tokens", color="domain", facet_col="mixing",
                          # interval 2: 100 mix updates over the 200 steps, the swept interval nearest the codes'
                          # 120 that losses.png draws (studies.pruning._paper_interval)
                          sel={"alpha": 0.3, "damage": 1.0, "unevenness": 0.5, "rho": 0.1, "interval": 2},
                          title="modelled per-domain loss: fixed, DRPruning's robust mixing and Sheared-LLaMA's DBL"),
}

GANTT_OPS = ("forward", "backward", "weight gradient")


def _repo_root(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / "pkg" / "trainscale").is_dir() and (folder / "figures").is_dir():
            return folder
    return None


def find_figures_dir(figures_dir: str | Path | None = None) -> Path:
    """``figures_dir`` if given, else the repository's ``figures/`` found from the working directory upwards
    (JupyterLab starts in ``notebooks/``, papermill wherever it is run): no ``os.chdir``."""
    if figures_dir is not None:
        return Path(figures_dir)
    root = _repo_root(Path.cwd().resolve())
    if root is None:
        raise NoInteractiveFigure(f"no figures/ folder in {Path.cwd()} or above it; pass figures_dir")
    return root / "figures"


def _scalar(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _unique(values) -> list:
    seen, out = set(), []
    for v in np.asarray(values).ravel().tolist():
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def _select(da, key: str, value: Any):
    """``da`` at ``key == value``: a dimension is selected; a coordinate along one dimension masks it; a
    name ``da`` does not carry leaves it as it is."""
    if key in da.dims:
        return da.sel({key: value})
    if key in da.coords and da[key].ndim == 1:
        return da.isel({da[key].dims[0]: np.flatnonzero(da[key].values == value)})
    return da


def _reduced(da, reduce: Mapping[str, str]):
    for dim, how in reduce.items():
        if dim not in da.dims:
            continue
        if how == "geomean":
            da = np.exp(np.log(da).mean(dim))
        elif how == "mean":
            da = da.mean(dim)
        else:
            raise ValueError(f"reduce {dim}: {how!r} is not geomean or mean")
    return da


def trace_expected(ds, spec: FigureSpec, variable: str, selection: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) arrays a trace of ``spec`` for ``variable`` at ``selection`` draws from ``ds``: the fixed
    selections, then ``selection`` (dimension or coordinate), then the reductions."""
    arrays = []
    for name in (spec.x, variable):
        da = ds[name]
        for key, value in {**spec.sel, **selection}.items():
            da = _select(da, key, value)
        arrays.append(np.asarray(_reduced(da, spec.reduce).values))
    x, y = arrays
    if x.shape != y.shape:
        x = np.broadcast_to(x, y.shape)
    return x, y


def _values(ds, name: str | None) -> list:
    if name is None or name not in ds.variables:  # a dataset without that dimension: one trace, no selection
        return [None]
    return _unique(ds[name].values)


def _label(ds, name: str) -> str:
    from ..common.plotting import label

    text = label(ds[name], name)
    if len(text) > 60 and " (" in text:  # a long aside in the long_name: keep it for the hover, not the axis
        head, _, rest = text.partition(" (")
        units = rest[rest.rfind(") [") + 2:] if ") [" in rest else ""
        text = f"{head} {units}".strip()
    return text


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _study_dataset(study: str, figures_dir: str | Path):
    from ..common import io as tsio

    if study not in MAIN_FIGURES:
        known = ", ".join(sorted(MAIN_FIGURES))
        raise NoInteractiveFigure(f"{study}: no interactive main figure is defined for this study (its dataset "
                                  f"has no single natural plot yet, or it is not a study); defined: {known}")
    spec = MAIN_FIGURES[study]
    path = Path(figures_dir) / study / spec.dataset
    if not path.is_file():
        raise NoInteractiveFigure(f"{study}: no committed dataset {path} (run the study: make figures)")
    return spec, tsio.read_dataset(path)


def interactive_figure(study: str, figures_dir: str | Path = "figures"):
    """The study's main figure (``MAIN_FIGURES[study].figure``, the first it declares) as a plotly figure
    drawn from its committed dataset ``figures/<study>/<dataset>``: hover shows each point's values, drag to
    zoom, double-click to reset. Each trace's ``meta`` holds ``variable`` and ``selection`` (what
    :func:`trace_expected` reads back). Raises :class:`NoInteractiveFigure` with a one-line reason where
    the study has none (unknown study, no dataset)."""
    spec, ds = _study_dataset(study, figures_dir)
    if spec.kind == "gantt":
        return _gantt(study, spec, ds)
    from plotly.subplots import make_subplots

    cols, rows = _values(ds, spec.facet_col), _values(ds, spec.facet_row)
    titles = _panel_titles(spec, rows, cols)
    # rows of panels share the x axis (one variable): tick labels only under the last row, where rotated
    # category labels cannot run into the next row's panel titles
    fig = make_subplots(rows=len(rows), cols=len(cols), subplot_titles=titles if len(titles) > 1 else None,
                        shared_yaxes=spec.kind != "parity", shared_xaxes=len(rows) > 1 and spec.kind != "parity",
                        horizontal_spacing=0.06, vertical_spacing=0.1 if len(rows) > 1 else 0.08)
    colors, dashes = _values(ds, spec.color), _values(ds, spec.dash)
    shown = set()
    for (i, row), (j, col) in product(enumerate(rows, 1), enumerate(cols, 1)):
        for k, variable in enumerate(spec.y):
            for (c, cv), (d, dv) in product(enumerate(colors), enumerate(dashes)):
                selection = {n: _scalar(v) for n, v in ((spec.facet_row, row), (spec.facet_col, col),
                                                         (spec.color, cv), (spec.dash, dv)) if n and v is not None}
                x, y = trace_expected(ds, spec, variable, selection)
                if y.size == 0:
                    continue
                name = ", ".join([*([variable] if len(spec.y) > 1 else []),
                                  *(_fmt(v) for v in (cv, dv) if v is not None)]) or variable
                color = PALETTE[(c if cv is not None else k) % len(PALETTE)]
                meta = {"variable": variable, "selection": selection}
                common = dict(x=x.tolist(), y=y.tolist(), name=name, legendgroup=name, meta=meta,
                              showlegend=name not in shown)
                if spec.kind in ("bar", "stack"):
                    fig.add_bar(marker_color=color, **common, row=i, col=j)
                else:
                    mode = "markers" if spec.kind in ("parity", "markers") and k == 0 else "lines+markers"
                    style = d if spec.dash else (k if len(spec.y) > 1 else 0)  # else a dash per variable
                    fig.add_scatter(mode=mode, line=dict(color=color, dash=DASHES[style % len(DASHES)]),
                                    marker=dict(size=6 if spec.kind == "parity" else 7, opacity=0.8), **common,
                                    row=i, col=j)
                shown.add(name)
        if spec.kind == "parity":
            _identity_line(fig, ds, spec, row, col, i, j)
    fig.update_xaxes(title_text=_label(ds, spec.x), type="log" if spec.log_x else None, row=len(rows))
    fig.update_yaxes(type="log" if spec.log_y else None)
    fig.update_yaxes(title_text=_label(ds, spec.y[0]), col=1)
    if spec.kind in ("bar", "stack"):
        fig.update_layout(barmode="stack" if spec.kind == "stack" else "group")
    return _finish(fig, study, spec, ds, rows, cols)


def _panel_titles(spec: FigureSpec, rows: list, cols: list) -> list[str]:
    """Each panel's title, ``row-facet value, column-facet value``; one facet a line in every panel when one
    title is wider than its panel (at ``DESIGN_WIDTH_PX``), then wrapped within the panel."""
    parts = [[f"{n} {_fmt(v)}" for n, v in ((spec.facet_row, r), (spec.facet_col, c)) if n]
             for r in rows for c in cols]
    chars = _panel_chars(len(cols), SUBPLOT_TITLE_PX)
    sep = "<br>" if any(len(", ".join(p)) > chars for p in parts) else ", "
    return [_wrap(sep.join(p), chars) for p in parts]


def _identity_line(fig, ds, spec, row, col, i, j) -> None:
    selection = {n: _scalar(v) for n, v in ((spec.facet_row, row), (spec.facet_col, col)) if n}
    x, y = trace_expected(ds, spec, spec.y[0], selection)
    both = np.concatenate([x, y])
    both = both[np.isfinite(both) & (both > 0)]
    if both.size:
        lo, hi = float(both.min()), float(both.max())
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="#777", dash="dot", width=1),
                        name="y = x", legendgroup="y = x", showlegend=i == 1 and j == 1, hoverinfo="skip",
                        meta={"reference": True}, row=i, col=j)


def _gantt(study: str, spec: FigureSpec, ds):
    from plotly.subplots import make_subplots

    rows = _values(ds, spec.facet_row)
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, subplot_titles=[str(r) for r in rows],
                        vertical_spacing=0.06)
    shown = set()
    for i, row in enumerate(rows, 1):
        sel = ds.sel({spec.facet_row: row})
        start, end = sel["start_s"].values, sel["end_s"].values
        op, device, mb = sel["op"].values, sel["device"].values, sel["micro_batch"].values
        for code, name in enumerate(GANTT_OPS):
            keep = np.isfinite(start) & (op == code)
            if not keep.any():
                continue
            fig.add_bar(orientation="h", base=start[keep].tolist(), x=(end[keep] - start[keep]).tolist(),
                        y=device[keep].astype(int).tolist(), customdata=mb[keep].astype(int).tolist(),
                        name=name, legendgroup=name, showlegend=name not in shown, marker_color=PALETTE[code],
                        marker_line_color="white", marker_line_width=0.5,
                        hovertemplate="GPU %{y}, micro-batch %{customdata}: %{base:.3g}–%{x:.3g} s long<extra>"
                                      + name + "</extra>",
                        meta={"variable": "start_s", "selection": {spec.facet_row: _scalar(row), "op": code}},
                        row=i, col=1)
            shown.add(name)
        fig.update_yaxes(autorange="reversed", title_text="GPU", dtick=1, row=i, col=1)
    fig.update_xaxes(title_text=_label(ds, "end_s").replace("end", "time"), row=len(rows), col=1)
    fig.update_layout(barmode="overlay")
    return _finish(fig, study, spec, ds, rows, [None])


# The shared layout of every study's interactive figure, sized for a notebook output area of about 1000 px (the
# narrow case: JupyterLab at 1366 px with the file browser open) and fine wider. Text is wrapped in characters
# at these pixel widths per character (plotly's default font, a little generous).
DESIGN_WIDTH_PX = 1000
SUBPLOT_TITLE_PX, AXIS_TITLE_PX, TITLE_PX = 6.6, 7.2, 9.0  # per character at 12, 13 and 17 px
SUBPLOT_TITLE_SIZE, AXIS_TITLE_SIZE = 12, 13
ROW_HEIGHT_PX = 290  # each row of panels, plus the title, panel titles and the legend's rows
LINE_PX = {"title": 24, "subtitle": 16, "panel": 16}
TITLE_TOP_PX = 30  # the title's anchor below the figure's top (plotly draws its first line ~8 px above it)


def _panel_chars(cols: int, px_per_char: float) -> int:
    """Characters of text that fit across one of ``cols`` panels at ``DESIGN_WIDTH_PX`` (120 px of margins)."""
    width = (DESIGN_WIDTH_PX - 120) / max(cols, 1) * (1 - 0.06 * (max(cols, 1) - 1) / max(cols, 1))
    return max(int(width / px_per_char), 12)


def _axis_of(trace, letter: str) -> str:
    return (getattr(trace, f"{letter}axis", None) or letter).replace(letter, f"{letter}axis", 1)


def _tick_text(value: float) -> str:
    """A tick label spelling out its value: 0.001, 0.02, 5, 200, 1000, 20k, 5M, 1G, 100T; below 0.001 as
    Python's ``g`` writes it (0.0005, 1e-5), from 1e15 up as 1e15, 1e18."""
    if 1e4 <= value < 1e15:
        for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if value >= scale:
                return f"{float(f'{value / scale:.4g}'):g}{unit}"
    if 1e-3 <= value < 1e15:
        return f"{float(f'{value:.4g}'):g}"
    mantissa, _, exponent = f"{value:.3g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def _nice_linear(lo: float, hi: float) -> list[float]:
    """3 to 6 round values (steps of 1, 2 or 5 times a power of ten) within ``[lo, hi]``."""
    for exponent in range(math.floor(math.log10(hi - lo)) + 1, math.floor(math.log10(hi - lo)) - 3, -1):
        for mantissa in (5, 2, 1):
            step = mantissa * 10.0**exponent
            ticks = [k * step for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]
            if len(ticks) >= 3:
                return ticks[:: math.ceil(len(ticks) / 6)]
    return [lo, hi]


def log_ticks(values, max_ticks: int = 9) -> dict:
    """Tick settings for a log axis over ``values`` (its data): labels at the decades when three fit in the
    data, else at 1-2-5 (at most ``max_ticks`` of them: a narrow panel takes two decades instead), else at round
    linear steps (400, 420, ...) within a fraction of a decade; each label its full value (plotly's own log
    ticks label 2 and 5 between the decades with a bare "2", "5", which read as values). Minor gridlines,
    unlabelled, at the digits between."""
    v = np.asarray(values, dtype=float).ravel()
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0:
        return {}
    lo, hi = float(v.min()), float(v.max())
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    pad = 10 ** 0.03  # a tick just outside the data still shows within plotly's padded range
    grid = [float(f"{m * 10.0**e:.12g}") for e in range(e0, e1 + 1) for m in range(1, 10)]
    inside = [t for t in grid if lo / pad <= t <= hi * pad]

    def at(mantissas):
        return [t for t in inside if round(t / 10.0 ** math.floor(math.log10(t) + 1e-9)) in mantissas]

    decades, steps = at((1,)), at((1, 2, 5))
    if len(decades) >= 3:
        major = decades
    elif 3 <= len(steps) <= max_ticks:
        major = steps
    elif len(decades) == 2:
        major = decades
    else:
        major = [float(f"{t:.12g}") for t in _nice_linear(lo, hi)] if hi > lo else [lo]
    if len(major) > 9:  # many decades: every other (or third) one
        major = major[:: math.ceil(len(major) / 8)]
    digits = range(2, 10) if e1 - e0 <= 4 else (2, 5) if e1 - e0 <= 8 else ()  # fewer lines over more decades
    minor = [t for t in grid if t not in major and round(t / 10.0 ** math.floor(math.log10(t) + 1e-9)) in digits]
    return dict(tickmode="array", tickvals=major, ticktext=[_tick_text(t) for t in major],
                minor=dict(tickmode="array", tickvals=minor, showgrid=True, gridcolor="#f4f4f4", ticks=""))


TICK_LABEL_PX = 55  # room for one horizontal tick label ("0.001", "20k") and the gap to the next


def _log_axes(fig, cols: int) -> None:
    """Give every log axis :func:`log_ticks` of the data drawn on it (and on the axes it matches), as many
    labels as fit across one of ``cols`` panels (x) or up a row (y)."""
    room = {"x": _panel_chars(cols, 1.0) // TICK_LABEL_PX, "y": ROW_HEIGHT_PX // 30}
    layout = fig.layout.to_plotly_json()
    for letter in ("x", "y"):
        names = [k for k in layout if k.startswith(f"{letter}axis") and layout[k].get("type") == "log"]
        groups: dict[str, list] = {}
        for name in names:
            key = layout[name].get("matches")
            groups.setdefault(f"{key.replace(letter, letter + 'axis', 1)}" if key else name, []).append(name)
        for members in groups.values():
            values = [np.asarray(getattr(t, letter), dtype=float) for t in fig.data
                      if _axis_of(t, letter) in members and getattr(t, letter) is not None]
            ticks = log_ticks(np.concatenate([v.ravel() for v in values]) if values else [],
                              max_ticks=max(int(room[letter]), 3))
            for name in members:
                fig.layout[name].update(ticks)


def _finish(fig, study, spec, ds, rows, cols):
    setting = ds.attrs.get("git_commit", "")
    title = _wrap(f"{study}: {spec.title}", DESIGN_WIDTH_PX * 0.7 / TITLE_PX)  # clear of plotly's modebar
    subtitle = (f"figures/{study}/{spec.dataset} (interactive version of {spec.figure})"
                f"{', commit ' + setting[:12] if setting else ''}")
    panel_lines = max((a.text.count("<br>") + 1 for a in fig.layout.annotations if a.text), default=0)
    # the title block from the top of the figure down, then the first row's panel titles: the top margin holds
    # both, so the title never sits on a panel title or on the y-axis titles (which are wrapped to their row)
    top = TITLE_TOP_PX + LINE_PX["title"] * (title.count("<br>") + 1) + LINE_PX["subtitle"] + 8
    top += LINE_PX["panel"] * panel_lines
    fig.update_annotations(font_size=SUBPLOT_TITLE_SIZE)
    for axis in fig.select_yaxes():
        if axis.title.text:
            axis.title.text = _wrap(axis.title.text, ROW_HEIGHT_PX * 0.8 / AXIS_TITLE_PX)
    for axis in fig.select_xaxes():
        if axis.title.text:
            axis.title.text = _wrap(axis.title.text, _panel_chars(len(cols), AXIS_TITLE_PX))
    fig.update_xaxes(automargin=True, title_font_size=AXIS_TITLE_SIZE, title_standoff=8)
    fig.update_yaxes(automargin=True, title_font_size=AXIS_TITLE_SIZE, title_standoff=8)
    _log_axes(fig, len(cols))
    legend = [_label(ds, n) for n in (spec.color, spec.dash) if n and n in ds.variables]
    entries = sum(1 for t in fig.data if t.showlegend is not False and t.name)
    height = top + ROW_HEIGHT_PX * len(rows) + 90 + 22 * math.ceil(entries / 5)
    fig.update_layout(
        title=dict(text=f"{title}<br><sup>{subtitle}</sup>", x=0.01, xanchor="left", yref="container",
                   y=1 - TITLE_TOP_PX / height, yanchor="top"),
        margin=dict(t=top, l=60, r=20, b=10),
        height=height, autosize=True,
        template="plotly_white", hovermode="closest",
        legend=dict(LEGEND_BELOW, title=dict(text=" · ".join(legend) if legend else "", side="top")),
        meta={"study": study, "dataset": spec.dataset})
    return fig


def interactive_figures(figures_dir: str | Path = "figures", studies: Sequence[str] | None = None) -> dict:
    """Every study's interactive main figure: ``{study: figure}``, or ``{study: message}`` (a string saying
    why) for a study folder in ``figures_dir`` without one. ``studies`` defaults to the study folders there."""
    folder = Path(figures_dir)
    names = list(studies) if studies is not None else sorted(p.name for p in folder.iterdir() if p.is_dir())
    out: dict[str, Any] = {}
    for study in names:
        try:
            out[study] = interactive_figure(study, folder)
        except NoInteractiveFigure as err:
            out[study] = str(err)
    return out
