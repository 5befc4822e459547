"""The explore widget and the studies' interactive figures fit a notebook beside JupyterLab's file browser (issue
34 item 4: an output area of about 1000 px at 1366 px, 1150-1250 px at 1600 px): the two charts share their row
and shrink, every recompute option reads in full, the best-plan table is narrow, log axes label only full values
and titles, axis titles and legends neither collide nor go unnamed."""

import itertools
import re

import pytest

from conftest import REPO_ROOT

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

from trainscale.interface import explore, explore_figures  # noqa: E402
from trainscale.model.searchspace import FOLD_KNOBS, plan_differences, same_cost  # noqa: E402

FIGURES = REPO_ROOT / "figures"
CONTENT_PX = 1000  # the narrow output area the issue measured


def px(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)px", value or "")
    assert match, f"{value!r} is not a pixel width"
    return float(match.group(1))


@pytest.fixture(scope="module")
def explorer():
    return explore.Explorer(model="llama2-7b", system="dgx-h100", gpus=16, global_batch=64, tp=2, pp=2,
                            recompute="selective")


@pytest.fixture(scope="module")
def plans():
    return explore.best_plans("llama2-7b", "dgx-h100", 8, 32, top=3)


# ----------------------------------------------------------------------------- the widget

def test_charts_share_their_row_and_shrink_with_it(explorer):
    for out in (explorer.time_out, explorer.memory_out):
        assert out.layout.flex.startswith("1 1 "), out.layout.flex  # grow and shrink alike
        assert out.layout.min_width == "0"  # a plot's width cannot push its box past the row
        assert not out.layout.width
    assert "wrap" in explorer.charts.layout.flex_flow  # one column on a narrow screen, not a sideways cut
    # two charts side by side down to (about) the narrow output area
    assert 2 * px(explorer.time_out.layout.flex.split()[-1]) < CONTENT_PX
    for fig in (explorer.time_figure, explorer.memory_figure):
        assert fig.layout.width is None and fig.layout.autosize is True  # plotly fills its box


def test_every_recompute_option_reads_in_full(explorer):
    for name in ("recompute", "zero"):
        toggle = explorer.w[name]
        longest = max(len(str(label)) for label in toggle._options_labels)
        # ~8 px a character of the 13 px UI font, plus ipywidgets' 10 px of padding a side
        assert px(toggle.style.button_width) >= 8 * longest + 20, (name, toggle.style.button_width)
    assert "selective" in explorer.w["recompute"]._options_labels


def test_controls_fit_the_narrow_output_area(explorer):
    """The three control columns add up to less than 1000 px (and wrap, rather than cut, below that)."""
    top_row = explorer.widget.children[0]
    assert "wrap" in top_row.layout.flex_flow
    first, second, third = top_row.children
    widths = [max(px(c.layout.width) for c in col.children if getattr(c.layout, "width", None))
              for col in (first, second)]
    recompute = explorer.w["recompute"]
    toggles = px(recompute.style.description_width) + len(recompute.options) * (
        px(recompute.style.button_width) + 4)
    assert sum(widths) + toggles < CONTENT_PX


# ----------------------------------------------------------------------------- the best-plan table

def test_plan_label_names_a_plan_in_one_short_line():
    plan = dict(tp=8, pp=4, dp=16, cp=1, ep=1, interleave=2, micro_batch=2, recompute="selective", zero=1,
                shard_group=0, sequence_parallel=True, flash_attention=True, overlap_grad_reduce=False,
                tp_comm_overlap=False, zero3_per_tensor=False)
    assert explore.plan_label(plan) == "tp8 pp4 dp16 vp2 mb2 zero1 sp sel-rc fa"
    # settings without effect are left out as the search's canonical form leaves them out
    assert explore.plan_label({**plan, "tp": 1, "zero": 0, "shard_group": 8}) == "tp1 pp4 dp16 vp2 mb2 sel-rc fa"
    assert "sg8" in explore.plan_label({**plan, "shard_group": 8})


def test_compact_table_is_narrow_and_holds_the_numbers(plans):
    view = explore.compact_plans(plans)
    assert len(view.columns) <= 8  # instead of 15 knob columns and 4 numbers
    for column in ("plan", "step s", "tokens/s", "MFU", "GiB/GPU", "differs from #1", "same cost"):
        assert column in view.columns
    assert list(view["step s"]) == list(plans["step_time_s"])
    assert list(view["tokens/s"]) == list(plans["tokens_per_s"])
    assert list(view["MFU"]) == list(plans["mfu"])
    assert list(view["GiB/GPU"]) == list(plans["memory_gib_per_gpu"])
    assert max(len(label) for label in view["plan"]) <= 60
    page = explore.plans_html(plans)
    assert "ts-plans" in page and "overlap_grad_reduce" not in page.split("</style>")[1].split("<caption>")[0]
    assert f"{plans['mfu'].iloc[0]:.1%}" in page and f"{plans['memory_gib_per_gpu'].iloc[0]:.1f}" in page


def test_best_plans_keep_their_api_and_are_distinct_plans(plans):
    """The DataFrame keeps every knob column (best_plan reads them); no two rows are one plan: the search folds
    plans of identical cost that differ only in settings (issue 38), and the fold shows in ``same_cost``."""
    for column in (*explore.BEST_PLAN_COLUMNS, "step_time_s", "tokens_per_s", "mfu", "memory_gib_per_gpu",
                   "differs", "same_cost"):
        assert column in plans.columns
    rows = plans.to_dict("records")
    assert rows[0]["differs"] == "" and all(r["differs"] for r in rows[1:])
    labels = [explore.plan_label(r) for r in rows]
    assert len(set(labels)) == len(labels)
    for a, b in itertools.combinations(rows, 2):
        a_cost = {"step_time_s": a["step_time_s"], "memory_gib_per_gpu": a["memory_gib_per_gpu"]}
        b_cost = {"step_time_s": b["step_time_s"], "memory_gib_per_gpu": b["memory_gib_per_gpu"]}
        assert not (same_cost(a_cost, b_cost) and set(plan_differences(a, b)) <= set(FOLD_KNOBS)), (a, b)


def test_search_shows_the_compact_table():
    ex = explore.Explorer(model="llama2-7b", system="dgx-h100", gpus=8, global_batch=32, top=3)
    ex.search()
    shown = ex.plans_view.value
    assert "ts-plans" in shown and "tokens/s" in shown and explore.plan_label(ex.plans.iloc[0]) in shown
    assert len(ex.plans) == 3 and ex.best_plan()["tp"] == ex.plans["tp"].iloc[0]


# ----------------------------------------------------------------------------- the studies' figures

def test_log_ticks_label_full_values_only():
    for lo, hi in ((15, 2100), (0.001, 1.2), (2e-5, 0.1), (400, 490), (8, 2048), (1, 1e12)):
        ticks = explore_figures.log_ticks([lo, hi])
        assert 2 <= len(ticks["tickvals"]) <= 9, (lo, hi, ticks["ticktext"])
        for value, text in zip(ticks["tickvals"], ticks["ticktext"]):
            assert parse_tick(text) == pytest.approx(value, rel=1e-9), (value, text)
        assert not set(ticks["minor"]["tickvals"]) & set(ticks["tickvals"])
    assert explore_figures.log_ticks([15, 2100])["ticktext"] == ["20", "50", "100", "200", "500", "1000", "2000"]
    assert explore_figures.log_ticks([0.001, 1.2])["ticktext"] == ["0.001", "0.01", "0.1", "1"]


def parse_tick(text: str) -> float:
    scale = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    return float(text[:-1]) * scale[text[-1]] if text[-1] in scale else float(text)


def _committed():
    return [s for s, spec in sorted(explore_figures.MAIN_FIGURES.items()) if (FIGURES / s / spec.dataset).is_file()]


@pytest.fixture(scope="module")
def study_figures():
    return explore_figures.interactive_figures(FIGURES, _committed())


@pytest.mark.parametrize("study", _committed())
def test_study_figure_layout_fits_and_names_everything(study, study_figures):
    fig = study_figures[study]
    spec = explore_figures.MAIN_FIGURES[study]
    layout = fig.layout
    assert layout.width is None and layout.autosize is True
    # log axes: ticks at chosen values, each labelled with its full value (no bare minor "2", "5")
    for axis in [*fig.select_xaxes(), *fig.select_yaxes()]:
        if axis.type == "log":
            assert axis.tickmode == "array" and axis.tickvals, study
            for value, text in zip(axis.tickvals, axis.ticktext):
                assert parse_tick(text) == pytest.approx(value, rel=1e-9), (study, value, text)
    # the title block sits in the top margin, above the first row's panel titles
    title = layout.title
    assert title.yref == "container" and title.yanchor == "top"
    title_lines = title.text.count("<br>") + 1  # the subtitle is one of them
    panel_lines = max((a.text.count("<br>") + 1 for a in layout.annotations if a.text), default=0)
    assert layout.margin.t >= (explore_figures.TITLE_TOP_PX + explore_figures.LINE_PX["title"] * (title_lines - 1)
                               + explore_figures.LINE_PX["subtitle"] + explore_figures.LINE_PX["panel"] * panel_lines)
    assert (1 - title.y) * layout.height == pytest.approx(explore_figures.TITLE_TOP_PX)
    # axis titles no longer than their row (y) or panel (x): a long one cannot reach the chart title
    for axis in fig.select_yaxes():
        for line in (axis.title.text or "").split("<br>"):
            assert len(line) * explore_figures.AXIS_TITLE_PX <= explore_figures.ROW_HEIGHT_PX, (study, line)
    cols = max(1, len({a.domain[0] for a in fig.select_xaxes()}))
    for axis in fig.select_xaxes():
        for line in (axis.title.text or "").split("<br>"):
            chars = explore_figures._panel_chars(cols, explore_figures.AXIS_TITLE_PX)
            assert len(line) <= chars or " " not in line, (study, line)
    # every legend entry is named, and the legend says what the names are
    for trace in fig.data:
        if trace.showlegend is not False:
            assert trace.name and trace.name.strip(), (study, trace.meta)
    if spec.color or spec.dash:
        assert layout.legend.title.text.strip(), study
    assert layout.legend.orientation == "h"  # below the chart: the panels keep the full width
