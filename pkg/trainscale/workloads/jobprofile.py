r"""Job profile: what a training step costs beyond the accelerator's own work, and fine-tuning.

Following Lawenda et al., "Profiling and optimization of multi-card GPU machine learning jobs"
(arXiv 2505.22905), a step's time is decomposed into

- ``compute``, ``all_reduce``, ``optimizer``: the performance model's step (:func:`perfmodel.predict`,
  data parallelism over one node's GPUs, gradient all-reduce not overlapped);
- ``h2d_copy``: the step's samples copied host-to-device over PCIe, pinned or pageable;
- ``data_loading``: what the loader workers cannot prefetch while the GPU works;
- ``launch``: kernel launches the host cannot issue ahead of the GPU;
- ``synchronisation``: host-device synchronisations and the wait for the slowest GPU;

each a formula of its inputs (:mod:`trainscale.kernels.jobprofile`, coefficients in
``data/job_profile.yaml``), at three precisions: ``bf16-mixed`` (tensor cores, bf16 activations,
fp32 master weights), ``tf32`` and ``fp32`` (fp32 everywhere on the TF32 tensor-core peak or the
plain FP32 peak). The fp32 precisions are priced by the same model with every byte doubled: the
system's HBM and network bandwidths halved and the peak replaced, and the activations (not the
weight and optimizer state: 16 bytes per parameter either way) counted twice.

Fine-tuning (:func:`finetune`) compares full fine-tuning with LoRA (Hu et al. 2021, arXiv
2106.09685) and QLoRA (Dettmers et al. 2023, arXiv 2305.14314): a rank-``r`` adapter on each
targeted ``d_in x d_out`` matrix has ``r (d_in + d_out)`` trainable parameters; the frozen weights
get no gradients and no optimizer state, but the activations are still stored and the backward
pass still runs the data gradients through the frozen weights — what LoRA saves of the compute is
the weight-gradient GEMMs (about 1/3 of a full step). QLoRA stores the frozen linear weights in NF4
with double-quantised scales and dequantises them to bf16 before every use.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import yaml

from ..model import catalog, perfmodel
from ..common.checks import check_choice, check_float, check_int
from ..kernels import jobprofile as JK
from ..kernels import layout as K
from ..kernels.collectives import allreduce_time
from ..kernels.compute import gemm_fwd_bwd_time, gemm_time, memory_bound_time
from ..kernels.plan import ADAM_TRAFFIC_BYTES_PER_PARAM
from ..model.specs import ModelSpec, PlanSpec, RunSpec, SpecError, SystemSpec, resolve_model, resolve_system

GiB = 2.0**30
PRECISIONS = ("bf16-mixed", "tf32", "fp32")
COMPONENTS = ("compute", "all_reduce", "optimizer", "h2d_copy", "data_loading", "launch", "synchronisation")
METHODS = ("full", "lora", "qlora")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "reserved")
FT_TIME_PARTS = ("frozen_compute", "weight_gradients", "adapters", "dequantisation", "optimizer", "all_reduce",
                 "launch", "synchronisation")

__all__ = ["PRECISIONS", "COMPONENTS", "METHODS", "LORA_TARGETS", "MEMORY_PARTS", "FT_TIME_PARTS", "coefficients",
           "host", "resolve_workload", "precision_system", "JobProfile", "profile", "adapted_matrices",
           "lora_trainable_params", "quantised_params", "FineTune", "finetune", "nf4_bits_per_param"]


# --------------------------------------------------------------------------- catalog
@functools.lru_cache(maxsize=None)
def _catalog() -> dict:
    with open(catalog.data_path("job_profile.yaml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def coefficients(section: str) -> dict:
    """Values (without their sources) of one section of ``job_profile.yaml``: host, loader, finetune."""
    data = _catalog()
    check_choice("section", section, tuple(k for k in data if k not in ("systems", "workloads")))
    return {k: v["value"] for k, v in data[section].items()}


def host(system: str | SystemSpec) -> dict:
    """Host-side values of a node type (PCIe bandwidths, cores, FP32/TF32 peaks)."""
    name = system.name if isinstance(system, SystemSpec) else system
    systems = _catalog()["systems"]
    if name not in systems:
        raise SpecError("system", name, f"job profile coefficients exist for {', '.join(systems)}")
    return {k: v["value"] for k, v in systems[name].items()}


def resolve_workload(model, seq_len: int | None = None) -> ModelSpec:
    """A model-catalog name, a ``job_profile.yaml`` workload (``vit-b16``), a mapping or a spec;
    ``seq_len`` replaces the sequence length (tokens per sample)."""
    workloads = _catalog()["workloads"]
    if isinstance(model, str) and model not in catalog.models() and model in workloads:
        spec = ModelSpec.from_dict(workloads[model], name=model)
    else:
        spec = resolve_model(model)
    if seq_len is not None:
        spec = dataclasses.replace(spec, seq_len=check_int("seq_len", seq_len, 1))
    return spec


def precision_system(system, precision: str) -> SystemSpec:
    """The system the performance model prices a precision on: for tf32/fp32 the peak is the TF32 or
    FP32 one and the HBM and network bandwidths are halved (every operand, activation and gradient
    has 4 bytes, the model counts 2)."""
    system = resolve_system(system)
    check_choice("precision", precision, PRECISIONS)
    if precision == "bf16-mixed":
        return system
    peak = host(system)[f"peak_flops_{'tf32' if precision == 'tf32' else 'fp32'}"]
    if peak is None:
        raise SpecError("precision", precision, f"{system.name} has no {precision} peak; use bf16-mixed or fp32")
    return dataclasses.replace(system, peak_flops_bf16=float(peak),
                               hbm_bandwidth_GBps=system.hbm_bandwidth_GBps / 2,
                               scale_up_GBps_per_gpu=system.scale_up_GBps_per_gpu / 2,
                               scale_out_GBps_per_gpu=system.scale_out_GBps_per_gpu / 2)


def data_loading_grid(system, gpus: int, micro_batch: int, workers: Sequence[int], bytes_per_sample: Sequence,
                      decode_MBps_per_worker: float, gpu_busy_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Exposed data-loading time and host-to-device copy time of one iteration, ``[memory, workers,
    bytes_per_sample]`` with memory (pinned, pageable) at the system's host PCIe bandwidths; the
    GPU's ``gpu_busy_s`` hides loading (it grows by the copy)."""
    hv = host(system)
    bws = np.array([hv["pcie_pinned_GBps"], hv["pcie_pageable_GBps"]]) * 1e9
    load = np.zeros((2, len(workers), len(bytes_per_sample)))
    copy = np.zeros_like(load)
    JK.data_loading_grid(float(micro_batch), np.asarray(workers, dtype=np.int64), np.asarray(bytes_per_sample), bws,
                         decode_MBps_per_worker * 1e6, hv["host_cores"] / gpus, gpus, hv["gpus_per_pcie_switch"],
                         gpu_busy_s, load, copy)
    return load, copy


def nf4_bits_per_param(double_quant: bool = True) -> float:
    """Bits per NF4 weight with its block scales (4.127 with double quantisation, else 4.5)."""
    c = coefficients("finetune")
    if double_quant:
        return JK.nf4_bits_per_param(c["nf4_bits"], c["nf4_block"], c["nf4_scale_bits"], c["nf4_scale_block"],
                                     c["nf4_scale2_bits"])
    return JK.nf4_bits_per_param(c["nf4_bits"], c["nf4_block"], 32.0, 1.0, 0.0)


def _reserved_bytes() -> float:
    return float(catalog.calibration()["common"]["reserved_GiB"]["value"]) * GiB


def _run(model: ModelSpec, system: SystemSpec, gpus: int, micro_batch: int, micro_batches: int, recompute: str,
         flash_attention: bool) -> RunSpec:
    plan = PlanSpec(dp=gpus, micro_batch=micro_batch, global_batch=gpus * micro_batch * micro_batches,
                    recompute=recompute, flash_attention=flash_attention)
    plan.check_against(model)
    return RunSpec(id="job-profile", model=model, system=system, plan=plan)


def _state_bytes(model: ModelSpec) -> float:
    # the performance model's 16 bytes per parameter (tp = pp = 1, no ZeRO): bf16 weights and
    # gradients, fp32 master weights and Adam moments
    return 16.0 * model.params()


# --------------------------------------------------------------------------- step decomposition
@dataclass
class JobProfile:
    """One step on ``gpus`` data-parallel GPUs, decomposed (seconds per step in ``components``)."""

    precision: str
    gpus: int
    samples_per_gpu: int
    step_time_s: float
    gpu_busy_s: float
    memory_gib_per_gpu: float
    fits: bool
    launched_kernels: float
    components: dict = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.gpus * self.samples_per_gpu / self.step_time_s


def profile(model, system, gpus: int, micro_batch: int, micro_batches: int = 1, precision: str = "bf16-mixed",
            workers: int = 4, pinned: bool = True, bytes_per_sample: float = 602112.0,
            decode_MBps_per_worker: float | None = None, seq_len: int | None = None, recompute: str = "none",
            flash_attention: bool = True) -> JobProfile:
    """Decompose one data-parallel step of ``model`` on ``gpus`` GPUs of one ``system`` node.

    Each GPU processes ``micro_batch x micro_batches`` samples per step (weak scaling), loaded by
    ``workers`` loader processes per GPU and copied from ``pinned`` (else pageable) host memory;
    ``bytes_per_sample`` is the decoded input of one sample."""
    spec = resolve_workload(model, seq_len)
    base = resolve_system(system)
    hv = host(base)
    gpus = check_int("gpus", gpus, 1, base.gpus_per_node)
    micro_batch = check_int("micro_batch", micro_batch, 1)
    micro_batches = check_int("micro_batches", micro_batches, 1)
    workers = check_int("workers", workers, 0)
    bytes_per_sample = check_float("bytes_per_sample", bytes_per_sample, 0.0, open_min=True)
    if not isinstance(pinned, (bool, np.bool_)):
        raise SpecError("pinned", pinned, "expected true or false")
    decode = coefficients("loader")["decode_MBps_per_worker"] if decode_MBps_per_worker is None else \
        decode_MBps_per_worker
    decode = check_float("decode_MBps_per_worker", decode, 0.0, open_min=True)
    sys_p = precision_system(base, precision)

    run = _run(spec, sys_p, gpus, micro_batch, micro_batches, recompute, bool(flash_attention))
    pred = perfmodel.predict(run)
    b = pred.breakdown
    compute = b["compute"] + b["recompute"] + b["tp_comm"] + b["cp_comm"] + b["pp_comm"] + b["pipeline_bubble"]
    memory = pred.memory_gib_per_gpu * GiB
    if precision != "bf16-mixed":  # activations in fp32: twice the bytes; states are 16 B/param either way
        memory += memory - _state_bytes(spec) - _reserved_bytes()
    samples = micro_batch * micro_batches
    c = coefficients("host")
    bw = (hv["pcie_pinned_GBps"] if pinned else hv["pcie_pageable_GBps"]) * 1e9
    copy = JK.h2d_copy_s(samples * bytes_per_sample, bw, gpus, hv["gpus_per_pcie_switch"])
    busy = pred.step_time_s + copy
    load = JK.loader_exposed_s(samples, workers, decode * 1e6, bytes_per_sample, hv["host_cores"] / gpus, busy)
    kernels = JK.kernels_per_step(spec.layers, c["kernels_per_layer_forward"], c["backward_kernels_per_forward"],
                                  c["optimizer_kernels"], micro_batches)
    launch = JK.launch_exposed_s(kernels, c["launch_latency_s"], busy)
    sync = JK.sync_s(c["sync_points_per_step"], c["sync_latency_s"], c["step_time_jitter"], compute, gpus)
    parts = {"compute": compute, "all_reduce": b["dp_comm"], "optimizer": b["optimizer"], "h2d_copy": copy,
             "data_loading": load, "launch": launch, "synchronisation": sync}
    return JobProfile(precision=precision, gpus=gpus, samples_per_gpu=samples, step_time_s=float(sum(parts.values())),
                      gpu_busy_s=busy, memory_gib_per_gpu=memory / GiB,
                      fits=bool(memory <= base.hbm_capacity_GiB * GiB), launched_kernels=float(kernels),
                      components={k: float(v) for k, v in parts.items()})


# --------------------------------------------------------------------------- fine-tuning
def _matrices(model: ModelSpec) -> dict:
    """(d_in, d_out) of each linear matrix of one layer, by LoRA target name."""
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_heads * model.head_dim
    mats = {"q": (h, h), "k": (h, kv), "v": (h, kv), "o": (h, h), "up": (h, f), "down": (f, h)}
    if model.ffn_matrices == 3:
        mats["gate"] = (h, f)
    return mats


def adapted_matrices(model, targets: Sequence[str] = LORA_TARGETS) -> list[tuple[int, int]]:
    """(d_in, d_out) of the matrices of one layer that carry an adapter."""
    spec = resolve_workload(model)
    mats = _matrices(spec)
    if isinstance(targets, str) or len(targets) == 0:
        raise SpecError("targets", targets, f"expected a non-empty list from {', '.join(LORA_TARGETS)}")
    out = []
    for t in targets:
        if t not in mats:
            raise SpecError("targets", t, f"expected matrices of {spec.name}: {', '.join(mats)}")
        out.append(mats[t])
    if len(set(targets)) != len(targets):
        raise SpecError("targets", list(targets), "expected each matrix at most once")
    return out


def lora_trainable_params(model, rank: int, targets: Sequence[str] = LORA_TARGETS) -> int:
    """``layers x sum over targeted matrices of r (d_in + d_out)``."""
    spec = resolve_workload(model)
    rank = check_int("rank", rank, 1)
    return spec.layers * sum(rank * (d_in + d_out) for d_in, d_out in adapted_matrices(spec, targets))


def quantised_params(model) -> int:
    """Parameters QLoRA stores in NF4: the linear matrices of the layers (biases, norms, embeddings
    and the output layer stay 16-bit)."""
    spec = resolve_workload(model)
    return spec.layers * sum(a * b for a, b in _matrices(spec).values())


@dataclass
class FineTune:
    """Memory (bytes per GPU, by part) and time (seconds per step, by part) of one method."""

    method: str
    trainable_params: int
    memory_bytes: dict
    time_s: dict
    fits: bool

    @property
    def memory_gib(self) -> float:
        return sum(self.memory_bytes.values()) / GiB

    @property
    def step_time_s(self) -> float:
        return sum(self.time_s.values())


def finetune(model, system, method: str, rank: int = 16, targets: Sequence[str] = LORA_TARGETS, gpus: int = 1,
             micro_batch: int = 4, micro_batches: int = 1, seq_len: int | None = None, recompute: str = "none",
             flash_attention: bool = True) -> FineTune:
    """Memory and step time of full fine-tuning, LoRA or QLoRA (bf16 mixed precision, AdamW,
    data parallelism over ``gpus`` GPUs of one node).

    Full fine-tuning is the performance model's step. LoRA keeps its frozen-weight work (forward,
    data gradients, element-wise work), drops the weight-gradient GEMMs of the layers and of the
    output layer, adds the adapters' GEMMs (forward and backward, as priced by
    :func:`~trainscale.kernels.compute.gemm_fwd_bwd_time` on the roofline without tile
    quantisation, which would price a rank-16 GEMM at ~1% of peak), and updates and all-reduces only the
    adapters. QLoRA adds the dequantisation of every frozen linear matrix before each use
    (forward, backward, and the recomputed forward): read NF4 codes and scales, write bf16."""
    check_choice("method", method, METHODS)
    spec = resolve_workload(model, seq_len)
    sys_ = resolve_system(system)
    gpus = check_int("gpus", gpus, 1, sys_.gpus_per_node)
    micro_batch = check_int("micro_batch", micro_batch, 1)
    micro_batches = check_int("micro_batches", micro_batches, 1)
    rank = check_int("rank", rank, 1)
    adapted = adapted_matrices(spec, targets)
    run = _run(spec, sys_, gpus, micro_batch, micro_batches, recompute, bool(flash_attention))
    pred = perfmodel.predict(run)
    b = pred.breakdown
    calib = perfmodel.calibration_vector(sys_.generation)
    svec = perfmodel.system_vector(sys_)
    peak, hbm, sms = svec[K.S_PEAK_FLOPS], svec[K.S_HBM_BW], svec[K.S_SMS]
    fc, hc = coefficients("finetune"), coefficients("host")
    P = spec.params()
    reserved = _reserved_bytes()
    activations = pred.memory_gib_per_gpu * GiB - _state_bytes(spec) - reserved
    m = micro_batches
    tokens = micro_batch * spec.seq_len
    h, vocab = spec.hidden, spec.vocab
    mats = _matrices(spec)

    # weight-gradient GEMMs of one micro-batch (the k x n x m GEMM of each forward m x n x k)
    wgrad_layer = sum(gemm_time(d_in, d_out, tokens, 1, peak, hbm, sms, calib) for d_in, d_out in
                      ((h, mats["q"][1] + mats["k"][1] + mats["v"][1]), mats["o"],
                       (h, (spec.ffn_matrices - 1) * spec.ffn_hidden), mats["down"]))
    wgrad = m * (spec.layers * wgrad_layer + gemm_time(h, vocab, tokens, 1, peak, hbm, sms, calib))
    compute = b["compute"] + b["recompute"]
    uses = 3.0 if recompute == "full" else 2.0  # frozen weights used in forward, backward (and recompute)
    base_kernels = JK.kernels_per_step(spec.layers, hc["kernels_per_layer_forward"],
                                       hc["backward_kernels_per_forward"], hc["optimizer_kernels"], m)
    if method == "full":
        T = P
        mem = {"weights": 2.0 * P, "gradients": 2.0 * P, "optimizer": 12.0 * P}
        parts = {"frozen_compute": compute - wgrad, "weight_gradients": wgrad, "adapters": 0.0, "dequantisation": 0.0,
                 "optimizer": b["optimizer"], "all_reduce": b["dp_comm"]}
        kernels = base_kernels
    else:
        T = lora_trainable_params(spec, rank, targets)
        adapter = 0.0
        # rank-r GEMMs on the roofline without tile quantisation (1 x 1 tiles): libraries run these
        # skinny shapes with split-K or narrow tiles, not the large-GEMM tiles of the calibration
        skinny = calib.copy()
        skinny[K.C_TILE_M] = 1.0
        skinny[K.C_TILE_N] = 1.0
        for d_in, d_out in adapted:
            fa, ba = gemm_fwd_bwd_time(tokens, rank, d_in, 1, peak, hbm, sms, skinny)
            fb, bb = gemm_fwd_bwd_time(tokens, d_out, rank, 1, peak, hbm, sms, skinny)
            adapter += fa + ba + fb + bb + (uses - 2.0) * (fa + fb)
        adapter *= m * spec.layers
        apb = fc["adapter_bytes_per_param"]  # fp32 weight, gradient, two Adam moments
        mem = {"weights": 2.0 * P + 4.0 * T, "gradients": 4.0 * T, "optimizer": (apb - 8.0) * T}
        dequant = 0.0
        kernels = base_kernels + m * spec.layers * len(adapted) * fc["adapter_kernels_forward"] * (
            1.0 + hc["backward_kernels_per_forward"])
        if method == "qlora":
            q = quantised_params(spec)
            bits = nf4_bits_per_param(True)
            mem["weights"] = 2.0 * (P - q) + q * bits / 8.0 + 4.0 * T
            layer_q = q / spec.layers
            n_mats = len(mats)
            dequant = m * uses * spec.layers * memory_bound_time(layer_q * (bits / 8.0 + 2.0),
                                                                 fc["dequant_kernels_per_matrix"] * n_mats, hbm, calib)
            largest = max(a * b_ for a, b_ in mats.values())
            activations += 2.0 * 2.0 * largest  # the dequantised bf16 buffer (and the next one, prefetched)
            kernels += m * uses * spec.layers * n_mats * fc["dequant_kernels_per_matrix"]
        opt = memory_bound_time(ADAM_TRAFFIC_BYTES_PER_PARAM * T, 4.0, hbm, calib)
        eff = calib[K.C_NET_EFF]
        ar = allreduce_time(4.0 * T, gpus, 1, sys_.scale_up_domain, sys_.scale_up_GBps_per_gpu * 1e9,
                            sys_.scale_up_latency_s, sys_.scale_out_GBps_per_gpu * 1e9, sys_.scale_out_latency_s, eff)
        parts = {"frozen_compute": compute - wgrad, "weight_gradients": 0.0, "adapters": adapter,
                 "dequantisation": dequant, "optimizer": opt, "all_reduce": ar}
    mem["activations"] = activations
    mem["reserved"] = reserved
    busy = sum(parts.values())
    parts["launch"] = JK.launch_exposed_s(kernels, hc["launch_latency_s"], busy)
    parts["synchronisation"] = JK.sync_s(hc["sync_points_per_step"], hc["sync_latency_s"], hc["step_time_jitter"],
                                         parts["frozen_compute"] + parts["weight_gradients"] + parts["adapters"]
                                         + parts["dequantisation"], gpus)
    total = sum(mem.values())
    return FineTune(method=method, trainable_params=int(T), memory_bytes={k: float(mem[k]) for k in MEMORY_PARTS},
                    time_s={k: float(parts[k]) for k in FT_TIME_PARTS},
                    fits=bool(total <= sys_.hbm_capacity_GiB * GiB))
