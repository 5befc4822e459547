"""notebooks/explore.ipynb, trainscale.interface.explore and explore_figures (issue 12 part 3): the notebook runs
headless, the widgets' callbacks show the model's numbers for the values they were set to, and every study's
interactive main figure holds its committed dataset's values."""

import ast
import json
import math

import numpy as np
import pytest

from conftest import REPO_ROOT

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

from trainscale.interface import explore, explore_figures
from trainscale.model import perfmodel  # noqa: E402
from trainscale.model import planner
from trainscale.common import io as tsio  # noqa: E402
from trainscale.model.specs import RunSpec  # noqa: E402
from trainscale.studies import registry  # noqa: E402

FIGURES = REPO_ROOT / "figures"
NOTEBOOK = REPO_ROOT / "notebooks" / "explore.ipynb"


def predicted(model, system, gpus, global_batch, **plan):
    return perfmodel.predict(RunSpec.from_dict({"id": "t", "model": model, "system": system, "gpus": gpus,
                                                "plan": {**plan, "global_batch": global_batch}}))


def assert_numbers_equal(numbers, p):
    for name in explore.NUMBER_FIELDS:
        assert numbers[name] == pytest.approx(getattr(p, name), rel=1e-12), name
    assert numbers["fits"] == float(p.fits)


# ----------------------------------------------------------------------------- plain functions

def test_plan_choices_offer_only_valid_values():
    c = explore.plan_choices("llama2-70b", 64, 256, tp=8, pp=2)
    assert c["tp"] == [1, 2, 4, 8]  # 64 heads, 8 KV heads
    assert c["dp"] == [64 // (8 * 2 * c["cp"][0])]
    assert all(64 // 8 % p == 0 and p <= 80 for p in c["pp"])
    assert all(256 % (c["dp"][0] * b) == 0 for b in c["micro_batch"])
    assert c["ep"] == [1]
    moe = explore.plan_choices("moe-1.8t", 1024, 1024, tp=8, pp=8)
    assert moe["ep"] and all(16 % e == 0 and moe["dp"][0] % e == 0 for e in moe["ep"])
    # a batch the data-parallel ranks cannot share: no micro-batch is valid
    assert explore.plan_choices("llama2-7b", 16, 30)["micro_batch"] == []


def test_evaluate_equals_predict_and_reports_bad_plans_as_one_line():
    ev = explore.evaluate("llama2-7b", "dgx-h100", 16, 64, tp=2, pp=2, recompute="selective")
    assert ev.error is None
    p = predicted("llama2-7b", "dgx-h100", 16, 64, tp=2, pp=2, recompute="selective")
    assert_numbers_equal(ev.numbers, p)
    assert ev.numbers["memory_capacity_gib"] > 0
    bad = explore.evaluate("llama2-7b", "dgx-h100", 16, 30, tp=2, pp=2)
    assert bad.prediction is None and "\n" not in bad.error and "global_batch" in bad.error
    assert all(math.isnan(v) for k, v in bad.numbers.items() if k != "memory_capacity_gib")


def test_breakdown_and_memory_figures_hold_the_prediction():
    p = predicted("llama2-7b", "dgx-h100", 16, 64, tp=2, pp=2)
    t = explore.time_breakdown_figure(p)
    assert list(t.data[0].x) == list(p.breakdown)
    assert list(t.data[0].y) == pytest.approx(list(p.breakdown.values()), rel=1e-15)
    assert sum(t.data[0].y) == pytest.approx(p.step_time_s, rel=1e-9)
    m = explore.memory_figure(p, 80.0)
    assert list(m.data[0].y) == pytest.approx(list(p.memory_breakdown_gib.values()), rel=1e-15)
    assert sum(m.data[0].y) == pytest.approx(p.memory_gib_per_gpu, rel=1e-9)


def test_best_plans_are_the_search_results():
    table = explore.best_plans("llama2-7b", "dgx-h100", 8, 32, top=3)
    _, ranked = planner.search("llama2-7b", "dgx-h100", 8, 32, top=3)
    assert len(table) == len(ranked) == 3
    assert list(table["step_time_s"]) == pytest.approx([r["step_time_s"] for r in ranked], rel=1e-12)
    assert list(table["tp"]) == [r["plan"]["tp"] for r in ranked]
    assert list(table["step_time_s"]) == sorted(table["step_time_s"])


# ----------------------------------------------------------------------------- widget callbacks

def test_widget_changes_update_the_numbers_to_the_models():
    ex = explore.Explorer(model="llama2-7b", system="dgx-h100", gpus=16, global_batch=64, tp=2, pp=2,
                          recompute="selective")
    assert_numbers_equal(ex.numbers, predicted("llama2-7b", "dgx-h100", 16, 64, tp=2, pp=2, recompute="selective",
                                               flash_attention=False))
    before = dict(ex.numbers)

    ex.w["tp"].value = 4  # the observer re-evaluates: dp = 16 / (4 * 2) = 2
    assert ex.values()["dp"] == 2
    assert ex.numbers["step_time_s"] != before["step_time_s"]
    assert_numbers_equal(ex.numbers, predicted("llama2-7b", "dgx-h100", 16, 64, tp=4, pp=2, recompute="selective",
                                               flash_attention=False))
    assert list(ex.time_figure.data[0].y) == pytest.approx(list(ex.evaluation.prediction.breakdown.values()))

    ex.w["flash_attention"].value = True
    ex.w["zero"].value = 1
    assert_numbers_equal(ex.numbers, predicted("llama2-7b", "dgx-h100", 16, 64, tp=4, pp=2, recompute="selective",
                                               flash_attention=True, zero=1))

    ex.w["system"].value = "dgx-a100-80gb"
    assert ex.numbers["memory_capacity_gib"] == pytest.approx(80.0, abs=1.0)
    assert_numbers_equal(ex.numbers, predicted("llama2-7b", "dgx-a100-80gb", 16, 64, tp=4, pp=2,
                                               recompute="selective", flash_attention=True, zero=1))

    # a larger model: tp options follow its heads, the numbers its prediction
    ex.w["model"].value = "llama2-70b"
    ex.w["gpus"].value = 64
    v = ex.values()
    assert v["gpus"] == v["tp"] * v["pp"] * v["cp"] * v["dp"]
    assert_numbers_equal(ex.numbers, predicted("llama2-70b", "dgx-a100-80gb", 64, 64, tp=v["tp"], pp=v["pp"],
                                               cp=v["cp"], micro_batch=v["micro_batch"], recompute="selective",
                                               flash_attention=True, zero=1))


def test_invalid_setting_shows_the_error_and_nan():
    ex = explore.Explorer(model="llama2-7b", system="dgx-h100", gpus=16, global_batch=64)
    ex.w["global_batch"].value = 30  # dp 16 does not divide 30
    assert math.isnan(ex.numbers["step_time_s"])
    assert "global_batch" in ex.evaluation.error and "invalid plan" in ex.readout.value
    ex.w["global_batch"].value = 64
    assert np.isfinite(ex.numbers["step_time_s"])


def test_search_and_apply_best_plan_callbacks():
    ex = explore.Explorer(model="llama2-7b", system="dgx-h100", gpus=8, global_batch=32, top=3)
    ex.search_button.click()  # the button's callback: best_plans for the current setting
    assert len(ex.plans) == 3 and not ex.apply_button.disabled
    best = ex.best_plan()
    ex.apply_button.click()
    v = ex.values()
    for knob in ("tp", "pp", "cp", "micro_batch", "interleave", "recompute", "zero", "flash_attention",
                 "sequence_parallel", "overlap_grad_reduce"):
        assert v[knob] == best[knob], knob
    assert ex.numbers["step_time_s"] == pytest.approx(float(ex.plans["step_time_s"].iloc[0]), rel=1e-9)


# ----------------------------------------------------------------------------- study figures

def _study_dirs():
    return sorted(p.name for p in FIGURES.iterdir() if p.is_dir() and any(p.glob("*.nc")))


def test_every_study_with_a_dataset_has_a_figure_or_a_clear_reason():
    figures = explore_figures.interactive_figures(FIGURES)
    for study in _study_dirs():
        assert study in figures
        if isinstance(figures[study], str):
            assert study in figures[study] and study not in explore_figures.MAIN_FIGURES
    for study in explore_figures.MAIN_FIGURES:  # every registered study with committed figures has one
        assert not isinstance(figures.get(study, ""), str), figures.get(study)
    with pytest.raises(explore_figures.NoInteractiveFigure, match="no-such-study"):
        explore_figures.interactive_figure("no-such-study", FIGURES)


def test_a_figure_is_a_standalone_html_page(tmp_path):
    """Interactive without a server or kernel: plotly.js and the data in one file."""
    page = tmp_path / "overlap.html"
    explore_figures.interactive_figure("overlap", FIGURES).write_html(page, include_plotlyjs=True)
    text = page.read_text(encoding="utf-8")
    assert "Plotly.newPlot" in text and "step time" in text


@pytest.mark.parametrize("study", sorted(explore_figures.MAIN_FIGURES))
def test_interactive_figure_data_equal_the_dataset(study):
    spec = explore_figures.MAIN_FIGURES[study]
    # the main figure is the first figure the study declares
    assert spec.figure == [o for o in registry.load(study).outputs if o.endswith(".png")][0]
    ds = tsio.read_dataset(FIGURES / study / spec.dataset)
    fig = explore_figures.interactive_figure(study, FIGURES)
    traces = [t for t in fig.data if not (t.meta or {}).get("reference")]
    assert traces
    if spec.kind == "gantt":
        for t in traces:
            sel = ds.sel({spec.facet_row: t.meta["selection"][spec.facet_row]})
            keep = np.isfinite(sel["start_s"].values) & (sel["op"].values == t.meta["selection"]["op"])
            np.testing.assert_array_equal(np.asarray(t.base, float), sel["start_s"].values[keep])
            np.testing.assert_allclose(np.asarray(t.x, float), (sel["end_s"] - sel["start_s"]).values[keep],
                                       rtol=1e-15)
        n = sum(len(t.base) for t in traces)
        assert n == int(np.isfinite(ds["start_s"].values).sum())
        return
    drawn = 0
    for t in traces:
        variable, selection = t.meta["variable"], t.meta["selection"]
        assert variable in spec.y
        x, y = explore_figures.trace_expected(ds, spec, variable, selection)
        np.testing.assert_array_equal(np.asarray(t.y, float), np.asarray(y, float))
        assert list(t.x) == x.tolist()
        drawn += len(t.y)
    # every value of the drawn variables is in the figure, once (minus the reduced dimensions)
    expected = 0
    for variable in spec.y:
        da = ds[variable]
        for key, value in spec.sel.items():
            da = da.sel({key: value}) if key in da.dims else da
        expected += int(np.prod([n for d, n in da.sizes.items() if d not in spec.reduce]))
    assert drawn == expected


def test_spot_checks_against_the_dataset_directly():
    """Independent of trace_expected: a few traces read back by name."""
    fig = explore_figures.interactive_figure("datacenter-design", FIGURES)
    ds = tsio.read_dataset(FIGURES / "datacenter-design" / "datacenter_design.nc")
    trace = next(t for t in fig.data if t.name == "moe-1.8t, flat")
    np.testing.assert_array_equal(trace.y, ds["mfu_domain"].sel(model="moe-1.8t", network="flat").values)
    np.testing.assert_array_equal(trace.x, ds["domain"].values)

    fig = explore_figures.interactive_figure("geo-distributed", FIGURES)
    ds = tsio.read_dataset(FIGURES / "geo-distributed" / "geo_pipeline.nc")
    trace = next(t for t in fig.data if t.name == "baseline")
    geomean = np.exp(np.log(ds["tokens_per_s"].sel(approach="baseline").values).mean(axis=1))
    np.testing.assert_allclose(trace.y, geomean, rtol=1e-14)

    fig = explore_figures.interactive_figure("validation", FIGURES)
    ds = tsio.read_dataset(FIGURES / "validation" / "validation.nc")
    points = sum(len(t.x) for t in fig.data if not (t.meta or {}).get("reference"))
    assert points == ds.sizes["run"]
    assert sorted(v for t in fig.data if not (t.meta or {}).get("reference") for v in t.y) == sorted(
        ds["predicted"].values.tolist())


# ----------------------------------------------------------------------------- the notebook

def test_notebook_is_committed_stripped_with_a_parameters_cell():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    params = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
    assert len(params) == 1
    ast.parse("".join(params[0]["source"]))
    source = "\n".join("".join(c["source"]) for c in code)
    assert "chdir" not in source and "trainscale.kernels" not in source
    for module in ("explore.py", "explore_figures.py"):  # the widgets and the figures: the model's API only
        tree = ast.parse((REPO_ROOT / "pkg" / "trainscale" / "interface" / module).read_text(encoding="utf-8"))
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if "kernels" in m.split(".")], (module, imported)


# slow: executes the explore notebook (8 s); CI runs it (make test-all)
@pytest.mark.slow
@pytest.mark.workflow
def test_notebook_executes_headless(tmp_path):
    papermill = pytest.importorskip("papermill")
    out = tmp_path / "explore.ipynb"
    # run from notebooks/, as JupyterLab does: figures/ is found upwards, no chdir
    papermill.execute_notebook(str(NOTEBOOK), str(out), kernel_name="python3", cwd=str(NOTEBOOK.parent),
                               parameters={"gpus": 8, "global_batch": 32, "top_plans": 3}, progress_bar=False,
                               execution_timeout=600)  # a lost kernel message fails, not hangs
    nb = json.loads(out.read_text(encoding="utf-8"))
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    mimes = [m for o in outputs for m in o.get("data", {})]
    assert "application/vnd.jupyter.widget-view+json" in mimes  # the explorer
    n_studies = len(explore_figures.MAIN_FIGURES)
    assert mimes.count("application/vnd.plotly.v1+json") >= n_studies  # every study's figure
    text = "".join("".join(o.get("text", "")) for o in outputs)
    assert f"study datasets read from {FIGURES}" in text


def test_the_pruning_explorer_shows_the_interval_the_study_draws():
    """The explorer's pruning figure selects the update interval losses.png draws (the paper's, by the study's
    rule), not one typed apart from it."""
    from trainscale.studies import pruning

    ds = tsio.read_dataset(FIGURES / "pruning" / "mixing.nc")
    assert explore_figures.MAIN_FIGURES["pruning"].sel["interval"] == pruning._paper_interval(ds)
