"""Precision (bf16 / fp8 / mxfp8 / nvfp4) and mixture-of-experts shapes as part of a plan (issue 36)."""

import dataclasses
import csv

import pytest

from trainscale import catalog, perfmodel, validation
from trainscale.specs import ModelSpec, RunSpec, SpecError

BRIDGE = ("bridge-hopper", "bridge-blackwell", "bridge-mla")


def _bridge_runs():
    return [m for m in validation.public_runs() if m.dataset in BRIDGE]


def _run(precision="bf16", system="dgx-h100", recipe=None):
    plan = {"tp": 4, "pp": 1, "global_batch": 64, "micro_batch": 1, "recompute": "selective",
            "sequence_parallel": True, "flash_attention": True}
    if precision is not None:
        plan["precision"] = precision
    if recipe:
        plan["fp8_recipe"] = recipe
    return {"id": "x", "model": "llama3-70b", "system": system, "gpus": 64, "plan": plan}


def test_every_megatron_bridge_row_parses_and_is_priced():
    """The Megatron-Bridge 25.11 tables, transcribed whole: 23 rows, each priced to a finite rate."""
    runs = _bridge_runs()
    assert len(runs) == 23
    assert {m.run.plan.precision for m in runs} == {"bf16", "fp8", "mxfp8"}
    assert sum(m.run.model.is_moe for m in runs) == 12
    for m in runs:
        p = perfmodel.predict(m.run)
        assert 0 < validation.metric_value(p, m.metric, m.run.gpus) < 1e6


def test_bf16_is_the_default_and_changes_nothing():
    assert perfmodel.predict(_run(None)).as_dict() == perfmodel.predict(_run("bf16")).as_dict()


def test_fp8_prices_linear_gemms_at_the_fp8_peak_times_the_generation_factor():
    """Linear GEMMs at most 2 x 0.85 faster (H100 FP8 / BF16 peak x lowp_gemm_efficiency); attention stays bf16."""
    bf16 = perfmodel.RunSpec.from_dict(_run("bf16"))
    fp8 = perfmodel.RunSpec.from_dict(_run("fp8"))
    t16 = perfmodel.layer_times(bf16.model, bf16.system, bf16.plan)
    t8 = perfmodel.layer_times(fp8.model, fp8.system, fp8.plan)
    rho = perfmodel.calibration_parameters("hopper")["lowp_gemm_efficiency"]
    assert 1.0 < t16["fwd_gemm_s"] / t8["fwd_gemm_s"] < 2.0 * rho
    assert t8["fwd_elementwise_s"] > t16["fwd_elementwise_s"]  # the casts
    p16, p8 = perfmodel.predict(_run("bf16")), perfmodel.predict(_run("fp8"))
    assert p8.step_time_s < p16.step_time_s
    # FP8 weight and its transpose: 2 bytes per parameter more (current scaling)
    assert p8.memory_breakdown_gib["weights"] == pytest.approx(2 * p16.memory_breakdown_gib["weights"], rel=1e-9)


def test_recipes_cost_what_they_move():
    """Delayed scaling skips current scaling's amax pass: cheaper casts, same GEMMs."""
    cur = perfmodel.predict(_run("fp8", recipe="current")).step_time_s
    delayed = perfmodel.predict(_run("fp8", recipe="delayed")).step_time_s
    assert delayed < cur


@pytest.mark.parametrize("precision,system,message", [
    ("mxfp8", "dgx-h100", "plan.precision = 'mxfp8' is invalid; needs Blackwell"),
    ("fp8", "dgx-a100-80gb", "plan.precision = 'fp8' is invalid; dgx-a100-80gb (ampere) has no FP8"),
    ("fp16", "dgx-h100", "precision = 'fp16' is invalid; expected one of bf16, fp8, mxfp8, nvfp4"),
])
def test_a_precision_the_gpu_lacks_is_refused_in_one_line(precision, system, message):
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict(_run(precision, system))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_recipe_of_another_format_is_refused():
    with pytest.raises(SpecError, match="fp8_recipe = 'mxfp8' is invalid; expected one of current, delayed, blockwise"):
        RunSpec.from_dict(_run("fp8", recipe="mxfp8"))


def test_nvfp4_uses_the_fp4_peak_from_systems_yaml():
    b200 = perfmodel.resolve_system("dgx-b200")
    assert perfmodel.low_precision_peak(b200, "nvfp4") == 9.0e15
    assert perfmodel.low_precision_peak(b200, "mxfp8") == b200.peak_flops_fp8 == 4.5e15
    fast = perfmodel.predict(_run("nvfp4", "dgx-b200")).step_time_s
    assert fast < perfmodel.predict(_run("mxfp8", "dgx-b200")).step_time_s


def test_moe_shapes_count_their_parameters():
    """Qwen3-30B-A3B: 30.5B parameters, 3.3B active (Qwen3 technical report, arXiv 2505.09388, Table 2)."""
    qwen = next(m.run.model for m in _bridge_runs() if m.run.model.name == "qwen3-30b-a3b")
    assert qwen.params() / 1e9 == pytest.approx(30.5, rel=0.01)
    assert qwen.active_params() / 1e9 == pytest.approx(3.3, rel=0.03)
    assert qwen.query_width == 32 * 128 != qwen.hidden
    dsv3 = next(m.run.model for m in _bridge_runs() if m.run.model.name == "deepseek-v3")
    assert dsv3.moe_layers == 58 and dsv3.shared_ffn_width == 2048


def test_dense_layers_are_priced_at_their_own_width():
    dsv3 = next(m.run for m in _bridge_runs() if m.run.model.name == "deepseek-v3")
    no_dense = dataclasses.replace(dsv3.model, dense_layers=0, dense_ffn_hidden=0)
    with_dense = perfmodel.predict(dsv3).model_tflops_per_gpu
    assert with_dense != perfmodel.predict(RunSpec(dsv3.id, no_dense, dsv3.system, dsv3.plan)).model_tflops_per_gpu


def test_expert_tensor_parallelism_folds_experts_over_tp_and_dp():
    run = next(m.run for m in _bridge_runs() if m.run.id == "bridge2511-h100-qwen3-235b-a22b-256g-fp8-cs")
    assert (run.plan.tp, run.plan.dp, run.plan.ep, run.plan.etp) == (2, 16, 32, 1)
    plan = dict(tp=2, pp=8, ep=32, global_batch=2048, interleave=4, custom_pipeline_layout=True)
    with pytest.raises(SpecError, match="plan.ep = 32 is invalid; must divide dp = 16"):
        RunSpec.from_dict({"id": "y", "model": dataclasses.asdict(run.model), "system": "dgx-h100", "gpus": 256,
                           "plan": plan})


def test_csv_refuses_an_unknown_precision_in_one_line(tmp_path, monkeypatch):
    path = catalog.data_path(validation.STACKS_FILE)
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    bad = [r for r in rows if r["id"] == "bridge2511-h100-llama3-8b-8g-fp8-cs"][0]
    bad["precision"] = "fp6"
    out = tmp_path / validation.STACKS_FILE
    with open(out, "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerow(bad)
    monkeypatch.setattr(catalog, "data_path", lambda name: out)
    with pytest.raises(SpecError, match="precision = 'fp6' is invalid; expected one of bf16, fp8, mxfp8, nvfp4"):
        validation.public_runs()
