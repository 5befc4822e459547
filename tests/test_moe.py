"""Mixture-of-experts pricing (issue 36): token dispatch and combine, router and permutation, load
imbalance, and the Megatron-Bridge MoE rows as a held-out regression guard (nothing here is fitted to them)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainscale.model import perfmodel, validation
from conftest import grid_predictions
from trainscale.kernels import layout as K
from trainscale.kernels.collectives import BYTES
from trainscale.kernels.layer import layer_costs
from trainscale.kernels.moe import ROUTER_SCORE_BYTES, moe_dispatch_time, moe_permute_time
from trainscale.model.specs import ModelSpec, RunSpec, SpecError, SystemSpec, resolve_model

# a small MoE of Qwen3-30B-A3B's proportions: 4 layers, h = 1024, 16 heads, SwiGLU experts 512 wide, 32 experts, top-4
SHAPE = dict(layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=512, ffn_type="swiglu", vocab=1000,
             seq_len=2048, experts=32, top_k=4, capacity_factor=1.0)
H100 = SystemSpec.from_catalog("dgx-h100")  # 8-GPU NVLink domains, one flat scale-out tier


def _model(**kw):
    return ModelSpec.from_dict({**SHAPE, **kw}, name="small-moe")


def _costs(model, tp=1, ep=1, mb=1, rc=K.RC_NONE, etp=0, imbalance=1.0, system=H100, sp=True):
    calib = perfmodel.calibration_vector(system.generation)
    calib[K.C_MOE_IMBALANCE] = imbalance
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(model), perfmodel.system_vector(system), calib, tp, 1, mb, rc, sp, True,
                lc, ep, False, etp)
    return lc, calib


def _run(gpus=16, **plan):
    plan = {"global_batch": 64, "micro_batch": 1, "recompute": "none", "flash_attention": True, "stack": "megatron",
            **plan}
    return RunSpec.from_dict({"id": "moe", "model": dict(SHAPE), "system": "dgx-h100", "gpus": gpus, "plan": plan})


# --------------------------------------------------------------------------- dispatch by hand
def test_dispatch_across_two_nodes_by_hand():
    """ep = 16, tp = etp = 1 on 8-GPU nodes: each GPU sends its c k m copies of h 16-bit values; 7 of the 16
    shares go over NVLink, 8 through the NIC (the slower: it sets the time), one latency per peer. Two
    all-to-alls a pass (dispatch, combine), forward and backward; nothing to gather with etp = 1."""
    model = _model()
    lc, calib = _costs(model, tp=1, ep=16)
    m = model.seq_len
    S = BYTES * 1.0 * 4 * m * 1024  # c k m h x 2 bytes = 16.8 MB
    eta = calib[K.C_NET_EFF]
    outside = 8 / 16 * S / (eta * 50e9)
    inside = 7 / 16 * S / (eta * 450e9)
    assert outside > inside
    a2a = 7 * 2e-6 + 8 * 5e-6 + outside
    assert lc[K.L_FWD_EP] == pytest.approx(2 * a2a, rel=1e-12)
    assert lc[K.L_BWD_EP] == pytest.approx(2 * a2a, rel=1e-12)
    lc_full, _ = _costs(model, tp=1, ep=16, rc=K.RC_FULL)
    assert lc_full[K.L_BWD_EP] == pytest.approx(4 * a2a, rel=1e-12)  # the recomputed forward dispatches again
    # inside one node (ep = 8): NVLink only
    lc8, _ = _costs(model, tp=1, ep=8)
    assert lc8[K.L_FWD_EP] == pytest.approx(2 * (7 * 2e-6 + 7 / 8 * S / (eta * 450e9)), rel=1e-12)


def test_dispatch_with_expert_tensor_parallelism_by_hand():
    """tp = 2, etp = 1, ep = 16 (Megatron-Core folds the expert group over tp x dp, etp innermost): the ep ranks
    are adjacent (stride etp = 1), each GPU sends the copies of its m / 2 sequence-parallel tokens; with etp = 2
    the ep ranks are 2 apart and the received copies are all-gathered over the 2 etp ranks (NVLink)."""
    model = _model()
    lc, calib = _costs(model, tp=2, ep=16, etp=1)
    eta = calib[K.C_NET_EFF]
    S = BYTES * 4 * model.seq_len * 1024 / 2
    a2a = 7 * 2e-6 + 8 * 5e-6 + 8 / 16 * S / (eta * 50e9)
    assert lc[K.L_FWD_EP] == pytest.approx(2 * a2a, rel=1e-12)
    lc2, _ = _costs(model, tp=2, ep=8, etp=2)  # 8 ranks 2 apart: 4 per node, 2 nodes
    a2a = 3 * 2e-6 + 4 * 5e-6 + 4 / 8 * S / (eta * 50e9)
    gather = 1 * 2e-6 + 1 / 2 * 2 * S / (eta * 450e9)
    assert lc2[K.L_FWD_EP] == pytest.approx(2 * (a2a + gather), rel=1e-12)


def test_permutation_by_hand():
    """Router top-k over m E fp32 scores, permute (read and write r rows), un-permute (r + m rows), and the sort
    of the received copies by local expert (4 r rows) when a rank holds more than one expert."""
    model = _model()
    calib = perfmodel.calibration_vector("hopper")
    m, h, r, E = 2048.0, 1024.0, 4 * 2048.0, 32
    hbm = H100.hbm_bandwidth_GBps * 1e9
    rate = calib[K.C_HBM_EFF] * hbm
    fwd, bwd = moe_permute_time(r, m, h, E, 4, 1.0, 1, 1.0, hbm, calib)
    assert fwd == pytest.approx((2 * h * (3 * r + m + 4 * r) + ROUTER_SCORE_BYTES[0] * m * E) / rate
                                + 5 * calib[K.C_KERNEL_S], rel=1e-12)
    assert bwd == pytest.approx((2 * h * (3 * r + m + 4 * r + r) + ROUTER_SCORE_BYTES[1] * m * E) / rate
                                + 5 * calib[K.C_KERNEL_S], rel=1e-12)
    one, _ = moe_permute_time(r, m, h, E, 1, 1.0, 1, 1.0, hbm, calib)  # one expert a rank: no sort
    assert one == pytest.approx((2 * h * (3 * r + m) + ROUTER_SCORE_BYTES[0] * m * E) / rate
                                + 3 * calib[K.C_KERNEL_S], rel=1e-12)
    lc, _ = _costs(model, ep=8)  # 4 experts a rank
    assert lc[K.L_FWD_MOE] == pytest.approx(fwd, rel=1e-12) and lc[K.L_BWD_MOE] == pytest.approx(bwd, rel=1e-12)
    full, _ = _costs(model, ep=8, rc=K.RC_FULL)
    assert full[K.L_BWD_MOE] == pytest.approx(bwd + fwd, rel=1e-12)  # the recomputed forward permutes again


# --------------------------------------------------------------------------- the breakdown
def test_moe_terms_in_the_breakdown_add_up_to_the_step():
    for plan in (dict(ep=16), dict(ep=8, pp=2, interleave=1)):
        gpus = 16
        p = perfmodel.predict(_run(gpus, **plan))
        assert p.breakdown["ep_comm"] > 0 and p.breakdown["moe_permute"] > 0
        assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s, rel=1e-9)
    p = perfmodel.predict(_run(8, ep=1))
    assert p.breakdown["ep_comm"] == 0.0 and p.breakdown["moe_permute"] > 0  # EP = 1: no all-to-all
    times = perfmodel.layer_times(_model(), "dgx-h100", _run(16, ep=16).plan)
    assert times["fwd_ep_comm_s"] > 0 and times["fwd_moe_permute_s"] > 0


def test_dense_models_have_no_moe_terms_and_ignore_the_imbalance():
    """A dense layer's costs are bit-identical whatever the imbalance slot holds, its MoE slots are 0, and its
    breakdown names no MoE term (the dense predictions were checked bit-identical against the code before the
    MoE terms, all 151 dense validation rows)."""
    dense = resolve_model("llama3-8b")
    a, _ = _costs(dense, tp=2)
    b, _ = _costs(dense, tp=2, imbalance=3.0)
    assert np.array_equal(a, b)
    assert a[K.L_FWD_MOE] == a[K.L_BWD_MOE] == a[K.L_FWD_EP] == a[K.L_BWD_EP] == 0.0
    run = RunSpec.from_dict({"model": "llama3-8b", "system": "dgx-h100", "gpus": 16,
                             "plan": {"tp": 2, "pp": 2, "global_batch": 32}})
    p = perfmodel.predict(run)
    assert not set(K.MOE_BREAKDOWN) & set(p.breakdown)
    skewed = perfmodel.predict(dataclasses.replace(run, plan=dataclasses.replace(run.plan, moe_imbalance=2.0)))
    assert skewed.as_dict() == p.as_dict()


def test_grid_prices_the_moe_terms_as_predict_does():
    space = dict(tp=[1, 2], pp=[1, 2], micro_batch=[1, 2], recompute=["none", "full"], sequence_parallel=[1],
                 flash_attention=[1], ep=[1, 4, 8])
    ds = perfmodel.evaluate_grid(_model(), "dgx-h100", 16, 64, stack="megatron", **space)
    assert "time_moe_permute_s" in ds and "time_ep_comm_s" in ds
    checked = 0
    for idx, p in grid_predictions(ds, _model(), H100, 64):
        assert p.step_time_s == pytest.approx(float(ds["step_time_s"].values[idx]), rel=1e-12)
        for name in K.MOE_BREAKDOWN:
            assert p.breakdown[name] == pytest.approx(float(ds[f"time_{name}_s"].values[idx]), rel=1e-12, abs=0)
        checked += 1
    assert checked > 20


# --------------------------------------------------------------------------- invariants
@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 7), tokens=st.sampled_from([512, 1024, 4096]), ep=st.sampled_from([2, 4, 8, 16, 32]),
       tp=st.sampled_from([1, 2, 4]), etp=st.sampled_from([0, 1]))
def test_dispatch_grows_with_top_k_and_tokens(k, tokens, ep, tp, etp):
    svec, calib = perfmodel.system_vector(H100), perfmodel.calibration_vector("hopper")
    et = etp or tp
    base = moe_dispatch_time(svec, calib, float(k * tokens), 1024.0, float(tp), et, ep, 1.0)
    assert base > 0.0
    assert moe_dispatch_time(svec, calib, float((k + 1) * tokens), 1024.0, float(tp), et, ep, 1.0) > base
    assert moe_dispatch_time(svec, calib, float(2 * k * tokens), 1024.0, float(tp), et, ep, 1.0) > base
    # EP = 1 with etp = 1: every expert is local, no all-to-all and nothing to gather
    assert moe_dispatch_time(svec, calib, float(k * tokens), 1024.0, float(tp), 1, 1, 1.0) == 0.0


@settings(max_examples=12, deadline=None)
@given(imbalance=st.floats(1.0, 4.0), ep=st.sampled_from([1, 4, 16]))
def test_imbalance_sweep_only_slows(imbalance, ep):
    """The load-imbalance knob (not fitted; 1 by default) never speeds a step up and scales the busiest rank's
    dispatch bytes and expert GEMM rows."""
    run = _run(16, ep=ep)
    balanced = perfmodel.predict(run)
    skewed = perfmodel.predict(dataclasses.replace(run, plan=dataclasses.replace(run.plan, moe_imbalance=imbalance)))
    assert skewed.step_time_s >= balanced.step_time_s * (1 - 1e-12)
    # within rounding: the busiest rank's share can reach the same bound by two orders of operations (1 ulp apart)
    assert skewed.breakdown["ep_comm"] >= balanced.breakdown["ep_comm"] * (1 - 1e-12)
    assert skewed.memory_gib_per_gpu >= balanced.memory_gib_per_gpu
    lc1, _ = _costs(_model(), ep=ep)
    lci, _ = _costs(_model(), ep=ep, imbalance=imbalance)
    assert lci[K.L_FWD_GEMM] >= lc1[K.L_FWD_GEMM] * (1 - 1e-12)  # equal rows can sum 1 ulp apart (hypothesis found it)


def test_imbalance_below_one_is_refused():
    with pytest.raises(SpecError, match="moe_imbalance"):
        _run(16, ep=16, moe_imbalance=0.5)


# --------------------------------------------------------------------------- the Megatron-Bridge MoE rows (held out)
def _bridge_moe():
    return [m for m in validation.public_runs() if m.dataset in ("bridge-hopper", "bridge-blackwell", "bridge-mla")
            and m.run.model.is_moe]


def test_every_bridge_moe_row_fits_but_the_known_misses():
    from test_memory import KNOWN_MISSES

    rows = _bridge_moe()
    assert len(rows) == 13  # the 12 of the 25.11 tables and the MoE optimisation guide's H100 Qwen3-30B-A3B run
    too_big = {m.run.id for m in rows if not perfmodel.predict(m.run).fits}
    assert too_big == {i for i in KNOWN_MISSES if i in {m.run.id for m in rows}}, too_big


# measured 2026-12-06 on this model (nothing fitted to these rows): 45.7% over the 12 MoE rows with the MoE host
# issue term (moe_host: kernels.moe.moe_host_time), 55.1% without it, 57.9% before the dispatch / permutation /
# imbalance terms of issue 36; 41.4% (2026-12-07) with GPT-OSS's expert biases, clamped GLU and unfused rotary
# embeddings priced (kernels.moe.expert_bias_time, glu_clamp_time); 39.1% over 13 with the MoE guide's H100 Qwen3
# row (10.5% too fast); the guard leaves about 5 points of margin
BRIDGE_MOE_MAPE_BOUND = 44.0


def test_bridge_moe_rows_mape_regression_guard():
    errors = [abs(validation.predicted_value(m) / m.measured - 1.0) for m in _bridge_moe()]
    assert 100.0 * np.mean(errors) < BRIDGE_MOE_MAPE_BOUND
