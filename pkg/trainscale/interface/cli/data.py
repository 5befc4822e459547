"""The data the package lists or fetches: ``trainscale systems`` and ``trainscale models`` (the catalogs; the
fields a run may override on a system, with units) and ``trainscale fetch-trace`` (the curtailment paper's
trace, not redistributable, checked by sha256).
"""

from __future__ import annotations

from .shared import _dump_json, _table

# Units and meaning of every field a run may override on a catalog system.
SYSTEM_FIELDS: dict[str, tuple[str, str]] = {
    "accelerator": ("-", "accelerator model name (label only)"),
    "generation": ("-", "accelerator generation; selects the calibration parameters"),
    "peak_flops_bf16": ("FLOP/s", "dense BF16 (FP16 on Volta) tensor-core peak per GPU"),
    "peak_flops_fp8": ("FLOP/s", "dense FP8 tensor-core peak per GPU (null if none)"),
    "peak_flops_fp4": ("FLOP/s", "dense FP4 (NVFP4) tensor-core peak per GPU (null if none)"),
    "sm_count": ("1", "streaming multiprocessors (compute units) per GPU"),
    "hbm_capacity_GiB": ("GiB", "HBM capacity per GPU as reported by the driver"),
    "hbm_bandwidth_GBps": ("GB/s", "HBM bandwidth per GPU"),
    "tdp_W": ("W", "GPU board power limit (TDP)"),
    "idle_W": ("W", "GPU power when idle"),
    "gpus_per_node": ("1", "GPUs per node"),
    "scale_up_domain": ("GPUs", "GPUs in one scale-up (NVLink/NVSwitch/Infinity Fabric) domain"),
    "scale_up_GBps_per_gpu": ("GB/s", "scale-up bandwidth per GPU, unidirectional"),
    "scale_up_latency_s": ("s", "scale-up latency per collective step (alpha)"),
    "scale_out_GBps_per_gpu": ("GB/s", "scale-out network bandwidth per GPU, unidirectional"),
    "scale_out_latency_s": ("s", "scale-out latency per collective step (alpha)"),
    "node_overhead_W": ("W", "node power besides the GPUs (CPUs, switches, NICs, fans)"),
    "scale_out_leaf_gpus": ("GPUs", "GPUs under one leaf switch of a two-tier fat-tree (0: one flat tier)"),
    "scale_out_oversubscription": ("1", "leaf-to-spine oversubscription; bandwidth across the spine is divided by it"),
    "scale_out_hop_latency_s": ("s", "latency per switch hop (2 hops inside a leaf, 4 across the spine)"),
    "scale_up_nvls_efficiency": ("1", "NVLS all-reduce in the scale-up switches, NCCL's share of the links (0: none)"),
}


def cmd_fetch_trace(args) -> int:
    from ...workloads import curtailment

    path = curtailment.fetch_paper_trace(args.dest, args.git_dir)
    print(f"wrote {path} (sha256 {curtailment.PAPER_TRACE['sha256'][:12]}..., {curtailment.PAPER_TRACE['licence']})")
    return 0


def cmd_systems(args) -> int:
    from ...model import catalog
    from ...model.specs import SystemSpec

    if args.fields:
        rows = [{"field": f, "units": SYSTEM_FIELDS.get(f, ("", ""))[0],
                 "meaning": SYSTEM_FIELDS.get(f, ("", ""))[1]} for f in SystemSpec.overridable_fields()]
        if args.json:
            _dump_json(rows)
        else:
            print(_table(rows))
        return 0
    rows = []
    for name in catalog.systems():
        s = SystemSpec.from_catalog(name)
        rows.append({"name": name, "accelerator": s.accelerator, "generation": s.generation,
                     "peak_TFLOPs_bf16": s.peak_flops_bf16 / 1e12, "HBM_GiB": s.hbm_capacity_GiB,
                     "HBM_GBps": s.hbm_bandwidth_GBps, "gpus_per_node": s.gpus_per_node,
                     "scale_up_domain": s.scale_up_domain, "scale_up_GBps": s.scale_up_GBps_per_gpu,
                     "scale_out_GBps": s.scale_out_GBps_per_gpu})
    if args.json:
        _dump_json(rows)
    else:
        print(_table(rows))
    return 0


def cmd_models(args) -> int:
    from ...model import catalog
    from ...model.specs import resolve_model

    rows = []
    for name in catalog.models():
        m = resolve_model(name)
        rows.append({"name": name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
                     "kv_heads": m.kv_heads, "ffn_hidden": m.ffn_hidden, "ffn_type": m.ffn_type,
                     "vocab": m.vocab, "seq_len": m.seq_len, "params_B": m.params() / 1e9})
    if args.json:
        _dump_json(rows)
    else:
        print(_table(rows))
    return 0


def add_parsers(sub) -> None:
    """The ``fetch-trace``, ``systems`` and ``models`` commands (``sub``: the parser's subcommands)."""
    p = sub.add_parser("fetch-trace", help="fetch the curtailment paper's marginal-carbon-intensity trace "
                       "(exalsius/curtail-llm evaluation/mci.csv, not redistributable) into external/, checked by sha256")
    p.add_argument("--git-dir", metavar="DIR", help="read it from a local clone of exalsius/curtail-llm instead "
                   "of downloading it")
    p.add_argument("--dest", metavar="FILE", help="where to write it (default: external/curtail-llm/mci.csv)")
    p.set_defaults(func=cmd_fetch_trace)

    p = sub.add_parser("systems", help="list catalog systems")
    p.add_argument("--fields", action="store_true", help="list the fields a run may override, with units")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_systems)

    p = sub.add_parser("models", help="list catalog models")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)
