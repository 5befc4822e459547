r"""Wall-clock and energy of a training run: the convergence layer's steps, priced by the performance model.

A run of :func:`trainscale.training.convergence.run` counts optimiser steps (or rounds, or messages) on a
small synthetic problem; it says nothing about how long one of them takes. Here the synthetic
problem stands in for a real model (a catalog name such as ``llama2-7b``) trained by workers made
of real GPUs (a catalog system such as ``dgx-a100-80gb``), and each step or round gets the
wall-clock time and energy the performance model (:func:`trainscale.model.perfmodel.predict`) and the
alpha-beta cost of its messages (:mod:`trainscale.kernels.collectives`) give it. That turns
*steps to target* into *time to target* and *energy to target*, which is what the batch-size,
low-communication, hierarchical, compression and geo-distributed studies compare.

The pieces, each one formula in one place:

* :class:`Link` and the message costs :func:`transfer_time_s`, :func:`allreduce_time_s`,
  :func:`two_level_allreduce_time_s` (alpha-beta, by the ring kernels of
  :mod:`trainscale.kernels.collectives`);
* :func:`worker_step`: one optimiser step of one data-parallel worker (``gpus_per_worker`` GPUs,
  no gradient synchronisation between workers), priced by :func:`trainscale.model.perfmodel.predict`;
* :func:`compression_ratio`: bits a run actually sent over what uncompressed float32 messages
  would have been, so that a compressed message of a real model is
  ``message_bytes * compression_ratio(ds)`` bytes;
* timelines that add the coordinates ``time_s`` and ``energy_J`` to a run:
  :func:`sync_timeline` and :func:`local_timeline` for lock-step methods (``sync``, ``local``),
  :func:`event_timeline` for event-driven ones (``async``, ``async_local``, ``hierarchical``),
  whose simulated time already is wall-clock time when run with
  ``time_per_step_s = worker_step(...).compute_s``;
* :func:`time_to_target`, :func:`energy_to_target` and :func:`to_target_table`.

Energy (all timelines, :func:`_energy_J`). Each of the ``W`` workers has ``g`` GPUs drawing
``power_W`` while the worker computes and ``idle_W`` otherwise (waiting for a message, for a
slower worker, or for the server). With ``b_k(T)`` the time worker ``k`` spent computing up to
wall-clock time ``T``,

.. math:: E(T) = g \sum_{k=1}^{W} \left[ b_k(T)\, P_\mathrm{busy} + (T - b_k(T))\, P_\mathrm{idle} \right].

Approximations: ``P_busy`` is the performance model's average power over a whole step (compute,
tensor/pipeline communication and bubbles inside the worker together); GPUs draw idle power while
data-parallel messages are in flight (the NICs, switches, WAN equipment, host CPUs and the node's
overhead power ``node_overhead_W`` are not counted, nor are parameter servers); the outer
optimiser step of local SGD is free.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import xarray as xr

from ..model import perfmodel
from ..common.checks import check_float as _check_float
from ..common.checks import check_int as _check_int
from ..common.checks import check_speeds
from .convergence import steps_to_target, tokens_to_target
from ..common.io import provenance
from ..kernels.collectives import p2p_time, ring_phase_time
from ..model.specs import (RECOMPUTE_MODES, ModelSpec, PlanSpec, RunSpec, SpecError, SystemSpec, resolve_model,
                           resolve_system)

__all__ = [
    "EVENT_METHODS",
    "LOCKSTEP_METHODS",
    "Link",
    "WorkerStep",
    "allreduce_time_s",
    "compression_ratio",
    "energy_to_target",
    "event_timeline",
    "local_timeline",
    "sync_timeline",
    "time_to_target",
    "to_target_table",
    "transfer_time_s",
    "two_level_allreduce_time_s",
    "worker_step",
]

LOCKSTEP_METHODS = ("sync", "local")
EVENT_METHODS = ("async", "async_local", "hierarchical")
FLOAT_BITS = 32  # the convergence layer's uncompressed messages are float32 on the wire


# ---------------------------------------------------------------------------------------------
# links and message costs


@dataclass(frozen=True)
class Link:
    """A network link: ``bandwidth_GBps`` (GB/s, bytes: 1 Gb/s = 0.125 GB/s) in one direction
    and ``latency_s`` (the alpha of one message or ring hop). Validated on construction."""

    bandwidth_GBps: float
    latency_s: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "bandwidth_GBps",
                           _check_float("bandwidth_GBps", self.bandwidth_GBps, 0.0, open_min=True))
        object.__setattr__(self, "latency_s", _check_float("latency_s", self.latency_s, 0.0))

    @property
    def bandwidth_Bps(self) -> float:
        """Bandwidth in bytes per second (what the kernels take)."""
        return self.bandwidth_GBps * 1e9


def _check_link(name: str, link) -> Link:
    if not isinstance(link, Link):
        raise SpecError(name, link, "expected a wallclock.Link(bandwidth_GBps, latency_s)")
    return link


def _check_bytes(nbytes) -> float:
    return _check_float("nbytes", nbytes, 0.0)


def _check_efficiency(efficiency) -> float:
    return _check_float("efficiency", efficiency, 0.0, 1.0, open_min=True)


def transfer_time_s(nbytes: float, link: Link, *, efficiency: float = 1.0) -> float:
    r"""Time to send ``nbytes`` over ``link``: :math:`\alpha + S / (\eta B)` (0 for an empty message).

    ``kernels.collectives.p2p_time`` across the scale-out tier; ``efficiency`` is the achieved
    fraction :math:`\eta` of the bandwidth. 1 GB over 1 Gb/s (0.125 GB/s) takes 8 s plus the latency.
    """
    link = _check_link("link", link)
    nbytes, eff = _check_bytes(nbytes), _check_efficiency(efficiency)
    bw = link.bandwidth_Bps
    return float(p2p_time(nbytes, True, bw, link.latency_s, bw, link.latency_s, eff))


def allreduce_time_s(nbytes: float, n: int, link: Link, *, efficiency: float = 1.0) -> float:
    r"""Ring all-reduce of ``nbytes`` over ``n`` peers, each with its own ``link``:

    .. math:: T = 2\,T_\mathrm{ring}(S, n) = 2(n-1)\,\alpha + 2\,\frac{n-1}{n}\,\frac{S}{\eta B}

    a reduce-scatter and an all-gather, each one ring pass (``kernels.collectives.ring_phase_time``).
    ``n = 1`` (or an empty message) costs nothing.
    """
    link = _check_link("link", link)
    nbytes, eff = _check_bytes(nbytes), _check_efficiency(efficiency)
    n = _check_int("n", n, 1)
    return 2.0 * float(ring_phase_time(nbytes, n, link.bandwidth_Bps, link.latency_s, eff))


def two_level_allreduce_time_s(nbytes: float, workers_per_region: int, regions: int, intra: Link, inter: Link,
                               *, efficiency: float = 1.0) -> float:
    r"""All-reduce of ``nbytes`` over ``regions`` regions of ``workers_per_region`` workers each.

    Inside a region every worker has its own ``intra`` link; the region reaches the other regions
    through one ``inter`` link (a WAN uplink) that all its workers share. Hierarchical all-reduce:
    reduce-scatter inside each region (worker ``i`` then holds shard ``i`` of the region's sum,
    ``S/w`` bytes), ``w`` concurrent ring all-reduces of the shards across the ``R`` regions (one
    per shard index, each getting ``B_inter / w`` of the shared link), all-gather inside the region:

    .. math::
        T = 2\,T_\mathrm{ring}(S, w;\ B_\mathrm{intra}, \alpha_\mathrm{intra})
          + 2\,T_\mathrm{ring}(S/w, R;\ B_\mathrm{inter}/w, \alpha_\mathrm{inter})
          = 2(w-1)\alpha_\mathrm{intra} + 2\frac{w-1}{w}\frac{S}{\eta B_\mathrm{intra}}
          + 2(R-1)\alpha_\mathrm{inter} + 2\frac{R-1}{R}\frac{S}{\eta B_\mathrm{inter}}.

    The cross-region term equals a ring all-reduce of the *full* buffer among the ``R`` regions
    over their WAN links, ``allreduce_time_s(S, R, inter)``: splitting the buffer into ``w``
    shards divides both the bytes per ring and the bandwidth per ring by ``w``, and the rings
    run at the same time, so only the latency terms could differ, and they do not (every ring has
    ``R - 1`` hops per pass). Sharding across a region's workers does not beat a slow uplink; it
    only keeps the intra-region work parallel. With one region this is the intra-region ring
    all-reduce; with one worker per region the inter-region one.
    """
    intra = _check_link("intra", intra)
    inter = _check_link("inter", inter)
    w = _check_int("workers_per_region", workers_per_region, 1)
    R = _check_int("regions", regions, 1)
    nbytes = _check_bytes(nbytes)
    inside = allreduce_time_s(nbytes, w, intra, efficiency=efficiency)
    shared = Link(inter.bandwidth_GBps / w, inter.latency_s)  # the region's uplink, one ring per shard
    across = allreduce_time_s(nbytes / w, R, shared, efficiency=efficiency)
    return inside + across


# ---------------------------------------------------------------------------------------------
# one worker's step, from the performance model


@dataclass(frozen=True)
class WorkerStep:
    """One optimiser step of one data-parallel worker, priced by the performance model.

    ``compute_s``: wall-clock seconds of the step (forward, backward, optimiser, and the tensor and
    pipeline parallelism inside the worker; no data-parallel gradient synchronisation, which the
    link functions add); ``power_W``: average power per GPU during it; ``idle_W``: power per GPU
    while waiting; ``gpus``: GPUs per worker; ``model_params``: parameters of the real model;
    ``message_bytes``: one full gradient (or pseudo-gradient), ``model_params * bytes_per_value``;
    ``tokens_per_step``: tokens the worker processes per step; ``plan``: the priced plan
    (``dp = 1``), None when built by hand.
    """

    model: str
    system: str
    gpus: int
    batch_per_worker: int
    compute_s: float
    power_W: float
    idle_W: float
    model_params: int
    message_bytes: float
    tokens_per_step: int = 0
    fits: bool = True
    plan: PlanSpec | None = None

    def __post_init__(self):
        _check_int("gpus", self.gpus, 1)
        _check_float("compute_s", self.compute_s, 0.0, open_min=True)
        _check_float("idle_W", self.idle_W, 0.0)
        _check_float("power_W", self.power_W, 0.0)
        _check_float("message_bytes", self.message_bytes, 0.0)


def worker_step(model: str | Mapping | ModelSpec, system: str | Mapping | SystemSpec, gpus_per_worker: int,
                batch_per_worker: int, *, bytes_per_value: float = 2, calibration: Mapping | None = None,
                micro_batch: int | None = None, recompute: str | None = None,
                flash_attention: bool = True) -> WorkerStep:
    """Price one optimiser step of one worker: ``gpus_per_worker`` GPUs of ``system`` holding one
    replica of ``model``, ``batch_per_worker`` sequences per step.

    The plan: ``dp = 1``, ``tp = min(gpus_per_worker, gpus_per_node)`` (tensor parallelism inside
    a node), ``pp = gpus_per_worker / tp`` (pipeline stages across nodes; ``gpus_per_worker`` must
    then be a multiple of ``gpus_per_node``), sequence parallelism when ``tp > 1``, flash attention
    (``flash_attention``). ``micro_batch`` (default: every power of two up to 16 that divides the
    batch) and ``recompute`` (default: ``none``, ``selective``, ``full``) are searched: the step is
    the fastest plan that fits in memory (ties to the smaller micro-batch and the lighter
    recomputation), priced by :func:`trainscale.model.perfmodel.predict` (pipelines simulated).
    ``bytes_per_value`` is the width of a gradient value on the wire (2: bf16).
    Raises :class:`SpecError` naming ``gpus_per_worker`` when no plan fits.
    """
    model = resolve_model(model, "worker_step")
    system = resolve_system(system, "worker_step")
    g = _check_int("gpus_per_worker", gpus_per_worker, 1)
    batch = _check_int("batch_per_worker", batch_per_worker, 1)
    width = _check_float("bytes_per_value", bytes_per_value, 0.0, open_min=True)
    node = system.gpus_per_node
    tp = min(g, node)
    if g % tp:
        raise SpecError("gpus_per_worker", g, f"expected at most gpus_per_node = {node} or a multiple of it")
    pp = g // tp
    if micro_batch is None:
        micro = [m for m in (1, 2, 4, 8, 16) if batch % m == 0]
    else:
        micro = [_check_int("micro_batch", micro_batch, 1)]
        if batch % micro[0]:
            raise SpecError("micro_batch", micro_batch, f"must divide batch_per_worker = {batch}")
    if recompute is None:
        modes = list(RECOMPUTE_MODES)
    else:
        if recompute not in RECOMPUTE_MODES:
            raise SpecError("recompute", recompute, f"expected one of {', '.join(RECOMPUTE_MODES)}")
        modes = [recompute]
    if not isinstance(flash_attention, (bool, np.bool_)):
        raise SpecError("flash_attention", flash_attention, "expected true or false")

    def plan_for(mb, mode):
        return PlanSpec(tp=tp, pp=pp, dp=1, micro_batch=mb, global_batch=batch, recompute=mode,
                        sequence_parallel=tp > 1, flash_attention=bool(flash_attention))

    try:
        plan_for(micro[0], modes[0]).check_against(model)
    except SpecError as err:
        raise SpecError("gpus_per_worker", g, f"gives tp = {tp}, pp = {pp} for {model.name}: "
                        f"{err.field} {err.valid}") from err
    best = best_plan = None
    smallest = math.inf
    for mb in micro:
        for mode in modes:
            plan = plan_for(mb, mode)
            pred = perfmodel.predict(RunSpec("worker_step", model, system, plan), calibration)
            smallest = min(smallest, pred.memory_gib_per_gpu)
            if pred.fits and math.isfinite(pred.step_time_s) and (best is None or pred.step_time_s < best.step_time_s):
                best, best_plan = pred, plan
    if best is None:
        raise SpecError("gpus_per_worker", g,
                        f"{model.name} with {batch} sequences per worker does not fit in {system.name}'s "
                        f"{system.hbm_capacity_GiB:g} GiB per GPU with tp = {tp}, pp = {pp}, micro_batch in {micro} "
                        f"and recompute in {modes} (the smallest plan needs {smallest:.1f} GiB per GPU); "
                        "use more GPUs per worker or a smaller batch")
    params = model.params()
    return WorkerStep(model=model.name, system=system.name, gpus=g, batch_per_worker=batch,
                      compute_s=float(best.step_time_s), power_W=float(best.power_W_per_gpu),
                      idle_W=float(system.idle_W), model_params=int(params), message_bytes=float(params * width),
                      tokens_per_step=batch * model.seq_len, fits=True, plan=best_plan)


# ---------------------------------------------------------------------------------------------
# what a run records about itself


def _run_parameters(ds: xr.Dataset) -> dict:
    params = ds.attrs.get("parameters")
    if isinstance(params, str):
        try:
            return json.loads(params)
        except json.JSONDecodeError:
            raise SpecError("parameters", params[:80], "expected the JSON string convergence.run stores") from None
    return dict(params) if isinstance(params, Mapping) else {}


def _run_info(ds: xr.Dataset) -> tuple[str, int, dict]:
    """``(method, H, parameters)`` of a convergence run (attrs first, then its parameters)."""
    if not isinstance(ds, xr.Dataset):
        raise SpecError("ds", type(ds).__name__, "expected an xarray.Dataset from convergence.run")
    params = _run_parameters(ds)
    method = ds.attrs.get("method", params.get("method"))
    if method is None:
        raise SpecError("method", None, "the Dataset does not record its method: expected a Dataset from "
                        "convergence.run (attrs 'method' or 'parameters')")
    H = int(ds.attrs.get("inner_steps_per_message", params.get("H", 1)))
    return str(method), H, params


def _check_speeds(speeds, W: int) -> np.ndarray:
    return check_speeds(speeds, W)


def _check_step(step) -> WorkerStep:
    if not isinstance(step, WorkerStep):
        raise SpecError("step", type(step).__name__, "expected a wallclock.WorkerStep (from worker_step)")
    return step


def compression_ratio(ds: xr.Dataset) -> float:
    r"""Bits a run sent over the bits of the same messages uncompressed (float32):

    .. math:: \rho = \frac{\sum_k \mathrm{bits}_k}{32\, p \sum_k m_k}

    with ``bits_k`` the final ``bits_sent_per_worker`` of worker ``k``, ``p`` the parameters of the
    synthetic problem (the ``param`` dimension) and ``m_k`` the messages worker ``k`` sent:
    one per recorded update for event-driven runs (``update_worker``: ``async`` gradients,
    ``async_local`` and ``hierarchical`` pseudo-gradients), else the final step over the inner
    steps per message (``sync``: every step; ``local``: every ``H`` steps, one per round).
    Exactly 1 for an uncompressed run; ``k (32 + ceil(log2 p)) / (32 p)`` for top-k.
    Region-to-global pushes of ``hierarchical`` runs (``region_bits_sent``) are not counted.

    A real model's compressed message is taken as ``message_bytes * rho`` bytes: the ratio measured
    on float32 values is applied to the real message's width (an approximation for sparse
    formats, whose indices do not shrink with the value width).
    """
    method, H, _ = _run_info(ds)
    bits = np.asarray(ds["bits_sent_per_worker"].values, dtype=np.float64)
    W = bits.shape[1]
    p = int(ds.sizes["param"])
    if "update_worker" in ds:
        messages = np.bincount(np.asarray(ds["update_worker"].values, dtype=np.int64), minlength=W)
    else:
        last = int(ds["step"].values[-1])
        if last % H:
            raise SpecError("step", last, f"expected the last step to end a round of H = {H} steps")
        messages = np.full(W, last // H)
    total = float(messages.sum())
    if total <= 0:
        raise SpecError("ds", method, "the run sent no messages (its last step is 0)")
    return float(bits[-1].sum() / (FLOAT_BITS * p * total))


# ---------------------------------------------------------------------------------------------
# timelines


def _energy_J(time_s: np.ndarray, busy_s: np.ndarray, step: WorkerStep) -> np.ndarray:
    """``g sum_k [b_k P_busy + (T - b_k) P_idle]`` (module docstring); ``busy_s`` is ``[T, W]``."""
    T = np.asarray(time_s, dtype=np.float64)
    busy = np.asarray(busy_s, dtype=np.float64)
    return step.gpus * (busy * step.power_W + (T[:, None] - busy) * step.idle_W).sum(axis=1)


def _with_timeline(ds: xr.Dataset, time_s, busy_s, step: WorkerStep, info: dict) -> xr.Dataset:
    out = ds.copy()
    energy = _energy_J(time_s, busy_s, step)
    out = out.assign_coords(
        time_s=("step", np.asarray(time_s, dtype=np.float64),
                {"units": "s", "long_name": "wall-clock time at the evaluated step"}),
        energy_J=("step", energy, {"units": "J", "long_name": "energy of all workers' GPUs up to the evaluated step"}))
    out["busy_s"] = (("step", "worker"), np.asarray(busy_s, dtype=np.float64),
                     {"units": "s", "long_name": "time each worker spent computing up to the evaluated step"})
    out.attrs["timeline"] = json.dumps(dict(
        model=step.model, system=step.system, gpus_per_worker=step.gpus, batch_per_worker=step.batch_per_worker,
        compute_s=step.compute_s, power_W=step.power_W, idle_W=step.idle_W, message_bytes=step.message_bytes,
        **info), sort_keys=True)
    return out


def _lockstep_timeline(ds, step, method_expected, comm_s, speeds) -> xr.Dataset:
    r"""Lock-step rounds of ``H`` steps (``H = 1``: synchronous SGD), see :func:`local_timeline`."""
    method, H, params = _run_info(ds)
    if method != method_expected:
        raise SpecError("method", method, f"expected a '{method_expected}' run"
                        + ("; use event_timeline for event-driven runs" if method in EVENT_METHODS else ""))
    step = _check_step(step)
    M = _check_float("comm_s", comm_s, 0.0)
    W = int(ds.sizes["worker"])
    v = _check_speeds(speeds, W)
    c = step.compute_s / v  # seconds per inner step of each worker
    C = H * float(c.max())  # a round waits for the slowest worker
    if method == "local" and "delayed" not in params:
        raise SpecError("delayed", None, "a local run's parameters (attr 'parameters') must say whether its outer "
                        "update was delayed: expected a Dataset from convergence.run with provenance")
    delayed = method == "local" and bool(params["delayed"])
    steps = np.asarray(ds["step"].values, dtype=np.int64)
    if np.any(steps % H):
        raise SpecError("step", steps.tolist(), f"expected evaluations at round ends (multiples of H = {H})")
    n = (steps // H).astype(np.float64)  # rounds done at each evaluated step
    if delayed:
        time_s = np.where(n > 0, C + (n - 1) * max(C, M), 0.0)
    else:
        time_s = n * (C + M)
    busy = n[:, None] * H * c[None, :]
    info = {"method": method, "H": H, "delayed": delayed, "comm_s": M, "speeds": v.tolist()}
    return _with_timeline(ds, time_s, busy, step, info)


def sync_timeline(ds: xr.Dataset, step: WorkerStep, *, comm_s: float = 0.0, speeds=None) -> xr.Dataset:
    r"""Wall-clock time and energy of a synchronous (``method='sync'``) run.

    Every step each worker computes its gradient (``compute_s / speeds[k]``), then all exchange
    them (``comm_s``, e.g. :func:`allreduce_time_s` of ``step.message_bytes * compression_ratio(ds)``
    bytes): after ``s`` steps

    .. math:: t(s) = s \left( \max_k \frac{c}{v_k} + M \right), \qquad b_k(s) = s\,\frac{c}{v_k}.

    Returns a copy of ``ds`` with coordinates ``time_s`` and ``energy_J`` over ``step`` and the
    variable ``busy_s`` (step × worker); attr ``timeline`` (JSON) records the inputs.
    """
    return _lockstep_timeline(ds, step, "sync", comm_s, speeds)


def local_timeline(ds: xr.Dataset, step: WorkerStep, *, comm_s: float = 0.0, speeds=None) -> xr.Dataset:
    r"""Wall-clock time and energy of a local SGD / DiLoCo (``method='local'``) run.

    ``H`` (inner steps per round) and ``delayed`` are the run's own. A round is ``H`` inner steps
    on every worker, gated by the slowest, ``C = H max_k c / v_k``, and one exchange of
    pseudo-gradients, ``M = comm_s``. After ``n`` rounds (evaluated step ``s = n H``):

    .. math::
        t(n) = n\,(C + M) \quad\text{(outer step waits for the exchange)},\qquad
        t(n) = C + (n - 1)\max(C, M)\ \ (n \ge 1) \quad\text{(delayed)}

    and ``b_k(n) = n H c / v_k``. Delayed (one-step-delayed outer update): the outer step of round
    ``r`` applies round ``r - 1``'s pseudo-gradient, so its exchange overlaps round ``r``'s compute.
    With every worker starting round ``r`` when the slowest has finished round ``r - 1`` (``F``)
    and round ``r - 2``'s exchange has arrived (``E``), and one exchange on the link at a time,
    ``E_r = max(F_r, E_{r-1}) + M`` and ``t(r+1) = max(F_r, E_{r-1})``, whose solution is the
    formula above: the first round needs no exchange (the kernel applies nothing in round 0) and
    every later one takes the longer of compute and communication. The last round's exchange is
    still in flight at the end, as in the kernel. Returns as :func:`sync_timeline`.
    """
    return _lockstep_timeline(ds, step, "local", comm_s, speeds)


def event_timeline(ds: xr.Dataset, step: WorkerStep) -> xr.Dataset:
    r"""Energy of an event-driven run (``async``, ``async_local``, ``hierarchical``), whose
    ``time_s`` already is wall-clock time.

    The run must have been made with ``time_per_step_s = step.compute_s`` (checked), so that
    worker ``k`` computes each message (``H`` inner steps; ``H = 1`` for ``async``) in
    ``H compute_s / v_k`` seconds (times its jitter factor), with ``v_k`` the run's ``speeds``.
    Busy time is rebuilt from the recorded arrivals: worker ``k``'s ``j``-th message reaches the
    server at ``a_j`` (``update_time_s`` where ``update_worker == k``); with ``w_k`` the run's
    one-way ``worker_comm_s`` (0 for ``async``) its compute ran over ``[a_{j-1} + w_k, a_j - w_k]``
    (``[0, a_0 - w_k]`` for the first), and a message still being computed at the end started at
    ``a_last + w_k`` and lasts its nominal ``H compute_s / v_k`` (exact without jitter). Then
    ``b_k(T)`` is the length of these intervals before ``T`` and the energy the module's formula
    at each evaluated ``time_s``. Region and global servers draw nothing.

    Returns a copy of ``ds`` with the coordinate ``energy_J`` and the variable ``busy_s``.
    """
    method, H, params = _run_info(ds)
    if method not in EVENT_METHODS:
        raise SpecError("method", method, f"expected an event-driven run ({', '.join(EVENT_METHODS)}); "
                        "use sync_timeline or local_timeline")
    step = _check_step(step)
    if "time_per_step_s" not in params or "speeds" not in params:
        raise SpecError("parameters", None, "the run's parameters (time_per_step_s, speeds) are needed: "
                        "expected a Dataset from convergence.run with provenance")
    tps = float(params["time_per_step_s"])
    if not math.isclose(tps, step.compute_s, rel_tol=1e-9):
        raise SpecError("time_per_step_s", tps, f"expected the worker step's compute_s = {step.compute_s!r}: "
                        "run convergence.run(..., time_per_step_s=step.compute_s) so its time is wall-clock")
    W = int(ds.sizes["worker"])
    speeds = _check_speeds(params["speeds"], W)
    comm = np.asarray(params.get("worker_comm_s", np.zeros(W)), dtype=np.float64)
    if comm.shape != (W,):
        comm = np.broadcast_to(comm, (W,))
    arrival = np.asarray(ds["update_time_s"].values, dtype=np.float64)
    who = np.asarray(ds["update_worker"].values, dtype=np.int64)
    T = np.asarray(ds["time_s"].values, dtype=np.float64)
    busy = np.zeros((T.size, W))
    for k in range(W):
        a = arrival[who == k]
        w = comm[k]
        starts = np.concatenate([[0.0], a + w])
        ends = np.concatenate([a - w, starts[-1:] + H * step.compute_s / speeds[k]])  # last: still computing
        if a.size and who[-1] == k:  # it sent the run's last message and starts no other
            starts, ends = starts[:-1], ends[:-1]
        busy[:, k] = np.clip(np.minimum(T[:, None], ends[None, :]) - starts[None, :], 0.0, None).sum(axis=1)
    info = {"method": method, "H": H, "speeds": speeds.tolist(), "worker_comm_s": comm.tolist()}
    return _with_timeline(ds, T, busy, step, info)


# ---------------------------------------------------------------------------------------------
# to target


def _at_crossing(ds: xr.Dataset, name: str, target: float, var: str) -> float:
    if name not in ds:
        raise SpecError(name, None, "the Dataset has no such coordinate: add a timeline first "
                        "(sync_timeline, local_timeline or event_timeline)")
    s = steps_to_target(ds, target, var)
    if math.isnan(s):
        return math.nan
    index = int(np.flatnonzero(np.asarray(ds["step"].values) == s)[0])
    return float(np.asarray(ds[name].values)[index])


def time_to_target(ds: xr.Dataset, target: float, var: str = "loss") -> float:
    """``time_s`` at :func:`trainscale.training.convergence.steps_to_target` (NaN if never reached)."""
    return _at_crossing(ds, "time_s", target, var)


def energy_to_target(ds: xr.Dataset, target: float, var: str = "loss") -> float:
    """``energy_J`` at :func:`trainscale.training.convergence.steps_to_target` (NaN if never reached)."""
    return _at_crossing(ds, "energy_J", target, var)


def to_target_table(runs: Mapping[str, xr.Dataset], target: float, var: str = "loss") -> xr.Dataset:
    """One row per run (dimension ``method``, the mapping's keys, in order): ``steps_to_target``,
    ``samples_to_target``, ``time_to_target_s``, ``energy_to_target_J`` and ``final_loss`` (of
    ``var``). Every run needs a timeline (``time_s`` and ``energy_J``). Comparisons (speed-ups)
    are left to the notebooks. Select a row with ``table.sel({"method": name})``:
    ``table.sel(method=name)`` passes xarray's own ``method`` keyword (inexact matching) instead."""
    if not isinstance(runs, Mapping) or not runs:
        raise SpecError("runs", runs, "expected a non-empty mapping of name -> Dataset with a timeline")
    target = _check_float("target", target, -math.inf)
    names = [str(k) for k in runs]
    rows = {key: [] for key in ("steps", "samples", "time", "energy", "final")}
    for name, ds in runs.items():
        if not isinstance(ds, xr.Dataset) or var not in ds:
            raise SpecError(f"runs[{name!r}]", type(ds).__name__, f"expected a Dataset with the variable {var!r}")
        rows["steps"].append(steps_to_target(ds, target, var))
        rows["samples"].append(tokens_to_target(ds, target, var))
        rows["time"].append(time_to_target(ds, target, var))
        rows["energy"].append(energy_to_target(ds, target, var))
        rows["final"].append(float(np.asarray(ds[var].values)[-1]))
    out = xr.Dataset(
        {
            "steps_to_target": ("method", rows["steps"], {"units": "1", "long_name": f"steps until {var} <= target"}),
            "samples_to_target": ("method", rows["samples"],
                                  {"units": "1", "long_name": "examples (tokens) processed until the target"}),
            "time_to_target_s": ("method", rows["time"], {"units": "s", "long_name": "wall-clock time to the target"}),
            "energy_to_target_J": ("method", rows["energy"],
                                   {"units": "J", "long_name": "energy of all workers' GPUs to the target"}),
            "final_loss": ("method", rows["final"], {"units": "1", "long_name": f"final {var}"}),
        },
        coords={"method": ("method", names, {"units": "1", "long_name": "run"})},
    )
    out.attrs.update(provenance({"target": target, "var": var, "runs": names}))
    out.attrs["target"] = target
    return out
