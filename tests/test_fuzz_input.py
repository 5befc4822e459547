"""Bad input never hangs, never tracebacks, never passes silently (issue 12, part 6).

Hypothesis generates YAML run files and cluster files with fields of every type and scale (huge and
negative integers, NaN, infinities, strings, lists, nulls, unknown keys) around valid ones. Every
case must end in exit 0 with finite numbers, or exit 2 with one line on stderr naming what is wrong;
an exception escaping the CLI or a case running past its alarm fails the test. Raw YAML texts add
what a mapping cannot hold: duplicate keys, deep nesting, alias bombs, tabs and truncated documents.

The counts (inputs tried, one-line errors, results, tracebacks, hangs, silent) are printed at the end
of the module (``pytest -s``) and written to ``$TRAINSCALE_FUZZ_COUNTS`` when that is set.
"""

import collections
import json
import math
import os
import signal

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainscale.interface.cli import main
from trainscale.model.specs import SystemSpec

H100 = SystemSpec.from_catalog("dgx-h100")

CASE_SECONDS = 20  # a case running longer counts as a hang

ODD_NUMBERS = st.sampled_from([0, -1, 1, 2, 3, 7, 8, 64, 1000, 2**31, 2**63, 2**64, 2**70, 0.5, 1e-300, 1e308,
                               312, 312e12, float("nan"), float("inf"), -float("inf"), True, None, "8", [8], {}])
PLAN_KEYS = ["tp", "pp", "dp", "cp", "interleave", "micro_batch", "global_batch", "recompute", "sequence_parallel",
             "zero", "shard_group", "overlap_grad_reduce", "flash_attention", "ep", "tp_comm_overlap", "stack",
             "tp_async_backward",
             "bogus"]
SYSTEM_KEYS = ["peak_flops_bf16", "hbm_bandwidth_GBps", "hbm_capacity_GiB", "scale_up_GBps_per_gpu",
               "scale_out_GBps_per_gpu", "scale_up_latency_s", "scale_out_latency_s", "tdp_W", "idle_W",
               "gpus_per_node", "scale_up_domain", "scale_out_oversubscription", "latency"]
# factors on a valid value: the edges of each field's range and beyond (a unit slip is 1e-3 or 1e3)
SCALES = st.sampled_from([1, 1, 1, 0.5, 2, 1e-3, 1e3, 1e-12, 1e12, 1e-300, 1e300])
MODEL_KEYS = ["layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "experts", "top_k"]


COUNTS = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    line = ("fuzz counts: " + ", ".join(f"{key} {COUNTS[key]}" for key in
            ("inputs", "one-line errors", "results", "tracebacks", "hangs", "silent")))
    print("\n" + line)
    if os.environ.get("TRAINSCALE_FUZZ_COUNTS"):
        with open(os.environ["TRAINSCALE_FUZZ_COUNTS"], "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def _run_cli(argv, capsys):
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    COUNTS["inputs"] += 1
    try:
        code = main(argv)
    except Hang:
        COUNTS["hangs"] += 1
        pytest.fail(f"hang (> {CASE_SECONDS} s): {argv}")
    except SystemExit as exc:  # argparse
        code = exc.code
    except Exception as exc:  # noqa: BLE001 - an escaping exception is a traceback for the user
        COUNTS["tracebacks"] += 1
        pytest.fail(f"traceback ({type(exc).__name__}: {str(exc)[:300]}): {argv}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, *capsys.readouterr()


def _finite(obj):
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    return True


def _check(code, out, err, doc):
    if code not in (0, 2):
        COUNTS["tracebacks"] += 1
    assert code in (0, 2), (code, err[-2000:], doc)
    if code == 2:
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and lines[0].startswith("trainscale"), (err[-2000:], doc)
        assert len(lines[0]) <= 320, len(lines[0])  # "trainscale: error: " + a message capped at 300
        COUNTS["one-line errors"] += 1
    else:
        result = json.loads(out)
        if not _finite(result) or not result:
            COUNTS["silent"] += 1
        assert _finite(result) and result, (out[:2000], doc)
        warnings = [line for line in err.splitlines() if line]
        assert all(line.startswith("trainscale: warning: ") for line in warnings), err[-2000:]
        COUNTS["results"] += 1


@st.composite
def run_docs(draw):
    plan = {"tp": 8, "global_batch": 64}
    for key in draw(st.lists(st.sampled_from(PLAN_KEYS), max_size=3, unique=True)):
        plan[key] = draw(ODD_NUMBERS | st.sampled_from(["full", "none", "nemo", "x"]))
    system = draw(st.sampled_from(["dgx-h100", "dgx-a100-80gb", "no-such-system"]))
    if draw(st.booleans()):
        system = {"name": "dgx-h100"}
        for key in draw(st.lists(st.sampled_from(SYSTEM_KEYS), min_size=1, max_size=2, unique=True)):
            base = getattr(H100, key, None)
            if draw(st.booleans()) and isinstance(base, (int, float)):
                system[key] = base * draw(SCALES) if base else draw(SCALES)
            else:
                system[key] = draw(ODD_NUMBERS)
    model = draw(st.sampled_from(["llama2-7b", "gpt3-175b"]))
    if draw(st.booleans()):
        model = {"name": "m", "layers": 8, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "ffn_type": "gelu",
                 "vocab": 32000, "seq_len": 1024}
        for key in draw(st.lists(st.sampled_from(MODEL_KEYS), min_size=1, max_size=2, unique=True)):
            model[key] = draw(ODD_NUMBERS | st.sampled_from([1, 2, 4, 16, 64, 2048, 4096, 2**16, 2**20]))
    gpus = draw(st.sampled_from([64, 64, 64, 8, 16, 0, -8, 2**64, 1e308, "64", None]))
    return {"id": "fuzz", "model": model, "system": system, "gpus": gpus, "plan": plan}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=run_docs())
def test_fuzzed_runs_end_in_a_result_or_one_line(tmp_path_factory, capsys, doc):
    path = tmp_path_factory.mktemp("fuzz") / "runs.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    _check(*_run_cli(["predict", str(path), "--json"], capsys), doc)


@st.composite
def cluster_docs(draw):
    groups = [{"name": "a", "system": "dgx-a100-80gb", "nodes": 2}, {"name": "b", "system": "dgx-v100", "nodes": 2}]
    link = {"between": ["a", "b"], "bandwidth_GBps": 12.5, "latency_s": 1e-5}
    target = draw(st.sampled_from(["group", "link", "top"]))
    key = draw(st.sampled_from(["nodes", "name", "system", "bandwidth_GBps", "latency_s", "between", "extra"]))
    value = draw(ODD_NUMBERS | st.sampled_from(["a", ["a", "a"], ["a", "c"]]))
    if target == "group":
        groups[0][key] = value
    elif target == "link":
        link[key] = value
    doc = {"groups": groups, "links": [link]}
    if target == "top":
        doc[draw(st.sampled_from(["groups", "links", "extra"]))] = value
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=cluster_docs(), batch=st.sampled_from(["16", "0", "20000000000000000000", "7"]))
def test_fuzzed_cluster_files_end_in_a_result_or_one_line(tmp_path_factory, capsys, doc, batch):
    path = tmp_path_factory.mktemp("fuzz") / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    _check(*_run_cli(["plan", str(path), "--model", "llama2-7b", "--global-batch", batch, "--json"], capsys), doc)


GOOD_RUN = """id: fuzz
model: llama2-7b
system: dgx-h100
gpus: 64
plan: {tp: 8, global_batch: 64}
"""
GOOD_CLUSTER = """groups:
  - {name: a, system: dgx-a100-80gb, nodes: 2}
  - {name: b, system: dgx-v100, nodes: 2}
links:
  - {between: [a, b], bandwidth_GBps: 12.5, latency_s: 1.0e-5}
"""


def _alias_bomb(levels, width=10):
    lines = ["b0: &b0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


TEXT_EDITS = {
    "duplicate top key": lambda t: t + (t.splitlines() or [""])[0] + "\n",  # an emptied text has no line
    "duplicate inner key": lambda t: t.replace("{", "{tp: 4, tp: 2, " if "tp:" in t else "{name: z, name: y, ", 1),
    "deep list": lambda t: t + "deep: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep mapping": lambda t: t + "deep: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    "deep block": lambda t: t + "deep:\n" + "".join("  " * i + "- \n" for i in range(1, 400)),
    "alias bomb": lambda t: t + _alias_bomb(9),
    "alias bomb used": lambda t: _alias_bomb(8) + t.replace("gpus: 64", "gpus: *b8").replace("nodes: 2}", "nodes: *b8}", 1),
    "long value": lambda t: t.replace("dgx-", "x" * 100_000 + "dgx-", 1),
    "tab indent": lambda t: t.replace("  -", "\t-", 1) + "\tbad: 1\n",
    "truncated": lambda t: t[: len(t) // 2],
    "empty": lambda t: "",
    "binary": lambda t: "\x00\x01\x02",
    "nan link": lambda t: t.replace("12.5", ".nan").replace("1.0e-5", ".nan"),
    "inf link": lambda t: t.replace("12.5", ".inf"),
    "huge int": lambda t: t.replace("64", str(2**70), 1).replace("nodes: 2", f"nodes: {2**70}", 1),
    "anchor merge": lambda t: "base: &base {tp: 8}\n" + t.replace("{tp: 8,", "{<<: *base,", 1),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.sampled_from(sorted(TEXT_EDITS)), min_size=1, max_size=2, unique=True),
       cluster=st.booleans())
def test_fuzzed_yaml_texts_end_in_a_result_or_one_line(tmp_path_factory, capsys, edits, cluster):
    text = GOOD_CLUSTER if cluster else GOOD_RUN
    for edit in edits:
        text = TEXT_EDITS[edit](text)
    path = tmp_path_factory.mktemp("fuzz") / "input.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    argv = (["plan", str(path), "--model", "llama2-7b", "--global-batch", "16", "--json"] if cluster
            else ["predict", str(path), "--json"])
    _check(*_run_cli(argv, capsys), edits)
