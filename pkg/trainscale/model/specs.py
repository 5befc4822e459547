"""Specifications: what is trained (model), on what (system), and how (plan).

Following Calculon's separation of application, system and execution, a prediction takes
three specs. They are validated once, here, at the boundary: every error names the field,
the value and what would be valid. Kernels downstream trust their input.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import catalog
from ..common.errors import SpecError, short_repr  # noqa: F401 - defined apart so that inputs (the strict YAML
# loader the catalogs use) needs no specs: specs reads data/stack_defaults.yaml when it is imported

RECOMPUTE_MODES = ("none", "selective", "full")
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
FP8_RECIPES = {"bf16": ("none",), "fp8": ("current", "delayed", "blockwise"), "mxfp8": ("mxfp8",),
               "nvfp4": ("nvfp4",)}


INT_MAX = 2**40  # every count (GPUs, batch, widths) stays far inside the kernels' 64-bit integers
INT_LIMITS = {"layers": 100_000, "hidden": 2**20, "heads": 2**16, "kv_heads": 2**16, "ffn_hidden": 2**22,
              "vocab": 2**24, "seq_len": 2**24, "experts": 2**16, "top_k": 2**16, "sm_count": 100_000,
              "gpus_per_node": 100_000, "scale_up_domain": 2**24, "scale_out_leaf_gpus": 2**30,
              "tp": 2**20, "pp": 2**20, "cp": 2**20, "dp": 2**30, "interleave": 2**16, "micro_batch": 2**24,
              "shard_group": 2**30, "ep": 2**16, "gpus": 2**30, "etp": 2**20, "kv_channels": 2**16,
              "shared_experts": 2**16, "shared_expert_ffn_hidden": 2**22, "dense_layers": 100_000,
              "dense_ffn_hidden": 2**22}


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


# --------------------------------------------------------------------------- model
@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, dense or mixture of experts.

    ``ffn_hidden`` is the width of each feed-forward matrix: two matrices (h x f, f x h) with
    biases for ``gelu`` (GPT), three without biases for ``swiglu`` (Llama: gate, up, down).
    Input embedding and output projection are untied (both counted).

    Mixture of experts: ``experts > 1`` replaces the FFN of every layer by ``experts`` FFNs of
    that shape and a router (an ``h x experts`` matrix, no bias); each token goes to ``top_k`` of
    them, and an expert processes at most ``capacity_factor`` times its balanced share of the
    routed tokens (the compute is padded to that capacity). The defaults (1 expert, top-1,
    capacity 1.0) are the dense model.

    ``kv_channels`` (Megatron-Core's name; 0: ``hidden / heads``) is the width of one attention head where a
    model sets it apart from the hidden size (Qwen3: 128 with hidden 4096 and 64 heads; GPT-OSS: 64). ``shared_experts``
    FFNs of width ``shared_expert_ffn_hidden`` (0: ``ffn_hidden``) run on every token of a MoE layer beside
    the routed ones (DeepSeek-V3: 1). The first ``dense_layers`` layers of a MoE model are dense, with FFN
    width ``dense_ffn_hidden`` (0: ``ffn_hidden``; DeepSeek-V3: 3 layers of 18432).

    ``position_embedding`` is ``learned``, ``rotary`` or ``alibi``; left blank it follows the FFN's
    convention (``gelu``: GPT's learned table of ``seq_len x hidden``; ``swiglu``: Llama's rotary
    embeddings, applied to every layer's queries and keys and priced as the stack's element-wise
    kernel). ALiBi adds a bias to the attention scores inside the attention kernel: no parameters,
    no separate pass.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    ffn_type: str
    vocab: int
    seq_len: int
    source: str = ""
    experts: int = 1
    top_k: int = 1
    capacity_factor: float = 1.0
    position_embedding: str = ""
    kv_channels: int = 0
    shared_experts: int = 0
    shared_expert_ffn_hidden: int = 0
    dense_layers: int = 0
    dense_ffn_hidden: int = 0

    @property
    def query_width(self) -> int:
        """Width of the queries (and of the attention output): hidden, or heads x head_dim."""
        return self.heads * self.kv_channels if self.kv_channels else self.hidden

    @property
    def shared_ffn_width(self) -> int:
        """Total FFN width of a MoE layer's shared experts (0: none)."""
        return self.shared_experts * (self.shared_expert_ffn_hidden or self.ffn_hidden) if self.is_moe else 0

    @property
    def moe_layers(self) -> int:
        """Layers with experts (all of a MoE model's but its leading dense ones; 0 for a dense model)."""
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def positions(self) -> str:
        """The position encoding in force: the given one, or the FFN's convention."""
        if self.position_embedding:
            return self.position_embedding
        return "learned" if self.ffn_type == "gelu" else "rotary"

    @property
    def rotary(self) -> bool:
        return self.positions == "rotary"

    @property
    def learned_positions(self) -> bool:
        return self.positions == "learned"

    def position_params(self) -> int:
        """Parameters of the learned position table (``seq_len x hidden``); none for rotary or ALiBi."""
        return self.seq_len * self.hidden if self.learned_positions else 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``kv_channels``, or hidden / heads."""
        return self.kv_channels or self.hidden // self.heads

    @property
    def ffn_matrices(self) -> int:
        return 2 if self.ffn_type == "gelu" else 3

    @property
    def has_biases(self) -> bool:
        return self.ffn_type == "gelu"

    def params_per_layer(self) -> int:
        """Weights (and GPT biases) of one transformer layer (all experts of a MoE layer)."""
        return self.shared_params_per_layer() + self.expert_params_per_layer()

    def expert_params_per_layer(self) -> int:
        """Weights (and GPT biases) of one layer's experts: all of them for a mixture of experts,
        0 for a dense model (whose FFN is shared)."""
        if not self.is_moe:
            return 0
        return self.experts * self._ffn_params()

    def shared_params_per_layer(self) -> int:
        """Weights of one layer outside its experts: attention, norms, the router of a MoE layer,
        and the FFN of a dense one."""
        h = self.hidden
        q = self.query_width
        kv = self.kv_heads * self.head_dim
        attention = h * (q + 2 * kv) + q * h
        norms = 4 * h if self.has_biases else 2 * h  # LayerNorm has a bias, RMSNorm does not
        biases = (q + 2 * kv) + h if self.has_biases else 0
        if self.is_moe:  # router, and the shared experts
            shared = self._ffn_params(self.shared_ffn_width) if self.shared_ffn_width else 0
            return attention + norms + biases + h * self.experts + shared
        return attention + norms + biases + self._ffn_params()

    def dense_layer_params(self) -> int:
        """Weights of one of a MoE model's leading dense layers (its FFN ``dense_ffn_hidden`` wide)."""
        moe_shared = self.shared_params_per_layer()
        h = self.hidden
        shared = self._ffn_params(self.shared_ffn_width) if self.shared_ffn_width else 0
        return moe_shared - h * self.experts - shared + self._ffn_params(self.dense_ffn_hidden or self.ffn_hidden)

    def layer_params(self) -> int:
        """Weights of all layers (a MoE model's leading dense layers at their own width)."""
        if self.is_moe and self.dense_layers:
            return self.moe_layers * self.params_per_layer() + self.dense_layers * self.dense_layer_params()
        return self.layers * self.params_per_layer()

    def _ffn_params(self, width: int | None = None) -> int:
        h, f = self.hidden, (self.ffn_hidden if width is None else width)
        return self.ffn_matrices * h * f + (f + h if self.has_biases else 0)

    def weight_matrices_per_layer(self) -> int:
        """Weight matrices of one layer, the tensors DeepSpeed's ZeRO-3 gathers one by one (its
        biases and norms, under ``stage3_param_persistence_threshold``'s 1e5 elements, stay
        resident): GPT's (Megatron's) fused QKV, projection and two FFN matrices (4); Llama's
        separate Q, K, V, O and its FFN matrices (gate, up, down: 7)."""
        return 4 if self.has_biases else 4 + self.ffn_matrices

    def params(self) -> int:
        """All parameters: layers, final norm, input embedding (plus a learned position table)
        and the untied output projection."""
        h = self.hidden
        final_norm = 2 * h if self.has_biases else h
        return self.layer_params() + 2 * self.vocab * h + self.position_params() + final_norm

    def active_params(self) -> int:
        """Parameters a token uses: all of a dense model; a MoE model's ``top_k`` experts per layer."""
        if not self.is_moe:
            return self.params()
        return self.params() - self.moe_layers * (self.experts - self.top_k) * self._ffn_params()

    @classmethod
    def from_dict(cls, d: Mapping, name: str = "custom", where: str | None = None) -> "ModelSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        _reject_unknown(d, known, where, "model")
        hidden = _int(d, "hidden", where)
        heads = _int(d, "heads", where)
        if hidden % heads:
            raise SpecError("heads", heads, f"must divide hidden = {hidden}", where)
        kv_heads = _int(d, "kv_heads", where, default=heads)
        if heads % kv_heads:
            raise SpecError("kv_heads", kv_heads, f"must divide heads = {heads}", where)
        ffn_type = _choice(d, "ffn_type", where, "gelu", FFN_TYPES)
        if ffn_type == "gelu":
            default_ffn = 4 * hidden
        else:  # Llama convention: 2/3 of 4h, rounded up to a multiple of 256
            default_ffn = 256 * math.ceil(8 * hidden / 3 / 256)
        experts = _int(d, "experts", where, 1)
        top_k = _int(d, "top_k", where, 1)
        if top_k > experts:
            raise SpecError("top_k", top_k, f"expected at most experts = {experts}", where)
        capacity = _float(d, "capacity_factor", where, 1.0, minimum=1.0)
        layers = _int(d, "layers", where)
        moe_fields = {key: _int(d, key, where, 0, minimum=0) for key in
                      ("shared_experts", "shared_expert_ffn_hidden", "dense_layers", "dense_ffn_hidden")}
        if experts == 1:
            for key, value in moe_fields.items():
                if value:
                    raise SpecError(key, value, "only a mixture of experts (experts > 1) has it; use 0", where)
        if moe_fields["dense_layers"] >= layers:
            raise SpecError("dense_layers", moe_fields["dense_layers"], f"expected fewer than layers = {layers}",
                            where)
        return cls(
            name=str(d.get("name", name)),
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            ffn_hidden=_int(d, "ffn_hidden", where, default=default_ffn),
            ffn_type=ffn_type,
            vocab=_int(d, "vocab", where),
            seq_len=_int(d, "seq_len", where),
            source=str(d.get("source", "")),
            experts=experts,
            top_k=top_k,
            capacity_factor=capacity,
            position_embedding=_optional_choice(d, "position_embedding", where, POSITION_EMBEDDINGS),
            kv_channels=_int(d, "kv_channels", where, 0, minimum=0),
            **moe_fields,
        )


def resolve_model(value: str | Mapping | ModelSpec, where: str | None = None) -> ModelSpec:
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, str):
        models = catalog.models()
        if value not in models:
            raise SpecError("model", value, f"expected a catalog model ({', '.join(sorted(models))}) "
                            "or a mapping of its shape", where)
        return ModelSpec.from_dict(models[value], name=value, where=where)
    if isinstance(value, Mapping):
        return ModelSpec.from_dict(value, where=where)
    raise SpecError("model", value, "expected a catalog name or a mapping", where)


# --------------------------------------------------------------------------- system
@dataclass(frozen=True)
class SystemSpec:
    """A cluster building block: nodes of identical accelerators, a scale-up domain (NVLink /
    NVSwitch / Infinity Fabric) and a scale-out network. Bandwidths are unidirectional per GPU.

    The scale-out topology fields are optional. ``scale_out_leaf_gpus`` (default 0: one flat
    tier, every NIC on the same switch layer) is the number of GPUs under one leaf switch of a
    two-tier fat-tree; collectives whose group spans more than one leaf cross the spine, where
    the bandwidth is divided by ``scale_out_oversubscription`` (default 1.0, non-blocking).
    ``scale_out_hop_latency_s`` (default 0.0: the hops are inside ``scale_out_latency_s``) is
    added per link hop to every scale-out step: 2 hops inside a leaf, 4 across the spine.
    """

    name: str
    accelerator: str
    generation: str
    peak_flops_bf16: float
    peak_flops_fp8: float | None
    sm_count: int
    hbm_capacity_GiB: float
    hbm_bandwidth_GBps: float
    tdp_W: float
    idle_W: float
    gpus_per_node: int
    scale_up_domain: int
    scale_up_GBps_per_gpu: float
    scale_up_latency_s: float
    scale_out_GBps_per_gpu: float
    scale_out_latency_s: float
    node_overhead_W: float = 0.0
    scale_out_leaf_gpus: int = 0
    scale_out_oversubscription: float = 1.0
    scale_out_hop_latency_s: float = 0.0
    peak_flops_fp4: float | None = None  # dense FP4 (NVFP4) tensor-core peak; None: no FP4 tensor cores
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    NUMERIC_FIELDS = (
        "peak_flops_bf16", "peak_flops_fp8", "sm_count", "hbm_capacity_GiB", "hbm_bandwidth_GBps",
        "tdp_W", "idle_W", "gpus_per_node", "scale_up_domain", "scale_up_GBps_per_gpu",
        "scale_up_latency_s", "scale_out_GBps_per_gpu", "scale_out_latency_s", "node_overhead_W",
        "scale_out_leaf_gpus", "scale_out_oversubscription", "scale_out_hop_latency_s", "peak_flops_fp4",
    )
    # optional fields and their defaults (an entry without them loads unchanged)
    # plausible ranges, so that a unit slip (TFLOP/s for FLOP/s, Gb/s for GB/s by 1e3) is an error
    RANGES = {
        "peak_flops_bf16": (1e12, 1e17, "FLOP/s per GPU (a value under 1e12 looks like TFLOP/s)"),
        "peak_flops_fp8": (1e12, 1e17, "FLOP/s per GPU (a value under 1e12 looks like TFLOP/s)"),
        "peak_flops_fp4": (1e12, 1e17, "FLOP/s per GPU (a value under 1e12 looks like TFLOP/s)"),
        "hbm_capacity_GiB": (0.5, 1e5, "GiB"), "hbm_bandwidth_GBps": (1.0, 1e6, "GB/s"),
        "tdp_W": (1.0, 1e5, "W"), "idle_W": (0.0, 1e5, "W"), "node_overhead_W": (0.0, 1e7, "W"),
        "scale_up_GBps_per_gpu": (1e-6, 1e6, "GB/s"), "scale_out_GBps_per_gpu": (1e-6, 1e6, "GB/s"),
        "scale_up_latency_s": (0.0, 10.0, "seconds"), "scale_out_latency_s": (0.0, 10.0, "seconds"),
        "scale_out_oversubscription": (1.0, 1e3, "a ratio"), "scale_out_hop_latency_s": (0.0, 1.0, "seconds"),
    }
    OPTIONAL_DEFAULTS = {"node_overhead_W": 0.0, "scale_out_leaf_gpus": 0, "scale_out_oversubscription": 1.0,
                         "scale_out_hop_latency_s": 0.0}

    @classmethod
    def overridable_fields(cls) -> tuple[str, ...]:
        return ("accelerator", "generation") + cls.NUMERIC_FIELDS

    @classmethod
    def from_catalog(cls, name: str, overrides: Mapping | None = None,
                     where: str | None = None) -> "SystemSpec":
        systems = catalog.systems()
        if name not in systems:
            raise SpecError("system", name, f"expected a catalog system ({', '.join(sorted(systems))})",
                            where)
        entry = systems[name]
        values: dict[str, Any] = {"name": name}
        sources: dict[str, str] = {}
        for key, item in entry.items():
            if isinstance(item, Mapping) and "value" in item:
                values[key] = item["value"]
                sources[key] = item.get("source", "")
            elif key != "description":
                values[key] = item
        overrides = dict(overrides or {})
        overrides.pop("name", None)
        _reject_unknown(overrides, set(cls.overridable_fields()), where, "system")
        for key, value in overrides.items():
            values[key] = value
            sources[key] = "override in the run's input"
        return cls._checked(values, sources, where)

    @classmethod
    def _checked(cls, values: dict, sources: dict, where: str | None) -> "SystemSpec":
        generations = catalog.generations()
        if values.get("generation") not in generations:
            raise SpecError("generation", values.get("generation"),
                            f"expected one of {', '.join(generations)}", where)
        kwargs: dict[str, Any] = {"name": values["name"], "accelerator": str(values.get("accelerator", "")),
                                  "generation": values["generation"], "sources": sources}
        for key in cls.NUMERIC_FIELDS:
            if key in ("sm_count", "gpus_per_node", "scale_up_domain"):
                kwargs[key] = _int(values, key, where)
            elif key in ("peak_flops_fp8", "peak_flops_fp4"):
                kwargs[key] = _float(values, key, where, allow_none=True)
            elif key == "scale_out_leaf_gpus":
                kwargs[key] = _int(values, key, where, default=0, minimum=0)
            elif key == "scale_out_oversubscription":
                kwargs[key] = _float(values, key, where, default=1.0, minimum=1.0)
            elif key in cls.OPTIONAL_DEFAULTS:
                kwargs[key] = _float(values, key, where, default=cls.OPTIONAL_DEFAULTS[key])
            else:
                kwargs[key] = _float(values, key, where)
        for key, (lo, hi, unit) in cls.RANGES.items():
            value = kwargs[key]
            if value is not None and not lo <= value <= hi:
                raise SpecError(key, value, f"expected {unit} in [{lo:g}, {hi:g}]", where)
        if kwargs["idle_W"] > kwargs["tdp_W"]:
            raise SpecError("idle_W", kwargs["idle_W"], f"must not exceed tdp_W = {kwargs['tdp_W']}", where)
        leaf = kwargs["scale_out_leaf_gpus"]
        if leaf and leaf % kwargs["gpus_per_node"]:
            raise SpecError("scale_out_leaf_gpus", leaf,
                            f"must be 0 (one flat tier) or a multiple of gpus_per_node = {kwargs['gpus_per_node']}",
                            where)
        if kwargs["scale_up_domain"] % kwargs["gpus_per_node"]:
            raise SpecError("scale_up_domain", kwargs["scale_up_domain"],
                            f"must be a multiple of gpus_per_node = {kwargs['gpus_per_node']}", where)
        return cls(**kwargs)


def resolve_system(value: str | Mapping | SystemSpec, where: str | None = None) -> SystemSpec:
    if isinstance(value, SystemSpec):
        return value
    if isinstance(value, str):
        return SystemSpec.from_catalog(value, where=where)
    if isinstance(value, Mapping):
        if "name" not in value:
            raise SpecError("system.name", None, "an overriding mapping needs the catalog name it starts from",
                            where)
        return SystemSpec.from_catalog(value["name"], overrides=value, where=where)
    raise SpecError("system", value, "expected a catalog name or a mapping with name and overrides", where)


# --------------------------------------------------------------------------- plan
def _stack_default_valid(name: str, value: Any) -> bool:
    if name == "recompute":
        return value in RECOMPUTE_MODES
    if name == "zero":
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3
    return isinstance(value, bool) or (value == TP_RULE and name != "flash_attention")


_STACK_DEFAULTS: dict | None = None


def stack_defaults() -> dict[str, dict[str, Any]]:
    """Per stack, the value each of :data:`STACK_DEFAULT_FIELDS` takes where a plan does not give it
    (``data/stack_defaults.yaml``, each with its source), checked once: every stack of :data:`STACKS`,
    every field, each value valid for its field (``"tp>1"``: on where the plan has tensor parallelism)."""
    global _STACK_DEFAULTS
    if _STACK_DEFAULTS is None:
        data = catalog.stack_defaults()
        where = "data/stack_defaults.yaml"
        table = {}
        for stack in STACKS:
            entry = data.get(stack)
            if not isinstance(entry, Mapping):
                raise SpecError(f"stacks.{stack}", entry, "expected a mapping of the plan defaults", where)
            _reject_unknown(entry, STACK_DEFAULT_FIELDS, where, f"{stack} default")
            table[stack] = {}
            for name in STACK_DEFAULT_FIELDS:
                item = entry.get(name)
                if not isinstance(item, Mapping) or not str(item.get("source") or "").strip() \
                        or not _stack_default_valid(name, item.get("value")):
                    raise SpecError(f"stacks.{stack}.{name}", item, "expected {value, source} with a non-empty "
                                    f"source and a value valid for {name}", where)
                table[stack][name] = item["value"]
        _STACK_DEFAULTS = table
    return _STACK_DEFAULTS


def stack_defaults_text(indent: str = "") -> str:
    """The stack defaults as a plain table, one line per field, a column per stack (for the PlanSpec
    docstring and ``trainscale predict --help``)."""
    table = stack_defaults()
    cells = [["field", *STACKS]] + [[name, *(_default_word(table[s][name]) for s in STACKS)]
                                    for name in STACK_DEFAULT_FIELDS]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def _default_word(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "on if tp>1" if value == TP_RULE else str(value)


@dataclass(frozen=True)
class PlanSpec:
    """How the model is spread: tp x cp x dp x pp GPUs (Megatron rank order: tp innermost, then
    cp, dp, pp), micro-batching and memory-saving options.

    Units: ``global_batch`` and ``micro_batch`` are sequences (of the model's ``seq_len`` tokens);
    ``global_batch`` is the whole step over all data-parallel ranks, ``micro_batch`` what one rank
    runs in one forward/backward pass. ``tp``, ``pp``, ``dp``, ``cp``, ``ep`` are GPUs (degrees),
    ``interleave`` model chunks per pipeline device, ``shard_group`` data-parallel ranks,
    ``first_stage_layers`` / ``last_stage_layers`` transformer layers, ``recompute_share`` a fraction.

    Defaults: ``recompute``, ``flash_attention``, ``zero``, ``sequence_parallel``,
    ``overlap_grad_reduce`` and ``tp_comm_overlap`` left out (None) take the ``stack``'s own default,
    what that software does when its flag is not given (``data/stack_defaults.yaml``, each with the file
    and commit that defines it; the table at the end). A measured run gives all of them.

    ``zero`` is the ZeRO stage (3 = FSDP). ``shard_group`` is the number of data-parallel ranks
    that share one copy of the sharded state: dp (the default) shards over all of them; fewer is
    hybrid sharding (HSDP: shard inside the group, replicate across groups).
    ``overlap_grad_reduce`` hides the data-parallel gradient reduction behind the last
    micro-batch's backward pass (default: the stack's).
    ``flash_attention`` fuses the attention core so that no s x s score matrix reaches HBM
    (default: the stack's; the published Megatron runs of 2021-22 predate it and say so).
    ``zero3_per_tensor`` makes ZeRO-3 fetch each weight matrix separately, prefetching one matrix
    ahead, as DeepSpeed's ZeRO-3 of 2021 (v0.3-0.5) did in the published comparison (Narayanan et
    al. 2021); off means one flat all-gather per layer, the next layer prefetched, as PyTorch FSDP
    does (and, nearer to it than to the 2021 code, DeepSpeed's ZeRO-3 since its prefetch coordinator
    was rewritten in 2022, microsoft/DeepSpeed#1453).
    ``ep`` is the expert-parallel degree of a mixture-of-experts model: each expert lives on one
    of ``ep`` data-parallel ranks (``ep`` divides ``dp`` and the experts; it takes no GPUs of its
    own, as in Megatron-LM and DeepSpeed-MoE). 1 (the default) for dense models.
    ``tp_comm_overlap`` overlaps the sequence-parallel all-gathers and reduce-scatters with the
    neighbouring GEMMs, as Megatron-Core's ``--tp-comm-overlap`` does (needs sequence parallelism;
    default: the stack's, off wherever sequence parallelism is off).
    ``stack`` is the software that runs the plan (``megatron``, the default; ``deepspeed``,
    ``fsdp``, ``nemo``): it selects the stack's calibrated host overhead and ZeRO-3 fetch cost and
    its documented behaviour (gradient precision), see ``data/calibration.yaml``, and the defaults of
    the knobs above (``data/stack_defaults.yaml``).
    ``compiled`` says the model was compiled (``torch.compile``), which fuses the element-wise
    chains an eager stack runs as separate kernels: the stack's ``elementwise_traffic`` factor
    becomes 1, that of Megatron's and Transformer Engine's hand-fused kernels (off by default; it
    changes nothing for stacks whose factor is already 1).
    ``grad_reduce_fp32`` says the gradients are held and reduced in fp32 (4 bytes each) instead of
    the stack's 16 bits, as DeepSpeed's BF16_Optimizer does (it reduces its fp32 gradient buffer,
    ``get_grads_for_reduction``) and Megatron-LM's ``--accumulate-allreduce-grads-in-fp32`` (off by
    default). On the ``deepspeed`` stack that optimizer all-reduces the fp32 gradients even though it
    shards its states (ZeRO 1), twice the wire bytes of a reduce-scatter (``fp32_grads_allreduced`` in
    ``data/calibration.yaml``).
    ``recompute_share`` is the share of the forward (beyond the attention core) that a selective
    recompute recomputes, for a run whose checkpointing fraction is known (fms-fsdp checkpoints a
    fraction of its blocks, ``selective_checkpointing``); by default the stack's documented share
    (``selective_recompute_share`` in ``data/calibration.yaml``).
    ``rotary_kernel`` is how the code applies a rotary model's position embeddings (``fused``,
    ``complex``, ``matrix``, ``rotate_half``: the HBM bytes and kernels of each in ``rotary_kernels``
    of ``data/calibration.yaml``), for a run whose code base is not its stack's reference (fms-fsdp on
    the ``fsdp`` stack, whose reference is torchtitan); by default the stack's (``rotary_kernel``), and
    ``fused`` when ``compiled``.
    ``tp_async_backward`` says the backward pass issues its tensor-parallel collectives
    asynchronously beside its GEMMs, as Megatron-LM has since September 2021 (the input-gradient all-reduce of
    each column-parallel linear beside its weight-gradient GEMM, ``--async-tensor-model-parallel-allreduce``;
    with sequence parallelism the input re-gather beside the data-gradient GEMM and the reduce-scatter
    beside the weight-gradient GEMM: :func:`trainscale.kernels.layer.tp_async_backward_time`); by default
    the stack's (``tp_async_backward`` in ``data/calibration.yaml``). Megatron-LM of 2021 (Narayanan
    et al.'s runs) had no such overlap.
    ``etp`` is the experts' tensor-parallel degree (Megatron-Core's ``expert_tensor_parallel_size``; 0, the
    default: ``tp``): the ``ep x etp`` GPUs of an expert group are folded over the ``tp x dp`` ranks, so
    ``ep x etp`` must divide ``tp x dp`` (with ``etp = tp``: ``ep`` divides ``dp``, as before).
    ``precision`` is the number format of the linear layers' GEMMs: ``bf16`` (the default), ``fp8``
    (Hopper and newer), ``mxfp8`` or ``nvfp4`` (Blackwell); ``fp8_recipe`` its scaling recipe (blank: the
    format's first, see :data:`FP8_RECIPES`). Attention, norms, router, embedding and output layer stay in
    bf16 (Transformer Engine's recipes as Megatron-Core runs them).
    ``custom_pipeline_layout`` says the run gives its own assignment of layers to pipeline chunks
    (Megatron-Core's ``pipeline_model_parallel_layout``, or its first/last-stage layer counts), so the
    stack's even split of interleaved chunks does not bind: the layers are spread as evenly as they go.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    interleave: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    recompute: str | None = None  # None: the stack's (STACK_DEFAULT_FIELDS, resolved in __post_init__)
    sequence_parallel: bool | None = None  # None: the stack's
    zero: int | None = None  # None: the stack's
    shard_group: int = 0  # 0 means dp
    overlap_grad_reduce: bool | None = None  # None: the stack's
    flash_attention: bool | None = None  # None: the stack's
    zero3_per_tensor: bool = False
    ep: int = 1
    tp_comm_overlap: bool | None = None  # None: the stack's (off where sequence parallelism is off)
    stack: str = DEFAULT_STACK
    compiled: bool = False
    grad_reduce_fp32: bool = False
    recompute_share: float | None = None  # None: the stack's documented selective share
    rotary_kernel: str = ""  # "": the stack's
    tp_async_backward: bool | None = None  # None: the stack's
    first_stage_layers: int = 0
    """Transformer layers of the first pipeline device (all its chunks together), Megatron-Core's
    ``--decoder-first-pipeline-num-layers``; 0 (the default): not given, the stack's even split."""
    last_stage_layers: int = 0
    """Transformer layers of the last pipeline device, ``--decoder-last-pipeline-num-layers``; 0: not
    given. The other devices share the rest evenly (Megatron-Core's rules: :meth:`check_against`)."""
    embedding_in_split: bool = False
    """The embedding counts as one layer of the split, Megatron-Core's
    ``--account-for-embedding-in-pipeline-split``: the first chunk of the first device builds one
    layer fewer."""
    loss_in_split: bool = False
    """The output layer and loss count as one layer, ``--account-for-loss-in-pipeline-split``: the
    last chunk of the last device builds one layer fewer."""

    def __post_init__(self):
        """Give each of :data:`STACK_DEFAULT_FIELDS` left None its stack's default (:func:`stack_defaults`).

        Here rather than in :meth:`from_dict` so that a plan built in Python and one read from YAML
        get the same defaults from one place, and no PlanSpec ever holds None for these fields.
        ``dataclasses.replace(plan, stack=...)`` keeps the values already resolved (it passes every field)."""
        if any(getattr(self, name) is None for name in STACK_DEFAULT_FIELDS):
            if self.stack not in STACKS:
                raise SpecError("plan.stack", self.stack, f"expected one of {', '.join(STACKS)}")
            defaults = stack_defaults()[self.stack]
            for name in STACK_DEFAULT_FIELDS:
                if getattr(self, name) is None:
                    value = defaults[name]
                    if value == TP_RULE:
                        value = self.tp > 1
                    if name == "tp_comm_overlap":
                        value = bool(value) and bool(self.sequence_parallel)
                    object.__setattr__(self, name, value)

    @property
    def split_ends(self) -> int:
        """The embedding (1) and loss (2) counted in the split, as the kernels take them."""
        return (1 if self.embedding_in_split else 0) | (2 if self.loss_in_split else 0)

    @property
    def has_split(self) -> bool:
        """Whether the plan gives its pipeline split (otherwise the stack's default)."""
        return bool(self.first_stage_layers or self.last_stage_layers or self.split_ends)
    etp: int = 0  # 0: tp
    precision: str = "bf16"
    fp8_recipe: str = ""  # "": the precision's first recipe
    custom_pipeline_layout: bool = False
    moe_imbalance: float = 1.0
    """Tokens the busiest expert-parallel rank's experts receive over the mean (>= 1): the expert GEMMs,
    the dispatch and combine and the permutation wait for that rank. 1 (the default): balanced routing, as
    a run with forced balancing (Megatron-Core's ``--moe-router-force-load-balancing``, the Megatron-Bridge
    performance tables) or a dropless run at capacity factor 1 has; aux-loss-balanced training runs above
    it. Not fitted: give the measured value where a run reports one."""

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def recipe(self) -> str:
        """The scaling recipe in force: the given one, or the precision's default."""
        return self.fp8_recipe or FP8_RECIPES[self.precision][0]

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def shard(self) -> int:
        return self.shard_group or self.dp

    @classmethod
    def from_dict(cls, d: Mapping, gpus: int | None = None, where: str | None = None) -> "PlanSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        _reject_unknown(d, known, where, "plan")
        tp = _int(d, "tp", where, 1)
        pp = _int(d, "pp", where, 1)
        cp = _int(d, "cp", where, 1)
        if d.get("dp") is None:
            if gpus is None:
                raise SpecError("plan.dp", None, "give dp or the run's gpus", where)
            if gpus % (tp * pp * cp):
                raise SpecError("gpus", gpus, f"must be a multiple of tp*pp*cp = {tp * pp * cp}", where)
            dp = gpus // (tp * pp * cp)
        else:
            dp = _int(d, "dp", where)
        plan = cls(
            tp=tp, pp=pp, dp=dp, cp=cp,
            interleave=_int(d, "interleave", where, 1),
            micro_batch=_int(d, "micro_batch", where, 1),
            global_batch=_int(d, "global_batch", where),
            recompute=_given(d, "recompute", lambda: _choice(d, "recompute", where, "", RECOMPUTE_MODES)),
            sequence_parallel=_optional_bool(d, "sequence_parallel", where),
            zero=_given(d, "zero", lambda: _int(d, "zero", where, minimum=0)),
            shard_group=_int(d, "shard_group", where, 0, minimum=0),
            overlap_grad_reduce=_optional_bool(d, "overlap_grad_reduce", where),
            flash_attention=_optional_bool(d, "flash_attention", where),
            zero3_per_tensor=_bool(d, "zero3_per_tensor", where, False),
            ep=_int(d, "ep", where, 1),
            tp_comm_overlap=_optional_bool(d, "tp_comm_overlap", where),
            stack=_choice(d, "stack", where, DEFAULT_STACK, STACKS),
            compiled=_bool(d, "compiled", where, False),
            grad_reduce_fp32=_bool(d, "grad_reduce_fp32", where, False),
            recompute_share=_float(d, "recompute_share", where, None, allow_none=True),
            rotary_kernel=_optional_choice(d, "rotary_kernel", where, ROTARY_KERNELS),
            tp_async_backward=_optional_bool(d, "tp_async_backward", where),
            first_stage_layers=_int(d, "first_stage_layers", where, 0, minimum=0),
            last_stage_layers=_int(d, "last_stage_layers", where, 0, minimum=0),
            embedding_in_split=_bool(d, "embedding_in_split", where, False),
            loss_in_split=_bool(d, "loss_in_split", where, False),
            etp=_int(d, "etp", where, 0, minimum=0),
            precision=_choice(d, "precision", where, "bf16", PRECISIONS),
            custom_pipeline_layout=_bool(d, "custom_pipeline_layout", where, False),
            moe_imbalance=_float(d, "moe_imbalance", where, 1.0, minimum=1.0),
        )
        recipe = d.get("fp8_recipe") or ""
        if recipe:
            valid = FP8_RECIPES[plan.precision]
            if recipe not in valid:
                raise SpecError("plan.fp8_recipe", recipe, f"expected one of {', '.join(valid)} for precision "
                                f"{plan.precision} (or blank: {valid[0]})", where)
            plan = dataclasses.replace(plan, fp8_recipe=recipe)
        if plan.recompute_share is not None and (plan.recompute_share > 1.0 or plan.recompute != "selective"):
            raise SpecError("plan.recompute_share", plan.recompute_share,
                            "expected a share in [0, 1] of a selective recompute (recompute: selective)", where)
        if plan.zero > 3:
            raise SpecError("plan.zero", plan.zero, "expected a ZeRO stage 0, 1, 2 or 3", where)
        if plan.tp_comm_overlap and not plan.sequence_parallel:
            raise SpecError("plan.tp_comm_overlap", True, "needs sequence_parallel: true", where)
        if gpus is not None and plan.gpus != gpus:
            raise SpecError("gpus", gpus, f"must equal tp*pp*dp*cp = {tp}*{pp}*{plan.dp}*{cp} = {plan.gpus}",
                            where)
        if plan.shard_group and plan.dp % plan.shard_group:
            raise SpecError("plan.shard_group", plan.shard_group, f"must divide dp = {plan.dp}", where)
        if plan.etp == 0 and plan.dp % plan.ep:
            raise SpecError("plan.ep", plan.ep, f"must divide dp = {plan.dp}", where)
        if plan.etp and (plan.dp * plan.tp) % (plan.ep * plan.etp):
            raise SpecError("plan.etp", plan.etp, f"ep*etp = {plan.ep}*{plan.etp} must divide tp*dp = "
                            f"{plan.tp}*{plan.dp}", where)
        if plan.global_batch % (plan.dp * plan.micro_batch):
            raise SpecError("plan.global_batch", plan.global_batch,
                            f"must be divisible by dp*micro_batch = {plan.dp}*{plan.micro_batch}", where)
        return plan

    def check_precision(self, system: "SystemSpec", where: str | None = None) -> None:
        """A low precision the accelerator has no tensor cores for is refused: fp8 needs an FP8 peak
        (Hopper, Ada, CDNA3 and newer); mxfp8 and nvfp4 need Blackwell."""
        if self.precision == "bf16":
            return
        if self.precision == "fp8" and system.peak_flops_fp8 is None:
            raise SpecError("plan.precision", self.precision, f"{system.name} ({system.generation}) has no FP8 "
                            "tensor cores; valid: bf16", where)
        if self.precision in ("mxfp8", "nvfp4") and system.generation != "blackwell":
            raise SpecError("plan.precision", self.precision, f"needs Blackwell's block-scaled tensor cores; "
                            f"{system.name} is {system.generation} (valid: bf16"
                            f"{', fp8' if system.peak_flops_fp8 else ''})", where)

    def check_against(self, model: ModelSpec, where: str | None = None) -> None:
        """Combinations that are invalid for this model (the grid masks the same ones)."""
        if model.heads % self.tp:
            raise SpecError("plan.tp", self.tp, f"must divide heads = {model.heads}", where)
        if model.kv_heads % self.tp:
            raise SpecError("plan.tp", self.tp, f"must divide kv_heads = {model.kv_heads}", where)
        if self.pp * self.interleave > model.layers:
            raise SpecError("plan.interleave" if self.interleave > 1 else "plan.pp",
                            self.interleave if self.interleave > 1 else self.pp,
                            f"pp*interleave = {self.pp * self.interleave} pipeline chunks exceed "
                            f"layers = {model.layers}", where)
        if model.seq_len % self.cp:
            raise SpecError("plan.cp", self.cp, f"must divide seq_len = {model.seq_len}", where)
        if self.ep > 1 and not model.is_moe:
            raise SpecError("plan.ep", self.ep, f"expert parallelism needs a mixture of experts; "
                            f"{model.name} is dense (use ep = 1)", where)
        if model.is_moe and model.experts % self.ep:
            raise SpecError("plan.ep", self.ep, f"must divide experts = {model.experts}", where)
        if self.interleave > 1 and self.pp == 1:
            raise SpecError("plan.interleave", self.interleave, "interleaving needs pp > 1", where)
        if self.has_split:
            check_split(model.layers, self.pp, self.interleave, self.first_stage_layers, self.last_stage_layers,
                        self.embedding_in_split, self.loss_in_split, where)
        elif (self.interleave > 1 and model.layers % (self.pp * self.interleave)
                and not self.custom_pipeline_layout and catalog.calibration()["stacks"][self.stack]["fixed"]["interleave_even_split"]["value"]):
            hint = suggest_split(model.layers, self.pp, self.interleave)
            raise SpecError("plan.interleave", self.interleave,
                            f"the {self.stack} stack builds the same number of layers in every interleaved chunk: "
                            f"pp*interleave = {self.pp * self.interleave} must divide layers = {model.layers}"
                            + (f", or give the split ({hint})" if hint else "")
                            + " (or custom_pipeline_layout: true)", where)
        if self.interleave > 1 and self.micro_batches % self.pp:
            raise SpecError("plan.interleave", self.interleave,
                            f"the interleaved schedule needs micro-batches ({self.micro_batches}) "
                            f"divisible by pp = {self.pp}", where)


PlanSpec.__doc__ += ("\n    The stacks' defaults (data/stack_defaults.yaml), for the fields a plan leaves out:\n\n"
                     + stack_defaults_text(indent="    ") + "\n")


def split_rule(layers: int, pp: int, v: int, first: int, last: int, embedding: bool, loss: bool) -> tuple[str, Any, str] | None:
    """The first of Megatron-Core's rules for a pipeline split that ``(first, last, embedding, loss)``
    breaks, as ``(field, value, what is valid)``, or None (NVIDIA/Megatron-LM d98e8a6, 2026-08:
    ``TransformerConfig.__post_init__`` in megatron/core/transformer/transformer_config.py and
    ``get_num_layers_to_build`` in megatron/core/transformer/transformer_block.py; the same rules as
    core_r0.10 of December 2024, which added the end-stage flags)."""
    if pp == 1:
        return "plan.pp", pp, "a pipeline split needs pp > 1"
    if (first or last) and (embedding or loss):
        return ("plan.first_stage_layers" if first else "plan.last_stage_layers", first or last,
                "Megatron-Core does not combine the end-stage layer counts with embedding_in_split / loss_in_split")
    if embedding or loss:
        total = layers + int(embedding) + int(loss)
        if total % pp or (total // pp) % v:
            return ("plan.embedding_in_split" if embedding else "plan.loss_in_split", True,
                    f"layers + ends = {total} must split into pp*interleave = {pp}*{v} equal chunks")
        if total // (pp * v) < 2:
            return ("plan.embedding_in_split" if embedding else "plan.loss_in_split", True,
                    f"the end chunk would hold no transformer layer ({total // (pp * v)} per chunk)")
        return None
    for name, value in (("plan.first_stage_layers", first), ("plan.last_stage_layers", last)):
        if value and value % v:
            return name, value, f"must be a multiple of interleave = {v}"
    rest, devices = layers - first - last, pp - bool(first) - bool(last)
    if rest < 0 or (devices == 0 and rest) or (devices and (rest <= 0 or rest % devices or (rest // devices) % v)):
        name, value = ("plan.first_stage_layers", first) if first else ("plan.last_stage_layers", last)
        return (name, value, f"the other {devices} devices must share the other {rest} layers evenly, "
                f"a multiple of interleave = {v} each" if devices else
                f"first + last must equal layers = {layers} on pp = 2")
    return None


def check_split(layers: int, pp: int, v: int, first: int, last: int, embedding: bool, loss: bool,
                where: str | None = None) -> None:
    """Raise :class:`SpecError` naming the field of a split Megatron-Core would refuse (:func:`split_rule`)."""
    broken = split_rule(layers, pp, v, first, last, embedding, loss)
    if broken is not None:
        raise SpecError(*broken, where)


def suggest_split(layers: int, pp: int, v: int) -> str:
    """A split Megatron-Core builds for ``layers`` on ``pp`` x ``v`` chunks, as plan fields, or ""."""
    for embedding, loss in ((True, True), (True, False), (False, True)):
        if split_rule(layers, pp, v, 0, 0, embedding, loss) is None:
            return ", ".join(f"{k}: true" for k, on in (("embedding_in_split", embedding), ("loss_in_split", loss)) if on)
    for first in range(v, layers, v):
        for last in range(v, layers - first + 1, v):
            if split_rule(layers, pp, v, first, last, False, False) is None:
                return f"first_stage_layers: {first}, last_stage_layers: {last}"
    return ""


@dataclass(frozen=True)
class RunSpec:
    id: str
    model: ModelSpec
    system: SystemSpec
    plan: PlanSpec

    @property
    def gpus(self) -> int:
        return self.plan.gpus

    @classmethod
    def from_dict(cls, d: Mapping, index: int = 0) -> "RunSpec":
        if not isinstance(d, Mapping):
            raise SpecError("run", d, "expected a mapping with model, system, gpus and plan", f"run {index}")
        run_id = str(d.get("id", index))
        where = f"run {run_id!r}"
        _reject_unknown(d, {"id", "model", "system", "gpus", "plan"}, where, "run")
        for key in ("model", "system", "gpus", "plan"):
            if key not in d:
                raise SpecError(key, None, "it is required", where)
        model = resolve_model(d["model"], where)
        system = resolve_system(d["system"], where)
        gpus = _int(d, "gpus", where)
        if not isinstance(d["plan"], Mapping):
            raise SpecError("plan", d["plan"], "expected a mapping", where)
        plan = PlanSpec.from_dict(d["plan"], gpus=gpus, where=where)
        plan.check_against(model, where)
        plan.check_precision(system, where)
        return cls(id=run_id, model=model, system=system, plan=plan)
