"""``trainscale plan`` (a pipeline over a heterogeneous cluster) and ``trainscale plan-cluster`` (each cluster
size's best plan, its time to train a token budget, GPU-hours and energy, and the Pareto front of the three).
"""

from __future__ import annotations

import os

from .shared import CLIError, _dump_json, _fmt, _load_yaml, _positive_int, _progress, _spec_arg, _table, _warn

# `plan` simulates the chosen pipeline micro-batch by micro-batch (memory and time grow with the count)
PLAN_SIMULATED_MICRO_BATCHES = 2**20


def cmd_plan(args) -> int:
    from ...model import hetero

    from ...common.inputs import check_finite, plausibility_warnings

    doc = _load_yaml(args.cluster)
    cluster = hetero.Cluster.from_dict(doc, where=args.cluster)
    for group in cluster.groups:
        for warning in plausibility_warnings(group.system):
            _warn(f"{args.cluster} group {group.name!r}: {warning}")
    problem = hetero.problem(args.model, cluster, args.global_batch, max_stages=args.max_stages)
    best = hetero.plan(problem)
    if best is not None and best.micro_batches > PLAN_SIMULATED_MICRO_BATCHES:
        raise CLIError(f"--global-batch = {args.global_batch} is invalid; the best plan runs {best.micro_batches:,} "
                       f"micro-batches per replica, the pipeline simulation at most {PLAN_SIMULATED_MICRO_BATCHES:,} "
                       f"(a global batch up to {PLAN_SIMULATED_MICRO_BATCHES * best.dp:,} with dp {best.dp})")
    if best is None:
        result = {"model": args.model, "global_batch": args.global_batch, "fits": False,
                  "reason": "no plan fits in the cluster's memory"}
    else:
        simulated, step = hetero.simulate(problem, best)
        result = {"model": args.model, "global_batch": args.global_batch, "fits": True,
                  "dp": best.dp, "pp": len(best.groups), "micro_batches": best.micro_batches,
                  "step_time_s": step, "planner_step_time_s": best.step_time_s,
                  "bubble_fraction": simulated.bubble_fraction,
                  "tokens_per_s": problem.global_batch * problem.model.seq_len / step,
                  "gradient_sync_s": best.sync_s, "stages": best.describe(cluster)}
        check_finite(result, where=args.cluster)
    if args.json:
        _dump_json(result)
        return 0
    print(f"{args.model} on {', '.join(f'{g.nodes} x {g.system.name} ({g.name})' for g in cluster.groups)}, "
          f"global batch {args.global_batch}")
    if not result["fits"]:
        print(result["reason"])
        return 0
    print(f"dp {result['dp']} x pp {result['pp']}, {result['micro_batches']} micro-batches per replica: "
          f"step {_fmt(result['step_time_s'])} s (simulated 1F1B; planner's closed form "
          f"{_fmt(result['planner_step_time_s'])} s), {_fmt(result['tokens_per_s'])} tokens/s")
    print(_table(result["stages"]))
    return 0


def cmd_plan_cluster(args) -> int:
    from ...model import plancluster
    from ...common import io as tsio
    from ...model.specs import resolve_model, resolve_system

    sizes = plancluster.parse_gpus(args.gpus, "--gpus")
    tokens = plancluster.parse_tokens(args.tokens, "--tokens")
    for option, path, suffix in (("--out", args.out, ".nc"), ("--figure", args.figure, ".png")):
        if path is not None and (not path.endswith(suffix) or os.path.isdir(path)):
            raise CLIError(f"{option} = {path!r} is invalid; expected a file name ending in {suffix}")
    model = resolve_model(_spec_arg(args.model, "model"), where="--model")
    system = resolve_system(_spec_arg(args.system, "system"), where="--system")
    from ...common.inputs import plausibility_warnings

    for warning in plausibility_warnings(system):
        _warn(f"--system: {warning}")
    ds = plancluster.cluster_front(model, system, sizes, tokens, args.global_batch, stack=args.stack,
                                   progress=_progress)
    written = []
    if args.out:
        written.append(tsio.write_dataset(ds, args.out))
    if args.figure:
        written.append(plancluster.save_front_figure(ds, args.figure))
    rows = plancluster.front_rows(ds)
    if args.json:
        _dump_json({"model": model.name, "system": system.name, "stack": args.stack, "tokens": tokens,
                    "global_batch": args.global_batch, "seq_len": model.seq_len,
                    "objectives": list(plancluster.OBJECTIVES),
                    "sizes": [{**{k: v for k, v in row.items() if k != "front"}, "on_front": bool(row["front"])}
                              for row in rows],
                    "written": [str(p) for p in written]})
        return 0
    print(f"{model.name} on {system.name}, {tokens:.4g} tokens, global batch {args.global_batch} sequences of "
          f"{model.seq_len} tokens, stack {args.stack}: each size's best plan the stack runs (trainscale search)")
    print(_table([{k: v for k, v in row.items() if k != "reason"} for row in rows]))
    for row in rows:
        if "reason" in row:
            print(f"{row['gpus']} GPUs: {row['reason']}")
    print("*: on the Pareto front of (days, GPU_h, MWh): no other size is no worse in all three and better in one; "
          "days = tokens / predicted tokens/s; MWh: GPUs at their predicted power and each node's overhead "
          "(systems.yaml node_overhead_W)")
    for path in written:
        print(f"wrote {path}")
    return 0


def add_parsers(sub) -> None:
    """The ``plan`` and ``plan-cluster`` commands (``sub``: the parser's subcommands)."""
    p = sub.add_parser("plan", help="plan a pipeline over a heterogeneous cluster (groups + links YAML)")
    p.add_argument("cluster", metavar="CLUSTER.yaml", help="groups: [{name, system, nodes}], links: [...]")
    p.add_argument("--model", required=True, help="catalog model name")
    p.add_argument("--global-batch", required=True, type=_positive_int,
                   help="sequences per optimizer step, over all data-parallel ranks")
    p.add_argument("--max-stages", type=_positive_int, default=8, help="most pipeline stages (default 8)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("plan-cluster", help="across cluster sizes: each size's best plan, its time to train a token "
                       "budget, GPU-hours and energy, and the Pareto front of the three",
                       description="For each cluster size, the best plan the stack runs (as `search` finds it) and "
                       "what training --tokens tokens on it costs: days, GPU-hours and MWh (GPUs at their predicted "
                       "power plus each node's overhead). A size is on the Pareto front (*) when no other size is no "
                       "worse in all three and better in one.")
    p.add_argument("--model", required=True, help="catalog model name, or a YAML file with the model's shape")
    p.add_argument("--system", required=True, help="catalog system name, or a YAML file {name: ..., overrides}")
    p.add_argument("--gpus", required=True, metavar="SIZES",
                   help="cluster sizes: 256,512,1024 or a range of powers of two 256..8192 (or both, comma-separated)")
    p.add_argument("--tokens", required=True, metavar="TOKENS", help="tokens to train, e.g. 1e12")
    p.add_argument("--global-batch", required=True, type=_positive_int,
                   help="sequences per optimizer step, over all data-parallel ranks (the same at every size)")
    p.add_argument("--stack", default="megatron", choices=("megatron", "deepspeed", "fsdp", "nemo"),
                   help="software stack that runs the plans (default megatron)")
    p.add_argument("--out", metavar="FRONT.nc", help="write the sizes, plans, costs and front as a netCDF dataset")
    p.add_argument("--figure", metavar="FRONT.png", help="draw time to train against GPU-hours, the front joined")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan_cluster)
