"""Multi-token prediction (model.mtp_num_layers, Megatron-Core's MultiTokenPredictionBlock): on the last pipeline
stage each depth runs one more layer, a 2h -> h projection and another output layer and loss."""

import dataclasses

import numpy as np
import pytest

from trainscale.kernels import layout as K
from trainscale.kernels.compute import gemm_fwd_bwd_time
from trainscale.kernels.layer import layer_costs, layer_fwd_bwd
from trainscale.model import perfmodel, validation
from trainscale.model.specs import ModelSpec, RunSpec, SpecError, SystemSpec

SHAPE = dict(layers=8, hidden=2048, heads=16, kv_heads=4, ffn_hidden=1024, ffn_type="swiglu", vocab=32000,
             seq_len=4096, experts=16, top_k=2)
H100 = SystemSpec.from_catalog("dgx-h100")


def _costs(mtp):
    calib = perfmodel.calibration_vector(H100.generation)
    lc = np.empty(K.L_SIZE)
    model = ModelSpec.from_dict({**SHAPE, "mtp_num_layers": mtp}, name="mtp")
    layer_costs(perfmodel.model_vector(model), perfmodel.system_vector(H100), calib, 1, 1, 2, K.RC_NONE, False, True,
                lc, 4, False, 0)
    return lc, calib


def test_each_depth_adds_a_layer_a_projection_and_a_head():
    plain, calib = _costs(0)
    for depth in (1, 2):
        lc, _ = _costs(depth)
        fwd, bwd = layer_fwd_bwd(plain)
        m, h = 2 * SHAPE["seq_len"], SHAPE["hidden"]
        eh_fwd, eh_bwd = gemm_fwd_bwd_time(m, h, 2 * h, np.int64(1), H100.peak_flops_bf16,
                                           H100.hbm_bandwidth_GBps * 1e9, H100.sm_count, calib)
        assert lc[K.L_HEAD_FWD] == pytest.approx(plain[K.L_HEAD_FWD] * (1 + depth) + depth * (fwd + eh_fwd), rel=1e-12)
        assert lc[K.L_HEAD_BWD] == pytest.approx(plain[K.L_HEAD_BWD] * (1 + depth) + depth * (bwd + eh_bwd), rel=1e-12)
        assert lc[K.L_HEAD_BYTES] == pytest.approx(plain[K.L_HEAD_BYTES] * (1 + depth) + depth * plain[K.L_ACT_BYTES])
        assert lc[K.L_FLOPS_HEAD] == pytest.approx(plain[K.L_FLOPS_HEAD] * (1 + depth)
                                                   + depth * (plain[K.L_FLOPS_FWD] + 4.0 * m * h * h))
        for slot in (K.L_FWD_GEMM, K.L_BWD_GEMM, K.L_ACT_BYTES, K.L_FLOPS_FWD):  # the model's own layers unchanged
            assert lc[slot] == plain[slot]


def _run(mtp, pp=2):
    return RunSpec.from_dict({"id": "mtp", "model": {**SHAPE, "mtp_num_layers": mtp}, "system": "dgx-h100",
                              "gpus": 8, "plan": {"tp": 1, "pp": pp, "ep": 4, "micro_batch": 1, "global_batch": 64,
                                                  "recompute": "none", "stack": "megatron"}})


def test_the_last_stage_carries_it_in_time_and_memory():
    for pp in (1, 2):
        plain, mtp = perfmodel.predict(_run(0, pp)), perfmodel.predict(_run(1, pp))
        assert mtp.step_time_s > plain.step_time_s
        assert mtp.memory_gib_per_gpu >= plain.memory_gib_per_gpu
    # pp 2: the last stage holds its layer, its experts and a copy of the embedding besides
    assert perfmodel.predict(_run(1)).memory_breakdown_gib["weights"] > perfmodel.predict(_run(0)).memory_breakdown_gib[
        "weights"]


def test_a_bad_depth_is_refused_in_one_line():
    with pytest.raises(SpecError, match="mtp_num_layers = -1 is invalid; expected an integer in"):
        ModelSpec.from_dict({**SHAPE, "mtp_num_layers": -1}, name="mtp")


def test_the_deepseek_v3_row_with_mtp_runs_the_recipes_layout():
    (m,) = [m for m in validation.public_runs() if "-mtp-" in m.run.id]
    assert m.run.model.mtp_num_layers == 1
    assert (m.run.plan.first_stage_layers, m.run.plan.last_stage_layers) == (4, 1)
    others = [m for m in validation.public_runs() if m.run.model.name == "deepseek-v3" and "-mtp-" not in m.run.id]
    assert others and all(o.run.model.mtp_num_layers == 0 for o in others)  # not stated by their tables
    without = dataclasses.replace(m.run, model=dataclasses.replace(m.run.model, mtp_num_layers=0))
    assert perfmodel.predict(m.run).step_time_s > 1.1 * perfmodel.predict(without).step_time_s
