"""Tensor-parallel inference latency: prefill (serial or ISO split-sequence overlap) and decode.

Python API over :mod:`trainscale.kernels.inference` (the formulas and the schedule are documented
there). ``prefill`` and ``decode`` price one configuration and return typed results;
``prefill_grid`` prices tensor-parallel degrees x prompt lengths x split ratios in one Numba call.
Weights, activations and the KV cache are 16-bit; ``batch`` prompts are processed together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np

from . import catalog
from ..common.checks import check_float, check_floats, check_int
from ..kernels import inference as K
from .perfmodel import GiB, calibration_vector, model_vector, system_vector
from .specs import ModelSpec, SpecError, resolve_model, resolve_system

__all__ = ["Decode", "Prefill", "block_time_s", "check_tp", "decode", "kv_cache_bytes_per_gpu", "layer_flops", "memory_fits", "prefill",
           "prefill_grid", "weight_bytes_per_gpu"]


@dataclass(frozen=True)
class Prefill:
    """One prefill on ``tp`` GPUs. ``time_s`` is the latency with the prompt split after
    ``first_chunk_tokens`` (0 or all: serial), ``serial_time_s`` the unsplit latency, ``savings``
    ``1 - time_s / serial_time_s``. ``compute_s`` and ``comm_s`` sum the split execution's
    compute and communication (per GPU); ``exposed_comm_s = time_s - compute_s``."""

    tp: int
    prompt_tokens: int
    batch: int
    split_ratio: float
    first_chunk_tokens: int
    time_s: float
    serial_time_s: float
    savings: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    flops_per_gpu: float

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Decode:
    """One decode step (one new token per sequence) after ``context_tokens`` cached tokens."""

    tp: int
    context_tokens: int
    batch: int
    time_s: float
    compute_s: float
    comm_s: float
    flops_per_gpu: float

    def as_dict(self) -> dict:
        return asdict(self)


def check_tp(model: ModelSpec, tp, name: str = "tp") -> int:
    """A tensor-parallel degree that divides the model's query and key/value heads."""
    tp = check_int(name, tp, 1)
    if model.heads % tp or model.kv_heads % tp:
        raise SpecError(name, tp, f"must divide {model.name}'s heads = {model.heads} and kv_heads = {model.kv_heads}")
    return tp


def _resolve(model) -> ModelSpec:
    """The model, where this module can price its attention: multi-head or grouped-query (its KV cache and
    decode GEMVs); latent attention (DeepSeek-V3) caches its latent instead, which is not priced here."""
    model = resolve_model(model)
    if model.is_mla:
        raise SpecError("kv_lora_rank", model.kv_lora_rank, "the inference model prices multi-head and "
                        "grouped-query attention only (use 0); latent attention is priced for training (predict)")
    return model


def _setup(model, system, calibration):
    model = _resolve(model)
    system = resolve_system(system)
    return model, system, calibration_vector(system.generation, calibration)


def layer_flops(model, tp: int, tokens: int, context: int = 0, batch: int = 1) -> float:
    """FLOPs per GPU of one layer for ``tokens`` new tokens after ``context`` cached ones."""
    model = _resolve(model)
    tp = check_tp(model, tp)
    kv = model.kv_heads * model.head_dim
    return float(K.layer_flops(check_int("batch", batch, 1), check_int("tokens", tokens, 1),
                               check_int("context", context, 0), model.hidden, model.heads, kv,
                               model.ffn_hidden, model.ffn_matrices, tp))


def block_time_s(model, system, tokens: int, context: int = 0, batch: int = 1,
                 calibration: Mapping[str, float] | None = None) -> float:
    """Seconds of one transformer block on one GPU (no tensor parallelism) for ``tokens`` new tokens of
    ``batch`` sequences after ``context`` cached ones: a decode step's layer (``tokens`` = 1: weight GEMVs,
    attention over the cache) or a prefill chunk's attention and MLP blocks; 16-bit weights."""
    model, system, calib = _setup(model, system, calibration)
    s = check_int("tokens", tokens, 1)
    ctx = check_int("context", context, 0)
    b = check_int("batch", batch, 1)
    h, kv = float(model.hidden), float(model.kv_heads * model.head_dim)
    peak, hbm, sms = system.peak_flops_bf16, system.hbm_bandwidth_GBps * 1e9, system.sm_count
    if s == 1:
        return float(K.decode_layer_compute(b, ctx, h, model.heads, kv, model.ffn_hidden, model.ffn_matrices, 1.0,
                                            peak, hbm, calib))
    return float(K.attention_block_time(b, s, ctx, h, model.heads, kv, 1.0, peak, hbm, sms, calib)
                 + K.mlp_block_time(b, s, h, model.ffn_hidden, model.ffn_matrices, 1.0, peak, hbm, sms, calib))


def weight_bytes_per_gpu(model, tp: int) -> float:
    """16-bit weights held by one of ``tp`` GPUs (every matrix, embedding and output layer sharded)."""
    model = _resolve(model)
    return K.BYTES * model.params() / check_tp(model, tp)


def kv_cache_bytes_per_gpu(model, tp: int, tokens: int, batch: int = 1) -> float:
    """16-bit keys and values of ``tokens`` tokens of ``batch`` sequences on one of ``tp`` GPUs."""
    model = _resolve(model)
    kv = model.kv_heads * model.head_dim
    return 2.0 * K.BYTES * batch * tokens * kv / check_tp(model, tp) * model.layers


def prefill(model, system, tp: int, prompt_tokens: int, split_ratio: float = 0.0, batch: int = 1,
            overlap_slowdown: float = 0.0, calibration: Mapping[str, float] | None = None) -> Prefill:
    """Prefill latency of ``batch`` prompts of ``prompt_tokens`` tokens, the prompt split after
    ``round(split_ratio * prompt_tokens)`` tokens (ISO; 0 or 1: serial)."""
    model, system, calib = _setup(model, system, calibration)
    tp = check_tp(model, tp)
    s = check_int("prompt_tokens", prompt_tokens, 1)
    ratio = check_float("split_ratio", split_ratio, 0.0, 1.0)
    b = check_int("batch", batch, 1)
    slow = check_float("overlap_slowdown", overlap_slowdown, 0.0, 10.0)
    mvec, svec = model_vector(model), system_vector(system)
    s1 = int(K.chunk_tokens(s, ratio))
    out = np.empty(K.P_SIZE)
    K.prefill_time(mvec, svec, calib, tp, b, s, s1, slow, out)
    serial = np.empty(K.P_SIZE)
    K.prefill_time(mvec, svec, calib, tp, b, s, 0, slow, serial)
    return Prefill(tp=tp, prompt_tokens=s, batch=b, split_ratio=ratio, first_chunk_tokens=s1,
                   time_s=float(out[K.P_TIME]), serial_time_s=float(serial[K.P_TIME]),
                   savings=float(1.0 - out[K.P_TIME] / serial[K.P_TIME]), compute_s=float(out[K.P_COMPUTE]),
                   comm_s=float(out[K.P_COMM]), exposed_comm_s=float(out[K.P_TIME] - out[K.P_COMPUTE]),
                   flops_per_gpu=float(out[K.P_FLOPS]))


def decode(model, system, tp: int, context_tokens: int, batch: int = 1,
           calibration: Mapping[str, float] | None = None) -> Decode:
    """Latency of one decode step (always serial: one token cannot be split)."""
    model, system, calib = _setup(model, system, calibration)
    tp = check_tp(model, tp)
    ctx = check_int("context_tokens", context_tokens, 0)
    b = check_int("batch", batch, 1)
    out = np.empty(K.P_SIZE)
    K.decode_time(model_vector(model), system_vector(system), calib, tp, b, ctx, out)
    return Decode(tp=tp, context_tokens=ctx, batch=b, time_s=float(out[K.P_TIME]), compute_s=float(out[K.P_COMPUTE]),
                  comm_s=float(out[K.P_COMM]), flops_per_gpu=float(out[K.P_FLOPS]))


def prefill_grid(model, system, tps: Sequence[int], prompt_tokens: Sequence[int], split_ratios: Sequence[float],
                 batch: int = 1, overlap_slowdown: float = 0.0,
                 calibration: Mapping[str, float] | None = None) -> np.ndarray:
    """``out[i, j, r, P_*]``: prefill of ``prompt_tokens[j]`` on ``tps[i]`` GPUs split at ``split_ratios[r]``."""
    model, system, calib = _setup(model, system, calibration)
    if isinstance(tps, (str, bytes)) or not isinstance(tps, (Sequence, np.ndarray)) or len(tps) == 0:
        raise SpecError("tps", tps, "expected a non-empty list of tensor-parallel degrees")
    tp_arr = np.asarray([check_tp(model, int(t) if isinstance(t, np.integer) else t, "tps") for t in tps],
                        dtype=np.int64)
    if isinstance(prompt_tokens, (str, bytes)) or not isinstance(prompt_tokens, (Sequence, np.ndarray)) \
            or len(prompt_tokens) == 0:
        raise SpecError("prompt_tokens", prompt_tokens, "expected a non-empty list of integers >= 1")
    prompts = np.asarray([check_int("prompt_tokens", int(p) if isinstance(p, np.integer) else p, 1)
                          for p in prompt_tokens], dtype=np.int64)
    ratios = np.asarray(check_floats("split_ratios", list(split_ratios), 0.0, 1.0))
    out = np.empty((tp_arr.size, prompts.size, ratios.size, K.P_SIZE))
    K.prefill_grid(model_vector(model), system_vector(system), calib, tp_arr, prompts, ratios,
                   check_int("batch", batch, 1), check_float("overlap_slowdown", overlap_slowdown, 0.0, 10.0), out)
    return out


PREFILL_FIELDS = {"time_s": K.P_TIME, "compute_s": K.P_COMPUTE, "comm_s": K.P_COMM}


def prefill_table(model, system, tps: Sequence[int], prompt_tokens: Sequence[int], split_ratios: Sequence[float],
                  batch: int = 1, overlap_slowdown: float = 0.0,
                  calibration: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """:func:`prefill_grid` as named arrays ``[tp, prompt, ratio]``: ``time_s`` (the prefill),
    ``compute_s`` and ``comm_s`` (the all-reduces)."""
    out = prefill_grid(model, system, tps, prompt_tokens, split_ratios, batch, overlap_slowdown, calibration)
    return {name: out[..., slot] for name, slot in PREFILL_FIELDS.items()}


def memory_fits(model, system, tp: int, tokens: int, batch: int = 1) -> bool:
    """Whether weights, the KV cache of ``tokens`` tokens and the framework's reserve
    (``reserved_GiB`` of calibration.yaml) fit in one GPU's memory."""
    model, system = _resolve(model), resolve_system(system)
    reserved = catalog.calibration()["common"]["reserved_GiB"]["value"] * GiB
    need = weight_bytes_per_gpu(model, tp) + kv_cache_bytes_per_gpu(model, tp, tokens, batch) + reserved
    return bool(need <= system.hbm_capacity_GiB * GiB)
