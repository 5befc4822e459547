"""pipeline-planning: the schedule simulator's invariants and the memory-limited comparison on the quick
workflow's outputs and on small direct calls (the paper comparison is judged on the committed full data by
tests/test_verify.py)."""

import numpy as np
import pytest

from trainscale import io as tsio
from trainscale.specs import SpecError
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
    tput = pl["tokens_per_s"]
    planner = tput.sel(approach="planner").values
    for baseline in ("data-parallel", "even-pipeline"):
        assert (planner >= tput.sel(approach=baseline).values * (1 - 1e-9)).all(), baseline
    slowest, fastest = float(pl["bandwidth_GBps"].min()), float(pl["bandwidth_GBps"].max())
    # on a slow network the planner pipelines more (fewer replicas)
    assert int(pl["dp"].sel(bandwidth_GBps=slowest)) <= int(pl["dp"].sel(bandwidth_GBps=fastest))


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
