"""Bad input never hangs, never tracebacks, never passes silently (issue 12, part 6).

Hypothesis generates YAML run files and cluster files with fields of every type and scale (huge and
negative integers, NaN, infinities, strings, lists, nulls, unknown keys) around valid ones. Every
case must end in exit 0 with finite numbers, or exit 2 with one line on stderr naming what is wrong;
an exception escaping the CLI or a case running past its alarm fails the test.
"""

import json
import math
import signal

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainscale.cli import main

CASE_SECONDS = 20  # a case running longer counts as a hang

ODD_NUMBERS = st.sampled_from([0, -1, 1, 2, 3, 7, 8, 64, 1000, 2**31, 2**63, 2**64, 2**70, 0.5, 1e-300, 1e308,
                               312, 312e12, float("nan"), float("inf"), -float("inf"), True, None, "8", [8], {}])
PLAN_KEYS = ["tp", "pp", "dp", "cp", "interleave", "micro_batch", "global_batch", "recompute", "sequence_parallel",
             "zero", "shard_group", "overlap_grad_reduce", "flash_attention", "ep", "tp_comm_overlap", "stack",
             "bogus"]
SYSTEM_KEYS = ["peak_flops_bf16", "hbm_bandwidth_GBps", "hbm_capacity_GiB", "scale_up_GBps_per_gpu",
               "scale_out_GBps_per_gpu", "scale_up_latency_s", "scale_out_latency_s", "tdp_W", "idle_W",
               "gpus_per_node", "scale_up_domain", "scale_out_oversubscription", "latency"]
MODEL_KEYS = ["layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "experts", "top_k"]


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def _run_cli(argv, capsys):
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        code = main(argv)
    except Hang:
        pytest.fail(f"hang (> {CASE_SECONDS} s): {argv}")
    except SystemExit as exc:  # argparse
        code = exc.code
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
    assert code in (0, 2), (code, err[-2000:], doc)
    if code == 2:
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and lines[0].startswith("trainscale"), (err[-2000:], doc)
        assert len(lines[0]) <= 2000, len(lines[0])
    else:
        assert _finite(json.loads(out)), (out[:2000], doc)


@st.composite
def run_docs(draw):
    plan = {"tp": 8, "global_batch": 64}
    for key in draw(st.lists(st.sampled_from(PLAN_KEYS), max_size=3, unique=True)):
        plan[key] = draw(ODD_NUMBERS | st.sampled_from(["full", "none", "nemo", "x"]))
    system = draw(st.sampled_from(["dgx-h100", "dgx-a100-80gb", "no-such-system"]))
    if draw(st.booleans()):
        system = {"name": "dgx-h100"}
        for key in draw(st.lists(st.sampled_from(SYSTEM_KEYS), min_size=1, max_size=2, unique=True)):
            system[key] = draw(ODD_NUMBERS)
    model = draw(st.sampled_from(["llama2-7b", "gpt3-175b"]))
    if draw(st.booleans()):
        model = {"name": "m", "layers": 8, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "ffn_type": "gelu",
                 "vocab": 32000, "seq_len": 1024}
        for key in draw(st.lists(st.sampled_from(MODEL_KEYS), min_size=1, max_size=2, unique=True)):
            model[key] = draw(ODD_NUMBERS)
    gpus = draw(st.sampled_from([64, 8, 0, -8, 2**64, 1e308, "64", None]))
    return {"id": "fuzz", "model": model, "system": system, "gpus": gpus, "plan": plan}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
