"""The Numba kernels against closed forms, textbook formulas and a pure-Python reference run."""

import ast
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainscale.model import grid as model_grid
from trainscale.model import perfmodel
from trainscale.kernels import collectives as C
from trainscale.kernels import compute
from trainscale.kernels import layout as K
from trainscale.kernels import zero3
from trainscale.kernels.grid import evaluate_grid as grid_kernel
from trainscale.kernels.layer import layer_costs
from trainscale.kernels.pipesplit import stage_layers
from trainscale.kernels.plan import plan_costs
from trainscale.model.specs import ModelSpec, PlanSpec, RunSpec, resolve_model, resolve_system

REPO_ROOT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=50, deadline=None)

# A100-like two-tier network (SI units)
BW_UP, LAT_UP = 300e9, 2e-6
BW_OUT, LAT_OUT = 25e9, 5e-6
ETA = 0.85
DOMAIN = 8


def rel(a, b):
    return abs(a - b) / abs(b)


# --------------------------------------------------------------------------- collectives
@FAST
@given(n=st.integers(2, DOMAIN), nbytes=st.floats(1.0, 1e11))
def test_allreduce_inside_domain_is_textbook_ring(n, nbytes):
    expected = 2 * (n - 1) / n * nbytes / (ETA * BW_UP) + 2 * (n - 1) * LAT_UP
    got = C.allreduce_time(nbytes, n, 1, DOMAIN, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA)
    assert got == pytest.approx(expected, rel=1e-12)
    phase = C.ring_phase_time(nbytes, n, BW_UP, LAT_UP, ETA)
    assert phase == pytest.approx((n - 1) / n * nbytes / (ETA * BW_UP) + (n - 1) * LAT_UP, rel=1e-12)
    assert C.allgather_time(nbytes, n, 1, DOMAIN, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA) == pytest.approx(
        phase, rel=1e-12)


@FAST
@given(n=st.integers(2, 512), stride=st.integers(DOMAIN, 4096), nbytes=st.floats(1.0, 1e11))
def test_allreduce_one_member_per_domain_is_flat_scale_out_ring_or_tree(n, stride, nbytes):
    ring = 2 * (n - 1) / n * nbytes / (ETA * BW_OUT) + 2 * (n - 1) * LAT_OUT
    tree = 2 * math.ceil(math.log2(n)) * LAT_OUT + 2 * nbytes / (C.TREE_BUS_FACTOR * ETA * BW_OUT)  # NCCL's 0.9
    got = C.allreduce_time(nbytes, n, stride, DOMAIN, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA)
    assert got == pytest.approx(min(ring, tree), rel=1e-12)
    phase = C.allgather_time(nbytes, n, stride, DOMAIN, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA)
    assert phase == pytest.approx(ring / 2, rel=1e-12)  # all-gather and reduce-scatter are ring-only


@pytest.mark.parametrize("nbytes", [1e3, 1e5, 1e7, 1e9, 1e11])
def test_allreduce_two_tier_case_is_min_of_ring_tree_and_2d(nbytes):
    n, n_in, n_out = 64, 8, 8
    assert C.group_split(n, 1, DOMAIN) == (n_in, n_out)
    bus = min(BW_UP, n_in * BW_OUT)  # 200 GB/s: each of the 8 GPUs of a node drives its NIC
    ring = 2 * ((n - n_out) * LAT_UP + (n_out - 1) * LAT_OUT + (n - 1) / n * nbytes / (ETA * bus))
    tree = 2 * ((n_in - 1) * LAT_UP + 3 * LAT_OUT) + 2 * nbytes / (C.TREE_BUS_FACTOR * ETA * bus)  # log2(8) = 3
    hier = (2 * ((n_in - 1) * LAT_UP + (n_in - 1) / n_in * nbytes / (ETA * BW_UP))
            + 2 * ((n_out - 1) * LAT_OUT + (n_out - 1) / n_out * (nbytes / n_in) / (ETA * BW_OUT)))
    got = C.allreduce_time(nbytes, n, 1, DOMAIN, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA)
    assert got == pytest.approx(min(ring, tree, hier), rel=1e-12)
    # latency-bound messages take the tree, bandwidth-bound ones the ring
    if nbytes <= 1e5:
        assert tree < min(ring, hier)
    if nbytes >= 1e11:
        assert ring < min(tree, hier)


@pytest.mark.parametrize("n, stride, bus", [(8, 1, BW_UP), (64, DOMAIN, BW_OUT), (4, 2, BW_UP)])
def test_busbw_rises_with_size_and_tends_to_eta_b(n, stride, bus):
    sizes = np.logspace(3, 13, 41)
    bw = np.array([C.allreduce_busbw_GBps(s, n, stride, DOMAIN, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA)
                   for s in sizes])
    assert np.all(np.diff(bw) > 0), bw
    limit = ETA * bus / 1e9
    assert bw[-1] == pytest.approx(limit, rel=0.01), (bw[-1], limit)
    assert bw[0] < 0.5 * limit  # small messages are latency bound


# --------------------------------------------------------------------------- GEMM efficiency
SMS, TILE_M, TILE_N, ETA_MAX = 108.0, 128.0, 256.0, 0.77


def gemm_eff(m, n, k, batch):
    return compute.gemm_efficiency(m, n, batch, SMS, ETA_MAX, TILE_M, TILE_N)


@pytest.mark.parametrize("m, n, batch", [(128 * 108, 256, 1), (128 * 54, 512, 1), (128, 256, 108),
                                         (128 * 27, 256 * 8, 2)])
@pytest.mark.parametrize("k", [64, 1024, 12288])
def test_gemm_efficiency_full_waves(m, n, batch, k):
    tiles = batch * (m // 128) * (n // 256)
    assert tiles % 108 == 0
    assert gemm_eff(m, n, k, batch) == pytest.approx(ETA_MAX, rel=1e-12)


def test_gemm_wave_quantisation():
    k = 4096
    full = gemm_eff(128, 256, k, 108)  # 108 tiles: one full wave
    one_more = gemm_eff(128, 256, k, 109)  # 109 tiles: two waves, the second nearly empty
    assert one_more / full == pytest.approx(109 / 216, rel=1e-12)
    # the same through m: one extra tile row of 256-wide tiles
    full_m = gemm_eff(128 * 108, 256, k, 1)
    extra_m = gemm_eff(128 * 109, 256, k, 1)
    assert extra_m / full_m == pytest.approx(109 / 216, rel=1e-12)
    # a partial edge tile: m = 64 fills half of each 128-row tile
    assert gemm_eff(64, 256, k, 216) / full == pytest.approx(0.5, rel=1e-12)


@FAST
@given(m=st.integers(1, 100_000), n=st.integers(1, 100_000), k=st.integers(1, 100_000),
       batch=st.integers(1, 512))
def test_gemm_efficiency_never_exceeds_eta_max(m, n, k, batch):
    eff = gemm_eff(m, n, k, batch)
    assert 0.0 < eff <= ETA_MAX


# --------------------------------------------------------------------------- parameters and FLOPs
def megatron_params(model: ModelSpec) -> float:
    l, h, V, s = model.layers, model.hidden, model.vocab, model.seq_len
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


@pytest.mark.parametrize("name", ["gpt-1.7b", "gpt3-175b", "gpt-18.4b", "gpt-1t"])
def test_gpt_params_megatron_closed_form(name):
    model = resolve_model(name)
    h, V = model.hidden, model.vocab
    # Megatron's eq. counts the tied embedding once and omits the final LayerNorm (weight + bias);
    # we count an untied output projection (V h) and the final LayerNorm (2 h).
    expected = megatron_params(model) + V * h + 2 * h
    assert model.params() == round(expected)
    assert abs(model.params() - expected) < 1e-3 * h  # the closed form is exact, not rounded


def test_llama2_7b_params_match_meta():
    assert resolve_model("llama2-7b").params() == 6_738_415_616


def megatron_run(recompute, gpus=1024, tp=8, pp=16, gb=1536, mb=1, name="gpt3-175b"):
    return RunSpec(id="flops", model=resolve_model(name), system=resolve_system("dgx-a100-80gb"),
                   plan=PlanSpec(tp=tp, pp=pp, dp=gpus // (tp * pp), micro_batch=mb, global_batch=gb,
                                 recompute=recompute))


@pytest.mark.parametrize("mb", [1, 2])
def test_flops_megatron_eq3(mb):
    run = megatron_run("full", mb=mb)
    m = run.model
    B, s, l, h, V = run.plan.global_batch, m.seq_len, m.layers, m.hidden, m.vocab
    p = perfmodel.predict(run)
    hw = p.hardware_tflops_per_gpu * 1e12 * p.step_time_s * run.gpus
    model_flops = p.model_tflops_per_gpu * 1e12 * p.step_time_s * run.gpus
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert rel(hw, eq3) < 1e-9, (hw, eq3)
    expected_model = 72 * B * s * l * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V
    assert rel(model_flops, expected_model) < 1e-9, (model_flops, expected_model)
    # without recomputation hardware FLOPs are model FLOPs; selective adds the attention core
    none = perfmodel.predict(megatron_run("none", mb=mb))
    assert rel(none.hardware_tflops_per_gpu * none.step_time_s * run.gpus * 1e12, expected_model) < 1e-9
    sel = perfmodel.predict(megatron_run("selective", mb=mb))
    assert rel(sel.hardware_tflops_per_gpu * sel.step_time_s * run.gpus * 1e12,
               expected_model + 4 * B * s * s * l * h) < 1e-9


# --------------------------------------------------------------------------- pipeline
@FAST
@given(layers=st.integers(1, 200), pp=st.integers(1, 64), v=st.integers(1, 8))
def test_stage_layers_balanced(layers, pp, v):
    if pp * v > layers or (v > 1 and pp == 1):
        return
    first, mid, last = stage_layers(layers, pp, v)
    base = layers // (pp * v)
    for n in (first, mid, last):  # chunks of base or base + 1 layers
        assert v * base <= n <= v * (base + 1)
    if layers % (pp * v) == 0:
        assert first == mid == last == layers // pp
    if pp == 1:
        assert first == mid == last == layers
    elif pp == 2:
        assert first + last == layers
    else:  # the middle devices hold the rest, the most loaded one has `mid`
        rest = layers - first - last
        assert (pp - 2) * v * base <= rest <= (pp - 2) * mid
        assert mid == -(-rest // (pp - 2))
        assert first <= mid and last <= mid


def _vectors(model, system):
    model, system = resolve_model(model), resolve_system(system)
    return (perfmodel.model_vector(model), perfmodel.system_vector(system),
            perfmodel.calibration_vector(system.generation))


@pytest.mark.parametrize("pp, v, micro", [(2, 1, 8), (4, 1, 16), (8, 1, 8), (8, 1, 32), (4, 2, 8),
                                          (8, 2, 16), (2, 2, 4), (16, 2, 32)])
def test_pipeline_bubble_closed_form(pp, v, micro):
    mvec, svec, calib = _vectors("gpt3-175b", "dgx-a100-80gb")
    tp, dp, mb = 8, 2, 1
    lc = np.empty(K.L_SIZE)
    layer_costs(mvec, svec, calib, tp, 1, mb, K.RC_FULL, False, False, lc, 1, False, 0)
    lc[K.L_HEAD_FWD] = lc[K.L_HEAD_BWD] = 0.0  # uniform stages: no output layer on the last
    out = np.empty(K.O_SIZE)
    plan_costs(mvec, svec, calib, lc, tp * pp * dp, tp, pp, dp, 1, v, mb, dp * mb * micro, K.RC_FULL, 0, 0,
               False, False, out, 1, 0, 0, 0, 0)
    assert out[K.O_REASON] in (K.R_OK, K.R_MEMORY)  # memory is beside the point here
    steady = out[K.O_COMPUTE] + out[K.O_RECOMPUTE] + out[K.O_TP_COMM] + out[K.O_CP_COMM] + out[K.O_PP_COMM]
    assert steady == pytest.approx(out[K.O_STEP] - out[K.O_BUBBLE] - out[K.O_DP_COMM] - out[K.O_OPTIMIZER]
                                   - out[K.O_STRAGGLER],
                                   rel=1e-12)
    assert out[K.O_BUBBLE] / steady == pytest.approx((pp - 1) / (v * micro), rel=1e-12)


# --------------------------------------------------------------------------- grid
SMALL = dict(tp=[1, 2, 4, 8], pp=[1, 2, 4], micro_batch=[1, 2], recompute=["none", "selective", "full"],
             zero=[0, 3], sequence_parallel=[0, 1], tp_comm_overlap=[0, 1])


# --------------------------------------------------------------------------- DeepSpeed ZeRO-3 windows
Z3_SYSTEM = perfmodel.system_vector(resolve_system("dgx-a100-80gb"))


def _z3_calib(fetch_s):
    calib = perfmodel.calibration_vector("ampere", {"zero3_fetch_s": fetch_s}, stack="deepspeed")
    return calib


@pytest.mark.parametrize("name, matrices", [("gpt3-175b", 4), ("llama2-7b", 7)])
def test_zero3_matrices_add_up_to_the_layer_weights(name, matrices):
    # the matrices DeepSpeed fetches one by one are the layer's weights but its norms and biases
    model = resolve_model(name)
    vec = perfmodel.model_vector(model)
    assert vec[K.M_TENSORS_LAYER] == matrices
    total = sum(zero3.zero3_tensor_params(vec, i) for i in range(matrices))
    h = model.hidden
    extras = (4 * h + (h + 2 * model.kv_heads * model.head_dim) + h + model.ffn_hidden + h if model.has_biases
              else 2 * h)
    assert total == pytest.approx(model.params_per_layer() - extras, rel=1e-12)


@FAST
@given(work_s=st.floats(1e-4, 10.0), share_recomp=st.sampled_from([0.0, 1.0]), group=st.sampled_from([8, 64, 768]),
       name=st.sampled_from(["gpt3-175b", "llama2-7b", "gpt-1.7b"]))
def test_zero3_windows_are_the_sum_over_matrices(work_s, share_recomp, group, name):
    # one matrix ahead: each matrix's share of a pass runs beside the next matrix's gather (backward:
    # the previous one's, and the reduce-scatter of the matrix before); each fetch adds its host cost
    vec = perfmodel.model_vector(resolve_model(name))
    calib = _z3_calib(2e-3)
    n, tp, slow = int(vec[K.M_TENSORS_LAYER]), 1, 0.2
    sizes = [zero3.zero3_tensor_params(vec, i) for i in range(n)]
    shares = [x / sum(sizes) for x in sizes]
    gather = [zero3.zero3_tensor_gather_time(vec, Z3_SYSTEM, calib, tp, group, i) - 2e-3 for i in range(n)]
    bw, lat = C.out_link(Z3_SYSTEM, group, tp)
    scatter = [C.allgather_time(2.0 * x, group, tp, 8, Z3_SYSTEM[K.S_SCALE_UP_BW], Z3_SYSTEM[K.S_SCALE_UP_LAT], bw,
                                lat, calib[K.C_NET_EFF]) for x in sizes]

    def exposed(c, w):
        return max(c - w, c * slow / (1 + slow))

    fwd = sum(exposed(gather[(i + 1) % n], work_s * shares[i]) + 2e-3 for i in range(n))
    recomp = share_recomp * work_s
    bwd = sum(exposed(gather[(i + 1) % n], recomp * shares[i]) + 2e-3 for i in range(n)) if recomp else 0.0
    bwd += sum(exposed(gather[i - 1] + scatter[(i + 1) % n], 2 * work_s * shares[i]) + 2e-3 for i in range(n))
    got = zero3.zero3_tensor_windows(vec, Z3_SYSTEM, calib, tp, group, work_s, recomp, 2 * work_s, slow)
    assert got[0] == pytest.approx(fwd, rel=1e-12) and got[1] == pytest.approx(bwd, rel=1e-12)


@FAST
@given(work_s=st.floats(1e-5, 10.0), group=st.sampled_from([2, 16, 384, 1536]),
       name=st.sampled_from(["gpt3-175b", "llama2-7b", "gpt-1.7b"]))
def test_zero3_one_matrix_ahead_never_hides_more_than_a_layer_ahead(work_s, group, name):
    # sum_i max(w_i, c_i) >= max(sum w, sum c): without host cost and slowdown, pipelining the
    # fetches one matrix ahead exposes at least what prefetching the whole next layer would
    vec = perfmodel.model_vector(resolve_model(name))
    calib = _z3_calib(0.0)
    n = int(vec[K.M_TENSORS_LAYER])
    gathers = sum(zero3.zero3_tensor_gather_time(vec, Z3_SYSTEM, calib, 1, group, i) for i in range(n))
    fwd, _ = zero3.zero3_tensor_windows(vec, Z3_SYSTEM, calib, 1, group, work_s, 0.0, 2 * work_s, 0.0)
    assert fwd >= max(0.0, gathers - work_s) * (1 - 1e-12)


def test_zero3_per_tensor_buffers_hold_two_matrices():
    # DeepSpeed holds the matrix in use and the prefetched next one (GPT: the FFN's two, 8 h^2),
    # FSDP the layer in use and the next layer
    model = resolve_model("gpt3-175b")
    plan = dict(tp=1, pp=1, dp=384, micro_batch=1, global_batch=384, zero=3, recompute="full",
                stack="deepspeed", overlap_grad_reduce=True)
    system = resolve_system("dgx-a100-80gb")
    deepspeed = perfmodel.predict(RunSpec(id="z", model=model, system=system,
                                          plan=PlanSpec(**plan, zero3_per_tensor=True)))
    fsdp = perfmodel.predict(RunSpec(id="z", model=model, system=system, plan=PlanSpec(**plan)))
    gib = 2.0 ** 30
    assert deepspeed.memory_breakdown_gib["buffers"] == pytest.approx(2 * 8 * model.hidden ** 2 / gib, rel=1e-12)
    assert fsdp.memory_breakdown_gib["buffers"] == pytest.approx(2 * 2 * model.params_per_layer() / gib, rel=1e-12)


@pytest.fixture(scope="module")
def small_grid():
    return perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 64, 128, **SMALL)


def test_grid_equals_scalar_predict(small_grid):
    ds = small_grid
    model, system = resolve_model("llama2-7b"), resolve_system("dgx-h100")
    step = ds["step_time_s"]
    checked = 0
    for idx in np.ndindex(step.shape):
        if not np.isfinite(step.values[idx]):
            continue
        entry = {name: ds[name].values[i].item() for name, i in zip(perfmodel.GRID_AXES, idx)}
        entry["dp"] = int(ds["dp"].values[idx])
        plan = perfmodel.plan_from_grid_entry(entry, 128)
        # the grid prices every plan, runnable by its stack or not (data/stack_rules.yaml): so does predict here
        p = perfmodel.predict(RunSpec(id="g", model=model, system=system, plan=plan), pipeline_simulation=False,
                              allow_unrunnable=True, warn=False)
        assert p.step_time_s == pytest.approx(float(step.values[idx]), rel=1e-12, abs=0)
        assert p.memory_gib_per_gpu == pytest.approx(float(ds["memory_gib_per_gpu"].values[idx]), rel=1e-12)
        assert p.mfu == pytest.approx(float(ds["mfu"].values[idx]), rel=1e-12)
        assert p.fits == bool(ds["fits"].values[idx])
        for name in p.breakdown:
            assert p.breakdown[name] == pytest.approx(float(ds[f"time_{name}_s"].values[idx]), rel=1e-12,
                                                      abs=1e-15)
        checked += 1
    assert checked >= 400, checked  # most of the 1152 plans are valid


def test_grid_reason_codes():
    ds = perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 96, 96, tp=[3], pp=[1])
    assert int(ds["reason"].item()) == K.R_TP_HEADS and np.isnan(ds["step_time_s"].item())
    ds = perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 64, 128, tp=[3], pp=[1])
    assert int(ds["reason"].item()) == K.R_TP_HEADS and np.isnan(ds["step_time_s"].item())  # first reason wins
    ds = perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 64, 128, tp=[2], pp=[3])
    assert int(ds["reason"].item()) == K.R_GPUS and np.isnan(ds["step_time_s"].item())  # 2*3 does not divide 64
    ds = perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 64, 128, tp=[1], pp=[8], interleave=[8])
    assert int(ds["reason"].item()) == K.R_PP_LAYERS and np.isnan(ds["step_time_s"].item())  # 64 > 32 layers
    ds = perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 64, 128, tp=[1], pp=[1], micro_batch=[4])
    assert int(ds["reason"].item()) == K.R_BATCH and np.isnan(ds["step_time_s"].item())  # dp*mb = 256
    ds = perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 64, 128, tp=[4], pp=[2], micro_batch=[1])
    assert int(ds["reason"].item()) == K.R_OK and np.isfinite(ds["step_time_s"].item())
    assert ds.attrs and ds["reason"].attrs["reasons"][K.R_MEMORY] == "does not fit in accelerator memory"


def _kernel_args(model, system, gpus, gb, **axes):
    model, system = resolve_model(model), resolve_system(system)
    defaults = {"recompute": ["full"], "sequence_parallel": [0], "zero": [0], "shard_group": [0],
                "overlap_grad_reduce": [0], "flash_attention": [0], "zero3_per_tensor": [0],
                "tp_comm_overlap": [0]}
    arrays = [model_grid._axis(list(axes.get(n, defaults.get(n, [1]))), n) for n in perfmodel.GRID_AXES]
    return (perfmodel.model_vector(model), perfmodel.system_vector(system),
            perfmodel.calibration_vector(system.generation), gpus, gb, *arrays)


def test_grid_independent_of_thread_count(monkeypatch):
    from trainscale.kernels import grid as grid_kernels

    monkeypatch.setattr(grid_kernels, "MIN_PLANS_PER_THREAD", 100)  # this small grid cut in ranges too
    args = _kernel_args("llama2-7b", "dgx-h100", 64, 128, **dict(SMALL, tp_comm_overlap=[0]), flash_attention=[0, 1],
                        overlap_grad_reduce=[0, 1])
    threads = min(2, numba.config.NUMBA_NUM_THREADS)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one, dp1 = grid_kernel(*args)
        numba.set_num_threads(threads)
        two, dp2 = grid_kernel(*args)
    finally:
        numba.set_num_threads(before)
    ep_args = (*args, np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    three, dp3 = grid_kernels.evaluate_grid_ep(*ep_args, threads=3)  # three ranges of 384 plans; seven uneven ones
    seven, dp7 = grid_kernels.evaluate_grid_ep(*ep_args, threads=7)
    assert one.shape == (1152, K.O_SIZE)
    assert np.isfinite(one[:, K.O_STEP]).sum() > 500
    for other, dp in ((two, dp2), (three, dp3), (seven, dp7)):
        np.testing.assert_array_equal(one, other)
        np.testing.assert_array_equal(dp1, dp)


REFERENCE_AXES = dict(tp=[1, 2, 8], pp=[1, 4], cp=[1, 2], interleave=[1, 2], micro_batch=[1, 2],
                      recompute=["none", "selective", "full"], sequence_parallel=[0, 1], zero=[0, 1, 3],
                      shard_group=[0, 4], overlap_grad_reduce=[0, 1], flash_attention=[0, 1],
                      zero3_per_tensor=[0, 1], tp_comm_overlap=[0, 1])


def test_grid_matches_pure_python_reference(tmp_path):
    case = {"model": "llama2-7b", "system": "dgx-a100-80gb", "gpus": 64, "gb": 64}
    script = textwrap.dedent(f"""
        import json, numpy as np
        from trainscale.model import grid, perfmodel
        from trainscale.kernels.grid import evaluate_grid
        from trainscale.model.specs import resolve_model, resolve_system
        case = json.loads({json.dumps(json.dumps(case))})
        axes = json.loads({json.dumps(json.dumps(REFERENCE_AXES))})
        m, s = resolve_model(case["model"]), resolve_system(case["system"])
        arrays = [grid._axis(axes[n], n) for n in perfmodel.GRID_AXES]
        res, dp = evaluate_grid(perfmodel.model_vector(m), perfmodel.system_vector(s),
                                perfmodel.calibration_vector(s.generation), case["gpus"], case["gb"], *arrays)
        np.save({str(tmp_path / 'ref.npy')!r}, res)
        np.save({str(tmp_path / 'dp.npy')!r}, dp)
    """)
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = np.load(tmp_path / "ref.npy")
    jit, dp = grid_kernel(*_kernel_args(case["model"], case["system"], case["gpus"], case["gb"],
                                        **REFERENCE_AXES))
    assert ref.shape == jit.shape
    np.testing.assert_array_equal(np.load(tmp_path / "dp.npy"), dp)
    np.testing.assert_array_equal(np.isnan(ref), np.isnan(jit))
    finite = np.isfinite(jit[:, K.O_STEP])
    assert finite.sum() > 100
    np.testing.assert_allclose(jit, ref, rtol=1e-12, atol=0, equal_nan=True)


def _decorators(fn):
    return [ast.unparse(d) for d in fn.decorator_list]


def test_no_cached_kernel_calls_a_parallel_kernel():
    """Numba's cache of a function that calls a ``parallel=True`` kernel loaded from the cache in
    another process crashes the next process that loads it (kernels/__init__.py); such callers
    are plain Python or ``cache=False``."""
    folder = Path(perfmodel.__file__).parents[1] / "kernels"
    trees = {p: ast.parse(p.read_text()) for p in sorted(folder.glob("*.py"))}
    functions = {fn.name: fn for tree in trees.values() for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)}
    parallel = {name for name, fn in functions.items() if any("parallel=True" in d for d in _decorators(fn))}
    assert {"evaluate_layouts", "worker_step"} <= parallel
    offenders = []
    for name, fn in functions.items():
        if not any("cache=True" in d for d in _decorators(fn)):
            continue
        called = {c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", "")
                  for c in ast.walk(fn) if isinstance(c, ast.Call)}
        offenders += [f"{name} -> {callee}" for callee in called & parallel if callee != name]
    assert not offenders, offenders


@pytest.mark.slow
def test_cached_grid_survives_compiling_in_three_processes(tmp_path):
    """The crash this guards against: one process caches the grid kernels, a second
    compiles the dense-grid entry point against it, a third loads both."""
    script = textwrap.dedent("""
        import sys
        from trainscale.model import grid, perfmodel
        from trainscale.kernels.grid import evaluate_grid
        space = {"tp": [1, 2], "pp": [1, 2], "micro_batch": [1, 2]}
        if sys.argv[1] == "ep":
            perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 16, 64, **space)
        else:
            arrays = [grid._axis(space.get(n, [0] if n in perfmodel.BOOLEAN_AXES + ("zero", "shard_group")
                                                else ["full"] if n == "recompute" else [1]), n)
                      for n in perfmodel.GRID_AXES]
            calib = perfmodel.calibration_vector("hopper")
            m, s = perfmodel.model_vector(perfmodel.resolve_model("llama2-7b")), \\
                perfmodel.system_vector(perfmodel.resolve_system("dgx-h100"))
            results, _ = evaluate_grid(m, s, calib, 16, 64, *arrays)
            print(results.shape[0])
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    for stage in ("ep", "dense", "dense"):
        proc = subprocess.run([sys.executable, "-c", script, stage], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, (stage, proc.returncode, proc.stderr[-2000:])


# --- one Numba cache wherever the package runs (make, an activated venv, a notebook, a SLURM job) --------------

def test_the_package_decides_the_numba_cache_folder(tmp_path):
    from trainscale import kernels

    root = Path(kernels.__file__).resolve().parents[3]
    assert kernels.cache_base({}) == str(root / ".numba_cache")  # a source checkout: what `make setup` warms
    assert kernels.cache_base({"NUMBA_CACHE_DIR": "/elsewhere"}) == "/elsewhere"
    wheel = tmp_path / "site-packages" / "trainscale" / "kernels"
    wheel.mkdir(parents=True)
    assert kernels.cache_base({"XDG_CACHE_HOME": str(tmp_path)}, here=wheel) == str(tmp_path / "trainscale-numba")


def test_every_caller_shares_one_compiled_layer_and_plan():
    """predict, the heterogeneous planner, the dense grid and the search call ``layer_costs`` and ``plan_costs``
    with the same argument types (every argument given): one specialization of each, so what make setup compiles
    serves them all (a call leaving a default out is a second specialization: ~4 s a layer, ~13 s a plan on 2 cores)."""
    script = textwrap.dedent("""
        import contextlib, io
        from trainscale.interface.cli import main
        from trainscale.model import perfmodel, planner
        from trainscale.kernels.layer import layer_costs
        from trainscale.kernels.plan import plan_costs
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["predict", "examples/runs.yaml"]) == 0
            assert main(["plan", "examples/cluster.yaml", "--model", "llama2-70b", "--global-batch", "256"]) == 0
        perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 16, 64, tp=[1, 2], pp=[1, 2])
        planner.search("llama2-7b", "dgx-h100", gpus=16, global_batch=32, top=1)
        print(len(layer_costs.signatures), len(plan_costs.signatures))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1", "1"], proc.stdout


@pytest.mark.slow
def test_no_kernel_is_compiled_for_a_literal_argument(tmp_path):
    """From an empty cache (so each callee is compiled, not loaded inside its caller's cached code), the same calls
    as above leave no kernel with a ``Literal`` argument type: a constant passed from one kernel to another is
    written ``np.int64(n)``, else Numba compiles the callee and all it calls once more for that value (the dense
    grid passed ``0, 0`` for the pipeline's end layers: a second ``plan_costs``, ~13 s from an empty cache; the
    recompute-module bits compiled ``recomputes`` seven times)."""
    script = textwrap.dedent("""
        import contextlib, importlib, io, pkgutil
        from numba.core.registry import CPUDispatcher
        import trainscale.kernels as K
        from trainscale.interface.cli import main
        from trainscale.model import perfmodel, planner
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["predict", "examples/runs.yaml"]) == 0
        perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 16, 64, tp=[1, 2], pp=[1, 2])
        planner.search("llama2-7b", "dgx-h100", gpus=16, global_batch=32, top=1)
        for info in pkgutil.iter_modules(K.__path__):
            mod = importlib.import_module("trainscale.kernels." + info.name)
            for name, obj in vars(mod).items():
                if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == mod.__name__:
                    for sig in obj.signatures:
                        if "Literal" in str(sig):
                            print(mod.__name__, name, sig)
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900,
                          cwd=REPO_ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "", proc.stdout[:2000]


def test_a_new_shell_predicts_from_the_cache_make_setup_filled():
    """No NUMBA_CACHE_DIR (an activated venv): the second `trainscale predict` loads every kernel, compiles none."""
    from trainscale import kernels

    root = Path(kernels.__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["NUMBA_DEBUG_CACHE"] = "1"
    cli = [sys.executable, "-m", "trainscale.interface.cli", "predict", str(root / "examples" / "runs.yaml")]
    for _ in range(2):
        proc = subprocess.run(cli, env=env, cwd=root, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    saved = [line for line in proc.stdout.splitlines() if "[cache] data saved" in line]
    loaded = [line for line in proc.stdout.splitlines() if "[cache] data loaded" in line]
    assert not saved, saved[:3]
    assert loaded and all(str(root / ".numba_cache") in line for line in loaded), loaded[:3]
