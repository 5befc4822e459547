"""Gradient compressors: contraction and variance bounds, unbiasedness, NumPy references on the
same uniforms, PowerSGD exactness, error feedback on a constructed stall, bit counts, determinism."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trainscale.training import compression as CP
from trainscale.kernels import compress as K
from trainscale.model.specs import SpecError

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EMPTY = np.zeros(0)

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
# small integers make many ties in |x|
tied = st.integers(-3, 3).map(float)


def vectors(elements=finite, min_size=1, max_size=40):
    return st.lists(elements, min_size=min_size, max_size=max_size).map(np.array)


def key(seed, worker, step):
    return np.uint64(K.call_key(seed, worker, step))


def params(k=0, scale=1, levels=0, elias=0, rank=0, rows=0, ef=0):
    return K.make_params(*(float(v) for v in (k, scale, levels, elias, rank, rows, ef)))


def draws(code, x, p, n, seed=0):
    """``n`` independent compressions of ``x`` (steps 0..n-1 of worker 0); rows are C(x)."""
    outs = np.empty((n, x.size))
    for t in range(n):
        K.compress(code, x, outs[t], EMPTY, p, key(seed, 0, t))
    return outs


# --------------------------------------------------------------------------- references

def top_k_reference(x, k):
    keep = np.argsort(-np.abs(x), kind="stable")[:k]  # ties: lower index first
    out = np.zeros_like(x)
    out[keep] = x[keep]
    return out


def random_k_reference(x, k, scale, u):
    """Knuth's selection sampling (Algorithm S) on the given uniforms."""
    d = x.size
    out = np.zeros_like(x)
    taken = 0
    for i in range(d):
        if taken < k and u[i] * (d - i) < k - taken:
            out[i] = x[i] * (d / k if scale else 1.0)
            taken += 1
    return out


def qsgd_reference(x, s, u):
    norm = np.linalg.norm(x)
    if norm == 0:
        return np.zeros_like(x)
    a = s * np.abs(x) / norm
    level = np.minimum(np.floor(a), s)
    level = level + (u < a - level)
    return np.where(x >= 0, 1.0, -1.0) * norm * level / s


def qsgd_variance(x, s):
    """Exact E‖Q(x) − x‖² = (‖x‖²/s²) Σ p_i (1 − p_i), p_i the fractional part of s|x_i|/‖x‖."""
    norm = np.linalg.norm(x)
    if norm == 0:
        return 0.0
    a = s * np.abs(x) / norm
    p = a - np.floor(a)
    return norm**2 / s**2 * float(np.sum(p * (1 - p)))


def elias_omega(n):
    """The Elias-ω code of n >= 1 as a bit string (Elias 1975)."""
    code = "0"
    while n > 1:
        b = bin(n)[2:]
        code = b + code
        n = len(b) - 1
    return code


# --------------------------------------------------------------------------- top-k

@SETTINGS
@given(x=vectors(st.one_of(finite, tied)), kf=st.floats(0, 1))
def test_top_k_is_a_contraction_and_keeps_the_k_largest(x, kf):
    d = x.size
    k = max(1, round(kf * d))
    out = np.empty(d)
    bits = K.compress(K.TOP_K, x, out, EMPTY, params(k=k), key(0, 0, 0))
    np.testing.assert_array_equal(out, top_k_reference(x, k))
    err2 = float(np.sum((out - x) ** 2))
    assert err2 <= (1 - k / d) * float(np.sum(x * x)) * (1 + 1e-12) + 1e-300
    assert bits == k * (32 + math.ceil(math.log2(d)))


def test_top_k_ties_go_to_lower_indices():
    x = np.array([1.0, -2.0, 2.0, 0.5, -2.0, 2.0])
    out = np.empty(6)
    K.compress(K.TOP_K, x, out, EMPTY, params(k=2), key(0, 0, 0))
    np.testing.assert_array_equal(out, [0, -2.0, 2.0, 0, 0, 0])
    K.compress(K.TOP_K, x, out, EMPTY, params(k=4), key(0, 0, 0))
    np.testing.assert_array_equal(out, [0, -2.0, 2.0, 0, -2.0, 2.0])


# --------------------------------------------------------------------------- random-k

@SETTINGS
@given(x=vectors(), kf=st.floats(0, 1), scale=st.booleans(), seed=st.integers(0, 2**31))
def test_random_k_matches_reference_and_keeps_exactly_k(x, kf, scale, seed):
    d = x.size
    k = max(1, round(kf * d))
    kk = key(seed, 3, 7)
    out = np.empty(d)
    K.compress(K.RANDOM_K, x, out, EMPTY, params(k=k, scale=int(scale)), kk)
    np.testing.assert_array_equal(out, random_k_reference(x, k, scale, K.uniforms(kk, d)))
    # exactly k entries chosen (count on a vector with no zeros)
    K.compress(K.RANDOM_K, np.ones(d), out, EMPTY, params(k=k, scale=int(scale)), kk)
    assert np.count_nonzero(out) == k


def test_random_k_is_unbiased_with_its_variance():
    """d = 20, k = 5, N = 40 000 draws. Unbiased: every |mean_i − x_i| within 5 standard errors
    (sd_i = |x_i| √(d/k − 1)). Variance: E‖C − x‖² = (d/k − 1)‖x‖² = 3‖x‖², measured within 2 %.
    Inclusion frequency of every index within 0.01 of k/d = 0.25. Unscaled: (1 − k/d)‖x‖² within 2 %."""
    rng = np.random.default_rng(1)
    d, k, n = 20, 5, 40_000
    x = rng.normal(size=d)
    nx2 = float(x @ x)
    outs = draws(K.RANDOM_K, x, params(k=k, scale=1), n)
    se = np.abs(x) * math.sqrt(d / k - 1) / math.sqrt(n)
    assert np.all(np.abs(outs.mean(axis=0) - x) <= 5 * se)
    var = float(np.mean(np.sum((outs - x) ** 2, axis=1)))
    assert abs(var / ((d / k - 1) * nx2) - 1) < 0.02
    assert np.max(np.abs((outs != 0).mean(axis=0) - k / d)) < 0.01
    plain = draws(K.RANDOM_K, x, params(k=k, scale=0), n, seed=2)
    var0 = float(np.mean(np.sum((plain - x) ** 2, axis=1)))
    assert abs(var0 / ((1 - k / d) * nx2) - 1) < 0.02


# --------------------------------------------------------------------------- QSGD

@SETTINGS
@given(x=vectors(), s=st.integers(1, 16), seed=st.integers(0, 2**31))
def test_qsgd_matches_reference_and_variance_bound(x, s, seed):
    d = x.size
    kk = key(seed, 1, 2)
    out = np.empty(d)
    K.compress(K.QSGD, x, out, EMPTY, params(levels=s), kk)
    np.testing.assert_allclose(out, qsgd_reference(x, s, K.uniforms(kk, d)), rtol=1e-14, atol=0)
    # levels are integers in 0..s
    norm = np.linalg.norm(x)
    if norm > 0:
        lv = np.abs(out) * s / norm
        assert np.all(np.abs(lv - np.round(lv)) < 1e-9) and np.all(lv <= s + 1e-9)
    # Alistarh et al. Lemma 3.1 on the exact variance
    assert qsgd_variance(x, s) <= min(d / s**2, math.sqrt(d) / s) * norm**2 * (1 + 1e-12)


@pytest.mark.parametrize("s", [1, 4])
def test_qsgd_is_unbiased_with_its_variance(s):
    """d = 30, N = 40 000 draws: every |mean_i − x_i| within 5 standard errors (exact per-entry
    variance (‖x‖/s)² p_i(1 − p_i)); measured E‖Q − x‖² within 2 % of the exact value, which is
    below min(d/s², √d/s)‖x‖²."""
    rng = np.random.default_rng(3)
    d, n = 30, 40_000
    x = rng.normal(size=d)
    outs = draws(K.QSGD, x, params(levels=s), n, seed=s)
    norm = np.linalg.norm(x)
    a = s * np.abs(x) / norm
    p = a - np.floor(a)
    se = norm / s * np.sqrt(p * (1 - p)) / math.sqrt(n)
    assert np.all(np.abs(outs.mean(axis=0) - x) <= 5 * se + 1e-15)
    exact = qsgd_variance(x, s)
    var = float(np.mean(np.sum((outs - x) ** 2, axis=1)))
    assert abs(var / exact - 1) < 0.02
    assert exact <= min(d / s**2, math.sqrt(d) / s) * norm**2


# --------------------------------------------------------------------------- PowerSGD

def power_step_reference(M, Q):
    P, _ = np.linalg.qr(M @ Q)
    return P @ (P.T @ M)


def low_rank(m, n, r, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(m, r)) @ rng.normal(size=(r, n))


@pytest.mark.parametrize("m,n,true_rank,r", [(12, 9, 1, 1), (12, 9, 2, 3), (10, 16, 4, 4), (7, 7, 3, 5)])
def test_powersgd_exact_for_rank_at_most_r(m, n, true_rank, r):
    M = low_rank(m, n, true_rank, seed=m * n + r)
    x = M.ravel()
    p = params(rank=r, rows=m)
    state = np.zeros(K.state_size(K.POWER_SGD, x.size, p))
    K.init_state(K.POWER_SGD, x.size, p, key(5, 0, -1), state)
    Q0 = state.reshape(n, min(r, m, n)).copy()
    out = np.empty(x.size)
    bits = K.compress(K.POWER_SGD, x, out, state, p, key(5, 0, 0))
    assert np.linalg.norm(out - x) <= 1e-10 * np.linalg.norm(x)
    np.testing.assert_allclose(out, power_step_reference(M, Q0).ravel(), rtol=0, atol=1e-10 * np.abs(x).max())
    assert bits == 32 * min(r, m, n) * (m + n)


def test_powersgd_error_decreases_with_rank_and_warm_start_reaches_best_rank_r():
    """A 24 × 20 matrix with singular values 2^-j. After one step from the same seed the error is
    non-increasing in r (nested random Q). After 30 warm-started steps it is within 1e-6 (relative)
    of the Eckart–Young optimum ‖M − M_r‖² = Σ_{j>=r} σ_j²."""
    rng = np.random.default_rng(7)
    m, n = 24, 20
    U, _ = np.linalg.qr(rng.normal(size=(m, n)))
    V, _ = np.linalg.qr(rng.normal(size=(n, n)))
    sigma = 2.0 ** -np.arange(n)
    M = (U * sigma) @ V.T
    x = M.ravel()
    first, final = [], []
    for r in range(1, 7):
        p = params(rank=r, rows=m)
        state = np.zeros(K.state_size(K.POWER_SGD, x.size, p))
        K.init_state(K.POWER_SGD, x.size, p, key(11, 0, -1), state)
        out = np.empty(x.size)
        for t in range(30):
            K.compress(K.POWER_SGD, x, out, state, p, key(11, 0, t))
            if t == 0:
                first.append(float(np.sum((out - x) ** 2)))
        final.append(float(np.sum((out - x) ** 2)))
        best = float(np.sum(sigma[r:] ** 2))
        assert abs(final[-1] - best) <= 1e-6 * best
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(first))
    assert all(b < a for a, b in itertools.pairwise(final))


def test_powersgd_vector_view_and_zero_input():
    d = 10  # m = 3, n = 4, two padding zeros
    assert K.matrix_shape(d, 0) == (3, 4)
    assert K.matrix_shape(16, 0) == (4, 4) and K.matrix_shape(17, 0) == (4, 5)
    p = params(rank=2)
    state = np.zeros(K.state_size(K.POWER_SGD, d, p))
    assert state.size == 4 * 2
    K.init_state(K.POWER_SGD, d, p, key(0, 0, -1), state)
    Q0 = state.copy()
    out = np.empty(d)
    assert K.compress(K.POWER_SGD, np.zeros(d), out, state, p, key(0, 0, 0)) == 32 * 2 * (3 + 4)
    assert np.all(out == 0)
    np.testing.assert_array_equal(state, Q0)  # a zero Q column keeps its previous value
    x = np.arange(1.0, d + 1)
    K.compress(K.POWER_SGD, x, out, state, p, key(0, 0, 1))
    M = np.concatenate([x, np.zeros(2)]).reshape(3, 4)
    np.testing.assert_allclose(out, power_step_reference(M, Q0.reshape(4, 2)).ravel()[:d], atol=1e-12)


# --------------------------------------------------------------------------- error feedback

def distributed_gd(code, k, ef, eta=0.1, steps=500):
    """Two workers, gradients g_w = A_w (w − w*) with A_1 = I + B, A_2 = I − B, B = [[0, 2], [2, 0]]:
    the average is the gradient of ½‖w − w*‖². From w* + (0, 1) each worker's largest entry is the
    first, ±2, and they cancel, so top-1 without error feedback never moves (the second coordinate
    is never selected)."""
    B = np.array([[0.0, 2.0], [2.0, 0.0]])
    A = [np.eye(2) + B, np.eye(2) - B]
    w_star = np.array([1.0, -2.0])
    p = params(k=k, scale=0, ef=int(ef))
    states = [np.zeros(K.state_size(code, 2, p)) for _ in A]
    w = w_star + np.array([0.0, 1.0])
    out = np.empty(2)
    bits = 0
    for t in range(steps):
        total = np.zeros(2)
        for worker, Aw in enumerate(A):
            bits += K.compress(code, Aw @ (w - w_star), out, states[worker], p, key(0, worker, t))
            total += out
        w = w - eta * total / len(A)
    return float(np.linalg.norm(w - w_star)), bits


def test_error_feedback_recovers_what_top_k_loses():
    full, _ = distributed_gd(K.NONE, 0, False)
    plain, _ = distributed_gd(K.TOP_K, 1, False)
    fixed, bits = distributed_gd(K.TOP_K, 1, True)
    assert full < 1e-12                 # uncompressed GD converges
    assert plain == 1.0                 # plain top-1 never moves: stuck at distance 1
    assert fixed < 1e-12                # top-1 with error feedback converges to w*
    assert bits == 500 * 2 * (32 + 1)   # one value + a 1-bit index per worker per step


@pytest.mark.parametrize("code,extra", [(K.TOP_K, {"k": 3}), (K.RANDOM_K, {"k": 3, "scale": 0}),
                                        (K.QSGD, {"levels": 2}), (K.POWER_SGD, {"rank": 1}),
                                        (K.NONE, {})])
def test_error_feedback_telescopes(code, extra):
    """Σ_t sent_t = Σ_t x_t − e_T for any compressor, and error_feedback == compress with P_EF."""
    rng = np.random.default_rng(code)
    d = 12
    p = params(ef=1, **extra)
    p0 = params(ef=0, **extra)
    state = np.zeros(K.state_size(code, d, p))
    K.init_state(code, d, p, key(0, 0, -1), state)
    err = np.zeros(d)
    cstate = state[d:].copy()
    sent = np.zeros(d)
    total = np.zeros(d)
    out, out2 = np.empty(d), np.empty(d)
    for t in range(20):
        x = rng.normal(size=d)
        b1 = K.compress(code, x, out, state, p, key(0, 0, t))
        b2 = K.error_feedback(code, x, out2, err, cstate, p0, key(0, 0, t))
        assert b1 == b2
        np.testing.assert_array_equal(out, out2)
        sent += out
        total += x
    np.testing.assert_allclose(sent, total - state[:d], atol=1e-12)


# --------------------------------------------------------------------------- bits

def test_bit_counts():
    rng = np.random.default_rng(0)
    out = np.empty(1000)
    x = rng.normal(size=1000)
    assert K.compress(K.NONE, x, out, EMPTY, params(), key(0, 0, 0)) == 32 * 1000
    assert K.compress(K.TOP_K, x, out, EMPTY, params(k=10), key(0, 0, 0)) == 10 * (32 + 10)
    assert K.compress(K.RANDOM_K, x, out, EMPTY, params(k=10), key(0, 0, 0)) == 10 * (32 + 10)
    for d, index_bits in [(1, 0), (2, 1), (1024, 10), (1025, 11)]:
        assert K.compress(K.TOP_K, np.ones(d), np.empty(d), EMPTY, params(k=1), key(0, 0, 0)) == 32 + index_bits
    # QSGD fixed width: norm + (sign + level in 0..s) per entry
    assert K.compress(K.QSGD, x, out, EMPTY, params(levels=1), key(0, 0, 0)) == 32 + 1000 * 2
    assert K.compress(K.QSGD, x, out, EMPTY, params(levels=4), key(0, 0, 0)) == 32 + 1000 * 4
    assert K.compress(K.QSGD, x, out, EMPTY, params(levels=3), key(0, 0, 0)) == 32 + 1000 * 3
    # PowerSGD on the 31 x 33 view of 1000 entries (m = ⌊√1000⌋ = 31, n = ⌈1000/31⌉ = 33)
    p = params(rank=4)
    state = np.zeros(K.state_size(K.POWER_SGD, 1000, p))
    K.init_state(K.POWER_SGD, 1000, p, key(0, 0, -1), state)
    assert K.compress(K.POWER_SGD, x, out, state, p, key(0, 0, 0)) == 32 * 4 * (31 + 33)
    for code, p in [(K.NONE, params()), (K.TOP_K, params(k=10)), (K.QSGD, params(levels=3)),
                    (K.POWER_SGD, params(rank=4))]:
        assert K.nominal_bits(code, 1000, p) > 0


def test_elias_omega_lengths_and_qsgd_code_s():
    assert [elias_omega(n) for n in (1, 2, 3, 4, 7, 8)] == ["0", "100", "110", "101000", "101110",
                                                           "1110000"]
    for n in range(1, 2000):
        assert K.elias_omega_bits(n) == len(elias_omega(n))
    rng = np.random.default_rng(4)
    for s in (1, 3, 8):
        x = rng.normal(size=50) * (rng.random(50) < 0.5)
        kk = key(9, 0, s)
        out = np.empty(50)
        bits = K.compress(K.QSGD, x, out, EMPTY, params(levels=s, elias=1), kk)
        level = np.rint(np.abs(out) * s / np.linalg.norm(x)).astype(int)
        nz = np.flatnonzero(level)
        gaps = np.diff(np.concatenate([[-1], nz]))
        expected = 32 + sum(len(elias_omega(int(g))) + 1 + len(elias_omega(int(level[i])))
                            for g, i in zip(gaps, nz))
        assert bits == expected


# --------------------------------------------------------------------------- determinism and API

def test_same_seed_same_outputs_and_keys_are_distinct():
    x = np.random.default_rng(0).normal(size=64)
    for spec in [CP.CompressorSpec("random_k", k=8), CP.CompressorSpec("qsgd", levels=2),
                 CP.CompressorSpec("powersgd", rank=2, error_feedback=True),
                 CP.CompressorSpec("top_k", ratio=0.1, error_feedback=True)]:
        a = CP.compress(x, spec, seed=3, worker=1, step=5)
        b = CP.compress(x, spec, seed=3, worker=1, step=5)
        np.testing.assert_array_equal(a.out, b.out)
        np.testing.assert_array_equal(a.state, b.state)
        assert a.bits == b.bits
    spec = CP.CompressorSpec("qsgd", levels=2)
    outs = [CP.compress(x, spec, seed=s, worker=w, step=t).out for s, w, t in [(3, 1, 5), (4, 1, 5),
                                                                              (3, 2, 5), (3, 1, 6)]]
    for i in range(1, 4):
        assert not np.array_equal(outs[0], outs[i])
    keys = {int(CP.key(s, w, t)) for s in range(4) for w in range(4) for t in range(-1, 4)}
    assert len(keys) == 4 * 4 * 5


def test_api_matches_kernel_and_state_carries():
    x = np.random.default_rng(2).normal(size=30)
    spec = CP.CompressorSpec.from_dict({"name": "top_k", "k": 3, "error_feedback": True})
    assert spec.code == K.TOP_K and spec.state_size(30) == 30
    np.testing.assert_array_equal(spec.params(30), params(k=3, ef=1))
    state = spec.init_state(30, seed=0)
    r1 = CP.compress(x, spec, seed=0, step=0, state=state)
    assert r1.state is state and r1.bits == 3 * (32 + 5)
    np.testing.assert_array_equal(state, x - r1.out)
    assert CP.CompressorSpec("random_k", ratio=0.1).params(30)[K.P_K] == 3
    assert CP.CompressorSpec("powersgd", rank=2).nominal_bits(30) == 32 * 2 * (5 + 6)
    assert CP.resolve_compressor("none") == CP.CompressorSpec()


@pytest.mark.parametrize("d,field", [
    ({"name": "zip"}, "name"),
    ({"name": "top_k"}, "k"),
    ({"name": "top_k", "k": 2, "ratio": 0.1}, "k"),
    ({"name": "top_k", "k": 0}, "k"),
    ({"name": "random_k", "ratio": 1.5}, "ratio"),
    ({"name": "qsgd"}, "levels"),
    ({"name": "qsgd", "levels": 2.5}, "levels"),
    ({"name": "powersgd"}, "rank"),
    ({"name": "none", "rank": 2}, "rank"),
    ({"name": "top_k", "k": 1, "error_feedback": "yes"}, "error_feedback"),
    ({"name": "top_k", "k": 1, "momentum": 0.9}, "momentum"),
])
def test_invalid_specs_name_the_field(d, field):
    with pytest.raises(SpecError) as e:
        CP.CompressorSpec.from_dict(d, where="config.compression")
    assert e.value.field == field and "config.compression" in str(e.value)


def test_invalid_inputs_name_the_field():
    with pytest.raises(SpecError) as e:
        CP.CompressorSpec("top_k", k=40).params(30)
    assert e.value.field == "k"
    with pytest.raises(SpecError) as e:
        CP.CompressorSpec("powersgd", rank=6).params(30)  # 5 x 6 view
    assert e.value.field == "rank"
    with pytest.raises(SpecError) as e:
        CP.compress(np.ones((2, 2)), "none", seed=0, step=0)
    assert e.value.field == "x"
    with pytest.raises(SpecError) as e:
        CP.compress([1.0, np.nan], "none", seed=0, step=0)
    assert e.value.field == "x"
    with pytest.raises(SpecError) as e:
        CP.compress([1.0, 2.0], {"name": "top_k", "k": 1, "error_feedback": True}, seed=0, step=0,
                    state=np.zeros(3))
    assert e.value.field == "state"
    with pytest.raises(SpecError) as e:
        CP.key(-1, 0, 0)
    assert e.value.field == "seed"


@SETTINGS
@given(a=vectors(st.one_of(finite, tied)), jf=st.floats(0, 1))
def test_select_is_the_jth_smallest(a, jf):
    j = min(a.size - 1, int(jf * a.size))
    assert K.select(a.copy(), j) == np.sort(a)[j]
