"""hardware-scaling: the plumbing on the quick workflow's outputs, and the module's functions directly (the paper
comparison is judged on the committed full data by tests/test_verify.py)."""

import json

import numpy as np
import pytest

from trainscale.common import comparison
from trainscale.model import perfmodel
from trainscale.common import io as tsio
from trainscale.model.specs import SpecError, resolve_model, resolve_system
from trainscale.studies import hardware_scaling as study

M4, M8 = 4 * 2**20, 8 * 2**20  # tokens: 1024 and 2048 Llama-2 sequences


@pytest.fixture(scope="module")
def quick(quick_workflow):
    return quick_workflow / "figures" / "hardware-scaling"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small grid saved as the notebook saves it: 7B on A100 and H100 at 128 and 2048 GPUs."""
    folder = tmp_path_factory.mktemp("hardware-scaling")
    args = (["llama2-7b"], ["dgx-a100-80gb", "dgx-h100"], [128, 2048], list(study.STRATEGIES))
    tsio.write_dataset(study.hardware_scaling(*args, global_batch_tokens=M8), folder / "hardware_scaling.nc")
    tsio.write_dataset(study.batch_sweep(*args, batches_tokens=[M4, M8]), folder / "batch_sweep.nc")
    tsio.write_dataset(study.allreduce_busbw(["dgx-a100-80gb", "dgx-h100"], [1, 2, 8], [2**20, 2**30]),
                       folder / "allreduce_busbw.nc")
    return folder


def _consistent(grid):
    fits = grid["fits"].values
    per_gpu = grid["tokens_per_s_per_gpu"].values
    assert np.isfinite(per_gpu[fits]).all() and np.isnan(per_gpu[~fits]).all()
    product = (grid["tp"] * grid["pp"] * grid["dp"]).values
    gpus = np.broadcast_to(grid["gpus"].values, product.shape)
    assert (product[fits] == gpus[fits]).all()  # whole sequences: no context parallelism
    np.testing.assert_allclose(grid["tokens_per_s"].values[fits], (per_gpu * gpus)[fits], rtol=1e-12)
    assert (grid["mfu"].values[fits] < 1).all()
    # the step's compute and exposed communication are parts of it
    parts = (grid["compute_s"] + grid["exposed_comm_s"]).values[fits]
    assert (parts <= grid["step_time_s"].values[fits] * (1 + 1e-9)).all()


@pytest.mark.workflow
def test_quick_run_plans_are_consistent(quick):
    grid = tsio.read_dataset(quick / "hardware_scaling.nc")
    _consistent(grid)
    assert json.loads(grid.attrs["parameters"])["stack"] == "fsdp"
    sweep = tsio.read_dataset(quick / "batch_sweep.nc")
    batch = json.loads(grid.attrs["parameters"])["global_batch_tokens"]
    if batch in sweep["global_batch_tokens"].values:
        np.testing.assert_array_equal(sweep["tokens_per_s_per_gpu"].sel(global_batch_tokens=batch).values,
                                      grid["tokens_per_s_per_gpu"].values)


@pytest.mark.workflow
def test_quick_run_allreduce_bus_bandwidth_rises_with_message_size(quick):
    busbw = tsio.read_dataset(quick / "allreduce_busbw.nc")["busbw_GBps"].values
    assert (np.diff(busbw, axis=-1) >= -1e-9).all()
    # more nodes never give more bus bandwidth for small messages (latency grows with the ring)
    assert (np.diff(busbw[..., 0], axis=-1) <= 1e-9).all()


@pytest.mark.workflow
def test_quick_run_records_match_compare(quick):
    records = comparison.read_records(quick / comparison.RECORDS_FILE)
    assert comparison.diff_records(study.compare(quick), records) == []


def test_small_grid_plans_are_consistent(small):
    _consistent(tsio.read_dataset(small / "hardware_scaling.nc"))


def test_a_batch_with_fewer_sequences_than_gpus_has_no_fsdp_plan(small):
    sweep = tsio.read_dataset(small / "batch_sweep.nc")
    fits = sweep["fits"].sel(model="llama2-7b", system="dgx-h100", gpus=2048)
    assert not fits.sel(strategy="fsdp", global_batch_tokens=M4)  # 1024 sequences over 2048 ranks
    assert fits.sel(strategy="fsdp", global_batch_tokens=M8)
    assert fits.sel(strategy="tp-pp", global_batch_tokens=M4)  # model parallelism needs fewer ranks
    ds = tsio.read_dataset(small / "hardware_scaling.nc")
    assert int(ds["global_batch_sequences"].sel(model="llama2-7b")) == 2048


def test_flash_attention_only_where_the_gpu_runs_it():
    model = resolve_model("llama2-7b")
    for system, flash in (("dgx-v100", [0]), ("dgx-a100-80gb", [1]), ("dgx-h100", [1])):
        for strategy in study.STRATEGIES:
            space = study.strategy_space(strategy, model, resolve_system(system), 128, 1024)
            assert space["flash_attention"] == flash and space["cp"] == [1]


def test_compare_reads_the_saved_grids(small):
    records = study.compare(small)
    assert {r.study for r in records} == {study.STUDY} and len(records) == 9
    ds = tsio.read_dataset(small / "hardware_scaling.nc")
    fsdp = ds["tokens_per_s_per_gpu"].sel(strategy="fsdp", system="dgx-h100", model="llama2-7b")
    first = records[0]
    assert first.our_value == pytest.approx(float(fsdp.sel(gpus=2048) / fsdp.sel(gpus=128) - 1))
    assert first.paper_value == study.PAPER_FSDP_CHANGE and not first.same_setting
    assert "at 4M tokens fsdp has no plan on 2048 GPUs" in first.reason
    assert first.our_low <= first.our_value <= first.our_high
    mfu = next(r for r in records if r.quantity == "MFU on dgx-h100")
    assert mfu.our_value == pytest.approx(float(ds["mfu"].sel(system="dgx-h100", strategy="fsdp").median()))


def test_compare_needs_the_papers_gpu_counts(small, tmp_path):
    for name in ("batch_sweep.nc", "allreduce_busbw.nc"):
        (tmp_path / name).write_bytes((small / name).read_bytes())
    tsio.write_dataset(tsio.read_dataset(small / "hardware_scaling.nc").sel(gpus=[128]), tmp_path / "hardware_scaling.nc")
    with pytest.raises(ValueError, match="lacks the paper's 128 and 2048"):
        study.compare(tmp_path)


@pytest.mark.parametrize("kwargs, field", [
    ({"stack": "jax"}, "stack"),
    ({"global_batch_tokens": 1000}, "global_batch_tokens"),
    ({"strategies": ["zero-2"]}, "strategies"),
    ({"gpus": [0]}, "gpus"),
])
def test_bad_input_is_named(kwargs, field):
    args = {"models": ["llama2-7b"], "systems": ["dgx-h100"], "gpus": [8], **kwargs}
    with pytest.raises(SpecError, match=field):
        study.hardware_scaling(**args)


def test_an_empty_batch_sweep_is_named():
    with pytest.raises(SpecError, match="batch_sweep_tokens"):
        study.batch_sweep(["llama2-7b"], ["dgx-h100"], [8], ["fsdp"], [])


# --------------------------------------------------------------------------- published scaling curves
def test_published_scaling_holds_the_measured_series_relative_to_their_first_point():
    from trainscale.model import validation

    pub = study.published_scaling()
    names = list(dict.fromkeys(pub["series"].values.tolist()))
    assert any("(strong)" in n for n in names) and any("(weak)" in n for n in names)
    for name in names:
        sel = pub["series"].values == name
        gpus = pub["gpus"].values[sel]
        assert len(set(gpus)) >= study.MIN_SERIES_POINTS and np.all(np.diff(gpus) >= 0)
        assert pub["measured_relative"].values[sel][0] == 1.0 and pub["predicted_relative"].values[sel][0] == 1.0
    # Narayanan et al. 2021 Table 2, ZeRO-3 without model parallelism, 175B: 144, 88, 44 TFLOP/s per GPU
    zero3 = pub.sel(run=["meg21-t2-175b-zero3-384", "meg21-t2-175b-zero3-768", "meg21-t2-175b-zero3-1536"])
    assert zero3["measured_relative"].values == pytest.approx([1.0, 88 / 144, 44 / 144], rel=1e-12)
    # the prediction of each run is the performance model's of its published plan
    runs = {m.run.id: m for m in validation.measured_runs(None)}
    m = runs["meg21-t2-175b-zero3-768"]
    first = runs["meg21-t2-175b-zero3-384"]
    ratio = perfmodel.predict(m.run).hardware_tflops_per_gpu / perfmodel.predict(first.run).hardware_tflops_per_gpu
    assert float(zero3["predicted_relative"][1]) == pytest.approx(ratio, rel=1e-12)
    for name in [*pub.data_vars, *pub.coords]:
        assert pub[name].attrs.get("long_name"), name


def test_published_scaling_figure_is_one_panel_per_series(tmp_path):
    from trainscale.common import io as tsio

    pub = study.published_scaling()
    tsio.write_dataset(pub, tmp_path / "published_scaling.nc")
    fig = study.draw_published_scaling(tmp_path)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == len(set(pub["series"].values.tolist()))
