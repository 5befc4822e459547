r"""What scale costs: the terms that grow with the number of ranks that synchronise.

Stragglers (:func:`straggler_time_s`). Every rank's step takes a slightly different time: GPUs of
one model differ in clocks and thermals, hosts in jitter (PRISM, Golden et al. 2025, arXiv
2510.15596: up to 14% spread of GEMM throughput across the GPUs of one platform, 9% GPU-time
variability at 64k GPUs). Where ``N`` ranks synchronise, the group waits for the slowest, so with
per-rank times ``T (1 + \sigma Z_i)``, ``Z_i`` i.i.d. standard normal, the expected time is

.. math:: \mathrm{E}\left[\max_i T (1 + \sigma Z_i)\right] = T\,(1 + \sigma\,\mathrm{E}[Z_{(N)}])

and the straggler cost is ``T σ E[Z_(N)]``. ``E[Z_(N)]``, the expected maximum of ``N`` i.i.d.
standard normals, is taken from Blom's (1958) approximation of normal order statistics,

.. math:: \mathrm{E}[Z_{(N)}] \approx \Phi^{-1}\!\left(\frac{N - 0.375}{N + 0.25}\right),

exact at ``N = 1`` (0), within 0.026 of the exact integral
``\int z\,N \phi(z) \Phi(z)^{N-1} dz`` for ``N \ge 2`` (4.5% at ``N = 2``, under 1% from ``N = 8``),
growing like ``\sqrt{2 \ln N}`` asymptotically: weak scaling is never perfect, and the loss per
doubling shrinks with ``N``. ``Φ^{-1}`` is Acklam's rational approximation (relative error below
1.2e-9) refined by one Halley step against ``math.erfc``.
``σ`` is one global parameter, fitted once (``straggler_spread`` in ``data/calibration.yaml``).
"""

import math

from numba import njit

# Acklam's coefficients for the inverse normal CDF (P. J. Acklam, "An algorithm for computing the
# inverse normal cumulative distribution function", 2003; as in scipy-free implementations)
_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
      -3.066479806614716e+01, 2.506628277459239e+00)
_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
      -1.328068155288572e+01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
      4.374664141464968e+00, 2.938163982698783e+00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)


@njit(cache=True)
def normal_quantile(p):
    """``Φ^{-1}(p)`` for ``0 < p < 1``: Acklam's rational approximation and one Halley step."""
    p_low = 0.02425
    if p < p_low:
        q = math.sqrt(-2.0 * math.log(p))
        x = ((((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5])
             / ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0))
    elif p <= 1.0 - p_low:
        q = p - 0.5
        r = q * q
        x = ((((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q
             / (((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1.0))
    else:
        q = math.sqrt(-2.0 * math.log(1.0 - p))
        x = -((((((_C[0] * q + _C[1]) * q + _C[2]) * q + _C[3]) * q + _C[4]) * q + _C[5])
              / ((((_D[0] * q + _D[1]) * q + _D[2]) * q + _D[3]) * q + 1.0))
    # one Halley step on Phi(x) - p
    e = 0.5 * math.erfc(-x / math.sqrt(2.0)) - p
    u = e * math.sqrt(2.0 * math.pi) * math.exp(0.5 * x * x)
    return x - u / (1.0 + 0.5 * x * u)


@njit(cache=True)
def expected_max_normal(n):
    """Expected maximum of ``n`` i.i.d. standard normal variables, Blom's approximation
    ``Φ^{-1}((n - 0.375) / (n + 0.25))``; 0 for ``n <= 1``."""
    if n <= 1:
        return 0.0
    return normal_quantile((n - 0.375) / (n + 0.25))


@njit(cache=True)
def straggler_time_s(work_s, spread, n):
    """Expected time the slowest of ``n`` synchronising ranks adds to ``work_s`` seconds of work
    whose per-rank duration has relative standard deviation ``spread``: ``work_s σ E[Z_(n)]``."""
    if n <= 1 or spread <= 0.0 or work_s <= 0.0:
        return 0.0
    return work_s * spread * expected_max_normal(n)
