"""The values a spec field may take and the parsers that read one field of a mapping.

The vocabularies (recompute modes, stacks, FFN types, position encodings, rotary kernels, precisions and their
scaling recipes), the integer limits every count is checked against, and the helpers that read one field of an
input mapping (``_int``, ``_float``, ``_bool``, ``_choice``, ...) and refuse unknown fields, each raising a
:class:`~trainscale.common.errors.SpecError` that names the field, the value and what is valid. Shared by
:mod:`.model_spec`, :mod:`.system_spec` and :mod:`.plan_spec`; :mod:`.specs` re-exports the vocabularies.
"""

from __future__ import annotations

import math
from typing import Mapping

from ..common.errors import SpecError

RECOMPUTE_MODES = ("none", "selective", "full")
# Megatron-Core's named modules of a selective recomputation (TransformerConfig.recompute_modules; NVIDIA/Megatron-LM
# d98e8a6 megatron/core/transformer/transformer_config.py): a plan's recompute_modules, bit i of the kernels' mask is
# module i (trainscale.kernels.layout RM_*, trainscale.kernels.activations)
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "moe_act", "mlp", "moe", "shared_experts")
STACKS = ("megatron", "deepspeed", "fsdp", "nemo")
DEFAULT_STACK = "megatron"
# Plan knobs whose default is the stack's own (data/stack_defaults.yaml): None at construction means
# "not given", resolved by PlanSpec.__post_init__; sequence_parallel before tp_comm_overlap, which needs it.
STACK_DEFAULT_FIELDS = ("recompute", "flash_attention", "zero", "sequence_parallel", "overlap_grad_reduce",
                        "tp_comm_overlap")
TP_RULE = "tp>1"  # a stack default that is on exactly where the plan has tensor parallelism
FFN_TYPES = ("gelu", "swiglu")
# how a model encodes token positions: a learned table added to the input (GPT), rotary embeddings
# applied to queries and keys in every layer (Llama, Su et al. 2021), or ALiBi biases on the scores (BLOOM)
POSITION_EMBEDDINGS = ("learned", "rotary", "alibi")
# how a code base applies rotary embeddings (HBM bytes and kernels of each: data/calibration.yaml, rotary_kernels)
ROTARY_KERNELS = ("fused", "complex", "matrix", "rotate_half")
# number format of the linear layers' GEMMs (attention, norms, router, embedding and output layer stay in
# bf16), and the scaling recipe of each low-precision format (the first is the default): per-tensor
# scales from an amax history (delayed), from the tensor itself (current), per 128-element blocks
# (blockwise, DeepSeek-V3's 1x128 activations / 128x128 weights), or the formats' own block scales
# (mxfp8: 32-element blocks with E8M0 scales; nvfp4: 16-element blocks with E4M3 scales and a tensor scale)
PRECISIONS = ("bf16", "fp8", "mxfp8", "nvfp4")
# a MoE plan's token dispatcher: Megatron-Core's all-to-all one, or its flex dispatcher with the DeepEP backend
MOE_DISPATCHERS = ("alltoall", "deepep", "hybridep")
# Megatron-Core's CUDA graphs (cuda_graph_impl): none, Transformer Engine's graphs of named scopes (attention, the
# router, the dispatcher's preprocessing), or the whole forward and backward of a step
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")
FP8_RECIPES = {"bf16": ("none",), "fp8": ("current", "delayed", "blockwise"), "mxfp8": ("mxfp8",),
               "nvfp4": ("nvfp4",)}


INT_MAX = 2**40  # every count (GPUs, batch, widths) stays far inside the kernels' 64-bit integers
INT_LIMITS = {"layers": 100_000, "hidden": 2**20, "heads": 2**16, "kv_heads": 2**16, "ffn_hidden": 2**22,
              "vocab": 2**24, "seq_len": 2**24, "experts": 2**16, "top_k": 2**16, "sm_count": 100_000,
              "gpus_per_node": 100_000, "scale_up_domain": 2**24, "scale_out_leaf_gpus": 2**30,
              "tp": 2**20, "pp": 2**20, "cp": 2**20, "dp": 2**30, "interleave": 2**16, "micro_batch": 2**24,
              "shard_group": 2**30, "ep": 2**16, "gpus": 2**30, "etp": 2**20, "kv_channels": 2**16,
              "shared_experts": 2**16, "shared_expert_ffn_hidden": 2**22, "dense_layers": 100_000,
              "dense_ffn_hidden": 2**22, "q_lora_rank": 2**20, "kv_lora_rank": 2**20, "qk_head_dim": 2**16,
              "qk_pos_emb_head_dim": 2**16, "v_head_dim": 2**16, "mtp_num_layers": 100_000}


def _int(d: Mapping, key: str, where: str | None, default=None, minimum: int = 1) -> int:
    value = d.get(key, default)
    maximum = INT_LIMITS.get(key, INT_MAX)
    if value is None:
        raise SpecError(key, value, "it is required (an integer)", where)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise SpecError(key, value, f"expected an integer in [{minimum}, {maximum}]", where)
    if not minimum <= value <= maximum:
        raise SpecError(key, value, f"expected an integer in [{minimum}, {maximum}]", where)
    return value


def _float(d: Mapping, key: str, where: str | None, default=None, minimum: float = 0.0,
           allow_none: bool = False) -> float | None:
    value = d.get(key, default)
    if value is None:
        if allow_none:
            return None
        raise SpecError(key, value, "it is required (a number)", where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(key, value, f"expected a number >= {minimum}", where)
    if not math.isfinite(value) or value < minimum:
        raise SpecError(key, value, f"expected a finite number >= {minimum}", where)
    return float(value)


def _bool(d: Mapping, key: str, where: str | None, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(key, value, "expected true or false", where)
    return value


def _choice(d: Mapping, key: str, where: str | None, default: str, choices) -> str:
    value = d.get(key, default)
    if value not in choices:
        raise SpecError(key, value, f"expected one of {', '.join(choices)}", where)
    return value


def _optional_bool(d: Mapping, key: str, where: str | None) -> bool | None:
    """True or false, or None where the field is absent or null (its default applies)."""
    if d.get(key) is None:
        return None
    return _bool(d, key, where, False)


def _given(d: Mapping, key: str, parse):
    """``parse()`` where the field is given, None where it is absent or null (its default applies)."""
    return None if d.get(key) is None else parse()


def _optional_choice(d: Mapping, key: str, where: str | None, choices) -> str:
    """One of ``choices``, or "" where the field is absent, null or blank (its default applies)."""
    if d.get(key) in (None, ""):
        return ""
    return _choice(d, key, where, "", choices)


def _reject_unknown(d: Mapping, known, where: str | None, what: str) -> None:
    for key in d:
        if key not in known:
            raise SpecError(key, d[key], f"unknown {what} field; valid fields: {', '.join(sorted(known))}",
                            where)
