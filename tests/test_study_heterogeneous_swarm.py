"""heterogeneous-swarm: the swarm model (trainscale.workloads.swarm, kernels.swarm) against brute force and hand-worked
cases, the int8 fit, NSGA-II against PETALS' choice, bad swarm files, and the study's records. The comparison
with PETALS' numbers is judged on the committed full datasets by ``trainscale verify``."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainscale.common import comparison
from trainscale.common import io as tsio
from trainscale.workloads import swarm as W
from trainscale.kernels import swarm as K
from trainscale.model.specs import SpecError
from trainscale.studies import heterogeneous_swarm as study


def brute_force_route_cost(starts, spans, rtt, dec, pen, L, weight=0.5):
    """The cheapest chain from block 0 to L, edge cost ``weight r_s + (j - i) d_s + pen_s`` (PETALS' router:
    weight 1/2, pen the cache penalty), by enumerating every chain."""
    best = math.inf
    stack = [(0, 0.0)]
    while stack:
        i, cost = stack.pop()
        if i == L:
            best = min(best, cost)
            continue
        for s in range(len(starts)):
            a, n = starts[s], spans[s]
            if not a <= i < a + n:
                continue
            for j in range(i + 1, min(L, a + n) + 1):
                stack.append((j, cost + weight * rtt[s] + (j - i) * dec[s] + pen[s]))
    return best


@st.composite
def small_swarms(draw):
    L = draw(st.integers(2, 7))
    S = draw(st.integers(1, 4))
    spans = np.array([draw(st.integers(1, L)) for _ in range(S)], np.int64)
    starts = np.array([draw(st.integers(0, L - n)) for n in spans], np.int64)
    floats = st.floats(0.0, 1.0, allow_nan=False)
    rtt = np.array([draw(floats) for _ in range(S)])
    dec = np.array([draw(st.floats(1e-3, 1.0)) for _ in range(S)])
    pen = np.array([draw(st.sampled_from([0.0, 10.0])) + draw(floats) for _ in range(S)])
    return L, starts, spans, rtt, dec, pen


@settings(max_examples=150, deadline=None)
@given(small_swarms(), st.sampled_from([0.5, 1.0]))
def test_router_equals_brute_force_shortest_path(swarm, weight):
    """PETALS' router (weight 1/2) and the search's least-latency chain (weight 1, hop costs incl. transfers)."""
    L, starts, spans, rtt, dec, pen = swarm
    hs, hf, ht = (np.empty(L, np.int64) for _ in range(3))
    n = K.route(starts, spans, rtt, dec, pen, weight, L, hs, hf, ht)
    want = brute_force_route_cost(starts, spans, rtt, dec, pen, L, weight)
    if not math.isfinite(want):
        assert n == 0
        return
    assert n > 0 and hf[0] == 0 and ht[n - 1] == L
    assert all(ht[h] == hf[h + 1] for h in range(n - 1))  # hops chain up
    for h in range(n):  # every hop stays inside its server's span
        s = hs[h]
        assert starts[s] <= hf[h] < ht[h] <= starts[s] + spans[s]
    got = sum(weight * rtt[s] + (j - i) * dec[s] + pen[s] for s, i, j in zip(hs[:n], hf[:n], ht[:n]))
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def _mixed(k=2.0, c=0.002, **kw):
    gpus, bw, rtt = study.mixed_swarm(12, 0.5, [100.0, 1000.0], 20.0)
    return W.SwarmSpec(W.make_swarm(gpus, bw, rtt).servers, int8_slowdown=k, int8_overhead_s=c, **kw)


@pytest.mark.parametrize("chain", W.CHAINS)
def test_kernel_evaluation_equals_the_plain_python_reference(chain):
    spec = _mixed()
    a = W.server_arrays(spec)
    rng = np.random.default_rng(0)
    pop = np.stack([W._random_tiling(rng, a["spans"], a["L"]) for _ in range(30)]
                   + [rng.integers(0, a["L"] - a["spans"] + 1) for _ in range(30)])
    out = np.empty((pop.shape[0], 3))
    weight, hop_s = W.route_costs(a, chain)
    K.evaluate_many(pop, a["spans"], a["rtt_s"], a["dec_s"], a["bw_Bps"], hop_s, weight, a["tput"], a["L"],
                    a["act_bytes"], out)
    for row, res in zip(pop, out):
        lat, thr = W.reference_evaluate(row, a, chain)
        if math.isinf(lat):
            assert res[0] >= K.INF
        else:
            assert res[0] == pytest.approx(lat, rel=1e-12)
        assert res[1] == pytest.approx(thr, rel=1e-12)


def test_petals_placement_holds_every_block_and_balances_identical_servers():
    spec = W.make_swarm(["dgx-a100-80gb"] * 3, 1000.0, 5.0)
    a = W.server_arrays(spec)
    choice = W.petals_choice(spec, a)
    assert K.uncovered_blocks(choice["starts"], a["spans"], a["L"]) == 0
    # three equal servers of 31 blocks over 70: the weakest block is held by one server, the rest by up to two
    blocks = np.empty(a["L"])
    K.block_throughputs(choice["starts"], a["spans"], a["tput"], a["L"], blocks)
    assert blocks.min() == pytest.approx(a["tput"][0]) and blocks.max() == pytest.approx(2 * a["tput"][0])
    assert len(choice["chain"]) == 3 and choice["chain"][0][1] == 0 and choice["chain"][-1][2] == a["L"]


def test_router_avoids_a_server_without_cache_room():
    L = 4
    spans = np.array([4, 4], np.int64)
    starts = np.array([0, 0], np.int64)
    rtt, dec = np.array([0.01, 0.01]), np.array([0.01, 0.011])  # server 0 is faster ...
    pen = np.array([W.CACHE_PENALTY_S, 0.0])  # ... but its cache is full
    hs, hf, ht = (np.empty(L, np.int64) for _ in range(3))
    assert K.route(starts, spans, rtt, dec, pen, 0.5, L, hs, hf, ht) == 1 and hs[0] == 1
    pen[0] = 0.0
    assert K.route(starts, spans, rtt, dec, pen, 0.5, L, hs, hf, ht) == 1 and hs[0] == 0


def test_least_latency_chain_is_never_slower_than_petals_route():
    spec = _mixed()
    a = W.server_arrays(spec)
    rng = np.random.default_rng(5)
    for _ in range(20):
        starts = W._random_tiling(rng, a["spans"], a["L"])
        petals = W.evaluate_placement(spec, starts, a, "petals")
        best = W.evaluate_placement(spec, starts, a, "optimal")
        assert best["latency_s"] <= petals["latency_s"] * (1 + 1e-12)
        assert best["swarm_tokens_per_s"] == petals["swarm_tokens_per_s"]  # the chain does not change placement
    with pytest.raises(SpecError, match="chain"):
        W.route_costs(a, "fastest")


def test_offloading_is_bound_by_the_host_link_or_compute():
    from trainscale.model.specs import resolve_model

    m = resolve_model("bloom-176b")
    slow = W.offload_rates("bloom-176b", "dgx-a100-80gb", 1.0)  # 1 GB/s: loading the weights dominates
    assert slow["steps_per_s"] == pytest.approx(1e9 / (m.layers * m.params_per_layer()), rel=1e-12)
    assert slow["forward_tokens_per_s"] == pytest.approx(128 * slow["steps_per_s"], rel=1e-12)
    fast = W.offload_rates("bloom-176b", "dgx-a100-80gb", 1e5, forward_batch=64)  # compute dominates
    swarm = W.SwarmSpec((W.Server("dgx-a100-80gb", 1.0, 0.0),), forward_batch=64)
    assert fast["forward_tokens_per_s"] == pytest.approx(128 * 64 / (m.layers * W.server_arrays(swarm)["fwd_s"][0]))


def test_int8_fit_reproduces_its_two_targets():
    spec = W.make_swarm(["dgx-a100-80gb"] * 3, 1000.0, 5.0)
    k, c = W.fit_int8(spec, 1.71, 253.6, 64)
    assert k > 1.0 and 0.0 <= c < 0.01
    fitted = W.SwarmSpec(spec.servers, int8_slowdown=k, int8_overhead_s=c)
    assert W.petals_choice(fitted)["steps_per_s"] == pytest.approx(1.71, rel=1e-9)
    b64 = W.SwarmSpec(spec.servers, int8_slowdown=k, int8_overhead_s=c, forward_batch=64)
    assert W.petals_choice(b64)["forward_tokens_per_s"] == pytest.approx(253.6, rel=1e-9)


def test_nsga2_front_dominates_or_equals_petals_choice_and_is_seeded():
    spec = _mixed()
    a = W.server_arrays(spec)
    choice = W.petals_choice(spec, a)
    front = W.pareto_search(spec, population=16, generations=8, seed=3, arrays=a)
    assert front["latency_s"].size > 0
    assert W.dominates_or_equals(front["latency_s"], front["swarm_tokens_per_s"], choice["latency_s"],
                                 choice["swarm_tokens_per_s"])
    # the front is non-dominated: no point is at least as good as another in both objectives and better in one
    lat, thr = front["latency_s"], front["swarm_tokens_per_s"]
    for i, j in itertools.permutations(range(lat.size), 2):
        assert not (lat[i] <= lat[j] and thr[i] >= thr[j] and (lat[i] < lat[j] or thr[i] > thr[j]))
    again = W.pareto_search(spec, population=16, generations=8, seed=3, arrays=a)
    np.testing.assert_array_equal(front["starts"], again["starts"])


def test_committed_search_never_loses_to_petals_choice():
    """What was a record (true by construction: PETALS' placement seeds NSGA-II, which keeps its best), on the
    committed full dataset: in every swept case with a front, its latency over PETALS' is at most 1."""
    from conftest import REPO_ROOT

    gain = tsio.read_dataset(REPO_ROOT / "figures" / study.STUDY / "search.nc")["latency_gain"].values
    assert np.isfinite(gain).any() and np.all(gain[np.isfinite(gain)] <= 1.0)


def test_a_swarm_too_small_to_hold_the_model_has_no_front():
    spec = W.make_swarm(["rtx3060-pcie"] * 3, 1000.0, 5.0)
    a = W.server_arrays(spec)
    assert a["spans"].sum() < a["L"]
    assert math.isinf(W.petals_choice(spec, a)["latency_s"])
    assert W.pareto_search(spec, 8, 2, 0, a)["latency_s"].size == 0


@pytest.mark.parametrize("text, field", [
    ("servers:\n  - {gpu: nope, bandwidth_Mbps: 100, rtt_ms: 5}\n", "servers[0].gpu"),
    ("servers:\n  - {gpu: rtx3060-pcie, bandwidth_Mbps: 100, rtt_ms: -5}\n", "servers[0].rtt_ms"),
    ("servers:\n  - {gpu: rtx3060-pcie, rtt_ms: 5}\n", "servers[0].bandwidth_Mbps"),
    ("servers:\n  - {gpu: rtx3060-pcie, bandwidth_Mbps: fast, rtt_ms: 5}\n", "servers[0].bandwidth_Mbps"),
    ("servers:\n  - {gpu: rtx3060-pcie, bandwidth_Mbps: 100, rtt_ms: 5, count: 0}\n", "servers[0].count"),
    ("servers:\n  - {gpu: rtx3060-pcie, bandwidth_Mbps: 100, rtt_ms: 5, colour: red}\n", "servers[0].colour"),
    ("servers: []\n", "servers"),
    ("model: bloom-176b\n", "servers"),
])
def test_bad_swarm_files_get_one_line(tmp_path, text, field):
    path = tmp_path / "swarm.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        W.load_swarm(path)
    assert err.value.field == field
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text, field", [
    ("gpu,bandwidth_Mbps,rtt_ms\nrtx3060-pcie,100,5\nrtx3060-pcie,100,slow\n", "line 3, rtt_ms"),
    ("gpu,bandwidth_Mbps,rtt_ms\nnope,100,5\n", "line 2, gpu"),
    ("gpu,bandwidth_Mbps,rtt_ms\nrtx3060-pcie,0,5\n", "line 2, bandwidth_Mbps"),
    ("gpu,bandwidth_Mbps,rtt_ms\nrtx3060-pcie,100\n", "line 2"),
    ("gpu,bandwidth_Mbps\nrtx3060-pcie,100\n", "line 2, rtt_ms"),
    ("gpu,bandwidth_Mbps,rtt_ms,colour\nrtx3060-pcie,100,5,red\n", "header"),
    ("gpu,bandwidth_Mbps,rtt_ms,count\nrtx3060-pcie,100,5,0\n", "line 2, count"),
    ("gpu,bandwidth_Mbps,rtt_ms\n", "servers"),
    ("", "header"),
])
def test_bad_csv_swarm_files_get_one_line_naming_line_and_column(tmp_path, text, field):
    path = tmp_path / "swarm.csv"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        W.load_swarm(path)
    assert err.value.field == field
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_csv_swarm_file_equals_the_yaml_one(tmp_path):
    (tmp_path / "swarm.csv").write_text("gpu,bandwidth_Mbps,rtt_ms,count,cache_full\n"
                                        "rtx-a5000-pcie,1000,10,3,false\nrtx3060-pcie,100,40,1,true\n")
    (tmp_path / "swarm.yaml").write_text("servers:\n  - {gpu: rtx-a5000-pcie, bandwidth_Mbps: 1000, rtt_ms: 10, "
                                         "count: 3}\n  - {gpu: rtx3060-pcie, bandwidth_Mbps: 100, rtt_ms: 40, "
                                         "cache_full: true}\n")
    assert W.load_swarm(tmp_path / "swarm.csv") == W.load_swarm(tmp_path / "swarm.yaml")


def test_swarm_file_round_trip(tmp_path):
    path = tmp_path / "swarm.yaml"
    path.write_text("servers:\n  - {gpu: rtx-a5000-pcie, bandwidth_Mbps: 1000, rtt_ms: 10, count: 3}\n"
                    "  - {gpu: rtx3060-pcie, bandwidth_Mbps: 100, rtt_ms: 40, cache_full: true}\n")
    spec = W.load_swarm(path)
    assert len(spec.servers) == 4 and spec.servers[3].cache_full and spec.servers[0].gpu == "rtx-a5000-pcie"
    a = W.server_arrays(spec)
    assert a["penalty_s"].tolist() == [0.0, 0.0, 0.0, W.CACHE_PENALTY_S]


def _paper_spec(k=2.0, c=0.002, **kw):
    gpus, bw = study.paper_mix([100.0, 1000.0])
    return W.SwarmSpec(W.make_swarm(gpus, bw, 20.0).servers, int8_slowdown=k, int8_overhead_s=c, **kw)


def test_paper_mix_is_petals_fourteen_servers_and_links_are_a_permutation():
    want = {"rtx3060-pcie": 2, "rtx2080ti-pcie": 4, "rtx3090-pcie": 2, "rtx-a4000-pcie": 2, "rtx-a5000-pcie": 4}
    spread = np.linspace(100.0, 1000.0, 14)
    for lo in study.LINK_ORDERS:
        for jo in study.JOIN_ORDERS:
            gpus, bw = study.paper_mix([100.0, 1000.0], lo, jo)
            assert {g: gpus.count(g) for g in want} == want and len(gpus) == 14
            np.testing.assert_allclose(np.sort(bw), spread)
    gpus, bw = study.paper_mix([100.0, 1000.0], "strong on fast links")
    assert gpus[-1] == "rtx-a5000-pcie" and bw[-1] == 1000.0
    with pytest.raises(SpecError, match="link_order"):
        study.paper_mix([100.0, 1000.0], "random")


def test_chain_kernels_equal_the_plain_python_reference():
    spec = _mixed(forward_batch=64)
    a = W.server_arrays(spec)
    rng = np.random.default_rng(2)
    for _ in range(5):
        starts = W._random_tiling(rng, a["spans"], a["L"])
        holders, n_holders = W._holders(a, starts)
        pop = rng.integers(0, 4, size=(20, a["L"]))
        out = np.empty((pop.shape[0], 3))
        K.evaluate_chains(pop, holders, n_holders, a["rtt_s"], a["dec_s"], a["fwd_s"], a["bw_Bps"], a["act_bytes"],
                          a["fwd_bytes"], a["L"], out)
        for genes, res in zip(pop, out):
            lat, stage, hops = W.reference_chain_evaluate(genes, starts, a)
            if math.isinf(lat):
                assert res[0] >= K.INF
                continue
            assert res[0] == pytest.approx(lat, rel=1e-12) and res[1] == pytest.approx(stage, rel=1e-12)
            assert res[2] == hops


def test_petals_router_chain_round_trips_through_its_genome():
    spec = _paper_spec()
    a = W.server_arrays(spec)
    choice = W.petals_choice(spec, a)
    holders, n_holders = W._holders(a, choice["starts"])
    genes = W.chain_genes(choice["chain"], holders, a["L"])
    hs, hf, ht = (np.empty(a["L"], np.int64) for _ in range(3))
    n = K.decode_chain(genes, holders, n_holders, a["L"], hs, hf, ht)
    assert [(int(hs[h]), int(hf[h]), int(ht[h])) for h in range(n)] == choice["chain"]


def test_chain_search_never_loses_to_petals_router_and_is_seeded():
    gpus = [g for g, _ in study.PETALS_MIX] * 5  # enough servers that blocks have several holders
    spec = _spec_of(gpus)
    f = W.chain_search(spec, population=16, generations=6, seed=4)
    pt = f["petals"]
    assert f["latency_s"].size > 0
    assert W.dominates_or_equals(f["latency_s"], f["chain_tokens_per_s"], pt["latency_s"], pt["chain_tokens_per_s"])
    lat, thr = f["latency_s"], f["chain_tokens_per_s"]
    for i, j in itertools.permutations(range(lat.size), 2):
        assert not (lat[i] <= lat[j] and thr[i] >= thr[j] and (lat[i] < lat[j] or thr[i] > thr[j]))
    again = W.chain_search(spec, population=16, generations=6, seed=4)
    np.testing.assert_array_equal(f["genes"], again["genes"])


def _spec_of(gpus):
    return W.SwarmSpec(W.make_swarm(gpus, np.linspace(100.0, 1000.0, len(gpus)), 20.0).servers, int8_slowdown=2.0,
                       int8_overhead_s=0.002, forward_batch=64)


def test_study_tables_and_records(tmp_path):
    base = {"bandwidth_Mbps": [100.0, 1000.0], "rtt_ms": 20.0, "link_order": "interleaved",
            "join_order": "weakest first"}
    tab = study.petals_table(base, rtts_ms=[5.0, 50.0])
    assert tab["fitted"].sum() == 2  # the two numbers the int8 cost is fitted to
    fit = tab.sel(setting=study.FIT_SETTING)
    assert float(fit["predicted"].sel(metric="steps_per_s")) == pytest.approx(1.71, rel=1e-9)
    search = study.search_sweep(base, [20], [1.0], [300.0], [50.0], population=12, generations=4, seed=1, seeds=2)
    assert search.sizes["case"] == 5 and search.sizes["ga_seed"] == 2
    gain = search["latency_gain"].values
    assert np.all(gain[np.isfinite(gain)] <= 1 + 1e-12)
    tsio.write_dataset(tab, tmp_path / "petals.nc")
    tsio.write_dataset(search, tmp_path / "search.nc")
    records = study.compare(tmp_path)
    assert len(records) == 11  # 12 published numbers, 2 fitted left out, and the GA's chain
    assert records[0].same_setting and "RAM offloading" in records[0].quantity  # the paper's settings first
    mixed = [r for r in records if r.quantity.endswith(study.MIXED_SETTING) and "GA" not in r.quantity]
    assert len(mixed) == 3 and all(r.same_setting and "RTT" in r.free_parameter for r in mixed)
    assert all(r.our_low <= r.our_value <= r.our_high for r in mixed)
    ga = records[-1]
    assert not ga.same_setting and ga.free_parameter.startswith("GA seed")
    for r in records:
        assert r.study == study.STUDY and r.verdict in comparison.VERDICTS
    for ds in (tab, search):
        for name in list(ds.data_vars) + list(ds.coords):
            assert ds[name].attrs.get("long_name"), name
    again = study.search_sweep(base, [20], [1.0], [300.0], [50.0], population=12, generations=4, seed=1, seeds=2)
    tsio.write_dataset(again, tmp_path / "again.nc")
    assert (tmp_path / "again.nc").read_bytes() == (tmp_path / "search.nc").read_bytes()


def test_pareto_names_the_cases_with_no_feasible_placement():
    """pareto.png draws no point for a swarm that cannot hold the model, so its panel's title says which."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from conftest import REPO_ROOT
    from trainscale.common import plotting

    folder = REPO_ROOT / "figures" / study.STUDY
    search = tsio.read_dataset(folder / "search.nc")
    infeasible = [(str(k), float(v)) for k, v, lat in zip(search["sweep"].values, search["value"].values,
                                                          search["petals_latency_s"].values) if not np.isfinite(lat)]
    assert infeasible  # the committed sweep has such cases (servers = 10, no A5000s)
    with matplotlib.rc_context(plotting.STYLE):
        fig = study.draw_pareto(folder)
        try:
            titles = " ".join(ax.get_title().replace("\n", " ") for ax in fig.axes)
            for knob, value in infeasible:
                assert f"{study._case_name(knob, value)}: no feasible placement" in titles
        finally:
            plt.close(fig)
