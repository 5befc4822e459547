"""parallelism-strategies (Narayanan et al. 2021, arXiv 2104.04473): PTD-P vs ZeRO-3 as GPUs double at a
fixed batch, and the TP x PP split; unit tests of the study functions and of its paper comparison (records),
and the plumbing of the quick workflow's outputs. The comparison with the paper is judged on the committed full
datasets by ``trainscale verify``, not here."""

import numpy as np
import pytest
import xarray as xr
from trainscale.common import comparison
from trainscale.common import io as tsio
from trainscale.model import perfmodel
from trainscale.model.specs import PlanSpec, RunSpec, SpecError, resolve_system
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
        assert space["sequence_parallel"] == [0]
    # Megatron reduces after the backward; DeepSpeed's ZeRO-3 prefetches and overlaps by default
    assert ptdp["overlap_grad_reduce"] == [0] and z3["overlap_grad_reduce"] == [1]


def test_best_plan_is_the_best_of_its_space_by_brute_force():
    space = {**ps.strategy_space("zero-3", "gpt-175b", SYSTEM, 768, 1536)}
    stack = ps.strategy_stack("zero-3")  # the paper ran ZeRO-3 with DeepSpeed; Megatron's rules refuse it
    best = ps.best_plan("gpt-175b", SYSTEM, 768, 1536, space, stack=stack)
    system = resolve_system(SYSTEM)
    rates = []
    for mb in space["micro_batch"]:
        p = perfmodel.predict(RunSpec(id="x", model=ps.study_model("gpt-175b"), system=system,
                                      plan=PlanSpec(tp=1, pp=1, dp=768, micro_batch=mb, global_batch=1536, zero=3,
                                                    zero3_per_tensor=True, flash_attention=False, recompute="full",
                                                    overlap_grad_reduce=True, stack=stack,
                                                    tp_async_backward=ps.PAPER_TP_ASYNC_BACKWARD)))
        if p.fits:
            rates.append((p.tokens_per_s, mb, p.hardware_tflops_per_gpu))
    tokens, mb, tflops = max(rates)
    assert best["plan"]["micro_batch"] == mb
    assert best["tokens_per_s"] == pytest.approx(tokens, rel=1e-12)
    assert best["hardware_tflops_per_gpu"] == pytest.approx(tflops, rel=1e-12)


def test_zero3_loses_rate_as_each_gpus_share_of_the_batch_halves():
    # the study's ZeRO-3 search halves the micro-batch with each GPU's share of the batch
    ds = ps.strategy_scaling(["gpt-175b"], [384], [1536], doublings=3, strategies=("zero-3",))
    assert ds["micro_batch"].sel(strategy="zero-3").values.ravel().tolist() == [4, 2, 1]
    got = ds["hardware_tflops_per_gpu"].sel(strategy="zero-3").values.ravel()
    # every GPU still gathers every layer's weights: per-GPU rate falls with each doubling
    assert np.all(np.diff(got) < 0)
    assert "speedup_vs_zero3" in ds and np.allclose(ds["speedup_vs_zero3"].values, 1.0)
    # the paper's PTD-P plan is priced where its model-parallel size divides the GPUs
    assert np.isfinite(ds["paper_plan_tflops_per_gpu"].values).all()


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


def test_tp_pp_sweep_cells_and_cross_node_tensor_parallelism():
    sw = ps.tp_pp_sweep("gpt-161b", 64, [32])
    assert ps.study_model("gpt-161b").params() == pytest.approx(161e9, rel=0.02)
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


def test_compare_records_are_well_formed(tmp_path):
    scaling = ps.strategy_scaling(["gpt-175b"], [384], [1536], doublings=2, strategies=("zero-3",))
    sweep = ps.tp_pp_sweep("gpt-161b", 64, [32])
    tsio.write_dataset(scaling, tmp_path / "strategies.nc")
    tsio.write_dataset(sweep, tmp_path / "tp_pp_sweep.nc")
    records = ps.compare(tmp_path)
    quantities = [r.quantity for r in records]
    assert len(set(quantities)) == len(quantities)
    # the 768-GPU ratio, Table 2's PTD-P and ZeRO-3 rows at 384 and 768 GPUs, the best tp at batch 32
    assert len(records) == 1 + 2 + 2 + 1
    for r in records:
        assert r.study == ps.STUDY and r.verdict in comparison.VERDICTS and np.isfinite(r.our_value)
    ratio = next(r for r in records if r.quantity.startswith("PTD-P over ZeRO-3"))
    assert ratio.paper_value == pytest.approx(149 / 88) and ratio.neutral == 1.0
    assert ratio.our_value == pytest.approx(float(scaling["paper_plan_tflops_per_gpu"].isel(model=0, doubling=1)) /
                                            float(scaling["paper_zero3_tflops_per_gpu"].isel(model=0, doubling=1)))
    zero3 = next(r for r in records if r.quantity == "ZeRO-3 TFLOP/s per GPU, 175B, 768 GPUs")
    assert "micro-batch (2)" in zero3.our_setting and "searched best ZeRO-3 micro-batch" in zero3.reason
    best = records[-1]
    assert best.our_value == int(ps.best_tp(sweep).sel(global_batch=32)) and best.same_setting
    assert comparison.diff_records(records, ps.compare(tmp_path)) == []  # deterministic


def test_zero3_at_table_2_micro_batch_is_the_published_run_priced():
    """Table 2 states each ZeRO-3 row's micro-batch (global batch / GPUs: 4, 2, 1 for 175B); the study prices
    ZeRO-3 there first, and gets exactly what validation predicts for the published rows of
    data/published_runs.csv (the same plan, stack and software)."""
    from trainscale.model import validation
    scaling = ps.strategy_scaling(["gpt-175b"], [384], [1536], doublings=3, strategies=("zero-3",))
    rows = {m.run.gpus: m for m in validation.published_runs() if m.run.id.startswith("meg21-t2-175b-zero3")}
    assert sorted(rows) == [384, 768, 1536]
    for k, gpus in enumerate((384, 768, 1536)):
        m = rows[gpus]
        assert m.run.plan.micro_batch == ps.PAPER_TABLE2[(96, 12288)]["zero3_micro_batch"][gpus] == 1536 // gpus
        ours = float(scaling["paper_zero3_tflops_per_gpu"].isel(model=0, doubling=k))
        assert ours == pytest.approx(perfmodel.predict(m.run).hardware_tflops_per_gpu, rel=1e-9)
        best = float(scaling["hardware_tflops_per_gpu"].sel(strategy="zero-3").isel(model=0, doubling=k))
        assert best >= ours * (1 - 1e-9)  # the searched micro-batch is never worse


# --------------------------------------------------------------------------- quick workflow plumbing
@pytest.mark.workflow
def test_quick_workflow_writes_the_outputs(quick_workflow):
    folder = quick_workflow / "figures" / STUDY
    for name in ps.OUTPUTS:
        assert (folder / name).stat().st_size > 0, name
    ds = _read(quick_workflow, "strategies.nc")
    assert {"gpt-175b", "gpt-530b"} <= set(ds["model"].values.tolist())
    v = _read(quick_workflow, "published.nc")
    assert np.isfinite(v["study_tflops_per_gpu"].values).sum() >= 3
    written = comparison.read_records(folder / comparison.RECORDS_FILE)
    assert comparison.diff_records(ps.compare(folder), written) == []
