"""A plan's knobs left out take its stack's own defaults (data/stack_defaults.yaml), and nothing the
project has measured moves: every measured run gives every such knob itself."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import math
import re
from pathlib import Path

import pytest

from trainscale.interface import cli
from trainscale.model import catalog, plan_spec, specs, validation
from trainscale.model.specs import STACK_DEFAULT_FIELDS, STACKS, PlanSpec, SpecError

PKG = Path(specs.__file__).parents[1]

# The defaults every plan had before they became the stack's (main at 3983b3d): a PlanSpec built
# without these knobs was priced with them.
LEGACY = {"recompute": "full", "flash_attention": False, "zero": 0, "sequence_parallel": False,
          "overlap_grad_reduce": False, "tp_comm_overlap": False}
# Every value unlike LEGACY (and unlike every stack's): a run that read any stack default would change.
OPPOSITE = {"recompute": "selective", "flash_attention": True, "zero": 2, "sequence_parallel": True,
            "overlap_grad_reduce": True, "tp_comm_overlap": True}

# sha256 (first 16 hex digits) of [(run id, repr(PlanSpec)), ...] per dataset, and the run count,
# recorded with main's code at a401533 (PlanSpec with precision and MoE fields), before the stack defaults;
# re-recorded when PlanSpec gained moe_imbalance (default 1.0), overlap_moe_expert_parallel_comm (default False) and
# moe_dispatcher (default 'alltoall'): with that default taken out of each repr, every dataset's hash is the one
# recorded before (checked when re-recorded); bridge-2604 and bridge-2606 re-recorded when 11 of their MoE rows took the
# EP all-to-all overlap their release's config turns on (data/bridge_archive.py EP_A2A_OVERLAP), and bridge-2604 when
# one took its DeepEP dispatcher (MOE_DISPATCHER); re-recorded when PlanSpec gained recompute_modules
# (default ''; the same check) and bridge-2602, -2604, -2606 and -mla when 22 rows took the modules their release's
# config recomputes (RECOMPUTE_MODULES); bridge-2602, -2604, -2606, -blackwell and -hopper when their 17 GPT-OSS rows
# took the unfused rotary kernel (rotary_kernel rotate_half: Megatron-Bridge does not fuse YaRN's rotary embeddings);
# bridge-2602, -2604 and -2606 when 31 MoE rows took the HybridEP dispatcher and 5 H100 Qwen3 rows the EP overlap (and
# one DeepEP) their release's config sets (bridge_archive.py), and bridge-hopper when it gained the MoE guide's row;
# re-recorded when PlanSpec gained cuda_graph_impl (default 'none') and fused_grouped_mlp (default False): with those
# defaults taken out of each repr every dataset's hash is the one recorded before but bridge-2606's, whose 8 GB200
# MXFP8 MoE rows took the full-iteration graphs and fused grouped MLP of their release's config (checked); bridge-mla
# when its 25.11 B200 DeepSeek-V3 row 'w/ MTP' took its recipe's pipeline split (first_stage_layers 4, last 1).
PLAN_HASHES_BEFORE = {
    "bridge-2602": "351e4f91674a364e 33",
    "bridge-2604": "d6849ab7133303af 32",
    "bridge-2606": "65365b34d064525f 11",
    "bridge-blackwell": "95248dc0f35dc556 14",
    "bridge-hopper": "199bd55b4c1179fc 7",
    "bridge-mla": "d98b05bef849bf25 3",
    "calculon": "55897fc4ca8d3d73 8",
    "deepspeed-ampere": "2b3d3e7021ac5615 3",
    "deepspeed-trials": "b1cb8dd5290259bf 39",
    "fsdp-ampere": "0d327d785d93dc66 7",
    "fsdp-compiled": "fd7c6c4eec757ee0 10",
    "fsdp-hopper": "2d1f9bef772d8b55 12",
    "fsdp-mosaic": "6fa01387468b14f5 18",
    "megatron-hopper": "16f1428c84954b99 9",
    "nemo-blackwell": "7f427615565e4be0 7",
    "nemo-hopper": "2f3a1696e7f0678b 14",
    "published": "8065a439f38887b4 21",
    "vtrain-multi": "e926a9bf44d8d8ab 109",
    "vtrain-single": "98624bfbff5af625 1440",
}


def measured_plans() -> dict[str, list[tuple[str, PlanSpec]]]:
    out: dict[str, list] = {}
    for m in validation.measured_runs(validation.vtrain_dir(), include_vtrain_single=True):
        out.setdefault(m.dataset, []).append((m.run.id, m.run.plan))
    out["calculon"] = [(r["plan_id"], validation.calculon_run(r).plan) for r in validation.calculon_rows()]
    return out


def plan_hashes(plans) -> dict[str, str]:
    return {k: hashlib.sha256(json.dumps([(i, repr(p)) for i, p in v]).encode()).hexdigest()[:16] + f" {len(v)}"
            for k, v in sorted(plans.items())}


@pytest.fixture
def table(monkeypatch):
    """Replace the stack defaults of every stack by ``values`` (None: restore the data's)."""
    def use(values):
        monkeypatch.setattr(plan_spec, "_STACK_DEFAULTS", None if values is None else {s: dict(values) for s in STACKS})
    yield use
    monkeypatch.setattr(plan_spec, "_STACK_DEFAULTS", None)


def test_every_measured_plan_is_the_one_main_built():
    assert plan_hashes(measured_plans()) == PLAN_HASHES_BEFORE


@pytest.mark.parametrize("values", [LEGACY, OPPOSITE], ids=["legacy", "opposite"])
def test_no_measured_run_reads_a_stack_default(table, values):
    """Built under the data's defaults, the legacy ones and their opposite, every measured run's plan is
    field-for-field the same: each gives every knob of STACK_DEFAULT_FIELDS itself."""
    ours = measured_plans()
    table(values)
    other = measured_plans()
    assert ours.keys() == other.keys()
    for dataset in ours:
        for (run_id, a), (_, b) in zip(ours[dataset], other[dataset], strict=True):
            assert a == b, (dataset, run_id, {f: (getattr(a, f), getattr(b, f)) for f in STACK_DEFAULT_FIELDS})


def test_package_plans_give_the_knobs_megatrons_defaults_moved():
    """Megatron's defaults differ from the legacy ones in recompute and flash_attention only, so every
    PlanSpec(...) the package (studies, workloads, the search) builds gives both; its other defaults are
    the legacy ones (a change to them must make the studies' plans explicit first)."""
    megatron = specs.stack_defaults()["megatron"]
    moved = {f for f in STACK_DEFAULT_FIELDS if megatron[f] != LEGACY[f]}
    assert moved == {"recompute", "flash_attention"}
    calls = []
    for path in PKG.rglob("*.py"):
        if path.name in ("specs.py", "plan_spec.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # a PlanSpec built only to ask whether the system runs a format (PlanSpec(...).check_precision(system))
        # is never priced: its knobs do not matter
        asked = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "check_precision"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "PlanSpec" \
                    and id(node) not in asked:
                calls.append((f"{path.relative_to(PKG)}:{node.lineno}", {k.arg for k in node.keywords}))
    assert len(calls) >= 9, calls
    for where, keywords in calls:
        assert moved <= keywords, f"{where}: PlanSpec(...) without {sorted(moved - keywords)}"


def test_a_plan_without_knobs_takes_its_stacks_defaults():
    p = PlanSpec(tp=8, global_batch=8)
    assert (p.recompute, p.flash_attention, p.zero, p.sequence_parallel, p.overlap_grad_reduce,
            p.tp_comm_overlap) == ("none", True, 0, False, False, False)
    d = PlanSpec(tp=8, stack="deepspeed")
    assert (d.recompute, d.flash_attention, d.zero, d.sequence_parallel) == ("none", False, 1, False)
    f8, f1 = PlanSpec(tp=8, stack="fsdp"), PlanSpec(tp=1, stack="fsdp")
    assert (f8.recompute, f8.zero, f8.sequence_parallel, f8.overlap_grad_reduce) == ("selective", 3, True, True)
    assert f1.sequence_parallel is False  # "tp>1"
    n = PlanSpec(tp=4, stack="nemo")
    assert (n.zero, n.sequence_parallel, n.tp_comm_overlap, n.overlap_grad_reduce) == (1, True, True, True)
    # tp_comm_overlap needs sequence parallelism: turned off with it
    assert PlanSpec(tp=4, stack="nemo", sequence_parallel=False).tp_comm_overlap is False
    # a given value wins over the stack's
    assert PlanSpec(tp=8, recompute="full", flash_attention=False).recompute == "full"
    # YAML and Python get the same plan; a resolved plan never holds None
    y = PlanSpec.from_dict({"tp": 4, "pp": 2, "global_batch": 64, "stack": "nemo"}, gpus=64)
    assert y == PlanSpec(tp=4, pp=2, dp=8, global_batch=64, stack="nemo")
    assert all(getattr(y, f) is not None for f in STACK_DEFAULT_FIELDS)
    # null in YAML means "not given"
    assert PlanSpec.from_dict({"global_batch": 1, "recompute": None}, gpus=1).recompute == "none"


def test_bad_stack_and_bad_default_data_are_one_line(table, monkeypatch):
    with pytest.raises(SpecError, match=r"plan.stack = 'titan' is invalid; expected one of megatron, deepspeed"):
        PlanSpec(stack="titan")
    table(None)
    bad = {s: {f: {"value": v, "source": "x"} for f, v in LEGACY.items()} for s in STACKS}
    bad["fsdp"]["zero"] = {"value": 4, "source": "x"}
    monkeypatch.setattr(catalog, "stack_defaults", lambda: bad)
    with pytest.raises(SpecError, match=r"stacks.fsdp.zero = .* is invalid; expected \{value, source\}"):
        specs.stack_defaults()
    bad["fsdp"]["zero"] = {"value": 3, "source": ""}
    with pytest.raises(SpecError, match=r"stacks.fsdp.zero"):
        specs.stack_defaults()


def test_every_default_has_a_source_naming_a_file_or_commit():
    data = catalog.stack_defaults()
    assert set(data) == set(STACKS)
    for stack, entry in data.items():
        assert set(entry) == set(STACK_DEFAULT_FIELDS), stack
        for name, item in entry.items():
            assert len(item["source"]) > 40 and any(c in item["source"] for c in ("/", ".py", "docs")), (stack, name)


def test_predict_help_lists_every_plan_field_with_its_unit_and_each_stacks_defaults(capsys):
    assert set(cli.predict.PLAN_FIELDS) == {f.name for f in dataclasses.fields(PlanSpec)}
    with pytest.raises(SystemExit):
        cli.main(["predict", "--help"])
    out = capsys.readouterr().out
    assert re.search(r"^  global_batch +sequences +required ", out, re.M)
    assert re.search(r"^  micro_batch +sequences +1 ", out, re.M)
    assert re.search(r"^  recompute +- +the stack's ", out, re.M)
    assert re.search(r"^  fp8_recipe +- +the format's ", out, re.M)
    assert specs.stack_defaults_text(indent="  ") in out
    assert "recompute            none      none       selective   none" in out
    assert "zero                 0         1          3           1" in out
    assert specs.stack_defaults_text(indent="    ") in PlanSpec.__doc__


def test_the_70b_example_without_knobs_is_priced_as_megatron_runs_it(tmp_path, capsys):
    """Issue 34: the 70B plan without recompute / flash_attention was priced with full recomputation and
    unfused attention (32.47 s, 73.3 GiB). Megatron-LM's defaults recompute nothing, fuse the attention
    and keep the optimizer state on every rank: 1.5-1.8x faster, and about 100 GiB does not fit an 80 GB H100."""
    run = tmp_path / "run.yaml"
    run.write_text("id: r\nmodel: llama2-70b\nsystem: dgx-h100\ngpus: 64\nplan: {tp: 8, pp: 2, global_batch: 256}\n")
    assert cli.main(["predict", str(run), "--json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert r["fits"] is False and "memory" in r["reason"] and r["memory_gib_per_gpu"] > 80 * 1e9 / 2**30
    # as before the change, when the plan says so: full recomputation and unfused attention, 1.5-1.8x slower
    run.write_text("id: r\nmodel: llama2-70b\nsystem: dgx-h100\ngpus: 64\n"
                   "plan: {tp: 8, pp: 2, global_batch: 256, recompute: full, flash_attention: false}\n")
    assert cli.main(["predict", str(run), "--json"]) == 0
    (old,) = json.loads(capsys.readouterr().out)
    assert old["fits"] is True and 1.5 < old["step_time_s"] / r["step_time_s"] < 1.8


def test_search_names_the_stack_it_prices(capsys):
    assert cli.main(["search", "--model", "llama2-7b", "--system", "dgx-a100-80gb", "--gpus", "8",
                     "--global-batch", "64", "--fix", "tp=8", "pp=1", "cp=1", "--top", "1", "--stack", "fsdp"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("llama2-7b on 8 GPUs of dgx-a100-80gb, global batch 64 sequences, stack fsdp; "
                                   "precision bf16")
