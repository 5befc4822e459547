r"""The curtailment controller as a discrete-event simulation on the controller's poll clock.

Plain arrays in, arrays out (:func:`simulate`); the model layer is :mod:`trainscale.workloads.curtailment`.

**Clock.** The controller of Wiesner et al. (arXiv 2602.22760) reads each site's marginal carbon
intensity every ``poll_s`` seconds (10 s) from a trace sampled every ``slot_s`` seconds (5 minutes).
Every decision happens at a poll ``t_k = k * poll_s``; the intensity is constant over the poll
interval ``[t_k, t_k + poll_s)`` (``poll_s`` divides ``slot_s``), so the integrals below are exact
sums over poll intervals. An event the policy schedules between two polls (the end of provisioning)
takes effect at the first poll at or after it, as in a polling controller.

**Site states.** ``OFF`` (no power), ``PROVISIONING`` (idle power ``P_idle``), ``TRAINING``
(power ``P_train`` while computing, ``P_idle`` while waiting for a model average).

* ``OFF -> PROVISIONING`` at a poll where the intensity ``c_s(t) < c_thr``; training starts at the
  first poll ``>= t + provision_s``.
* Any state ``-> OFF`` once the intensity has been ``>= c_thr`` at every poll for ``hysteresis_s``
  (600 s): ``t - t_above >= hysteresis_s`` with ``t_above`` the first poll of the current run of
  polls above the threshold (a poll below resets it).

**Rounds.** While two or more sites train, a round opens; ``round_s`` (600 s) after it opened,
the ``n`` training sites average their models, weighted by the batches each processed (the
weighting does not change the time), which takes ``sync_s[n]`` seconds during which every
training site waits at idle power; the next round opens when the average is done. A round whose
sites drop to one closes without an average: a lone site keeps training locally.

**Progress.** Site ``s`` processes one batch every ``step_s[s]`` seconds of training, so the
batches of the run are :math:`B = \sum_s \tau_s / \mathrm{step}_s` with :math:`\tau_s` its
training seconds. The run ends at the first time where ``B`` reaches ``target_batches`` (inside
a poll interval, by linear interpolation: the training sites' rates are constant there).

**Energy and emissions** of site ``s`` over the run, with the poll intervals ``k``,
:math:`\tau_{s,k}` the training seconds and :math:`\iota_{s,k}` the idle (provisioned, not
computing) seconds in interval ``k``:

.. math::
    E_s = \sum_k \left(\tau_{s,k} P_\mathrm{train} + \iota_{s,k} P_\mathrm{idle}\right), \qquad
    M_s = \sum_k \left(\tau_{s,k} P_\mathrm{train} + \iota_{s,k} P_\mathrm{idle}\right) c_s(t_k) / 3.6\times 10^6

(J and gCO2 with ``c`` in gCO2/kWh: the integral of power, and of power times intensity, over the
timeline).
"""

import numpy as np
from numba import njit

OFF = 0
PROVISIONING = 1
TRAINING = 2

J_PER_KWH = 3.6e6

# slots of the per-site result array
R_TRAIN_S = 0
R_IDLE_S = 1
R_ENERGY_J = 2
R_EMISSIONS_G = 3
R_BATCHES = 4
R_STARTS = 5
N_SITE_RESULTS = 6

# slots of the run's result array
G_END_S = 0  # NaN when the target was not reached within the trace
G_FIRST_START_S = 1
G_ROUNDS = 2
G_SYNC_S = 3
G_BATCHES = 4
N_RUN_RESULTS = 5


@njit(cache=True)
def interval_seconds(t, dt, sync_until):
    """Training seconds of a training site in the poll interval ``[t, t + dt)`` when every
    training site waits for a model average until ``sync_until``:
    :math:`\\tau = \\max(0, t + dt - \\max(t, t_\\mathrm{sync}))`."""
    start = max(t, sync_until)
    return max(0.0, t + dt - start)


@njit(cache=True)
def update_site(state, above_since, ready_at, t, below, provision_s, hysteresis_s):
    """One site's transition at poll ``t``: (state, above_since, ready_at, started).

    ``OFF`` and below the threshold: provisioning starts, training at ``t + provision_s``;
    ``PROVISIONING`` and ``t >= ready_at``: training; any state above the threshold for
    ``hysteresis_s`` (``t - above_since >= hysteresis_s``): ``OFF``."""
    started = 0
    if below:
        above_since = -1.0
    elif state != OFF and above_since < 0.0:
        above_since = t
    if state == OFF and below:
        state = PROVISIONING
        ready_at = t + provision_s
        started = 1
    if state == PROVISIONING and t >= ready_at:
        state = TRAINING
    if state != OFF and above_since >= 0.0 and t - above_since >= hysteresis_s:
        state = OFF
        above_since = -1.0
    return state, above_since, ready_at, started


@njit(cache=True)
def simulate(intensity, slot_s, poll_s, threshold, provision_s, hysteresis_s, round_s, step_s, sync_s,
             train_W, idle_W, target_batches, states, batches_log, sync_log):
    """Run the controller over ``intensity`` (sites x slots, gCO2/kWh, one value per ``slot_s``).

    ``step_s``, ``train_W``, ``idle_W``: per site; ``sync_s[n]``: seconds to average ``n`` models.
    ``states`` (sites x polls, int8) receives each site's state at every poll, ``batches_log``
    (sites x polls) the batches each site trained in the poll interval, and ``sync_log`` (polls,
    int8) the number of sites averaging at a poll where a round closes (as far as the run goes;
    the rest is left as given). Returns (per-site results ``R_*``, run results ``G_*``)."""
    S, T = intensity.shape
    per_site = np.zeros((S, N_SITE_RESULTS))
    run = np.zeros(N_RUN_RESULTS)
    run[G_END_S] = np.nan
    run[G_FIRST_START_S] = np.nan
    state = np.zeros(S, dtype=np.int64)
    above_since = -np.ones(S)
    ready_at = np.zeros(S)
    sync_until = -1.0
    round_open = False
    round_start = 0.0
    done = 0.0
    polls = int(np.floor(T * slot_s / poll_s))
    tau = np.zeros(S)
    for k in range(polls):
        t = k * poll_s
        slot = int(t // slot_s)
        for s in range(S):
            below = intensity[s, slot] < threshold
            st, above_since[s], ready_at[s], started = update_site(state[s], above_since[s], ready_at[s], t, below,
                                                                    provision_s, hysteresis_s)
            state[s] = st
            per_site[s, R_STARTS] += started
            if started and np.isnan(run[G_FIRST_START_S]):
                run[G_FIRST_START_S] = t
        training = 0
        for s in range(S):
            if state[s] == TRAINING:
                training += 1
        if t >= sync_until:
            if training < 2:
                round_open = False
            elif not round_open:
                round_open = True
                round_start = t
            elif t - round_start >= round_s:
                sync_until = t + sync_s[training]
                sync_log[k] = training
                run[G_ROUNDS] += 1
                run[G_SYNC_S] += sync_s[training]
                round_start = sync_until
        # the interval [t, t + poll_s)
        progress = 0.0
        for s in range(S):
            states[s, k] = state[s]
            tau[s] = interval_seconds(t, poll_s, sync_until) if state[s] == TRAINING else 0.0
            progress += tau[s] / step_s[s]
        frac = 1.0
        length = poll_s
        finished = progress > 0.0 and done + progress >= target_batches
        if finished:
            frac = (target_batches - done) / progress
            start = max(t, sync_until)
            length = start + frac * (t + poll_s - start) - t
        for s in range(S):
            if state[s] == OFF:
                continue
            train = tau[s] * frac
            idle = length - train
            energy = train * train_W[s] + idle * idle_W[s]
            per_site[s, R_TRAIN_S] += train
            per_site[s, R_IDLE_S] += idle
            per_site[s, R_ENERGY_J] += energy
            per_site[s, R_EMISSIONS_G] += energy * intensity[s, slot] / J_PER_KWH
            per_site[s, R_BATCHES] += train / step_s[s]
            batches_log[s, k] = train / step_s[s]
        done += progress * frac
        if finished:
            run[G_END_S] = t + length
            break
    run[G_BATCHES] = done
    return per_site, run


@njit(cache=True)
def always_on(intensity_site, slot_s, step_s, train_W, target_batches):
    """A single site training from ``t = 0`` without pause: (end_s, energy_J, emissions_g), with
    :math:`T = N \\cdot \\mathrm{step}`, :math:`E = P T` and :math:`M = P \\int_0^T c(t)\\,dt / 3.6\\times10^6`;
    end NaN when the trace is shorter than ``T``."""
    end = target_batches * step_s
    slots = intensity_site.shape[0]
    if end > slots * slot_s:
        return np.nan, np.nan, np.nan
    emissions = 0.0
    t = 0.0
    i = 0
    while t < end:
        upto = min(end, (i + 1) * slot_s)
        emissions += train_W * (upto - t) * intensity_site[i] / J_PER_KWH
        t = upto
        i += 1
    return end, train_W * end, emissions
