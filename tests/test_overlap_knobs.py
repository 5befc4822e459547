"""Communication overlap knobs of a plan: tensor-parallel overlap with the GEMMs, ZeRO-3 prefetch,
data-parallel reduction behind the backward pass, context-parallel ring behind attention. Each
reports its exposed time in ``breakdown`` and its total in ``comm_total_s``."""

import pytest

from trainscale import perfmodel
from trainscale.kernels.plan import tp_overlapped_time
from trainscale.specs import SpecError


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
    assert plain.breakdown["tp_comm"] == pytest.approx(plain.comm_total_s["tp_comm"], rel=1e-12)
    assert plain.comm_total_s["tp_comm"] / 8 <= over.breakdown["tp_comm"] * (1 + 1e-12)
    assert over.breakdown["tp_comm"] < plain.breakdown["tp_comm"]


def test_tp_overlap_closed_form():
    # a collective longer than its GEMM exposes the difference, a shorter one a chunk of itself
    assert tp_overlapped_time(4.0, 4, 1.0, 1.0, 10.0, 10.0) == pytest.approx(3.0 + 3.0 + 1.0 + 1.0)
    assert tp_overlapped_time(4.0, 2, 0.0, 0.0, 0.0, 0.0) == pytest.approx(16.0)


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
    plain = perfmodel.predict(_run(zero=zero, dp=8, pp=1, global_batch=64))
    over = perfmodel.predict(_run(zero=zero, dp=8, pp=1, global_batch=64, overlap_grad_reduce=True))
    assert over.step_time_s <= plain.step_time_s * (1 + 1e-12)
    assert over.breakdown["dp_comm"] <= over.comm_total_s["dp_comm"] * (1 + 1e-12)
    assert plain.breakdown["dp_comm"] == pytest.approx(plain.comm_total_s["dp_comm"], rel=1e-9)
