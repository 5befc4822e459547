"""The softmax's exponentials in a fused attention (kernels.compute.attention_exp_time): one per score in the
forward and one in the backward's recompute of P, on the special-function units, at the generation's
calibration ``flops_per_exponential`` (dense 16-bit tensor-core FLOPs in the time of one exponential)."""

import numpy as np
import pytest

from trainscale.kernels import layout as K
from trainscale.kernels.compute import attention_exp_time
from trainscale.kernels.inference import attention_core_time
from trainscale.kernels.layer import causal_block_fraction, layer_costs
from trainscale.model import catalog, perfmodel
from trainscale.model.specs import ModelSpec, SystemSpec

SHAPE = dict(layers=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, ffn_type="swiglu", vocab=1000,
             seq_len=8192)


def _costs(system, calib, flash=True, **shape):
    lc = np.empty(K.L_SIZE)
    model = ModelSpec.from_dict({**SHAPE, **shape}, name="exp")
    layer_costs(perfmodel.model_vector(model), perfmodel.system_vector(system), calib, 1, 1, 2, K.RC_NONE, False,
                flash, lc)
    return lc


def test_the_generations_constants_are_their_tensor_over_sfu_rates():
    fixed = {g: v["fixed"]["flops_per_exponential"]["value"] for g, v in catalog.calibration()["generations"].items()}
    # dense 16-bit tensor-core FLOP per SM per clock over 16 exp2 per SM per clock
    assert fixed["ampere"] == 2048 / 16 and fixed["hopper"] == 4096 / 16 and fixed["blackwell"] == 8192 / 16
    h100 = SystemSpec.from_catalog("dgx-h100")
    # FlashAttention-3: 989 TFLOPS of matmul against 3.9 TFLOPS of special functions on the H100 SXM5
    assert h100.peak_flops_bf16 / fixed["hopper"] == pytest.approx(3.9e12, rel=0.01)


def test_the_exponentials_add_once_forward_and_once_to_the_backward():
    for name in ("dgx-a100-80gb", "dgx-h100", "dgx-b200"):
        system = SystemSpec.from_catalog(name)
        calib = perfmodel.calibration_vector(system.generation)
        off = calib.copy()
        off[K.C_ATTN_EXP_FLOPS] = 0.0
        on, plain = _costs(system, calib), _costs(system, off)
        s = SHAPE["seq_len"]
        scores = 2 * SHAPE["heads"] * s * s * causal_block_fraction(s, s)  # micro-batch 2, tp 1
        t_exp = scores * calib[K.C_ATTN_EXP_FLOPS] / system.peak_flops_bf16
        assert t_exp > 0
        assert on[K.L_FWD_GEMM] - plain[K.L_FWD_GEMM] == pytest.approx(t_exp, rel=1e-9)
        assert on[K.L_BWD_GEMM] - plain[K.L_BWD_GEMM] == pytest.approx(t_exp, rel=1e-9)
        unfused_on, unfused_off = _costs(system, calib, flash=False), _costs(system, off, flash=False)
        assert unfused_on[K.L_FWD_GEMM] == unfused_off[K.L_FWD_GEMM]  # a separate, memory-bound softmax there


def test_a_narrow_head_loses_more_to_the_exponentials_and_blackwell_most():
    """The FLOPs of both products scale with the head width, the exponentials do not: at head dim 64 the
    exponentials are twice the share they are at 128, and on B200 (512) twice H100's (256)."""
    shares = {}
    for name in ("dgx-h100", "dgx-b200"):
        system = SystemSpec.from_catalog(name)
        calib = perfmodel.calibration_vector(system.generation)
        off = calib.copy()
        off[K.C_ATTN_EXP_FLOPS] = 0.0
        for d in (64, 128):
            shape = dict(heads=4096 // d, kv_heads=4096 // d, kv_channels=d)
            on, plain = _costs(system, calib, **shape), _costs(system, off, **shape)
            shares[name, d] = (on[K.L_FWD_GEMM] - plain[K.L_FWD_GEMM]) / on[K.L_FWD_GEMM]
    assert shares["dgx-h100", 64] > shares["dgx-h100", 128] > 0
    assert shares["dgx-b200", 128] > shares["dgx-h100", 128]


def test_inference_prices_the_same_exponentials():
    system = SystemSpec.from_catalog("dgx-h100")
    calib = perfmodel.calibration_vector(system.generation)
    off = calib.copy()
    off[K.C_ATTN_EXP_FLOPS] = 0.0
    args = (4, 2048, 0, 8192.0, 64, 1024.0, 1.0, system.peak_flops_bf16, system.hbm_bandwidth_GBps * 1e9,
            system.sm_count)
    scores = 4 * 64 * (2048 * 2049 / 2)
    expected = attention_exp_time(scores, system.peak_flops_bf16, calib)
    assert expected == pytest.approx(scores * 256 / system.peak_flops_bf16, rel=1e-12)
    assert attention_core_time(*args, calib) - attention_core_time(*args, off) == pytest.approx(expected, rel=1e-9)
