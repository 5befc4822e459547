"""The experts' tensor-parallel degree as a searched knob (issue 36 item 4: ``search`` and ``predict`` take the
MoE knobs): the grid, the sparse pricing and the one-pass scan price ``etp`` as ``predict`` does, the default
space of a mixture of experts offers it (as tp, or 1), a search finds ``etp 1`` where it wins, and ``--fix``
takes it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from trainscale.model import perfmodel, searchspace

from trainscale.model import planner
from trainscale.interface.cli import main
from trainscale.model.specs import ModelSpec, resolve_system
from conftest import grid_predictions

H100 = resolve_system("dgx-h100")


def _moe() -> ModelSpec:
    """A small mixture of experts (Qwen3-30B-A3B's layer shape, 8 layers): many small experts, top-8."""
    return ModelSpec(name="moe-etp-test", layers=8, hidden=2048, heads=32, kv_heads=4, kv_channels=128,
                     ffn_hidden=768, vocab=151936, seq_len=4096, ffn_type="swiglu", experts=128, top_k=8)


def _space(**over):
    space = dict(tp=[1, 2, 4], pp=[1, 2], micro_batch=[1, 2], recompute=["none"], sequence_parallel=[1],
                 flash_attention=[1], zero=[1], ep=[1, 4, 8], etp=[0, 1, 2])
    space.update(over)
    return space


def test_grid_prices_etp_as_predict_does():
    """Every finite grid entry over (ep, etp) equals predict of that plan (kernel against its reference)."""
    ds = perfmodel.evaluate_grid(_moe(), H100, 16, 64, stack="megatron", **_space())
    assert perfmodel.grid_axes(ds)[-2:] == ("ep", "etp")
    checked, etps = 0, set()
    for idx, p in grid_predictions(ds, _moe(), H100, 64):
        assert p.step_time_s == pytest.approx(float(ds["step_time_s"].values[idx]), rel=1e-12)
        assert p.memory_gib_per_gpu == pytest.approx(float(ds["memory_gib_per_gpu"].values[idx]), rel=1e-12)
        checked += 1
        etps.add((int(ds["etp"].values[idx[-1]]), int(ds["tp"].values[idx[0]])))
    assert checked > 30 and {(1, 2), (1, 4), (2, 4), (0, 4)} <= etps


def test_an_etp_that_breaks_the_expert_layout_is_masked():
    """ep x etp must divide tp x dp (Megatron-Core's expert groups folded over the tensor- and data-parallel
    ranks): on 8 GPUs with tp 1 (dp 8), ep 8 with etp 2 is structurally invalid, as predict says."""
    ds = perfmodel.evaluate_grid(_moe(), H100, 8, 64, stack="megatron", **_space(tp=[1], pp=[1], ep=[8]))
    bad = ds.sel(tp=1, pp=1, ep=8, etp=2)
    assert not bad["fits"].values.any() and np.isnan(bad["step_time_s"].values).all()
    good = ds.sel(tp=1, pp=1, ep=8, etp=1)
    assert np.isfinite(good["step_time_s"].values).all()


def test_sparse_pricing_and_one_pass_scan_equal_the_dense_grid_with_etp():
    model = _moe()
    space = _space()
    calib = perfmodel.calibration_vector(H100.generation, stack="megatron")
    grid = perfmodel.evaluate_grid(model, H100, 16, 64, stack="megatron", **space)
    prices = searchspace.price_space(model, H100, calib, 16, 64, space)
    n_knob = int(np.prod(prices.knob_shape))
    layout_shape = tuple(len(space[n]) if n in space else 1 for n in searchspace.LAYOUT_AXES)
    layout_flat = np.ravel_multi_index(tuple(prices.layouts.T), layout_shape)
    index = (layout_flat[:, None] * n_knob + np.arange(n_knob)[None, :]).ravel()
    assert np.array_equal(grid["step_time_s"].values.ravel()[index], prices.step_s, equal_nan=True)
    assert np.array_equal(prices.plans_by_reason, np.bincount(grid["reason"].values.ravel(),
                                                              minlength=prices.plans_by_reason.size))
    scan = searchspace.scan_space(model, H100, calib, 16, 64, space, k=5, threads=2)
    flat = prices.feasible
    brute = flat[np.lexsort((flat, prices.step_s[flat]))]
    assert [r[0] for r in scan.ranked()] == brute.tolist()
    assert [e["plan"] for e in searchspace.distinct_plans(scan)] == \
        [e["plan"] for e in perfmodel.rank(grid, 10 ** 6)]


def test_etp_equal_to_tp_is_the_same_plan_as_etp_0():
    """etp 0 means "as tp": a space offering both lists the plan once."""
    model = _moe()
    space = _space(tp=[2], etp=[0, 2])
    calib = perfmodel.calibration_vector(H100.generation, stack="megatron")
    plans = [e["plan"] for e in searchspace.distinct_plans(searchspace.price_space(model, H100, calib, 16, 64, space))]
    assert plans and all(p["etp"] == 0 for p in plans)


def test_default_space_of_a_moe_offers_etp_and_the_search_finds_etp_1_where_it_wins():
    """With the attention split four ways (tp 4), experts whole on each GPU (etp 1, Megatron-Bridge's MoE recipes)
    beat experts split as the attention (etp = tp): no all-gather / reduce-scatter over the expert's tp group and
    GEMMs four times wider. The search, over the default space with tp fixed, returns etp 1 first; fixed to etp 0 it
    is slower."""
    model = _moe()
    space = perfmodel.default_space(model, H100, 64, 512)
    assert space["etp"] == list(perfmodel.EXPERT_TP_CHOICES) == [0, 1]
    _, best = planner.search(model, H100, 64, 512, top=1, space=dict(space, tp=[4]))
    _, as_tp = planner.search(model, H100, 64, 512, top=1, space=dict(space, tp=[4], etp=[0]))
    assert best[0]["plan"]["etp"] == 1 and as_tp[0]["plan"]["etp"] == 0
    assert best[0]["step_time_s"] < 0.9 * as_tp[0]["step_time_s"]


def test_cli_fixes_etp(tmp_path, capsys):
    model = tmp_path / "moe.yaml"
    model.write_text(json.dumps(dataclasses.asdict(_moe())))
    code = main(["search", "--model", str(model), "--system", "dgx-h100", "--gpus", "16", "--global-batch", "64",
                 "--fix", "tp=2", "pp=1", "etp=1", "--top", "2", "--json"])
    assert code == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best and all(row["plan"]["etp"] == 1 and row["plan"]["tp"] == 2 for row in best)
    code = main(["search", "--model", str(model), "--system", "dgx-h100", "--gpus", "16", "--global-batch", "64",
                 "--fix", "etp=-1"])
    assert code != 0


def test_the_table_says_etp_as_tp_in_words(tmp_path, capsys):
    """The search table shows etp 0 as "tp" (the JSON keeps the plan field's 0)."""
    model = tmp_path / "moe.yaml"
    model.write_text(json.dumps(dataclasses.asdict(_moe())))
    code = main(["search", "--model", str(model), "--system", "dgx-h100", "--gpus", "16", "--global-batch", "64",
                 "--fix", "tp=2", "pp=1", "etp=0", "--top", "1"])
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("rank"))
    columns, row = lines[header].split(), lines[header + 2].split()
    assert code == 0 and row[columns.index("etp")] == "tp"
