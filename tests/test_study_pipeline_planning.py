"""pipeline-planning: the schedule simulator's invariants and the memory-limited comparison on the quick
workflow's outputs and on small direct calls (the paper comparison is judged on the committed full data by
tests/test_verify.py)."""

import numpy as np
import pytest

from trainscale.common import io as tsio
from trainscale.model.specs import SpecError
from trainscale.studies import pipeline_planning as study


@pytest.mark.workflow
def test_schedules_follow_dapple_and_its_successors(quick_workflow):
    ds = tsio.read_dataset(quick_workflow / "figures" / "pipeline-planning" / "schedules.nc")
    tput, mem = ds["tokens_per_s"], ds["peak_activation_gib"]
    for m in ds["micro_batches"].values:
        gpipe, one_f_one_b = (float(tput.sel(schedule=s, micro_batches=m)) for s in ("gpipe", "1f1b"))
        # same operations, same dependencies: equal makespan at equal micro-batch counts
        assert one_f_one_b == pytest.approx(gpipe, rel=1e-9)
        assert float(tput.sel(schedule="zb-h1", micro_batches=m)) >= one_f_one_b * (1 - 1e-9)
        assert float(tput.sel(schedule="interleaved", micro_batches=m)) >= one_f_one_b * (1 - 1e-9)
    # 1F1B holds at most pp micro-batches of activations: its memory does not grow with their count; GPipe's does
    assert np.ptp(mem.sel(schedule="1f1b").values) == pytest.approx(0.0, abs=1e-12)
    assert (np.diff(mem.sel(schedule="gpipe").values) > 0).all()


@pytest.mark.workflow
def test_planner_is_never_worse_than_its_baselines(quick_workflow):
    pl = tsio.read_dataset(quick_workflow / "figures" / "pipeline-planning" / "planner.nc")
    _check_planner(pl)


def _check_planner(pl):
    tput = pl["tokens_per_s"]
    planner = tput.sel(approach="planner").values
    for baseline in ("pipedream", "data-parallel", "even-pipeline"):
        other = tput.sel(approach=baseline).values
        ok = np.isfinite(other)
        assert (planner[ok] >= other[ok] * (1 - 1e-9)).all(), baseline
    slowest, fastest = float(pl["bandwidth_GBps"].min()), float(pl["bandwidth_GBps"].max())
    dp = pl["dp"].sel(approach="planner")
    # on a slow network the planner pipelines more (fewer replicas)
    assert (dp.sel(bandwidth_GBps=slowest).values <= dp.sel(bandwidth_GBps=fastest).values).all()


@pytest.fixture(scope="module")
def planner():
    return study.pipeline_planner("llama2-13b", "dgx-v100", 8, [16, 64], [0.625, 3.125, 50], max_stages=8,
                                  reference_global_batch=64)


def test_dapples_planner_is_never_worse_than_pipedreams_or_the_baselines(planner):
    _check_planner(planner)
    assert set(planner["dp"].sel(approach="data-parallel").values.ravel()) == {8}
    assert set(planner["pp"].sel(approach="even-pipeline").values.ravel()) == {8}


def test_compare_reads_pipedreams_speed_up_at_the_reference_batch_on_ethernet(planner, tmp_path):
    rec = study._planner_record(planner)
    gain = planner["tokens_per_s"].sel(approach="planner") / planner["tokens_per_s"].sel(approach="pipedream")
    assert rec.our_value == pytest.approx(float(gain.sel(global_batch=64, bandwidth_GBps=3.125)))
    assert rec.our_low == pytest.approx(float(gain.min())) and rec.our_high == pytest.approx(float(gain.max()))
    assert not rec.same_setting
    faster = planner.copy(deep=True)  # a PipeDream plan 3.23x slower is read as such
    faster["tokens_per_s"].loc[{"approach": "pipedream"}] = faster["tokens_per_s"].sel(approach="planner") / 3.23
    assert study._planner_record(faster).our_value == pytest.approx(3.23)


def test_the_planner_reference_batch_must_be_swept():
    with pytest.raises(SpecError, match="planner_global_batch"):
        study.pipeline_planner("llama2-13b", "dgx-v100", 8, [16, 64], [3.125], reference_global_batch=32)


@pytest.fixture(scope="module")
def limited():
    return study.memory_limited_schedules("gpt3-175b", "dgx-a100-80gb", 8, 8, [32, 64], [1, 2])


def test_a_point_fits_only_within_the_gpu_memory(limited):
    cap = limited.attrs["parameters"]
    fits, mem = limited["fits"].values, limited["memory_gib"].values
    assert np.array_equal(fits, mem <= 80.0)
    assert '"hbm_capacity_GiB": 80.0' in cap


def test_gpipe_holds_more_activations_than_1f1b_at_the_same_plan(limited):
    gpipe = limited["memory_gib"].sel(schedule="gpipe").values
    one = limited["memory_gib"].sel(schedule="1f1b").values
    ok = np.isfinite(gpipe)
    assert (gpipe[ok] >= one[ok] - 1e-9).all()
    # at the same plan both schedules run the same operations: equal throughput
    np.testing.assert_allclose(limited["tokens_per_s"].sel(schedule="gpipe"),
                               limited["tokens_per_s"].sel(schedule="1f1b"), rtol=1e-9)


def test_best_fitting_is_the_fastest_point_that_fits(limited):
    best = study.best_fitting(limited)
    for b in limited["global_batch"].values:
        for s in limited["schedule"].values:
            t = limited["tokens_per_s"].sel(global_batch=b, schedule=s).values
            f = limited["fits"].sel(global_batch=b, schedule=s).values
            assert float(best["tokens_per_s"].sel(global_batch=b, schedule=s)) == pytest.approx(np.nanmax(t[f]))


def test_the_reference_batch_must_be_swept():
    with pytest.raises(SpecError, match="reference_global_batch"):
        study.memory_limited_schedules("gpt3-175b", "dgx-a100-80gb", 8, 8, [32, 64], [1], reference_global_batch=48)
