"""Megatron-Core's full-iteration CUDA graphs and the experts' fused grouped MLP (plan.cuda_graph_impl,
plan.fused_grouped_mlp), as the 26.06 Megatron-Bridge GB200 MXFP8 configs run them."""

import dataclasses

import numpy as np
import pytest

from trainscale.kernels import layout as K
from trainscale.kernels.layer import layer_costs
from trainscale.model import perfmodel, validation
from trainscale.model.specs import ModelSpec, RunSpec, SpecError, SystemSpec

# GPT-OSS-like experts (biases, clamped GLU), 2 layers
SHAPE = dict(layers=2, hidden=2880, heads=64, kv_heads=8, kv_channels=64, ffn_hidden=2880, ffn_type="swiglu",
             vocab=1000, seq_len=4096, experts=128, top_k=4, expert_bias=True, activation_func_clamp_value=7.0)
GB200 = SystemSpec.from_catalog("gb200-nvl72")


def _costs(graph=False, fused=False, precision_cast=True):
    calib = perfmodel.calibration_vector(GB200.generation)
    if precision_cast:
        calib[K.C_CAST_BYTES] = 4.0
    calib[K.C_FULL_ITERATION_GRAPH] = 1.0 if graph else 0.0
    calib[K.C_FUSED_GROUPED_MLP] = 1.0 if fused else 0.0
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(ModelSpec.from_dict(SHAPE, name="oss-like")), perfmodel.system_vector(GB200),
                calib, 1, 1, 1, K.RC_NONE, False, True, lc, 8, False, 0)
    return lc


def _run(**plan):
    base = dict(tp=1, pp=1, ep=8, micro_batch=1, global_batch=64, recompute="none", stack="nemo",
                precision="mxfp8", moe_dispatcher="hybridep")
    return RunSpec.from_dict({"id": "graphs", "model": dict(SHAPE), "system": "gb200-nvl72", "gpus": 8,
                              "plan": {**base, **plan}})


def test_a_full_iteration_graph_issues_nothing_from_the_host():
    eager, graphed = _costs(), _costs(graph=True)
    assert eager[K.L_FWD_MOE_HOST] > 0 and eager[K.L_BWD_MOE_HOST] > 0
    assert graphed[K.L_FWD_MOE_HOST] == graphed[K.L_BWD_MOE_HOST] == 0.0
    assert graphed[K.L_FWD_MOE] <= eager[K.L_FWD_MOE]  # the bias loop's host issue is gone, its bytes stay
    assert graphed[K.L_FWD_GEMM] == eager[K.L_FWD_GEMM] and graphed[K.L_FWD_EP] == eager[K.L_FWD_EP]


def test_the_fused_grouped_mlp_drops_the_experts_activation_clamp_bias_and_second_cast():
    eager, fused = _costs(), _costs(fused=True)
    assert fused[K.L_FWD_ELEM] < eager[K.L_FWD_ELEM] and fused[K.L_BWD_ELEM] < eager[K.L_BWD_ELEM]
    assert fused[K.L_FWD_MOE] < eager[K.L_FWD_MOE]  # no clamp, no bias loop
    plain = dict(SHAPE, expert_bias=False, activation_func_clamp_value=0.0)
    calib = perfmodel.calibration_vector(GB200.generation)
    calib[K.C_FUSED_GROUPED_MLP] = 1.0
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(ModelSpec.from_dict(plain, name="plain")), perfmodel.system_vector(GB200),
                calib, 1, 1, 1, K.RC_NONE, False, True, lc, 8, False, 0)
    assert lc[K.L_FWD_MOE] == pytest.approx(fused[K.L_FWD_MOE], rel=1e-12)  # nothing of either is charged
    assert fused[K.L_FWD_GEMM] == eager[K.L_FWD_GEMM]


def test_scoped_graphs_price_as_none_and_bad_values_are_refused():
    none = perfmodel.predict(_run()).as_dict()
    for impl in ("local", "transformer_engine"):
        assert perfmodel.predict(_run(cuda_graph_impl=impl)).as_dict() == none
    assert perfmodel.predict(_run(cuda_graph_impl="full_iteration")).step_time_s < none["step_time_s"]
    with pytest.raises(SpecError, match="cuda_graph_impl = 'full' is invalid; expected one of none, local"):
        _run(cuda_graph_impl="full")
    with pytest.raises(SpecError, match="stack rule nemo-fused-grouped-mlp-is-mxfp8"):
        perfmodel.predict(_run(fused_grouped_mlp=True, precision="bf16", moe_dispatcher="alltoall"))
    with pytest.raises(SpecError, match="stack rule deepspeed-no-megatron-core-graphs-or-fused-mlp"):
        perfmodel.predict(_run(stack="deepspeed", cuda_graph_impl="full_iteration", moe_dispatcher="alltoall"))


def test_the_26_06_gb200_mxfp8_moe_rows_carry_both_from_their_config():
    rows = [m for m in validation.public_runs() if m.run.plan.cuda_graph_impl == "full_iteration"]
    assert len(rows) == 8 and all(m.run.plan.fused_grouped_mlp for m in rows)
    assert {m.run.id.split("-")[0] for m in rows} == {"bridge2606", "bridge260601"}
    assert all(m.run.system.name == "gb200-nvl72" and m.run.plan.precision == "mxfp8" for m in rows)
    eager = [dataclasses.replace(m.run, plan=dataclasses.replace(m.run.plan, cuda_graph_impl="none",
                                                                   fused_grouped_mlp=False)) for m in rows]
    assert all(perfmodel.predict(m.run).step_time_s < perfmodel.predict(e).step_time_s for m, e in zip(rows, eager))


def _search(**knobs):
    from trainscale.model import planner

    model = ModelSpec.from_dict(SHAPE, name="oss-like")
    space = {"tp": [1], "pp": [1], "ep": [8], "micro_batch": [1], "recompute": ["none"]}
    return planner.search(model, GB200, 8, 64, top=1, space=space, stack="nemo", precision="mxfp8",
                          moe_dispatcher="hybridep", **knobs)


def test_search_prices_graphs_and_the_fused_mlp_as_predict_does():
    _, (eager,) = _search()
    _, (both,) = _search(cuda_graph_impl="full_iteration", fused_grouped_mlp=True)
    assert both["plan"]["cuda_graph_impl"] == "full_iteration" and both["plan"]["fused_grouped_mlp"] is True
    assert both["step_time_s"] < eager["step_time_s"]
    plan = {k: both["plan"][k] for k in ("tp", "pp", "ep", "micro_batch", "recompute", "interleave",
                                         "flash_attention", "sequence_parallel", "zero", "overlap_grad_reduce")}
    p = perfmodel.predict(_run(**plan, cuda_graph_impl="full_iteration", fused_grouped_mlp=True))
    assert both["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-12)


def test_search_keeps_the_fused_mlp_to_mxfp8_and_cli_takes_both(capsys):
    from trainscale.interface.cli import main

    with pytest.raises(SpecError, match="fused_grouped_mlp = 'yes' is invalid"):
        _search(fused_grouped_mlp="yes")
    from trainscale.model import planner

    model = ModelSpec.from_dict(SHAPE, name="oss-like")
    summary, ranked = planner.search(model, GB200, 8, 64, top=1, space={"tp": [1], "pp": [1], "ep": [8]},
                                     stack="nemo", precision="bf16", fused_grouped_mlp=True)
    assert ranked == [] and "nemo-fused-grouped-mlp-is-mxfp8" in summary.attrs["plans_by_stack_rule"]
    assert main(["search", "--model", "moe-1.8t", "--system", "gb200-nvl72", "--gpus", "1024",
                 "--global-batch", "1024", "--precision", "mxfp8", "--cuda-graph-impl", "full_iteration",
                 "--fused-grouped-mlp", "--fix", "tp=8", "pp=8", "ep=16", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "full_iteration CUDA graphs; experts' fused grouped MLP" in out
