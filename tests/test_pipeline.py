"""Pipeline-schedule simulator: closed forms, an independent reference, invariants, batch and threads."""

import math

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trainscale.model import pipeline as P
from trainscale.model.specs import SpecError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1"]
times = st.integers(0, 8).map(lambda k: k / 4.0)  # quarter-second steps: sums are exact


def uniform(schedule, p, m, v, f, b, w, send=0.0, act=1.0):
    """Simulate with per-device times f, b, w (split evenly over v chunks)."""
    S = p * v
    return P.simulate(schedule, [f / v] * S, [b / v] * S, [w / v] * S, [send] * (S - 1), [act] * S,
                      micro_batches=m, interleave=v)


def close(a, b, rel=1e-12):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


# --------------------------------------------------------------------------- closed forms

@SETTINGS
@given(p=st.integers(1, 8), m=st.integers(1, 32), f=times, b=times, w=times,
       schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_gpipe_1f1b_equal_closed_form(p, m, f, b, w, schedule):
    r = uniform(schedule, p, m, 1, f, b, w)
    assert close(r.makespan_s, P.closed_form(schedule, f, b, w, p, m))
    assert close(r.makespan_s, (m + p - 1) * (f + b + w))


@SETTINGS
@given(p=st.integers(1, 8), k=st.integers(1, 4), v=st.integers(2, 4), c=st.tuples(times, times, times))
def test_interleaved_equals_closed_form(p, k, v, c):
    m = k * p
    if m > 32:
        m = p * (32 // p)
    fc, bc, wc = c  # per chunk
    f, b, w = v * fc, v * bc, v * wc
    S = p * v
    r = P.simulate("interleaved", [fc] * S, [bc] * S, [wc] * S, micro_batches=m, interleave=v)
    expected = P.closed_form("interleaved", f, b, w, p, m, v)
    assert close(r.makespan_s, expected)
    assert close(expected, m * (f + b + w) + (p - 1) * (f + b + w) / v)


@SETTINGS
@given(p=st.integers(1, 8), extra=st.integers(0, 24), f=times, b=times, frac=st.integers(0, 4))
def test_zb_h1_equals_closed_form(p, extra, f, b, frac):
    m = p + extra  # closed form needs m >= p and w <= min(f, b)
    w = min(f, b) * frac / 4
    r = uniform("zb-h1", p, m, 1, f, b, w)
    assert close(r.makespan_s, P.closed_form("zb-h1", f, b, w, p, m))
    assert close(r.makespan_s, m * (f + b + w) + (p - 1) * (f + b - w))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_closed_form_grid(schedule, p):
    for v in ([2, 3, 4] if schedule == "interleaved" else [1]):
        for m in range(1, 33):
            if schedule == "interleaved" and m % p:
                continue
            if schedule == "zb-h1" and m < p:
                continue
            f, b, w = 1.0, 2.0, 0.75
            r = uniform(schedule, p, m, v, f, b, w)
            assert close(r.makespan_s, P.closed_form(schedule, f, b, w, p, m, v)), (p, m, v)


def test_zb_h1_closed_form_condition_is_stated():
    # outside w <= min(f, b) the deferred W passes do not fit: the simulator is longer
    r = uniform("zb-h1", 2, 2, 1, 1.0, 0.5, 0.8)
    assert r.makespan_s == pytest.approx(5.6)
    assert 2 * 2.3 + 1 * (1.5 - 0.8) == pytest.approx(5.3)
    with pytest.raises(SpecError) as e:
        P.closed_form("zb-h1", 1.0, 0.5, 0.8, 2, 2)
    assert e.value.field == "w"
    with pytest.raises(SpecError):
        P.closed_form("zb-h1", 1.0, 1.0, 1.0, 4, 3)


# --------------------------------------------------------------------------- independent reference

def _ref_kahn(schedule, fwd, bwd, wgrad, send, m, v):
    """A second, test-local reference: per-device sweep over the orders (fixed point), from
    reference_orders, but a different resolution algorithm than both kernel and simulate_reference."""
    S = len(fwd)
    p = S // v
    orders = P.reference_orders(schedule, p, m, v)
    split = schedule == "zb-h1"
    end = {}
    pos = [0] * p
    free = [0.0] * p
    progress = True
    while progress:
        progress = False
        for d in range(p):
            while pos[d] < len(orders[d]):
                op, k, i = orders[d][pos[d]]
                if op == "F":
                    dep = ("F", k - 1, i) if k > 0 else None
                    delay = send[k - 1] if k > 0 else 0.0
                    dur = fwd[k]
                elif op == "B":
                    dep = ("F", k, i) if k == S - 1 else ("B", k + 1, i)
                    delay = 0.0 if k == S - 1 else send[k]
                    dur = bwd[k] if split else bwd[k] + wgrad[k]
                else:
                    dep, delay, dur = ("B", k, i), 0.0, wgrad[k]
                if dep is not None and dep not in end:
                    break
                ready = end[dep] + delay if dep is not None else 0.0
                s = max(free[d], ready)
                end[(op, k, i)] = s + dur
                free[d] = s + dur
                pos[d] += 1
                progress = True
    assert all(pos[d] == len(orders[d]) for d in range(p))
    return max(end.values()), end


@st.composite
def instances(draw):
    schedule = draw(st.sampled_from(SCHEDULES))
    p = draw(st.integers(1, 5))
    v = draw(st.integers(2, 3)) if schedule == "interleaved" else 1
    m = p * draw(st.integers(1, 3)) if schedule == "interleaved" else draw(st.integers(1, 9))
    S = p * v
    arr = lambda n, lo, hi: draw(st.lists(st.floats(lo, hi, allow_nan=False), min_size=n, max_size=n))
    return (schedule, p, v, m, arr(S, 0.01, 3.0), arr(S, 0.01, 3.0), arr(S, 0.0, 2.0), arr(S - 1, 0.0, 1.0),
            arr(S, 0.0, 1e9))


@SETTINGS
@given(instances())
def test_kernel_equals_references(inst):
    schedule, _p, v, m, fwd, bwd, wgrad, send, act = inst
    r = P.simulate(schedule, fwd, bwd, wgrad, send, act, micro_batches=m, interleave=v)
    ref = P.simulate_reference(schedule, fwd, bwd, wgrad, send, act, micro_batches=m, interleave=v)
    assert r.makespan_s == ref["makespan_s"]
    np.testing.assert_allclose(r.busy_s, ref["busy_s"], rtol=1e-12)
    np.testing.assert_allclose(r.peak_activation_bytes, ref["peak_activation_bytes"], rtol=1e-12, atol=1e-3)
    tl = r.timeline
    rows = list(zip(tl["device"], tl["stage"], tl["micro_batch"], tl["op"].astype(str), tl["start_s"], tl["end_s"]))
    assert rows == [tuple(x) for x in ref["timeline"]]  # exact: same max/+ on the same numbers
    makespan, end = _ref_kahn(schedule, fwd, bwd, wgrad, send, m, v)
    assert r.makespan_s == makespan
    for d, k, i, op, _, e in rows:
        assert end[(op, k, i)] == e


# --------------------------------------------------------------------------- invariants

def _check_timeline(r, fwd, bwd, wgrad, send, split):
    tl = r.timeline
    S = len(fwd)
    end = {(o, k, i): e for o, k, i, e in zip(tl["op"].astype(str), tl["stage"], tl["micro_batch"], tl["end_s"])}
    for d, rows in tl.groupby("device"):
        s, e = rows["start_s"].to_numpy(), rows["end_s"].to_numpy()
        assert np.all(s[1:] >= e[:-1])  # one op at a time, in order
        assert np.all(e >= s)
        assert set(rows["stage"] % r.devices) == {d}
    for o, k, i, s, e in zip(tl["op"].astype(str), tl["stage"], tl["micro_batch"], tl["start_s"], tl["end_s"]):
        if o == "F":
            assert e == pytest.approx(s + fwd[k])
            if k > 0:
                assert s >= end[("F", k - 1, i)] + send[k - 1]
        elif o == "B":
            assert e == pytest.approx(s + bwd[k] + (0.0 if split else wgrad[k]))
            assert s >= (end[("F", k, i)] if k == S - 1 else end[("B", k + 1, i)] + send[k])
            assert s >= end[("F", k, i)]
        else:
            assert s >= end[("B", k, i)]
    assert len(tl) == len(end)  # each op exactly once
    assert r.makespan_s == tl["end_s"].max()
    assert np.all(r.idle_s >= 0)


@SETTINGS
@given(instances())
def test_no_overlap_and_dependencies(inst):
    schedule, p, v, m, fwd, bwd, wgrad, send, act = inst
    r = P.simulate(schedule, fwd, bwd, wgrad, send, act, micro_batches=m, interleave=v)
    _check_timeline(r, fwd, bwd, wgrad, send, schedule == "zb-h1")
    assert len(r.timeline) == p * v * m * (3 if schedule == "zb-h1" else 2)
    assert r.bubble_fraction == pytest.approx(1 - r.busy_s.sum() / (p * r.makespan_s))
    assert 0 <= r.bubble_fraction < 1


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (8, 32), (1, 5), (6, 6)])
def test_1f1b_memory_vs_gpipe(p, m):
    act = 3.0e9
    g = uniform("gpipe", p, m, 1, 1.0, 2.0, 0.5, act=act)
    o = uniform("1f1b", p, m, 1, 1.0, 2.0, 0.5, act=act)
    z = uniform("zb-h1", p, m, 1, 1.0, 2.0, 0.5, act=act)
    assert o.peak_activation_bytes[0] == min(p, m) * act
    assert g.peak_activation_bytes[0] == m * act
    np.testing.assert_array_equal(o.peak_activation_bytes, [min(p - d, m) * act for d in range(p)])
    np.testing.assert_array_equal(z.peak_activation_bytes, o.peak_activation_bytes)  # ZB-H1 = 1F1B memory
    assert o.makespan_s == g.makespan_s  # same makespan, less memory


@SETTINGS
@given(p=st.integers(1, 8), m=st.integers(1, 32), f=times, b=times, w=times)
def test_bubble_and_orderings_uniform(p, m, f, b, w):
    if f + b + w == 0:
        return
    o = uniform("1f1b", p, m, 1, f, b, w)
    assert o.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-12, abs=1e-15)
    z = uniform("zb-h1", p, m, 1, f, b, w)
    assert z.makespan_s <= o.makespan_s
    if w > 0 and p > 1 and m >= p and w <= min(f, b):
        assert z.makespan_s < o.makespan_s
    if m % p == 0:
        for v in (2, 3, 4):
            assert uniform("interleaved", p, m, v, f, b, w).makespan_s <= o.makespan_s * (1 + 1e-12)


@SETTINGS
@given(instances(), st.floats(1.0, 10.0))
def test_slower_link_is_never_faster(inst, factor):
    schedule, _p, v, m, fwd, bwd, wgrad, send, act = inst
    fast = P.simulate(schedule, fwd, bwd, wgrad, send, act, micro_batches=m, interleave=v)
    slow = P.simulate(schedule, fwd, bwd, wgrad, [s * factor + 0.1 for s in send], act, micro_batches=m,
                      interleave=v)
    assert slow.makespan_s >= fast.makespan_s


@pytest.mark.parametrize("p,m", [(4, 8), (2, 3), (8, 16)])
def test_uniform_transfer_delays(p, m):
    f, b, c = 1.0, 2.0, 0.25
    # GPipe: the critical path crosses each of the p-1 boundaries twice, once forward, once back
    g = uniform("gpipe", p, m, 1, f, b, 0.0, send=c)
    assert g.makespan_s == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * c, rel=1e-12)
    # 1F1B: device 0's steady state is a loop of p micro-batches through every boundary and back
    # (B(i) -> F(i+p) -> ... -> B(i+p)), so transfers also stretch the steady state
    o = uniform("1f1b", p, m, 1, f, b, 0.0, send=c)
    assert o.makespan_s >= g.makespan_s
    if m >= 2 * p:
        period = max(f + b, (p * (f + b) + 2 * (p - 1) * c) / p)
        assert o.makespan_s >= (m - p) * period


# --------------------------------------------------------------------------- batch and threads

def _batch(schedule, p, v, m, n, seed):
    rng = np.random.default_rng(seed)
    S = p * v
    return {"fwd": rng.uniform(0.1, 2, (n, S)), "bwd": rng.uniform(0.1, 3, (n, S)), "wgrad": rng.uniform(0, 1, (n, S)),
                "send": rng.uniform(0, 0.5, (n, S - 1)), "act_bytes": rng.uniform(1e8, 1e9, (n, S))}


@pytest.mark.parametrize("schedule,p,v,m", [("gpipe", 4, 1, 6), ("1f1b", 5, 1, 12), ("interleaved", 3, 3, 6),
                                            ("zb-h1", 4, 1, 9)])
def test_simulate_many_equals_simulate(schedule, p, v, m):
    args = _batch(schedule, p, v, m, 7, 1)
    batch = P.simulate_many(schedule, **args, micro_batches=m, interleave=v, timeline=True)
    assert batch.ops == p * v * m * (3 if schedule == "zb-h1" else 2)
    for r in range(7):
        one = P.simulate(schedule, *(args[k][r] for k in ("fwd", "bwd", "wgrad", "send", "act_bytes")),
                         micro_batches=m, interleave=v)
        assert batch.makespan_s[r] == one.makespan_s
        assert batch.bubble_fraction[r] == one.bubble_fraction
        np.testing.assert_array_equal(batch.busy_s[r], one.busy_s)
        np.testing.assert_array_equal(batch.idle_s[r], one.idle_s)
        np.testing.assert_array_equal(batch.peak_activation_bytes[r], one.peak_activation_bytes)
        np.testing.assert_array_equal(batch.start_s[r], one.timeline["start_s"].to_numpy())
        np.testing.assert_array_equal(batch.end_s[r], one.timeline["end_s"].to_numpy())
        np.testing.assert_array_equal(batch.op_stage, one.timeline["stage"].to_numpy())
    no_tl = P.simulate_many(schedule, **args, micro_batches=m, interleave=v)
    np.testing.assert_array_equal(no_tl.makespan_s, batch.makespan_s)
    assert no_tl.start_s is None


def test_thread_count_does_not_change_results():
    """The batch is cut into 1, 2 or 3 ranges simulated side by side (200 pipelines: at least
    MIN_ROWS_PER_THREAD a range): the same bytes, the timeline too."""
    from trainscale.kernels import pipeline as KP

    p, v, m, n = 4, 2, 8, 200
    args = _batch("interleaved", p, v, m, n, 2)
    ops = int(KP.ops_per_device(KP.INTERLEAVED, v, m))
    outs = []
    for threads in (1, 2, 3):
        out = (np.empty(n), np.empty(n, np.int64), np.empty((n, p)), np.empty((n, p)), np.empty((n, p, ops)),
               np.empty((n, p, ops)))
        KP.simulate_many(KP.INTERLEAVED, p, v, m, args["fwd"], args["bwd"], args["wgrad"], args["send"],
                         args["act_bytes"], *out, True, threads=threads)
        outs.append(out)
    assert np.all(outs[0][1] == KP.OK)
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            np.testing.assert_array_equal(a, b)
    old = numba.get_num_threads()
    try:  # and through the model's entry point, at Numba's thread counts
        numba.set_num_threads(1)
        one = P.simulate_many("interleaved", **args, micro_batches=m, interleave=v, timeline=True)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = P.simulate_many("interleaved", **args, micro_batches=m, interleave=v, timeline=True)
    finally:
        numba.set_num_threads(old)
    for name in ("makespan_s", "busy_s", "peak_activation_bytes", "start_s", "end_s"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name))
    np.testing.assert_array_equal(one.makespan_s, outs[0][0])


# --------------------------------------------------------------------------- validation and plotting

@pytest.mark.parametrize("kwargs,field", [
    ({"schedule": "pipedream"}, "schedule"),
    ({"schedule": "interleaved", "interleave": 2, "micro_batches": 6, "fwd": [1.0] * 8}, "micro_batches"),
    ({"schedule": "interleaved", "interleave": 1}, "interleave"),
    ({"schedule": "1f1b", "interleave": 2, "fwd": [1.0] * 8}, "interleave"),
    ({"bwd": [1.0, -1.0, 1.0, 1.0]}, "bwd"),
    ({"fwd": [1.0, math.nan, 1.0, 1.0]}, "fwd"),
    ({"send": [0.1] * 4}, "send"),
    ({"wgrad": [0.1] * 3}, "wgrad"),
    ({"act_bytes": [[1.0] * 4]}, "act_bytes"),
    ({"micro_batches": 0}, "micro_batches"),
    ({"fwd": 5.0}, "fwd"),
    ({"interleave": 2, "schedule": "interleaved", "fwd": [1.0] * 5}, "fwd"),
])
def test_validation(kwargs, field):
    base = {"schedule": "1f1b", "fwd": [1.0] * 4, "bwd": [2.0] * 4, "micro_batches": 8, "interleave": 1}
    args = {**base, **kwargs}
    if "fwd" in kwargs and "bwd" not in kwargs and np.ndim(kwargs["fwd"]) == 1:
        args["bwd"] = [2.0] * len(kwargs["fwd"])
    with pytest.raises(SpecError) as e:
        P.simulate(args.pop("schedule"), args.pop("fwd"), args.pop("bwd"), **args)
    assert e.value.field == field


def test_scalars_broadcast_and_defaults():
    r = P.simulate("1f1b", [1.0] * 3, 2.0, micro_batches=4)
    assert r.makespan_s == (4 + 2) * 3.0
    assert np.all(r.peak_activation_bytes == 0)


def test_gantt_draws_every_op():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = uniform("zb-h1", 4, 8, 1, 1.0, 1.0, 1.0)
    fig, ax = plt.subplots()
    assert P.gantt(r, ax) is ax
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == len(r.timeline)
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"F", "B", "W"}
    plt.close(fig)


# --------------------------------------------------------------------------- the performance model uses it
from trainscale.model import perfmodel  # noqa: E402
from trainscale.kernels import layout as KL  # noqa: E402
from trainscale.kernels.pipesplit import chunk_layers, stage_layers  # noqa: E402
from trainscale.model.specs import RunSpec, resolve_model, resolve_system  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 64), pp=st.integers(1, 8), v=st.integers(1, 4))
def test_chunk_layers_agree_with_stage_layers(layers, pp, v):
    if pp * v > layers:
        return
    chunks = chunk_layers(layers, pp, v)
    per_device = chunks.sum(axis=0)
    first, middle, last = stage_layers(layers, pp, v)
    assert chunks.sum() == layers and chunks.min() >= 1 and chunks.max() - chunks.min() <= 1
    assert per_device[0] == first and per_device[-1] == last
    if pp > 2:
        assert per_device[1:-1].max() == middle


@pytest.mark.parametrize("pp, v, micro", [(4, 1, 8), (4, 2, 8), (8, 3, 16), (2, 1, 1)])
def test_simulated_step_equals_closed_form_where_it_is_exact(pp, v, micro):
    """Equal chunks, free links, no output-layer or ZeRO-3 end costs: the simulated pipeline and the
    closed form (m + (p-1)/v) * t agree exactly (the step's other terms, stragglers among them, taken off)."""
    model, system = resolve_model("gpt3-175b"), resolve_system("dgx-a100-80gb")
    plan = perfmodel.PlanSpec(tp=8, pp=pp, dp=1, interleave=v, micro_batch=1, global_batch=micro)
    calib = perfmodel.calibration_vector(system.generation)
    out = perfmodel.plan_vector(model, system, plan, calib)
    for slot in (KL.O_HEAD_FWD, KL.O_HEAD_BWD, KL.O_ENDS, KL.O_P2P):
        out[slot] = 0.0
    per_device = model.layers // pp * (out[KL.O_LAYER_FWD] + out[KL.O_LAYER_BWD])
    closed = (micro + (pp - 1) / v) * per_device
    perfmodel.simulate_pipeline(out, model, plan, calib, system)
    makespan = out[KL.O_STEP] - out[KL.O_DP_EXPOSED] - out[KL.O_OPTIMIZER] - out[KL.O_STRAGGLER]
    assert makespan == pytest.approx(closed, rel=1e-12)
    assert out[KL.O_PP_COMM] == 0.0
    assert out[KL.O_BUBBLE] == pytest.approx((pp - 1) / v * per_device, rel=1e-9)


def test_predict_simulates_pipelines_and_keeps_the_breakdown_whole():
    run = RunSpec.from_dict({"model": "gpt3-175b", "system": "dgx-a100-80gb", "gpus": 64,
                             "plan": {"tp": 8, "pp": 8, "interleave": 3, "global_batch": 64}})
    sim, closed = perfmodel.predict(run), perfmodel.predict(run, pipeline_simulation=False)
    assert sum(sim.breakdown.values()) == pytest.approx(sim.step_time_s, rel=1e-12)
    assert sum(closed.breakdown.values()) == pytest.approx(closed.step_time_s, rel=1e-12)
    # the closed form charges every transfer to every stage; the simulator lets them overlap
    assert sim.breakdown["pp_comm"] < closed.breakdown["pp_comm"]
    assert sim.step_time_s == pytest.approx(closed.step_time_s, rel=0.05)
    assert sim.memory_gib_per_gpu == closed.memory_gib_per_gpu
