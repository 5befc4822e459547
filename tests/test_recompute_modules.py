"""Megatron-Core's selective recomputation of named modules (plan.recompute_modules) and the low-precision recipes'
saved linear inputs (kernels.activations), against counts made by hand from the module docstring's formulas."""

import csv
import dataclasses

import numpy as np
import pytest

from trainscale.common.errors import SpecError
from trainscale.kernels import layout as K
from trainscale.kernels.layer import layer_costs
from trainscale.model import perfmodel, stackrules, validation
from trainscale.model.specs import PlanSpec
from trainscale.model.vectors import plan_calibration_vector

RUNS = {"deepseek-v3": "bridge2606-gb200-deepseek-v3-256g-fp8-mx", "gpt-oss-120b": "bridge2604-h100-gpt-oss-120b-64g-bf16",
        "llama3-70b": "bridge2604-gb200-llama3-70b-64g-fp8-mx"}


def _layer(model_name, plan_extra, tp=1):
    """One (MoE) layer's costs (``L_*``) of the published run of ``model_name`` for one micro-batch, with its plan
    changed by ``plan_extra`` (bf16 unless it says otherwise; flash attention; sequence parallel where tp > 1)."""
    run = next(m.run for m in validation.public_runs() if m.run.id == RUNS[model_name])
    extra = {"precision": "bf16", "fp8_recipe": "", "recompute_modules": "", **plan_extra}
    run = dataclasses.replace(run, plan=dataclasses.replace(run.plan, tp=tp, sequence_parallel=tp > 1, **extra))
    calib = plan_calibration_vector(run.system, run.plan)
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(run.model), perfmodel.system_vector(run.system), calib, tp, 1, 1,
                ["none", "selective", "full"].index(run.plan.recompute), tp > 1, True, lc, run.plan.ep, False, 0)
    return run, lc * 1.0


def test_mla_up_proj_frees_the_expanded_qkv_and_reruns_the_up_projections():
    """DeepSeek-V3: recomputing mla_up_proj keeps 2 a (2 d_qk + d_v) = 2 x 128 x (2 x 192 + 128) = 131,072 bytes per
    token less (Megatron-Core discards the per-head Q, K, V); its backward re-runs the two up projections."""
    _, base = _layer("deepseek-v3", {"recompute": "selective"})
    run, mla = _layer("deepseek-v3", {"recompute": "selective", "recompute_modules": "mla_up_proj"},
                      )
    m = run.model
    per_token = 2 * m.heads * (2 * (m.qk_head_dim + m.qk_pos_emb_head_dim) + m.v_head_dim)
    assert per_token == 131072
    assert base[K.L_ACT_BYTES] - mla[K.L_ACT_BYTES] == pytest.approx(per_token * run.model.seq_len, rel=1e-12)
    assert mla[K.L_WORK_BYTES] - base[K.L_WORK_BYTES] == pytest.approx(per_token * run.model.seq_len, rel=1e-12)
    extra = mla[K.L_RECOMP] - base[K.L_RECOMP]
    # the two up projections' forward: 2 m (r_q a d_qk + r_kv a (d_n + d_v)) FLOPs at no more than the GEMM peak
    flops = 2.0 * run.model.seq_len * (m.q_lora_rank * m.heads * 192 + m.kv_lora_rank * m.heads * (128 + 128))
    assert mla[K.L_FLOPS_RECOMP] - base[K.L_FLOPS_RECOMP] == pytest.approx(flops, rel=1e-12)
    assert flops / run.system.peak_flops_bf16 < extra < 5.0 * flops / run.system.peak_flops_bf16


def test_layernorm_and_moe_act_free_the_router_input_and_the_expert_activations():
    """GPT-OSS 120B (no latent attention, no shared experts, top 4): layernorm frees the pre-MLP norm's output
    (2 bytes per hidden element), moe_act each routed copy's activation output (2 f bytes)."""
    _, base = _layer("gpt-oss-120b", {"recompute": "selective"})
    run, both = _layer("gpt-oss-120b", {"recompute": "selective",
                                                     "recompute_modules": "layernorm,moe_act"})
    m = run.model
    freed = 2.0 * m.hidden + m.top_k * 2.0 * m.ffn_hidden
    assert base[K.L_ACT_BYTES] - both[K.L_ACT_BYTES] == pytest.approx(freed * run.model.seq_len, rel=1e-12)
    assert both[K.L_RECOMP] > base[K.L_RECOMP]
    assert both[K.L_FLOPS_RECOMP] == base[K.L_FLOPS_RECOMP]  # memory-bound work only


def test_the_moe_module_keeps_only_the_blocks_input():
    _, none = _layer("gpt-oss-120b", {"recompute": "none"})
    run, moe = _layer("gpt-oss-120b", {"recompute": "selective", "recompute_modules": "moe"})
    m = run.model
    inner = m.top_k * (2.0 * m.hidden + 2.0 * 3 * m.ffn_hidden)  # per routed copy: input, fc1 output, act output
    assert none[K.L_ACT_BYTES] - moe[K.L_ACT_BYTES] == pytest.approx(inner * run.model.seq_len, rel=1e-12)
    assert moe[K.L_BWD_EP] > none[K.L_BWD_EP]  # the dispatch and combine run again


def test_a_low_precision_layer_keeps_its_linear_inputs_in_the_recipes_format():
    """Llama 3 70B, tp 1: under MXFP8 the QKV and FC1 inputs (h each) and the FC2 input (f) are kept at 1.03 bytes
    instead of 2, and the attention output (q_w = h) gains a 1.03-byte copy beside its 16-bit one."""
    run, bf16 = _layer("llama3-70b", {"recompute": "none"})
    _, mx = _layer("llama3-70b", {"recompute": "none", "precision": "mxfp8"})
    m = run.model
    q = 1.03
    expected = (2.0 - q) * (2 * m.hidden + m.ffn_hidden) - q * m.hidden
    assert bf16[K.L_ACT_BYTES] - mx[K.L_ACT_BYTES] == pytest.approx(expected * run.model.seq_len, rel=1e-9)


def test_without_modules_a_bf16_layer_is_what_it_was():
    """No module named and bf16: the default core_attn mask gives the counts of Korthikanti et al. (tested in
    test_memory) and naming core_attn alone changes nothing."""
    _, base = _layer("llama3-70b", {"recompute": "selective"}, tp=8)
    _, core = _layer("llama3-70b", {"recompute": "selective", "recompute_modules": ["core_attn"]}, tp=8)
    assert np.array_equal(base, core)


@pytest.mark.parametrize("value, needle", [("mla_up_proj,attn", "plan.recompute_modules"),
                                           ("mlp,mlp", "distinct names"), (7, "plan.recompute_modules")])
def test_a_bad_module_list_is_refused_with_the_valid_names(value, needle):
    with pytest.raises(SpecError) as err:
        PlanSpec.from_dict({"tp": 1, "global_batch": 8, "dp": 8, "recompute": "selective",
                            "recompute_modules": value})
    assert needle in str(err.value) and "shared_experts" in str(err.value)


def test_modules_need_a_selective_recompute_and_a_megatron_core_stack():
    with pytest.raises(SpecError, match="needs recompute: selective"):
        PlanSpec.from_dict({"tp": 1, "global_batch": 8, "dp": 8, "recompute": "full", "recompute_modules": "mlp"})
    plan = PlanSpec.from_dict({"tp": 1, "global_batch": 8, "dp": 8, "recompute": "selective", "stack": "deepspeed",
                               "recompute_modules": ["mlp"]})
    assert plan.recompute_modules == "mlp" and plan.recompute_module_mask == K.RM_MLP
    system = validation.public_runs()[0].run.system
    assert [r.id for r in stackrules.broken_rules(plan, system)] == ["deepspeed-no-recompute-modules"]
    nemo = dataclasses.replace(plan, stack="nemo")
    assert not stackrules.broken_rules(nemo, system)


def test_the_rows_carry_their_release_configs_modules_and_say_where():
    path = "pkg/trainscale/data/published_runs_stacks.csv"
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["recompute_modules"]]
    assert len(rows) == 22
    for r in rows:
        assert r["recompute"] == "selective" and r["model"] in ("deepseek-v3", "gpt-oss-120b")
        assert f"selective recomputation of {r['recompute_modules'].replace(',', ' and ')}" in r["note"]
        assert "workload_base_configs.py:" in r["note"]
    runs = {m.run.id: m.run for m in validation.public_runs()}
    assert runs["bridge260401-b200-deepseek-v3-256g-fp8-mx"].plan.recompute_modules == "mla_up_proj,mlp"
    assert perfmodel.predict(runs["bridge260401-b200-deepseek-v3-256g-fp8-mx"]).fits
    assert runs["bridge2604-gb200-deepseek-v3-256g-fp8-mx"].model.dense_layers == 3  # "mlp": these layers' MLP only


def _oss_space(**axes):
    from trainscale.model.grid import default_space

    run = next(m.run for m in validation.public_runs() if m.run.id == RUNS["gpt-oss-120b"])
    space = default_space(run.model, run.system, 64, 1280)
    space.update({"tp": [1], "pp": [4], "cp": [1], "interleave": [1], "micro_batch": [1], "etp": [0],
                  "sequence_parallel": [0], "zero": [1], "shard_group": [0], "overlap_grad_reduce": [1],
                  "flash_attention": [1], "tp_comm_overlap": [0], **axes})
    return run, space


def test_search_prices_the_moe_knobs_as_predict_prices_the_plan():
    """A search with the GPT-OSS row's modules, overlap and imbalance gives its plans those fields, at predict's step
    time and memory; the modules lower the memory the search reports against the same search without them."""
    from trainscale.model import planner
    from trainscale.model.grid import plan_from_grid_entry
    from trainscale.model.specs import RunSpec

    run, space = _oss_space(ep=[8], recompute=["selective"])
    knobs = {"recompute_modules": "layernorm,moe_act", "moe_imbalance": 1.2}
    _, (row,) = planner.search(run.model, run.system, 64, 1280, top=1, space=space, stack="nemo", **knobs)
    _, (plain,) = planner.search(run.model, run.system, 64, 1280, top=1, space=space, stack="nemo",
                                 moe_imbalance=1.2)
    assert row["plan"]["recompute_modules"] == "layernorm,moe_act" and row["plan"]["moe_imbalance"] == 1.2
    plan = plan_from_grid_entry(row["plan"], 1280)
    assert plan.recompute_modules == "layernorm,moe_act" and plan.moe_imbalance == 1.2
    p = perfmodel.predict(RunSpec(id="s", model=run.model, system=run.system, plan=plan))
    assert row["step_time_s"] == p.step_time_s and row["memory_gib_per_gpu"] == p.memory_gib_per_gpu
    assert plain["memory_gib_per_gpu"] - row["memory_gib_per_gpu"] > 1.0
    assert row["step_time_s"] > plain["step_time_s"]  # the norms and activations run again


def test_a_search_with_the_ep_overlap_keeps_only_plans_its_rules_allow():
    from trainscale.model import planner

    run, space = _oss_space(ep=[1, 8], recompute=["none", "full"], interleave=[1, 3])
    summary, rows = planner.search(run.model, run.system, 64, 1280, top=3, space=space, stack="nemo",
                                   overlap_moe_expert_parallel_comm=True)
    by_rule = summary.attrs["plans_by_stack_rule"]
    assert all(by_rule[f"nemo-ep-overlap-{rule}"] > 0 for rule in ("needs-expert-parallelism",
                                                                      "needs-interleaving-with-pipelines",
                                                                      "without-full-recompute"))
    assert rows and all(r["plan"]["ep"] == 8 and r["plan"]["recompute"] == "none" and r["plan"]["interleave"] == 3
                        and r["plan"]["overlap_moe_expert_parallel_comm"] for r in rows)


def test_the_search_command_takes_the_knobs_and_refuses_a_bad_one(capsys):
    from trainscale.interface.cli import main

    args = ["search", "--model", "llama3-8b", "--system", "dgx-h100", "--gpus", "8", "--global-batch", "16",
            "--stack", "nemo", "--fix", "tp=1", "pp=1", "cp=1", "--top", "1"]
    assert main(args + ["--recompute-modules", "mlp", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"recompute_modules": "mlp"' in out
    with pytest.raises(SystemExit) as exit_:
        main(args + ["--recompute-modules", "mlp,attn"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--recompute-modules" in err and "'mlp,attn'" in err and "shared_experts" in err


def test_the_kernels_bits_are_the_vocabularys_order():
    from trainscale.model.spec_fields import RECOMPUTE_MODULES

    assert [getattr(K, f"RM_{name.upper()}") for name in RECOMPUTE_MODULES] == [1 << i for i in
                                                                              range(len(RECOMPUTE_MODULES))]
