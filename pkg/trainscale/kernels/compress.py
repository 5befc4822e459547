"""Gradient compressors: top-k, random-k, QSGD, PowerSGD, and error feedback around any of them.

One dispatcher, :func:`compress`, serves every optimiser kernel::

    bits = compress(code, x, out, state, params, key)

* ``code``: ``NONE`` (0), ``TOP_K`` (1), ``RANDOM_K`` (2), ``QSGD`` (3), ``POWER_SGD`` (4);
* ``x``: ``float64[d]``, the vector to send (not modified);
* ``out``: ``float64[d]``, receives ``C(x)``, what the receiver reconstructs;
* ``state``: ``float64[state_size(code, d, params)]``, per-worker memory kept between calls
  (``[error (d, only with error feedback) | PowerSGD's Q (n r)]``), set up by :func:`init_state`;
* ``params``: ``float64[NPARAM]``, slots ``P_*`` below (:func:`make_params` fills them);
* ``key``: ``uint64``, the call's random key, ``call_key(seed, worker, step)``;
* returns the number of bits the message would take on the wire (``int64``).

Randomness is counter-based: uniform number ``i`` of a call is a hash of ``(key, i)``
(:func:`uniform`, SplitMix64's finaliser), and ``key`` is a hash of ``(seed, worker, step)``.
So a call's draws depend only on those three integers, never on thread scheduling or on how
many numbers other workers or earlier steps used, and no generator state is carried around.

Compressors (``‖·‖`` is the Euclidean norm, ``d`` the length of ``x``):

* ``NONE``: ``C(x) = x``; ``32 d`` bits.
* ``TOP_K``: keep the ``k`` entries of largest ``|x_i|`` (ties: lower index first), zero the rest.
  Deterministic and biased; a δ-contraction with δ = k/d:
  ``‖C(x) − x‖² ≤ (1 − k/d) ‖x‖²``. Bits ``k (32 + ⌈log2 d⌉)`` (value and index of each entry).
* ``RANDOM_K``: keep a uniformly random ``k``-subset (selection sampling, Knuth's Algorithm S:
  entry ``i`` is taken if ``u_i < (k − taken)/(d − i)``), scaled by ``d/k`` when ``P_SCALE = 1``
  (unbiased: ``E C(x) = x``, ``E‖C(x) − x‖² = (d/k − 1)‖x‖²``) or unscaled when ``P_SCALE = 0``
  (biased, a contraction in expectation: ``E‖C(x) − x‖² = (1 − k/d)‖x‖²``; the usual choice
  under error feedback). Bits ``k (32 + ⌈log2 d⌉)``, as for top-k (indices are sent, not
  regenerated from a shared seed).
* ``QSGD`` with ``s`` levels (Alistarh et al. 2017, NeurIPS, "QSGD", eq. (1)):
  ``Q(x)_i = ‖x‖ sign(x_i) ξ_i``, ``ξ_i = (l + 1)/s`` with probability ``s|x_i|/‖x‖ − l`` else
  ``l/s``, ``l = ⌊s|x_i|/‖x‖⌋``. Unbiased; ``E‖Q(x) − x‖² = (‖x‖²/s²) Σ p_i (1 − p_i)`` with
  ``p_i = s|x_i|/‖x‖ − l`` the fractional part, and ``≤ min(d/s², √d/s) ‖x‖²`` (their Lemma 3.1).
  Bits, ``P_ELIAS = 0`` (fixed width): ``32 + d (1 + ⌈log2 (s + 1)⌉)`` (the norm, then a sign bit
  and a level in ``0..s`` per entry). ``P_ELIAS = 1`` (their Code_s, data-dependent): ``32`` for
  the norm, then for each nonzero level in index order ``Elias-ω(gap) + 1 + Elias-ω(level)``,
  where ``gap`` is the distance from the previous nonzero (the first one's index + 1) and
  Elias-ω (recursive) code length is ``L(1) = 1``, ``L(n) = ⌊log2 n⌋ + 1 + L(⌊log2 n⌋)``.
* ``POWER_SGD`` with rank ``r`` (Vogels et al. 2019, NeurIPS, "PowerSGD", Algorithm 1, one worker):
  ``x`` is laid row-major into an ``m × n`` matrix ``M`` (``m = P_ROWS``, or ``⌊√d⌋`` when 0;
  ``n = ⌈d/m⌉``; zero padding), then ``P = M Q``, ``P̂ = orth(P)`` (Gram–Schmidt, twice),
  ``Q ← Mᵀ P̂``, ``C(x) = P̂ Qᵀ = P̂ P̂ᵀ M``: the projection of ``M`` on ``span(M Q_old)``, so
  ``‖C(x) − x‖ ≤ ‖x‖``, exact when ``rank M ≤ r`` and ``M Q_old`` has rank ``rank M``, and
  nested in ``r`` (column ``j`` of the initial ``Q`` does not depend on ``r``). ``Q`` lives in
  the state and warm-starts the next call (one power iteration per step); a column that comes
  out zero keeps its previous value so it never dies. The initial ``Q`` is i.i.d. N(0, 1)
  (Box–Muller on the counter-based uniforms). ``r`` is clamped to ``min(m, n)``.
  Bits ``32 r (m + n)`` (``P`` and ``Q``).
* Error feedback (``P_EF = 1``; Seide et al. 2014, Karimireddy et al. 2019):
  ``e ← e + x; c = C(e); e ← e − c``, sending ``c``; ``e`` is the first ``d`` slots of ``state``.
  :func:`error_feedback` is the same wrapper with the error passed on its own.

Floats on the wire are 32-bit (``FLOAT_BITS``); the kernels compute in float64.
"""

import numpy as np
from numba import njit

NONE = 0
TOP_K = 1
RANDOM_K = 2
QSGD = 3
POWER_SGD = 4
NCODES = 5

# params slots (float64[NPARAM])
P_K = 0        # k, entries kept by TOP_K and RANDOM_K
P_SCALE = 1    # RANDOM_K: 1 = scale by d/k (unbiased), 0 = plain
P_LEVELS = 2   # QSGD: s, number of levels (>= 1)
P_ELIAS = 3    # QSGD: 0 = fixed-width bit count, 1 = Elias-omega (Code_s) bit count
P_RANK = 4     # POWER_SGD: r
P_ROWS = 5     # POWER_SGD: rows m of the matrix view; 0 = floor(sqrt(d))
P_EF = 6       # 1 = error feedback around the compressor (state starts with the error)
NPARAM = 7

FLOAT_BITS = 32

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_ONE = np.uint64(1)
_NORMAL_SALT = np.uint64(0x6A09E667F3BCC909)
_TWO_M53 = 1.0 / 9007199254740992.0


# --------------------------------------------------------------------------- randomness

@njit(cache=True)
def mix64(z):
    """SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijection of uint64 that scrambles bits."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(cache=True)
def call_key(seed, worker, step):
    """The random key of one compression call: a hash of ``(seed, worker, step)`` (int64 each).

    Each stage is a bijection in its argument, so distinct triples give distinct keys."""
    h = mix64(np.uint64(seed) + _GOLDEN)
    h = mix64(h + np.uint64(worker) + _GOLDEN)
    return mix64(h + np.uint64(step) + _GOLDEN)


@njit(cache=True)
def uniform(key, i):
    """Uniform number ``i`` (int64 >= 0) of the call with ``key``, in ``[0, 1)`` with 53 bits."""
    h = mix64(np.uint64(key) + (np.uint64(i) + _ONE) * _GOLDEN)
    return np.float64(h >> _S11) * _TWO_M53


@njit(cache=True)
def uniforms(key, n):
    """``uniform(key, i)`` for ``i < n``, as an array (for references and tests)."""
    u = np.empty(n, np.float64)
    key = np.uint64(key)
    for i in range(n):
        u[i] = uniform(key, i)
    return u


@njit(cache=True)
def normal(key, i):
    """Standard normal number ``i`` of ``key`` (Box–Muller on a separate stream of uniforms)."""
    k = mix64(np.uint64(key) ^ _NORMAL_SALT)
    u1 = 1.0 - uniform(k, 2 * i)  # (0, 1]
    u2 = uniform(k, 2 * i + 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


# --------------------------------------------------------------------------- bit counts

@njit(cache=True)
def ceil_log2(n):
    """``⌈log2 n⌉`` for an integer ``n >= 1`` (0 for n = 1): the bits of an index below n."""
    b = 0
    v = n - 1
    while v > 0:
        b += 1
        v >>= 1
    return b


@njit(cache=True)
def floor_log2(n):
    """``⌊log2 n⌋`` for an integer ``n >= 1``."""
    b = -1
    while n > 0:
        b += 1
        n >>= 1
    return b


@njit(cache=True)
def elias_omega_bits(n):
    """Length of the Elias-ω (recursive) code of an integer ``n >= 1``."""
    bits = 1  # the terminating 0
    while n > 1:
        f = floor_log2(n)
        bits += f + 1
        n = f
    return bits


@njit(cache=True)
def sparse_bits(k, d):
    """``k`` values and ``k`` indices into ``d`` entries: ``k (32 + ⌈log2 d⌉)``."""
    return k * (FLOAT_BITS + ceil_log2(d))


@njit(cache=True)
def qsgd_fixed_bits(d, s):
    """QSGD, fixed width: ``32 + d (1 + ⌈log2 (s + 1)⌉)``."""
    return FLOAT_BITS + d * (1 + ceil_log2(s + 1))


@njit(cache=True)
def matrix_shape(d, rows):
    """PowerSGD's matrix view of a length-``d`` vector: ``(m, n)`` with ``m n >= d``."""
    m = rows
    if m <= 0:
        m = int(np.floor(np.sqrt(d)))
        while m * m > d:  # guard against rounding of sqrt
            m -= 1
        while (m + 1) * (m + 1) <= d:
            m += 1
        m = max(m, 1)
    n = (d + m - 1) // m
    return m, n


@njit(cache=True)
def _rank(d, params):
    m, n = matrix_shape(d, int(params[P_ROWS]))
    r = int(params[P_RANK])
    return min(r, m, n), m, n


@njit(cache=True)
def nominal_bits(code, d, params):
    """Bits of one message where that does not depend on the data (QSGD: the fixed-width count,
    which ``P_ELIAS = 1`` replaces by the data-dependent Code_s length)."""
    if code == TOP_K or code == RANDOM_K:
        return sparse_bits(int(params[P_K]), d)
    if code == QSGD:
        return qsgd_fixed_bits(d, int(params[P_LEVELS]))
    if code == POWER_SGD:
        r, m, n = _rank(d, params)
        return FLOAT_BITS * r * (m + n)
    return FLOAT_BITS * d


# --------------------------------------------------------------------------- state

@njit(cache=True)
def compressor_state_size(code, d, params):
    """Slots of the compressor's own state (PowerSGD's ``Q``: ``n r``; others none)."""
    if code == POWER_SGD:
        r, _m, n = _rank(d, params)
        return n * r
    return 0


@njit(cache=True)
def state_size(code, d, params):
    """Slots of ``state`` for :func:`compress`: ``d`` for the error (with ``P_EF``) + the compressor's."""
    ef = d if params[P_EF] != 0.0 else 0
    return ef + compressor_state_size(code, d, params)


@njit(cache=True)
def init_compressor_state(code, d, params, key, cstate):
    """Initial compressor state: PowerSGD's ``Q[i, j] = normal(key, j n + i)`` (column-major,
    so column ``j`` does not depend on ``r``), stored row-major ``n × r``."""
    if code == POWER_SGD:
        r, _m, n = _rank(d, params)
        for j in range(r):
            for i in range(n):
                cstate[i * r + j] = normal(key, j * n + i)


@njit(cache=True)
def init_state(code, d, params, key, state):
    """Zero error (with ``P_EF``) followed by :func:`init_compressor_state`.

    Convention: ``key = call_key(seed, worker, -1)``, the step before the first."""
    ef = d if params[P_EF] != 0.0 else 0
    for i in range(ef):
        state[i] = 0.0
    init_compressor_state(code, d, params, key, state[ef:])


# --------------------------------------------------------------------------- compressors

@njit(cache=True)
def identity(x, out):
    """``C(x) = x``; returns bits ``32 d``."""
    d = x.shape[0]
    for i in range(d):
        out[i] = x[i]
    return FLOAT_BITS * d


@njit(cache=True)
def select(a, j):
    """The ``j``-th smallest entry of ``a`` (0-based), as ``np.sort(a)[j]``; reorders ``a``.

    Hoare's quickselect with a median-of-three pivot (numba's ``np.partition`` costs seconds of
    compilation)."""
    lo = 0
    hi = a.shape[0] - 1
    while lo < hi:
        mid = (lo + hi) // 2
        p0 = a[lo]
        p1 = a[mid]
        p2 = a[hi]
        if p0 > p1:
            p0, p1 = p1, p0
        if p1 > p2:
            p1 = p2
            p1 = max(p1, p0)
        pivot = p1
        i = lo
        k = hi
        while i <= k:
            while a[i] < pivot:
                i += 1
            while a[k] > pivot:
                k -= 1
            if i <= k:
                a[i], a[k] = a[k], a[i]
                i += 1
                k -= 1
        # now a[lo..k] <= pivot <= a[i..hi], and a[k+1..i-1] == pivot
        if j <= k:
            hi = k
        elif j >= i:
            lo = i
        else:
            return a[j]
    return a[j]


@njit(cache=True)
def top_k(x, out, k):
    """Keep the ``k`` largest ``|x_i|`` (ties: lower index first); returns bits ``k (32 + ⌈log2 d⌉)``.

    O(d) expected: the k-th largest magnitude ``t`` by :func:`select`, then every ``|x_i| > t`` and the first
    ``k − #{|x_i| > t}`` entries with ``|x_i| = t``."""
    d = x.shape[0]
    if k >= d:
        for i in range(d):
            out[i] = x[i]
        return sparse_bits(d, d)
    if k <= 0:
        for i in range(d):
            out[i] = 0.0
        return 0
    a = np.abs(x)
    t = select(a.copy(), d - k)
    above = 0
    for i in range(d):
        if a[i] > t:
            above += 1
    ties = k - above
    for i in range(d):
        if a[i] > t:
            out[i] = x[i]
        elif a[i] == t and ties > 0:
            out[i] = x[i]
            ties -= 1
        else:
            out[i] = 0.0
    return sparse_bits(k, d)


@njit(cache=True)
def random_k(x, out, k, scale, key):
    """Keep a uniform random ``k``-subset (uniforms ``0..d-1`` of ``key``), times ``d/k`` if
    ``scale``; returns bits ``k (32 + ⌈log2 d⌉)``."""
    d = x.shape[0]
    if k >= d:
        for i in range(d):
            out[i] = x[i]
        return sparse_bits(d, d)
    f = d / k if scale else 1.0
    taken = 0
    for i in range(d):
        if taken < k and uniform(key, i) * (d - i) < (k - taken):
            out[i] = f * x[i]
            taken += 1
        else:
            out[i] = 0.0
    return sparse_bits(k, d)


@njit(cache=True)
def qsgd(x, out, s, elias, key):
    """QSGD with ``s`` levels, stochastic rounding with uniforms ``0..d-1`` of ``key``; returns the
    fixed-width or the Elias-ω (Code_s) bit count (see the module docstring)."""
    d = x.shape[0]
    norm2 = 0.0
    for i in range(d):
        norm2 += x[i] * x[i]
    norm = np.sqrt(norm2)
    bits = FLOAT_BITS if elias else qsgd_fixed_bits(d, s)
    if norm == 0.0:
        for i in range(d):
            out[i] = 0.0
        return bits
    last = -1
    for i in range(d):
        a = s * abs(x[i]) / norm
        level = int(np.floor(a))
        level = min(level, s)
        if uniform(key, i) < a - level:
            level += 1
        q = norm * level / s
        out[i] = q if x[i] >= 0.0 else -q
        if elias and level > 0:
            bits += elias_omega_bits(i - last) + 1 + elias_omega_bits(level)
            last = i
    return bits


@njit(cache=True)
def power_sgd(x, out, cstate, rank, rows):
    """One PowerSGD power iteration with the warm-started ``Q`` in ``cstate`` (``n × r``,
    row-major), which it updates; returns bits ``32 r (m + n)``."""
    d = x.shape[0]
    m, n = matrix_shape(d, rows)
    r = min(rank, m, n)
    # P = M Q   (M[i, j] = x[i n + j], zero beyond d)
    P = np.zeros((m, r))
    for i in range(m):
        for j in range(n):
            idx = i * n + j
            if idx >= d:
                break
            v = x[idx]
            if v != 0.0:
                for c in range(r):
                    P[i, c] += v * cstate[j * r + c]
    # orthonormalise the columns of P: modified Gram–Schmidt, two passes
    for c in range(r):
        before = 0.0
        for i in range(m):
            before += P[i, c] * P[i, c]
        for _ in range(2):
            for b in range(c):
                dot = 0.0
                for i in range(m):
                    dot += P[i, b] * P[i, c]
                for i in range(m):
                    P[i, c] -= dot * P[i, b]
        after = 0.0
        for i in range(m):
            after += P[i, c] * P[i, c]
        if after > 0.0 and after > 1e-24 * before:
            inv = 1.0 / np.sqrt(after)
            for i in range(m):
                P[i, c] *= inv
        else:
            for i in range(m):
                P[i, c] = 0.0
    # Q_new = Mᵀ P̂
    Qn = np.zeros((n, r))
    for i in range(m):
        for j in range(n):
            idx = i * n + j
            if idx >= d:
                break
            v = x[idx]
            if v != 0.0:
                for c in range(r):
                    Qn[j, c] += v * P[i, c]
    # C(x) = P̂ Q_newᵀ
    for i in range(m):
        for j in range(n):
            idx = i * n + j
            if idx >= d:
                break
            acc = 0.0
            for c in range(r):
                acc += P[i, c] * Qn[j, c]
            out[idx] = acc
    # warm start: keep a column that came out zero
    for c in range(r):
        nz = False
        for j in range(n):
            if Qn[j, c] != 0.0:
                nz = True
                break
        if nz:
            for j in range(n):
                cstate[j * r + c] = Qn[j, c]
    return FLOAT_BITS * r * (m + n)


@njit(cache=True)
def compress_raw(code, x, out, cstate, params, key):
    """``out = C(x)`` for compressor ``code`` without error feedback; returns bits sent."""
    if code == TOP_K:
        return top_k(x, out, int(params[P_K]))
    if code == RANDOM_K:
        return random_k(x, out, int(params[P_K]), params[P_SCALE] != 0.0, key)
    if code == QSGD:
        return qsgd(x, out, int(params[P_LEVELS]), params[P_ELIAS] != 0.0, key)
    if code == POWER_SGD:
        return power_sgd(x, out, cstate, int(params[P_RANK]), int(params[P_ROWS]))
    return identity(x, out)


@njit(cache=True)
def error_feedback(code, x, out, err, cstate, params, key):
    """Error feedback around ``code``: ``e ← e + x; out = C(e); e ← e − out``; returns bits sent."""
    d = x.shape[0]
    for i in range(d):
        err[i] += x[i]
    bits = compress_raw(code, err, out, cstate, params, key)
    for i in range(d):
        err[i] -= out[i]
    return bits


@njit(cache=True)
def compress(code, x, out, state, params, key):
    """The dispatcher: ``out = C(x)`` (with error feedback if ``params[P_EF]``); returns bits sent.

    ``state`` is ``[error (d, with P_EF) | compressor state]`` of :func:`state_size` slots."""
    d = x.shape[0]
    if params[P_EF] != 0.0:
        return error_feedback(code, x, out, state[:d], state[d:], params, key)
    return compress_raw(code, x, out, state, params, key)


@njit(cache=True)
def make_params(k, scale, levels, elias, rank, rows, ef):
    """Fill a ``float64[NPARAM]`` parameter array (slots ``P_*``)."""
    p = np.zeros(NPARAM)
    p[P_K] = k
    p[P_SCALE] = scale
    p[P_LEVELS] = levels
    p[P_ELIAS] = elias
    p[P_RANK] = rank
    p[P_ROWS] = rows
    p[P_EF] = ef
    return p
