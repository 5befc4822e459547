"""Uneven pipeline splits (issue 35, item 1) and the interleaved peak memory per device (item 2).

Megatron-Core's rules for a split (``--decoder-first/last-pipeline-num-layers``,
``--account-for-embedding/loss-in-pipeline-split``; NVIDIA/Megatron-LM d98e8a6,
megatron/core/transformer/transformer_config.py and transformer_block.py) are written twice: as the
kernel the grid runs (:func:`trainscale.kernels.pipesplit.split_reason`) and as the Python check that names
the field (:func:`trainscale.model.specs.split_rule`); the peak a device holds
(:func:`trainscale.kernels.pipesplit.held_layers`) is checked against both pipeline simulators.
"""

import dataclasses
import itertools

import numpy as np
import pytest

from trainscale.model import perfmodel, pipeline, validation

from trainscale.model import planner
from trainscale.kernels import layout as K
from trainscale.kernels.pipesplit import held_layers, split_chunk_layers, split_reason, split_stage_layers
from trainscale.model.specs import RunSpec, SpecError, split_rule, suggest_split

ENDS = {(False, False): 0, (True, False): 1, (False, True): 2, (True, True): 3}


def run_30_layers(interleave=2, **split):
    """A 30-layer GPT (hidden 4096) on pp 4: pp*interleave = 8 does not divide 30."""
    model = {"name": "gpt-30l", "layers": 30, "hidden": 4096, "heads": 32, "vocab": 51200, "seq_len": 2048}
    plan = {"tp": 2, "pp": 4, "interleave": interleave, "micro_batch": 1, "global_batch": 16,
            "recompute": "selective", "sequence_parallel": True, **split}
    return RunSpec.from_dict({"id": "u30", "model": model, "system": "dgx-a100-80gb", "gpus": 16, "plan": plan})


# --------------------------------------------------------------------------- the rules
def test_megatron_refuses_30_layers_on_4x2_and_names_the_split_it_would_build():
    with pytest.raises(SpecError) as err:
        run_30_layers()
    assert err.value.field == "plan.interleave"
    assert "embedding_in_split: true, loss_in_split: true" in str(err.value)
    assert suggest_split(30, 4, 2) == "embedding_in_split: true, loss_in_split: true"
    assert suggest_split(126, 8, 8) == "embedding_in_split: true, loss_in_split: true"
    assert suggest_split(30, 4, 3) == "first_stage_layers: 3, last_stage_layers: 3"  # 3, 12, 12, 3


@pytest.mark.parametrize("split, field, words", [
    ({"first_stage_layers": 3}, "plan.first_stage_layers", "multiple of interleave = 2"),
    ({"first_stage_layers": 6, "last_stage_layers": 6}, "plan.first_stage_layers", "share the other 18 layers"),
    ({"first_stage_layers": 4, "embedding_in_split": True}, "plan.first_stage_layers", "does not combine"),
    ({"embedding_in_split": True}, "plan.embedding_in_split", "layers + ends = 31"),
])
def test_a_split_megatron_core_refuses_names_its_field(split, field, words):
    with pytest.raises(SpecError) as err:
        run_30_layers(**split)
    assert err.value.field == field and words in str(err.value), str(err.value)


def test_the_kernel_rule_agrees_with_the_python_rule():
    """Every split of 8-40 layers over pp 2-5 and v 1-3 (end counts 0-12): the grid's kernel and the
    spec's check accept the same ones."""
    checked = accepted = 0
    for layers, pp, v in itertools.product(range(8, 41), range(2, 6), range(1, 4)):
        if pp * v > layers:
            continue
        for first, last, (emb, loss) in itertools.product(range(0, 13), range(0, 13), ENDS):
            ends = ENDS[(emb, loss)]
            if not (first or last or ends):
                continue
            python_ok = split_rule(layers, pp, v, first, last, emb, loss) is None
            kernel_ok = split_reason(layers, pp, v, first, last, ends) == K.R_OK
            assert python_ok == kernel_ok, (layers, pp, v, first, last, emb, loss)
            checked += 1
            if kernel_ok:
                chunks = split_chunk_layers(layers, pp, v, first, last, ends)
                assert chunks.sum() == layers and chunks.min() >= 1
                assert (chunks == chunks[:, :1]).all() or ends or first or last
                accepted += 1
    assert checked > 100_000 and accepted > 1000, (checked, accepted)


def test_megatron_core_splits_of_published_shapes():
    """Llama 3.1 405B (126 layers) on pp 8, vp 8 with the embedding and loss in the split (CloudAI's
    NeMo 405B recipe sets both): 2 layers per chunk, 1 in the first and in the last chunk."""
    chunks = split_chunk_layers(126, 8, 8, 0, 0, 3)
    assert chunks[0, 0] == 1 and chunks[7, 7] == 1 and (np.delete(chunks.ravel(), [0, 63]) == 2).all()
    assert list(chunks.sum(axis=0)) == [15, 16, 16, 16, 16, 16, 16, 15]
    assert split_stage_layers(30, 4, 2, 0, 0, 3) == (7, 8, 7)
    assert split_chunk_layers(30, 4, 2, 4, 6, 0).tolist() == [[2, 5, 5, 3], [2, 5, 5, 3]]


# --------------------------------------------------------------------------- priced and reported
def test_30_layers_on_4x2_is_priced_and_the_split_reported():
    run = run_30_layers(embedding_in_split=True, loss_in_split=True)
    p = perfmodel.predict(run)
    assert p.fits and np.isfinite(p.step_time_s)
    assert p.stage_layers == [[3, 4], [4, 4], [4, 4], [4, 3]]
    assert p.as_dict()["stage_layers"] == [[3, 4], [4, 4], [4, 4], [4, 3]]
    even = perfmodel.predict(RunSpec.from_dict({"id": "e", "model": dict(name="gpt-32l", layers=32, hidden=4096,
                             heads=32, vocab=51200, seq_len=2048), "system": "dgx-a100-80gb", "gpus": 16,
                             "plan": dict(tp=2, pp=4, interleave=2, global_batch=16, recompute="selective",
                                          sequence_parallel=True)}))
    assert "stage_layers" not in even.as_dict() and even.stage_layers == [[4, 4]] * 4
    # two layers fewer than the even 32: the busiest device is as busy, the step no longer
    assert p.step_time_s < even.step_time_s


@pytest.mark.parametrize("schedule, interleave", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)])
def test_every_schedule_prices_the_split_and_each_device_works_its_layers(schedule, interleave):
    """30 layers on pp 4 (embedding and loss in the split): each device's simulated busy time is its
    layers' forward, backward and weight-gradient time (the last device's output layer on top)."""
    run = run_30_layers(interleave=interleave, embedding_in_split=True, loss_in_split=True)
    st = perfmodel.pipeline_stage_times(run.model, run.system, run.plan)
    chunks = split_chunk_layers(30, 4, interleave, 0, 0, 3)
    r = pipeline.simulate(schedule, st["fwd"], st["bwd"], st["wgrad"], st["send"], st["act_bytes"],
                          micro_batches=run.plan.micro_batches, interleave=interleave)
    per_layer = (st["fwd"][1] + st["bwd"][1] + st["wgrad"][1]) / chunks.ravel()[1]
    head = st["fwd"][-1] + st["bwd"][-1] + st["wgrad"][-1] - chunks.ravel()[-1] * per_layer
    expected = chunks.sum(axis=0) * per_layer * run.plan.micro_batches
    expected[-1] += head * run.plan.micro_batches
    assert r.busy_s == pytest.approx(expected, rel=1e-12)
    assert list(chunks.sum(axis=0)) == [7, 8, 8, 7]
    # the bubble is what the busiest device waits: shorter end stages shorten nobody's critical path
    assert r.makespan_s > expected.max()


# --------------------------------------------------------------------------- memory at depth
def _random_chunks(rng, p, v):
    return rng.integers(1, 5, size=(v, p))


@pytest.mark.parametrize("p, v, m", [(2, 1, 1), (4, 1, 2), (4, 1, 8), (4, 2, 4), (4, 2, 8), (8, 3, 8),
                                     (8, 8, 16), (3, 4, 6), (8, 2, 64)])
def test_held_layers_is_the_simulators_peak_on_every_device(p, v, m):
    """The kernel's peak (replaying the warm-up and one period of the steady state) against the
    discrete-event simulator and the plain-Python reference, on random chunk sizes."""
    rng = np.random.default_rng(p * 100 + v * 10 + m)
    schedule = "1f1b" if v == 1 else "interleaved"
    for _ in range(5):
        chunks = _random_chunks(rng, p, v)
        act = chunks.ravel().astype(float)  # one byte per layer-micro-batch
        sim = pipeline.simulate(schedule, np.ones(p * v), np.ones(p * v), act_bytes=act, micro_batches=m,
                                interleave=v)
        ref = pipeline.simulate_reference(schedule, np.ones(p * v), np.ones(p * v), act_bytes=act,
                                          micro_batches=m, interleave=v)
        for d in range(p):
            assert held_layers(chunks, p, v, m, d) == sim.peak_activation_bytes[d] == ref["peak_activation_bytes"][d]


def test_held_layers_with_equal_chunks_is_megatrons_interleaved_factor():
    """Megatron-LM's theoretical_memory_usage.py: the first device holds p (1 + (p-1)/(p v)) micro-batches
    of its layers; device d holds (p v + p - 2d - 1) chunks, the last (v - 1) p + 1, not one."""
    for p, v in [(4, 2), (8, 8), (16, 3)]:
        chunks = np.full((v, p), 2)
        m = 4 * p
        assert held_layers(chunks, p, v, m, 0) == pytest.approx(2 * v * p * (1 + (p - 1) / (p * v)), rel=1e-12)
        assert held_layers(chunks, p, v, m, p - 1) == 2 * ((v - 1) * p + 1)
        assert held_layers(chunks, p, v, m, 1) == 2 * (p * v + p - 3)


def test_memory_per_device_follows_the_split():
    """30 layers, pp 4, v 2, embedding and loss in the split, against the simulator's peak per device:
    the memory model's activations are the most loaded candidate's simulated peak."""
    run = run_30_layers(embedding_in_split=True, loss_in_split=True)
    st = perfmodel.pipeline_stage_times(run.model, run.system, run.plan)
    sim = pipeline.simulate("interleaved", st["fwd"], st["bwd"], act_bytes=st["act_bytes"],
                            micro_batches=run.plan.micro_batches, interleave=2)
    p = perfmodel.predict(run)
    act_gib = p.memory_breakdown_gib["activations"]
    # the first device (3 + 4 layers, most in flight) holds the most: its simulated peak, to the byte
    assert act_gib * 2**30 == pytest.approx(sim.peak_activation_bytes[0], rel=1e-12)
    assert sim.peak_activation_bytes[0] == sim.peak_activation_bytes.max()


# --------------------------------------------------------------------------- even plans unchanged
# step time (s) and memory (GiB) before uneven splits existed (main at 192858a), to the bit; but Llama 3.1 70B's memory
# since the model keeps no dropout masks for a model without dropout (57.41923522949219 GiB before, 2026-12-07), and
# the step of the two runs with overlapped gradient reduction since it goes in Megatron-Core's buckets, one latency
# each (kernels.dpsync.dp_buckets, 2026-12-07: 14.68567492986278 and 3.403620764199055 s before), and again since a
# fused attention's softmax exponentials are priced (kernels.compute.attention_exp_time, 2026-12-08: 14.685998248618036
# and 3.4402807641990547 s before; the two A100 runs use no fused attention)
BEFORE = {
    "meg21-t1-145.6b": (24.683498079186226, 49.90922546386719),
    "korth22-t5-530b-seqsel": (36.64134431067891, 56.024925231933594),
    "dgxc2504-h100-l31-70b-64g-bf16": (14.86827607028685, 55.96611022949219),
    "meglm-h100-ws-119b": (3.455859462282273, 32.95732539892197),
}


def _published(run_id):
    return next(m.run for m in validation.published_runs() + validation.public_runs() if m.run.id == run_id)


# the calibration those values were priced under (calibration_fitted.yaml before the refit with stragglers): the
# pins compare the pricing code, not the fit; a run is priced with its generation's and stack's values
CALIBRATION_BEFORE = {
    "ampere": {"gemm_peak_efficiency": 0.7472547, "network_efficiency": 0.8012756},
    "hopper": {"gemm_peak_efficiency": 0.598145, "network_efficiency": 0.8587207},
    "nemo": {"compute_efficiency": 1.0584218},
    "megatron": {},
}


@pytest.mark.parametrize("run_id", sorted(BEFORE))
def test_even_published_runs_predict_exactly_what_they_did(run_id):
    run = _published(run_id)
    calibration = {**CALIBRATION_BEFORE[run.system.generation], **CALIBRATION_BEFORE[run.plan.stack],
                   "straggler_spread": 0.0}
    p = perfmodel.predict(run, calibration)
    assert (p.step_time_s, p.memory_gib_per_gpu) == BEFORE[run_id]


def test_an_even_split_given_explicitly_prices_to_the_bit_as_the_default():
    """Megatron 145.6B (80 layers, pp 8, v 2): first and last stage given as their even 10 layers."""
    run = _published("meg21-t1-145.6b")
    assert run.model.layers == 80 and run.plan.pp == 8 and run.plan.interleave == 2
    explicit = dataclasses.replace(run.plan, first_stage_layers=10, last_stage_layers=10)
    a, b = perfmodel.predict(run), perfmodel.predict(RunSpec(id=run.id, model=run.model, system=run.system,
                                                             plan=explicit))
    assert a.as_dict() == b.as_dict()


# --------------------------------------------------------------------------- the search knob
def test_search_with_the_ends_in_the_split_finds_interleaved_plans_of_126_layers():
    """Llama 3.1 405B (126 layers) on 512 H100: with the embedding and loss in the split, pp 8 x v 8
    plans exist for the Megatron stack; without it, they are masked (pp*v must divide 126)."""
    space = {"tp": [8], "pp": [8], "cp": [2], "interleave": [1, 8], "micro_batch": [1],
             "recompute": ["none"], "sequence_parallel": [1], "zero": [1], "flash_attention": [1]}
    plain = perfmodel.evaluate_grid("llama3-405b", "dgx-h100", 512, 256, **space)
    split = perfmodel.evaluate_grid("llama3-405b", "dgx-h100", 512, 256, split_ends=3, **space)
    assert int(plain["reason"].sel(interleave=8).item()) == K.R_UNEVEN_CHUNKS
    assert bool(split["fits"].sel(interleave=8).item()) and split.attrs["split_ends"] == 3
    # pp 8 x v 1 with the ends: (126 + 2) / 8 = 16 per device, 15 on the ends
    assert int(split["reason"].sel(interleave=1).item()) == K.R_OK
    _, ranked = planner.search("llama3-405b", "dgx-h100", 512, 256, space=space, split_ends=3, top=2)
    best = ranked[0]["plan"]
    assert best["interleave"] == 8 and best["embedding_in_split"] and best["loss_in_split"]
    run = RunSpec(id="best", model=perfmodel.resolve_model("llama3-405b"), system=perfmodel.resolve_system("dgx-h100"),
                  plan=perfmodel.plan_from_grid_entry(best, 256))
    run.plan.check_against(run.model)
    assert perfmodel.predict(run).stage_layers[0] == [1] + [2] * 7
    with pytest.raises(SpecError, match="split_ends"):
        perfmodel.evaluate_grid("llama3-405b", "dgx-h100", 512, 256, split_ends=4, **space)


# --------------------------------------------------------------------------- the memory shape, once per layout
def test_pipeline_memory_shape_is_the_per_plan_arithmetic():
    """The search computes a layout's pipeline memory shape once (issue 38 item 5:
    :func:`~trainscale.kernels.memory.pipeline_memory_shape`) instead of per plan: its layers and activation bytes
    of the first, most loaded middle and last device are, to the bit, what ``stage_activation_bytes`` of the
    layout's chunks gives, for even and uneven default splits and every kind of explicit split."""
    from trainscale.kernels.memory import middle_device, pipeline_memory_shape, stage_activation_bytes

    act = 1.2345678901234567e7  # bytes per layer and micro-batch, any float
    shape = np.empty((3, 3), dtype=np.int64)
    checked = 0
    for layers, pp, v, micro in itertools.product((30, 32, 61, 96, 126), (1, 2, 3, 4, 5, 8), (1, 2, 3, 4), (1, 3, 8, 40)):
        if pp * v > layers or (pp == 1 and v > 1):
            continue
        splits = [(0, 0, 0)] + [(f, l, e) for f, l, e in itertools.product((0, v, 2 * v), (0, v, 3 * v), (0, 1, 2, 3))
                                if (f or l or e) and pp > 1 and split_reason(layers, pp, v, f, l, e) == K.R_OK]
        for first, last, ends in splits:
            pipeline_memory_shape(layers, pp, v, micro, first, last, ends, shape)
            if pp == 1:
                assert shape[0, 0] == layers
                continue
            chunks = split_chunk_layers(layers, pp, v, first, last, ends)
            stages = split_stage_layers(layers, pp, v, first, last, ends)
            devices = (0, middle_device(chunks) if pp > 2 else pp - 1, pp - 1)
            for k, d in enumerate(devices):
                a = act * shape[k, 1] * shape[k, 2] if v == 1 else act * shape[k, 1]
                assert shape[k, 0] == stages[k] and a == stage_activation_bytes(act, chunks, pp, v, micro, d)
            checked += 1
    assert checked > 500, checked
