r"""Accelerator power over a step: idle power plus dynamic power in proportion to the time the tensor
cores and HBM are busy (:func:`power_draw`),

.. math:: P = P_\mathrm{idle} + (P_\mathrm{TDP} - P_\mathrm{idle})
          \min\left(1,\ \frac{a_c\, t_\mathrm{GEMM} + a_m\, t_\mathrm{HBM}}{T}\right)

with ``t_GEMM`` and ``t_HBM`` the busy seconds of the critical pipeline stage in a step of ``T``
(:func:`trainscale.kernels.plan.plan_time`) and the compute and memory shares ``a_c``, ``a_m`` of the
calibration (``calib[C_POWER_COMPUTE]``, ``calib[C_POWER_MEMORY]``). :mod:`trainscale.kernels.overlap`
prices compute beside collectives under a power cap with it.
"""

from numba import njit


@njit(cache=True)
def power_draw(idle_w, tdp_w, compute_share, memory_share, gemm_busy_s, hbm_busy_s, step_s):
    """Accelerator power: idle plus dynamic power in proportion to the time the tensor cores and
    HBM are busy, ``P = P_idle + (P_TDP - P_idle) min(1, a_c t_GEMM / T + a_m t_HBM / T)``."""
    use = (compute_share * gemm_busy_s + memory_share * hbm_busy_s) / step_s
    if use > 1.0:
        use = 1.0
    return idle_w + (tdp_w - idle_w) * use
