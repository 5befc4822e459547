"""The `trainscale` command line: in-process through `main([...])`, plus one console-script run."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import numpy as np

from trainscale import __version__
from trainscale.model import catalog, perfmodel, validation
from trainscale.interface.cli import main
from trainscale.interface.cli.data import SYSTEM_FIELDS
from trainscale.interface.cli.shared import _clean
from trainscale.model.specs import SystemSpec

ISSUE_RUN = {
    "model": {"layers": 96, "hidden": 12288, "heads": 96, "kv_heads": 96, "ffn_hidden": 49152,
              "ffn_type": "gelu", "vocab": 51200, "seq_len": 2048},
    "system": "dgx-a100-80gb",
    "gpus": 384,
    "plan": {"tp": 8, "pp": 12, "dp": 4, "interleave": 1, "micro_batch": 1, "global_batch": 1536,
             "recompute": "full"},
}

OUTPUT_KEYS = {"id", "step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu",
               "hfu", "memory_gib_per_gpu", "fits", "power_W_per_gpu", "energy_J_per_token", "breakdown"}

SYSTEMS = ["dgx-v100", "dgx-a100-40gb", "dgx-a100-80gb", "jean-zay-a100-80gb", "dgx-h100", "grand-teton-h100-96gb", "dgx-h200", "dgx-b200", "gb200-nvl72",
           "mi300x", "rtx4090-pcie", "rtx3060-pcie", "rtx-a5000-pcie", "rtx2080ti-pcie", "rtx3090-pcie", "rtx-a4000-pcie",
           "a800-pcie", "a800-sxm"]


def write_yaml(tmp_path, doc, name="runs.yaml"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def run_json(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def check_prediction(p):
    assert OUTPUT_KEYS <= set(p)
    assert math.isclose(sum(p["breakdown"].values()), p["step_time_s"], rel_tol=1e-9)
    assert 0 < p["mfu"] < 1 and 0 < p["hfu"] < 1
    assert p["step_time_s"] > 0 and p["tokens_per_s"] > 0 and p["memory_gib_per_gpu"] > 0


# --------------------------------------------------------------------------- predict
def test_predict_two_runs_json(tmp_path, capsys):
    doc = {"runs": [
        {"id": "gpt3-selene", "model": "gpt3-175b", "system": "dgx-a100-80gb", "gpus": 1024,
         "plan": {"tp": 8, "pp": 16, "dp": 8, "global_batch": 1536, "recompute": "full"}},
        {"id": "inline", "model": {"layers": 24, "hidden": 2048, "heads": 16, "ffn_type": "swiglu",
                                   "vocab": 32000, "seq_len": 4096},
         "system": {"name": "dgx-h100", "scale_out_GBps_per_gpu": 25.0, "hbm_capacity_GiB": 96},
         "gpus": 16, "plan": {"tp": 2, "dp": 8, "micro_batch": 2, "global_batch": 256, "recompute": "full"}},
    ]}
    result = run_json(capsys, ["predict", write_yaml(tmp_path, doc), "--json"])
    assert isinstance(result, list) and [p["id"] for p in result] == ["gpt3-selene", "inline"]
    for p in result:
        check_prediction(p)
        assert p["fits"] is True and "reason" not in p
        assert p["hfu"] >= p["mfu"]  # full recompute: hardware FLOPs include the recomputed forward


def test_predict_issue_example_single_run(tmp_path, capsys):
    result = run_json(capsys, ["predict", write_yaml(tmp_path, ISSUE_RUN), "--json"])
    assert isinstance(result, list) and len(result) == 1
    p = result[0]
    assert p["id"] == "0"
    check_prediction(p)
    assert p["fits"] is True
    assert p["hfu"] > p["mfu"]


def test_predict_table(tmp_path, capsys):
    assert main(["predict", write_yaml(tmp_path, {"runs": [ISSUE_RUN, dict(ISSUE_RUN, id="b")]})]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert lines[0].split()[0] == "id" and "MFU" in lines[0]
    assert len(lines) == 4 and lines[2].split()[0] == "0" and lines[3].split()[0] == "b"


def test_predict_not_fitting_is_not_an_error(tmp_path, capsys):
    run = {"id": "big", "model": "llama3-405b", "system": "dgx-a100-40gb", "gpus": 8,
           "plan": {"tp": 8, "global_batch": 8}}
    result = run_json(capsys, ["predict", write_yaml(tmp_path, run), "--json"])
    assert result[0]["fits"] is False
    assert isinstance(result[0]["reason"], str) and result[0]["reason"]


def _run(**changes):
    run = {"id": "x", "model": "llama2-7b", "system": "dgx-a100-80gb", "gpus": 8,
           "plan": {"tp": 8, "global_batch": 8}}
    for key, value in changes.items():
        run[key] = value
    return run


BAD_RUNS = {
    "unknown model": (_run(model="gpt-9000"), ["model", "gpt-9000"]),
    "unknown system": (_run(system="dgx-z9"), ["system", "dgx-z9"]),
    "gpus wrong type": (_run(gpus="many"), ["gpus", "many"]),
    "gpus != tp*pp*dp*cp": (_run(gpus=12, plan={"tp": 8, "dp": 2, "global_batch": 8}), ["gpus", "12"]),
    "tp does not divide heads": (_run(gpus=3, plan={"tp": 3, "global_batch": 8}), ["plan.tp", "3", "heads"]),
    "tp does not divide kv_heads": (_run(model="llama2-70b", gpus=16, plan={"tp": 16, "global_batch": 8}),
                                    ["plan.tp", "16", "kv_heads"]),
    "pp*interleave > layers": (_run(gpus=8, plan={"pp": 8, "interleave": 8, "global_batch": 64}),
                               ["interleave", "8", "layers"]),
    "global batch indivisible": (_run(gpus=8, plan={"dp": 8, "micro_batch": 1, "global_batch": 100}),
                                 ["global_batch", "100"]),
    "unknown plan field": (_run(plan={"tpp": 8, "global_batch": 8}), ["tpp", "8"]),
    "unknown system override": (_run(system={"name": "dgx-a100-80gb", "nvlink_GBps": 900}),
                                ["nvlink_GBps", "900"]),
}


@pytest.mark.parametrize("case", list(BAD_RUNS))
def test_predict_errors(tmp_path, capsys, case):
    bad, expected = BAD_RUNS[case]
    # the bad run comes second: nothing of the good first run may reach stdout
    path = write_yaml(tmp_path, {"runs": [ISSUE_RUN, bad]})
    assert main(["predict", path, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("trainscale: error: run 'x': ")
    for text in expected:
        assert text in lines[0]


@pytest.mark.parametrize("case", ["missing file", "malformed yaml", "list top level", "runs not a list"])
def test_predict_input_errors(tmp_path, capsys, case):
    if case == "missing file":
        path, expected = str(tmp_path / "nope.yaml"), ["nope.yaml", "no such file"]
    elif case == "malformed yaml":
        path, expected = write_yaml(tmp_path, "runs: [\n  {model: gpt3-175b,\n  gpus: : 3\n"), ["runs.yaml", "YAML"]
    elif case == "list top level":
        path, expected = write_yaml(tmp_path, [ISSUE_RUN]), ["runs.yaml", "top level"]
    else:
        path, expected = write_yaml(tmp_path, {"runs": ISSUE_RUN}), ["runs.yaml", "runs"]
    assert main(["predict", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainscale: error: "), err
    for text in expected:
        assert text in lines[0]


def test_non_finite_floats_become_null():
    doc = {"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": -float("inf")}}
    assert json.loads(json.dumps(_clean(doc), allow_nan=False)) == {"a": None, "b": [None, 1.5], "c": {"d": None}}


def test_bad_arguments_exit_2(capsys):
    for argv in (["predict"], ["frobnicate"], ["search", "--model", "llama2-7b"],
                 ["search", "--model", "llama2-7b", "--system", "dgx-h100", "--gpus", "0", "--global-batch", "8"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    capsys.readouterr()


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert __version__ in capsys.readouterr().out


# --------------------------------------------------------------------------- catalogs
def test_systems(capsys):
    rows = run_json(capsys, ["systems", "--json"])
    assert [r["name"] for r in rows] == SYSTEMS
    a100 = rows[SYSTEMS.index("dgx-a100-80gb")]
    assert a100["peak_TFLOPs_bf16"] == pytest.approx(312) and a100["HBM_GiB"] == pytest.approx(80)
    assert main(["systems"]) == 0
    out = capsys.readouterr().out
    for name in SYSTEMS:
        assert name in out


def test_system_fields(capsys):
    rows = run_json(capsys, ["systems", "--fields", "--json"])
    assert [r["field"] for r in rows] == list(SystemSpec.overridable_fields())
    assert all(r["units"] and r["meaning"] for r in rows)
    assert set(SystemSpec.overridable_fields()) <= set(SYSTEM_FIELDS)
    assert main(["systems", "--fields"]) == 0
    assert "scale_out_GBps_per_gpu" in capsys.readouterr().out


def test_models(capsys):
    rows = {r["name"]: r for r in run_json(capsys, ["models", "--json"])}
    for name in ("gpt3-175b", "llama2-7b", "llama2-70b", "llama3-405b"):
        assert name in rows
    assert rows["gpt3-175b"]["params_B"] == pytest.approx(175, rel=0.01)
    assert rows["llama2-70b"]["kv_heads"] == 8
    assert rows["llama3-405b"]["params_B"] == pytest.approx(405, rel=0.02)
    assert main(["models"]) == 0
    assert "llama3-405b" in capsys.readouterr().out


# --------------------------------------------------------------------------- search
def test_search_best_plans_repredict(tmp_path, capsys):
    result = run_json(capsys, ["search", "--model", "llama2-7b", "--system", "dgx-a100-80gb", "--gpus", "64",
                               "--global-batch", "256", "--top", "3", "--json"])
    assert result["plans_evaluated"] >= result["plans_feasible"] > 0
    best = result["best"]
    assert len(best) == 3
    times = [b["step_time_s"] for b in best]
    assert times == sorted(times)
    for b in best:
        p = b["plan"]
        assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == 64
    run = {"id": "best", "model": "llama2-7b", "system": "dgx-a100-80gb", "gpus": 64,
           "plan": dict(best[0]["plan"], global_batch=256)}
    (pred,) = run_json(capsys, ["predict", write_yaml(tmp_path, run), "--json"])
    assert pred["fits"] is True
    assert math.isclose(pred["step_time_s"], best[0]["step_time_s"], rel_tol=1e-9)


def test_search_unknown_model(capsys):
    assert main(["search", "--model", "gpt-9000", "--system", "dgx-h100", "--gpus", "8",
                 "--global-batch", "8"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "gpt-9000" in err


# --------------------------------------------------------------------------- validate / calibrate
def test_validate_published_accuracy(capsys):
    result = run_json(capsys, ["validate", "--json"])
    published = [r for r in result["runs"] if r["dataset"] == "published"]
    assert published
    ape = [abs(r["rel_error"]) for r in published]
    summary = result["summary"]["published"]
    assert summary["runs"] == len(published)
    assert summary["mape"] == pytest.approx(sum(ape) / len(ape), rel=1e-9)
    assert summary["worst"] == pytest.approx(max(ape), rel=1e-9)
    assert summary["mape"] <= 0.10  # the bounds on accuracy are tests/test_validation.py's
    stored = yaml.safe_load(catalog.data_path("calibration_fitted.yaml").read_text())
    size_out = validation.size_out_by_dataset(stored["cross_validation"])["published"]
    assert summary["size_out_mape"] == pytest.approx(size_out["mape"])
    assert summary["cv_mape"] == pytest.approx(stored["cross_validation"]["leave_one_dataset_out"]["published"]["mape"])


def test_validate_table_and_missing_vtrain(tmp_path, capsys):
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "published" in out and "MAPE_%" in out
    assert main(["validate", "--vtrain", str(tmp_path / "absent")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "--vtrain" in err
    assert main(["validate", "--vtrain", str(tmp_path)]) == 2  # a folder without the vTrain files
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "ground_truth_multi.csv" in err


@pytest.mark.slow
def test_calibrate_without_write(capsys):
    """The packaged data is enough to calibrate: no folder outside the project."""
    result = run_json(capsys, ["calibrate", "--json"])
    assert result["written"] is None and result["cross_validation"] is None
    assert {"published", "vtrain-multi", "nemo-hopper", "fsdp-hopper"} <= set(result["errors"])
    assert all(math.isfinite(v) for owners in result["fitted"].values() for params in owners.values()
               for v in params.values())
    for errors in result["errors"].values():
        assert 0 <= errors["mape"] <= errors["worst"]


def test_calibrate_table_prints_both_cross_validations(capsys, monkeypatch):
    """`calibrate --cv` prints each dataset's error left out as a dataset and by size class (the fit and
    the refits are replaced by the stored results: this checks the table, not the fit)."""
    from trainscale.model import calibration

    stored = yaml.safe_load(catalog.data_path("calibration_fitted.yaml").read_text())
    monkeypatch.setattr(calibration, "fit", lambda vtrain=None: {
        "fitted": stored["fitted"], "at_bound": [], "errors": stored["errors_at_fit"], "cost": 0.0,
        "datasets": sorted(stored["errors_at_fit"])})
    monkeypatch.setattr(calibration, "cross_validate", lambda vtrain=None, full=None, progress=None:
                        stored["cross_validation"])
    assert main(["calibrate", "--cv"]) == 0
    out = capsys.readouterr().out
    assert "left-out_MAPE_%" in out and "size-out_MAPE_%" in out
    size_out = validation.size_out_by_dataset(stored["cross_validation"])
    row = next(line for line in out.splitlines() if line.startswith("nemo-hopper "))
    assert f"{100 * size_out['nemo-hopper']['mape']:.4g}" in row


# --------------------------------------------------------------------------- console script
def test_console_script(tmp_path):
    script = Path(sys.executable).parent / "trainscale"
    assert script.exists(), f"console script not installed next to the interpreter: {script}"
    path = write_yaml(tmp_path, ISSUE_RUN)
    proc = subprocess.run([str(script), "predict", path, "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (p,) = json.loads(proc.stdout)
    check_prediction(p)
    # 96 heads, tp 5 (gpus adjusted so that only the head split is wrong)
    bad = write_yaml(tmp_path, dict(ISSUE_RUN, gpus=240, plan=dict(ISSUE_RUN["plan"], tp=5)), "bad.yaml")
    proc = subprocess.run([str(script), "predict", bad], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "plan.tp" in proc.stderr and "5" in proc.stderr


# --------------------------------------------------------------------------- search for planners
def _search_fixed(capsys, run, knobs, async_backward="off"):
    p = run.plan
    return run_json(capsys, ["search", "--model", run.model.name, "--system", run.system.name,
                             "--gpus", str(run.gpus), "--global-batch", str(p.global_batch),
                             "--fix", f"tp={p.tp}", f"pp={p.pp}", "recompute=full", "sequence_parallel=false",
                             "zero=0", "flash_attention=false", "--search", *knobs, "--top", "1",
                             "--tp-async-backward", async_backward, "--json"])


def test_search_with_the_published_plan_fixed_reproduces_megatron_table_1(capsys):
    """Narayanan et al. 2021 Table 1 publishes tp, pp and dp; micro-batch and interleaving are not
    published, so they are searched, with the 2021 code's synchronous backward. The best such plan is
    optimistic by construction; within 15% on average and 20% at worst (4.2% and 6.9% at present;
    searched.searched_dataset, which also keeps the smaller runs' DDP overlap, gives 4.9% and 7.0%)."""
    from trainscale.model import validation

    errors = []
    for m in [m for m in validation.published_runs() if m.run.id.startswith("meg21-t1")]:
        got = _search_fixed(capsys, m.run, ["interleave", "micro_batch"])
        (best,) = got["best"]
        assert (best["plan"]["tp"], best["plan"]["pp"], best["plan"]["dp"]) == (m.run.plan.tp, m.run.plan.pp,
                                                                                  m.run.plan.dp)
        errors.append(best["hardware_tflops_per_gpu"] / m.measured - 1.0)
    errors = np.abs(errors)
    assert len(errors) == 10 and errors.mean() <= 0.15 and errors.max() <= 0.20, errors


def test_search_takes_the_backward_overlap_of_the_code_that_ran(capsys):
    """Table 1's Megatron-LM (2021) all-reduced the backward's TP gradients synchronously
    (``--tp-async-backward off``); today's default overlaps them, which prices the same plan faster."""
    from trainscale.model import validation

    (m,) = [m for m in validation.published_runs() if m.run.id == "meg21-t1-18.4b"]
    off = _search_fixed(capsys, m.run, ["micro_batch"])
    on = _search_fixed(capsys, m.run, ["micro_batch"], async_backward="on")
    default = _search_fixed(capsys, m.run, ["micro_batch"], async_backward="stack")
    assert off["tp_async_backward"] is False and on["tp_async_backward"] is True and default["tp_async_backward"] is None
    assert off["best"][0]["plan"]["tp_async_backward"] is False
    assert on["best"][0]["step_time_s"] < off["best"][0]["step_time_s"]
    assert default["best"][0]["step_time_s"] == on["best"][0]["step_time_s"]


def test_search_takes_spec_files_and_lists_distinct_plans(tmp_path, capsys):
    model = tmp_path / "model.yaml"
    model.write_text("{name: tiny, layers: 8, hidden: 1024, heads: 16, kv_heads: 16, ffn_hidden: 4096, "
                     "ffn_type: gelu, vocab: 32000, seq_len: 1024}\n")
    system = tmp_path / "system.yaml"
    system.write_text("{name: dgx-a100-80gb, scale_out_GBps_per_gpu: 12.5}\n")
    got = run_json(capsys, ["search", "--model", str(model), "--system", str(system), "--gpus", "16",
                            "--global-batch", "64", "--seq-len", "2048", "--stack", "fsdp", "--top", "20", "--json"])
    assert got["seq_len"] == 2048 and got["stack"] == "fsdp" and len(got["best"]) == 20
    keys = {perfmodel.canonical_plan(e["plan"]) for e in got["best"]}
    assert len(keys) == 20  # no plan listed twice under another spelling
    assert all(e["plan"]["stack"] == "fsdp" for e in got["best"])


@pytest.mark.parametrize("args, field", [
    (["--fix", "tp"], "--fix"),
    (["--fix", "bogus=2"], "--fix"),
    (["--fix", "tp=1e400"], "--fix"),
    (["--search", "colour"], "--search"),
])
def test_search_rejects_bad_knobs_in_one_line(capsys, args, field):
    code = main(["search", "--model", "llama2-7b", "--system", "dgx-h100", "--gpus", "8", "--global-batch", "8",
                 *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and field in err, err


def test_search_names_the_reasons_no_plan_is_valid(capsys):
    """Every plan masked: the message gives the grid's reasons with their counts, here Megatron's even
    split of 96 layers over pp 12 x interleave 5 chunks among them (not a claim that no split divides
    the GPUs)."""
    assert main(["search", "--model", "gpt3-175b", "--system", "dgx-a100-80gb", "--gpus", "384",
                 "--global-batch", "1536", "--fix", "tp=8", "pp=12", "interleave=5", "cp=1"]) == 0
    out = capsys.readouterr().out
    assert "no valid plan" in out and "pp*interleave must divide the layers" in out
    assert "fits in memory" not in out.split("no valid plan")[1]


def test_search_says_when_no_split_divides_the_gpus(capsys):
    assert main(["search", "--model", "llama2-7b", "--system", "dgx-h100", "--gpus", "7", "--global-batch", "8",
                 "--fix", "tp=2"]) == 0
    out = capsys.readouterr().out
    assert "no valid plan" in out
