"""Wall-clock join of the convergence layer and the performance model: link costs against closed
forms and invariants, one worker's step against perfmodel.predict, compression ratios against
the compressors' bit counts, timelines and energy against hand-computed schedules, time and
energy to target against convergence.steps_to_target, and validation errors naming the field."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainscale.training import convergence as C
from trainscale.model import perfmodel
from trainscale.training import wallclock as WC
from trainscale.model.specs import PlanSpec, RunSpec, SpecError, resolve_model, resolve_system

# a hand-made worker step: numbers chosen so that closed forms are easy to read
STEP = WC.WorkerStep(model="toy", system="toy", gpus=8, batch_per_worker=4, compute_s=2.0, power_W=300.0,
                     idle_W=60.0, model_params=1000, message_bytes=2000.0)
G, P, IDLE, CS = STEP.gpus, STEP.power_W, STEP.idle_W, STEP.compute_s


@pytest.fixture(scope="module")
def problem():
    return C.make_problem("least_squares", n_samples=256, dim=64, workers=4, seed=0)


@pytest.fixture(scope="module")
def sync_run(problem):
    return C.run(problem, "sync", steps=20, batch_size=8)


@pytest.fixture(scope="module")
def local_runs(problem):
    plain = C.run(problem, "local", steps=16, batch_size=8, H=4)
    delayed = C.run(problem, "local", steps=16, batch_size=8, H=4, delayed=True)
    return plain, delayed


# ---------------------------------------------------------------------------------------------
# links


def test_transfer_time_closed_form():
    gbit = WC.Link(bandwidth_GBps=0.125, latency_s=0.05)  # 1 Gb/s
    assert WC.transfer_time_s(1e9, gbit) == pytest.approx(8.0 + 0.05, rel=1e-15)
    assert WC.transfer_time_s(1e9, gbit, efficiency=0.5) == pytest.approx(16.0 + 0.05, rel=1e-15)
    assert WC.transfer_time_s(0.0, gbit) == 0.0  # no message, no latency
    assert WC.Link(0.125).latency_s == 0.0
    assert WC.Link(12.5).bandwidth_Bps == 12.5e9


def test_allreduce_closed_form_and_single_peer():
    link = WC.Link(10.0, 1e-3)
    # 2 (n-1) alpha + 2 (n-1)/n S / B
    assert WC.allreduce_time_s(1e9, 4, link) == pytest.approx(2 * 3 * 1e-3 + 2 * 0.75 * 0.1, rel=1e-14)
    assert WC.allreduce_time_s(1e9, 4, link, efficiency=0.5) == pytest.approx(0.006 + 0.3, rel=1e-14)
    assert WC.allreduce_time_s(1e9, 1, link) == 0.0
    assert WC.allreduce_time_s(0.0, 8, link) == 0.0


def test_two_level_allreduce():
    intra, inter = WC.Link(50.0, 5e-6), WC.Link(0.125, 0.03)
    S = 13.5e9
    # one region: the intra-region ring all-reduce; one worker per region: the inter-region one
    assert WC.two_level_allreduce_time_s(S, 8, 1, intra, inter) == pytest.approx(WC.allreduce_time_s(S, 8, intra),
                                                                                 rel=1e-14)
    assert WC.two_level_allreduce_time_s(S, 1, 4, intra, inter) == pytest.approx(WC.allreduce_time_s(S, 4, inter),
                                                                                 rel=1e-14)
    w, R = 8, 4
    closed = (2 * (w - 1) * 5e-6 + 2 * (w - 1) / w * S / 50e9
              + 2 * (R - 1) * 0.03 + 2 * (R - 1) / R * S / 0.125e9)
    got = WC.two_level_allreduce_time_s(S, w, R, intra, inter)
    assert got == pytest.approx(closed, rel=1e-13)
    # the shared uplink makes the cross-region part the regions' all-reduce of the full buffer
    assert got == pytest.approx(WC.allreduce_time_s(S, w, intra) + WC.allreduce_time_s(S, R, inter), rel=1e-13)


@settings(max_examples=60, deadline=None)
@given(nbytes=st.floats(0.0, 1e12), n=st.integers(1, 64), w=st.integers(1, 16), R=st.integers(1, 16),
       bw=st.floats(1e-3, 1e3), factor=st.floats(1.0, 1e3), lat=st.floats(0.0, 1.0))
def test_more_bandwidth_is_never_slower(nbytes, n, w, R, bw, factor, lat):
    slow, fast = WC.Link(bw, lat), WC.Link(bw * factor, lat)
    other = WC.Link(10.0, 1e-5)
    assert WC.transfer_time_s(nbytes, fast) <= WC.transfer_time_s(nbytes, slow)
    assert WC.allreduce_time_s(nbytes, n, fast) <= WC.allreduce_time_s(nbytes, n, slow)
    assert (WC.two_level_allreduce_time_s(nbytes, w, R, other, fast)
            <= WC.two_level_allreduce_time_s(nbytes, w, R, other, slow))
    assert (WC.two_level_allreduce_time_s(nbytes, w, R, fast, other)
            <= WC.two_level_allreduce_time_s(nbytes, w, R, slow, other))
    # and more bytes never faster
    assert WC.allreduce_time_s(nbytes, n, slow) <= WC.allreduce_time_s(nbytes + 1e6, n, slow)


@pytest.mark.parametrize("call, field", [
    (lambda: WC.Link(0.0, 0.0), "bandwidth_GBps"),
    (lambda: WC.Link(-1.0, 0.0), "bandwidth_GBps"),
    (lambda: WC.Link(math.inf, 0.0), "bandwidth_GBps"),
    (lambda: WC.Link(True, 0.0), "bandwidth_GBps"),
    (lambda: WC.Link(1.0, -1e-3), "latency_s"),
    (lambda: WC.Link(1.0, math.nan), "latency_s"),
    (lambda: WC.transfer_time_s(-1.0, WC.Link(1.0)), "nbytes"),
    (lambda: WC.transfer_time_s(1.0, 1.0), "link"),
    (lambda: WC.transfer_time_s(1.0, WC.Link(1.0), efficiency=0.0), "efficiency"),
    (lambda: WC.allreduce_time_s(1.0, 0, WC.Link(1.0)), "n"),
    (lambda: WC.allreduce_time_s(1.0, 2.5, WC.Link(1.0)), "n"),
    (lambda: WC.two_level_allreduce_time_s(1.0, 0, 2, WC.Link(1.0), WC.Link(1.0)), "workers_per_region"),
    (lambda: WC.two_level_allreduce_time_s(1.0, 2, 0, WC.Link(1.0), WC.Link(1.0)), "regions"),
    (lambda: WC.two_level_allreduce_time_s(1.0, 2, 2, None, WC.Link(1.0)), "intra"),
])
def test_link_errors_name_the_field(call, field):
    with pytest.raises(SpecError) as err:
        call()
    assert err.value.field == field


# ---------------------------------------------------------------------------------------------
# one worker's step


def test_worker_step_matches_perfmodel():
    ws = WC.worker_step("llama2-7b", "dgx-a100-80gb", 8, 8)
    model, system = resolve_model("llama2-7b"), resolve_system("dgx-a100-80gb")
    plan = ws.plan
    assert (plan.tp, plan.pp, plan.dp, plan.global_batch) == (8, 1, 1, 8)
    pred = perfmodel.predict(RunSpec("same", model, system, plan))
    assert ws.compute_s == pred.step_time_s
    assert ws.power_W == pred.power_W_per_gpu
    assert pred.breakdown["dp_comm"] == 0.0  # no gradient synchronisation inside the worker
    # the same plan through the CLI's mapping
    mapping = {"model": "llama2-7b", "system": "dgx-a100-80gb", "gpus": 8,
               "plan": {"tp": 8, "pp": 1, "micro_batch": plan.micro_batch, "global_batch": 8,
                        "recompute": plan.recompute, "sequence_parallel": True, "flash_attention": True}}
    assert perfmodel.predict(mapping).step_time_s == ws.compute_s
    assert ws.idle_W == system.idle_W and ws.gpus == 8 and ws.fits
    assert ws.model_params == model.params() == 6_738_415_616
    assert ws.message_bytes == 2 * 6_738_415_616
    assert ws.tokens_per_step == 8 * 4096
    assert WC.worker_step(model, system, 8, 8, bytes_per_value=4).message_bytes == 4 * 6_738_415_616
    # the fastest fitting plan of the searched ones
    for mb in (1, 2, 4, 8):
        for mode in ("none", "selective", "full"):
            other = PlanSpec(tp=8, pp=1, dp=1, micro_batch=mb, global_batch=8, recompute=mode,
                             sequence_parallel=True, flash_attention=True)
            p = perfmodel.predict(RunSpec("other", model, system, other))
            if p.fits:
                assert p.step_time_s >= ws.compute_s
    fixed = WC.worker_step(model, system, 8, 8, micro_batch=1, recompute="full")
    assert (fixed.plan.micro_batch, fixed.plan.recompute) == (1, "full")
    assert fixed.compute_s >= ws.compute_s


def test_worker_step_across_nodes_is_pipelined():
    ws = WC.worker_step("llama2-7b", "dgx-a100-80gb", 16, 16)
    assert (ws.plan.tp, ws.plan.pp, ws.plan.dp) == (8, 2, 1)
    assert ws.gpus == 16


@pytest.mark.parametrize("kwargs, field", [
    ({"gpus_per_worker": 3}, "gpus_per_worker"),   # tp = 3 does not divide 32 heads
    ({"gpus_per_worker": 12}, "gpus_per_worker"),  # more than a node, not a multiple of it
    ({"gpus_per_worker": 0}, "gpus_per_worker"),
    ({"batch_per_worker": 0}, "batch_per_worker"),
    ({"micro_batch": 3}, "micro_batch"),
    ({"recompute": "some"}, "recompute"),
    ({"bytes_per_value": 0}, "bytes_per_value"),
    ({"model": "llama-9000"}, "model"),
    ({"model": "gpt3-175b", "gpus_per_worker": 1, "batch_per_worker": 1}, "gpus_per_worker"),  # does not fit
])
def test_worker_step_errors_name_the_field(kwargs, field):
    args = {"model": "llama2-7b", "system": "dgx-a100-80gb", "gpus_per_worker": 8, "batch_per_worker": 8}
    args.update(kwargs)
    with pytest.raises(SpecError) as err:
        WC.worker_step(**args)
    assert err.value.field == field


# ---------------------------------------------------------------------------------------------
# compression ratio


def test_compression_ratio_uncompressed_is_one(sync_run, local_runs, problem):
    assert WC.compression_ratio(sync_run) == 1.0
    assert WC.compression_ratio(local_runs[0]) == 1.0
    async_run = C.run(problem, "async", steps=12, batch_size=8, speeds=[1.0, 0.5, 1.0, 0.25])
    assert WC.compression_ratio(async_run) == 1.0


def test_compression_ratio_top_k(problem):
    d, k = 64, 8
    expected = k * (32 + math.ceil(math.log2(d))) / (32 * d)
    topk = {"name": "top_k", "k": k}
    ds = C.run(problem, "sync", steps=20, batch_size=8, compressor=topk)
    assert WC.compression_ratio(ds) == pytest.approx(expected, rel=1e-15)
    ds = C.run(problem, "local", steps=16, batch_size=8, H=4, compressor=topk)
    assert WC.compression_ratio(ds) == pytest.approx(expected, rel=1e-15)
    ds = C.run(problem, "async", steps=12, batch_size=8, compressor=topk, speeds=[1.0, 0.5, 1.0, 0.25])
    assert WC.compression_ratio(ds) == pytest.approx(expected, rel=1e-15)


# ---------------------------------------------------------------------------------------------
# lock-step timelines


def test_sync_timeline_no_comm_equal_speeds(sync_run):
    ds = WC.sync_timeline(sync_run, STEP)
    steps = sync_run["step"].values
    np.testing.assert_allclose(ds["time_s"].values, steps * CS, rtol=1e-15)
    # comm 0 and equal speeds: every GPU busy all the time
    np.testing.assert_allclose(ds["energy_J"].values, 4 * G * P * steps * CS, rtol=1e-14)
    for name, units in (("time_s", "s"), ("energy_J", "J"), ("busy_s", "s")):
        assert ds[name].attrs["units"] == units and ds[name].attrs["long_name"]
    assert "time_s" not in sync_run.coords  # a copy
    np.testing.assert_array_equal(ds["loss"].values, sync_run["loss"].values)


def test_sync_timeline_comm_and_straggler(sync_run):
    steps = sync_run["step"].values.astype(float)
    M = 0.7
    ds = WC.sync_timeline(sync_run, STEP, comm_s=M)
    np.testing.assert_allclose(ds["time_s"].values, steps * (CS + M), rtol=1e-14)
    np.testing.assert_allclose(ds["energy_J"].values, G * 4 * steps * (P * CS + IDLE * M), rtol=1e-14)
    # a straggler at half speed doubles the compute part; the others wait for it at idle power
    ds = WC.sync_timeline(sync_run, STEP, comm_s=M, speeds=[1.0, 1.0, 1.0, 0.5])
    np.testing.assert_allclose(ds["time_s"].values, steps * (2 * CS + M), rtol=1e-14)
    busy = steps * np.array([CS, CS, CS, 2 * CS])[:, None]
    energy = G * (P * busy + IDLE * (steps * (2 * CS + M) - busy)).sum(axis=0)
    np.testing.assert_allclose(ds["energy_J"].values, energy, rtol=1e-14)
    np.testing.assert_allclose(ds["busy_s"].values, busy.T, rtol=1e-15)


def test_local_timeline_rounds(local_runs):
    plain, _ = local_runs
    H, M = 4, 3.0
    rounds = plain["step"].values / H
    ds = WC.local_timeline(plain, STEP, comm_s=M)
    np.testing.assert_allclose(ds["time_s"].values, rounds * (H * CS + M), rtol=1e-14)
    np.testing.assert_allclose(ds["energy_J"].values, G * 4 * rounds * (P * H * CS + IDLE * M), rtol=1e-14)


@pytest.mark.parametrize("M", [0.0, 3.0, 8.0, 30.0])  # below, at and above a round's compute (H c = 8 s)
def test_local_timeline_delayed_overlaps(local_runs, M):
    plain, delayed = local_runs
    H = 4
    C_round = H * CS
    n = delayed["step"].values / H
    d = WC.local_timeline(delayed, STEP, comm_s=M)
    expected = np.where(n > 0, C_round + (n - 1) * max(C_round, M), 0.0)
    np.testing.assert_allclose(d["time_s"].values, expected, rtol=1e-14)
    p = WC.local_timeline(plain, STEP, comm_s=M)
    assert np.all(d["time_s"].values <= p["time_s"].values)
    assert np.all(d["energy_J"].values <= p["energy_J"].values)
    assert np.all(d["busy_s"].values == p["busy_s"].values)  # same work, less waiting


@pytest.mark.parametrize("speeds", [None, [1.0, 0.5, 0.9, 0.3]])
@pytest.mark.parametrize("M", [0.0, 1.5])
def test_energy_at_least_busy_energy(sync_run, local_runs, speeds, M):
    for ds, hidden in ((WC.sync_timeline(sync_run, STEP, comm_s=M, speeds=speeds), M == 0.0),
                       (WC.local_timeline(local_runs[0], STEP, comm_s=M, speeds=speeds), M == 0.0),
                       # delayed: an exchange shorter than a round (8 s) hides behind compute
                       (WC.local_timeline(local_runs[1], STEP, comm_s=M, speeds=speeds), M <= 4 * CS)):
        busy_only = G * P * ds["busy_s"].values.sum(axis=1)
        assert np.all(ds["energy_J"].values >= busy_only * (1 - 1e-14))
        if hidden and speeds is None:
            np.testing.assert_allclose(ds["energy_J"].values, busy_only, rtol=1e-14)
        else:
            assert np.all(ds["energy_J"].values[1:] > busy_only[1:])
        assert np.all(np.diff(ds["time_s"].values) > 0)


# ---------------------------------------------------------------------------------------------
# event-driven timelines


def test_event_timeline_async_workers_never_wait(problem):
    ds = C.run(problem, "async", steps=24, batch_size=8, speeds=[1.0, 0.5, 1.0, 0.25], time_per_step_s=CS)
    out = WC.event_timeline(ds, STEP)
    T = ds["time_s"].values
    np.testing.assert_array_equal(out["time_s"].values, T)
    # without communication every worker computes all the time: all GPUs at busy power
    np.testing.assert_allclose(out["busy_s"].values, np.broadcast_to(T[:, None], (T.size, 4)), rtol=1e-14)
    np.testing.assert_allclose(out["energy_J"].values, 4 * G * P * T, rtol=1e-14)
    with pytest.raises(SpecError) as err:  # its simulated time is not this step's
        WC.event_timeline(C.run(problem, "async", steps=4, batch_size=8), STEP)
    assert err.value.field == "time_per_step_s"


@pytest.mark.skipif("async_local" not in C.METHODS, reason="convergence has no async_local method")
def test_event_timeline_async_local_closed_form():
    one = C.make_problem("least_squares", n_samples=64, dim=8, workers=1, seed=1)
    H, w = 2, 0.25
    ds = C.run(one, "async_local", steps=6, batch_size=4, H=H, time_per_step_s=CS, worker_comm_s=w)
    out = WC.event_timeline(ds, STEP)
    s = ds["step"].values.astype(float)  # messages; each: H steps of compute, then w there and w back
    np.testing.assert_allclose(out["time_s"].values, np.where(s > 0, s * H * CS + (2 * s - 1) * w, 0.0), rtol=1e-14)
    np.testing.assert_allclose(out["busy_s"].values[:, 0], s * H * CS, rtol=1e-14)
    expected = G * (P * s * H * CS + IDLE * np.where(s > 0, (2 * s - 1) * w, 0.0))
    np.testing.assert_allclose(out["energy_J"].values, expected, rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# to target


def test_time_and_energy_to_target(sync_run):
    ds = WC.sync_timeline(sync_run, STEP, comm_s=0.5, speeds=[1.0, 1.0, 1.0, 0.5])
    target = float(sync_run["loss"].values[7]) + 1e-12
    s = C.steps_to_target(ds, target)
    assert not math.isnan(s)
    assert WC.time_to_target(ds, target) == float(ds["time_s"].sel(step=int(s)))
    assert WC.energy_to_target(ds, target) == float(ds["energy_J"].sel(step=int(s)))
    assert WC.time_to_target(ds, target) == pytest.approx(s * (2 * CS + 0.5), rel=1e-14)
    assert math.isnan(WC.time_to_target(ds, -1.0))
    assert math.isnan(WC.energy_to_target(ds, -1.0))
    with pytest.raises(SpecError) as err:  # no timeline yet
        WC.time_to_target(sync_run, target)
    assert err.value.field == "time_s"


def test_to_target_table(sync_run, local_runs):
    runs = {"sync": WC.sync_timeline(sync_run, STEP, comm_s=4.0),
            "diloco": WC.local_timeline(local_runs[0], STEP, comm_s=4.0)}
    target = float(max(sync_run["loss"].values[-1], local_runs[0]["loss"].values[-1])) + 1e-9
    table = WC.to_target_table(runs, target)
    assert list(table["method"].values) == ["sync", "diloco"]
    for name, ds in runs.items():
        row = table.sel({"method": name})  # sel(method=...) is the interpolation keyword
        assert float(row["steps_to_target"]) == C.steps_to_target(ds, target)
        assert float(row["samples_to_target"]) == C.tokens_to_target(ds, target)
        assert float(row["time_to_target_s"]) == WC.time_to_target(ds, target)
        assert float(row["energy_to_target_J"]) == WC.energy_to_target(ds, target)
        assert float(row["final_loss"]) == float(ds["loss"].values[-1])
    assert table["time_to_target_s"].attrs["units"] == "s"
    assert table["energy_to_target_J"].attrs["units"] == "J"
    assert all(table[v].attrs.get("long_name") for v in table.data_vars)
    with pytest.raises(SpecError) as err:
        WC.to_target_table({}, target)
    assert err.value.field == "runs"


# ---------------------------------------------------------------------------------------------
# validation of the timelines


def _without_attrs(ds):
    out = ds.copy()
    out.attrs = {}
    return out


def test_timeline_errors_name_the_field(sync_run, local_runs):
    cases = [
        (lambda: WC.sync_timeline(sync_run, STEP, speeds=[1.0, 1.0]), "speeds"),
        (lambda: WC.sync_timeline(sync_run, STEP, speeds=[1.0, 1.0, 0.0, 1.0]), "speeds"),
        (lambda: WC.sync_timeline(sync_run, STEP, comm_s=-1.0), "comm_s"),
        (lambda: WC.sync_timeline(sync_run, "step"), "step"),
        (lambda: WC.sync_timeline(local_runs[0], STEP), "method"),
        (lambda: WC.local_timeline(sync_run, STEP), "method"),
        (lambda: WC.event_timeline(sync_run, STEP), "method"),
        (lambda: WC.sync_timeline(_without_attrs(sync_run), STEP), "method"),
        (lambda: WC.WorkerStep("m", "s", 0, 1, 1.0, 1.0, 0.0, 1, 2.0), "gpus"),
        (lambda: WC.WorkerStep("m", "s", 1, 1, 0.0, 1.0, 0.0, 1, 2.0), "compute_s"),
    ]
    for call, field in cases:
        with pytest.raises(SpecError) as err:
            call()
        assert err.value.field == field, field
