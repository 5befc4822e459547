"""Precision (bf16 / fp8 / mxfp8 / nvfp4) and mixture-of-experts shapes as part of a plan (issue 36)."""

import dataclasses
import csv

import numpy as np
import pytest

from trainscale.model import catalog, perfmodel, validation

from trainscale.model import planner
from trainscale.model.specs import ModelSpec, RunSpec, SpecError

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
    """The Megatron-Bridge 25.11 tables, transcribed whole (23 rows), and the canonical H100 Qwen3-30B-A3B run of its
    MoE optimisation guide (1 row, bridge-hopper), each priced to a finite rate."""
    runs = _bridge_runs()
    assert len(runs) == 24
    assert {m.run.plan.precision for m in runs} == {"bf16", "fp8", "mxfp8"}
    assert sum(m.run.model.is_moe for m in runs) == 13
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


# --------------------------------------------------------------------------- search in a precision (item 4)
# a small space of Llama 3 70B on 64 H100s: pipelined and interleaved plans (simulated by predict) among them
SPACE_70B = {"tp": [4, 8], "pp": [2, 4], "interleave": [1, 2], "micro_batch": [1, 2], "recompute": ["selective", "full"],
             "sequence_parallel": [1], "flash_attention": [1], "zero": [0, 1], "overlap_grad_reduce": [1]}


def _search_70b(precision="bf16", top=3, **kw):
    return planner.search("llama3-70b", "dgx-h100", 64, 128, top=top, space=SPACE_70B, precision=precision, **kw)


def _predict_as_plan(row, precision, recipe="", **kw):
    """predict of a searched plan with the precision given as a plan field (not taken from the row)."""
    plan = {k: v for k, v in row["plan"].items() if k not in ("precision", "fp8_recipe")}
    plan.update(global_batch=128, precision=precision, fp8_recipe=recipe)
    return perfmodel.predict({"id": "p", "model": "llama3-70b", "system": "dgx-h100", "gpus": 64, "plan": plan}, **kw)


@pytest.mark.parametrize("recipe", ["", "delayed"])
def test_an_fp8_search_prices_its_plans_as_predict_prices_fp8(recipe):
    """Every row (pipeline simulated) is predict's price of that plan in fp8, its closed form predict's closed form."""
    _, rows = _search_70b("fp8", fp8_recipe=recipe)
    assert rows and any(r["plan"]["pp"] > 1 for r in rows)
    for row in rows:
        assert row["plan"]["precision"] == "fp8" and row["plan"]["fp8_recipe"] == (recipe or "current")
        assert row["step_time_s"] == pytest.approx(_predict_as_plan(row, "fp8", recipe).step_time_s, rel=1e-9)
        closed = _predict_as_plan(row, "fp8", recipe, pipeline_simulation=False).step_time_s
        assert row["closed_form_step_time_s"] == pytest.approx(closed, rel=1e-12)
        plan = perfmodel.plan_from_grid_entry(row["plan"], 128)
        assert (plan.precision, plan.recipe) == ("fp8", recipe or "current")


@pytest.mark.parametrize("system,precision", [("dgx-h100", "fp8"), ("dgx-b200", "mxfp8"), ("dgx-b200", "nvfp4")])
def test_the_grid_prices_a_low_precision_as_predict_does(system, precision):
    """As test_kernels.test_grid_equals_scalar_predict for bf16: a sample of the grid's closed-form prices, each
    predict's closed form of that plan with the precision a plan field."""
    space = dict(tp=[1, 2, 4], pp=[1, 2], micro_batch=[1, 2], recompute=["none", "full"], sequence_parallel=[0, 1],
                 zero=[0, 1], flash_attention=[1])
    ds = perfmodel.evaluate_grid("llama2-7b", system, 16, 64, precision=precision, **space)
    bf16 = perfmodel.evaluate_grid("llama2-7b", system, 16, 64, **space)
    assert ds.attrs["precision"] == precision and "precision" not in bf16.attrs
    step = ds["step_time_s"].values
    finite = list(zip(*np.nonzero(np.isfinite(step))))
    assert len(finite) > 40
    for idx in finite[::3]:
        entry = {name: ds[name].values[i].item() for name, i in zip(perfmodel.GRID_AXES, idx)}
        entry.update(dp=int(ds["dp"].values[idx]), precision=precision)
        plan = perfmodel.plan_from_grid_entry(entry, 64)
        p = perfmodel.predict(RunSpec(id="g", model=perfmodel.resolve_model("llama2-7b"),
                                      system=perfmodel.resolve_system(system), plan=plan),
                              pipeline_simulation=False, allow_unrunnable=True, warn=False)
        assert p.step_time_s == pytest.approx(float(step[idx]), rel=1e-12, abs=0)
        assert p.memory_gib_per_gpu == pytest.approx(float(ds["memory_gib_per_gpu"].values[idx]), rel=1e-12)
        assert p.step_time_s != pytest.approx(float(bf16["step_time_s"].values[idx]), rel=1e-6)


def test_fp8_finds_faster_plans_than_bf16_for_a_large_dense_model_on_h100():
    _, bf16 = _search_70b("bf16", top=1)
    _, fp8 = _search_70b("fp8", top=1)
    assert fp8[0]["step_time_s"] < 0.9 * bf16[0]["step_time_s"]
    assert bf16[0]["plan"]["precision"] == "bf16"


def test_a_search_of_two_precisions_ranks_them_together():
    s16, r16 = _search_70b("bf16", top=4)
    s8, r8 = _search_70b("fp8", top=4)
    both, rows = _search_70b("bf16,fp8", top=4)
    assert [r["step_time_s"] for r in rows] == sorted(r["step_time_s"] for r in r16 + r8)[:4]
    assert rows[0]["plan"]["precision"] == "fp8"
    assert both.attrs["precision"] == ["bf16", "fp8"]
    for key in ("space_size", "plans_priced", "plans_feasible"):
        assert both.attrs[key] == s16.attrs[key] + s8.attrs[key]
    assert (both["plans"].values == s16["plans"].values + s8["plans"].values).all()
    assert _search_70b(["fp8", "bf16"], top=4)[1][0]["step_time_s"] == rows[0]["step_time_s"]


@pytest.mark.parametrize("precision,system,message", [
    ("fp8", "dgx-a100-80gb", "precision = 'fp8' is invalid; dgx-a100-80gb (ampere) has no FP8 tensor cores; "
                             "valid: bf16"),
    ("bf16,mxfp8", "dgx-h100", "precision = 'mxfp8' is invalid; needs Blackwell"),
    ("fp16", "dgx-h100", "precision = 'fp16' is invalid; expected one of bf16, fp8, mxfp8, nvfp4"),
])
def test_a_search_in_a_precision_the_gpu_lacks_is_refused_in_one_line(precision, system, message):
    with pytest.raises(SpecError) as err:
        planner.search("llama2-7b", system, 16, 64, space={"tp": [1]}, precision=precision)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SpecError, match="fp8_recipe = 'nvfp4' is invalid; expected one of current, delayed"):
        planner.search("llama2-7b", "dgx-h100", 16, 64, space={"tp": [1]}, precision="fp8", fp8_recipe="nvfp4")


def test_search_command_takes_and_names_the_precision(capsys):
    from trainscale.interface.cli import main

    with pytest.raises(SystemExit):
        main(["search", "--help"])
    assert "--precision" in capsys.readouterr().out
    args = ["search", "--model", "llama2-7b", "--gpus", "16", "--global-batch", "64", "--fix", "tp=1", "pp=1",
            "--search", "micro_batch", "zero", "--top", "2"]
    assert main(args + ["--system", "dgx-a100-80gb", "--precision", "fp8"]) == 2
    err = capsys.readouterr().err
    assert err == ("trainscale: error: --precision = 'fp8' is invalid; dgx-a100-80gb (ampere) has no FP8 tensor "
                   "cores; valid: bf16\n")
    assert main(args + ["--system", "dgx-h100", "--precision", "fp8", "--fp8-recipe", "delayed"]) == 0
    out = capsys.readouterr().out
    assert "; precision fp8 (recipe delayed)" in out.splitlines()[0]
    assert main(args + ["--system", "dgx-h100", "--precision", "bf16,fp8", "--json"]) == 0
    got = __import__("json").loads(capsys.readouterr().out)
    assert got["precision"] == ["bf16", "fp8"] and got["best"][0]["plan"]["precision"] == "fp8"
