"""What scale costs (issue 35): stragglers, NCCL's tree discount, DeepSpeed's partitioned pipeline
tensors, and the >= 1,000-GPU validation group. Kernels against plain-Python references and
invariants."""

import math

import numpy as np
import pytest
from scipy import integrate, stats

from trainscale.model import perfmodel
from trainscale.kernels import layout as K
from trainscale.kernels.collectives import TREE_BUS_FACTOR, allreduce_time
from trainscale.kernels.scale import expected_max_normal, normal_quantile, straggler_time_s


def exact_expected_max(n):
    """E[max of n i.i.d. N(0, 1)] = integral of z n phi(z) Phi(z)^(n-1), by quadrature."""
    return integrate.quad(lambda z: z * n * stats.norm.pdf(z) * stats.norm.cdf(z) ** (n - 1), -12, 12,
                          limit=400)[0]


@pytest.mark.parametrize("p", [1e-9, 1e-4, 0.02, 0.3, 0.5, 0.77, 0.98, 0.9999, 1 - 1e-9])
def test_normal_quantile_matches_scipy(p):
    assert normal_quantile(p) == pytest.approx(stats.norm.ppf(p), abs=1e-8)


@pytest.mark.parametrize("n, rel", [(2, 0.05), (3, 0.03), (8, 0.01), (64, 0.01), (1024, 0.01), (16384, 0.01)])
def test_expected_max_is_bloms_approximation_of_the_exact_integral(n, rel):
    exact = exact_expected_max(n)
    assert expected_max_normal(n) == pytest.approx(exact, rel=rel)
    # Blom's formula itself, in plain Python
    assert expected_max_normal(n) == pytest.approx(stats.norm.ppf((n - 0.375) / (n + 0.25)), abs=1e-9)


def test_expected_max_grows_like_sqrt_2_ln_n_and_never_falls():
    ns = np.unique(np.logspace(0, 6, 200).astype(int))
    values = np.array([expected_max_normal(int(n)) for n in ns])
    assert values[0] == 0.0  # one rank waits for nobody
    assert np.all(np.diff(values) >= 0.0)
    # the ratio to sqrt(2 ln n) rises slowly towards 1 (about 0.87 at a million ranks)
    ratio = values[-1] / math.sqrt(2.0 * math.log(ns[-1]))
    assert 0.8 < ratio < 1.0


def test_straggler_time_reference():
    for work, spread, n in ((10.0, 0.01, 1024), (2.5, 0.03, 8), (1.0, 0.0, 4096), (3.0, 0.02, 1)):
        expected = 0.0 if n <= 1 or spread == 0 else work * spread * stats.norm.ppf((n - 0.375) / (n + 0.25))
        assert straggler_time_s(work, spread, n) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_tree_allreduce_takes_ncclS_bandwidth_discount():
    """Across 64 nodes (one GPU each), a 1 GiB all-reduce: the ring's bandwidth term beats the tree's
    discounted one; a 64 KiB one is latency-bound and the tree, log2 deep, wins."""
    big, small = 2.0 ** 30, 2.0 ** 16
    args = (64, 8, 8, 300e9, 2e-6, 25e9, 5e-6, 0.85)
    ring_big = 2.0 * (63 * 5e-6 + 63 / 64 * big / (0.85 * 25e9))
    assert allreduce_time(big, *args) == pytest.approx(ring_big, rel=1e-12)
    tree_small = 2.0 * (6 * 5e-6) + 2.0 * small / (TREE_BUS_FACTOR * 0.85 * 25e9)
    assert allreduce_time(small, *args) == pytest.approx(tree_small, rel=1e-12)


def _run(gpus, gb, model="gpt-175b", tp=8, pp=8, stack="megatron", **plan):
    return {"id": "x", "model": model, "system": "dgx-a100-80gb", "gpus": gpus,
            "plan": dict(tp=tp, pp=pp, micro_batch=1, global_batch=gb, recompute="full", stack=stack, **plan)}


# The spread's prior (calibration.yaml): the stored value is 0 until the refit that fits it (see its comment).
PRIOR_SPREAD = {"straggler_spread": 0.01}


def test_straggler_is_in_the_breakdown_and_the_step():
    p = perfmodel.predict(_run(1024, 1024), PRIOR_SPREAD)
    assert p.breakdown["straggler"] > 0.0
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s, rel=1e-9)
    off = perfmodel.predict(_run(1024, 1024), {"straggler_spread": 0.0})
    assert p.step_time_s == pytest.approx(off.step_time_s * (1.0 + 0.01 * expected_max_normal(1024)), rel=1e-9)


def test_weak_scaling_is_never_perfect_nor_faster_with_more_gpus():
    """At a fixed batch per GPU, more data-parallel replicas never make a step shorter, and the
    straggler term alone makes it strictly longer."""
    steps = [perfmodel.predict(_run(g, g // 8), PRIOR_SPREAD).step_time_s for g in (512, 1024, 2048, 4096, 8192, 16384)]
    assert np.all(np.diff(steps) > 0.0)


def test_deepspeed_pipeline_gathers_its_partitioned_tensors():
    """DeepSpeed's pipeline engine re-gathers each received activation and gradient over the tp
    ranks (PartitionedTensor.full()): two all-gathers of the boundary tensor per micro-batch."""
    from trainscale.model.specs import RunSpec

    run = RunSpec.from_dict(_run(64, 64, tp=8, pp=8, stack="deepspeed"))
    calib = perfmodel.plan_calibration_vector(run.system, run.plan, {"straggler_spread": 0.0})
    assert calib[K.C_PIPE_PARTITIONED] == 1.0
    assert perfmodel.calibration_vector("ampere", None, "megatron")[K.C_PIPE_PARTITIONED] == 0.0
    with_gathers = perfmodel.plan_vector(run.model, run.system, run.plan, calib)
    calib[K.C_PIPE_PARTITIONED] = 0.0
    without = perfmodel.plan_vector(run.model, run.system, run.plan, calib)
    system = run.system
    nbytes = 2.0 * 2048 * 12288  # one micro-batch's boundary activation, 16-bit
    one = 7 * system.scale_up_latency_s + 7 / 8 * nbytes / (calib[K.C_NET_EFF] * system.scale_up_GBps_per_gpu * 1e9)
    micro = 64
    assert with_gathers[K.O_PP_COMM] - without[K.O_PP_COMM] == pytest.approx(micro * 2 * one, rel=1e-9)
