"""GPT-OSS's experts: the second linear's bias added expert by expert and the clamped GLU's clamp, each priced as
Megatron-Core runs it (kernels.moe.expert_bias_time, kernels.moe.glu_clamp_time), counted by hand here."""

import numpy as np
import pytest

from trainscale.kernels import layout as K
from trainscale.kernels.layer import layer_costs
from trainscale.kernels.moe import EXPERT_BIAS_BYTES, GLU_CLAMP_BYTES, expert_bias_time, glu_clamp_time
from trainscale.model import perfmodel, validation
from trainscale.model.specs import ModelSpec, SpecError, SystemSpec

# GPT-OSS-120B's expert proportions, 2 layers: h = f = 2880, 128 experts, top-4
SHAPE = dict(layers=2, hidden=2880, heads=64, kv_heads=8, kv_channels=64, ffn_hidden=2880, ffn_type="swiglu",
             vocab=1000, seq_len=4096, experts=128, top_k=4)
H100 = SystemSpec.from_catalog("dgx-h100")
HBM = H100.hbm_bandwidth_GBps * 1e9


def _costs(ep=8, rc=K.RC_NONE, modules="", **model):
    spec = ModelSpec.from_dict({**SHAPE, **model}, name="gpt-oss-like")
    calib = perfmodel.calibration_vector("hopper")
    if modules:
        calib[K.C_RECOMPUTE_MODULES] = modules
    lc = np.empty(K.L_SIZE)
    layer_costs(perfmodel.model_vector(spec), perfmodel.system_vector(H100), calib, 1, 1, 1, rc, False, True, lc,
                ep, False, 0)
    return lc, calib


def test_expert_bias_by_hand():
    """Forward: the host's 2 E_l + 4 ops or the GPU's 12 bytes per element and 2 E_l + 1 kernels, the longer;
    backward: 16 bytes per element and 4 E_l + 1 kernels."""
    calib = perfmodel.calibration_vector("hopper")
    rate, launch, op = calib[K.C_HBM_EFF] * HBM, calib[K.C_KERNEL_S], calib[K.C_MOE_OP_HOST_S]
    routed, h, local = 4.0 * 4096, 2880.0, 16
    fwd, bwd = expert_bias_time(routed, h, local, 1.0, 1.0, 1.0, HBM, op, calib)
    gpu = EXPERT_BIAS_BYTES[0] * routed * h / rate + (2 * local + 1) * launch
    assert fwd == pytest.approx(max(gpu, (2 * local + 4) * op), rel=1e-12)
    assert bwd == pytest.approx(EXPERT_BIAS_BYTES[1] * routed * h / rate + (4 * local + 1) * launch, rel=1e-12)
    few, _ = expert_bias_time(64.0, h, local, 1.0, 1.0, 1.0, HBM, op, calib)  # a few copies: the host's issue
    assert few == pytest.approx((2 * local + 4) * op, rel=1e-12)
    half, _ = expert_bias_time(routed, h, local, 2.0, 1.0, 1.0, HBM, 0.0, calib)  # tp 2: half the copies
    assert half == pytest.approx(EXPERT_BIAS_BYTES[0] * routed * h / 2 / rate + (2 * local + 1) * launch, rel=1e-12)


def test_glu_clamp_by_hand():
    calib = perfmodel.calibration_vector("hopper")
    rate, launch = calib[K.C_HBM_EFF] * HBM, calib[K.C_KERNEL_S]
    n = 4.0 * 4096 * 2880
    fwd, bwd = glu_clamp_time(n, False, HBM, calib)
    assert fwd == pytest.approx(GLU_CLAMP_BYTES[0] * n / rate + 3 * launch, rel=1e-12)
    assert bwd == pytest.approx(GLU_CLAMP_BYTES[1] * n / rate + 3 * launch, rel=1e-12)
    _, again = glu_clamp_time(n, True, HBM, calib)  # moe_act recomputed: the clamp's forward once more
    assert again == pytest.approx(bwd + fwd, rel=1e-12)


def test_the_layer_adds_exactly_the_two_terms_to_its_moe_costs():
    base, calib = _costs()
    lc, _ = _costs(expert_bias=True, activation_func_clamp_value=7.0)
    routed, local = 4.0 * 4096, 128 // 8
    b_f, b_b = expert_bias_time(routed, 2880.0, local, 1.0, 1.0, 1.0, HBM, calib[K.C_MOE_OP_HOST_S], calib)
    c_f, c_b = glu_clamp_time(routed * 2880.0, False, HBM, calib)
    assert lc[K.L_FWD_MOE] == pytest.approx(base[K.L_FWD_MOE] + b_f + c_f, rel=1e-12)
    assert lc[K.L_BWD_MOE] == pytest.approx(base[K.L_BWD_MOE] + b_b + c_b, rel=1e-12)
    assert lc[K.L_HBM_TIME] == pytest.approx(base[K.L_HBM_TIME] + b_f + c_f + b_b + c_b, rel=1e-12)  # for power
    untouched = [i for i in range(K.L_SIZE) if i not in (K.L_FWD_MOE, K.L_BWD_MOE, K.L_HBM_TIME)]
    assert np.array_equal(lc[untouched], base[untouched])  # no GEMM, collective or memory slot moves
    # moe_act recomputed (Megatron-Core's selective module): the clamp's forward runs again in the backward
    recomputed, _ = _costs(rc=K.RC_SELECTIVE, modules=K.RM_MOE_ACT, activation_func_clamp_value=7.0)
    plain, _ = _costs(rc=K.RC_SELECTIVE, modules=K.RM_MOE_ACT)
    assert recomputed[K.L_BWD_MOE] - plain[K.L_BWD_MOE] == pytest.approx(c_b + c_f, rel=1e-9)


@pytest.mark.parametrize("fields, name", [
    (dict(experts=1, top_k=1, expert_bias=True), "expert_bias"),
    (dict(expert_bias="yes"), "expert_bias"),
    (dict(activation_func_clamp_value=7.0, ffn_type="gelu"), "activation_func_clamp_value"),
    (dict(activation_func_clamp_value=-1.0), "activation_func_clamp_value"),
])
def test_a_bad_field_is_refused_in_one_line_naming_it(fields, name):
    with pytest.raises(SpecError) as err:
        ModelSpec.from_dict({**SHAPE, **fields}, name="bad")
    assert name in str(err.value) and "\n" not in str(err.value)


def test_the_gpt_oss_rows_carry_both_and_a_bad_cell_is_refused():
    from trainscale.model import measured

    rows = [m for m in validation.public_runs() if m.run.model.name == "gpt-oss-120b"]
    assert len(rows) == 17
    assert all(m.run.model.expert_bias and m.run.model.activation_func_clamp_value == 7.0 for m in rows)
    assert all(m.run.plan.rotary_kernel == "rotate_half" for m in rows)
    with pytest.raises(ValueError, match="expert_bias = 'yes' is invalid; valid: blank, true or false"):
        measured._flag({"id": "x", "expert_bias": "yes"}, "expert_bias", measured.STACKS_FILE)
