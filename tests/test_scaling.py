"""Scaling curves (`trainscale scale`, trainscale.model.scaling): the best plan per GPU count at a fixed global batch,
and the throughput per GPU lost to each component of the step."""

import numpy as np
import pytest

from trainscale.model import perfmodel, scaling

from trainscale.model import planner
from trainscale.interface.cli import main
from trainscale.common.io import read_dataset
from trainscale.model.specs import RunSpec, SpecError, resolve_model, resolve_system

MODEL, SYSTEM, BATCH = "llama2-1b", "dgx-h100", 64  # a small dense model: each search takes a fraction of a second
COUNTS = [8, 16, 32]


@pytest.fixture(scope="module")
def curve():
    return scaling.scaling_curve(MODEL, SYSTEM, COUNTS, BATCH)


def test_throughput_per_gpu_is_the_searched_best_plan_priced_by_predict(curve):
    model, system = resolve_model(MODEL), resolve_system(SYSTEM)
    for gpus in COUNTS:
        _, ranked = planner.search(model, system, gpus, BATCH, top=1)
        plan = perfmodel.plan_from_grid_entry(ranked[0]["plan"], BATCH)
        p = perfmodel.predict(RunSpec(id="best", model=model, system=system, plan=plan))
        at = curve.sel(gpus=gpus)
        assert float(at["tokens_per_s_per_gpu"]) == pytest.approx(p.tokens_per_s / gpus, rel=1e-9)
        assert float(at["step_time_s"]) == pytest.approx(p.step_time_s, rel=1e-9)
        assert float(at["mfu"]) == pytest.approx(p.mfu, rel=1e-9)
        assert (int(at["tp"]), int(at["pp"]), int(at["dp"]), int(at["micro_batch"])) == \
            (plan.tp, plan.pp, plan.dp, plan.micro_batch)


def test_each_count_carries_its_best_plans_confidence(curve):
    """The dataset's confidence fields are the search's for the best plan (trainscale.model.confidence), and the flag
    follows from them: MFU above the generation's best measured by more than the left-out error."""
    model, system = resolve_model(MODEL), resolve_system(SYSTEM)
    for gpus in COUNTS:
        _, ranked = planner.search(model, system, gpus, BATCH, top=1)
        conf, at = ranked[0]["confidence"], curve.sel(gpus=gpus)
        assert float(at["left_out_error"]) == pytest.approx(conf["left_out_error"], rel=1e-12)
        assert float(at["best_measured_mfu"]) == pytest.approx(conf["best_measured_mfu"], rel=1e-12)
        expected = float(at["mfu"]) > float(at["best_measured_mfu"]) * (1 + float(at["left_out_error"]))
        assert bool(at["above_best_measured"]) == expected == conf["above_best_measured"]


def test_the_flag_shows_in_the_scale_table():
    """A count whose plan is flagged prints the generation's best measured MFU and the error in 'above best'."""
    from trainscale.interface.cli.search import _scale_above_text

    ds = scaling.scaling_curve(MODEL, SYSTEM, [8], BATCH)
    ds["above_best_measured"].values[0] = False
    assert _scale_above_text(ds, 0) == "-"
    ds["above_best_measured"].values[0] = True
    ds["best_measured_mfu"].values[0], ds["left_out_error"].values[0] = 0.4, 0.05
    assert _scale_above_text(ds, 0) == "gen 40% (+5.0% err)"


def test_causes_add_up_to_the_step_time_they_explain(curve):
    """Each cause's time adds up to the step; what each adds over linear scaling from the baseline adds up to
    the step's excess over linear scaling, and their shares to one minus the scaling efficiency."""
    g0 = curve.attrs["baseline_gpus"]
    assert g0 == COUNTS[0]
    step = curve["step_time_s"].values
    ideal = step[0] * g0 / curve["gpus"].values
    np.testing.assert_allclose(curve["time_s"].sum("cause").values, step, rtol=1e-9)
    np.testing.assert_allclose(curve["added_time_s"].sum("cause").values, step - ideal, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(curve["throughput_loss"].sum("cause").values, 1 - curve["scaling_efficiency"].values,
                               rtol=1e-9, atol=1e-12)
    assert np.all(curve["throughput_loss"].sel(gpus=g0).values == 0)
    any_plan = perfmodel.predict({"model": MODEL, "system": SYSTEM, "gpus": 8, "plan": {"global_batch": BATCH}})
    assert curve["cause"].values.tolist() == list(any_plan.breakdown)  # every component of the step


def test_strong_scaling_never_raises_throughput_per_gpu(curve):
    """A fixed global batch over more GPUs (strong scaling) leaves each GPU a smaller share of the work and
    more communication: on a dense model the best plan's throughput per GPU does not grow, and data-parallel
    communication is what it loses most to here (dp grows with the GPUs, the gradient all-reduce does not
    shrink)."""
    per_gpu = curve["tokens_per_s_per_gpu"].values
    assert np.all(np.diff(per_gpu) <= 0), per_gpu
    assert np.all(curve["scaling_efficiency"].values <= 1 + 1e-12)
    assert np.all(curve["throughput_loss"].sel(cause="dp_comm").values[1:] > 0)


def test_a_count_without_a_plan_is_nan_and_the_baseline_is_the_next():
    """llama2-70b with tp 8 and no ZeRO fits only pipelined over 8 stages: nothing at 8 GPUs."""
    space = {"tp": [8], "pp": [1, 8], "recompute": ["full"], "flash_attention": [1]}
    ds = scaling.scaling_curve("llama2-70b", SYSTEM, [8, 64], 64, space=space)
    assert ds["has_plan"].values.tolist() == [False, True] and ds.attrs["baseline_gpus"] == 64
    assert np.isnan(ds["step_time_s"].values[0]) and np.all(np.isnan(ds["throughput_loss"].values[0]))
    assert ds["tp"].values.tolist() == [-1, 8] and ds["pp"].values.tolist() == [-1, 8]
    assert float(ds["scaling_efficiency"].sel(gpus=64)) == 1.0


def test_the_calibration_reaches_every_plan_priced():
    """With a straggler spread (calibration override) the wait for the slowest rank is priced at every count
    and loses throughput as the ranks grow (its stored value is 0 until the refit)."""
    ds = scaling.scaling_curve(MODEL, SYSTEM, [8, 64], BATCH, calibration={"straggler_spread": 0.01})
    assert np.all(ds["time_s"].sel(cause="straggler").values > 0)
    assert float(ds["throughput_loss"].sel(cause="straggler", gpus=64)) > 0


# --------------------------------------------------------------------------- GPU counts
@pytest.mark.parametrize("text, counts", [
    ("64..512", [64, 128, 256, 512]),
    ("256..16384", [256, 512, 1024, 2048, 4096, 8192, 16384]),
    ("384..1536", [384, 768, 1536]),
    ("8..8", [8]),
    ("256,512,1024", [256, 512, 1024]),
    ("1024, 256", [256, 1024]),
    ("96", [96]),
])
def test_gpu_counts_parse(text, counts):
    assert scaling.parse_gpus(text) == counts


@pytest.mark.parametrize("text", ["64..500", "512..64", "0..8", "a..b", "64-512", "64...512", "", "8,,16", "8,8",
                                  "0,8", "-8", "8.5", "2..2199023255552"])
def test_bad_gpu_counts_name_gpus(text):
    with pytest.raises(SpecError) as err:
        scaling.parse_gpus(text)
    assert err.value.field == "gpus" and "gpus = " in str(err.value)


def test_a_global_batch_no_data_parallel_degree_divides_is_refused():
    with pytest.raises(SpecError) as err:
        scaling.scaling_curve(MODEL, SYSTEM, [8, 16], 12, space={"tp": [1], "pp": [1], "cp": [1]})
    assert err.value.field == "global_batch" and "8 GPUs" in str(err.value) and "8" in err.value.valid


# --------------------------------------------------------------------------- command line
def test_scale_command_prints_a_table_and_writes_a_dataset_with_units(tmp_path, capsys):
    out_path = tmp_path / "curve" / "scale.nc"
    code = main(["scale", "--model", MODEL, "--system", SYSTEM, "--gpus", "8..32", "--global-batch", str(BATCH),
                 "--out", str(out_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [int(r.split()[0]) for r in rows] == COUNTS
    assert "(baseline)" in rows[0] and "dp_comm" in rows[-1]
    ds = read_dataset(out_path)
    assert ds.sizes == {"gpus": 3, "cause": ds.sizes["cause"]} and ds.attrs["baseline_gpus"] == 8
    for name, var in ds.variables.items():
        wanted = ("units", "long_name") if var.dtype.kind in "biufc" else ("long_name",)
        assert all(var.attrs.get(k) for k in wanted), f"{name}: {var.attrs}"
    assert f"{float(ds['tokens_per_s_per_gpu'].sel(gpus=8)):,.0f}" in rows[0]  # the table prints the dataset
    assert not list(out_path.parent.glob(".*.tmp"))  # the atomic writer left no temporary


def test_scale_json_has_every_count(capsys):
    import json

    assert main(["scale", "--model", MODEL, "--system", SYSTEM, "--gpus", "8,16", "--global-batch", str(BATCH),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [c["gpus"] for c in got["counts"]] == [8, 16] and got["baseline_gpus"] == 8
    second = got["counts"][1]
    assert second["plan"]["recompute"] in ("none", "selective", "full")
    assert sum(second["throughput_loss"].values()) == pytest.approx(1 - second["scaling_efficiency"], abs=1e-12)


@pytest.mark.parametrize("args, field", [
    (["--gpus", "64..500", "--global-batch", "64"], "gpus = '64..500' is invalid"),
    (["--gpus", "0,8", "--global-batch", "64"], "gpus = '0,8' is invalid"),
    (["--gpus", "8..16", "--global-batch", "12", "--fix", "tp=1", "pp=1", "cp=1"], "global_batch = 12 is invalid"),
])
def test_scale_rejects_bad_input_in_one_line(capsys, args, field):
    code = main(["scale", "--model", MODEL, "--system", SYSTEM, *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and field in err, err


def test_scale_rejects_a_global_batch_below_one(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["scale", "--model", MODEL, "--system", SYSTEM, "--gpus", "8..16", "--global-batch", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "--global-batch" in err, err
