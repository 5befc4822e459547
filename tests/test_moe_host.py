"""The host issue of a mixture-of-experts layer (``moe_host``, kernels.moe.moe_host_time): the ops Megatron-Core
issues after its dropless dispatcher's tokens-per-expert device-to-host sync, priced by hand from the counts and
the constants in data/calibration.yaml; zero, and bit-identical predictions, for dense models."""

import dataclasses

import numpy as np
import pytest

from trainscale.model import catalog, perfmodel
from trainscale.kernels import layout as K
from trainscale.kernels.layer import layer_costs
from trainscale.kernels.moe import moe_host_time
from trainscale.model.specs import ModelSpec, RunSpec, SystemSpec, resolve_model

# the small MoE of test_moe: 4 layers, h = 1024, 32 experts of 512, top-4
SHAPE = dict(layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=512, ffn_type="swiglu", vocab=1000,
             seq_len=2048, experts=32, top_k=4, capacity_factor=1.0)
H100 = SystemSpec.from_catalog("dgx-h100")
OP_S = 1.6e-5  # calibration.yaml common.moe_op_host_s
LAUNCH_S = 4.0e-6  # calibration.yaml common.kernel_overhead_s


def _costs(model, tp=1, ep=1, rc=K.RC_NONE, etp=0, calib=None):
    calib = perfmodel.calibration_vector(H100.generation) if calib is None else calib
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(model), perfmodel.system_vector(H100), calib, tp, 1, 1, rc, True, True,
                lc, ep, False, etp)
    return lc


def _run(gpus=8, model=None, **plan):
    plan = {"global_batch": 64, "micro_batch": 1, "recompute": "none", "flash_attention": True, "stack": "megatron",
            **plan}
    return RunSpec.from_dict({"id": "moe-host", "model": dict(SHAPE) if model is None else model,
                              "system": "dgx-h100", "gpus": gpus, "plan": plan})


def test_the_constant_and_its_source_are_in_calibration_yaml():
    entry = catalog.calibration()["common"]["moe_op_host_s"]
    assert entry["value"] == OP_S and "layer_host_s" in entry["source"]
    calib = perfmodel.calibration_vector("hopper")
    assert calib[K.C_MOE_OP_HOST_S] == OP_S and calib[K.C_KERNEL_S] == LAUNCH_S


def test_issue_counts_by_hand():
    """Qwen3-30B-A3B on 8 GPUs (ep 8, 16 local experts, etp 1, MXFP8): 4 ops (two grouped linears, their
    activation, the un-permutation) + 3 all-to-alls + the sort and unsort = 9 ops a pass; 2 x 16 GEMMs and 2 x 16
    quantisations forward, 4 x 16 GEMMs and 2 x 16 quantisations backward."""
    fwd, bwd = moe_host_time(16, 8, 1, True, OP_S, LAUNCH_S)
    assert fwd == pytest.approx(9 * OP_S + 64 * LAUNCH_S, rel=1e-12)
    assert bwd == pytest.approx(9 * OP_S + 96 * LAUNCH_S, rel=1e-12)
    fwd, bwd = moe_host_time(16, 8, 1, False, OP_S, LAUNCH_S)  # bf16: no quantisation launches
    assert (fwd, bwd) == pytest.approx((9 * OP_S + 32 * LAUNCH_S, 9 * OP_S + 64 * LAUNCH_S), rel=1e-12)
    # one expert a rank, no expert parallelism: the grouped linears, activation and un-permutation only
    assert moe_host_time(1, 1, 1, False, OP_S, LAUNCH_S) == pytest.approx((4 * OP_S + 2 * LAUNCH_S,
                                                                            4 * OP_S + 4 * LAUNCH_S), rel=1e-12)
    # expert tensor parallelism: two gathers and a reduce-scatter more
    assert moe_host_time(2, 4, 2, False, OP_S, LAUNCH_S)[0] == pytest.approx(12 * OP_S + 4 * LAUNCH_S, rel=1e-12)


def test_layer_costs_carry_it_and_dense_layers_do_not():
    lc = _costs(ModelSpec.from_dict(SHAPE, name="small-moe"), ep=8)  # 4 local experts, bf16
    fwd, bwd = 9 * OP_S + 8 * LAUNCH_S, 9 * OP_S + 16 * LAUNCH_S
    assert lc[K.L_FWD_MOE_HOST] == pytest.approx(fwd, rel=1e-12)
    assert lc[K.L_BWD_MOE_HOST] == pytest.approx(bwd, rel=1e-12)
    full = _costs(ModelSpec.from_dict(SHAPE, name="small-moe"), ep=8, rc=K.RC_FULL)
    assert full[K.L_BWD_MOE_HOST] == pytest.approx(bwd + fwd, rel=1e-12)  # the recomputed forward syncs again
    dense = resolve_model("llama3-8b")
    a = _costs(dense, tp=2)
    calib = perfmodel.calibration_vector(H100.generation)
    calib[K.C_MOE_OP_HOST_S] = 1.0  # a dense layer never reads it
    b = _costs(dense, tp=2, calib=calib)
    assert a[K.L_FWD_MOE_HOST] == a[K.L_BWD_MOE_HOST] == 0.0
    assert np.array_equal(a, b)


def test_moe_breakdown_has_it_as_layers_x_micro_batches_x_the_layer_term():
    run = _run(8, ep=8)  # dp 8, 8 micro-batches of 1, pp 1: all 4 layers on the critical stage
    p = perfmodel.predict(run)
    per_layer = (9 * OP_S + 8 * LAUNCH_S) + (9 * OP_S + 16 * LAUNCH_S)
    assert "moe_host" in p.breakdown
    assert p.breakdown["moe_host"] == pytest.approx(8 * 4 * per_layer, rel=1e-12)
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s, rel=1e-9)
    times = perfmodel.layer_times(run.model, "dgx-h100", run.plan)
    assert times["fwd_moe_host_s"] == pytest.approx(9 * OP_S + 8 * LAUNCH_S, rel=1e-12)
    # with pipeline stages (simulated) the term stays in the breakdown and the breakdown still adds up
    q = perfmodel.predict(_run(16, ep=8, pp=2))
    assert q.breakdown["moe_host"] > 0 and sum(q.breakdown.values()) == pytest.approx(q.step_time_s, rel=1e-9)


def test_dense_predictions_name_no_moe_host_and_ignore_its_constant():
    run = RunSpec.from_dict({"model": "llama3-8b", "system": "dgx-h100", "gpus": 16,
                             "plan": {"tp": 2, "pp": 2, "global_batch": 32}})
    p = perfmodel.predict(run)
    assert "moe_host" not in p.breakdown
    calib = perfmodel.plan_calibration_vector(H100, run.plan)
    out = perfmodel.plan_vector(run.model, H100, run.plan, calib)
    calib[K.C_MOE_OP_HOST_S] = 1.0
    out_changed = perfmodel.plan_vector(run.model, H100, run.plan, calib)
    assert out[K.O_MOE_HOST] == 0.0
    assert np.array_equal(out, out_changed, equal_nan=True)
    assert dataclasses.asdict(perfmodel.predict(run)) == dataclasses.asdict(p)
