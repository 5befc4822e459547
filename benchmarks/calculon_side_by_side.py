"""trainscale's plan search side by side with Calculon's (issue 38, "What it must show").

Run as ``CALCULON_DIR=/tmp/calculon CALCULON_PYTHON=/tmp/calcvenv/bin/python .venv/bin/python
benchmarks/calculon_side_by_side.py`` (setup and the numbers of one run: ``benchmarks/calculon.md``). Without
Calculon (either variable unset, or not pointing at a Calculon checkout and an interpreter that imports it)
it prints one ``skipped: ...`` line and exits 0.

Setting: GPT-3 175B (Calculon ``models/gpt3-175B.json``, trainscale ``gpt3-175b``) on 64 A100-80GB (Calculon
``systems/a100_80g.json`` with its second memory tier switched off, so that no offloading is searched;
trainscale ``dgx-a100-80gb``), global batch 128 sequences of 2048 tokens. Both sides search only the knobs
both have: tp (1, 2, 4, 8: one NVLink domain), pp (divisors of the 96 blocks), dp (the rest), micro-batch,
interleave, recompute (none / selective = Calculon ``attn_only`` / full), sequence parallelism (Calculon
``tensor_par_comm_type`` ``rs_ag``, else ``ar``) and optimizer sharding (ZeRO-1 = Calculon
``optimizer_sharding``). Off on both sides: flash attention (Calculon has none), TP and DP overlap, offload,
context parallelism; Calculon's ``seq_par_ag_redo`` off, ``fused_activation`` on; Calculon's network
placement (which of its two networks carries tp, pp, dp) is Calculon's choice: every valid placement is priced
and the best kept, for its optimum and for ours alike.

1. Calculon's model searched over that space in one process (``--calculon-worker search``, run by
   ``CALCULON_PYTHON``: Calculon's ``Llm`` compiled and run per execution, logging silenced, micro-batch sizes
   ascending with Calculon's ``--mbs-break`` rule: stop at the first size with no execution that fits). Its
   wall time is Calculon's time to optimum. Its own ``llm-optimal-execution`` enumerates more (placements of
   every dimension, ``p2p_rs_ag``, ``seq_par_ag_redo``, overlap and offload options) and would run far longer
   on one core; its execution count (``-d``) is printed, with the time it would take at the rate measured, and
   with ``CALCULON_NATIVE=1`` it is run too (one worker, ``-v CRITICAL``, ``--mbs-break``; minutes).
2. ``planner.search`` over the same space: warm (a second call in this process), fresh (a new process with the
   Numba cache filled: interpreter start, imports and the search) and cold (a new process with an empty Numba
   cache: JIT compilation as well).
3. Our best plan written as a Calculon execution and priced by Calculon (best placement), then by
   ``calculon llm`` itself as a check; Calculon's optimum priced by ``trainscale predict``.

Prints ``BENCH calculon_optimum_ratio`` (our optimum's sample rate under Calculon's model / Calculon's optimum's;
1 means ours is Calculon's optimum too, the target is >= 0.99) and ``BENCH calculon_time_to_optimum_ratio``
(Calculon's search wall time / ours in a fresh process with the Numba cache filled; ``_warm`` in process,
``_cold`` with an empty cache).

Nothing of Calculon's is copied here: the worker only imports Calculon and calls its public ``Llm`` API.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPUS, GLOBAL_BATCH, LAYERS = 64, 128, 96
TP = (1, 2, 4, 8)
CALC_MODEL, CALC_SYSTEM = "models/gpt3-175B.json", "systems/a100_80g.json"
TS_MODEL, TS_SYSTEM = "gpt3-175b", "dgx-a100-80gb"
RECOMPUTE_TO_CALCULON = {"none": "none", "selective": "attn_only", "full": "full"}
RECOMPUTE_FROM_CALCULON = {v: k for k, v in RECOMPUTE_TO_CALCULON.items()}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def calculon_execution(tp, pp, dp, mb, interleave, recompute, sp, sharding, tn=0, pn=1, dn=1) -> dict:
    """A Calculon execution JSON for a plan of the common space (placement tn/pn/dn: Calculon network index)."""
    return {"num_procs": tp * pp * dp, "tensor_par": tp, "pipeline_par": pp, "data_par": dp,
            "tensor_par_net": tn, "pipeline_par_net": pn, "data_par_net": dn,
            "batch_size": GLOBAL_BATCH, "microbatch_size": mb, "datatype": "float16", "fused_activation": True,
            "attention_type": "multihead", "activation_recompute": recompute, "pipeline_interleaving": interleave,
            "optimizer_sharding": bool(sharding), "tensor_par_comm_type": "rs_ag" if sp and tp > 1 else "ar",
            "tensor_par_overlap": "none", "seq_par_ag_redo": False, "data_par_overlap": False,
            "weight_offload": False, "activations_offload": False, "optimizer_offload": False, "training": True}


# ---------------------------------------------------------------- worker: runs under CALCULON_PYTHON
def _worker(mode: str, calculon_dir: str, arg: str) -> None:
    import logging

    import calculon
    from calculon.llm import Llm
    from calculon.system import System

    logging.getLogger().setLevel(logging.CRITICAL)
    app = Llm.Application(calculon.io.read_json_file(os.path.join(calculon_dir, CALC_MODEL)))
    cfg = calculon.io.read_json_file(os.path.join(calculon_dir, CALC_SYSTEM))
    cfg["mem2"]["GiB"] = 0  # no second memory tier: no offloading
    syst = System(cfg)
    nets = range(syst.num_networks)
    quiet = logging.Logger("quiet")
    quiet.setLevel(logging.CRITICAL)

    def price(exe: dict):
        try:
            model = Llm(app, quiet)
            model.compile(syst, Llm.Execution.from_json(exe))
            model.run(syst)
            return model.get_stats_json(False)
        except Llm.Error:
            return None

    def best_placement(base: dict):
        """(sample rate, execution, stats) of the best valid network placement of ``base``, or None; evaluations."""
        best, count = None, 0
        for tn in (nets if base["tensor_par"] > 1 else [0]):
            for pn in (nets if base["pipeline_par"] > 1 else [0]):
                for dn in (nets if base["data_par"] > 1 else [0]):
                    exe = dict(base, tensor_par_net=tn, pipeline_par_net=pn, data_par_net=dn)
                    count += 1
                    stats = price(exe)
                    if stats is not None and (best is None or stats["sample_rate"] > best[0]):
                        best = (stats["sample_rate"], exe, stats)
        return best, count

    if mode == "price":
        base = json.loads(arg)
        best, _ = best_placement(base)
        print(json.dumps({"sample_rate": best and best[0], "execution": best and best[1],
                          "total_time": best and best[2]["total_time"]}))
        return

    start = time.perf_counter()
    evaluated = good = 0
    best = None
    for tp in TP:
        for pp in [p for p in _divisors(LAYERS) if GPUS % (tp * p) == 0]:
            dp = GPUS // (tp * pp)
            if GLOBAL_BATCH % dp:
                continue
            for interleave in ([1] if pp == 1 else _divisors(LAYERS // pp)):
                for recompute in ("full", "attn_only", "none"):
                    for sharding in ((True, False) if dp > 1 else (False,)):
                        for sp in ((True, False) if tp > 1 else (False,)):
                            for mb in _divisors(GLOBAL_BATCH // dp):
                                base = calculon_execution(tp, pp, dp, mb, interleave, recompute, sp, sharding)
                                found, count = best_placement(base)
                                evaluated += count
                                if found is None:
                                    break  # Calculon's --mbs-break: larger micro-batches need more memory
                                good += 1
                                if best is None or found[0] > best[0]:
                                    best = found
    wall = time.perf_counter() - start
    print(json.dumps({"wall_s": wall, "evaluated": evaluated, "good_plans": good, "sample_rate": best[0],
                      "execution": best[1], "total_time": best[2]["total_time"]}))


# ---------------------------------------------------------------- driver: runs under trainscale's Python
def _run_calculon(python: str, calculon_dir: str, *args: str) -> dict:
    out = subprocess.run([python, __file__, "--calculon-worker", *args], cwd=calculon_dir, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _calculon_llm(python: str, calculon_dir: str, exe: dict) -> float:
    """Sample rate of ``exe`` from Calculon's own ``calculon llm`` command (logging silenced)."""
    with tempfile.TemporaryDirectory() as tmp:
        sys_cfg = json.loads(Path(calculon_dir, CALC_SYSTEM).read_text())
        sys_cfg["mem2"]["GiB"] = 0
        Path(tmp, "sys.json").write_text(json.dumps(sys_cfg))
        Path(tmp, "exe.json").write_text(json.dumps(exe))
        subprocess.run([python, os.path.join(calculon_dir, "bin", "calculon"), "-v", "CRITICAL", "llm", CALC_MODEL,
                        str(Path(tmp, "exe.json")), str(Path(tmp, "sys.json")), str(Path(tmp, "stats.json"))],
                       cwd=calculon_dir, check=True, capture_output=True)
        return json.loads(Path(tmp, "stats.json").read_text())["sample_rate"]


def _native_count(python: str, calculon_dir: str) -> int:
    """Executions Calculon's own ``llm-optimal-execution`` enumerates here (``-d``: loop only, nothing run)."""
    with tempfile.TemporaryDirectory() as tmp:
        sys_cfg = json.loads(Path(calculon_dir, CALC_SYSTEM).read_text())
        sys_cfg["mem2"]["GiB"] = 0
        Path(tmp, "sys.json").write_text(json.dumps(sys_cfg))
        out = subprocess.run([python, os.path.join(calculon_dir, "bin", "calculon"), "llm-optimal-execution", "-d",
                              "-c", "1", "--no-tp-overlap", "--no-dp-overlap", CALC_MODEL, str(GPUS),
                              str(GLOBAL_BATCH), "float16", str(Path(tmp, "sys.json")), str(Path(tmp, "o.json"))],
                             cwd=calculon_dir, check=True, capture_output=True, text=True)
    return int(out.stdout.split("Total executions:")[1].split()[0])


def _native_search(python: str, calculon_dir: str) -> dict:
    """Calculon's own ``llm-optimal-execution`` over its whole space here: one worker (``-c 1``), logging
    silenced (``-v CRITICAL``), ``--mbs-break``, no TP/DP overlap, no second memory tier. Wall seconds, best."""
    with tempfile.TemporaryDirectory() as tmp:
        sys_cfg = json.loads(Path(calculon_dir, CALC_SYSTEM).read_text())
        sys_cfg["mem2"]["GiB"] = 0
        Path(tmp, "sys.json").write_text(json.dumps(sys_cfg))
        start = time.perf_counter()
        subprocess.run([python, os.path.join(calculon_dir, "bin", "calculon"), "-v", "CRITICAL",
                        "llm-optimal-execution", "-c", "1", "-m", "--no-tp-overlap", "--no-dp-overlap", CALC_MODEL,
                        str(GPUS), str(GLOBAL_BATCH), "float16", str(Path(tmp, "sys.json")), str(Path(tmp, "o.json"))],
                       cwd=calculon_dir, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - start
        best = json.loads(Path(tmp, "o.json").read_text())["0"]
    return {"wall_s": wall, "sample_rate": best["stats"]["sample_rate"], "execution": best["execution"]}


def trainscale_space() -> dict:
    from trainscale.model import perfmodel

    pp = [p for p in _divisors(LAYERS) if GPUS % p == 0]
    return {"tp": list(TP), "pp": pp, "cp": [1],
            "interleave": [v for v in _divisors(LAYERS) if v == 1 or 2 * v <= LAYERS],
            "micro_batch": perfmodel.local_batch_divisors(GPUS, GLOBAL_BATCH, list(TP), pp, [1]),
            "recompute": ["none", "selective", "full"], "sequence_parallel": [0, 1], "zero": [0, 1],
            "shard_group": [0], "overlap_grad_reduce": [0], "flash_attention": [0], "tp_comm_overlap": [0]}


def trainscale_search():
    from trainscale.model import planner

    return planner.search(TS_MODEL, TS_SYSTEM, GPUS, GLOBAL_BATCH, top=1, space=trainscale_space())[1][0]


COLD = """
import time; t = time.perf_counter()
import sys; sys.path.insert(0, {here!r})
import calculon_side_by_side as c
c.trainscale_search()
print(time.perf_counter() - t)
"""


def _fresh_search_s() -> tuple[float, float]:
    """Wall seconds of the search in a fresh process (interpreter start, imports, the search), as a user running
    it sees: first with an empty Numba cache (JIT compilation included), then again with the cache that run
    filled (a new shell after ``make setup``)."""
    times = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for _ in range(2):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", COLD.format(here=str(Path(__file__).parent))], env=env,
                           check=True, capture_output=True, text=True)
            times.append(time.perf_counter() - start)
    return times[0], times[1]


def main() -> int:
    calculon_dir, python = os.environ.get("CALCULON_DIR"), os.environ.get("CALCULON_PYTHON")
    if not calculon_dir or not python:
        print("skipped: CALCULON_DIR and CALCULON_PYTHON are not both set (see benchmarks/calculon.md)")
        return 0
    if not Path(calculon_dir, CALC_MODEL).is_file() or not shutil.which(python) or subprocess.run(
            [python, "-c", "import calculon.llm"], cwd=calculon_dir, capture_output=True).returncode:
        print(f"skipped: no Calculon at CALCULON_DIR={calculon_dir} importable by CALCULON_PYTHON={python}")
        return 0

    from trainscale.model import perfmodel

    print(f"setting: {TS_MODEL} on {GPUS} x {TS_SYSTEM} (Calculon {CALC_SYSTEM}, mem2 off), global batch "
          f"{GLOBAL_BATCH}")
    calc = _run_calculon(python, calculon_dir, "search", calculon_dir, "-")
    print(f"calculon optimum: {json.dumps(calc['execution'])}")
    print(f"calculon optimum: {calc['sample_rate']:.4f} samples/s ({calc['total_time']:.3f} s/step); "
          f"{calc['evaluated']} executions priced ({calc['good_plans']} plans fit) in {calc['wall_s']:.1f} s")

    cold_s, fresh_s = _fresh_search_s()
    trainscale_search()  # compiled (cache filled) before the warm timing
    start = time.perf_counter()
    ours = trainscale_search()
    warm_s = time.perf_counter() - start
    plan = ours["plan"]
    print(f"trainscale optimum: {json.dumps(plan)}; {ours['step_time_s']:.3f} s/step predicted")
    exe = calculon_execution(plan["tp"], plan["pp"], plan["dp"], plan["micro_batch"], plan["interleave"],
                             RECOMPUTE_TO_CALCULON[plan["recompute"]], plan["sequence_parallel"], plan["zero"] >= 1)
    priced = _run_calculon(python, calculon_dir, "price", calculon_dir, json.dumps(exe))
    if priced["sample_rate"] is None:
        print("trainscale optimum: Calculon rejects it (no placement fits or is valid)")
        ratio = 0.0
    else:
        check = _calculon_llm(python, calculon_dir, priced["execution"])
        ratio = priced["sample_rate"] / calc["sample_rate"]
        print(f"trainscale optimum under Calculon: {priced['sample_rate']:.4f} samples/s "
              f"({priced['total_time']:.3f} s/step; `calculon llm` gives {check:.4f}); placement "
              f"tp/pp/dp nets {priced['execution']['tensor_par_net']}/{priced['execution']['pipeline_par_net']}/"
              f"{priced['execution']['data_par_net']}")

    ce = calc["execution"]
    reverse = perfmodel.predict({"model": TS_MODEL, "system": TS_SYSTEM, "gpus": GPUS, "plan": {
        "tp": ce["tensor_par"], "pp": ce["pipeline_par"], "dp": ce["data_par"], "cp": 1,
        "global_batch": GLOBAL_BATCH, "micro_batch": ce["microbatch_size"],
        "interleave": ce["pipeline_interleaving"], "recompute": RECOMPUTE_FROM_CALCULON[ce["activation_recompute"]],
        "sequence_parallel": ce["tensor_par_comm_type"] == "rs_ag", "zero": int(ce["optimizer_sharding"]),
        "flash_attention": False, "overlap_grad_reduce": False, "tp_comm_overlap": False}},
        allow_unrunnable=True, warn=False)
    print(f"calculon optimum under trainscale: {reverse.step_time_s:.3f} s/step, "
          f"{reverse.memory_gib_per_gpu:.1f} GiB/GPU, fits {reverse.fits}, unrunnable {reverse.unrunnable}; "
          f"ratio to our optimum {ours['step_time_s'] / reverse.step_time_s:.4f}")

    native = _native_count(python, calculon_dir)
    per_exe = calc["wall_s"] / calc["evaluated"]
    print(f"calculon llm-optimal-execution here enumerates {native} executions: ~{native * per_exe:.0f} s on one "
          f"core at the {per_exe * 1e3:.1f} ms/execution measured")
    print(f"trainscale search: {warm_s:.3f} s warm (in process), {fresh_s:.1f} s in a fresh process with the Numba "
          f"cache filled, {cold_s:.1f} s in a fresh process with an empty cache (JIT compilation)")
    print(f"BENCH calculon_optimum_ratio {ratio:.4f} 1")
    if os.environ.get("CALCULON_NATIVE") == "1":
        nat = _native_search(python, calculon_dir)
        print(f"calculon llm-optimal-execution (one worker): {nat['sample_rate']:.4f} samples/s in "
              f"{nat['wall_s']:.1f} s; optimum {json.dumps(nat['execution'])}")
        if priced["sample_rate"] is not None:
            print(f"BENCH calculon_native_optimum_ratio {priced['sample_rate'] / nat['sample_rate']:.4f} 1")
        print(f"BENCH calculon_native_search_s {nat['wall_s']:.1f} s")
        print(f"BENCH calculon_native_time_to_optimum_ratio {nat['wall_s'] / fresh_s:.1f} x")
    print(f"BENCH calculon_time_to_optimum_ratio {calc['wall_s'] / fresh_s:.2f} x")
    print(f"BENCH calculon_time_to_optimum_ratio_warm {calc['wall_s'] / warm_s:.1f} x")
    print(f"BENCH calculon_time_to_optimum_ratio_cold {calc['wall_s'] / cold_s:.2f} x")
    print(f"BENCH calculon_search_s {calc['wall_s']:.1f} s")
    print(f"BENCH calculon_trainscale_search_warm_s {warm_s:.3f} s")
    print(f"BENCH calculon_trainscale_search_fresh_s {fresh_s:.1f} s")
    print(f"BENCH calculon_trainscale_search_cold_s {cold_s:.1f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--calculon-worker":
        mode, calculon_dir, arg = sys.argv[2:5]
        _worker(mode, calculon_dir, arg)
    else:
        sys.exit(main())
