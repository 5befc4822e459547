"""The paper comparisons, judged on the committed full datasets (figures/), and the machinery behind
`make verify`: the verdict rule, the records' file format, and that altering a dataset is caught."""

import math
import shutil
from dataclasses import replace

import numpy as np
import pytest

from trainscale.common import comparison
from trainscale.interface import verify
from trainscale.common import io as tsio
from trainscale.studies import registry
from conftest import REPO_ROOT

STUDIES = verify.study_names(REPO_ROOT / "config" / "config.yaml")


# ----------------------------------------------------------------------------- the verdict rule

@pytest.mark.parametrize("paper, ours, same, verdict", [
    (7.5, 8.1, True, "reproduced"),         # +8%
    (7.5, 9.4, True, "partly"),             # +25.3%: the paper's direction (above 1), too large
    (7.5, 9.3, True, "reproduced"),         # +24%
    (7.5, 8.1, False, "partly"),            # agrees, but in another setting
    (7.5, 0.6, True, "not reproduced"),     # reversed (below the no-effect value 1)
    (7.5, 1.0, True, "not reproduced"),     # no effect
    (7.5, math.nan, True, "not reproduced"),
    (0.8, 0.7, True, "reproduced"),         # a slow-down, within tolerance
    (0.8, 0.5, True, "not reproduced"),     # a slow-down 0.5 / 0.2 = 2.5x the paper's
    (0.8, 0.65, False, "partly"),           # a slow-down 0.35 / 0.2 = 1.75x the paper's, another setting
    (50.0, 1.9, False, "not reproduced"),   # 0.9 / 49 of the paper's speed-up: the right way, 54x too small
    (1.5, 1.6, False, "partly"),            # within 25%, but in another setting
    (2.0, 2.9, True, "partly"),             # +45%, but 1.9 / 1.0 of the paper's effect
    (2.0, 3.1, True, "not reproduced"),     # 2.1 / 1.0 of the paper's effect: more than 2x off
    (0.88, 1.04, True, "not reproduced"),   # within 25% of the paper, but a saving turned into a cost
    (0.88, 1.04, False, "not reproduced"),
])
def test_verdict_follows_from_the_numbers(paper, ours, same, verdict):
    r = comparison.numeric("s", "q", "x", paper_value=paper, paper_setting="p", our_value=ours,
                           our_setting="o", same_setting=same, neutral=1.0)
    assert r.verdict == verdict, r.reason


def test_the_size_test_weighs_the_effect_from_no_effect_not_the_value():
    """1.6x against 1.5x is 1.2 times the paper's effect (partly, by size, at a tolerance that rejects it as a
    number); 1.9x against 50x is 0.018 times it (not reproduced, though the direction is the paper's)."""
    assert comparison.effect_ratio(1.5, 1.6, 1.0) == pytest.approx(1.2)
    near = comparison.numeric("s", "q", "x", paper_value=1.5, paper_setting="p", our_value=1.6, our_setting="o",
                              neutral=1.0, rel_tol=0.05)
    far = comparison.numeric("s", "q", "x", paper_value=50, paper_setting="p", our_value=1.9, our_setting="o",
                             neutral=1.0, same_setting=False)
    assert (near.verdict, far.verdict) == ("partly", "not reproduced")
    assert "1.2x the paper's effect" in near.reason and "more than a factor of 2" in far.reason


def test_a_claim_needing_what_we_do_not_run_is_not_tested_and_counted_apart():
    gpu = comparison.not_tested("s", "GPU over CPU speed-up", "x", paper_value=50, paper_setting="GPU vs CPU",
                                needs="a GPU: this study runs on a CPU", our_value=1.9, our_setting="CPU threads")
    assert gpu.verdict == "not tested" and gpu.reason.startswith("needs a GPU")
    assert comparison.counts([gpu]) == {"reproduced": 0, "partly": 0, "not reproduced": 0, "not tested": 1}


@pytest.mark.parametrize("ours, verdict", [(1.3, "not tested"), (0.9, "not reproduced"), (1.0, "not reproduced"),
                                           (math.nan, "not reproduced")])
def test_a_direction_without_a_size_is_never_partly(ours, verdict):
    r = comparison.directional("s", "q", "x", paper_direction=1, paper_setting="p", our_value=ours,
                               our_setting="o", neutral=1.0)
    assert r.verdict == verdict, r.reason


def test_without_a_neutral_value_only_the_tolerance_decides():
    near = comparison.numeric("s", "q", "%", paper_value=35, paper_setting="p", our_value=30, our_setting="o")
    far = comparison.numeric("s", "q", "%", paper_value=35, paper_setting="p", our_value=20, our_setting="o")
    assert (near.verdict, far.verdict) == ("reproduced", "not reproduced")


@pytest.mark.parametrize("error, same, verdict", [
    (0.04, True, "reproduced"), (0.05, True, "reproduced"), (0.05, False, "partly"), (0.0999, True, "partly"),
    (0.1001, True, "not reproduced"), (math.nan, True, "not reproduced"), (math.inf, True, "not reproduced")])
def test_an_error_bound_is_met_below_it_partly_up_to_twice_it(error, same, verdict):
    record = comparison.within_target("s", "q", "1", target=0.05, target_setting="target", our_value=error,
                                      our_setting="ours", same_setting=same)
    assert record.verdict == verdict
    assert record.paper_value == 0.05


def test_free_parameter_needs_its_sweep_and_records_its_range():
    with pytest.raises(ValueError, match="sweep"):
        comparison.numeric("s", "q", "x", paper_value=2, paper_setting="p", our_value=2, our_setting="o",
                           free_parameter="target 0.2-0.5")
    r = comparison.numeric("s", "q", "x", paper_value=2, paper_setting="p", our_value=2, our_setting="o",
                           free_parameter="target 0.2-0.5", sweep=[3.0, 1.5, math.nan, 2.0])
    assert (r.our_low, r.our_high) == (1.5, 3.0)


def test_records_round_trip_and_malformed_files_name_row_and_column(tmp_path):
    records = [comparison.numeric("s", f"q{i}", "x", paper_value=1.0 + i, paper_setting="p, with comma",
                                  our_value=1.0 / 3 + i, our_setting='o "quoted"', neutral=1.0)
               for i in range(3)]
    path = comparison.write_records(records, tmp_path / "comparison.csv")
    assert comparison.read_records(path) == records
    assert comparison.diff_records(records, comparison.read_records(path)) == []
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2] + [lines[2].replace(",not reproduced,", ",maybe,")]) + "\n")
    with pytest.raises(ValueError) as err:
        comparison.read_records(path)
    assert "row 3" in str(err.value) and "maybe" in str(err.value) and "\n" not in str(err.value)


def test_diff_names_a_moved_value_a_moved_verdict_and_a_missing_claim():
    a = comparison.numeric("s", "speed-up", "x", paper_value=2, paper_setting="p", our_value=2.1,
                           our_setting="o", neutral=1)
    b = comparison.numeric("s", "speed-up", "x", paper_value=2, paper_setting="p", our_value=3.0,
                           our_setting="o", neutral=1)
    problems = comparison.diff_records([b], [a])
    assert any("our_value" in p for p in problems) and any("verdict" in p for p in problems)
    assert comparison.diff_records([a, replace(b, quantity="other")], [a]) == [
        "'other': missing from the committed records"]
    # a last-bit difference (another CPU) is not a difference
    c = replace(a, our_value=a.our_value * (1 + 1e-12))
    assert comparison.diff_records([c], [a]) == []


def test_verify_write_rewrites_stale_records_from_the_datasets_and_nothing_else(tmp_path):
    study = "pruning"
    shutil.copytree(REPO_ROOT / "figures" / study, tmp_path / study, ignore=shutil.ignore_patterns("*.png", "*.ipynb"))
    path = tmp_path / study / comparison.RECORDS_FILE
    stale = [replace(r, our_value=r.our_value * 2) for r in comparison.read_records(path)]
    comparison.write_records(stale, path)
    assert not verify.check_study(study, tmp_path).ok
    assert verify.write_study(study, tmp_path).ok
    assert verify.check_study(study, tmp_path).ok
    (tmp_path / study / "mixing.nc").unlink()  # a dataset missing: nothing is written
    before = path.read_text()
    assert not verify.write_study(study, tmp_path).ok and path.read_text() == before


# ----------------------------------------------------------------------------- the registry

def test_registry_declares_every_study_of_the_config():
    for info in registry.load_all(STUDIES):
        assert info.paper and info.outputs and callable(info.compare)
        assert (REPO_ROOT / info.notebook).is_file()


def test_measured_outputs_are_declared_outputs(monkeypatch):
    """MEASURED (timings of the machine) must name outputs of the study; only distributed-mpc has any."""
    measured = {info.name: info.measured for info in registry.load_all(STUDIES) if info.measured}
    assert set(measured) <= {"distributed-mpc"}
    module = registry.load("distributed-mpc").module
    monkeypatch.setattr(module, "MEASURED", ("no_such_output.nc",))
    with pytest.raises(registry.ConfigError, match="MEASURED"):
        registry.load("distributed-mpc")


def test_every_figure_of_every_study_is_drawn_by_its_module(monkeypatch):
    """Every PNG a study writes is in its FIGURES (drawn from the saved datasets, so verify redraws and checks
    it); a study that drew one in the notebook only is refused, naming the figure."""
    for info in registry.load_all(STUDIES):
        pngs = {name for name in info.outputs if name.endswith(".png")}
        assert pngs and pngs == set(info.figures), info.name
    module = registry.load("job-profile").module
    figures = dict(module.FIGURES)
    del figures["overheads.png"]
    monkeypatch.setattr(module, "FIGURES", figures)
    with pytest.raises(registry.ConfigError, match=r"figures \['overheads.png'\] of its OUTPUTS are not in FIGURES"):
        registry.load("job-profile")


def test_study_parameters_are_checked_with_one_line_naming_the_field():
    import yaml

    config = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    schema = registry.schema_from_file(REPO_ROOT / "config" / "schema.yaml")
    registry.validate_config(config, schema)
    config["studies"]["overlap"]["quick"]["no_such_knob"] = 1
    with pytest.raises(registry.ConfigError) as err:
        registry.validate_config(config, schema)
    assert str(err.value).startswith("config: studies.overlap.quick.no_such_knob: unknown parameter")
    del config["studies"]["overlap"]["quick"]["no_such_knob"]
    config["studies"]["brand-new"] = {"full": {}, "quick": {}}
    with pytest.raises(registry.ConfigError, match=r"no \$defs/params/brand-new"):
        registry.validate_config(config, schema)


# ----------------------------------------------------------------------------- the published figures

@pytest.mark.verify
@pytest.mark.parametrize("study", STUDIES)
def test_committed_comparison_follows_from_the_committed_datasets(study):
    check = verify.check_study(study, REPO_ROOT / "figures")
    assert check.ok, "\n".join(check.problems)
    assert check.records, f"{study} records no claim"


def _perturbed_copy(study, tmp_path):
    """The study's committed folder, with every float variable of every dataset moved by +-10..40%,
    differently per element (so ratios move too); in a dataset without floats, every count moves up by 1-2."""
    target = tmp_path / study
    shutil.copytree(REPO_ROOT / "figures" / study, target, ignore=shutil.ignore_patterns("*.png"))
    rng = np.random.default_rng(0)
    for path in sorted(target.glob("*.nc")):
        ds = tsio.read_dataset(path).load()
        for name, var in ds.data_vars.items():
            if np.issubdtype(var.dtype, np.floating):
                factor = 1.0 + rng.choice([-1, 1], var.shape) * rng.uniform(0.1, 0.4, var.shape)
                ds[name] = var * factor
                ds[name].attrs = var.attrs
            elif np.issubdtype(var.dtype, np.integer) and not any(np.issubdtype(ds[n].dtype, np.floating)
                                                                 for n in ds.data_vars):
                # a dataset of counts only (survey-map): every count moved up by 1 or 2
                ds[name] = var + rng.integers(1, 3, var.shape).astype(var.dtype)
                ds[name].attrs = var.attrs
        ds.to_netcdf(path, engine="h5netcdf")
    return target


@pytest.mark.verify
@pytest.mark.parametrize("study", STUDIES)
def test_an_altered_dataset_fails_verify(study, tmp_path):
    _perturbed_copy(study, tmp_path)
    check = verify.check_study(study, tmp_path)
    assert not check.ok, f"{study}: perturbing every dataset left every committed record unchanged"


@pytest.mark.verify
def test_readme_table_is_generated_from_the_records():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    expected = verify.update_readme(readme, REPO_ROOT / "figures", REPO_ROOT / "config" / "config.yaml")
    assert expected == readme, "the README's generated gallery or comparison table is stale: run make gallery"


def test_notebook_parameters_are_checked_against_the_config_schema():
    schema = REPO_ROOT / "config" / "schema.yaml"
    good = {"vtrain_dir": "pkg/trainscale/data/vtrain", "include_vtrain_single": False, "output_dir": "x"}
    registry.check_notebook_parameters("validation", good, schema)
    with pytest.raises(registry.ConfigError, match=r"^notebook parameter include_vtrain_single: 'badvalue' is not of"):
        registry.check_notebook_parameters("validation", {**good, "include_vtrain_single": "badvalue"}, schema)
    with pytest.raises(registry.ConfigError, match="notebook parameter include_vtrain_single: missing"):
        registry.check_notebook_parameters("validation", {"vtrain_dir": "x"}, schema)


@pytest.mark.workflow
def test_a_wrong_papermill_parameter_stops_the_notebook_with_one_line(tmp_path):
    import subprocess

    from conftest import BIN_DIR

    proc = subprocess.run([str(BIN_DIR / "papermill"), "-k", "python3", "--cwd", str(REPO_ROOT),
                           str(REPO_ROOT / "notebooks" / "validation.ipynb"), str(tmp_path / "out.ipynb"),
                           "-p", "include_vtrain_single", "badvalue", "-p", "output_dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0
    assert "notebook parameter include_vtrain_single: 'badvalue' is not of type 'boolean'" in proc.stdout + proc.stderr
