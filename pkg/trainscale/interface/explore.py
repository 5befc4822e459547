"""Interactive exploration of the performance model (the first part of ``notebooks/explore.ipynb``): plain
functions that take values and return data or figures (testable without a browser), with a thin ipywidgets layer
on top whose callbacks only call them.

:func:`plan_choices` (the valid tp/pp/cp/micro-batch/... values for a model, GPU count and batch),
:func:`evaluate` (one plan through :func:`trainscale.model.perfmodel.predict`: step time, its breakdown, memory
per GPU by component, MFU), :func:`time_breakdown_figure`, :func:`memory_figure` and :func:`best_plans`
(:func:`trainscale.model.planner.search`, the search ``trainscale search`` runs); the :class:`Explorer` widget
wires menus and sliders to them.

The notebook's second part, each study's main figure drawn interactively from its committed dataset, is
:mod:`trainscale.interface.explore_figures` (:func:`~trainscale.interface.explore_figures.interactive_figure`);
that module also holds the plotly style both share and says why plotly.

This module reaches the model only through its public API (``perfmodel``, ``specs``, ``catalog``); it never
imports ``trainscale.kernels``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..model import catalog, perfmodel

from ..model import planner
from ..model.specs import DEFAULT_STACK, RECOMPUTE_MODES, STACKS, RunSpec, SpecError, resolve_model, resolve_system
from .explore_figures import LEGEND_BELOW, PALETTE, _wrap

__all__ = ["models", "systems", "gpu_choices", "plan_choices", "run_dict", "Evaluation", "evaluate",
           "time_breakdown_figure", "memory_figure", "best_plans", "plan_label", "compact_plans", "plans_html",
           "Explorer"]

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
