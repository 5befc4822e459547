"""The contention model of compute-communication overlap (kernels.overlap, trainscale.model.overlap):
closed forms, hand computations and invariants."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainscale.model import overlap as ov
from trainscale.model import perfmodel
from trainscale.kernels import compute
from trainscale.kernels import overlap as KO
from trainscale.model.specs import SpecError

FAST = settings(max_examples=40, deadline=None)
CALIB = perfmodel.calibration_vector("hopper")
PEAK, HBM, SMS = 989.4e12, 3350e9, 132
FLOOR = 0.5


def run(system="dgx-h100", model="llama2-7b", zero=3, gpus=4):
    return {"model": model, "system": system, "gpus": gpus,
            "plan": {"dp": gpus, "zero": zero, "micro_batch": 2, "global_batch": 8 * gpus, "recompute": "selective",
                     "flash_attention": True, "stack": "fsdp"}}


# --------------------------------------------------------------------------- kernels
def test_channels_follow_message_size_up_to_the_maximum():
    assert KO.collective_channels(0.0, 24, 32768.0) == 0
    assert KO.collective_channels(1.0, 24, 32768.0) == 1
    assert KO.collective_channels(32768.0 * 5 + 1, 24, 32768.0) == 6
    assert KO.collective_channels(1e9, 24, 32768.0) == 24


def test_hbm_share_is_traffic_over_achievable_bandwidth():
    # 360 GB/s received, 3 bytes of HBM traffic each, on 0.85 x 3350 GB/s
    assert KO.collective_hbm_share(360e9, 3.0, HBM, 0.85) == pytest.approx(3 * 360 / (0.85 * 3350))
    assert KO.collective_hbm_share(0.0, 3.0, HBM, 0.85) == 0.0


def test_contended_machine_by_hand():
    peak, bw, sms = KO.contended_machine(PEAK, HBM, SMS, 24, 0.3, FLOOR)
    assert sms == 108 and peak == pytest.approx(PEAK * 108 / 132) and bw == pytest.approx(0.7 * HBM)
    assert KO.contended_machine(PEAK, HBM, SMS, 0, 0.9, FLOOR)[1] == pytest.approx(FLOOR * HBM)  # fair-share floor


def test_no_contention_means_no_slowdown():
    assert KO.gemm_contention_slowdown(4096, 4096, 4096, 1, PEAK, HBM, SMS, CALIB, 0, 0.0, FLOOR) == 0.0


def test_compute_bound_gemm_loses_its_wave_and_memory_bound_gemm_loses_bandwidth():
    # 12 x 11 = 132 tiles of 128 x 256 fill one wave (compute-bound at k = 16384); with 24 SMs
    # taken they need two waves: twice the FLOP time
    m, n, k = 12 * 128, 11 * 256, 16384
    kernel = CALIB[5]
    t = compute.gemm_time(m, n, k, 1, PEAK, HBM, SMS, CALIB)
    assert t - kernel == pytest.approx(2 * m * n * k / (CALIB[0] * PEAK))
    p, b, s = KO.contended_machine(PEAK, HBM, SMS, 24, 0.0, FLOOR)
    assert compute.gemm_time(m, n, k, 1, p, b, s, CALIB) == pytest.approx(2 * (t - kernel) + kernel)
    # a skinny GEMM (low arithmetic intensity) is memory-bound: it slows by 1/(1-h) on its byte time
    slow = KO.gemm_contention_slowdown(65536, 64, 64, 1, PEAK, HBM, SMS, CALIB, 0, 0.25, FLOOR)
    t = compute.gemm_time(65536, 64, 64, 1, PEAK, HBM, SMS, CALIB)
    assert slow == pytest.approx((t - kernel) / 0.75 / t + kernel / t - 1, rel=1e-9)


@FAST
@given(h1=st.floats(0.0, 0.9), h2=st.floats(0.0, 0.9), c1=st.integers(0, 64), c2=st.integers(0, 64),
       m=st.integers(64, 16384), n=st.integers(64, 16384), k=st.integers(64, 16384))
def test_slowdown_is_monotone_in_sm_and_hbm_share(h1, h2, c1, c2, m, n, k):
    lo_h, hi_h = sorted((h1, h2))
    lo_c, hi_c = sorted((c1, c2))
    lo = KO.gemm_contention_slowdown(m, n, k, 1, PEAK, HBM, SMS, CALIB, lo_c, lo_h, FLOOR)
    hi = KO.gemm_contention_slowdown(m, n, k, 1, PEAK, HBM, SMS, CALIB, hi_c, hi_h, FLOOR)
    assert -1e-12 <= lo <= hi + 1e-12  # rounding: one SM of 108 may cost -1e-16


def test_capped_clock():
    # cap at TDP and demand within TDP: full clock
    assert KO.capped_clock(700.0, 70.0, 700.0, 0.95, 0.0, 3.0, 0.2) == 1.0
    # demand 1.0 under a cap at half the dynamic range: f = 0.5^(1/3)
    assert KO.capped_clock(385.0, 70.0, 700.0, 1.0, 0.0, 3.0, 0.2) == pytest.approx(0.5 ** (1 / 3))
    assert KO.capped_clock(385.0, 70.0, 700.0, 1.0, 0.0, 1.0, 0.2) == pytest.approx(0.5)  # linear
    # fixed (memory) power eats the budget first; the floor holds
    assert KO.capped_clock(385.0, 70.0, 700.0, 1.0, 0.25, 3.0, 0.2) == pytest.approx(0.25 ** (1 / 3))
    assert KO.capped_clock(80.0, 70.0, 700.0, 1.0, 0.5, 3.0, 0.2) == 0.2


def test_step_time_closed_forms():
    R, C, M = 0.1, 2.0, 0.5
    # sequential, ideal (comm hidden), comm-bound ideal, no communication
    assert KO.overlap_step_time(R, C, M, 0.0, 0.3, 1.0, 1.0) == pytest.approx(R + C + M)
    assert KO.overlap_step_time(R, C, M, C, 0.0, 1.0, 1.0) == pytest.approx(R + max(C, M))
    assert KO.overlap_step_time(R, 0.4, 1.0, 0.4, 0.0, 1.0, 1.0) == pytest.approx(R + 1.0)
    assert KO.overlap_step_time(R, C, 0.0, C, 0.3, 1.0, 1.0) == pytest.approx(R + C)
    # overlapped with slowdown s: compute M/(1+s) done in the window, the rest alone
    s = 0.25
    assert KO.overlap_step_time(R, C, M, C, s, 1.0, 1.0) == pytest.approx(R + M + C - M / (1 + s))


@FAST
@given(R=st.floats(0, 1), C=st.floats(0, 10), M=st.floats(0, 10), frac=st.floats(0, 1), s=st.floats(0, 1),
       use=st.floats(0.1, 1.0), comm_use=st.floats(0.0, 0.5), cap=st.floats(0.3, 1.0))
def test_sequential_ge_overlapped_ge_ideal(R, C, M, frac, s, use, comm_use, cap):
    out = np.empty(KO.V_SIZE)
    steps = []
    for ovl, cont in ((0.0, 1), (frac * C, 1), (frac * C, 0)):
        KO.overlap_step(R, 0.5, C, use, M, comm_use, ovl, s, cont, 70.0, 700.0, 70.0 + cap * 630.0, 3.0, 0.2, out)
        steps.append(out[KO.V_STEP])
        assert out[KO.V_POWER_PEAK] <= 700.0 + 1e-9 and out[KO.V_POWER_MEAN] <= out[KO.V_POWER_PEAK] + 1e-9
    seq, ovr, ideal = steps
    assert seq >= ovr - 1e-12 and ovr >= ideal - 1e-12


# --------------------------------------------------------------------------- API
def test_no_communication_no_slowdown():
    r = ov.overlap(run(gpus=1, zero=0) | {"gpus": 1})
    assert r.inputs["comm_s"] == 0.0 and r.inputs["slowdown"] == 0.0
    steps = [r.modes[m]["step_time_s"] for m in ov.MODES]
    assert steps[0] == pytest.approx(steps[1]) == pytest.approx(steps[2])


def test_three_modes_against_the_performance_model():
    r = ov.overlap(run())
    i = r.inputs
    # sequential and ideal at full clock are the performance model's own steps
    assert r.modes["sequential"]["step_time_s"] == pytest.approx(i["step_sequential_model_s"], rel=1e-9)
    assert r.modes["ideal"]["step_time_s"] == pytest.approx(i["step_ideal_model_s"], rel=1e-9)
    seq, ovr, ideal = (r.modes[m]["step_time_s"] for m in ov.MODES)
    assert seq > ovr > ideal
    assert 0.05 < r.compute_slowdown < 0.6  # contention is neither free nor absurd
    assert i["channels"] == 24 and i["sm_share"] == pytest.approx(24 / 132)
    # FSDP mix: two all-gathers (k = 2) and one reduce-scatter (k = 3) per layer
    assert i["hbm_bytes_per_wire_byte"] == pytest.approx(7 / 3)


def test_power_cap_at_tdp_does_not_slow_compute_alone_and_a_lower_cap_does():
    inputs = ov.overlap_inputs(run())
    at_tdp = ov.overlap_modes(inputs, inputs["tdp_W"])
    assert at_tdp["sequential"]["clock_alone"] == 1.0
    assert at_tdp["sequential"]["step_time_s"] == pytest.approx(inputs["step_sequential_model_s"])
    low = ov.overlap_modes(inputs, 0.6 * inputs["tdp_W"])
    for mode in ov.MODES:
        assert low[mode]["step_time_s"] > at_tdp[mode]["step_time_s"]
        assert low[mode]["power_peak_W"] <= 0.6 * inputs["tdp_W"] + 1e-9


def test_fp8_needs_fp8_tensor_cores_and_pp_must_be_one():
    with pytest.raises(SpecError) as err:
        ov.overlap(run("dgx-a100-80gb"), "fp8")
    assert err.value.field == "precision"
    with pytest.raises(SpecError) as err:
        ov.overlap(run(), "int4")
    assert err.value.field == "precision"
    bad = run()
    bad["plan"] = {"pp": 2, "dp": 2, "micro_batch": 1, "global_batch": 8}
    with pytest.raises(SpecError) as err:
        ov.overlap(bad)
    assert err.value.field == "plan.pp"
    with pytest.raises(SpecError) as err:
        ov.overlap(run(), power_cap_W=50.0)
    assert err.value.field == "power_cap_W"


def test_every_coefficient_has_a_source():
    data = ov._catalog()
    for group in [data["common"], *data["generations"].values()]:
        for name, item in group.items():
            assert item.get("source") and math.isfinite(float(item["value"])), name
