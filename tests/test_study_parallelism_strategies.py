"""parallelism-strategies (Narayanan et al. 2021, arXiv 2104.04473): PTD-P vs ZeRO-3 as GPUs double at a
fixed batch, and TP = node size winning the TP x PP split; unit tests of the study functions and the
paper's effects on the quick workflow's outputs."""

import numpy as np
import pytest
from conftest import notebook_text
import xarray as xr
from trainscale import io as tsio
from trainscale import perfmodel
from trainscale.specs import PlanSpec, RunSpec, SpecError, resolve_system
from trainscale.studies import parallelism_strategies as ps

STUDY = "parallelism-strategies"
SYSTEM = "dgx-a100-80gb"




def _read(results, name):
    return tsio.read_dataset(results / "figures" / STUDY / name)


# --------------------------------------------------------------------------- unit tests
def test_strategy_spaces_follow_the_paper():
    z3 = ps.strategy_space("zero-3", "gpt-175b", SYSTEM, 768, 1536)
    assert z3["tp"] == [1] and z3["pp"] == [1] and z3["zero"] == [3] and z3["zero3_per_tensor"] == [1]
    ptdp = ps.strategy_space("ptd-p", "gpt-530b", SYSTEM, 1120, 2240)
    assert max(ptdp["tp"]) == 8  # tensor parallelism stays inside the node
    assert 35 in ptdp["pp"] and all(1120 % p == 0 and p <= 105 for p in ptdp["pp"])
    assert ps.strategy_space("ptd-p-node-tp", "gpt-530b", SYSTEM, 1120, 2240)["tp"] == [8]
    for space in (z3, ptdp):  # the paper's 2021 software everywhere
        assert space["recompute"] == ["full"] and space["flash_attention"] == [0]
        assert space["overlap_grad_reduce"] == [0] and space["sequence_parallel"] == [0]


def test_best_plan_is_the_best_of_its_space_by_brute_force():
    space = {**ps.strategy_space("zero-3", "gpt-175b", SYSTEM, 768, 1536)}
    best = ps.best_plan("gpt-175b", SYSTEM, 768, 1536, space)
    system = resolve_system(SYSTEM)
    rates = []
    for mb in space["micro_batch"]:
        p = perfmodel.predict(RunSpec(id="x", model=ps.study_model("gpt-175b"), system=system,
                                      plan=PlanSpec(tp=1, pp=1, dp=768, micro_batch=mb, global_batch=1536, zero=3,
                                                    zero3_per_tensor=True, flash_attention=False)))
        if p.fits:
            rates.append((p.tokens_per_s, mb, p.hardware_tflops_per_gpu))
    tokens, mb, tflops = max(rates)
    assert best["plan"]["micro_batch"] == mb
    assert best["tokens_per_s"] == pytest.approx(tokens, rel=1e-12)
    assert best["hardware_tflops_per_gpu"] == pytest.approx(tflops, rel=1e-12)


def test_zero3_matches_the_published_table2_runs():
    # the study's ZeRO-3 search lands on the paper's micro-batches and within 12% of its TFLOP/s
    ds = ps.strategy_scaling(["gpt-175b"], [384], [1536], doublings=3, strategies=("zero-3",))
    assert ds["micro_batch"].sel(strategy="zero-3").values.ravel().tolist() == [4, 2, 1]
    got = ds["hardware_tflops_per_gpu"].sel(strategy="zero-3").values.ravel()
    np.testing.assert_allclose(got, [144.0, 88.0, 44.0], rtol=0.12)
    # halving each GPU's share of the batch costs ZeRO-3 at least a quarter of its rate per doubling
    assert np.all(got[1:] / got[:-1] < 0.75)
    assert "speedup_vs_zero3" in ds and np.allclose(ds["speedup_vs_zero3"].values, 1.0)


def test_paper_plans_are_predicted_within_15_percent_of_table2():
    # within 0-5% with the Ampere-only calibration; since one fit serves every stack and generation
    # (the published Megatron runs' own MAPE went from 5.2% to 7.1%) +8-9% for 175B and +12-14% for
    # 530B: the joint fit's GEMM efficiency favours large Megatron models (closing note, issue 10)
    ds = ps.strategy_scaling(["gpt-175b", "gpt-530b"], [384, 560], [1536, 2240], doublings=3, strategies=("zero-3",))
    for model in ds["model"].values.tolist():
        ref = ps.paper_reference(model)
        got = ds["paper_plan_tflops_per_gpu"].sel(model=model).values
        np.testing.assert_allclose(got, list(ref["ptd-p"].values()), rtol=0.15)


def test_dataset_metadata_and_determinism():
    a = ps.strategy_scaling(["gpt-175b"], [384], [1536], doublings=2, strategies=("ptd-p-node-tp", "zero-3"))
    b = ps.strategy_scaling(["gpt-175b"], [384], [1536], doublings=2, strategies=("ptd-p-node-tp", "zero-3"))
    xr.testing.assert_identical(a, b)
    assert a["gpus"].values.tolist() == [[384, 768]]
    for name, var in a.variables.items():
        if name not in ("model", "strategy"):
            assert "units" in var.attrs and "long_name" in var.attrs, name
    assert "parameters" in a.attrs and "git_commit" in a.attrs
    # the fitted plans hold all GPUs
    fits = a["fits"].values
    prod = (a["tp"] * a["pp"] * a["dp"]).values
    assert np.all(prod[fits] == np.broadcast_to(a["gpus"].values[:, None, :], prod.shape)[fits])


def test_tp_pp_sweep_tp8_wins_at_fixed_model_parallel_size():
    sw = ps.tp_pp_sweep("gpt-161b", 64, [32])
    assert ps.study_model("gpt-161b").params() == pytest.approx(161e9, rel=0.02)
    assert int(ps.best_tp(sw).sel(global_batch=32)) == 8
    # cells never exceed the GPUs; tp * pp * dp = GPUs where a plan fits
    fits = sw["fits"].values[0]
    tp, pp = np.meshgrid(sw["tp"].values, sw["pp"].values, indexing="ij")
    assert np.all(tp[fits] * pp[fits] * sw["dp"].values[0][fits] == 64)
    # crossing the node with tensor parallelism costs: tp 16 and 32 below tp 8 on the diagonal
    diag = {t: float(sw["hardware_tflops_per_gpu"].sel(global_batch=32, tp=t, pp=64 // t)) for t in (8, 16, 32)}
    assert diag[8] > diag[16] > diag[32]


def test_best_tp_on_a_hand_made_sweep():
    tps = np.array([1, 2, 4])
    rate = np.full((1, 3, 3), np.nan)
    rate[0, 0, 2], rate[0, 1, 1], rate[0, 2, 0] = 10.0, 30.0, 20.0  # the diagonal tp * pp = 4
    rate[0, 1, 0] = 50.0  # off the diagonal (dp = 2)
    sw = xr.Dataset({"hardware_tflops_per_gpu": (("global_batch", "tp", "pp"), rate)},
                    coords={"global_batch": [8], "tp": tps, "pp": tps}, attrs={"gpus": 4})
    assert int(ps.best_tp(sw)[0]) == 2
    assert int(ps.best_tp(sw, fixed_model_parallel=False)[0]) == 2
    rate[0, 0, 0] = 99.0
    assert int(ps.best_tp(sw, fixed_model_parallel=False)[0]) == 1


def test_published_comparison_marks_the_overlap():
    scaling = ps.strategy_scaling(["gpt-175b"], [384], [1536], doublings=3, strategies=("zero-3",))
    v = ps.published_comparison(scaling)
    overlap = np.isfinite(v["study_tflops_per_gpu"].values)
    assert overlap.sum() == 3 and set(v["strategy"].values[overlap]) == {"zero-3"}
    np.testing.assert_allclose(v["study_tflops_per_gpu"].values[overlap], v["predicted_tflops_per_gpu"].values[overlap])
    assert float(np.abs(v["rel_error"]).mean()) < 0.10


@pytest.mark.parametrize("call, field", [
    (lambda: ps.strategy_scaling(["gpt-175b"], [0], [1536]), "base_gpus"),
    (lambda: ps.strategy_scaling(["gpt-175b"], [384, 768], [1536]), "base_gpus"),
    (lambda: ps.strategy_scaling(["gpt-175b"], [384], [1536], doublings=0), "doublings"),
    (lambda: ps.strategy_scaling(["gpt-175b"], [384], [1536], strategies=("fsdp",)), "strategies"),
    (lambda: ps.strategy_scaling(["no-such-model"], [384], [1536]), "model"),
    (lambda: ps.tp_pp_sweep("gpt-161b", 48, [32]), "gpus"),
    (lambda: ps.tp_pp_sweep("gpt-161b", 64, []), "global_batches"),
    (lambda: ps.strategy_space("ddp", "gpt-175b", SYSTEM, 64, 64), "strategy"),
])
def test_bad_inputs_name_the_field(call, field):
    with pytest.raises(SpecError) as err:
        call()
    assert err.value.field == field
    assert field in str(err.value)


# --------------------------------------------------------------------------- the paper's effects (quick workflow)
@pytest.mark.workflow
def test_ptdp_beats_zero3_more_as_gpus_double(quick_workflow):
    ds = _read(quick_workflow, "strategies.nc")
    assert {"gpt-175b", "gpt-530b"} <= set(ds["model"].values.tolist())
    for model in ds["model"].values.tolist():
        ratio = ds["speedup_vs_zero3"].sel(model=model, strategy="ptd-p").values
        assert ratio[-1] > 1.5, f"{model}: PTD-P only {ratio[-1]:.2f}x ZeRO-3 at the largest count"
        # the advantage grows as the GPUs double (flat within 1% allowed), and grows overall
        assert np.all(np.diff(ratio) > -0.01 * ratio[:-1]), ratio
        assert ratio[-1] > 1.4 * ratio[0], ratio
        zero3 = ds["hardware_tflops_per_gpu"].sel(model=model, strategy="zero-3").values
        assert np.all(np.diff(zero3) < 0) and zero3[-1] < 0.65 * zero3[0], zero3
        ptdp = ds["hardware_tflops_per_gpu"].sel(model=model, strategy="ptd-p").values
        assert ptdp[-1] > 0.85 * ptdp[0], ptdp  # PTD-P keeps its per-GPU rate
    r175 = float(ds["speedup_vs_zero3"].sel(model="gpt-175b", strategy="ptd-p").isel(doubling=1))
    assert 1.5 < r175 < 2.5  # paper: ~1.7x at 768 GPUs
    text = notebook_text(quick_workflow, STUDY)
    assert f"at 2× GPUs and fixed batch, PTD-P is {r175:.2f}× ZeRO-3 for 175B (paper: ~1.7×)" in text
    assert "ZeRO-3 for 530B (paper: ~1.7×)" in text


@pytest.mark.workflow
def test_tp_equal_to_node_size_wins_the_sweep(quick_workflow):
    sw = _read(quick_workflow, "tp_pp_sweep.nc")
    assert sw.attrs["gpus_per_node"] == 8
    best = ps.best_tp(sw)
    smallest = int(sw["global_batch"].min())
    assert int(best.sel(global_batch=smallest)) == 8
    diag = sw["hardware_tflops_per_gpu"].where(sw["tp"] * sw["pp"] == sw.attrs["gpus"]).max("pp")
    for b in sw["global_batch"].values:  # tp = 8 within 1% of the best split at every batch
        assert float(diag.sel(global_batch=b, tp=8)) >= 0.99 * float(diag.sel(global_batch=b).max())
    assert "best TP in the TP×PP sweep: 8 (= GPUs per node)" in notebook_text(quick_workflow, STUDY)


@pytest.mark.workflow
def test_published_runs_are_compared(quick_workflow):
    v = _read(quick_workflow, "published.nc")
    assert np.isfinite(v["study_tflops_per_gpu"].values).sum() >= 3
    mape = float(np.abs(v["rel_error"]).mean())
    assert f"published Narayanan et al. 2021 runs: MAPE {mape:.1%}" in notebook_text(quick_workflow, STUDY)
    for name in ("tflops_vs_gpus.png", "tp_pp_heatmap.png"):
        assert (quick_workflow / "figures" / STUDY / name).stat().st_size > 10_000
