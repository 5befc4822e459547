"""Compute-communication overlap with contention, on top of the performance model.

The performance model (:func:`trainscale.model.perfmodel.predict`) charges overlapped compute one average
slowdown (``overlap_compute_slowdown`` in ``calibration.yaml``); priced without it, it hides
communication behind compute as if both ran at full speed, and that is what this module starts
from (``IDEAL_OVERLAP``). Here the collectives that overlap compute hold SMs and HBM bandwidth
(the contention model of :mod:`trainscale.kernels.overlap`), so the overlapped compute slows down;
power rises while both run, and a power cap lowers the clock. Each run is priced three ways:

- ``sequential``: compute, then communication (``overlap_grad_reduce`` off);
- ``overlapped``: the collectives run next to the compute they can overlap, which slows down;
- ``ideal``: the same overlap without any slowdown (what ``predict`` assumes with overlap on).

The inputs come from two predictions of the same plan (overlap off and on): the compute ``C``
(compute + recomputation), the data-parallel / ZeRO communication ``M`` (overlap off), the part of
it left exposed by the ideal overlap ``E``, hence the compute that can overlap ``C_ov = M - E``
(exact when the overlapped phases are alike, as the layers of a transformer are), and the rest
``R``. The contention slowdown ``sigma`` is the compute of a third prediction on the *contended
machine* (fewer SMs, less HBM bandwidth) over ``C``. Coefficients are in ``data/overlap.yaml``,
each with its source. Pipeline parallelism is not modelled here (``pp`` must be 1).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import yaml

from . import catalog, perfmodel
from ..common.checks import check_choice, check_float
from ..kernels import layout as K
from ..kernels import overlap as KO
from ..kernels.collectives import allgather_time, allreduce_time
from ..kernels.collectives import BYTES
from .specs import RunSpec, SpecError, SystemSpec

PRECISIONS = ("bf16", "fp8")
# the performance model's overlap without its average contention slowdown (calibration.yaml's
# overlap_compute_slowdown): this module prices the contention of each run itself; and without stragglers
# (straggler_spread): its modes split one node's step into compute, communication and the rest, which a wait
# proportional to each mode's own length would not leave whole
IDEAL_OVERLAP = {"overlap_compute_slowdown": 0.0, "straggler_spread": 0.0}
MODES = ("sequential", "overlapped", "ideal")

__all__ = [
    "MODES",
    "PRECISIONS",
    "OverlapPrediction",
    "coefficients",
    "collective_profile",
    "contended_system",
    "contention",
    "overlap",
    "overlap_inputs",
    "overlap_modes",
    "precision_system",
]


@functools.cache
def _catalog() -> dict:
    with open(catalog.data_path("overlap.yaml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def coefficients(generation: str) -> dict:
    """The contention coefficients in force for an accelerator generation (name -> value)."""
    data = _catalog()
    gens = data["generations"]
    if generation not in gens:
        raise SpecError("generation", generation, f"expected one of {', '.join(gens)}")
    out = {name: float(item["value"]) for name, item in data["common"].items()}
    out.update({name: float(item["value"]) for name, item in gens[generation].items()})
    return out


def precision_system(system: SystemSpec, precision: str) -> SystemSpec:
    """The system as the performance model sees it at ``precision``.

    The model prices every GEMM at ``peak_flops_bf16`` with 16-bit operand traffic; an FP8 run is
    the same system with the FP8 tensor-core peak. Operands still stream through HBM at 16 bits
    (Transformer-Engine-style FP8 keeps 16-bit activations and casts per GEMM): an estimate that
    puts FP8 GEMMs twice as close to the memory roof.
    """
    check_choice("precision", precision, PRECISIONS)
    if precision == "bf16":
        return system
    if system.peak_flops_fp8 is None:
        raise SpecError("precision", precision, f"{system.name} has no FP8 tensor cores; expected bf16")
    return dataclasses.replace(system, peak_flops_bf16=system.peak_flops_fp8)


def _group(run: RunSpec) -> tuple[int, int]:
    plan = run.plan
    shard = plan.shard_group or plan.dp
    return (shard if plan.zero >= 1 else plan.dp) * plan.cp, plan.tp


def collective_profile(run: RunSpec) -> dict:
    """The data-parallel / ZeRO collective of a plan, as :func:`trainscale.kernels.plan.plan_costs`
    issues it (pp = 1): message bytes, ranks, the wire rate it reaches and its HBM bytes per wire byte.

    - ZeRO-3 (FSDP): each layer's 16-bit parameters ``2 P_layer / tp`` are all-gathered before
      every use (twice, three times with full recomputation) and its gradients reduce-scattered:
      ``k = (g k_copy + k_reduce) / (g + 1)``;
    - ZeRO-1/2: reduce-scatter of the gradients and all-gather of the weights, ``2 P / tp`` bytes;
    - no ZeRO: one all-reduce of the gradients (half reduce-scatter, half all-gather).

    The wire rate is the bytes a GPU receives per second of the collective, ``(n-1)/n S / T``
    (per phase), so latency-bound small messages stream less.
    """
    model, system, plan = run.model, run.system, run.plan
    n, stride = _group(run)
    calib = perfmodel.calibration_vector(system.generation)
    coef = coefficients(system.generation)
    k_copy, k_reduce = coef["hbm_bytes_per_wire_byte_copy"], coef["hbm_bytes_per_wire_byte_reduce"]
    net = (system.scale_up_domain, system.scale_up_GBps_per_gpu * 1e9, system.scale_up_latency_s,
           system.scale_out_GBps_per_gpu * 1e9, system.scale_out_latency_s, calib[K.C_NET_EFF])
    domain, bw_up, lat_up, bw_out, lat_out, eff = net
    if plan.zero == 3:
        nbytes = BYTES * model.params_per_layer() / plan.tp
        gathers = 3.0 if plan.recompute == "full" else 2.0
        k = (gathers * k_copy + k_reduce) / (gathers + 1.0)
        kind = "fsdp all-gather / reduce-scatter per layer"
        t_phase = allgather_time(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, eff)
    else:
        nbytes = BYTES * model.params() / plan.tp
        k = 0.5 * (k_copy + k_reduce)
        if plan.zero >= 1:
            kind = "reduce-scatter + all-gather of the gradients"
            t_phase = allgather_time(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, eff)
        else:
            kind = "all-reduce of the gradients"
            t_phase = 0.5 * allreduce_time(nbytes, n, stride, domain, bw_up, lat_up, bw_out, lat_out, eff)
    wire = (n - 1) / n * nbytes / t_phase if n > 1 and t_phase > 0 else 0.0
    return {"message_bytes": float(nbytes), "ranks": int(n), "kind": kind, "wire_Bps": float(wire),
            "hbm_bytes_per_wire_byte": float(k)}


def contention(system: SystemSpec, message_bytes: float, wire_Bps: float, hbm_bytes_per_wire_byte: float) -> dict:
    """SMs (channels) and HBM share a collective of ``message_bytes`` at ``wire_Bps`` takes."""
    coef = coefficients(system.generation)
    calib = perfmodel.calibration_vector(system.generation)
    channels = KO.collective_channels(float(message_bytes), int(coef["max_channels"]), coef["bytes_per_channel"])
    demand = KO.collective_hbm_share(float(wire_Bps), float(hbm_bytes_per_wire_byte),
                                     system.hbm_bandwidth_GBps * 1e9, calib[K.C_HBM_EFF])
    return {"channels": int(channels), "sm_share": channels / system.sm_count, "hbm_share": float(demand)}


def contended_system(system: SystemSpec, channels: int, hbm_share: float) -> SystemSpec:
    """The machine overlapped compute runs on (:func:`trainscale.kernels.overlap.contended_machine`)."""
    floor = coefficients(system.generation)["hbm_fair_share_floor"]
    peak, hbm, sms = KO.contended_machine(system.peak_flops_bf16, system.hbm_bandwidth_GBps * 1e9,
                                          system.sm_count, int(channels), float(hbm_share), floor)
    return dataclasses.replace(system, peak_flops_bf16=peak, hbm_bandwidth_GBps=hbm / 1e9, sm_count=int(sms))


def _as_run(run: RunSpec | Mapping) -> RunSpec:
    if not isinstance(run, RunSpec):
        run = RunSpec.from_dict(run)
    if run.plan.pp != 1:
        raise SpecError("plan.pp", run.plan.pp, "the overlap model takes pp = 1 (no pipeline parallelism)")
    return run


def _compute(p: perfmodel.Prediction) -> float:
    return p.breakdown["compute"] + p.breakdown["recompute"]


def overlap_inputs(run: RunSpec | Mapping, precision: str = "bf16") -> dict:
    """Everything the overlap kernel needs for one run at one precision (seconds, utilisations)."""
    run = _as_run(run)
    system = precision_system(run.system, precision)
    seq_plan = dataclasses.replace(run.plan, overlap_grad_reduce=False)
    ov_plan = dataclasses.replace(run.plan, overlap_grad_reduce=True)
    seq_run = RunSpec(id=run.id, model=run.model, system=system, plan=seq_plan)
    seq = perfmodel.predict(seq_run, IDEAL_OVERLAP)
    ideal = perfmodel.predict(RunSpec(id=run.id, model=run.model, system=system, plan=ov_plan), IDEAL_OVERLAP)
    compute = _compute(seq)
    comm = seq.breakdown["dp_comm"]
    rest = seq.step_time_s - compute - comm
    exposed = ideal.breakdown["dp_comm"]
    overlappable = min(max(comm - exposed, 0.0), compute)

    profile = collective_profile(seq_run)
    cont = contention(system, profile["message_bytes"], profile["wire_Bps"], profile["hbm_bytes_per_wire_byte"])
    if comm > 0.0 and profile["ranks"] > 1:
        busy = perfmodel.predict(RunSpec(id=run.id, model=run.model, plan=seq_plan,
                                         system=contended_system(system, cont["channels"], cont["hbm_share"])),
                                 IDEAL_OVERLAP)
        slowdown = _compute(busy) / compute - 1.0
    else:
        cont = {"channels": 0, "sm_share": 0.0, "hbm_share": 0.0}
        slowdown = 0.0

    calib = perfmodel.calibration_vector(system.generation, IDEAL_OVERLAP)
    vec = perfmodel.plan_vector(run.model, system, seq_plan, calib)
    a_c, a_m = calib[K.C_POWER_COMPUTE], calib[K.C_POWER_MEMORY]
    optimizer = float(vec[K.O_OPTIMIZER])
    gemm_busy, hbm_busy = float(vec[K.O_GEMM_BUSY]), float(vec[K.O_HBM_BUSY]) - optimizer
    compute_use = min(1.0, (a_c * gemm_busy + a_m * hbm_busy) / compute) if compute > 0 else 0.0
    rest_use = min(1.0, a_m * optimizer / rest) if rest > 0 else 0.0
    comm_use = a_m * min(1.0, cont["hbm_share"])
    return {
        "rest_s": rest, "compute_s": compute, "comm_s": comm, "overlappable_s": overlappable,
        "exposed_ideal_s": exposed, "slowdown": slowdown, "rest_use": rest_use, "compute_use": compute_use,
        "comm_use": comm_use, "idle_W": system.idle_W, "tdp_W": system.tdp_W, **profile, **cont,
        "step_sequential_model_s": seq.step_time_s, "step_ideal_model_s": ideal.step_time_s,
        "tokens": float(run.plan.global_batch * run.model.seq_len),
    }


def overlap_modes(inputs: Mapping, power_cap_W: float | None = None, exponent: float | None = None) -> dict:
    """Price the three modes of one run (``inputs`` from :func:`overlap_inputs`) under a power cap
    (default: the TDP); ``exponent`` of the power-clock relation defaults to the catalog's."""
    tdp, idle = float(inputs["tdp_W"]), float(inputs["idle_W"])
    cap = tdp if power_cap_W is None else check_float("power_cap_W", power_cap_W, idle, math.inf, open_min=True)
    coef = _catalog()["common"]
    x = float(coef["power_frequency_exponent"]["value"]) if exponent is None else check_float(
        "exponent", exponent, 0.0, 10.0, open_min=True)
    n = len(MODES)

    def col(value):
        return np.full(n, float(value))

    overlappable = np.array([0.0, inputs["overlappable_s"], inputs["overlappable_s"]])
    contention_flag = np.array([1, 1, 0], dtype=np.int64)
    res = KO.overlap_steps(col(inputs["rest_s"]), col(inputs["rest_use"]), col(inputs["compute_s"]),
                           col(inputs["compute_use"]), col(inputs["comm_s"]), col(inputs["comm_use"]), overlappable,
                           col(inputs["slowdown"]), contention_flag, col(idle), col(tdp), col(cap), x,
                           float(coef["min_clock_fraction"]["value"]))
    names = {"step_time_s": KO.V_STEP, "power_mean_W": KO.V_POWER_MEAN, "power_peak_W": KO.V_POWER_PEAK,
             "clock_alone": KO.V_CLOCK_ALONE, "clock_overlapped": KO.V_CLOCK_WINDOW, "window_s": KO.V_WINDOW,
             "compute_slowdown": KO.V_SLOWDOWN, "compute_time_s": KO.V_COMPUTE}
    return {mode: {name: float(res[i, j]) for name, j in names.items()} for i, mode in enumerate(MODES)}


@dataclass
class OverlapPrediction:
    """One run priced three ways (``modes``: sequential, overlapped, ideal) with the contention
    that the overlapped collectives cause (``inputs``)."""

    id: str
    precision: str
    power_cap_W: float
    inputs: dict
    modes: dict = field(default_factory=dict)

    @property
    def compute_slowdown(self) -> float:
        """Overlapped compute's slowdown against running alone (contention and clocks)."""
        return self.modes["overlapped"]["compute_slowdown"]

    @property
    def sequential_over_overlapped(self) -> float:
        return self.modes["sequential"]["step_time_s"] / self.modes["overlapped"]["step_time_s"] - 1.0


def overlap(run: RunSpec | Mapping, precision: str = "bf16", power_cap_W: float | None = None,
            exponent: float | None = None) -> OverlapPrediction:
    """Sequential, overlapped and ideal step of one run (``pp = 1``) at a precision and power cap."""
    run = _as_run(run)
    inputs = overlap_inputs(run, precision)
    modes = overlap_modes(inputs, power_cap_W, exponent)
    cap = run.system.tdp_W if power_cap_W is None else float(power_cap_W)
    return OverlapPrediction(id=run.id, precision=precision, power_cap_W=cap, inputs=inputs, modes=modes)
