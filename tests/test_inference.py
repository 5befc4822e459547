"""Tensor-parallel inference kernels and API (trainscale.model.inference): closed forms, hand-computed
FLOPs and bytes, the two-stream schedule's bounds, ISO invariants."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainscale.model import inference
from trainscale.kernels import inference as K
from trainscale.model.specs import SpecError

MODEL = "llama2-13b"  # h 5120, 40 heads (MHA), SwiGLU f 13824, 40 layers


def test_layer_flops_by_hand():
    # llama2-13b, tp 2, 8 tokens after 4 cached: GEMMs 2m/t (h(h + 2kv) + h^2 + 3hf), attention
    # 4 b a d / t (s c + s (s + 1) / 2) with a d = h
    h, f, t, s, c = 5120, 13824, 2, 8, 4
    gemm = 2 * s / t * (h * 3 * h + h * h + 3 * h * f)
    attention = 4 * h / t * (s * c + s * (s + 1) / 2)
    assert inference.layer_flops(MODEL, t, s, context=c) == pytest.approx(gemm + attention, rel=1e-12)
    # the causal attention of two chunks adds up to the unsplit prompt's
    whole = inference.layer_flops(MODEL, t, 100)
    split = inference.layer_flops(MODEL, t, 30) + inference.layer_flops(MODEL, t, 70, context=30)
    assert split == pytest.approx(whole, rel=1e-12)


def test_bytes_by_hand():
    # one all-reduce carries the chunk's activations: 2 bytes x tokens x hidden
    assert K.allreduce_bytes(1, 1000, 5120) == 2 * 1000 * 5120
    # weights: 2 bytes per parameter over tp GPUs; KV cache: K and V, 2 bytes, kv width, every layer
    from trainscale.model.specs import resolve_model
    m = resolve_model(MODEL)
    assert inference.weight_bytes_per_gpu(MODEL, 4) == 2 * m.params() / 4
    assert inference.kv_cache_bytes_per_gpu(MODEL, 4, 1000, batch=2) == 2 * 2 * 2 * 1000 * 5120 / 4 * 40
    # element-wise traffic of one block
    assert K.attention_elementwise_bytes(10, 5120, 5120, 2) == 10 * 10 * 5120 + 4 * 10 * 10240 / 2
    assert K.mlp_elementwise_bytes(10, 5120, 13824, 3, 2) == 10 * 10 * 5120 + 6 * 10 * 13824 / 2


def test_two_stream_schedule_by_hand():
    # serial chain a -> r -> m -> q: the sum
    comp = np.array([1.0, 2.0])
    comm = np.array([0.5, 0.25])
    assert K.two_stream_makespan(comp, comm, np.array([-1, 0]), np.array([0, 1]), 0.0) == pytest.approx(3.75)
    # two chunks: A1 A2 M1 M2 | R1 R2 Q1 Q2 (durations 1,1,1,1 | 1.5 each):
    # A1 0-1, R1 1-2.5, A2 1-2, R2 2.5-4, M1 2.5-3.5, Q1 4-5.5, M2 4-5, Q2 5.5-7
    comp = np.ones(4)
    comm = np.full(4, 1.5)
    comp_dep = np.array([-1, -1, 0, 1])
    comm_dep = np.array([0, 1, 2, 3])
    assert K.two_stream_makespan(comp, comm, comp_dep, comm_dep, 0.0) == pytest.approx(7.0)
    # a cycle is reported, not looped over
    assert math.isnan(K.two_stream_makespan(np.ones(1), np.ones(1), np.array([0]), np.array([0]), 0.0))


def test_slowdown_stretches_overlapped_compute():
    # compute 2 s alongside a 1 s collective at rate 1/2: 1 s of collective covers 0.5 s of work
    comp, comm = np.array([2.0]), np.array([1.0])
    none = np.array([-1])
    assert K.two_stream_makespan(comp, comm, none, none, 0.0) == pytest.approx(2.0)
    assert K.two_stream_makespan(comp, comm, none, none, 1.0) == pytest.approx(2.5)


@pytest.mark.parametrize("system", ["rtx4090-pcie", "a800-pcie", "dgx-a100-80gb"])
def test_split_ratio_zero_or_one_is_serial(system):
    serial = inference.prefill(MODEL, system, 4, 1000, 0.0)
    assert serial.first_chunk_tokens == 0 and serial.savings == 0.0
    full = inference.prefill(MODEL, system, 4, 1000, 1.0)
    assert full.time_s == serial.time_s
    # serial = compute + communication exactly
    assert serial.time_s == pytest.approx(serial.compute_s + serial.comm_s, rel=1e-12)
    # and a tiny ratio that rounds to no tokens too
    assert inference.prefill(MODEL, system, 4, 1000, 0.0004).time_s == serial.time_s


def test_without_communication_iso_saves_nothing():
    # tp = 1: no all-reduce; the split execution is its chunks' compute back to back
    for ratio in (0.3, 0.5, 0.7):
        p = inference.prefill(MODEL, "dgx-a100-80gb", 1, 2048, ratio)
        assert p.comm_s == 0.0
        assert p.time_s == pytest.approx(p.compute_s, rel=1e-12)
        assert p.savings <= 1e-12  # smaller GEMMs and more launches: never faster


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([2, 4, 8]), s=st.integers(16, 4096), ratio=st.floats(0.0, 1.0),
       system=st.sampled_from(["rtx4090-pcie", "a800-pcie", "dgx-a100-80gb"]))
def test_iso_bounds(tp, s, ratio, system):
    serial = inference.prefill(MODEL, system, tp, s, 0.0)
    p = inference.prefill(MODEL, system, tp, s, ratio)
    # overlap hides at most the smaller of the split execution's compute and communication
    assert p.time_s >= max(p.compute_s, p.comm_s) * (1 - 1e-12)
    assert p.time_s <= (p.compute_s + p.comm_s) * (1 + 1e-12)
    # against serial: at most min(compute, comm), plus whatever splitting itself sped up
    saved = serial.time_s - p.time_s
    assert saved <= min(serial.compute_s, serial.comm_s) + max(0.0, serial.compute_s - p.compute_s) + 1e-12
    assert p.flops_per_gpu == pytest.approx(serial.flops_per_gpu, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(bw=st.floats(1.0, 500.0), factor=st.floats(1.0, 10.0), ratio=st.floats(0.0, 1.0),
       s=st.integers(64, 4096), tp=st.sampled_from([2, 8]))
def test_more_link_bandwidth_is_never_slower(bw, factor, ratio, s, tp):
    slow = {"name": "rtx4090-pcie", "scale_up_GBps_per_gpu": bw}
    fast = {"name": "rtx4090-pcie", "scale_up_GBps_per_gpu": bw * factor}
    a = inference.prefill(MODEL, slow, tp, s, ratio)
    b = inference.prefill(MODEL, fast, tp, s, ratio)
    assert b.time_s <= a.time_s * (1 + 1e-12)
    assert b.serial_time_s <= a.serial_time_s * (1 + 1e-12)
    assert inference.decode(MODEL, fast, tp, s).time_s <= inference.decode(MODEL, slow, tp, s).time_s * (1 + 1e-12)


def test_overlap_slowdown_never_helps():
    # compute-bound (a800-pcie, tp 2): the slowed compute is on the critical path
    base = inference.prefill(MODEL, "a800-pcie", 2, 4096, 0.5)
    slowed = inference.prefill(MODEL, "a800-pcie", 2, 4096, 0.5, overlap_slowdown=0.2)
    assert slowed.time_s > base.time_s
    assert slowed.serial_time_s == base.serial_time_s  # nothing overlaps in the serial execution


def test_iso_pays_on_pcie_not_nvlink():
    pcie = min(inference.prefill("llama2-70b", "rtx4090-pcie", 8, 2048, r).time_s for r in np.linspace(0, 1, 21))
    nvl = min(inference.prefill("llama2-70b", "dgx-a100-80gb", 8, 2048, r).time_s for r in np.linspace(0, 1, 21))
    pcie_serial = inference.prefill("llama2-70b", "rtx4090-pcie", 8, 2048).time_s
    nvl_serial = inference.prefill("llama2-70b", "dgx-a100-80gb", 8, 2048).time_s
    assert 1 - pcie / pcie_serial > 0.15 > 1 - nvl / nvl_serial


def test_decode_is_bound_by_weights_and_latency():
    d = inference.decode("llama2-70b", "dgx-a100-80gb", 8, 1024)
    weights = inference.weight_bytes_per_gpu("llama2-70b", 8)
    # at least the time to stream the layer weights once at the achievable HBM bandwidth
    assert d.compute_s >= 0.85 * weights * 0.95 / (0.85 * 2039e9) * 0.85
    assert d.time_s == pytest.approx(d.compute_s + d.comm_s, rel=1e-12)
    # the all-reduces of 2 b h bytes are latency-bound: at least 2 (n - 1) alpha each, 2 per layer
    assert d.comm_s >= 80 * 2 * 2 * 7 * 2e-6 * 0.99


def test_grid_matches_single_calls():
    g = inference.prefill_grid(MODEL, "a800-pcie", [2, 4], [256, 1000], [0.0, 0.4])
    p = inference.prefill(MODEL, "a800-pcie", 4, 1000, 0.4)
    assert g[1, 1, 1, K.P_TIME] == p.time_s
    assert g[0, 0, 0, K.P_TIME] == inference.prefill(MODEL, "a800-pcie", 2, 256).time_s


def test_errors_name_the_field():
    with pytest.raises(SpecError) as err:
        inference.prefill(MODEL, "a800-pcie", 3, 1000)
    assert err.value.field == "tp"
    with pytest.raises(SpecError) as err:
        inference.prefill(MODEL, "a800-pcie", 2, 1000, split_ratio=1.5)
    assert err.value.field == "split_ratio"
    with pytest.raises(SpecError) as err:
        inference.prefill(MODEL, "a800-pcie", 2, 0)
    assert err.value.field == "prompt_tokens"
    with pytest.raises(SpecError) as err:
        inference.prefill_grid(MODEL, "a800-pcie", [], [10], [0.0])
    assert err.value.field == "tps"
