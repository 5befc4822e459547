"""Chiplet meshes: hop counts and ring embeddings vs brute force, collective costs vs hand
computation, weak-scaling invariants, energy bookkeeping."""

import itertools
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainscale.workloads import chiplet as C
from trainscale.kernels import chiplet as K
from trainscale.kernels.collectives import ring_phase_time
from trainscale.model.specs import SpecError


def bfs_distances(n, source):
    """Hops from ``source`` to every chiplet of an n x n mesh, by breadth-first search."""
    dist = {source: 0}
    queue = deque([source])
    while queue:
        v = queue.popleft()
        r, c = divmod(v, n)
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < n and 0 <= cc < n and rr * n + cc not in dist:
                dist[rr * n + cc] = dist[v] + 1
                queue.append(rr * n + cc)
    return dist


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_mesh_hops_equal_breadth_first_search(n):
    for a in range(n * n):
        dist = bfs_distances(n, a)
        for b in range(n * n):
            assert K.mesh_hops(a, b, n) == dist[b]


@pytest.mark.parametrize("n", range(1, 10))
def test_mesh_ring_visits_every_chiplet_with_the_closed_form_hops(n):
    order = C.mesh_ring(n)
    assert sorted(order) == list(range(n * n))
    hops = [bfs_distances(n, order[i])[order[(i + 1) % len(order)]] for i in range(len(order))] if n > 1 else []
    assert hops == C.ring_edge_hops(order, n)
    assert max(hops, default=0) == K.mesh_ring_max_hops(n)
    assert sum(hops) == K.mesh_ring_total_hops(n)
    # one way round no directed link carries two edges; both ways round only with n odd
    assert max(C.ring_link_loads(order, n).values(), default=1) == K.mesh_ring_congestion(n, False) == 1
    assert max(C.ring_link_loads(order, n, True).values(), default=1) == K.mesh_ring_congestion(n, True)


@pytest.mark.parametrize("n", [2, 3])
def test_mesh_ring_is_optimal_by_brute_force(n):
    """Over every cyclic order of the chiplets, the longest edge and the total hops are at least
    the closed forms (which the construction attains)."""
    dist = [bfs_distances(n, a) for a in range(n * n)]
    best_max, best_total = np.inf, np.inf
    for rest in itertools.permutations(range(1, n * n)):
        order = (0, *rest)
        hops = [dist[order[i]][order[(i + 1) % len(order)]] for i in range(len(order))]
        best_max = min(best_max, max(hops))
        best_total = min(best_total, sum(hops))
    assert best_max == K.mesh_ring_max_hops(n)
    assert best_total == K.mesh_ring_total_hops(n)


@pytest.mark.parametrize("p", range(1, 12))
def test_folded_line_ring_uses_every_directed_link_once(p):
    order = C.line_ring(p)
    assert sorted(order) == list(range(p))
    if p == 1:
        assert K.line_ring_max_hops(1) == 0 and K.line_ring_total_hops(1) == 0
        return
    hops = [abs(order[i] - order[(i + 1) % p]) for i in range(p)]
    assert max(hops) == K.line_ring_max_hops(p)
    assert sum(hops) == K.line_ring_total_hops(p) == 2 * (p - 1)
    # as a row of a p x p mesh: each of the 2 (p - 1) directed links carries exactly one edge
    loads = C.ring_link_loads(order, p)
    assert len(loads) == 2 * (p - 1) and set(loads.values()) == {1}


def test_mesh_ring_collective_by_hand():
    # 4 members, 2 hops per step, congestion 2, bidirectional: per step 2 * 5 ns + (S/4) * 2 / (2 B)
    S, B, a = 8e6, 100e9, 5e-9
    t = K.mesh_ring_phase_time(S, 4, 2, 2, 2.0, B, a)
    assert t == pytest.approx(3 * (2 * a + (S / 4) * 2 / (2 * B)), rel=1e-12)
    assert t == pytest.approx(ring_phase_time(S, 4, 2 * B / 2, 2 * a, 1.0), rel=1e-12)
    assert K.mesh_ring_phase_time(S, 1, 0, 1, 1.0, B, a) == 0.0
    # link bytes: 3 steps, every ring edge carries S/4, the ring has 10 hops in all
    assert K.ring_phase_link_bytes(S, 4, 10) == pytest.approx(3 * S / 4 * 10, rel=1e-12)


TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 96, "ffn_type": "swiglu",
        "vocab": 100, "seq_len": 16}
HW = {"peak_flops": 1e12, "matmul_efficiency": 0.5, "dram_GBps": 10.0, "dram_pJ_per_bit": 4.0,
      "link_GBps": 2.0, "link_pJ_per_bit": 1.0, "hop_latency_s": 1e-8, "flop_pJ": 0.5, "static_W": 3.0}


def test_volumes_and_flops_by_hand():
    T, w, L = 64, 2.0, 2
    h, kv, f = 64, 32, 96  # kv width = 2 heads x 16
    linears = [(h, h + 2 * kv), (h, h), (h, 2 * f), (f, h)]
    for n in (1, 2, 4):
        N = n * n
        one = C.step("1d-tp", n, TINY, HW, T)
        two = C.step("2d", n, TINY, HW, T)
        flops = L * 3 * (sum(2 * T * i * o for i, o in linears) + 4 * T * 16 * h) / N
        assert one["flops_per_chiplet"] == pytest.approx(flops, rel=1e-12)
        assert two["flops_per_chiplet"] == pytest.approx(flops, rel=1e-12)
        # 1D: 8 ring passes of the activation T h w per layer over the mesh ring of N
        S = T * h * w
        assert one["comm_bytes_per_chiplet"] == pytest.approx(L * 8 * (N - 1) / N * S, rel=1e-12)
        t1 = ring_phase_time(S, N, 2 * 2e9 / K.mesh_ring_congestion(n, True),
                             K.mesh_ring_max_hops(n) * 1e-8, 1.0)
        assert one["comm_s"] == pytest.approx(L * 8 * t1, rel=1e-12)
        assert one["link_byte_hops"] == pytest.approx(L * 8 * (N - 1) / N * S * K.mesh_ring_total_hops(n), rel=1e-12)
        # 2D: per linear layer 2 passes of T in w / n and 2 of T out w / n, over rows or columns of n
        sizes = [T * x * w / n for i, o in linears for x in (i, o)]
        assert two["comm_bytes_per_chiplet"] == pytest.approx(L * sum(2 * (n - 1) / n * s for s in sizes), rel=1e-12)
        t2 = sum(2 * ring_phase_time(s, n, 2e9, K.line_ring_max_hops(n) * 1e-8, 1.0) for s in sizes)
        assert two["comm_s"] == pytest.approx(L * t2, rel=1e-12, abs=0)
        assert two["link_byte_hops"] == pytest.approx(
            L * sum(2 * n * (n - 1) / n * s * 2 * (n - 1) for s in sizes), rel=1e-12, abs=0)
        # weights: all of them, split over the N chiplets, in both schemes
        weights = L * w * sum(i * o for i, o in linears) / N
        assert one["weight_bytes_per_chiplet"] == pytest.approx(weights, rel=1e-12)
        assert two["weight_bytes_per_chiplet"] == pytest.approx(weights, rel=1e-12)


def test_single_chiplet_schemes_agree_and_do_not_communicate():
    one = C.step("1d-tp", 1, TINY, HW, 64)
    two = C.step("2d", 1, TINY, HW, 64)
    assert one["comm_s"] == two["comm_s"] == 0.0 and one["energy_link_J"] == 0.0
    for key in ("flops_per_chiplet", "dram_bytes_per_chiplet", "local_s", "energy_J"):
        assert one[key] == pytest.approx(two[key], rel=1e-12)


def _zero_latency(n, scheme, model="llama2-7b", ref=8, tokens=8 * 4096):
    hw = dict(HW, hop_latency_s=0.0)
    return C.step(scheme, n, model, hw, tokens, reference_side=ref)


def test_weak_scaling_2d_communication_is_constant_up_to_the_ring_factor():
    sides = [1, 2, 4, 8]
    two = {n: _zero_latency(n, "2d") for n in sides}
    one = {n: _zero_latency(n, "1d-tp") for n in sides}
    # 2D: comm time * n/(n-1) is the same on every mesh (h grows like n, the volume like h/n)
    base = two[2]["comm_s"] * 2 / 1
    for n in sides[1:]:
        assert two[n]["comm_s"] * n / (n - 1) == pytest.approx(base, rel=1e-12)
    # 1D: comm time * N/(N-1) grows like n
    base1 = one[2]["comm_s"] * 4 / 3 / 2
    for n in sides[1:]:
        assert one[n]["comm_s"] * n * n / (n * n - 1) / n == pytest.approx(base1, rel=1e-12)
    # GEMM work per chiplet is fixed; only the attention core (4 T s h / N) shrinks
    for n in sides:
        assert two[n]["weight_bytes_per_chiplet"] == pytest.approx(two[8]["weight_bytes_per_chiplet"], rel=1e-12)
    # compute per chiplet = GEMMs (fixed) + attention (~ 1/n): c(n) = a + b/n exactly
    c = {n: two[n]["compute_s"] for n in sides}
    assert c[2] - c[4] == pytest.approx(2 * (c[4] - c[8]), rel=1e-9)
    assert c[1] - c[2] == pytest.approx(2 * (c[2] - c[4]), rel=1e-9)
    assert one[4]["compute_s"] == pytest.approx(c[4], rel=1e-12)
    ratio2 = [two[n]["compute_s"] / two[n]["comm_s"] for n in (4, 8)]
    ratio1 = [one[n]["compute_s"] / one[n]["comm_s"] for n in (4, 8)]
    assert ratio2[1] / ratio2[0] > 0.7  # nearly constant (ring factor and attention share move it)
    assert ratio1[1] / ratio1[0] < 0.5  # halves (and more) when the side doubles


def test_1d_activations_are_replicated_2d_activations_are_split():
    a1 = [_zero_latency(n, "1d-tp")["activation_bytes_per_chiplet"] for n in (2, 4, 8)]
    a2 = [_zero_latency(n, "2d")["activation_bytes_per_chiplet"] for n in (2, 4, 8)]
    assert a1[2] / a1[1] > 1.7 and a1[1] / a1[0] > 1.3  # the replicated inputs T h grow ~ n
    assert a2[2] <= a2[1] <= a2[0]  # T in / n per GEMM: fixed; the attention share shrinks
    assert a1[2] / a2[2] > 2.5 > a1[0] / a2[0]


hw_values = st.fixed_dictionaries({
    "peak_flops": st.floats(1e11, 1e15), "matmul_efficiency": st.floats(0.05, 1.0),
    "dram_GBps": st.floats(1.0, 4000.0), "dram_pJ_per_bit": st.floats(0.0, 30.0),
    "link_GBps": st.floats(1.0, 2000.0), "link_pJ_per_bit": st.floats(0.0, 5.0),
    "hop_latency_s": st.floats(0.0, 1e-6), "flop_pJ": st.floats(0.0, 5.0), "static_W": st.floats(0.0, 50.0)})


TOKENS_ALL_SIDES = 2520 * 16  # 2520 sequences of 16: whole sequences per block for every side <= 10


@settings(max_examples=40, deadline=None)
@given(hw=hw_values, n=st.integers(1, 9), scheme=st.sampled_from(C.SCHEMES))
def test_energy_is_non_negative_and_additive(hw, n, scheme):
    r = C.step(scheme, n, TINY, hw, TOKENS_ALL_SIDES)
    parts = [r[k] for k in ("energy_compute_J", "energy_dram_J", "energy_link_J", "energy_static_J")]
    assert all(p >= 0.0 for p in parts)
    assert r["energy_J"] == pytest.approx(sum(parts), rel=1e-12)
    N = n * n
    assert r["energy_link_J"] == pytest.approx(8 * r["link_byte_hops"] * hw["link_pJ_per_bit"] * 1e-12, rel=1e-12)
    assert r["energy_static_J"] == pytest.approx(N * hw["static_W"] * r["step_s"], rel=1e-12)
    assert r["step_s"] == pytest.approx(r["local_s"] + r["comm_s"], rel=1e-12)
    assert r["local_s"] >= max(r["compute_s"], r["dram_s"]) * (1 - 1e-12)
    # more link bandwidth is never slower
    faster = C.step(scheme, n, TINY, dict(hw, link_GBps=2 * hw["link_GBps"]), TOKENS_ALL_SIDES)
    assert faster["step_s"] <= r["step_s"] * (1 + 1e-12)


def test_catalog_chiplets_carry_sources():
    for name, entry in C.chiplets().items():
        spec = C.resolve_chiplet(name)
        for field in C.ChipletSpec.numeric_fields():
            assert entry[field]["source"], (name, field)
            assert getattr(spec, field) == float(entry[field]["value"])


def test_errors_name_the_field():
    with pytest.raises(SpecError) as err:
        C.resolve_chiplet("hecaton-standard", {"link_GBps": -1.0})
    assert err.value.field == "link_GBps"
    with pytest.raises(SpecError) as err:
        C.resolve_chiplet("hecaton-standard", {"warp_drive": 1.0})
    assert err.value.field == "chiplet_overrides"
    with pytest.raises(SpecError) as err:
        C.resolve_chiplet("no-such-chiplet")
    assert err.value.field == "chiplet"
    with pytest.raises(SpecError) as err:
        C.step("3d", 2, TINY, HW, 64)
    assert err.value.field == "scheme"
    with pytest.raises(SpecError) as err:  # 3 sequences cannot be cut into 2 whole-sequence blocks
        C.step("2d", 2, TINY, HW, 48)
    assert err.value.field == "tokens_per_step"
