"""Transcribe Megatron-Bridge's performance archive into ``published_runs_stacks.csv`` rows (issue 36).

The ``bridge26*`` rows of ``published_runs_stacks.csv`` were made by this script, not typed:
every pre-training row of ``docs/performance-summary-archive.md`` (NVIDIA-NeMo/Megatron-Bridge at
:data:`COMMIT`) of a release other than 25.11 (whose rows were transcribed by hand, ``bridge2511-*``), on a
system in ``systems.yaml`` and of a model in ``models.yaml``. Run from the repository root with the archive
read from a checkout of that commit::

    PYTHONPATH=pkg python pkg/trainscale/data/bridge_archive.py ARCHIVE.md [--write]

It prints the rows (and every skipped row with why); ``--write`` replaces the rows it made before (the
CSV written to a temporary name and moved into place whole). Each row copies the model's shape columns from
that model's 25.11 row (one model, one shape) and takes its plan and throughput from the table:
dp = gpus / (tp pp cp); VP ``n/a`` = 1; FSDP > 0 = Megatron-FSDP, written zero 3
(as the 25.11 rows); a mixture of experts with tp > 1 gets etp 1 (the tables have no ETP column; Bridge's
workload base configs set ``expert_tensor_parallel_size=1``); a layer count that does not split evenly over
pp x vp chunks runs the recipe's own layout (``custom_pipeline_layout``). Where the release's own config of a row
turns on a knob the tables do not state (the EP all-to-all overlap, the DeepEP or HybridEP dispatcher, the modules of a
selective recomputation: :data:`EP_A2A_OVERLAP`, :data:`MOE_DISPATCHER`, :data:`RECOMPUTE_MODULES`), the row carries
it, with the config's tag, file and line in its note. Otherwise unstated (recompute, overlaps, the distributed
optimizer, the MoE dispatcher): NeMo's defaults, as for the 25.11 rows. Of the CUDA graphs only full-iteration ones are
priced, with the fused grouped MLP that comes with them (:data:`FULL_ITERATION_GRAPHS`); graphs of named scopes price
as none (``PlanSpec.cuda_graph_impl``).
"""

from __future__ import annotations

import csv
import os
import re
import sys
from pathlib import Path

COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
URL = f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{COMMIT}/docs/performance-summary-archive.md"
HERE = Path(__file__).resolve().parent
CSV_FILE = HERE / "published_runs_stacks.csv"
HAND_RELEASE = "25.11"
SYSTEMS = {"DGX-GB200": ("gb200-nvl72", "gb200"), "DGX-B200": ("dgx-b200", "b200"), "DGX-H100": ("dgx-h100", "h100")}
MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b",
          "DeepSeekV3": "deepseek-v3", "GPT OSS 120B": "gpt-oss-120b", "Qwen3_30B_a3B": "qwen3-30b-a3b",
          "Qwen3_235B_a22B": "qwen3-235b-a22b"}
PRECISIONS = {"BF16": ("bf16", "", "bf16"), "FP8-CS": ("fp8", "current", "fp8-cs"), "FP8": ("fp8", "", "fp8"),
              "FP8-MX": ("mxfp8", "mxfp8", "fp8-mx"), "MXFP8": ("mxfp8", "mxfp8", "fp8-mx"),
              "NVFP4": ("nvfp4", "nvfp4", "nvfp4")}
SHAPE = ("params_b", "layers", "hidden", "heads", "ffn_hidden", "vocab", "kv_heads", "ffn_type", "position_embedding",
         "rotary_kernel", "experts", "top_k", "shared_experts", "shared_expert_ffn_hidden", "dense_layers",
         "dense_ffn_hidden", "kv_channels", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
         "v_head_dim", "hidden_dropout", "attention_dropout", "expert_bias",
         "activation_func_clamp_value", "mtp_num_layers")
FOOTNOTE = re.compile(r"\[\^([^\]]+)\]")
# Megatron-Core's batch-level EP all-to-all overlap (plan.overlap_moe_expert_parallel_comm) where the release's own
# performance scripts turn it on: moe_a2a_overlap=True in the row's workload base config (the default config variant,
# v2, falling back to v1), which _set_moe_a2a_overlap_overrides (scripts/performance/utils/overrides.py) turns into
# comm_overlap.overlap_moe_expert_parallel_comm and delay_wgrad_compute; off (CommOverlapConfig's default) in every
# other release's config of these rows. A release's Megatron-Bridge tag: docs/versions1.json at COMMIT (26.04 =
# v0.4.0, 26.04.01 = v0.4.2, 26.06 = v0.5.0, 26.06.01 = v0.5.1). Keyed by (release, system, model, precision tag).
_QWEN = "scripts/performance/configs/qwen/qwen3_workload_base_configs.py"
_DSV3 = "scripts/performance/configs/deepseek/deepseek_workload_base_configs.py"
_OSS = "scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py"
EP_A2A_OVERLAP = {
    ("26.04", "gb200", "gpt-oss-120b", "bf16"): f"v0.4.0:{_OSS}:102 (GB200_BF16_V2)",
    ("26.04.01", "gb200", "gpt-oss-120b", "bf16"): f"v0.4.2:{_OSS}:102 (GB200_BF16_V2)",
    ("26.04.01", "b200", "deepseek-v3", "fp8-mx"): f"v0.4.2:{_DSV3}:203 (B200_FP8_MX_V2)",
    ("26.06", "gb200", "deepseek-v3", "fp8-mx"): f"v0.5.0:{_DSV3}:98 (GB200_FP8_MX_V1)",
    ("26.06.01", "gb200", "deepseek-v3", "fp8-mx"): f"v0.5.1:{_DSV3}:98 (GB200_FP8_MX_V1)",
    ("26.06", "gb200", "gpt-oss-120b", "fp8-mx"): f"v0.5.0:{_OSS}:211 (GB200_FP8_MX_V2)",
    ("26.06.01", "gb200", "gpt-oss-120b", "fp8-mx"): f"v0.5.1:{_OSS}:211 (GB200_FP8_MX_V2)",
    ("26.06", "gb200", "qwen3-30b-a3b", "fp8-mx"): f"v0.5.0:{_QWEN}:388 (GB200_FP8_MX_V1)",
    ("26.06.01", "gb200", "qwen3-30b-a3b", "fp8-mx"): f"v0.5.1:{_QWEN}:405 (GB200_FP8_MX_V1)",
    ("26.06", "gb200", "qwen3-235b-a22b", "fp8-mx"): f"v0.5.0:{_QWEN}:229 (GB200_FP8_MX_V2)",
    ("26.06.01", "gb200", "qwen3-235b-a22b", "fp8-mx"): f"v0.5.1:{_QWEN}:229 (GB200_FP8_MX_V2)",
    ("26.02", "h100", "qwen3-30b-a3b", "fp8"): f"v0.3.0:{_QWEN}:421 (H100_FP8_CS_V1)",
    ("26.02", "h100", "qwen3-235b-a22b", "fp8"): f"v0.3.0:{_QWEN}:268 (H100_FP8_CS_V2)",
    ("26.02.01", "h100", "qwen3-235b-a22b", "fp8"): f"v0.3.1:{_QWEN}:259 (H100_FP8_CS_V2)",
    ("26.04", "h100", "qwen3-235b-a22b", "fp8"): f"v0.4.0:{_QWEN}:273 (H100_FP8_CS_V2)",
    ("26.04.01", "h100", "qwen3-235b-a22b", "fp8"): f"v0.4.2:{_QWEN}:275 (H100_FP8_CS_V2)",
}
# The token dispatcher where the release's config uses Megatron-Core's flex dispatcher (moe_flex_dispatcher_backend
# "deepep" or "hybridep", which apply_flex_dispatcher_backend, src/megatron/bridge/training/flex_dispatcher_backend.py,
# turns into moe_token_dispatcher_type="flex"): plan.moe_dispatcher deepep or hybridep, both priced as sending a token
# once per remote node that needs it. HybridEP crosses nodes only in the H100 Qwen3-30B rows of 26.04-26.06 (EP 16 on
# two 8-GPU nodes; Bridge's launcher sets NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8, v0.4.0 scripts/performance/
# perf_plugins.py:356-360, and its containers build DeepEP's hybrid-ep with HYBRID_EP_MULTINODE=1); inside one NVLink
# domain (GB200's 72 GPUs, a B200 node's 8) every dispatcher prices alike. 26.02's H100 Qwen3-30B config runs DeepEP
# (its recipe applies it: v0.3.0 src/megatron/bridge/recipes/qwen/qwen3_moe.py:270); 26.02.01's H100 Qwen3-235B config
# names DeepEP but its script forces the all-to-all dispatcher (v0.3.1 scripts/performance/configs/qwen/
# qwen3_llm_pretrain.py:185), so that row stays alltoall. Where the config's layout differs from the row's (26.02.01
# H100 Qwen3-30B, 26.02.01 B200 GPT-OSS) nothing is taken from it.
MOE_DISPATCHER = {
    ("26.04.01", "b200", "deepseek-v3", "fp8-mx"): ("deepep", f"v0.4.2:{_DSV3}:203 (B200_FP8_MX_V2)"),
    ("26.02", "h100", "qwen3-30b-a3b", "fp8"): ("deepep", f"v0.3.0:{_QWEN}:421 (H100_FP8_CS_V1)"),
    ("26.06.01", "gb200", "deepseek-v3", "fp8-mx"): ("hybridep", f"v0.5.1:{_DSV3}:224 (GB200_FP8_MX_V2)"),
    ("26.06.01", "gb200", "gpt-oss-120b", "fp8-mx"): ("hybridep", f"v0.5.1:{_OSS}:211 (GB200_FP8_MX_V2)"),
    ("26.06.01", "gb200", "qwen3-30b-a3b", "fp8-mx"): ("hybridep", f"v0.5.1:{_QWEN}:405 (GB200_FP8_MX_V1)"),
    ("26.06.01", "gb200", "qwen3-235b-a22b", "fp8-mx"): ("hybridep", f"v0.5.1:{_QWEN}:229 (GB200_FP8_MX_V2)"),
    ("26.06", "gb200", "deepseek-v3", "fp8-mx"): ("hybridep", f"v0.5.0:{_DSV3}:209 (GB200_FP8_MX_V2)"),
    ("26.06", "gb200", "gpt-oss-120b", "fp8-mx"): ("hybridep", f"v0.5.0:{_OSS}:211 (GB200_FP8_MX_V2)"),
    ("26.06", "gb200", "qwen3-30b-a3b", "fp8-mx"): ("hybridep", f"v0.5.0:{_QWEN}:388 (GB200_FP8_MX_V1)"),
    ("26.06", "h100", "qwen3-30b-a3b", "fp8"): ("hybridep", f"v0.5.0:{_QWEN}:470 (H100_FP8_CS_V1)"),
    ("26.06", "gb200", "qwen3-235b-a22b", "fp8-mx"): ("hybridep", f"v0.5.0:{_QWEN}:229 (GB200_FP8_MX_V2)"),
    ("26.04.01", "gb200", "deepseek-v3", "fp8-mx"): ("hybridep", f"v0.4.2:{_DSV3}:170 (GB200_FP8_MX_V2)"),
    ("26.04.01", "gb200", "qwen3-30b-a3b", "fp8-mx"): ("hybridep", f"v0.4.2:{_QWEN}:363 (GB200_FP8_MX_V1)"),
    ("26.04.01", "b200", "qwen3-30b-a3b", "fp8-mx"): ("hybridep", f"v0.4.2:{_QWEN}:409 (B200_FP8_MX_V1)"),
    ("26.04.01", "h100", "qwen3-30b-a3b", "fp8"): ("hybridep", f"v0.4.2:{_QWEN}:424 (H100_FP8_CS_V1)"),
    ("26.04.01", "gb200", "qwen3-235b-a22b", "fp8-mx"): ("hybridep", f"v0.4.2:{_QWEN}:224 (GB200_FP8_MX_V2)"),
    ("26.04", "gb200", "deepseek-v3", "fp8-mx"): ("hybridep", f"v0.4.0:{_DSV3}:170 (GB200_FP8_MX_V2)"),
    ("26.04", "b200", "deepseek-v3", "fp8-mx"): ("hybridep", f"v0.4.0:{_DSV3}:201 (B200_FP8_MX_V2)"),
    ("26.04", "gb200", "gpt-oss-120b", "bf16"): ("hybridep", f"v0.4.0:{_OSS}:102 (GB200_BF16_V2)"),
    ("26.04", "b200", "gpt-oss-120b", "bf16"): ("hybridep", f"v0.4.0:{_OSS}:118 (B200_BF16_V2)"),
    ("26.04", "gb200", "qwen3-30b-a3b", "fp8-mx"): ("hybridep", f"v0.4.0:{_QWEN}:361 (GB200_FP8_MX_V1)"),
    ("26.04", "b200", "qwen3-30b-a3b", "fp8-mx"): ("hybridep", f"v0.4.0:{_QWEN}:407 (B200_FP8_MX_V1)"),
    ("26.04", "h100", "qwen3-30b-a3b", "fp8"): ("hybridep", f"v0.4.0:{_QWEN}:422 (H100_FP8_CS_V1)"),
    ("26.04", "gb200", "qwen3-235b-a22b", "fp8-mx"): ("hybridep", f"v0.4.0:{_QWEN}:222 (GB200_FP8_MX_V2)"),
    ("26.02.01", "gb200", "deepseek-v3", "fp8-mx"): ("hybridep", f"v0.3.1:{_DSV3}:161 (GB200_FP8_MX_V2)"),
    ("26.02.01", "b200", "deepseek-v3", "fp8-mx"): ("hybridep", f"v0.3.1:{_DSV3}:184 (B200_FP8_MX_V2)"),
    ("26.02.01", "gb200", "qwen3-30b-a3b", "fp8-mx"): ("hybridep", f"v0.3.1:{_QWEN}:347 (GB200_FP8_MX_V1)"),
    ("26.02.01", "b200", "qwen3-30b-a3b", "fp8-mx"): ("hybridep", f"v0.3.1:{_QWEN}:393 (B200_FP8_MX_V1)"),
    ("26.02.01", "gb200", "qwen3-235b-a22b", "fp8-mx"): ("hybridep", f"v0.3.1:{_QWEN}:216 (GB200_FP8_MX_V2)"),
    ("26.02", "gb200", "deepseek-v3", "fp8-mx"): ("hybridep", f"v0.3.0:{_DSV3}:161 (GB200_FP8_MX_V2)"),
    ("26.02", "b200", "deepseek-v3", "fp8-mx"): ("hybridep", f"v0.3.0:{_DSV3}:184 (B200_FP8_MX_V2)"),
    ("26.02", "gb200", "qwen3-30b-a3b", "fp8-mx"): ("hybridep", f"v0.3.0:{_QWEN}:356 (GB200_FP8_MX_V1)"),
    ("26.02", "gb200", "qwen3-235b-a22b", "fp8-mx"): ("hybridep", f"v0.3.0:{_QWEN}:225 (GB200_FP8_MX_V2)"),
}
# Full-iteration CUDA graphs with Megatron-Core's fused grouped MLP (cuda_graph_impl="full_iteration",
# cutedsl_fused_grouped_mlp=True: no host issue or token-count sync inside the step; the experts' two GEMMs with the
# activation, bias and quantization in two kernels), set only by the 26.06 and 26.06.01 GB200 MXFP8 configs of the MoE
# models: plan.cuda_graph_impl full_iteration and plan.fused_grouped_mlp.
FULL_ITERATION_GRAPHS = {
    ("26.06.01", "gb200", "deepseek-v3", "fp8-mx"): f"v0.5.1:{_DSV3}:224 (GB200_FP8_MX_V2)",
    ("26.06.01", "gb200", "gpt-oss-120b", "fp8-mx"): f"v0.5.1:{_OSS}:211 (GB200_FP8_MX_V2)",
    ("26.06.01", "gb200", "qwen3-30b-a3b", "fp8-mx"): f"v0.5.1:{_QWEN}:405 (GB200_FP8_MX_V1)",
    ("26.06.01", "gb200", "qwen3-235b-a22b", "fp8-mx"): f"v0.5.1:{_QWEN}:229 (GB200_FP8_MX_V2)",
    ("26.06", "gb200", "deepseek-v3", "fp8-mx"): f"v0.5.0:{_DSV3}:209 (GB200_FP8_MX_V2)",
    ("26.06", "gb200", "gpt-oss-120b", "fp8-mx"): f"v0.5.0:{_OSS}:211 (GB200_FP8_MX_V2)",
    ("26.06", "gb200", "qwen3-30b-a3b", "fp8-mx"): f"v0.5.0:{_QWEN}:388 (GB200_FP8_MX_V1)",
    ("26.06", "gb200", "qwen3-235b-a22b", "fp8-mx"): f"v0.5.0:{_QWEN}:229 (GB200_FP8_MX_V2)",
}
# Megatron-Core's selective recomputation of named modules (plan.recompute: selective, plan.recompute_modules) where
# the release's config of the row sets recompute_modules (which set_recompute_overrides, scripts/performance/utils/
# overrides.py, turns into recompute_granularity="selective"): the config the release's scripts run by default (v2,
# else v1; get_workload_base_config in scripts/performance/utils/utils.py), evaluated at the release's tag (its
# definition's line given), and only where its tp, pp, vp, ep, micro and global batch are the row's. Left out:
# 26.02.01 B200 GPT-OSS (its config has ep 64, the row ep 8); the 26.06 GPT-OSS configs set recompute_modules=[]
# (nothing recomputed: the rows' recompute none); Qwen3's recipes turn recomputation off (recompute_granularity=None).
RECOMPUTE_MODULES = {
    ("26.06.01", "gb200", "deepseek-v3", "fp8-mx"): ("mla_up_proj", f"v0.5.1:{_DSV3}:224 (GB200_FP8_MX_V2)"),
    ("26.06", "gb200", "deepseek-v3", "fp8-mx"): ("mla_up_proj", f"v0.5.0:{_DSV3}:209 (GB200_FP8_MX_V2)"),
    ("26.04.01", "gb200", "deepseek-v3", "fp8-mx"): ("mlp", f"v0.4.2:{_DSV3}:170 (GB200_FP8_MX_V2)"),
    ("26.04.01", "b200", "deepseek-v3", "fp8-mx"): ("mla_up_proj,mlp", f"v0.4.2:{_DSV3}:203 (B200_FP8_MX_V2)"),
    ("26.04.01", "gb200", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.4.2:{_OSS}:102 (GB200_BF16_V2)"),
    ("26.04.01", "b200", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.4.2:{_OSS}:117 (B200_BF16_V2)"),
    ("26.04.01", "h100", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.4.2:{_OSS}:124 (H100_BF16_V2)"),
    ("26.04", "gb200", "deepseek-v3", "fp8-mx"): ("mlp", f"v0.4.0:{_DSV3}:170 (GB200_FP8_MX_V2)"),
    ("26.04", "b200", "deepseek-v3", "fp8-mx"): ("mla_up_proj", f"v0.4.0:{_DSV3}:201 (B200_FP8_MX_V2)"),
    ("26.04", "gb200", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.4.0:{_OSS}:102 (GB200_BF16_V2)"),
    ("26.04", "b200", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.4.0:{_OSS}:118 (B200_BF16_V2)"),
    ("26.04", "h100", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.4.0:{_OSS}:126 (H100_BF16_V2)"),
    ("26.02.01", "gb200", "deepseek-v3", "fp8-mx"): ("mla_up_proj", f"v0.3.1:{_DSV3}:161 (GB200_FP8_MX_V2)"),
    ("26.02.01", "b200", "deepseek-v3", "fp8-mx"): ("mla_up_proj", f"v0.3.1:{_DSV3}:184 (B200_FP8_MX_V2)"),
    ("26.02.01", "gb200", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.3.1:{_OSS}:96 (GB200_BF16_V2)"),
    ("26.02.01", "h100", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.3.1:{_OSS}:114 (H100_BF16_V2)"),
    ("26.02", "gb200", "deepseek-v3", "fp8-mx"): ("mla_up_proj", f"v0.3.0:{_DSV3}:161 (GB200_FP8_MX_V2)"),
    ("26.02", "b200", "deepseek-v3", "fp8-mx"): ("mla_up_proj", f"v0.3.0:{_DSV3}:184 (B200_FP8_MX_V2)"),
    ("26.02", "gb200", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.3.0:{_OSS}:96 (GB200_BF16_V2)"),
    ("26.02", "b200", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.3.0:{_OSS}:108 (B200_BF16_V2)"),
    ("26.02", "h100", "gpt-oss-120b", "bf16"): ("layernorm,moe_act", f"v0.3.0:{_OSS}:114 (H100_BF16_V2)"),
}


def dataset_of(release: str) -> str:
    """One held-out dataset per release (its point releases with it): ``bridge-2604`` for 26.04 and 26.04.01."""
    return "bridge-" + "".join(release.split(".")[:2])


def tables(text: str):
    """(release, section heading, header, row cells, line) of every pre-training table row."""
    release, pretrain, heading, header = None, False, None, None
    for number, line in enumerate(text.splitlines(), start=1):
        if m := re.match(r"^## (\S+) NeMo Container", line):
            release, pretrain = m.group(1), False
        elif line.startswith("### "):
            pretrain = line.strip() == "### Pre-Training Performance"
        elif line.startswith("#### "):
            heading, header = line[5:].strip(), None
        elif line.startswith("|") and release and pretrain:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set("".join(cells)) <= set("-: "):
                yield release, heading, header, cells, number


def _int(value: str, default: int | None = None) -> int | None:
    return default if value in ("", "n/a", "-") else int(value.replace(",", ""))


def _templates(rows: list[dict]) -> dict:
    """The 25.11 row of each model (its shape columns), with and without multi-token prediction."""
    out = {}
    for r in rows:
        if r["id"].startswith("bridge2511-"):
            out.setdefault((r["model"], "-mtp-" in r["id"]), r)
    return out


def transcribe(text: str, rows: list[dict]) -> tuple[list[dict], list[str]]:
    """New rows from the archive ``text`` (``rows``: the CSV's current rows) and the skipped rows, each with why."""
    templates = _templates(rows)
    made, skipped, seen = [], [], set()
    for release, heading, header, cells, line in tables(text):
        if release == HAND_RELEASE:
            continue
        row = dict(zip(header, cells))
        if "Precision" not in row:  # 25.09: two configurations per cell, the second in brackets, token-dropping MoE
            skipped.append(f"line {line}: {release} {cells[0]}: no Precision column (two configurations per cell)")
            continue
        kind, _, name = heading.partition(": ")
        raw_system = name if kind == "System" else row.get("System", "")
        raw_model = name if kind == "Model" else row.get("Model", "")
        notes = FOOTNOTE.findall(raw_model + " " + " ".join(cells))
        model_key = FOOTNOTE.sub("", raw_model).strip()
        mtp = "w/ MTP" in model_key
        model_key = re.sub(r"\s*\(w/o? MTP\)", "", model_key)
        where = f"line {line}: {release} {model_key} on {raw_system}"
        if raw_system not in SYSTEMS:
            skipped.append(f"{where}: system not in systems.yaml")
            continue
        if model_key not in MODELS or (MODELS[model_key], mtp) not in templates:
            skipped.append(f"{where}: model not in models.yaml (or no 25.11 row of its shape)")
            continue
        precision_key = FOOTNOTE.sub("", row["Precision"]).strip()
        if precision_key not in PRECISIONS:
            skipped.append(f"{where}: precision {precision_key!r} not expressible")
            continue
        made_row, why = _row(release, row, raw_system, model_key, mtp, precision_key, notes, templates)
        if why:
            skipped.append(f"{where}: {why}")
            continue
        if made_row["id"] in seen:  # two table rows of one release, system, model, size and precision
            raise ValueError(f"{where}: id {made_row['id']} made twice; the id needs the knob that tells them apart")
        seen.add(made_row["id"])
        made.append(made_row)
    return made, skipped


def _catalog_layers(model: str) -> int:
    from trainscale.model.specs import resolve_model  # run as a script (the module docstring): no package

    return resolve_model(model).layers


def _row(release, row, raw_system, model_key, mtp, precision_key, notes, templates) -> tuple[dict, str]:
    model = MODELS[model_key]
    template = templates[(model, mtp)]
    system, short = SYSTEMS[raw_system]
    precision, recipe, tag = PRECISIONS[precision_key]
    gpus, tp, pp = _int(row["#-GPUs"]), _int(row["TP"]), _int(row["PP"])
    cp, vp, ep = _int(row.get("CP", ""), 1), _int(row.get("VP", ""), 1), _int(row.get("EP", ""), None)
    if gpus % (tp * pp * cp):
        return {}, f"{gpus} GPUs not divisible by tp x pp x cp"
    dp = gpus // (tp * pp * cp)
    moe = bool(template["experts"])
    etp = 1 if moe and tp > 1 else None
    if moe and ep and (tp * dp) % (ep * (etp or tp)):
        return {}, f"ep {ep} x etp does not divide tp x dp = {tp * dp}"
    fsdp = _int(row.get("FSDP", ""), 0)
    layers = int(template["layers"] or _catalog_layers(model))
    if pp * vp > layers:
        return {}, (f"pp x vp = {pp * vp} chunks for {layers} layers: the recipe's layout has chunks of only the "
                    "embedding or the loss, which the model cannot express")
    custom = pp > 1 and vp > 1 and layers % (pp * vp) != 0
    out = {k: "" for k in template}
    out.update({k: template[k] for k in SHAPE})
    rel = "".join(release.split("."))
    out.update({
        "id": f"bridge{rel}-{short}-{model}{'-mtp' if mtp else ''}-{gpus}g-{tag}",
        "source": (f"Megatron-Bridge docs/performance-summary-archive.md, '{release} NeMo Container' Pre-Training "
                   f"Performance, '{model_key}' table, row '{raw_system}' (transcribed by "
                   "pkg/trainscale/data/bridge_archive.py)"),
        "model": model, "seq_len": row["Sequence Length"], "system": system, "gpus": gpus, "tp": tp, "pp": pp,
        "dp": dp, "interleave": vp, "micro_batch": _int(row["MBS"]), "global_batch": _int(row["GBS"]),
        "zero": 3 if fsdp else "", "metric": "tokens_per_s_per_gpu",
        "value": _int(row["Tokens / sec / GPU"]), "cp": cp, "ep": ep or "", "stack": "nemo", "url": URL,
        "dataset": dataset_of(release), "etp": etp or "", "precision": precision, "fp8_recipe": recipe,
        "custom_pipeline_layout": "true" if custom else "",
    })
    a2a = EP_A2A_OVERLAP.get((release, short, model, tag))
    if a2a:
        out["overlap_moe_expert_parallel_comm"] = "true"
    dispatcher, dispatcher_source = MOE_DISPATCHER.get((release, short, model, tag), ("", ""))
    if dispatcher:
        out["moe_dispatcher"] = dispatcher
    modules, modules_source = RECOMPUTE_MODULES.get((release, short, model, tag), ("", ""))
    if modules:
        out["recompute"], out["recompute_modules"] = "selective", modules
    note = [f"precision {precision_key} as published" + ("" if recipe or precision == "bf16" else
                                                          " (recipe not stated: the format's default)"),
            f"table also gives Model TFLOP/s/GPU {row.get('Model TFLOP / sec / GPU', '')}",
            f"dp = gpus/(tp*pp*cp) = {dp}"]
    if fsdp:
        note.append(f"FSDP {fsdp}: Megatron-FSDP, written as zero 3")
    if moe:
        note.append("MoE: force-balanced token distribution, token-dropless (the archive's footnote)")
        if etp:
            note.append("etp 1 (no ETP column; Bridge's workload base configs set expert_tensor_parallel_size=1)")
    if model == "deepseek-v3":
        note.append("its multi-head latent attention priced as such (its widths from the 25.11 row)")
    if mtp:
        note.append("with multi-token prediction (the table's 'w/ MTP'): mtp_num_layers as its 25.11 row")
    elif model == "deepseek-v3":
        note.append("multi-token prediction not stated, not priced (the DeepSeek-V3 recipe sets mtp_num_layers 1 in "
                    "every release, but 25.11's table ran its GB200 rows with that recipe 'w/o MTP')")
    if custom:
        note.append(f"{layers} layers do not split evenly over pp*vp = {pp * vp} chunks: custom_pipeline_layout")
    if dispatcher:
        note.append(f"token dispatcher {dispatcher} in the release's config (Megatron-Bridge {dispatcher_source})")
    graphs = FULL_ITERATION_GRAPHS.get((release, short, model, tag))
    if graphs:
        out["cuda_graph_impl"], out["fused_grouped_mlp"] = "full_iteration", "true"
        note.append(f"full-iteration CUDA graphs and the fused grouped MLP in the release's config (Megatron-Bridge "
                    f"{graphs})")
    if modules:
        note.append(f"selective recomputation of {modules.replace(',', ' and ')} in the release's config "
                    f"(Megatron-Bridge {modules_source})")
    if a2a:
        note.append(f"EP all-to-all overlap on: moe_a2a_overlap=True in the release's config (Megatron-Bridge {a2a})")
    for name in notes:
        note.append(f"footnote [^{name}] of the archive" + (": a known performance regression (cudnn-frontend#256)"
                                                            if name == "gpt-oss-note" else ""))
    unstated = ([] if modules else ["recompute"]) + ["SP/TP overlap", "distributed optimizer"] + \
        ([] if dispatcher else ["dispatcher"])
    note.append(f"shape from this model's 25.11 row; {', '.join(unstated)} not stated: NeMo defaults")
    if moe and not a2a:
        note.append("EP all-to-all overlap off in the release's config")
    if template["rotary_kernel"]:
        note.append(f"rotary_kernel {template['rotary_kernel']} as this model's 25.11 row (its note gives the source)")
    out["note"] = "; ".join(note)
    return out, ""


def main(argv: list[str]) -> int:
    text = Path(argv[0]).read_text()
    with CSV_FILE.open(newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    kept = [r for r in rows if "bridge_archive.py" not in r["source"]]
    made, skipped = transcribe(text, kept)
    for r in made:
        print(r["id"], r["value"])
    for s in skipped:
        print("skipped", s)
    if "--write" in argv:  # to a temporary name beside the file, moved into place once written whole
        partial = CSV_FILE.with_name(CSV_FILE.name + ".partial")
        with partial.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
            writer.writeheader()
            writer.writerows(kept + made)
        os.replace(partial, CSV_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
