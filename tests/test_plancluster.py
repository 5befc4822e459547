"""`trainscale plan-cluster` and trainscale.model.plancluster: each cluster size's best runnable plan, its time, GPU-hours
and energy to train a token budget, and the Pareto front of the three (issue 38 item 6)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import json

from trainscale.interface import cli
from trainscale.common import io
from trainscale.model import perfmodel, plancluster
from trainscale.model import planner
from trainscale.model.plancluster import pareto_front
from trainscale.model.specs import RunSpec, SpecError, resolve_system
from trainscale.model.stackrules import broken_rules

MODEL, SYSTEM, TOKENS, GLOBAL_BATCH = "llama2-7b", "dgx-h100", 2e12, 512


# --------------------------------------------------------------------------- the Pareto helper
@pytest.mark.parametrize("points, front", [
    ([[1, 3], [2, 2], [3, 1], [3, 3]], [True, True, True, False]),  # (3, 3): every other one beats it
    ([[1, 1], [1, 1]], [True, True]),  # equal points do not dominate each other
    ([[1, 1], [1, 2]], [True, False]),  # no worse in all, better in one
    ([[1, 2, 3], [1, 2, 3], [0, 2, 3]], [False, False, True]),  # ties are dominated together
    ([[np.nan, 0], [1, 1]], [False, True]),  # a NaN row: never on the front, dominates nothing
    ([[5]], [True]),
    ([[3], [1], [2]], [False, True, False]),  # one cost: only the minimum
])
def test_pareto_front_on_constructed_cases(points, front):
    assert pareto_front(np.array(points, dtype=float)).tolist() == front


def test_pareto_front_of_nothing_is_empty():
    assert pareto_front(np.empty((0, 3))).tolist() == []


def _dominates(a, b):
    return bool(np.all(a <= b) and np.any(a < b))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 12), st.integers(1, 3)),
                  elements=st.sampled_from([0.0, 1.0, 2.0, 3.0, 1e9, np.nan])))
def test_pareto_front_invariants(points):
    """No front point is dominated; every other finite point is dominated by some front point."""
    front = pareto_front(points)
    finite = ~np.isnan(points).any(axis=1)
    assert not front[~finite].any()
    for i in np.flatnonzero(finite):
        dominated_by = [j for j in np.flatnonzero(finite) if _dominates(points[j], points[i])]
        if front[i]:
            assert not dominated_by, (points, i)
        else:
            assert any(front[j] for j in dominated_by), (points, i)


# --------------------------------------------------------------------------- input
@pytest.mark.parametrize("text, sizes", [
    ("256..8192", [256, 512, 1024, 2048, 4096, 8192]),
    ("64,128,256", [64, 128, 256]),
    ("512, 96, 128..256", [96, 128, 256, 512]),
    ("1..1", [1]),
    ([8, 4], [4, 8]),
    (16, [16]),
])
def test_parse_gpus(text, sizes):
    assert plancluster.parse_gpus(text) == sizes


@pytest.mark.parametrize("text, words", [
    ("0", "0 is not a size"), ("-8", "'-8' is not a size"), ("abc", "'abc' is not a size"),
    ("64,", "an empty size"), ("64,64", "64 appears twice"), ("64,32..128", "64 appears twice"),
    ("100..300", "START times a power of two"), ("512..256", "0 < START <= STOP"), (str(2**21), "is not a size"),
    ([], "GPU counts"), ([True], "not a size"), (2.0, "GPU counts"),
])
def test_parse_gpus_names_what_is_wrong(text, words):
    with pytest.raises(SpecError) as err:
        plancluster.parse_gpus(text)
    assert err.value.field == "gpus" and words in str(err.value) and "256..8192" in str(err.value)


@pytest.mark.parametrize("value", ["abc", "-1", 0, "nan", "inf", True, None])
def test_parse_tokens_wants_a_positive_finite_number(value):
    with pytest.raises(SpecError, match="tokens = .* is invalid; expected a positive finite number"):
        plancluster.parse_tokens(value)


# --------------------------------------------------------------------------- the sizes
@pytest.fixture(scope="module")
def front():
    """1 GPU (llama2-7b's optimizer states do not fit, so no plan) and 64 to 256 GPUs."""
    return plancluster.cluster_front(MODEL, SYSTEM, "1,64..256", TOKENS, GLOBAL_BATCH)


def _plan(ds, i):
    entry = {name: int(ds[name].values[i]) for name, _, _ in plancluster.KNOBS}
    entry["recompute"] = str(ds["recompute"].values[i])
    entry["stack"] = ds.attrs["stack"]
    return perfmodel.plan_from_grid_entry(entry, ds.attrs["global_batch"])


def test_a_size_without_plan_is_nan_and_says_why(front):
    one = front.sel(gpus=1)
    assert not bool(one["has_plan"]) and not bool(one["on_front"])
    for name in ("time_to_train_days", "gpu_hours", "energy_MWh", "tokens_per_s", "tp", "dp"):
        assert np.isnan(float(one[name])), name
    assert "fits in memory" in str(one["reason"].values)
    assert front["gpus"].values.tolist() == [1, 64, 128, 256]
    assert front["has_plan"].values.tolist() == [False, True, True, True]


def test_costs_follow_predict_of_the_chosen_plan(front):
    """Time to train = tokens / the predicted tokens/s of the plan the dataset names (rel 1e-9); GPU-hours =
    GPUs x hours; energy = the predicted energy per token x tokens."""
    for i in np.flatnonzero(front["has_plan"].values):
        plan = _plan(front, i)
        gpus = int(front["gpus"].values[i])
        assert plan.gpus == gpus
        p = perfmodel.predict(RunSpec(id="check", model=perfmodel.resolve_model(MODEL),
                                      system=resolve_system(SYSTEM), plan=plan))
        days = float(front["time_to_train_days"].values[i])
        assert days == pytest.approx(TOKENS / p.tokens_per_s / 86400, rel=1e-9)
        assert float(front["gpu_hours"].values[i]) == pytest.approx(gpus * days * 24, rel=1e-12)
        assert float(front["energy_MWh"].values[i]) == pytest.approx(p.node_energy_J_per_token * TOKENS / 3.6e9,
                                                                     rel=1e-9)
        assert float(front["accelerator_energy_MWh"].values[i]) == pytest.approx(
            p.energy_J_per_token * TOKENS / 3.6e9, rel=1e-9)
        assert float(front["step_time_s"].values[i]) == pytest.approx(p.step_time_s, rel=1e-9)


def test_the_chosen_plans_are_the_best_the_stack_runs(front):
    system = resolve_system(SYSTEM)
    for i in np.flatnonzero(front["has_plan"].values):
        plan = _plan(front, i)
        assert broken_rules(plan, system) == [], plan
        assert plan.zero in (0, 1), "Megatron-LM's distributed optimizer is ZeRO-1: no ZeRO-2 or 3 plan"
    _, ranked = planner.search(MODEL, SYSTEM, 128, GLOBAL_BATCH, top=1)
    assert float(front["tokens_per_s"].sel(gpus=128)) == pytest.approx(ranked[0]["tokens_per_s"], rel=1e-12)


def test_on_front_is_the_pareto_front_of_the_three_costs(front):
    costs = np.column_stack([front[name].values for name in plancluster.OBJECTIVES])
    assert front["on_front"].values.tolist() == pareto_front(costs).tolist()
    assert front["on_front"].values[front["has_plan"].values].any()


def test_another_stack_keeps_its_own_rules():
    ds = plancluster.cluster_front(MODEL, SYSTEM, [64], TOKENS, GLOBAL_BATCH, stack="fsdp")
    plan = _plan(ds, 0)
    assert plan.stack == "fsdp" and plan.zero in (0, 2, 3)
    assert broken_rules(plan, resolve_system(SYSTEM)) == []


@pytest.mark.parametrize("kwargs, field", [
    ({"tokens": 0}, "tokens"), ({"gpus": "0"}, "gpus"), ({"global_batch": 0}, "global_batch"),
    ({"global_batch": 1.5}, "global_batch"), ({"stack": "jax"}, "plan.stack"),
])
def test_cluster_front_rejects_bad_input_before_searching(kwargs, field):
    args = {"model": MODEL, "system": SYSTEM, "gpus": [64], "tokens": TOKENS, "global_batch": GLOBAL_BATCH,
            **kwargs}
    with pytest.raises(SpecError) as err:
        plancluster.cluster_front(**args)
    assert err.value.field == field


# --------------------------------------------------------------------------- the command
def _units_problems(ds):
    lacking = []
    for name, var in ds.variables.items():
        wanted = ("units", "long_name") if var.dtype.kind in "biufcmM" else ("long_name",)
        lacking += [f"{name}.{key}" for key in wanted if not var.attrs.get(key)]
    return lacking


def test_cli_writes_a_dataset_with_units_and_a_figure(tmp_path, capsys):
    out, fig = tmp_path / "front.nc", tmp_path / "front.png"
    rc = cli.main(["plan-cluster", "--model", MODEL, "--system", SYSTEM, "--gpus", "32..64", "--tokens", "2e12",
                   "--global-batch", str(GLOBAL_BATCH), "--out", str(out), "--figure", str(fig)])
    text = capsys.readouterr().out
    assert rc == 0, text
    lines = text.splitlines()
    rows = [line for line in lines if line.lstrip("* ").split(" ")[0] in ("32", "64")]
    assert len(rows) == 2 and any(line.startswith("*") for line in rows), text
    assert f"wrote {out}" in text and f"wrote {fig}" in text
    ds = io.read_dataset(out)
    assert _units_problems(ds) == []
    assert ds["gpus"].values.tolist() == [32, 64] and ds.attrs["tokens"] == 2e12
    first = fig.read_bytes()
    assert first.startswith(b"\x89PNG") and b"Software" not in first
    plancluster.save_front_figure(ds, fig)  # the same dataset drawn again: the same bytes
    assert fig.read_bytes() == first
    again = tmp_path / "again.nc"
    io.write_dataset(ds, again)
    io.write_dataset(ds, out)
    assert out.read_bytes() == again.read_bytes()


def test_cli_json(capsys):
    rc = cli.main(["plan-cluster", "--model", MODEL, "--system", SYSTEM, "--gpus", "1,64", "--tokens", "1e12",
                   "--global-batch", str(GLOBAL_BATCH), "--json"])

    got = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [s["gpus"] for s in got["sizes"]] == [1, 64]
    no_plan, best = got["sizes"]
    assert no_plan["days"] is None and no_plan["on_front"] is False and "memory" in no_plan["reason"]
    assert best["on_front"] is True and best["days"] > 0 and best["tp"] * best["pp"] * best["dp"] * best["cp"] == 64
    assert math.isclose(best["GPU_h"], 64 * best["days"] * 24, rel_tol=1e-12)


@pytest.mark.parametrize("args, field", [
    (["--gpus", "0"], "--gpus = '0'"),
    (["--gpus", "100..300"], "--gpus = '100..300'"),
    (["--gpus", "64,64"], "--gpus = '64,64'"),
    (["--tokens", "-1"], "--tokens = '-1'"),
    (["--tokens", "lots"], "--tokens = 'lots'"),
    (["--out", "front.csv"], "--out = 'front.csv'"),
    (["--figure", "front.svg"], "--figure = 'front.svg'"),
    (["--model", "no-such-model"], "model = 'no-such-model'"),
    (["--stack", "jax"], "--stack"),
    (["--global-batch", "0"], "--global-batch"),
])
def test_cli_bad_input_is_one_line(args, field, capsys):
    base = {"--model": MODEL, "--system": SYSTEM, "--gpus": "64", "--tokens": "1e12", "--global-batch": "512"}
    given = dict(zip(args[::2], args[1::2]))
    argv = ["plan-cluster"] + [x for key, value in {**base, **given}.items() for x in (key, value)]
    try:
        rc = cli.main(argv)
    except SystemExit as stop:  # argparse's own checks (choices, types)
        rc = stop.code
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and field in captured.err, captured.err
