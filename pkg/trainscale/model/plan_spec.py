"""How it is trained: :class:`PlanSpec`, the parallel plan and its knobs; the knobs a plan leaves out take its
stack's defaults (:func:`stack_defaults`, read and checked once from ``data/stack_defaults.yaml``, and shown as a
table in PlanSpec's docstring by :func:`stack_defaults_text`); and Megatron-Core's rules for an uneven pipeline
split (:func:`split_rule`, :func:`check_split`, :func:`suggest_split`). Public through :mod:`.specs`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from . import catalog
from ..common.errors import SpecError
from .model_spec import ModelSpec
from .spec_fields import (CUDA_GRAPH_IMPLS, DEFAULT_STACK, FP8_RECIPES, MOE_DISPATCHERS, PRECISIONS, RECOMPUTE_MODES, RECOMPUTE_MODULES, ROTARY_KERNELS,
                          STACK_DEFAULT_FIELDS, STACKS, TP_RULE, _bool, _choice, _float, _given, _int, _optional_bool, _optional_choice,
                          _reject_unknown)
from .system_spec import SystemSpec


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


def recompute_modules_text(value: Any, where: str | None = None) -> str:
    """A plan's ``recompute_modules`` as the canonical comma-separated text: a list or a comma-separated string of
    distinct names of ``RECOMPUTE_MODULES`` (None or empty: "", the stack's default)."""
    if value is None or value == "" or value == []:
        return ""
    names = [str(v).strip() for v in (value.split(",") if isinstance(value, str) else value)] \
        if isinstance(value, (str, list, tuple)) else None
    if names is None or not all(n in RECOMPUTE_MODULES for n in names) or len(set(names)) != len(names):
        raise SpecError("plan.recompute_modules", value, "expected distinct names, a list or comma-separated, of "
                        + ", ".join(RECOMPUTE_MODULES), where)
    return ",".join(names)


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
        object.__setattr__(self, "recompute_modules", recompute_modules_text(self.recompute_modules))

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
    overlap_moe_expert_parallel_comm: bool = False
    """Megatron-Core's batch-level EP all-to-all overlap (``--overlap-moe-expert-parallel-comm
    --delay-wgrad-compute``, off by default: ``model_parallel_config.py``; Megatron-LM d98e8a6
    ``megatron/core/transformer/moe/README.md``: "Overlaps All-to-All with computation by merging FWD-BWD passes
    of adjacent microbatches"): each layer's forward dispatch and combine run beside another micro-batch's
    backward of that layer, its backward ones beside the forward
    (:func:`trainscale.kernels.moe.ep_overlapped_times`). Its requirements are stack rules (``data/stack_rules.yaml``)."""
    moe_dispatcher: str = "alltoall"
    """The token dispatcher of a mixture of experts: ``alltoall`` (Megatron-Core's ``MoEAlltoAllTokenDispatcher``, each
    routed copy sent to its expert's GPU) or ``deepep`` (its flex dispatcher with DeepEP, ``--moe-token-dispatcher-type
    flex --moe-flex-dispatcher-backend deepep``: a token crosses the scale-out network once per remote node that
    holds any of its experts, :func:`trainscale.kernels.collectives.deduplicated_alltoall_time`) or ``hybridep`` (the
    flex dispatcher with HybridEP, ``--moe-flex-dispatcher-backend hybridep``), priced as DeepEP: across nodes it
    writes each token once per remote node that needs it over RDMA and fans it out over NVLink there
    (deepseek-ai/DeepEP hybrid-ep 34152ae ``csrc/hybrid_ep/backend/hybrid_ep_backend.cuh``, ``attn_to_rdma_map``:
    "any expert of this token is on that node"; ``docs/Hybrid-EP_Implementation.md``: "Similar to DeepEP, Hybrid-EP
    first performs IB communication between peer GPUs, then each rank distributes the received inter-node data
    locally"). Inside one scale-up domain the three price the same."""
    cuda_graph_impl: str = "none"
    """Megatron-Core's CUDA graphs (``--cuda-graph-impl``): ``none``; ``local`` or ``transformer_engine``, graphs of
    named scopes (``cuda_graph_scope``: attention, the router, the dispatcher's preprocessing), priced as
    ``none`` because what the model charges the host for is issued after the dispatcher's token-count sync, which
    those scopes do not capture (:func:`trainscale.kernels.moe.moe_host_time`); or ``full_iteration``, one graph of
    the step's forward and backward (the optimizer step apart), which issues no host work inside the step: no layer
    waits for the host (the stack's ``layer_host_s``) and a mixture of experts has no token-count sync (Megatron-Core
    sizes the experts' inputs by a static budget instead, ``moe_expert_rank_capacity_factor``; NVIDIA/Megatron-LM
    d0b3b775 ``megatron/core/transformer/moe/token_dispatcher.py``, ``fused_a2a.py``). Its requirements are stack
    rules."""
    fused_grouped_mlp: bool = False
    """Megatron-Core's fused grouped MLP of the experts (``cutedsl_fused_grouped_mlp``, Transformer Engine's op fuser,
    TE 4220403e ``forward_grouped_mlp.py``): the first grouped GEMM with its bias, the GLU (clamped or not), the
    routing-probability scaling and the MXFP8 quantization of its output in one kernel, the second grouped GEMM with
    its bias in another, so the routed copies' activation traffic, a clamp, the bias loop and the quantization of
    the second GEMM's input are not charged. MXFP8 on Blackwell only (stack rules)."""
    recompute_modules: str = ""
    """Megatron-Core's named modules of a selective recomputation (``recompute: selective``;
    ``--recompute-modules``, ``TransformerConfig.recompute_modules``), comma-separated, of ``core_attn``,
    ``mla_up_proj``, ``layernorm``, ``moe_act``, ``mlp``, ``moe``, ``shared_experts``. "" (the default): the stack's
    own selective recomputation (Megatron-Core's default, ``core_attn``). What each discards and re-runs:
    :mod:`trainscale.kernels.activations`. Megatron-Core stacks only (a stack rule)."""

    @property
    def recompute_module_mask(self) -> int:
        """The kernels' bitmask of :attr:`recompute_modules` (bit i: module i of ``RECOMPUTE_MODULES``)."""
        names = self.recompute_modules.split(",") if self.recompute_modules else ["core_attn"]
        return sum(1 << RECOMPUTE_MODULES.index(name) for name in names)

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
            overlap_moe_expert_parallel_comm=_bool(d, "overlap_moe_expert_parallel_comm", where, False),
            moe_dispatcher=_choice(d, "moe_dispatcher", where, "alltoall", MOE_DISPATCHERS),
            recompute_modules=recompute_modules_text(d.get("recompute_modules"), where),
            cuda_graph_impl=_choice(d, "cuda_graph_impl", where, "none", CUDA_GRAPH_IMPLS),
            fused_grouped_mlp=_bool(d, "fused_grouped_mlp", where, False),
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
        if plan.recompute_modules and plan.recompute != "selective":
            raise SpecError("plan.recompute_modules", plan.recompute_modules,
                            f"needs recompute: selective (the plan's recompute is {plan.recompute})", where)
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
