"""Mixture of experts (expert parallelism, all-to-all) and scale-out topology (fat-tree vs flat)."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainscale.model import perfmodel

from trainscale.model import planner
from trainscale.kernels import collectives as C
from trainscale.kernels import layout as K
from trainscale.kernels.layer import layer_costs
from trainscale.model.specs import ModelSpec, RunSpec, SpecError, SystemSpec, resolve_model

BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA = 450e9, 2e-6, 50e9, 5e-6, 0.8

# a small made-up MoE: 2 layers, h = 64, 4 heads, GeLU FFN 256 wide, 4 experts, top-2
TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, ffn_type="gelu", vocab=100, seq_len=16,
            experts=4, top_k=2, capacity_factor=1.0)


def tiny(**kw):
    return ModelSpec.from_dict({**TINY, **kw}, name="tiny-moe")


# --------------------------------------------------------------------------- all-to-all
def test_alltoall_inside_the_domain_by_hand():
    S = 64e6
    got = C.alltoall_time(S, 8, 1, 8, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA)
    assert got == pytest.approx(7 * LAT_UP + 7 / 8 * S / (ETA * BW_UP), rel=1e-14)
    assert C.alltoall_time(S, 1, 1, 8, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA) == 0.0


def test_alltoall_across_domains_by_hand():
    # 16 ranks in two domains of 8: 7 peers over NVLink, 8 through the NIC, at the same time
    S = 64e6
    got = C.alltoall_time(S, 16, 1, 8, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA)
    inside = 7 / 16 * S / (ETA * BW_UP)
    outside = 8 / 16 * S / (ETA * BW_OUT)
    assert outside > inside
    assert got == pytest.approx(7 * LAT_UP + 8 * LAT_OUT + outside, rel=1e-14)
    # stride 8 (one member per domain): every peer through the NIC
    got = C.alltoall_time(S, 4, 8, 8, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA)
    assert got == pytest.approx(3 * LAT_OUT + 3 / 4 * S / (ETA * BW_OUT), rel=1e-14)


def test_alltoall_volume_in_the_layer_costs():
    """ep = 4 ranks 8 apart (tp = etp = 8) on 8-GPU domains: the a2a per pass moves c k m h / tp values, and
    the received copies are all-gathered over the 8 expert-tensor-parallel ranks (NVLink) before the experts
    (Megatron-Core's alltoall dispatcher; reduce-scattered after them)."""
    model = resolve_model("moe-1.8t")
    system = SystemSpec.from_catalog("dgx-h100")
    mvec, svec = perfmodel.model_vector(model), perfmodel.system_vector(system)
    calib = perfmodel.calibration_vector(system.generation)
    lc = np.empty(K.L_SIZE)
    tp, ep, mb = 8, 4, 1
    layer_costs(mvec, svec, calib, tp, 1, mb, K.RC_NONE, True, True, lc, ep, False, 0)
    m = mb * model.seq_len
    nbytes = 2.0 * model.capacity_factor * model.top_k * m * model.hidden / tp
    a2a = 3 * system.scale_out_latency_s + 3 / 4 * nbytes / (calib[K.C_NET_EFF] * system.scale_out_GBps_per_gpu * 1e9)
    gather = 7 * system.scale_up_latency_s + 7 / 8 * 8 * nbytes / (calib[K.C_NET_EFF] * system.scale_up_GBps_per_gpu * 1e9)
    assert lc[K.L_FWD_EP] == pytest.approx(2 * (a2a + gather), rel=1e-12)  # dispatch + combine
    assert lc[K.L_BWD_EP] == pytest.approx(2 * (a2a + gather), rel=1e-12)
    layer_costs(mvec, svec, calib, tp, 1, mb, K.RC_FULL, True, True, lc, ep, False, 0)
    assert lc[K.L_BWD_EP] == pytest.approx(4 * (a2a + gather), rel=1e-12)  # plus the recomputed forward's
    layer_costs(mvec, svec, calib, tp, 1, mb, K.RC_NONE, True, True, lc, 1, False, 0)
    assert lc[K.L_FWD_EP] == pytest.approx(2 * gather, rel=1e-12)  # all experts local: no all-to-all
    layer_costs(mvec, svec, calib, tp, 1, mb, K.RC_NONE, True, True, lc, 1, False, 1)
    assert lc[K.L_FWD_EP] == 0.0 and lc[K.L_BWD_EP] == 0.0  # and with etp = 1 nothing to gather either


# --------------------------------------------------------------------------- topology
def test_tier_link_leaf_and_spine():
    # leaf of 64 GPUs, 4:1 oversubscribed, 0.5 us per hop
    bw, lat = C.tier_link(8, 8, BW_OUT, LAT_OUT, 64, 4.0, 0.5e-6)  # spans 64: stays in the leaf
    assert bw == BW_OUT and lat == pytest.approx(LAT_OUT + 2 * 0.5e-6, rel=1e-15)
    bw, lat = C.tier_link(16, 8, BW_OUT, LAT_OUT, 64, 4.0, 0.5e-6)  # spans 128: crosses the spine
    assert bw == BW_OUT / 4 and lat == pytest.approx(LAT_OUT + 4 * 0.5e-6, rel=1e-15)
    assert C.tier_link(4096, 1, BW_OUT, LAT_OUT, 0, 4.0, 0.0) == (BW_OUT, LAT_OUT)  # flat: unchanged


def test_collective_crossing_the_spine_slows_by_the_ratio():
    """Bandwidth-bound all-gather across 16 domains of 8: 2:1 oversubscription doubles its time when
    the group leaves the leaf, and leaves it alone when the group fits under one leaf."""
    S, r = 4e9, 2.0
    flat = C.allgather_time(S, 128, 1, 8, BW_UP, 0.0, BW_OUT, 0.0, ETA)
    bw, lat = C.tier_link(128, 1, BW_OUT, 0.0, 64, r, 0.0)
    spine = C.allgather_time(S, 128, 1, 8, BW_UP, 0.0, bw, lat, ETA)
    assert spine / flat == pytest.approx(r, rel=1e-12)
    bw, lat = C.tier_link(64, 1, BW_OUT, 0.0, 64, r, 0.0)
    leaf = C.allgather_time(S, 64, 1, 8, BW_UP, 0.0, bw, lat, ETA)
    assert leaf == C.allgather_time(S, 64, 1, 8, BW_UP, 0.0, BW_OUT, 0.0, ETA)


def _predict(model, system, gpus, **plan):
    plan = {"global_batch": 64, "micro_batch": 1, "recompute": "selective", "flash_attention": True, **plan}
    return perfmodel.predict(RunSpec.from_dict({"model": model, "system": system, "gpus": gpus, "plan": plan}))


def test_fat_tree_slows_data_parallel_traffic_not_tensor_parallel():
    flat = _predict("llama2-7b", "dgx-h100", 128, tp=8)
    tree = _predict("llama2-7b", {"name": "dgx-h100", "scale_out_leaf_gpus": 32,
                                  "scale_out_oversubscription": 4.0}, 128, tp=8)
    assert tree.breakdown["tp_comm"] == flat.breakdown["tp_comm"]
    assert tree.breakdown["compute"] == flat.breakdown["compute"]
    assert tree.breakdown["dp_comm"] > 2.0 * flat.breakdown["dp_comm"]
    # a leaf as large as the job: nothing crosses the spine
    big_leaf = _predict("llama2-7b", {"name": "dgx-h100", "scale_out_leaf_gpus": 128,
                                      "scale_out_oversubscription": 4.0}, 128, tp=8)
    assert big_leaf.step_time_s == flat.step_time_s


def test_hop_latency_adds_two_or_four_hops():
    sys0 = SystemSpec.from_catalog("dgx-h100")
    vec = perfmodel.system_vector(SystemSpec.from_catalog("dgx-h100", {"scale_out_leaf_gpus": 16,
                                                                        "scale_out_hop_latency_s": 1e-6}))
    from trainscale.kernels.collectives import out_link
    assert out_link(vec, 2, 8)[1] == pytest.approx(sys0.scale_out_latency_s + 2e-6, rel=1e-14)
    assert out_link(vec, 4, 8)[1] == pytest.approx(sys0.scale_out_latency_s + 4e-6, rel=1e-14)


# --------------------------------------------------------------------------- MoE counts
def test_moe_parameter_count_by_hand():
    m = tiny()
    h, f, E = 64, 256, 4
    attention = 4 * h * h + 3 * h + h  # QKV + projection, with biases
    norms = 4 * h
    router = h * E
    expert = 2 * h * f + f + h  # two matrices with biases
    assert m.expert_params_per_layer() == E * expert == 132352
    assert m.shared_params_per_layer() == attention + norms + router == 17152
    total = 2 * (17152 + 132352) + 2 * 100 * h + 16 * h + 2 * h
    assert m.params() == total == 312960
    assert m.active_params() == total - 2 * (E - 2) * expert
    dense = tiny(experts=1, top_k=1)
    assert dense.params() == 2 * (attention + norms + expert) + 2 * 100 * h + 16 * h + 2 * h


def test_moe_flops_by_hand():
    m = tiny()
    system = SystemSpec.from_catalog("dgx-h100")
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(m), perfmodel.system_vector(system),
                perfmodel.calibration_vector(system.generation), 1, 1, 3, K.RC_NONE, False, False, lc, 1, False, 0)
    b, s, h, f, E, k = 3, 16, 64, 256, 4, 2
    T = b * s
    flops = 2 * T * h * 3 * h + 2 * T * h * h + k * (2 * 2 * T * h * f) + 2 * T * h * E + 4 * b * s * s * h
    assert lc[K.L_FLOPS_FWD] == pytest.approx(flops, rel=1e-14)
    # top-1 of the same experts: the FFN FLOPs halve
    layer_costs(perfmodel.model_vector(tiny(top_k=1)), perfmodel.system_vector(system),
                perfmodel.calibration_vector(system.generation), 1, 1, 3, K.RC_NONE, False, False, lc, 1, False, 0)
    assert lc[K.L_FLOPS_FWD] == pytest.approx(flops - 2 * 2 * T * h * f, rel=1e-14)


def test_moe_catalog_shape_is_gpt4_like():
    m = resolve_model("moe-1.8t")
    assert m.experts == 16 and m.top_k == 2 and m.layers == 120
    assert 1.8e12 < m.params() < 1.9e12
    assert m.layers * m.shared_params_per_layer() == pytest.approx(55.5e9, rel=0.01)
    assert m.layers * m.expert_params_per_layer() / m.experts == pytest.approx(111e9, rel=0.01)


# --------------------------------------------------------------------------- memory, grid, invariants
def test_memory_per_gpu_falls_with_ep():
    mems = [_predict("moe-1.8t", "gb200-nvl72", 2048, tp=8, pp=16, ep=ep, zero=1,
                     sequence_parallel=True).memory_gib_per_gpu for ep in (1, 2, 4, 8, 16)]
    assert all(a > b for a, b in zip(mems, mems[1:])), mems


def test_ep_inside_the_domain_is_cheaper_than_across():
    """ep = 8 with tp = 8 spans 64 GPUs: inside an NVL72 domain, across the network on 8-GPU nodes."""
    small = _predict("moe-1.8t", {"name": "gb200-nvl72", "scale_up_domain": 8}, 2048, tp=8, pp=16, ep=8, zero=1,
                     sequence_parallel=True)
    rack = _predict("moe-1.8t", "gb200-nvl72", 2048, tp=8, pp=16, ep=8, zero=1, sequence_parallel=True)
    # the all-gather / reduce-scatter over the 8 expert-tensor-parallel ranks is inside NVLink in both: what
    # ep = 1 leaves of ep_comm; the all-to-all is what the domain changes
    gather = _predict("moe-1.8t", "gb200-nvl72", 2048, tp=8, pp=16, ep=1, zero=1,
                      sequence_parallel=True).breakdown["ep_comm"]
    assert 0.0 < gather < rack.breakdown["ep_comm"]
    assert rack.breakdown["ep_comm"] - gather < (small.breakdown["ep_comm"] - gather) / 5
    assert rack.breakdown["compute"] == pytest.approx(small.breakdown["compute"], rel=1e-9)
    assert rack.mfu > small.mfu


def test_grid_with_ep_equals_scalar_predict():
    model = resolve_model("moe-1.8t")
    system = SystemSpec.from_catalog("gb200-nvl72", {"scale_out_leaf_gpus": 256, "scale_out_oversubscription": 2.0})
    ds = perfmodel.evaluate_grid(model, system, 2048, 256, tp=[4, 8], pp=[8, 16], zero=[1], sequence_parallel=[1],
                                 recompute=["selective", "full"], flash_attention=[1], ep=[1, 2, 8, 16, 32])
    assert perfmodel.grid_axes(ds)[-1] == "ep" and "time_ep_comm_s" in ds
    step = ds["step_time_s"]
    checked = 0
    for idx in np.ndindex(step.shape):
        entry = {name: ds[name].values[i].item() for name, i in zip(perfmodel.grid_axes(ds), idx)}
        if entry["ep"] == 32:  # 32 does not divide 16 experts
            assert int(ds["reason"].values[idx]) == K.R_EP and not np.isfinite(step.values[idx])
            continue
        entry["dp"] = int(ds["dp"].values[idx])
        p = perfmodel.predict(RunSpec(id="g", model=model, system=system,
                                      plan=perfmodel.plan_from_grid_entry(entry, 256)), pipeline_simulation=False)
        assert p.step_time_s == pytest.approx(float(step.values[idx]), rel=1e-12)
        assert p.memory_gib_per_gpu == pytest.approx(float(ds["memory_gib_per_gpu"].values[idx]), rel=1e-12)
        assert p.breakdown["ep_comm"] == pytest.approx(float(ds["time_ep_comm_s"].values[idx]), rel=1e-12)
        assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s, rel=1e-9)
        checked += 1
    assert checked == 32


def test_search_finds_an_expert_parallel_plan():
    space = dict(tp=[8], pp=[8, 16], zero=[1], sequence_parallel=[1], recompute=["selective"], flash_attention=[1],
                 micro_batch=[1], ep=[1, 4, 16])
    system = {"name": "gb200-nvl72", "hbm_capacity_GiB": 96.0}
    grid = perfmodel.evaluate_grid("moe-1.8t", system, 2048, 256, **{**space, "ep": [1]})
    assert not grid["fits"].any()  # 1.8T of experts do not fit in 96 GiB without ep
    summary, ranked = planner.search("moe-1.8t", system, 2048, 256, top=3, space=space, rerank=3)
    assert summary.attrs["plans_feasible"] > 0
    assert ranked and ranked[0]["plan"]["ep"] > 1


@settings(max_examples=40, deadline=None)
@given(nbytes=st.floats(1e3, 1e10), n=st.integers(2, 64), stride=st.sampled_from([1, 2, 8]),
       up=st.floats(1.0, 4.0), out=st.floats(1.0, 4.0))
def test_more_bandwidth_is_never_slower_alltoall(nbytes, n, stride, up, out):
    slow = C.alltoall_time(nbytes, n, stride, 8, BW_UP, LAT_UP, BW_OUT, LAT_OUT, ETA)
    assert C.alltoall_time(nbytes, n, stride, 8, BW_UP * up, LAT_UP, BW_OUT, LAT_OUT, ETA) <= slow
    assert C.alltoall_time(nbytes, n, stride, 8, BW_UP, LAT_UP, BW_OUT * out, LAT_OUT, ETA) <= slow


@settings(max_examples=12, deadline=None)
@given(factor=st.floats(1.0, 8.0), oversub=st.floats(1.0, 8.0), ep=st.sampled_from([2, 4, 16]))
def test_more_bandwidth_is_never_slower_moe_step(factor, oversub, ep):
    base = {"name": "gb200-nvl72", "scale_up_domain": 8, "scale_out_leaf_gpus": 64,
            "scale_out_oversubscription": oversub}
    faster = dict(base, scale_out_GBps_per_gpu=50.0 * factor, scale_up_GBps_per_gpu=900.0 * factor)
    kw = dict(tp=4, pp=8, ep=ep, zero=1, sequence_parallel=True)
    slow = _predict("moe-1.8t", base, 1024, **kw)
    fast = _predict("moe-1.8t", faster, 1024, **kw)
    assert fast.step_time_s <= slow.step_time_s * (1 + 1e-12)
    flat = _predict("moe-1.8t", dict(base, scale_out_leaf_gpus=0), 1024, **kw)
    assert flat.step_time_s <= slow.step_time_s * (1 + 1e-12)  # a flat network is never slower


# --------------------------------------------------------------------------- dense unchanged, errors
RUNS = [
    ("gpt3-175b", "dgx-a100-80gb", 1024, dict(tp=8, pp=16, interleave=2, global_batch=1536, micro_batch=1)),
    ("llama2-70b", "dgx-h100", 256, dict(tp=8, pp=4, global_batch=256, micro_batch=1, sequence_parallel=True,
                                         zero=1)),
    ("llama2-7b", "dgx-h100", 64, dict(tp=1, global_batch=128, zero=3, overlap_grad_reduce=True, stack="fsdp")),
]


@pytest.mark.parametrize("model, system, gpus, plan", RUNS)
def test_dense_model_unchanged_by_the_new_fields(model, system, gpus, plan):
    plain = perfmodel.predict(RunSpec.from_dict({"model": model, "system": system, "gpus": gpus, "plan": plan}))
    explicit_model = {**resolve_model(model).__dict__, "experts": 1, "top_k": 1, "capacity_factor": 1.0}
    explicit_model.pop("name")
    explicit = perfmodel.predict(RunSpec.from_dict({
        "model": explicit_model,
        "system": {"name": system, "scale_out_leaf_gpus": 0, "scale_out_oversubscription": 1.0,
                   "scale_out_hop_latency_s": 0.0},
        "gpus": gpus, "plan": {**plan, "ep": 1}}))
    assert explicit.as_dict() | {"id": plain.id} == plain.as_dict()
    assert "ep_comm" not in plain.breakdown
    # a non-blocking two-tier fat-tree without hop latency prices exactly like the flat network
    tree = perfmodel.predict(RunSpec.from_dict({
        "model": model, "system": {"name": system, "scale_out_leaf_gpus": 32}, "gpus": gpus, "plan": plan}))
    assert tree.step_time_s == plain.step_time_s


def test_dense_grid_has_no_ep_dimension_and_rejects_ep():
    ds = perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 64, 128, tp=[8], ep=[1, 2])
    assert int(ds["reason"].sel(ep=2).item()) == K.R_EP
    assert "ep" not in perfmodel.evaluate_grid("llama2-7b", "dgx-h100", 64, 128, tp=[8]).dims


@pytest.mark.parametrize("make, field", [
    (lambda: tiny(top_k=5), "top_k"),
    (lambda: tiny(capacity_factor=0.5), "capacity_factor"),
    (lambda: RunSpec.from_dict({"model": "moe-1.8t", "system": "gb200-nvl72", "gpus": 768,
                                "plan": {"tp": 8, "pp": 8, "ep": 12, "global_batch": 96}}), "plan.ep"),
    (lambda: RunSpec.from_dict({"model": "moe-1.8t", "system": "gb200-nvl72", "gpus": 512,
                                "plan": {"tp": 8, "pp": 16, "ep": 8, "global_batch": 64}}), "plan.ep"),
    (lambda: RunSpec.from_dict({"model": "gpt3-175b", "system": "gb200-nvl72", "gpus": 512,
                                "plan": {"tp": 8, "pp": 16, "ep": 2, "global_batch": 64}}), "plan.ep"),
    (lambda: SystemSpec.from_catalog("dgx-h100", {"scale_out_oversubscription": 0.5}), "scale_out_oversubscription"),
    (lambda: SystemSpec.from_catalog("dgx-h100", {"scale_out_leaf_gpus": 12}), "scale_out_leaf_gpus"),
])
def test_bad_moe_and_topology_input_names_the_field(make, field):
    with pytest.raises(SpecError) as err:
        make()
    assert err.value.field == field
