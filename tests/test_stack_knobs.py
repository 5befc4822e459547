"""What a software stack changes in a step, beyond its fitted efficiencies: the element-wise traffic of an
eager stack and what ``compiled`` (torch.compile) does to it, a stack's own selective checkpointing, and
fused (flash) attention keeping the scores on chip. Closed forms on the layer kernel, and the eager/compiled
pairs of the public FSDP runs (the same model, system and plan measured both ways)."""

import csv
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainscale.model import calibration, catalog, perfmodel, validation

from trainscale.model import measured

from trainscale.model import planner
from trainscale.kernels import compute
from trainscale.kernels import layout as K
from trainscale.kernels.layer import (ELEMENTWISE_KERNELS_PER_LAYER, HP_GRAD_ACCUM_BYTES, causal_block_fraction,
                                      eager_chain_factor, layer_costs)
from trainscale.model.specs import RunSpec, SpecError, resolve_model, resolve_system


def _layer(model="llama2-7b", system="dgx-h100", tp=1, mb=1, rc=K.RC_NONE, sp=False, flash=True, stack="fsdp",
           compiled=False, overrides=None):
    m, s = resolve_model(model), resolve_system(system)
    calib = perfmodel.calibration_vector(s.generation, overrides, stack, compiled)
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(m), perfmodel.system_vector(s), calib, tp, 1, mb, rc, sp, flash, lc, 1, False, 0)
    return lc, calib, m, s


@pytest.mark.parametrize("traffic", [1.0, 2.0, 4.5])
def test_eager_elementwise_traffic_closed_form(traffic):
    """Element-wise time = (x (norms, dropouts, residual adds, activation) + attention) bytes / HBM rate
    + x * kernels, with x the stack's element-wise traffic factor: per token 30 h bytes of norms,
    dropouts and residual adds and 6 per SwiGLU element forward, twice that backward."""
    lc, calib, m, s = _layer(overrides={"elementwise_traffic": traffic})
    tokens, h, f = m.seq_len, m.hidden, m.ffn_hidden
    assert m.ffn_matrices == 3  # SwiGLU
    rate = calib[K.C_HBM_EFF] * s.hbm_bandwidth_GBps * 1e9
    kernel = calib[K.C_KERNEL_S]
    fwd = (traffic * (30.0 * tokens * h + 6.0 * tokens * f) + 8.0 * tokens * h) / rate
    # and, apart, torchtitan's rotary embedding of the queries and keys (20 bytes per element, 3 kernels)
    rotary = 20.0 * tokens * (h + m.kv_heads * m.head_dim) / rate + 3 * kernel
    assert calib[K.C_ELEM_TRAFFIC] == traffic
    assert lc[K.L_FWD_ELEM] == pytest.approx(fwd + traffic * ELEMENTWISE_KERNELS_PER_LAYER * kernel + rotary,
                                             rel=1e-12)
    assert lc[K.L_BWD_ELEM] == pytest.approx(2 * fwd + 2 * traffic * ELEMENTWISE_KERNELS_PER_LAYER * kernel + rotary,
                                             rel=1e-12)


def test_layernorm_gelu_layers_run_as_fused_in_an_eager_stack():
    """kernels.layer.eager_chain_factor: eager PyTorch decomposes a Llama layer's RMSNorm and SwiGLU (the
    stack's factor applies), but runs LayerNorm and GeLU as one kernel each (a GPT or MPT layer takes 1)."""
    for model, scales in (("gpt3-175b", False), ("mpt-7b", False), ("llama2-7b", True)):
        eager = _layer(model=model, overrides={"elementwise_traffic": 3.0})
        fused = _layer(model=model, overrides={"elementwise_traffic": 1.0})
        mvec = perfmodel.model_vector(eager[2])
        assert eager_chain_factor(mvec, eager[1]) == (3.0 if scales else 1.0)
        for slot in (K.L_FWD_ELEM, K.L_BWD_ELEM):
            if scales:
                assert eager[0][slot] > 1.5 * fused[0][slot]
            else:
                assert eager[0][slot] == fused[0][slot]


def test_unfused_attention_score_bytes():
    """Unfused attention moves 9 bytes per score forward (softmax 4, dropout 5) and 11 backward
    (dropout 5, softmax 6), not twice the forward."""
    plain, calib, m, s = _layer(stack="megatron", flash=False)
    rate = calib[K.C_HBM_EFF] * s.hbm_bandwidth_GBps * 1e9
    scores = m.heads * m.seq_len ** 2
    no_attention = (30.0 * m.seq_len * m.hidden + 6.0 * m.seq_len * m.ffn_hidden) / rate
    # Llama 2's rotary embedding in Megatron's fused kernel: 4 bytes per query / key element, one kernel
    rotary = 4.0 * m.seq_len * 2 * m.hidden / rate + calib[K.C_KERNEL_S]
    kernel = calib[K.C_KERNEL_S] * ELEMENTWISE_KERNELS_PER_LAYER
    assert plain[K.L_FWD_ELEM] == pytest.approx(no_attention + 9.0 * scores / rate + kernel + rotary, rel=1e-12)
    assert plain[K.L_BWD_ELEM] == pytest.approx(2 * no_attention + 11.0 * scores / rate + 2 * kernel + rotary,
                                                rel=1e-12)


def test_compiled_takes_fused_traffic_and_changes_nothing_else():
    eager, calib_e, _, _ = _layer(stack="fsdp", compiled=False)
    comp, calib_c, _, _ = _layer(stack="fsdp", compiled=True)
    assert calib_e[K.C_ELEM_TRAFFIC] > 1.0 and calib_c[K.C_ELEM_TRAFFIC] == 1.0
    assert comp[K.L_FWD_ELEM] < eager[K.L_FWD_ELEM] and comp[K.L_BWD_ELEM] < eager[K.L_BWD_ELEM]
    for slot in (K.L_FWD_GEMM, K.L_BWD_GEMM, K.L_FWD_TP, K.L_ACT_BYTES, K.L_FLOPS_FWD):
        assert comp[slot] == eager[slot]
    # stacks with hand-fused kernels: compiled or not, the same vector; Megatron-DeepSpeed's unfused
    # rotary embedding is the one chain that compiling would fuse
    for stack in ("megatron", "nemo", "deepspeed"):
        compiled = perfmodel.calibration_vector("hopper", None, stack, True)
        eager = perfmodel.calibration_vector("hopper", None, stack, False)
        rotary = [K.C_ROTARY_BYTES, K.C_ROTARY_KERNELS]
        assert np.array_equal(np.delete(compiled, rotary), np.delete(eager, rotary))
        assert list(compiled[rotary]) == [4.0, 1.0]
        assert (list(eager[rotary]) == [4.0, 1.0]) == (stack != "deepspeed")


def test_compiled_is_a_plan_field_with_a_one_line_error():
    run = {"id": "c", "model": "llama2-7b", "system": "dgx-h100", "gpus": 8,
           "plan": {"tp": 1, "pp": 1, "global_batch": 16, "micro_batch": 2, "recompute": "none", "zero": 3,
                    "flash_attention": True, "stack": "fsdp", "compiled": True}}
    fast = perfmodel.predict(run)
    slow = perfmodel.predict({**run, "plan": {**run["plan"], "compiled": False}})
    assert fast.step_time_s < slow.step_time_s
    with pytest.raises(SpecError) as err:
        perfmodel.predict({**run, "plan": {**run["plan"], "compiled": "maybe"}})
    assert err.value.field.endswith("compiled") and "maybe" in str(err.value)


def test_megatron_selective_recomputes_only_the_attention_core():
    sel, calib, m, s = _layer(stack="megatron", flash=False, rc=K.RC_SELECTIVE)
    peak, hbm, sms = s.peak_flops_bf16, s.hbm_bandwidth_GBps * 1e9, s.sm_count
    seq, d, a = m.seq_len, m.head_dim, m.heads
    core = (compute.gemm_time(seq, seq, d, a, peak, hbm, sms, calib) + compute.gemm_time(seq, d, seq, a, peak, hbm,
                                                                                         sms, calib)
            + compute.memory_bound_time(9.0 * a * seq * seq, 2.0, hbm, calib))
    assert sel[K.L_RECOMP] == pytest.approx(core, rel=1e-12)
    flash_sel, *_ = _layer(stack="megatron", flash=True, rc=K.RC_SELECTIVE)
    assert flash_sel[K.L_RECOMP] == 0.0  # flash attention recomputes its scores in the backward anyway


@given(share=st.floats(0.0, 1.0))
@settings(max_examples=20, deadline=None)
def test_stack_selective_share_closed_form(share):
    """A stack's selective checkpointing recomputes ``share`` of the forward's weight GEMMs and
    element-wise work (and, with flash attention, nothing of the attention core)."""
    base, calib, m, s = _layer(stack="fsdp")
    calib = calib.copy()
    calib[K.C_SELECTIVE_SHARE] = share
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(m), perfmodel.system_vector(s), calib, 1, 1, 1, K.RC_SELECTIVE, False, True,
                lc, 1, False, 0)
    fused = compute.fused_attention_fwd_bwd_time(m.seq_len, m.seq_len, m.head_dim, m.heads,
                                                 s.peak_flops_bf16, s.hbm_bandwidth_GBps * 1e9, s.sm_count, calib)
    exps = compute.attention_exp_time(m.heads * m.seq_len ** 2, s.peak_flops_bf16, calib)  # the softmax's
    core = (2.0 * fused[0] + exps) * causal_block_fraction(m.seq_len, m.seq_len)
    expected = share * (lc[K.L_FWD_GEMM] - core + lc[K.L_FWD_ELEM])
    assert lc[K.L_RECOMP] == pytest.approx(expected, rel=1e-9, abs=1e-15)
    attention_flops = 4.0 * m.seq_len ** 2 * m.hidden
    assert lc[K.L_FLOPS_RECOMP] == pytest.approx(attention_flops + share * (lc[K.L_FLOPS_FWD] - attention_flops),
                                                 rel=1e-12)


def test_fsdp_selective_share_is_documented_and_megatron_is_zero():
    assert perfmodel.calibration_vector("hopper", None, "fsdp")[K.C_SELECTIVE_SHARE] == 0.5
    for stack in ("megatron", "nemo", "deepspeed"):
        assert perfmodel.calibration_vector("hopper", None, stack)[K.C_SELECTIVE_SHARE] == 0.0


@given(s_q=st.integers(128, 32768), s_k=st.integers(128, 32768), d=st.sampled_from([64, 128]),
       batch=st.integers(1, 256))
@settings(max_examples=60, deadline=None)
def test_fused_attention_never_slower_than_writing_the_scores(s_q, s_k, d, batch):
    s = resolve_system("dgx-h100")
    calib = perfmodel.calibration_vector("hopper")
    peak, hbm = s.peak_flops_bf16, s.hbm_bandwidth_GBps * 1e9
    fwd, bwd = compute.fused_attention_fwd_bwd_time(s_q, s_k, d, batch, peak, hbm, s.sm_count, calib)
    unfused = compute.gemm_time(s_q, s_k, d, batch, peak, hbm, s.sm_count, calib)
    assert fwd <= unfused * (1 + 1e-12)
    eff = compute.gemm_efficiency(s_q, s_k, batch, s.sm_count, calib[K.C_GEMM_PEAK_EFF], calib[K.C_TILE_M],
                                  calib[K.C_TILE_N])
    compute_s = 2.0 * batch * s_q * s_k * d / (eff * peak)
    memory_s = 2.0 * batch * (s_q + s_k) * d / (calib[K.C_HBM_EFF] * hbm)
    assert fwd == pytest.approx(max(compute_s, memory_s) + calib[K.C_KERNEL_S], rel=1e-12)
    # the backward's two products run at the backward's share of the forward's efficiency
    assert bwd == pytest.approx(2.0 * max(compute_s, memory_s) / calib[K.C_ATTN_BWD_EFF] + calib[K.C_KERNEL_S],
                                rel=1e-12)


def test_fused_attention_backward_runs_at_the_measured_share_of_the_forward():
    """The FlashAttention papers' forward and backward rates (FA2 on A100 0.86; FA2, cuDNN and FA3 on
    H100 0.82-0.87) give the common 0.85, for every generation and stack."""
    for generation in ("ampere", "hopper", "blackwell"):
        for stack in ("megatron", "fsdp", "nemo"):
            assert perfmodel.calibration_vector(generation, None, stack)[K.C_ATTN_BWD_EFF] == pytest.approx(0.85)


def _pairs():
    """(eager, compiled) public runs of the same model, system and plan, measured both ways."""
    runs = {m.run.id: m for m in validation.public_runs()}
    pairs = []
    for rid, m in runs.items():
        if m.run.plan.compiled:
            continue
        for twin in (rid.replace("-8g", "-8g-compile").replace("-128g", "-128g-compile"),
                     rid.replace("fmsfsdp-", "fmsfsdp-compile-")):
            other = runs.get(twin)
            if other is not None and twin != rid and other.run.plan.recompute == m.run.plan.recompute:
                pairs.append((m, other))
    return pairs


def test_compile_speedup_of_measured_pairs():
    """torch.compile's measured speed-up on the six pairs (16-28%) follows from the eager stack's
    fitted element-wise traffic and the rotary kernel compiling fuses, the compiled runs never being fitted:
    1.14-1.24 predicted against 1.0 without the knob (calibration of 2026-12-05, with fms-fsdp's own rotary
    form). torchtitan's two pairs are 1.4-2 points high; fms-fsdp's four (A100 and H100, 7B and 13B) are
    4-9 points low: its compiled table (May 2024) is a later commit than its eager
    one (March), and what else changed between them is not stated. Asserted: each within 15 points
    and the mean within 10."""
    pairs = _pairs()
    assert len(pairs) >= 6, [(a.run.id, b.run.id) for a, b in pairs]
    misses = []
    for eager, comp in pairs:
        measured = comp.measured / eager.measured
        predicted = (validation.metric_value(perfmodel.predict(comp.run), comp.metric, comp.run.gpus)
                     / validation.metric_value(perfmodel.predict(eager.run), eager.metric, eager.run.gpus))
        assert predicted > 1.05, (eager.run.id, predicted)
        assert abs(predicted - measured) <= 0.15, (eager.run.id, comp.run.id, measured, predicted)
        misses.append(abs(predicted - measured))
    assert np.mean(misses) <= 0.10, misses


def test_compiled_runs_are_held_out_and_single_node_vtrain_is_fitted():
    runs = calibration.fitting_runs()
    datasets = {m.dataset for m in runs}
    assert "fsdp-compiled" not in datasets and "vtrain-single" in datasets
    assert "deepspeed-trials" not in datasets and "deepspeed-ampere" in datasets
    trials = [m for m in validation.public_runs() if m.run.id.startswith("bloomprequel-")]
    assert len(trials) == 39 and {m.dataset for m in trials} == {"deepspeed-trials"}
    assert not any(m.run.plan.compiled and m.dataset == "fsdp-compiled" for m in runs)


def test_search_prices_the_compiled_plans():
    space = {"tp": [1, 2], "micro_batch": [1, 2], "recompute": ["none", "full"], "zero": [3],
             "flash_attention": [1], "overlap_grad_reduce": [1]}
    _, eager = planner.search("llama2-7b", "dgx-h100", 8, 16, top=1, space=space, stack="fsdp")
    _, comp = planner.search("llama2-7b", "dgx-h100", 8, 16, top=1, space=space, stack="fsdp", compiled=True)
    assert comp[0]["plan"]["compiled"] is True and eager[0]["plan"]["compiled"] is False
    assert comp[0]["step_time_s"] < eager[0]["step_time_s"]
    grid = perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 8, 16, stack="fsdp", compiled=True, **space)
    assert grid.attrs["compiled"] == 1
    # the re-priced best plan is what predict gives for that plan
    plan = perfmodel.plan_from_grid_entry(comp[0]["plan"], 16)
    assert plan.compiled
    run = {"id": "s", "model": "llama2-7b", "system": "dgx-h100", "gpus": 8, "plan": dict(plan.__dict__)}
    assert perfmodel.predict(run).step_time_s == pytest.approx(comp[0]["step_time_s"], rel=1e-12)


def test_fp32_gradient_reduction_doubles_the_gradient_bytes():
    """DeepSpeed's BF16_Optimizer reduces its fp32 gradient buffer: the data-parallel reduction moves
    4 bytes per gradient instead of 2 (the weight all-gather after the step stays 16-bit). It holds
    that fp32 buffer and keeps the 16-bit gradients too (its pipeline engine zeroes them between
    micro-batches, never frees them): 6 bytes per gradient, three times the 16-bit case. Megatron's
    fp32 main gradients replace the 16-bit ones: twice."""
    run = {"id": "g", "model": "gpt3-175b", "system": "dgx-a100-80gb", "gpus": 512,
           "plan": {"tp": 8, "pp": 8, "global_batch": 512, "micro_batch": 1, "zero": 0, "stack": "deepspeed"}}
    half = perfmodel.predict(run)
    full = perfmodel.predict({**run, "plan": {**run["plan"], "grad_reduce_fp32": True}})
    assert full.comm_total_s["dp_comm"] == pytest.approx(2.0 * half.comm_total_s["dp_comm"], rel=0.01)
    assert full.memory_breakdown_gib["gradients"] == pytest.approx(3.0 * half.memory_breakdown_gib["gradients"],
                                                                   rel=1e-12)
    assert full.step_time_s > half.step_time_s
    megatron = {**run, "plan": {**run["plan"], "stack": "megatron", "zero": 1}}
    m_half = perfmodel.predict(megatron)
    m_full = perfmodel.predict({**megatron, "plan": {**megatron["plan"], "grad_reduce_fp32": True}})
    assert m_full.memory_breakdown_gib["gradients"] == pytest.approx(
        2.0 * m_half.memory_breakdown_gib["gradients"], rel=1e-12)
    bloom = [m for m in validation.public_runs() if m.run.id.startswith("bloom176b")]
    assert len(bloom) == 3 and all(m.run.plan.grad_reduce_fp32 for m in bloom)  # BLOOM's BF16_Optimizer, from the CSV
    # the topology trials before training: fp16 (16-bit gradients) until 02-27, the BF16_Optimizer from 02-28
    trials = {m.run.id: m.run.plan.grad_reduce_fp32 for m in validation.public_runs()
              if m.run.id.startswith("bloomprequel")}
    assert len(trials) == 39 and sum(trials.values()) == 9
    assert all(fp32 == rid.startswith("bloomprequel-0228") for rid, fp32 in trials.items())


@pytest.mark.parametrize("stack, allreduced", [("deepspeed", True), ("megatron", False)])
def test_bf16_optimizer_all_reduces_the_fp32_gradients(stack, allreduced):
    """ZeRO 1 with fp32 gradients: DeepSpeed's BF16_Optimizer all-reduces them (its engine hands
    ``get_grads_for_reduction()`` to ``buffered_allreduce_fallback``), then all-gathers the updated
    16-bit weights; Megatron's distributed optimizer reduce-scatters its fp32 main gradients. The
    data-parallel time is those two collectives over the whole model (pp = 1) and the dp ranks, once
    per bucket: DeepSpeed's 500M elements, Megatron-Core's one bucket without overlapped reduction."""
    model, system, dp = resolve_model("llama2-7b"), "dgx-a100-80gb", 64
    run = {"id": "z1", "model": model.name, "system": system, "gpus": dp,
           "plan": {"tp": 1, "pp": 1, "global_batch": 128, "micro_batch": 2, "zero": 1, "stack": stack,
                    "grad_reduce_fp32": True, "overlap_grad_reduce": False}}
    pred = perfmodel.predict(run)
    params = model.params()
    reduce_kind = "allreduce" if allreduced else "reduce_scatter"
    buckets = math.ceil(params / 5e8) if stack == "deepspeed" else 1
    assert buckets == (14 if stack == "deepspeed" else 1)
    expected = buckets * (perfmodel.collective_time_s(system, reduce_kind, 4.0 * params / buckets, dp, stack=stack)
                          + perfmodel.collective_time_s(system, "allgather", 2.0 * params / buckets, dp, stack=stack))
    assert pred.comm_total_s["dp_comm"] == pytest.approx(expected, rel=1e-9)
    assert pred.breakdown["dp_comm"] == pytest.approx(expected, rel=1e-9)  # not overlapped


@pytest.mark.parametrize("tp", [1, 4])
def test_bf16_optimizer_accumulates_every_micro_batch_into_fp32(tp):
    """After each micro-batch's backward DeepSpeed's pipeline engine calls the BF16_Optimizer's
    update_hp_grads, which casts the bf16 gradients to fp32 and adds them into its buffer: 18 bytes
    per parameter of HBM traffic, one kernel, in every layer's backward. Other optimizers (fp16, or
    Megatron's fp32 main grads written by the fused weight-gradient GEMM) pay nothing."""
    plain, calib, m, s = _layer(model="llama2-13b", system="dgx-a100-80gb", tp=tp, stack="deepspeed",
                                flash=False)
    bf16 = calib.copy()
    bf16[K.C_BF16_OPTIMIZER] = 1.0
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(m), perfmodel.system_vector(s), bf16, tp, 1, 1, K.RC_NONE, False, False, lc, 1, False, 0)
    params_layer = perfmodel.model_vector(m)[K.M_PARAMS_LAYER] / tp
    rate = calib[K.C_HBM_EFF] * s.hbm_bandwidth_GBps * 1e9
    assert HP_GRAD_ACCUM_BYTES == 18.0
    assert lc[K.L_BWD_ELEM] - plain[K.L_BWD_ELEM] == pytest.approx(
        HP_GRAD_ACCUM_BYTES * params_layer / rate + calib[K.C_KERNEL_S], rel=1e-9)
    assert lc[K.L_FWD_ELEM] == plain[K.L_FWD_ELEM]
    assert perfmodel.calibration_vector("ampere", None, "deepspeed", grad_reduce_fp32=True)[K.C_BF16_OPTIMIZER] == 1.0
    assert perfmodel.calibration_vector("ampere", None, "megatron", grad_reduce_fp32=True)[K.C_BF16_OPTIMIZER] == 0.0


def test_fa2_on_hopper_is_slower_than_the_native_kernel():
    """PyTorch SDPA's default (FlashAttention-2) reaches 0.52 of Hopper's native attention kernels
    (pytorch/pytorch#142132: 329 against 631 TFLOP/s). The FSDP stack's fused attention takes that
    share on Hopper, the native share (1) on Ampere; Megatron's and NeMo's kernels are native. On a
    compute-bound shape the attention products' time scales by 1 / 0.52."""
    _, calib_f, m, s = _layer(stack="fsdp")
    assert calib_f[K.C_ATTN_EFF] == pytest.approx(0.52)
    assert perfmodel.calibration_vector("ampere", None, "fsdp")[K.C_ATTN_EFF] == 1.0
    for stack in ("megatron", "nemo", "deepspeed"):
        assert perfmodel.calibration_vector("hopper", None, stack)[K.C_ATTN_EFF] == 1.0
    s_len, d, batch = 8192, 128, 32
    args = (s_len, s_len, d, batch, s.peak_flops_bf16, s.hbm_bandwidth_GBps * 1e9, s.sm_count)
    calib_native = calib_f.copy()
    calib_native[K.C_ATTN_EFF] = 1.0
    fwd_fa2, bwd_fa2 = compute.fused_attention_fwd_bwd_time(*args, calib_f)
    fwd_nat, bwd_nat = compute.fused_attention_fwd_bwd_time(*args, calib_native)
    kernel = calib_f[K.C_KERNEL_S]
    assert (fwd_fa2 - kernel) == pytest.approx((fwd_nat - kernel) / 0.52, rel=1e-12)
    assert (bwd_fa2 - kernel) == pytest.approx((bwd_nat - kernel) / 0.52, rel=1e-12)


def test_hsdp_rows_shard_within_the_node():
    """fms-fsdp's 7B rows ran HSDP (its table's sharding column): the CSV's shard_group 8 reaches the
    plan, so the weights and optimizer states are divided by 8, not by all 96-128 ranks."""
    runs = {m.run.id: m.run for m in validation.public_runs()}
    hsdp = [rid for rid, r in runs.items() if r.plan.shard_group == 8]
    assert sorted(hsdp) == ["fmsfsdp-a100-llama2-7b", "fmsfsdp-compile-a100-llama2-7b",
                            "fmsfsdp-compile-h100-llama2-7b", "fmsfsdp-h100-llama2-7b"]
    run = runs["fmsfsdp-h100-llama2-7b"]
    full = perfmodel.predict(RunSpec(id="full", model=run.model, system=run.system,
                                     plan=dataclasses.replace(run.plan, shard_group=0)))
    hybrid = perfmodel.predict(run)
    ratio = hybrid.memory_breakdown_gib["optimizer"] / full.memory_breakdown_gib["optimizer"]
    assert ratio == pytest.approx(run.plan.dp / 8, rel=1e-9)


def test_recompute_share_is_a_plan_field_over_the_stack_default():
    """A plan's ``recompute_share`` replaces the stack's selective share (fms-fsdp's runs checkpoint
    a known fraction of their blocks); it needs ``recompute: selective`` and a share in [0, 1], and
    a bad one is refused in one line naming the field."""
    run = {"id": "r", "model": "llama2-13b", "system": "dgx-h100", "gpus": 96,
           "plan": {"tp": 1, "pp": 1, "global_batch": 192, "micro_batch": 2, "recompute": "selective", "zero": 3,
                    "flash_attention": True, "stack": "fsdp"}}
    spec = RunSpec.from_dict(run)
    assert spec.plan.recompute_share is None
    assert perfmodel.plan_calibration_vector(spec.system, spec.plan)[K.C_SELECTIVE_SHARE] == 0.5
    times = []
    for share in (0.0, 0.5, 1.0):
        plan = {**run["plan"], "recompute_share": share}
        spec = RunSpec.from_dict({**run, "plan": plan})
        assert perfmodel.plan_calibration_vector(spec.system, spec.plan)[K.C_SELECTIVE_SHARE] == share
        times.append(perfmodel.predict({**run, "plan": plan}).breakdown["recompute"])
    assert times[0] < times[1] < times[2]
    assert times[2] - times[1] == pytest.approx(times[1] - times[0], rel=1e-9)  # linear in the share
    default = perfmodel.predict(run).breakdown["recompute"]
    assert default == pytest.approx(times[1], rel=1e-12)
    for bad_plan, value in (({"recompute_share": 1.5}, 1.5), ({"recompute_share": 0.3, "recompute": "full"}, 0.3),
                            ({"recompute_share": "half"}, "half")):
        with pytest.raises(SpecError) as err:
            perfmodel.predict({**run, "plan": {**run["plan"], **bad_plan}})
        assert err.value.field.endswith("recompute_share") and str(value) in str(err.value)
        assert "\n" not in str(err.value)


def test_search_takes_the_plan_knobs_it_cannot_search():
    """``search`` fixes ``grad_reduce_fp32`` and ``recompute_share`` for every plan it evaluates (the
    share on the selective ones), and the plans it returns carry them: each re-priced step time is
    what ``predict`` gives for that plan."""
    space = {"tp": [1], "pp": [1], "micro_batch": [2], "recompute": ["selective", "full"], "zero": [3],
             "flash_attention": [1], "overlap_grad_reduce": [1]}
    steps = {}
    for share in (0.2, 0.9):
        _, ranked = planner.search("llama2-13b", "dgx-h100", 96, 192, top=2, space=space, stack="fsdp",
                                     recompute_share=share)
        grid = perfmodel.evaluate_grid("llama2-13b", "dgx-h100", 96, 192, stack="fsdp", recompute_share=share,
                                       **space)
        assert grid.attrs["recompute_share"] == share
        for entry in ranked:
            plan = entry["plan"]
            assert plan.get("recompute_share") == (share if plan["recompute"] == "selective" else None)
            run = {"id": "s", "model": "llama2-13b", "system": "dgx-h100", "gpus": 96,
                   "plan": dict(perfmodel.plan_from_grid_entry(plan, 192).__dict__)}
            assert perfmodel.predict(run).step_time_s == pytest.approx(entry["step_time_s"], rel=1e-12)
            steps[(share, plan["recompute"])] = entry["step_time_s"]
    assert steps[(0.2, "selective")] < steps[(0.9, "selective")]
    assert steps[(0.2, "full")] == steps[(0.9, "full")]
    with pytest.raises(SpecError) as err:
        perfmodel.evaluate_grid("llama2-13b", "dgx-h100", 96, 192, recompute_share=1.5, **space)
    assert err.value.field == "recompute_share" and "1.5" in str(err.value)
    grid32 = perfmodel.evaluate_grid("llama2-7b", "dgx-a100-80gb", 64, 128, stack="deepspeed", grad_reduce_fp32=True,
                                     zero=[1], micro_batch=[2])
    grid16 = perfmodel.evaluate_grid("llama2-7b", "dgx-a100-80gb", 64, 128, stack="deepspeed", zero=[1],
                                     micro_batch=[2])
    assert grid32.attrs["grad_reduce_fp32"] == 1
    assert float(grid32["step_time_s"].max()) > float(grid16["step_time_s"].max())


@pytest.mark.parametrize("tp", [2, 8])
def test_batch_first_sequence_parallelism_copies_each_collective_once_more(tp):
    """torchtitan's DTensor sequence parallelism shards a batch-first tensor along dim 1; PyTorch's
    functional collectives gather and reduce-scatter along dim 0 and reorder with torch.cat(torch.chunk)
    (one read and one write of the whole m x h tensor per collective, four collectives per pass).
    Megatron (sequence-first) has no such copy. Closed form on the layer kernel: the FSDP stack's TP time
    per pass exceeds Megatron's by 4 (2 * 2 m h / (eta B) + t_kernel), and nothing else changes."""
    from trainscale.kernels.layer import sp_layout_copy_time

    mb = 2
    fsdp, calib_f, m, s = _layer(tp=tp, mb=mb, sp=True, stack="fsdp")
    meg, calib_m, _, _ = _layer(tp=tp, mb=mb, sp=True, stack="megatron")
    assert calib_f[K.C_SP_LAYOUT_COPY] == 1.0 and calib_m[K.C_SP_LAYOUT_COPY] == 0.0
    assert perfmodel.calibration_vector("hopper", None, "nemo")[K.C_SP_LAYOUT_COPY] == 0.0
    tokens, hbm = mb * m.seq_len, s.hbm_bandwidth_GBps * 1e9
    copy = 4 * (2 * 2 * tokens * m.hidden / (calib_f[K.C_HBM_EFF] * hbm) + calib_f[K.C_KERNEL_S])
    assert sp_layout_copy_time(tokens, m.hidden, tp, True, hbm, calib_f) == pytest.approx(copy, rel=1e-12)
    calib_f_off = calib_f.copy()
    calib_f_off[K.C_SP_LAYOUT_COPY] = 0.0
    off = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(m), perfmodel.system_vector(s), calib_f_off, tp, 1, mb, K.RC_NONE, True, True, off)
    assert fsdp[K.L_FWD_TP] - off[K.L_FWD_TP] == pytest.approx(copy, rel=1e-9)
    assert fsdp[K.L_BWD_TP] - off[K.L_BWD_TP] == pytest.approx(copy, rel=1e-9)
    assert fsdp[K.L_FWD_GEMM] == off[K.L_FWD_GEMM] and fsdp[K.L_FWD_ELEM] == off[K.L_FWD_ELEM]
    # no sequence parallelism, or no tensor parallelism: no collective to reorder
    assert sp_layout_copy_time(tokens, m.hidden, tp, False, hbm, calib_f) == 0.0
    assert sp_layout_copy_time(tokens, m.hidden, 1, True, hbm, calib_f) == 0.0


def test_a_public_row_names_only_a_known_dataset(tmp_path, monkeypatch):
    """The ``dataset`` column sets a row apart as a held-out set or a separately fitted source; any other
    name is refused with one line naming the row, the field, the value and what is valid."""
    from trainscale.model import catalog

    with open(catalog.data_path(validation.STACKS_FILE), encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        row, fields = dict(next(reader), dataset="fsdp-compild"), reader.fieldnames
    with open(tmp_path / validation.STACKS_FILE, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerow(row)
    monkeypatch.setattr(catalog, "data_path", lambda name: tmp_path / name)
    with pytest.raises(ValueError, match=r"row \S+: dataset = 'fsdp-compild' is invalid; valid: blank"):
        validation.public_runs()


def _interleaved_run(stack, layers=84, pp=2, v=8):
    model = dataclasses.replace(resolve_model("llama2-7b"), name=f"llama-l{layers}", layers=layers)
    plan = {"tp": 8, "pp": pp, "dp": 1, "interleave": v, "micro_batch": 1, "global_batch": 8 * pp,
            "recompute": "full", "stack": stack}
    return model, plan


def test_megatron_refuses_an_uneven_interleaved_split_and_nemo_prices_it():
    """Megatron-LM builds layers / (pp * interleave) layers in every chunk and asserts the split is even
    (arguments.py); NeMo 2.0's recipes run uneven chunks (Llama 3.1 405B: 126 layers at PP 8, VP 8)."""
    model, plan = _interleaved_run("megatron")  # 84 layers over 2 x 8 chunks: 5.25 per chunk
    system = resolve_system("dgx-a100-80gb")
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict({"id": "uneven", "model": dataclasses.asdict(model), "system": system.name, "gpus": 16,
                           "plan": plan})
    message = str(err.value)
    assert "plan.interleave" in message and "8" in message and "layers = 84" in message and "\n" not in message
    run = RunSpec(id="uneven", model=model, system=system, plan=perfmodel.PlanSpec(**plan))
    refused = perfmodel.predict(run)
    assert not np.isfinite(refused.step_time_s) and refused.reason == K.REASONS[K.R_UNEVEN_CHUNKS]
    even = perfmodel.predict(dataclasses.replace(run, plan=dataclasses.replace(run.plan, interleave=6)))
    assert np.isfinite(even.step_time_s) and even.reason is None  # 84 = 2 x 6 x 7
    nemo = perfmodel.predict(dataclasses.replace(run, plan=dataclasses.replace(run.plan, stack="nemo")))
    assert np.isfinite(nemo.step_time_s) and nemo.reason is None


def test_a_megatron_search_skips_uneven_interleaving():
    """The grid masks exactly the interleaved megatron plans whose chunks would differ in size, with
    their own reason; the same space under nemo keeps them."""
    model, _ = _interleaved_run("megatron", layers=84)
    system = resolve_system("dgx-a100-80gb")
    space = {"tp": [8], "pp": [2, 4], "cp": [1], "interleave": [1, 2, 3, 4, 6, 8], "micro_batch": [1],
             "recompute": ["full"], "sequence_parallel": [0], "zero": [0], "shard_group": [0],
             "overlap_grad_reduce": [0], "flash_attention": [0], "zero3_per_tensor": [0], "tp_comm_overlap": [0]}
    space = {k: v for k, v in space.items() if k in perfmodel.GRID_AXES}
    grids = {stack: perfmodel.evaluate_grid(model, system, 64, 512, stack=stack, **space)
             for stack in ("megatron", "nemo")}
    reason = grids["megatron"]["reason"]
    uneven_layouts = sum(v > 1 and 84 % (pp * v) != 0 for pp in (2, 4) for v in (1, 2, 3, 4, 6, 8))
    for stack, expected in (("megatron", uneven_layouts), ("nemo", 0)):  # the search masks the same plans
        summary, _ = planner.search(model, system, 64, 512, top=1, space=space, stack=stack)
        assert int(summary["plans"].sel(reason=K.REASONS[K.R_UNEVEN_CHUNKS])) == expected, stack
    for pp in (2, 4):
        for v in (1, 2, 3, 4, 6, 8):
            code = int(reason.sel(pp=pp, interleave=v).values.ravel()[0])
            uneven = v > 1 and 84 % (pp * v) != 0
            assert (code == K.R_UNEVEN_CHUNKS) == uneven, (pp, v, code)
            nemo_code = int(grids["nemo"]["reason"].sel(pp=pp, interleave=v).values.ravel()[0])
            assert nemo_code != K.R_UNEVEN_CHUNKS


@pytest.mark.parametrize("stack", ["megatron", "deepspeed", "fsdp", "nemo"])
@pytest.mark.parametrize("tp", [1, 4])
def test_loss_streams_the_stacks_bytes_per_logit(stack, tp):
    """The output layer's time beyond its GEMMs is the stack's cross-entropy: its bytes per fp32 logit
    element of this GPU's vocabulary shard (tokens x vocab / tp) over the HBM rate, plus its kernels,
    forward and backward as calibration.yaml counts them from each stack's code."""
    lc, calib, m, s = _layer(model="llama3-8b", tp=tp, stack=stack)
    sv = perfmodel.system_vector(s)
    logits = m.seq_len * m.vocab / tp
    rate = calib[K.C_HBM_EFF] * s.hbm_bandwidth_GBps * 1e9
    f_head, b_head = compute.gemm_fwd_bwd_time(m.seq_len, m.vocab // tp, m.hidden, 1, sv[K.S_PEAK_FLOPS],
                                               sv[K.S_HBM_BW], sv[K.S_SMS], calib)
    fixed = catalog.calibration()["stacks"][stack]["fixed"]
    for direction, gemm, cost in (("forward", f_head, lc[K.L_HEAD_FWD]), ("backward", b_head, lc[K.L_HEAD_BWD])):
        spec = fixed[f"loss_{direction}_bytes_per_logit"]
        expected = gemm + spec["value"] * logits / rate + spec["kernels"] * calib[K.C_KERNEL_S]
        assert cost == pytest.approx(expected, rel=1e-12), (stack, direction)


def test_megatron_and_megatron_deepspeed_run_the_same_unfused_loss():
    """Megatron-DeepSpeed calls Megatron's vocab-parallel cross-entropy: the same count; NeMo's fused loss
    moves fewer bytes than Megatron's unfused one."""
    stacks = catalog.calibration()["stacks"]
    total = {name: sum(stacks[name]["fixed"][f"loss_{d}_bytes_per_logit"]["value"] for d in ("forward", "backward"))
             for name in stacks}
    assert total["megatron"] == total["deepspeed"] == 52
    assert total["nemo"] < total["megatron"]


@pytest.mark.parametrize("stack", ["megatron", "deepspeed", "fsdp", "nemo"])
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_rotary_embedding_streams_the_stacks_bytes(stack, compiled, tp):
    """A rotary model's layer costs, beyond a learned-position twin of the same shape, the stack's rotary
    kernel on this GPU's queries and keys, m (h + h_kv) / t elements, in each pass: the stack's bytes per
    element (a compiled plan: the common fused value) over the HBM rate, plus its kernels."""
    rope = resolve_model("llama3-8b")
    learned = dataclasses.replace(rope, position_embedding="learned")
    assert rope.rotary and not learned.rotary
    s = resolve_system("dgx-h100")
    calib = perfmodel.calibration_vector(s.generation, None, stack, compiled)
    costs = {}
    for m in (rope, learned):
        lc = np.empty(K.L_SIZE)
        layer_costs(perfmodel.model_vector(m), perfmodel.system_vector(s), calib, tp, 1, 1, K.RC_NONE, True,
                    True, lc)
        costs[m.positions] = lc
    cal = catalog.calibration()
    kernel = "fused" if compiled else cal["stacks"][stack]["fixed"]["rotary_kernel"]["value"]
    spec = cal["common"]["rotary_kernels"][kernel]
    elements = rope.seq_len * (rope.hidden + rope.kv_heads * rope.head_dim) / tp
    rate = calib[K.C_HBM_EFF] * s.hbm_bandwidth_GBps * 1e9
    expected = spec["bytes_per_element"] * elements / rate + spec["kernels"] * calib[K.C_KERNEL_S]
    for slot in (K.L_FWD_ELEM, K.L_BWD_ELEM):
        assert costs["rotary"][slot] - costs["learned"][slot] == pytest.approx(expected, rel=1e-9), slot
    assert costs["rotary"][K.L_FWD_GEMM] == costs["learned"][K.L_FWD_GEMM]


def test_position_embedding_follows_the_ffn_unless_given():
    """Blank: GPT (gelu) learns a position table, Llama (swiglu) rotates; BLOOM's ALiBi and nanochat's
    rotary embeddings come from models.yaml; only a learned table adds seq_len x hidden parameters."""
    gpt, llama = resolve_model("gpt3-175b"), resolve_model("llama3-8b")
    assert (gpt.positions, llama.positions) == ("learned", "rotary")
    assert resolve_model("bloom-176b").positions == "alibi"
    assert resolve_model("nanochat-d20").positions == "rotary"
    rotary_gpt = dataclasses.replace(gpt, position_embedding="rotary")
    assert gpt.params() - rotary_gpt.params() == gpt.seq_len * gpt.hidden
    assert dataclasses.replace(gpt, position_embedding="alibi").params() == rotary_gpt.params()


def test_a_bad_position_embedding_is_refused_with_one_line():
    with pytest.raises(SpecError, match="position_embedding.*learned, rotary, alibi"):
        resolve_model({"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 32,
                       "position_embedding": "sinusoidal"})
    row = {"id": "r1", "model": "x", "position_embedding": "rope"}
    with pytest.raises(ValueError, match="r1: position_embedding = 'rope' is invalid; valid: blank, learned"):
        measured._public_model(row)
    with pytest.raises(ValueError, match="catalog model llama3-8b"):
        measured._public_model({"id": "r2", "model": "llama3-8b", "position_embedding": "rotary"})


def test_a_plan_names_its_rotary_kernel_and_fms_fsdp_rows_take_the_matrix_form():
    """A plan's rotary_kernel replaces its stack's (compiled still fuses it); the fms-fsdp rows carry
    foundation-model-stack's matrix form, every other FSDP row torchtitan's complex multiplication; a name
    outside the catalog is refused with one line naming the field."""
    base = {"id": "r", "model": "llama2-7b", "system": "dgx-h100", "gpus": 8,
            "plan": {"tp": 1, "pp": 1, "global_batch": 16, "micro_batch": 2, "recompute": "none", "zero": 3,
                     "flash_attention": True, "stack": "fsdp"}}
    times = {k: perfmodel.predict({**base, "plan": {**base["plan"], "rotary_kernel": k}}).step_time_s
             for k in ("", "fused", "complex", "matrix", "rotate_half")}
    assert times[""] == times["complex"]
    assert times["fused"] < times["complex"] < times["rotate_half"] < times["matrix"]
    compiled = {k: perfmodel.predict({**base, "plan": {**base["plan"], "rotary_kernel": k, "compiled": True}})
                .step_time_s for k in ("", "matrix")}
    assert compiled[""] == compiled["matrix"]
    kernels = {m.run.id: m.run.plan.rotary_kernel for m in validation.public_runs() if m.run.plan.stack == "fsdp"}
    assert {k for i, k in kernels.items() if i.startswith("fmsfsdp")} == {"matrix"}
    assert {k for i, k in kernels.items() if not i.startswith("fmsfsdp")} == {""}
    with pytest.raises(SpecError) as err:
        perfmodel.predict({**base, "plan": {**base["plan"], "rotary_kernel": "triton"}})
    assert err.value.field.endswith("rotary_kernel") and "triton" in str(err.value) and "matrix" in str(err.value)


def test_tp_async_backward_is_a_plan_field_defaulting_to_the_stack():
    """Megatron-LM and NeMo (Transformer Engine) issue the backward's TP collectives asynchronously,
    DeepSpeed's Megatron and PyTorch's TP do not; a plan may say otherwise; a bad value is one line."""
    run = {"id": "a", "model": "gpt-22b", "system": "dgx-a100-80gb", "gpus": 8,
           "plan": {"tp": 8, "pp": 1, "global_batch": 4, "micro_batch": 4, "recompute": "full",
                    "flash_attention": False, "zero": 0, "sequence_parallel": False, "overlap_grad_reduce": False}}
    for stack, default in (("megatron", True), ("nemo", True), ("deepspeed", False), ("fsdp", False)):
        plan = {**run["plan"], "stack": stack}
        base = perfmodel.predict({**run, "plan": plan}).step_time_s
        chosen = perfmodel.predict({**run, "plan": {**plan, "tp_async_backward": default}}).step_time_s
        other = perfmodel.predict({**run, "plan": {**plan, "tp_async_backward": not default}}).step_time_s
        assert base == chosen
        assert (other > base) == default
    with pytest.raises(SpecError) as err:
        perfmodel.predict({**run, "plan": {**run["plan"], "tp_async_backward": "sometimes"}})
    assert err.value.field.endswith("tp_async_backward") and "sometimes" in str(err.value)
