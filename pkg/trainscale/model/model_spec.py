"""What is trained: :class:`ModelSpec`, a decoder-only transformer (dense or mixture of experts), its parameter
counts, and :func:`resolve_model` (a catalog name or a mapping of its shape). Public through :mod:`.specs`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping

from . import catalog
from ..common.errors import SpecError
from .spec_fields import FFN_TYPES, POSITION_EMBEDDINGS, _bool, _choice, _float, _int, _optional_choice, _reject_unknown


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

    Multi-head latent attention (DeepSeek-V2/V3; Megatron-Core's ``MLATransformerConfig`` names) where
    ``kv_lora_rank > 0``: the keys and values come from a latent of ``kv_lora_rank`` (plus a shared rotary key
    of ``qk_pos_emb_head_dim``) projected down from the hidden state and up again to ``heads x (qk_head_dim +
    v_head_dim)``; the queries likewise through a latent of ``q_lora_rank`` (0: projected directly). Each head
    scores with ``qk_head_dim + qk_pos_emb_head_dim`` channels and returns ``v_head_dim``; the output projection
    takes ``heads x v_head_dim``. ``kv_heads`` and ``kv_channels`` do not apply (leave them at their defaults).

    ``position_embedding`` is ``learned``, ``rotary`` or ``alibi``; left blank it follows the FFN's
    convention (``gelu``: GPT's learned table of ``seq_len x hidden``; ``swiglu``: Llama's rotary
    embeddings, applied to every layer's queries and keys and priced as the stack's element-wise
    kernel). ALiBi adds a bias to the attention scores inside the attention kernel: no parameters,
    no separate pass.

    ``hidden_dropout`` and ``attention_dropout`` (Megatron-Core's names; its defaults 0.1, NVIDIA/Megatron-LM
    ``megatron/core/transformer/transformer_config.py``) are the dropout probabilities the model trains with, after
    the attention and MLP blocks and on the attention probabilities. Only whether they are zero matters: a dropout
    keeps a 1-byte mask per element for its backward, and at probability 0 PyTorch returns its input and makes no mask
    (``aten/src/ATen/native/Dropout.cpp``: ``if (p == 0 || !train ...) return input``). Llama, Qwen3, DeepSeek-V3,
    GPT-OSS and Nemotron train without dropout (their Megatron-Bridge bridges set ``hidden_dropout = 0.0``; the
    attention dropout comes from their Hugging Face configs, 0.0).

    ``expert_bias``: the experts' linear layers carry biases (GPT-OSS: ``add_bias_linear`` in Megatron-Bridge's
    GPT-OSS bridge). Megatron-Core adds the second expert linear's bias outside the grouped GEMM, expert by expert
    (:func:`trainscale.kernels.moe.expert_bias_time`); the biases' own parameters (``2 f + h`` per expert) are not
    counted, under 0.1% of the experts'.

    ``activation_func_clamp_value`` (Megatron-Core's name; 0: none): the experts' GLU clamps its two halves to this
    value first (GPT-OSS: 7), which Megatron-Core does in PyTorch before its fused activation
    (:func:`trainscale.kernels.moe.glu_clamp_time`); only a mixture of experts with a GLU (``swiglu``) has it here.

    ``mtp_num_layers`` (Megatron-Core's name; 0: none): multi-token prediction depths (DeepSeek-V3: 1). Megatron-Core
    builds them on the last pipeline stage; each runs one more layer of the model on the normalised hidden states and
    next tokens' embeddings projected from ``2h`` to ``h``, and another output layer and loss
    (:func:`trainscale.kernels.layer.mtp_head_costs`). ``layers`` counts the main model's layers only.
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
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    expert_bias: bool = False
    activation_func_clamp_value: float = 0.0
    mtp_num_layers: int = 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (``kv_lora_rank > 0``)."""
        return self.kv_lora_rank > 0

    @property
    def query_width(self) -> int:
        """Width of the attention output (the output projection's input): hidden, heads x head_dim, or
        heads x v_head_dim under latent attention."""
        if self.is_mla:
            return self.heads * self.v_head_dim
        return self.heads * self.kv_channels if self.kv_channels else self.hidden

    def attention_params(self) -> int:
        """Weights of one layer's attention projections (no norms, no biases): Q, K, V and O, or under latent
        attention the down and up projections of the query and key-value latents and O (Megatron-Core's
        ``MLASelfAttention``: ``linear_q_down_proj``, ``linear_q_up_proj``, ``linear_kv_down_proj``,
        ``linear_kv_up_proj``, ``linear_proj``)."""
        h, a, q = self.hidden, self.heads, self.query_width
        if not self.is_mla:
            return h * (q + 2 * self.kv_heads * self.head_dim) + q * h
        q_dim = self.qk_head_dim + self.qk_pos_emb_head_dim
        query = h * self.q_lora_rank + self.q_lora_rank * a * q_dim if self.q_lora_rank else h * a * q_dim
        kv = h * (self.kv_lora_rank + self.qk_pos_emb_head_dim) + self.kv_lora_rank * a * (
            self.qk_head_dim + self.v_head_dim)
        return query + kv + q * h

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
        attention = self.attention_params()
        norms = 4 * h if self.has_biases else 2 * h  # LayerNorm has a bias, RMSNorm does not
        norms += self.q_lora_rank + self.kv_lora_rank  # latent attention's norms of its latents
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
        mla_fields = _mla_fields(d, where, kv_heads != heads or bool(d.get("kv_channels")))
        dropouts = {key: _probability(d, key, where, 0.1) for key in DROPOUT_FIELDS}
        expert_bias = _bool(d, "expert_bias", where, False)
        if expert_bias and experts == 1:
            raise SpecError("expert_bias", expert_bias, "only a mixture of experts (experts > 1) has it; use false",
                            where)
        clamp = _float(d, "activation_func_clamp_value", where, 0.0, minimum=0.0)
        if clamp and (experts == 1 or ffn_type != "swiglu"):
            raise SpecError("activation_func_clamp_value", clamp, "only a mixture of experts with a GLU (experts > 1, "
                            "ffn_type swiglu) has it here; use 0", where)
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
            **mla_fields,
            **dropouts,
            expert_bias=expert_bias,
            activation_func_clamp_value=clamp,
            mtp_num_layers=_int(d, "mtp_num_layers", where, 0, minimum=0),
        )


DROPOUT_FIELDS = ("hidden_dropout", "attention_dropout")


def _probability(d: Mapping, key: str, where: str | None, default: float) -> float:
    """A dropout probability: a number in [0, 1)."""
    value = _float(d, key, where, default, minimum=0.0)
    if value >= 1.0:
        raise SpecError(key, value, "expected a probability in [0, 1)", where)
    return value


MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


def _mla_fields(d: Mapping, where: str | None, mha_widths: bool) -> dict:
    """The latent-attention fields: all 0 (not latent attention), or ``kv_lora_rank``, ``qk_head_dim`` and
    ``v_head_dim`` positive (``q_lora_rank`` and ``qk_pos_emb_head_dim`` may be 0)."""
    fields = {key: _int(d, key, where, 0, minimum=0) for key in MLA_FIELDS}
    if not fields["kv_lora_rank"]:
        for key, value in fields.items():
            if value:
                raise SpecError(key, value, "only latent attention (kv_lora_rank > 0) has it; use 0", where)
        return fields
    for key in ("qk_head_dim", "v_head_dim"):
        if not fields[key]:
            raise SpecError(key, fields[key], "latent attention (kv_lora_rank > 0) needs a positive width", where)
    if mha_widths:
        raise SpecError("kv_lora_rank", fields["kv_lora_rank"], "latent attention sets its own head widths; "
                        "leave kv_heads (= heads) and kv_channels (0) at their defaults", where)
    return fields


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
