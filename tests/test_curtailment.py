"""The curtailment simulator (trainscale.workloads.curtailment): the controller's events on hand-worked traces, the energy
and emissions integrals, the trace generator's statistics, and one-line errors for bad trace files."""

import numpy as np
import pytest
import xarray as xr
from trainscale.workloads import curtailment as C
from trainscale.model.specs import SpecError

SLOT = C.SLOT_S
LOW, HIGH = 50.0, 400.0


def trace(*rows):
    """A trace from per-site lists of 5-minute values."""
    data = np.asarray(rows, dtype=float).T
    time = np.datetime64("2026-01-01T00:00", "ns") + np.arange(data.shape[0]) * np.timedelta64(300, "s")
    return C._trace_dataset(data, time, [f"s{i}" for i in range(data.shape[1])])


def run(tr, target=1e9, step_s=1.0, sync=(0.0, 0.0, 30.0, 30.0), policy=C.PAPER_POLICY, train_W=2000.0, idle_W=500.0):
    S = tr.sizes["site"]
    return C.run_policy(tr, policy, [step_s] * S, [train_W] * S, [idle_W] * S, target, list(sync)[: S + 1])


def first(states, value):
    idx = np.flatnonzero(states == value)
    return int(idx[0]) if idx.size else None


def test_start_after_provisioning_and_hysteresis_stop():
    # below for 30 min, then above: provisioning at 0 s, training at 240 s, stop 600 s after going above
    r = run(trace([LOW] * 6 + [HIGH] * 6))
    st = r["states"][0]
    assert st[0] == 1 and first(st, 2) == 24  # 240 s / 10 s polls
    assert first(st[1:], 0) + 1 == (1800 + 600) // 10  # off at 2400 s
    np.testing.assert_allclose(r["train_s"][0], 2400 - 240)
    np.testing.assert_allclose(r["idle_s"][0], 240)  # provisioning at idle power
    assert r["starts"][0] == 1 and np.isnan(r["end_s"])  # target not reached


def test_short_excursion_above_does_not_stop():
    # a 5-minute spike above (< 600 s) is bridged; a 15-minute one is not
    bridged = run(trace([LOW] * 3 + [HIGH] + [LOW] * 3 + [HIGH] * 4))
    assert bridged["starts"][0] == 1
    assert np.all(bridged["states"][0][24: (7 * 300 + 600) // 10] == 2)
    broken = run(trace([LOW] * 3 + [HIGH] * 3 + [LOW] * 3 + [HIGH] * 4))
    assert broken["starts"][0] == 2
    st = broken["states"][0]
    assert st[(900 + 600) // 10] == 0 and st[1800 // 10] == 1  # stopped, then provisioning again


def test_lone_site_trains_without_rounds():
    r = run(trace([LOW] * 12, [HIGH] * 12))
    assert r["rounds"] == 0 and r["sync_s"] == 0
    assert r["starts"].tolist() == [1, 0]
    np.testing.assert_allclose(r["train_s"][0], 12 * 300 - 240)
    assert r["energy_J"][1] == 0


def test_round_ends_after_600_s_with_an_average():
    # two sites from t = 0: training at 240 s, rounds of 600 s each followed by a 30 s average
    r = run(trace([LOW] * 12, [LOW] * 12))
    # rounds end at polls t = 240 + 630 k + 600: 840, 1470, 2100, 2730, 3360 (the trace ends at 3600 s)
    assert r["rounds"] == 5
    assert r["sync_s"] == pytest.approx(30 * r["rounds"])
    for s in range(2):
        assert r["train_s"][s] == pytest.approx(3600 - 240 - 30 * r["rounds"])
        assert r["idle_s"][s] == pytest.approx(240 + 30 * r["rounds"])


def test_second_site_joining_opens_a_round_and_leaving_closes_it():
    # site 1 is below only from 30 min to 45 min (then hysteresis): a round opens when it trains
    r = run(trace([LOW] * 24, [HIGH] * 6 + [LOW] * 3 + [HIGH] * 15))
    st = r["states"]
    assert first(st[1], 2) == (1800 + 240) // 10
    # rounds open at 2040 s and 2670 s (after the first 30 s average); site 1 is off at 2700 + 600 = 3300 s,
    # after the second average (3270 s); then site 0 trains alone
    assert r["rounds"] == 2 and r["sync_s"] == pytest.approx(60)
    assert st[1][3300 // 10] == 0 and st[0][-1] == 2


def test_energy_and_emissions_are_the_integrals_over_the_timeline():
    values = [LOW, 80.0, 20.0, HIGH, HIGH, HIGH]
    r = run(trace(values), train_W=1000.0, idle_W=100.0)
    # recompute the integrals poll by poll from the recorded states
    st = r["states"][0]
    polls = np.arange(st.size) * 10.0
    c = np.asarray(values)[(polls // SLOT).astype(int)]
    power = np.where(st == 2, 1000.0, np.where(st == 1, 100.0, 0.0))
    np.testing.assert_allclose(r["energy_J"][0], (power * 10.0).sum())
    np.testing.assert_allclose(r["emissions_g"][0], (power * 10.0 * c).sum() / 3.6e6)
    # by hand: 240 s idle at 50 g, 660 s training at 50/80/20 g... then 600 s above at HIGH
    by_hand = (100 * 240 * LOW + 1000 * (60 * LOW + 300 * 80 + 300 * 20 + 600 * HIGH)) / 3.6e6
    np.testing.assert_allclose(r["emissions_g"][0], by_hand)


def test_run_ends_exactly_at_the_target():
    # one site, 1 s per batch, training from 240 s: 1000 batches end at 1240 s
    r = run(trace([LOW] * 12), target=1000.0)
    assert r["end_s"] == pytest.approx(1240.0)
    assert r["batches"][0] == pytest.approx(1000.0) and r["train_s"][0] == pytest.approx(1000.0)
    # two sites at 1 and 2 s per batch share the work: 1.5 batches per second from 240 s
    tr = trace([LOW] * 12, [LOW] * 12)
    r2 = C.run_policy(tr, C.Policy(round_s=1e5), [1.0, 2.0], [1.0, 1.0], [0.0, 0.0], 900.0, [0, 0, 0])
    assert r2["end_s"] == pytest.approx(240 + 600) and r2["batches"].tolist() == pytest.approx([600, 300])


def test_always_on_baseline_integrates_the_trace():
    tr = trace([100.0, 200.0, 300.0])
    b = C.always_on(tr, "s0", 1.0, 1000.0, 450.0)  # 450 s: 300 s at 100 g, 150 s at 200 g
    assert b["end_s"] == 450 and b["energy_J"] == 450e3
    assert b["emissions_g"] == pytest.approx(1000 * (300 * 100 + 150 * 200) / 3.6e6)
    assert np.isnan(C.always_on(tr, "s0", 1.0, 1000.0, 901.0)["end_s"])


@pytest.mark.parametrize("region", ["CA", "TX", "SA", "DE"])
def test_generator_statistics_match_the_parameters(region):
    tr = C.generate_traces([region], days=730, seed=3)
    r = C.REGIONS[region]
    x = tr["intensity"].values[:, 0]
    below = x < C.REFERENCE_THRESHOLD
    assert below.mean() == pytest.approx(r.share_below, abs=0.02)  # share curtailed, 2 years
    if r.share_below == 0:
        assert np.mean(x) == pytest.approx(r.off_level, rel=0.02)
        return
    assert np.mean(x[~below]) == pytest.approx(r.off_level, rel=0.02)
    assert np.std(x[~below]) / r.off_level == pytest.approx(r.off_noise, rel=0.3)
    assert np.mean(x[below]) == pytest.approx(r.in_level, rel=0.1)
    # window lengths within 10 min .. 11 h (runs of curtailed slots, merged only across the day's gaps)
    edges = np.flatnonzero(np.diff(np.r_[0, below.astype(int), 0]))
    runs_h = (edges[1::2] - edges[::2]) * SLOT / 3600
    # (a window crossing 00:00 UTC is wrapped onto its own day's start: those pieces may be shorter)
    assert np.mean(runs_h >= r.window_min_h - 1e-9) > 0.95 and np.median(runs_h) > 1.0
    # clustered in local daytime: curtailed slots within +-6 h of the local peak hour, well above a uniform 50%
    hours = (np.arange(x.size) * SLOT / 3600 + r.utc_offset_h) % 24
    near = np.abs((hours[below] - r.peak_hour_local + 12) % 24 - 12) <= 6
    assert near.mean() > 0.7


def test_generator_is_seeded_and_regions_are_independent_streams():
    a = C.generate_traces(["CA", "TX"], days=3, seed=5)
    b = C.generate_traces(["CA", "TX"], days=3, seed=5)
    assert a.identical(b)
    assert not np.array_equal(a["intensity"].values, C.generate_traces(["CA", "TX"], days=3, seed=6)["intensity"].values)
    for name in list(a.data_vars) + list(a.coords):
        assert a[name].attrs.get("long_name"), name
    assert a["intensity"].attrs["units"] == "gCO2/kWh"


def test_site_step_from_the_performance_model():
    st = C.site_step()
    assert st["tokens"] == 524288 and 5.5e8 < st["params"] < 5.7e8
    assert 0.5 < st["step_s"] < 20
    assert C.averaging_time_s(st["params"], 1, 0.125, 0.05) == 0
    t2, t3 = (C.averaging_time_s(st["params"], n, 0.125, 0.05) for n in (2, 3))
    assert t2 == pytest.approx(2 * 0.05 + st["params"] * 2 / 0.125e9, rel=1e-9) and t3 > t2


def test_read_trace_round_trips_csv_and_netcdf(tmp_path):
    tr = C.generate_traces(["CA", "SA"], days=1, seed=0)
    path = tmp_path / "t.csv"
    with open(path, "w") as fh:
        fh.write("time,CA,SA\n")
        for t, (a, b) in zip(tr["time"].values, tr["intensity"].values):
            fh.write(f"{np.datetime_as_string(t, 's')}Z,{float(a)!r},{float(b)!r}\n")
    back = C.read_trace(path)
    np.testing.assert_allclose(back["intensity"].values, tr["intensity"].values)
    tr.to_netcdf(tmp_path / "t.nc")
    np.testing.assert_allclose(C.read_trace(tmp_path / "t.nc")["intensity"].values, tr["intensity"].values)


@pytest.mark.parametrize("text, field, where", [
    ("when,CA\n2026-01-01T00:00,1\n", "header", "time"),
    ("time,CA\n2026-01-01T00:00,1\n2026-01-01T00:05,-3\n", "CA", "row 3"),
    ("time,CA\n2026-01-01T00:00,1\n2026-01-01T00:05,abc\n", "CA", "row 3"),
    ("time,CA\n2026-01-01T00:00,1\n2026-01-01T00:15,2\n", "time", "row 3"),
    ("time,CA\nyesterday,1\n", "time", "row 2"),
    ("time,CA,SA\n2026-01-01T00:00,1\n", "row", "2"),
])
def test_bad_trace_files_give_one_line(tmp_path, text, field, where):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        C.read_trace(path)
    msg = str(err.value)
    assert err.value.field == field and where in msg and "\n" not in msg and "bad.csv" in msg


def test_bad_netcdf_trace_names_site_and_row(tmp_path):
    tr = C.generate_traces(["CA"], days=1, seed=0)
    tr["intensity"].values[7, 0] = np.nan
    tr.to_netcdf(tmp_path / "bad.nc")
    with pytest.raises(SpecError) as err:
        C.read_trace(tmp_path / "bad.nc")
    assert err.value.field == "CA" and "row 8" in str(err.value)
    xr.Dataset({"x": ("t", [1.0])}).to_netcdf(tmp_path / "other.nc")
    with pytest.raises(SpecError, match="intensity"):
        C.read_trace(tmp_path / "other.nc")


def test_bad_region_parameters_name_field_and_region():
    bad = C.RegionTrace("XX", utc_offset_h=0.0, share_below=0.4, off_level=50.0)
    with pytest.raises(SpecError) as err:
        C.generate_traces([bad], days=1)
    assert err.value.field == "off_level" and "region XX" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs, field", [({"threshold": 0}, "threshold"), ({"poll_s": 7}, "poll_s"),
                                           ({"round_s": -1}, "round_s")])
def test_bad_policy_names_the_field(kwargs, field):
    with pytest.raises(SpecError) as err:
        run(trace([LOW] * 2), policy=C.Policy(**kwargs))
    assert err.value.field == field


# ---------------------------------------------------------------------------------------------
# the statistical cost of averaging: the run's schedule and the convergence engine over it

def test_round_schedule_of_a_hand_made_run():
    T, P = C.K.TRAINING, C.K.PROVISIONING
    states = np.array([[T, T, T, T, 0, P, T, T],
                       [0, P, T, T, T, T, T, T]], dtype=np.int8)
    log = np.array([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0],
                    [0.0, 0.0, 0.5, 1.0, 0.75, 0.75, 1.0, 1.0]])
    sync = np.zeros(8, dtype=np.int8)
    sync[3] = 2  # a round closes at poll 3 (both training), then at poll 7
    sync[7] = 2
    sched = C.round_schedule({"states": states, "batches_log": log, "sync_log": sync})
    # rounds: polls [0, 3), [3, 7), [7, 8); whole batches completed in each
    assert sched["steps"].tolist() == [[3, 0], [2, 4], [1, 1]]
    assert sched["joins"].tolist() == [[True, True], [True, False], [False, False]]  # site 0 restarts at poll 6
    assert sched["averages"].tolist() == [[True, True], [True, True], [False, False]]
    assert sched["steps"].sum() == int(np.floor(log[0].sum())) + int(np.floor(log[1].sum()))


def _lsq_sgd_numpy(X, y, x, rows, lr):
    for idx in rows:
        x = x - lr * (X[idx].T @ (X[idx] @ x - y[idx]) / len(idx))
    return x


def _problem():
    from trainscale.training import convergence
    return convergence.make_problem("least_squares", 256, 6, seed=3, kappa=10.0)


def test_one_site_schedule_is_sequential_sgd():
    from trainscale.training import convergence
    prob = _problem()
    got = convergence.run_schedule(prob, [[7], [5]], [[True], [False]], [[False], [False]], lr=0.1, batch_size=4,
                                   seed=2)
    rows = np.random.default_rng(convergence._seed_sequence(2)).integers(0, prob.n_samples, size=(12, 4))
    want = _lsq_sgd_numpy(prob.X, prob.y, prob.initial_params(2), rows, 0.1)
    np.testing.assert_allclose(got["params"], want, rtol=1e-12, atol=1e-14)
    assert got["steps"] == 12


def test_sites_average_weighted_by_their_steps():
    from trainscale.training import convergence
    prob = _problem()
    steps = [[1, 3], [2, 0]]
    got = convergence.run_schedule(prob, steps, [[True, True], [False, False]], [[True, True], [False, False]],
                                   lr=0.05, batch_size=2, seed=5)
    rows = np.random.default_rng(convergence._seed_sequence(5)).integers(0, prob.n_samples, size=(6, 2))
    x0 = prob.initial_params(5)
    a = _lsq_sgd_numpy(prob.X, prob.y, x0, rows[:1], 0.05)  # site 0: 1 step
    b = _lsq_sgd_numpy(prob.X, prob.y, x0, rows[1:4], 0.05)  # site 1: 3 steps
    avg = (1 * a + 3 * b) / 4
    want = _lsq_sgd_numpy(prob.X, prob.y, avg, rows[4:6], 0.05)  # site 0 goes on alone, pending at the end
    np.testing.assert_allclose(got["params"], want, rtol=1e-12, atol=1e-14)


def test_a_lone_site_run_costs_nothing():
    prob = _problem()
    tr = trace([LOW] * 24)
    r = run(tr, target=3000, step_s=2.0)
    assert r["rounds"] == 0 and np.isfinite(r["end_s"])
    cost = C.averaging_cost(r, prob, lr=0.05, batch_size=4, seed=0)
    assert cost["loss_ratio"] == 1.0 and cost["steps"] == 3000


def test_averaging_at_small_batches_lowers_the_loss_on_a_two_site_run():
    prob = _problem()
    tr = trace([LOW] * 48, [LOW] * 48)
    r = run(tr, target=8000, step_s=2.0)
    assert r["rounds"] == 13
    # two replicas averaged act like a doubled batch: less gradient noise at the end (every seed)
    for seed in range(4):
        cost = C.averaging_cost(r, prob, lr=0.05, batch_size=1, seed=seed)
        assert cost["loss"] < cost["single_loss"] and cost["steps"] == 8000


# ---------------------------------------------------------------------------------------------
# the paper's trace (exalsius/curtail-llm evaluation/mci.csv): cited, fetched by hand, checked by sha256

HAVE_TRACE = C.paper_trace_path().is_file()


def test_a_trace_with_another_hash_is_refused(tmp_path):
    bad = tmp_path / "mci.csv"
    bad.write_text("point_time,CAISO_NORTH,SPP_TX,NEM_SA,DE\n2026-01-11 17:00:00+00:00,1,2,3,4\n")
    with pytest.raises(SpecError) as err:
        C.read_paper_trace(bad)
    assert err.value.field == "paper_trace" and "sha256" in str(err.value)
    with pytest.raises(SpecError) as err:
        C.read_paper_trace(tmp_path / "absent.csv")
    assert "trainscale fetch-trace" in str(err.value)


@pytest.mark.skipif(not HAVE_TRACE, reason="the paper's trace is not here (trainscale fetch-trace)")
def test_paper_trace_has_the_recorded_hash_and_the_papers_regions():
    import hashlib

    assert hashlib.sha256(C.paper_trace_path().read_bytes()).hexdigest() == C.PAPER_TRACE["sha256"]
    tr = C.read_paper_trace()
    assert list(tr["site"].values) == ["CA", "TX", "SA", "DE"] and tr.sizes["time"] == 217
    assert str(tr["time"].values[0]).startswith("2026-01-11T17:00")
    timing = C.window_timing(tr)
    # the generator's regions carry the trace's shares and window timing (module docstring)
    for site, region in C.REGIONS.items():
        assert timing[site]["share"] == pytest.approx(region.share_below, abs=0.005), site
        if region.share_below > 0:
            assert timing[site]["centre_local_h"] == pytest.approx(region.peak_hour_local, abs=0.05), site


def test_window_timing_finds_a_windows_centre_in_local_time():
    values = np.full((288, 1), 500.0)
    values[24:48, 0] = 10.0  # 02:00-04:00 UTC
    time = np.datetime64("2026-01-11T00:00", "ns") + np.arange(288) * np.timedelta64(300, "s")
    tr = C._trace_dataset(values, time, ["X"])
    t = C.window_timing(tr, utc_offsets_h={"X": -6.0})["X"]
    assert t["share"] == pytest.approx(24 / 288)
    assert t["centre_local_h"] == pytest.approx(21.0)  # 03:00 UTC at UTC-6
    assert t["windows"] == [(2.0, 4.0)]
