r"""Compute-communication overlap with contention: what a running collective takes from the
compute it overlaps, what a power cap takes from both, and the step time that results.

**Resources a collective holds.** An NCCL/RCCL collective runs one thread block (CTA) per
*channel*, each resident on one streaming multiprocessor for the whole collective. The library
drops channels for small messages, keeping at least ``b_ch`` bytes per channel, up to a maximum
``c_max`` per generation (:func:`collective_channels`):

.. math:: c(S) = \min\left(c_\max,\ \lceil S / b_\mathrm{ch} \rceil\right)

so the compute loses the SM share ``c / N_SM``. The collective also streams its data through
HBM: a ring reduce step reads the local chunk and the received chunk and writes the sum
(``k = 3`` bytes of HBM traffic per byte received), an all-gather step writes the received chunk
and reads it to forward it (``k = 2``). At a wire rate ``r`` (bytes a GPU receives per second) the
collective takes the HBM share (:func:`collective_hbm_share`)

.. math:: h = \frac{k\, r}{\eta_\mathrm{HBM} B_\mathrm{HBM}}

**The contended machine.** Overlapped compute sees ``N_SM - c`` SMs, the peak FLOP rate in
proportion, and HBM bandwidth ``B (1 - h)`` (never below a fair-share floor ``phi``, the memory
controllers' arbitration; :func:`contended_machine`). Re-pricing the compute's kernels on this
machine with the same roofline (:func:`trainscale.kernels.compute.gemm_time`: wave quantisation
over the free SMs, ``max`` of FLOP time and byte time) gives the contention slowdown ``sigma``:
compute-bound GEMMs lose about the SM share (plus a partial wave), memory-bound kernels and GEMMs
near the ridge lose the HBM share, so lower precision (a higher FLOP roof over the same 16-bit
operand traffic) moves GEMMs toward the memory roof and makes them more sensitive.

**Power and clocks.** Dynamic power is ``(P_TDP - P_idle)`` times a utilisation ``u`` (the
performance model's :func:`~trainscale.kernels.power.power_draw`). Compute whose utilisation is
``u_c`` at full clock draws ``u_c f^x`` at clock fraction ``f`` (``x = 3`` for ``P ~ C V^2 f`` with
``V ~ f``), the collective's HBM traffic draws ``u_m = a_m h`` regardless of the core clock. Under a
cap ``P_cap`` the clock is the largest ``f <= 1`` (at least ``f_min``) with
(:func:`capped_clock`)

.. math:: P_\mathrm{idle} + (P_\mathrm{TDP} - P_\mathrm{idle})\,(u_c f^x + u_m) \le P_\mathrm{cap}

**The step.** Compute ``C`` (standalone seconds at full clock), of which ``C_ov`` may run while
the collectives ``M`` run, and ``R`` that overlaps nothing (optimizer, other communication). During
the collectives the compute advances at speed ``v_w = f_w / (1 + sigma)``, alone at ``v_a = f_a``;
the collectives keep their own time (:func:`overlap_step_time`):

.. math:: T = R + M + \frac{C - \min(C_\mathrm{ov},\ M v_w)}{v_a}

``C_ov = 0`` is sequential execution ``R + M + C/f_a``; ``sigma = 0``, ``f_w = f_a = 1`` is the
ideal overlap ``R + \max(C, M)`` when ``C_ov = C``; and since ``v_w <= v_a``,
sequential >= overlapped >= ideal.
"""

import math

import numpy as np
from numba import njit

from .compute import gemm_time
from .power import power_draw

# result vector of overlap_step
V_STEP = 0  # step time, s
V_POWER_MEAN = 1  # mean accelerator power over the step, W
V_POWER_PEAK = 2  # power of the most demanding phase, W
V_CLOCK_ALONE = 3  # clock fraction while compute runs alone
V_CLOCK_WINDOW = 4  # clock fraction while compute and collectives run together
V_WINDOW = 5  # seconds compute and collectives run together
V_SLOWDOWN = 6  # effective compute slowdown while overlapped, v_a / v_w - 1
V_COMPUTE = 7  # seconds the compute takes in the step (alone and overlapped)
V_SIZE = 8


@njit(cache=True)
def collective_channels(message_bytes, max_channels, bytes_per_channel):
    """Channels (one SM each) a collective of ``message_bytes`` runs on: ``min(c_max, ceil(S/b_ch))``."""
    if message_bytes <= 0.0:
        return 0
    c = math.ceil(message_bytes / bytes_per_channel)
    c = min(c, max_channels)
    return int(c)


@njit(cache=True)
def collective_hbm_share(wire_Bps, hbm_bytes_per_wire_byte, hbm_bw, hbm_eff):
    """Share of the achievable HBM bandwidth a collective receiving ``wire_Bps`` bytes/s streams,
    ``k r / (eta_HBM B_HBM)`` (may exceed 1: demand, before arbitration)."""
    if wire_Bps <= 0.0:
        return 0.0
    return hbm_bytes_per_wire_byte * wire_Bps / (hbm_eff * hbm_bw)


@njit(cache=True)
def contended_machine(peak_flops, hbm_bw, sms, channels, hbm_share, fair_floor):
    """(peak FLOP/s, HBM bytes/s, SMs) left to compute while a collective holds ``channels`` SMs
    and the HBM share ``hbm_share``; compute keeps at least ``fair_floor`` of the bandwidth."""
    free = sms - channels
    free = max(free, 1)
    left = 1.0 - hbm_share
    left = max(left, fair_floor)
    return peak_flops * free / sms, hbm_bw * left, free


@njit(cache=True)
def gemm_contention_slowdown(m, n, k, batch, peak_flops, hbm_bw, sms, calib, channels, hbm_share, fair_floor):
    """Relative slowdown ``t_contended / t_alone - 1`` of one GEMM (m x n x k, ``batch`` copies)
    overlapped with a collective holding ``channels`` SMs and ``hbm_share`` of HBM."""
    alone = gemm_time(m, n, k, batch, peak_flops, hbm_bw, sms, calib)
    if alone <= 0.0:
        return 0.0
    p, b, s = contended_machine(peak_flops, hbm_bw, sms, channels, hbm_share, fair_floor)
    return gemm_time(m, n, k, batch, p, b, s, calib) / alone - 1.0


@njit(cache=True)
def capped_clock(cap_w, idle_w, tdp_w, compute_use, fixed_use, exponent, min_clock):
    """Largest clock fraction ``f`` in ``[min_clock, 1]`` with
    ``idle + (tdp - idle) (compute_use f^x + fixed_use) <= cap``."""
    if compute_use <= 0.0:
        return 1.0
    budget = (cap_w - idle_w) / (tdp_w - idle_w) - fixed_use
    if budget <= 0.0:
        return min_clock
    f = (budget / compute_use) ** (1.0 / exponent)
    f = min(f, 1.0)
    f = max(f, min_clock)
    return f


@njit(cache=True)
def overlap_step_time(rest_s, compute_s, comm_s, overlappable_s, slowdown, clock_alone, clock_window):
    """``R + M + (C - min(C_ov, M v_w)) / v_a`` with ``v_w = f_w / (1 + sigma)``, ``v_a = f_a``."""
    v_w = clock_window / (1.0 + slowdown)
    concurrent = overlappable_s
    concurrent = min(concurrent, comm_s * v_w)
    concurrent = min(concurrent, compute_s)
    return rest_s + comm_s + (compute_s - concurrent) / clock_alone


@njit(cache=True)
def overlap_step(rest_s, rest_use, compute_s, compute_use, comm_s, comm_use, overlappable_s, slowdown,
                 contention, idle_w, tdp_w, cap_w, exponent, min_clock, out):
    """Fill ``out`` (layout ``V_*``) with the step time, mean and peak power, clocks and window of
    one execution mode.

    ``rest_use``, ``compute_use``, ``comm_use`` are the utilisations (dynamic power over
    ``P_TDP - P_idle`` at full clock) of the non-overlapping work, the compute and the collectives.
    ``contention = 0`` prices the ideal overlap: no slowdown, the compute's own clock, and the
    overlapped collectives add no power.
    While overlapped, the compute's utilisation is ``compute_use / (1 + sigma)`` (it does less work
    per second) and the collectives add ``comm_use``; the cap sets the clocks of both phases.
    """
    f_a = capped_clock(cap_w, idle_w, tdp_w, compute_use, 0.0, exponent, min_clock)
    sigma = slowdown if contention else 0.0
    window_use = compute_use / (1.0 + sigma)
    f_w = capped_clock(cap_w, idle_w, tdp_w, window_use, comm_use, exponent, min_clock) if contention else f_a
    step = overlap_step_time(rest_s, compute_s, comm_s, overlappable_s, sigma, f_a, f_w)
    v_w = f_w / (1.0 + sigma)
    concurrent = min(overlappable_s, comm_s * v_w, compute_s)
    window = concurrent / v_w if concurrent > 0.0 else 0.0
    comm_alone = comm_s - window
    compute_alone = (compute_s - concurrent) / f_a
    p_rest = power_draw(idle_w, tdp_w, rest_use, 0.0, 1.0, 0.0, 1.0)
    p_alone = power_draw(idle_w, tdp_w, compute_use * f_a**exponent, 0.0, 1.0, 0.0, 1.0)
    p_comm = power_draw(idle_w, tdp_w, comm_use, 0.0, 1.0, 0.0, 1.0)
    # the ideal overlap's collectives cost the compute nothing, power included
    p_window = power_draw(idle_w, tdp_w, window_use * f_w**exponent, comm_use if contention else 0.0, 1.0, 1.0, 1.0)
    energy = p_rest * rest_s + p_alone * compute_alone + p_comm * comm_alone + p_window * window
    peak = idle_w
    if rest_s > 0.0 and p_rest > peak:
        peak = p_rest
    if compute_alone > 0.0 and p_alone > peak:
        peak = p_alone
    if comm_alone > 0.0 and p_comm > peak:
        peak = p_comm
    if window > 0.0 and p_window > peak:
        peak = p_window
    out[V_STEP] = step
    out[V_POWER_MEAN] = energy / step if step > 0.0 else idle_w
    out[V_POWER_PEAK] = peak
    out[V_CLOCK_ALONE] = f_a
    out[V_CLOCK_WINDOW] = f_w if window > 0.0 else f_a
    out[V_WINDOW] = window
    out[V_SLOWDOWN] = (1.0 + sigma) * f_a / f_w - 1.0 if window > 0.0 else 0.0
    out[V_COMPUTE] = window + compute_alone


@njit(cache=True)
def overlap_steps(rest_s, rest_use, compute_s, compute_use, comm_s, comm_use, overlappable_s, slowdown,
                  contention, idle_w, tdp_w, cap_w, exponent, min_clock):
    """:func:`overlap_step` over arrays of equal length (one mode per element); returns ``[n, V_SIZE]``."""
    n = rest_s.shape[0]
    out = np.empty((n, V_SIZE))
    for i in range(n):
        overlap_step(rest_s[i], rest_use[i], compute_s[i], compute_use[i], comm_s[i], comm_use[i],
                     overlappable_s[i], slowdown[i], contention[i], idle_w[i], tdp_w[i], cap_w[i], exponent,
                     min_clock, out[i])
    return out
