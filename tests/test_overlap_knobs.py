"""Communication overlap knobs of a plan: tensor-parallel overlap with the GEMMs, ZeRO-3 prefetch,
data-parallel reduction behind the backward pass, context-parallel ring behind attention. Each
reports its exposed time in ``breakdown`` and its total in ``comm_total_s``."""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainscale.model import catalog, perfmodel
from trainscale.kernels.collectives import overlapped_exposed
from trainscale.kernels.layer import tp_async_backward_time, tp_overlapped_time
from trainscale.model.specs import SpecError


def _run(**plan):
    base = {"tp": 8, "pp": 4, "global_batch": 256, "micro_batch": 1, "recompute": "selective",
            "sequence_parallel": True, "flash_attention": True}
    base.update(plan)
    gpus = base["tp"] * base["pp"] * base.get("cp", 1) * base.pop("dp", 2)
    return {"id": "k", "model": "llama2-70b", "system": "dgx-h100", "gpus": gpus, "plan": base}


def test_tp_overlap_hides_part_of_the_tensor_parallel_traffic():
    plain = perfmodel.predict(_run())
    over = perfmodel.predict(_run(tp_comm_overlap=True))
    assert over.step_time_s < plain.step_time_s
    # the same traffic, less of it exposed; one chunk of each of the 4 collectives per pass stays exposed
    assert over.comm_total_s["tp_comm"] == pytest.approx(plain.comm_total_s["tp_comm"], rel=1e-12)
    assert plain.comm_total_s["tp_comm"] / 8 <= over.breakdown["tp_comm"] * (1 + 1e-12)
    assert over.breakdown["tp_comm"] < plain.breakdown["tp_comm"]


@pytest.mark.parametrize("stack", ["megatron", "fsdp"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_tp_traffic_without_overlap_is_all_exposed(stack, recompute):
    """Without overlap every TP collective is exposed: the total counts the forward, the backward and
    what the backward recomputes (all of the forward under full recomputation, the stack's share under
    its selective checkpointing: torchtitan's half)."""
    p = perfmodel.predict(_run(stack=stack, recompute=recompute, tp_async_backward=False))
    assert p.breakdown["tp_comm"] > 0.0
    assert p.breakdown["tp_comm"] == pytest.approx(p.comm_total_s["tp_comm"], rel=1e-12)


def test_tp_overlap_closed_form():
    # without slowdown: a collective longer than its GEMM exposes the difference, a shorter one a chunk
    assert tp_overlapped_time(4.0, 4, 1.0, 1.0, 10.0, 10.0, 0.0) == pytest.approx(3.0 + 3.0 + 1.0 + 1.0)
    assert tp_overlapped_time(4.0, 2, 0.0, 0.0, 0.0, 0.0, 0.0) == pytest.approx(16.0)
    # with slowdown s: the three overlapped chunks (3.0) beside a long GEMM cost 3 s / (1 + s) more
    assert tp_overlapped_time(4.0, 4, 10.0, 10.0, 10.0, 10.0, 0.25) == pytest.approx(4 * (1.0 + 3.0 * 0.2))


def test_tp_async_backward_closed_form():
    # no sequence parallelism: the two input-gradient all-reduces beside the weight-gradient GEMMs (half
    # of each column-parallel linear's backward GEMM time)
    assert tp_async_backward_time(2.0, False, 10.0, 1.0, 0.0) == pytest.approx(0.0 + 1.5)
    assert tp_async_backward_time(2.0, False, 10.0, 10.0, 0.25) == pytest.approx(2 * 2.0 * 0.2)
    # sequence parallelism: two blocking all-gathers (half a pair each) and, per column-parallel linear,
    # the re-gather beside the data gradient and the reduce-scatter beside the weight gradient
    assert tp_async_backward_time(2.0, True, 10.0, 1.0, 0.0) == pytest.approx(2.0 + 0.0 + 2 * 0.5)
    assert tp_async_backward_time(2.0, True, 10.0, 10.0, 0.25) == pytest.approx(2.0 + 4 * 1.0 * 0.2)
    assert tp_async_backward_time(2.0, True, 0.0, 0.0, 0.25) == pytest.approx(3 * 2.0)  # nothing to hide behind


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.floats(0.0, 1.0))
def test_tp_async_backward_bounds(c, qkv, fc1, s):
    """Asynchronous all-reduces never expose more than the two blocking ones (2c); with sequence
    parallelism the blocking all-gathers (c) always show and the re-gathers add at most half a pass."""
    plain = tp_async_backward_time(c, False, qkv, fc1, s)
    assert -1e-12 <= plain <= 2.0 * c + 1e-12
    sp = tp_async_backward_time(c, True, qkv, fc1, s)
    assert c - 1e-12 <= sp <= 3.0 * c + 1e-12


@pytest.mark.parametrize("sp", [False, True])
def test_tp_async_backward_in_predict(sp):
    """The plan knob (default: the stack's, on for Megatron-LM): the backward hides part of its tensor-
    parallel traffic; the recomputed forward's stays exposed; with sequence parallelism the backward
    re-gathers each column-parallel input, half a pass more traffic."""
    kw = dict(recompute="full", sequence_parallel=sp, flash_attention=False)
    on = perfmodel.predict(_run(**kw))
    off = perfmodel.predict(_run(tp_async_backward=False, **kw))
    assert perfmodel.predict(_run(tp_async_backward=True, **kw)).step_time_s == on.step_time_s
    assert on.step_time_s < off.step_time_s
    assert on.breakdown["tp_comm"] < off.breakdown["tp_comm"]
    assert on.comm_total_s["tp_comm"] == pytest.approx(off.comm_total_s["tp_comm"] * ((3.5 if sp else 3.0) / 3.0),
                                                        rel=1e-12)
    fsdp = perfmodel.predict(_run(stack="fsdp", **kw))  # PyTorch's TP runs its collectives synchronously
    assert fsdp.breakdown["tp_comm"] == pytest.approx(fsdp.comm_total_s["tp_comm"], rel=1e-12)


def test_overlapped_exposed_closed_form():
    # Lee et al. 2025's setting: work runs 1 + s slower while the collective runs
    assert overlapped_exposed(2.0, 10.0, 0.25) == pytest.approx(2.0 * 0.25 / 1.25)  # long work: c s / (1 + s)
    assert overlapped_exposed(2.0, 0.5, 0.25) == pytest.approx(1.5)  # short work: c - w
    assert overlapped_exposed(0.0, 1.0, 0.25) == 0.0
    assert overlapped_exposed(2.0, 10.0, 0.0) == 0.0


@settings(max_examples=200, deadline=None)
@given(c=st.floats(0.0, 100.0), w=st.floats(0.0, 100.0), s=st.floats(0.0, 1.0))
def test_overlapped_exposed_lies_between_ideal_overlap_and_none(c, w, s):
    """The pair takes at least the longer of the two and at most their sum; the exposed time grows
    with the slowdown."""
    e = overlapped_exposed(c, w, s)
    assert max(0.0, c - w) - 1e-12 <= e <= c + 1e-12
    assert overlapped_exposed(c, w, min(1.0, s + 0.1)) >= e - 1e-12


def test_overlap_slowdown_is_the_sourced_common_value_and_costs_time(monkeypatch):
    cal = catalog.calibration()
    assert cal["common"]["overlap_compute_slowdown"]["value"] == pytest.approx(0.189)  # Lee et al. 2025
    slowed = perfmodel.predict(_run(tp_comm_overlap=True, overlap_grad_reduce=True))
    ideal = copy.deepcopy(cal)
    ideal["common"]["overlap_compute_slowdown"]["value"] = 0.0
    monkeypatch.setattr(catalog, "calibration", lambda: ideal)
    free = perfmodel.predict(_run(tp_comm_overlap=True, overlap_grad_reduce=True))
    assert slowed.step_time_s > free.step_time_s
    assert slowed.breakdown["tp_comm"] > free.breakdown["tp_comm"]
    assert slowed.comm_total_s["tp_comm"] == pytest.approx(free.comm_total_s["tp_comm"], rel=1e-12)


def test_fsdp_reduce_scatter_in_fp32_moves_twice_the_bytes():
    """torchtitan reduces in fp32: the ZeRO-3 / FSDP gradient reduce-scatter carries 4 bytes per
    gradient, the parameter gathers still 2."""
    def run(fp32):
        r = _run(tp=1, pp=1, dp=64, zero=3, global_batch=64, recompute="full")
        r["plan"].update(stack="fsdp", grad_reduce_fp32=fp32)
        return perfmodel.predict(r)

    bf16, fp32 = run(False), run(True)
    # per layer: 3 gathers (forward, recomputed forward, backward) and one reduce-scatter of equal size
    assert fp32.comm_total_s["dp_comm"] == pytest.approx(bf16.comm_total_s["dp_comm"] * 5 / 4, rel=0.02)


def test_tp_overlap_needs_sequence_parallel():
    with pytest.raises(SpecError) as err:
        perfmodel.predict(_run(sequence_parallel=False, tp_comm_overlap=True))
    assert err.value.field == "plan.tp_comm_overlap"


def test_context_parallel_ring_is_reported_even_when_hidden():
    p = perfmodel.predict(_run(tp=8, pp=1, cp=16, dp=1, global_batch=16, recompute="none",
                               **{"micro_batch": 1}))
    assert p.comm_total_s["cp_comm"] > 0.0
    assert 0.0 <= p.breakdown["cp_comm"] <= p.comm_total_s["cp_comm"] * (1 + 1e-12)


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_data_parallel_overlap_exposes_at_most_the_total(zero):
    # ZeRO-3 on the megatron stack is not a plan Megatron-LM runs (data/stack_rules.yaml): priced for the property
    plain = perfmodel.predict(_run(zero=zero, dp=8, pp=1, global_batch=64), allow_unrunnable=True, warn=False)
    over = perfmodel.predict(_run(zero=zero, dp=8, pp=1, global_batch=64, overlap_grad_reduce=True),
                             allow_unrunnable=True, warn=False)
    assert over.step_time_s <= plain.step_time_s * (1 + 1e-12)
    assert over.breakdown["dp_comm"] <= over.comm_total_s["dp_comm"] * (1 + 1e-12)
    assert plain.breakdown["dp_comm"] == pytest.approx(plain.comm_total_s["dp_comm"], rel=1e-9)


def test_overlap_slowdown_is_overridable_per_call():
    """A sweep, or trainscale.model.overlap (which prices each run's contention itself), can set it per call."""
    run = _run(tp_comm_overlap=True, overlap_grad_reduce=True)
    default = perfmodel.predict(run)
    ideal = perfmodel.predict(run, {"overlap_compute_slowdown": 0.0})
    assert ideal.step_time_s < default.step_time_s
    assert perfmodel.predict(run, {"overlap_compute_slowdown": 0.189}).step_time_s == default.step_time_s
    with pytest.raises(SpecError) as err:
        perfmodel.predict(run, {"overlap_slowdown": 0.0})
    assert "overlap_compute_slowdown" in str(err.value)


def test_no_measured_run_exposes_more_than_its_traffic():
    """Exposed communication never exceeds the traffic before overlap, for every published and public
    run (every stack, recompute mode and overlap knob they use): the selective share's TP traffic was
    once left out of the total."""
    from trainscale.model import validation

    runs = validation.measured_runs(None)
    assert len(runs) > 50
    for m in runs:
        p = perfmodel.predict(m.run)
        for kind, total in p.comm_total_s.items():
            assert p.breakdown.get(kind, 0.0) <= total * (1 + 1e-9) + 1e-12, (m.run.id, kind)
