"""Interactive exploration of the performance model and of the studies' datasets (``notebooks/explore.ipynb``).

Two halves, each plain functions that take values and return data or figures (testable without a
browser), with a thin ipywidgets layer on top whose callbacks only call them:

* **the model, live**: :func:`plan_choices` (the valid tp/pp/cp/micro-batch/... values for a model, GPU
  count and batch), :func:`evaluate` (one plan through :func:`trainscale.model.perfmodel.predict`: step time, its
  breakdown, memory per GPU by component, MFU), :func:`time_breakdown_figure`, :func:`memory_figure` and
  :func:`best_plans` (:func:`trainscale.model.planner.search`, the search ``trainscale search`` runs); the
  :class:`Explorer` widget wires menus and sliders to them.
* **the studies' figures, interactive**: :func:`interactive_figure` draws a study's main figure (the first
  figure it declares in ``OUTPUTS``) from its committed dataset in ``figures/<study>/``, with hover and zoom.

Plotting library: plotly (https://plotly.com/python/, MIT, maintained by Plotly Inc.). A plotly figure is a
JSON document rendered by plotly.js: it works in JupyterLab (the ``jupyterlab-plotly`` renderer ships inside
the plotly wheel, no extension to build), in a static HTML page or an exported notebook without a server or a
kernel (``fig.write_html(path)``: one file holding plotly.js and the data), and its traces hold plain
arrays, so a test can compare a figure's data with the dataset directly. hvplot/panel would need a Bokeh
server or a live kernel for most of their interactivity and pull in a larger stack.

This module reaches the model only through its public API (``perfmodel``, ``specs``, ``catalog``); it never
imports ``trainscale.kernels``.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..model import catalog, perfmodel

from ..model import planner
from ..model.specs import DEFAULT_STACK, RECOMPUTE_MODES, STACKS, RunSpec, SpecError, resolve_model, resolve_system

__all__ = ["models", "systems", "gpu_choices", "plan_choices", "run_dict", "Evaluation", "evaluate",
           "time_breakdown_figure", "memory_figure", "best_plans", "plan_label", "compact_plans", "plans_html",
           "Explorer", "FigureSpec", "MAIN_FIGURES", "NoInteractiveFigure", "interactive_figure",
           "interactive_figures", "find_figures_dir", "trace_expected", "log_ticks"]

# the colour-blind-safe cycle of trainscale.common.plotting (Okabe & Ito 2008), then greys
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000", "#999999")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
GPU_COUNTS = tuple(2**i for i in range(15))  # 1 .. 16384
INTERLEAVES = (1, 2, 3, 4, 6, 8)
MAX_MICRO_BATCH = 64


# --------------------------------------------------------------------------- the model: plain functions
def models() -> list[str]:
    """Catalog model names, in catalog order."""
    return list(catalog.models())


def systems() -> list[str]:
    """Catalog system names, in catalog order."""
    return list(catalog.systems())


def gpu_choices(gpus: int | None = None) -> list[int]:
    """The GPU counts offered: powers of two up to 16,384, and ``gpus`` itself if it is not one."""
    values = set(GPU_COUNTS)
    if gpus is not None:
        values.add(int(gpus))
    return sorted(values)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def plan_choices(model, gpus: int, global_batch: int, tp: int = 1, pp: int = 1, cp: int = 1,
                 micro_batch: int = 1) -> dict[str, list]:
    """The values each plan knob may take, given the knobs before it (tp, then pp, then cp, then the
    micro-batch), for ``model`` on ``gpus`` GPUs at ``global_batch`` sequences.

    tp: powers of two dividing the GPUs, the heads and the KV heads (at most 64); pp: divisors of
    ``gpus / tp`` up to the layers; cp: powers of two up to 16 dividing ``gpus / (tp pp)`` and the sequence;
    ``dp = gpus / (tp pp cp)`` (one value, derived); micro_batch: divisors of ``global_batch / dp`` up to 64
    (empty when ``dp`` does not divide the batch); interleave: chunk counts with ``pp * v <= layers`` whose
    micro-batch count is a multiple of pp (only 1 without pipelining); ep: divisors of the experts that
    divide dp (1 for a dense model). The knobs given are clipped to their choices first."""
    model = resolve_model(model)
    gpus, global_batch = int(gpus), int(global_batch)
    tps = [t for t in GPU_COUNTS if t <= min(gpus, 64) and gpus % t == 0 and model.heads % t == 0
           and model.kv_heads % t == 0] or [1]
    tp = tp if tp in tps else _nearest(tps, tp)
    pps = [p for p in _divisors(gpus // tp) if p <= model.layers] if gpus % tp == 0 else [1]
    pp = pp if pp in pps else _nearest(pps, pp)
    rest = gpus // (tp * pp)
    cps = [c for c in (1, 2, 4, 8, 16) if rest % c == 0 and model.seq_len % c == 0]
    cp = cp if cp in cps else _nearest(cps, cp)
    dp = gpus // (tp * pp * cp)
    mbs = ([b for b in _divisors(global_batch // dp) if b <= MAX_MICRO_BATCH]
           if global_batch % dp == 0 else [])
    mb = micro_batch if micro_batch in mbs else (_nearest(mbs, micro_batch) if mbs else 1)
    micro_batches = global_batch // (dp * mb) if mbs else 0
    interleaves = [1] + ([v for v in INTERLEAVES[1:] if pp * v <= model.layers and micro_batches % pp == 0]
                         if pp > 1 and micro_batches else [])
    eps = [e for e in _divisors(model.experts) if dp % e == 0] if model.is_moe else [1]
    return {"tp": tps, "pp": pps, "cp": cps, "dp": [dp], "micro_batch": mbs, "interleave": interleaves,
            "ep": eps, "recompute": list(RECOMPUTE_MODES), "zero": [0, 1, 2, 3], "stack": list(STACKS)}


def _nearest(options: Sequence[int], value: int) -> int:
    return min(options, key=lambda o: (abs(math.log(o) - math.log(max(value, 1))), o))


def run_dict(model: str, system: str, gpus: int, global_batch: int, **plan: Any) -> dict:
    """The run mapping :func:`trainscale.model.perfmodel.predict` reads (the CLI's ``predict`` format); ``plan``
    holds the plan fields (dp may be left out: it follows from the GPUs)."""
    plan = {k: v for k, v in plan.items() if v is not None}
    if not plan.get("sequence_parallel"):
        plan["tp_comm_overlap"] = False  # it needs sequence parallelism; off rather than an error
    return {"id": "explore", "model": model, "system": system, "gpus": int(gpus),
            "plan": {**plan, "global_batch": int(global_batch)}}


NUMBER_FIELDS = ("step_time_s", "tokens_per_s", "mfu", "hfu", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
                 "memory_gib_per_gpu", "power_W_per_gpu", "energy_J_per_token")


@dataclass
class Evaluation:
    """One plan through the model: the run, its :class:`~trainscale.model.perfmodel.Prediction` (None if the run
    is invalid) and the one-line error that said why."""

    run: dict
    prediction: perfmodel.Prediction | None = None
    error: str | None = None
    capacity_gib: float = float("nan")

    @property
    def numbers(self) -> dict[str, float]:
        """The read-out: step time, throughput, MFU, memory per GPU, ... (NaN where the run is invalid),
        ``fits`` (1.0 or 0.0) and the GPU's memory capacity."""
        p = self.prediction
        out = {name: float(getattr(p, name)) if p else float("nan") for name in NUMBER_FIELDS}
        out["fits"] = float(p.fits) if p else float("nan")
        out["memory_capacity_gib"] = self.capacity_gib
        return out


def evaluate(model: str, system: str, gpus: int, global_batch: int, **plan: Any) -> Evaluation:
    """Predict one plan (:func:`trainscale.model.perfmodel.predict`, pipelines simulated). An invalid run is not
    an exception: the Evaluation carries the model's one-line error instead of a prediction."""
    run = run_dict(model, system, gpus, global_batch, **plan)
    try:
        capacity = float(resolve_system(system).hbm_capacity_GiB)
    except SpecError:
        capacity = float("nan")
    try:
        return Evaluation(run, perfmodel.predict(RunSpec.from_dict(run)), None, capacity)
    except SpecError as err:
        return Evaluation(run, None, str(err), capacity)


def _go():
    import plotly.graph_objects as go

    return go


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


def time_breakdown_figure(prediction: perfmodel.Prediction | None, title: str = "") -> Any:
    """Bar chart of the step's exposed time by component (``Prediction.breakdown``, seconds; they add up
    to the step time), with the traffic before overlap (``comm_total_s``) as hollow bars beside them."""
    go = _go()
    fig = go.Figure()
    if prediction is not None:
        names = list(prediction.breakdown)
        fig.add_bar(x=names, y=[prediction.breakdown[n] for n in names], name="exposed (adds up to the step)",
                    marker_color=PALETTE[0], hovertemplate="%{x}: %{y:.4g} s<extra></extra>")
        total = [prediction.comm_total_s.get(n, float("nan")) for n in names]
        fig.add_bar(x=names, y=total, name="communication before overlap", marker_color="rgba(0,0,0,0)",
                    marker_line_color=PALETTE[3], marker_line_width=1.5,
                    hovertemplate="%{x} before overlap: %{y:.4g} s<extra></extra>")
        title = title or f"step {prediction.step_time_s:.4g} s"
    # no width: plotly sizes the chart to its output area (autosize), which the Explorer shares with the memory
    # chart; margins grow to fit rotated labels (automargin) instead of cutting them off
    fig.update_layout(title=_wrap(title, 60), yaxis_title="seconds per step", barmode="group", height=380,
                      autosize=True, margin=dict(l=50, r=10, t=50, b=10), legend=LEGEND_BELOW)
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


def memory_figure(prediction: perfmodel.Prediction | None, capacity_gib: float = float("nan"),
                  title: str = "") -> Any:
    """Bar chart of the most loaded GPU's memory by component (``Prediction.memory_breakdown_gib``, GiB;
    they add up to ``memory_gib_per_gpu``) with the GPU's capacity as a line."""
    go = _go()
    fig = go.Figure()
    if prediction is not None:
        names = list(prediction.memory_breakdown_gib)
        fig.add_bar(x=names, y=[prediction.memory_breakdown_gib[n] for n in names], name="memory",
                    marker_color=PALETTE[2] if prediction.fits else PALETTE[3],
                    hovertemplate="%{x}: %{y:.4g} GiB<extra></extra>")
        title = title or (f"{prediction.memory_gib_per_gpu:.1f} GiB per GPU"
                          + ("" if prediction.fits else f" — does not fit: {prediction.reason}"))
    if np.isfinite(capacity_gib):
        fig.add_hline(y=capacity_gib, line_dash="dot", annotation_text=f"capacity {capacity_gib:g} GiB")
    fig.update_layout(title=_wrap(title, 60), yaxis_title="GiB per GPU", height=380, showlegend=False,
                      autosize=True, margin=dict(l=50, r=10, t=50, b=10))
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


BEST_PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "interleave", "micro_batch", "recompute", "zero", "shard_group",
                     "sequence_parallel", "flash_attention", "overlap_grad_reduce", "tp_comm_overlap",
                     "zero3_per_tensor")


def best_plans(model: str, system: str, gpus: int, global_batch: int, top: int = 5, stack: str = DEFAULT_STACK,
               space: Mapping[str, Sequence] | None = None):
    """The ``top`` fastest plans that fit (:func:`trainscale.model.planner.search` over its default plan space,
    or ``space``; the search ``trainscale search`` runs): a DataFrame, one row per plan, with the plan's
    fields and its step time, throughput, MFU and memory per GPU (pipelines simulated), then ``differs`` (the
    knobs in which it differs from the first row, as ``trainscale search`` prints them; '' for the first) and
    ``same_cost`` (the settings the search folded into it because they cost exactly the same, e.g.
    ``recompute none = selective``; '' for none). The search folds such plans (issue 38), so no two rows are one
    plan spelt two ways. Empty when no plan fits or no split of the GPUs exists. :func:`compact_plans` is the
    narrow view of it the Explorer shows."""
    import pandas as pd

    from ..model.searchspace import differs_text, fold_text

    _, ranked = planner.search(model, system, int(gpus), int(global_batch), top=int(top), space=space,
                                 stack=stack)
    rows = []
    for rank, entry in enumerate(ranked, 1):
        plan = entry["plan"]
        row = {"rank": rank, **{k: plan.get(k, 1 if k == "ep" else None) for k in BEST_PLAN_COLUMNS}}
        row.update(step_time_s=entry["step_time_s"], tokens_per_s=entry["tokens_per_s"], mfu=entry["mfu"],
                   memory_gib_per_gpu=entry["memory_gib_per_gpu"],
                   differs=differs_text(plan, ranked[0]["plan"]), same_cost=fold_text(entry))
        rows.append(row)
    columns = ["rank", *BEST_PLAN_COLUMNS, "step_time_s", "tokens_per_s", "mfu", "memory_gib_per_gpu", "differs",
               "same_cost"]
    return pd.DataFrame(rows, columns=columns).set_index("rank")


RECOMPUTE_SHORT = {"none": "no-rc", "selective": "sel-rc", "full": "full-rc"}
FLAG_SHORT = {"sequence_parallel": "sp", "flash_attention": "fa", "overlap_grad_reduce": "ogr",
              "tp_comm_overlap": "tpo", "zero3_per_tensor": "pt"}
PLAN_LABEL_KEY = ("tp/pp/dp/cp/ep: parallel degrees (cp, ep shown above 1); vp: pipeline chunks per GPU "
                  "(interleave); mb: micro-batch; zero: ZeRO stage, sg: its shard group; no-rc/sel-rc/full-rc: "
                  "recomputation none/selective/full; sp: sequence parallel; fa: FlashAttention; ogr: overlapped "
                  "gradient reduction; tpo: TP communication overlap; pt: ZeRO-3 per-tensor fetches")


def plan_label(plan: Mapping[str, Any]) -> str:
    """One short line naming a plan, e.g. ``tp8 pp4 dp16 vp2 mb2 zero1 sp sel-rc fa`` (:data:`PLAN_LABEL_KEY`
    spells the abbreviations out): every knob that tells two searched plans apart, settings without effect
    dropped as :func:`trainscale.model.perfmodel.canonical_plan` drops them (sequence parallelism at tp 1, ...)."""
    p = {k: (v.item() if hasattr(v, "item") else v) for k, v in plan.items()}
    p = dict(perfmodel.canonical_plan(p))
    parts = [f"tp{p.get('tp', 1)}", f"pp{p.get('pp', 1)}", f"dp{p.get('dp', '?')}"]
    parts += [f"{k}{p[k]}" for k in ("cp", "ep") if int(p.get(k) or 1) > 1]
    if int(p.get("interleave") or 1) > 1:
        parts.append(f"vp{p['interleave']}")
    parts.append(f"mb{p.get('micro_batch', 1)}")
    if int(p.get("zero") or 0):
        parts.append(f"zero{p['zero']}" + (f" sg{p['shard_group']}" if p.get("shard_group") else ""))
    if p.get("sequence_parallel"):
        parts.append("sp")
    parts.append(RECOMPUTE_SHORT.get(p.get("recompute"), str(p.get("recompute"))))
    parts += [short for flag, short in FLAG_SHORT.items() if flag != "sequence_parallel" and p.get(flag)]
    return " ".join(parts)


COMPACT_PLAN_COLUMNS = ("plan", "step s", "tokens/s", "MFU", "GiB/GPU", "differs from #1", "same cost")


def compact_plans(table):
    """The best-plan table (:func:`best_plans`) as the Explorer shows it, narrow enough for a notebook beside
    the file browser: one short ``plan`` column (:func:`plan_label`) instead of fifteen knob columns, then step
    time, throughput, MFU, memory per GPU, what differs from the winner and the settings folded into the plan
    (``COMPACT_PLAN_COLUMNS``); numbers as they are (format them for display: :func:`plans_html`)."""
    import pandas as pd

    rows = [{"rank": rank, "plan": plan_label(row), "step s": row["step_time_s"], "tokens/s": row["tokens_per_s"],
             "MFU": row["mfu"], "GiB/GPU": row["memory_gib_per_gpu"],
             "differs from #1": row.get("differs", "") or "", "same cost": row.get("same_cost", "") or ""}
            for rank, row in zip(table.index, table.to_dict("records"))]
    return pd.DataFrame(rows, columns=["rank", *COMPACT_PLAN_COLUMNS]).set_index("rank")


PLANS_CSS = ("<style>.ts-plans{border-collapse:collapse;font-size:12px;line-height:1.3}"
             ".ts-plans th,.ts-plans td{padding:2px 6px;border-bottom:1px solid #e0e0e0;vertical-align:top}"
             ".ts-plans th{text-align:left;white-space:nowrap}.ts-plans td.num{text-align:right;white-space:nowrap}"
             ".ts-plans td.plan{font-family:monospace;white-space:nowrap}.ts-plans td.note{min-width:8em;"
             "max-width:18em;white-space:normal;color:#555}.ts-plans caption{caption-side:bottom;text-align:left;"
             "font-size:11px;color:#666;padding-top:4px}</style>")


def plans_html(table) -> str:
    """:func:`compact_plans` of ``table`` as an HTML table: numbers right-aligned and rounded (step s to 4
    figures, tokens/s whole, MFU in %, GiB to 0.1), the notes wrapping, the abbreviations spelt out below."""
    import html

    view = compact_plans(table)
    fmt = {"step s": "{:.4g}", "tokens/s": "{:,.0f}", "MFU": "{:.1%}", "GiB/GPU": "{:.1f}"}
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ("#", *view.columns))
    body = []
    for rank, row in view.iterrows():
        cells = [f"<td class='num'>{rank}</td>", f"<td class='plan'>{html.escape(row['plan'])}</td>"]
        cells += [f"<td class='num'>{fmt[c].format(row[c])}</td>" for c in fmt]
        cells += [f"<td class='note'>{html.escape(row[c]) or '–'}</td>" for c in ("differs from #1", "same cost")]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"{PLANS_CSS}<table class='ts-plans'><caption>{html.escape(PLAN_LABEL_KEY)}</caption>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


# --------------------------------------------------------------------------- the model: widgets
# Sizes for a notebook output area about 1000 px wide (JupyterLab at 1366 px with the file browser open): the three
# control columns take about 970 px, the two charts share a row down to ~820 px and stack below it.
CONTROL_WIDTH = "300px"
LABEL_WIDTH = "96px"
TOGGLE_LABEL_WIDTH = "80px"
CHART_FLEX = "1 1 400px"  # grow and shrink alike from 400 px: two charts per row at >= ~820 px, else one
CHAR_PX, BUTTON_PADDING_PX = 8, 20  # a 13 px UI font's widest lower-case average; ipywidgets pads 10 px a side


def button_width(labels: Sequence[Any]) -> str:
    """A ToggleButtons ``button_width`` that shows the longest of ``labels`` in full (no "select..."):
    ``CHAR_PX`` per character plus the button's padding."""
    return f"{CHAR_PX * max(len(str(label)) for label in labels) + BUTTON_PADDING_PX}px"


class Explorer:
    """Menus and sliders over the model; every change re-evaluates the plan (:func:`evaluate`) and redraws
    the read-out and the two figures. ``numbers`` holds the read-out's values, ``evaluation`` the last
    evaluation, ``plans`` the last best-plan table; ``widget`` is what to display.

    ``Explorer(model=..., system=..., gpus=..., global_batch=..., **plan)``: the start values."""

    KNOBS = ("tp", "pp", "cp", "micro_batch", "interleave", "ep")
    FLAGS = ("sequence_parallel", "flash_attention", "overlap_grad_reduce", "tp_comm_overlap")

    def __init__(self, model: str = "llama2-7b", system: str = "dgx-h100", gpus: int = 16,
                 global_batch: int = 64, top: int = 5, **plan: Any):
        import ipywidgets as w

        unknown = set(plan) - set(self.KNOBS) - set(self.FLAGS) - {"recompute", "zero", "stack"}
        if unknown:
            raise SpecError("plan", sorted(unknown)[0], "not a knob of the explorer; knobs: "
                            + ", ".join(self.KNOBS + self.FLAGS + ("recompute", "zero", "stack")))
        resolve_model(model), resolve_system(system)  # a bad name: one line naming it, before any widget
        self._busy = False
        self.numbers: dict[str, float] = {}
        self.evaluation: Evaluation | None = None
        self.plans = None
        self.time_figure = self.memory_figure = None
        wide = w.Layout(width=CONTROL_WIDTH)
        style = {"description_width": LABEL_WIDTH}
        toggle = {"description_width": TOGGLE_LABEL_WIDTH}
        self.w: dict[str, Any] = {
            "model": w.Dropdown(options=models(), value=model, description="model", layout=wide, style=style),
            "system": w.Dropdown(options=systems(), value=system, description="system", layout=wide,
                                 style=style),
            "gpus": w.SelectionSlider(options=gpu_choices(gpus), value=int(gpus), description="GPUs",
                                      layout=wide, style=style, continuous_update=False),
            "global_batch": w.BoundedIntText(value=int(global_batch), min=1, max=2**24,
                                             description="global batch", layout=wide, style=style),
            "stack": w.Dropdown(options=list(STACKS), value=plan.get("stack", DEFAULT_STACK),
                                description="stack", layout=wide, style=style),
            "recompute": w.ToggleButtons(options=list(RECOMPUTE_MODES), value=plan.get("recompute", "full"),
                                         description="recompute",
                                         style={**toggle, "button_width": button_width(RECOMPUTE_MODES)}),
            "zero": w.ToggleButtons(options=[0, 1, 2, 3], value=int(plan.get("zero", 0)), description="ZeRO",
                                    style={**toggle, "button_width": "40px"}),
        }
        for knob in self.KNOBS:
            self.w[knob] = w.SelectionSlider(options=[int(plan.get(knob, 1))], value=int(plan.get(knob, 1)),
                                             description=knob.replace("_", "-"), layout=wide, style=style,
                                             continuous_update=False)
        for flag in self.FLAGS:
            self.w[flag] = w.Checkbox(value=bool(plan.get(flag, False)), description=flag.replace("_", " "),
                                      indent=False, layout=w.Layout(width="200px"))
        self.dp_label = w.HTML()
        self.readout = w.HTML()
        # the charts share their row (flex from one basis, min_width 0 so a wide plot cannot push its box out of
        # the notebook; plotly fills whatever width the box gets) and wrap to one column on narrow screens
        chart = dict(flex=CHART_FLEX, min_width="0")
        self.time_out, self.memory_out = w.Output(layout=w.Layout(**chart)), w.Output(layout=w.Layout(**chart))
        # the best plans as an HTML table (plans_html): its value is the table, testable and kept in a saved
        # notebook's widget state; a table wider than the area scrolls inside it rather than past it
        self.plans_view = w.HTML(layout=w.Layout(max_width="100%", overflow="auto"))
        self.top = w.BoundedIntText(value=int(top), min=1, max=50, description="plans", layout=w.Layout(
            width="160px"))
        self.search_button = w.Button(description="find best plans", icon="search",
                                      tooltip="planner.search over the default plan space (seconds)")
        self.apply_button = w.Button(description="use best plan", tooltip="set the knobs to the best plan found",
                                     disabled=True)
        self.search_button.on_click(lambda _: self.search())
        self.apply_button.on_click(lambda _: self.apply_plan(self.best_plan()))
        for widget in self.w.values():
            widget.observe(self._on_change, names="value")
        col = w.VBox
        row = w.Layout(flex_flow="row wrap", width="100%")  # wrap rather than run past the output area
        self.charts = w.HBox([self.time_out, self.memory_out], layout=row)
        self.widget = w.VBox([
            w.HBox([col([self.w["model"], self.w["system"], self.w["gpus"], self.w["global_batch"],
                         self.w["stack"]]),
                    col([self.w["tp"], self.w["pp"], self.w["cp"], self.dp_label, self.w["micro_batch"],
                         self.w["interleave"], self.w["ep"]]),
                    col([self.w["recompute"], self.w["zero"], *[self.w[f] for f in self.FLAGS]])], layout=row),
            self.readout,
            self.charts,
            w.HBox([self.search_button, self.top, self.apply_button], layout=row),
            self.plans_view,
        ], layout=w.Layout(width="100%"))
        self._refresh_options()
        self.update()

    # ---- state
    def values(self) -> dict[str, Any]:
        """The current inputs: model, system, gpus, global batch and the plan knobs (dp derived)."""
        v = {name: widget.value for name, widget in self.w.items()}
        v["dp"] = v["gpus"] // (v["tp"] * v["pp"] * v["cp"])
        return v

    def _plan(self) -> dict[str, Any]:
        v = self.values()
        return {k: v[k] for k in (*self.KNOBS, *self.FLAGS, "dp", "recompute", "zero", "stack")}

    def _refresh_options(self) -> None:
        """Re-derive each knob's valid values from the ones before it, keeping a value where still valid."""
        v = {name: widget.value for name, widget in self.w.items()}
        choices = plan_choices(v["model"], v["gpus"], v["global_batch"], v["tp"], v["pp"], v["cp"],
                               v["micro_batch"])
        busy, self._busy = self._busy, True
        try:
            for knob in ("tp", "pp", "cp", "micro_batch"):
                self._set_options(knob, choices[knob])
                v[knob] = self.w[knob].value
            # interleave and ep depend on the micro-batch and dp chosen just above
            choices = plan_choices(v["model"], v["gpus"], v["global_batch"], v["tp"], v["pp"], v["cp"],
                                   v["micro_batch"])
            self._set_options("interleave", choices["interleave"])
            self._set_options("ep", choices["ep"])
            self.w["tp_comm_overlap"].disabled = not self.w["sequence_parallel"].value
            if not self.w["sequence_parallel"].value:
                self.w["tp_comm_overlap"].value = False
            dp = choices["dp"][0]
            note = "" if choices["micro_batch"] else f" — does not divide the global batch {v['global_batch']}"
            self.dp_label.value = f"<span style='margin-left:8px'>dp = <b>{dp}</b> (GPUs / tp·pp·cp){note}</span>"
        finally:
            self._busy = busy

    def _set_options(self, knob: str, options: list) -> None:
        widget = self.w[knob]
        options = list(options) or [widget.value]
        keep = widget.value if widget.value in options else _nearest(options, widget.value)
        if list(widget.options) != options:
            widget.options = options
        widget.value = keep

    def _on_change(self, change) -> None:
        if self._busy:
            return
        self._refresh_options()
        self.update()

    # ---- callbacks
    def update(self) -> Evaluation:
        """Evaluate the current plan and redraw the read-out and figures (every widget change calls it)."""
        v = self.values()
        self.evaluation = evaluate(v["model"], v["system"], v["gpus"], v["global_batch"], **self._plan())
        self.numbers = self.evaluation.numbers
        self.time_figure = time_breakdown_figure(self.evaluation.prediction)
        self.memory_figure = memory_figure(self.evaluation.prediction, self.evaluation.capacity_gib)
        self.readout.value = self._readout_html()
        for out, fig in ((self.time_out, self.time_figure), (self.memory_out, self.memory_figure)):
            self._show(out, fig)
        return self.evaluation

    def search(self):
        """Find the best plans for the current model, system, GPUs, batch and stack (:func:`best_plans`)."""
        v = self.values()
        self.plans_view.value = (f"<p><i>searching the plans of {v['model']} on {v['gpus']} GPUs of {v['system']}"
                                 " ...</i></p>")
        self.plans = best_plans(v["model"], v["system"], v["gpus"], v["global_batch"], top=self.top.value,
                                stack=v["stack"])
        # the compact view: fifteen knob columns would need a sideways scroll at ~1000 px
        self.plans_view.value = ("<p>no plan fits (or no tp·pp·dp split of the GPU count exists)</p>"
                                 if self.plans.empty else plans_html(self.plans))
        self.apply_button.disabled = self.plans is None or self.plans.empty
        return self.plans

    def best_plan(self) -> dict | None:
        """The first row of the last search as plan fields, or None."""
        if self.plans is None or self.plans.empty:
            return None
        row = self.plans.iloc[0]
        return {k: (row[k].item() if hasattr(row[k], "item") else row[k]) for k in BEST_PLAN_COLUMNS}

    def apply_plan(self, plan: Mapping[str, Any] | None) -> Evaluation | None:
        """Set the knobs to ``plan`` (e.g. :meth:`best_plan`) and re-evaluate once. Fields the explorer has
        no knob for (``shard_group``, ``zero3_per_tensor``) keep their defaults."""
        if not plan:
            return None
        busy, self._busy = self._busy, True
        try:
            for knob in ("tp", "pp", "cp", "micro_batch", "interleave", "ep"):
                if plan.get(knob) is not None:
                    self._refresh_options()
                    if int(plan[knob]) not in self.w[knob].options:
                        self.w[knob].options = sorted({*self.w[knob].options, int(plan[knob])})
                    self.w[knob].value = int(plan[knob])
            for key in ("recompute", "zero", *self.FLAGS):
                if plan.get(key) is not None:
                    self.w[key].value = plan[key] if key == "recompute" else (
                        int(plan[key]) if key == "zero" else bool(plan[key]))
            self._refresh_options()
        finally:
            self._busy = busy
        return self.update()

    # ---- display
    def _readout_html(self) -> str:
        ev = self.evaluation
        if ev.prediction is None:
            return f"<p style='color:#D55E00'><b>invalid plan:</b> {ev.error}</p>"
        n = self.numbers
        fits = ("fits" if ev.prediction.fits else
                f"<span style='color:#D55E00'>does not fit: {ev.prediction.reason}</span>")
        return ("<p style='font-size:110%'>"
                f"step <b>{n['step_time_s']:.4g} s</b> · {n['tokens_per_s']:,.0f} tokens/s · "
                f"MFU <b>{n['mfu']:.1%}</b> (HFU {n['hfu']:.1%}) · "
                f"memory <b>{n['memory_gib_per_gpu']:.1f}</b> / {n['memory_capacity_gib']:g} GiB per GPU ({fits}) · "
                f"{n['power_W_per_gpu']:.0f} W per GPU · {n['energy_J_per_token']:.3g} J/token</p>")

    @staticmethod
    def _show(out, fig) -> None:
        from IPython.display import clear_output, display

        with out:
            clear_output(wait=True)
            display(fig)


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

