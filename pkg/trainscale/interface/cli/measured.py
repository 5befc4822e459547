"""The model against the measured runs: ``trainscale validate`` (predicted vs measured on every published run,
by dataset, precision, scale and plan ranking) and ``trainscale calibrate`` (fit the model's parameters on them,
with cross-validation).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .shared import CLIError, _dump_json, _one_line, _table


def _validation_summary(ds) -> dict:
    import numpy as np

    out = {}
    datasets = ds["dataset"].values
    for name in dict.fromkeys(datasets.tolist()):
        ape = np.abs(ds["rel_error"].values[datasets == name])
        out[name] = {"runs": int(ape.size), "mape": float(ape.mean()), "median": float(np.median(ape)),
                     "worst": float(ape.max())}
    return out


def _vtrain_arg(args):
    from ...model import validation

    if args.vtrain is None:
        return validation.vtrain_dir()
    if not Path(args.vtrain).is_dir():
        raise CLIError(f"--vtrain = {args.vtrain!r} is invalid; no such directory")
    if validation.vtrain_dir(args.vtrain) is None:
        raise CLIError(f"--vtrain = {args.vtrain!r} is invalid; it holds no ground_truth_multi.csv")
    return Path(args.vtrain)


def cmd_validate(args) -> int:
    from ...model import catalog, validation

    vtrain = _vtrain_arg(args)
    if args.search_unpublished:
        return _validate_searched(args, validation)
    try:
        ds = validation.validation_dataset(vtrain_dir=vtrain, include_vtrain_single=True)
    except FileNotFoundError as exc:
        raise CLIError(f"--vtrain = {args.vtrain!r} is invalid; {_one_line(exc)}") from None
    df = validation.table(ds).reset_index()
    summary = _validation_summary(ds)
    stored_cv = catalog.stored_cross_validation()
    cv = stored_cv.get("leave_one_dataset_out", {})
    size_out = validation.size_out_by_dataset(stored_cv)
    for name, entry in summary.items():
        entry["fitted"] = name not in validation.NOT_FITTED
        if name in cv:
            entry["cv_mape"] = float(cv[name]["mape"])
            entry["cv_worst"] = float(cv[name]["worst"])
        if name in size_out:
            entry["size_out_mape"] = float(size_out[name]["mape"])
            entry["size_out_worst"] = float(size_out[name]["worst"])
    scale = validation.scale_groups(ds)
    if args.json:
        _dump_json({"runs": df.to_dict(orient="records"), "summary": summary,
                    "scale_groups": scale.to_dict(orient="records"),
                    "plan_ranking": validation.plan_ranking(ds).to_dict(orient="records")})
        return 0
    shown = df if args.all else df[df["dataset"] != "vtrain-single"]  # 1,440 rows: only when asked
    print(_table(shown.to_dict(orient="records")))
    print()
    rows = [{"dataset": k, "runs": v["runs"], "fitted": "yes" if v["fitted"] else "no (held out)",
             "MAPE_%": 100 * v["mape"], "worst_APE_%": 100 * v["worst"],
             "left-out_MAPE_%": 100 * v["cv_mape"] if "cv_mape" in v else None,
             "left-out_worst_%": 100 * v["cv_worst"] if "cv_worst" in v else None,
             "size-out_MAPE_%": 100 * v["size_out_mape"] if "size_out_mape" in v else None}
            for k, v in summary.items()]
    print(_table(rows))
    print("\nby precision and dense / MoE (fit: in-sample where the dataset was fitted, held out where never):")
    print(_table(validation.parity_by_precision(ds).to_dict(orient="records")))
    unfitted = validation.unfitted_precisions(ds)
    if len(unfitted):
        print("\nprecisions no fitted run uses, left out entirely (their GEMMs priced from the BF16 fit and the "
              "generation's peak ratio):")
        print(_table(unfitted.to_dict(orient="records")))
    print("\nleft-out: the error when the dataset is left out of the fit; size-out: the error of its runs when "
          "each run's model-size class is left out (its other sizes stay in the fit). Both from trainscale "
          "calibrate --cv, stored in calibration_fitted.yaml\n")
    print(_table(scale.to_dict(orient="records")))
    print(f"\nruns at >= {validation.LARGE_GPUS} GPUs and below, per dataset: mean_too_fast_% is the mean signed error "
          "as a speed (positive: predicted faster than measured); too_fast_per_doubling_% its slope per doubling "
          "of the GPU count within the group\n")
    ranking = validation.plan_ranking(ds)
    print(_table((ranking if args.all else ranking[ranking["dataset"] != "vtrain-single"]).to_dict(orient="records")))
    print(f"\nplans of one model at one GPU count ({validation.MIN_PLANS} or more): spearman ranks predicted "
          "against measured time per sequence; regret_%: how much longer the model's fastest plan measured "
          "than the measured fastest")
    return 0


def _validate_searched(args, validation) -> int:
    """``validate --search-unpublished``: the runs whose source leaves a knob blank, with those knobs
    searched (searched.searched_dataset) beside their stack's defaults."""
    from ...model import searched

    ds = searched.searched_dataset()
    # one row per run: the narrower ranges (dim search_range) are summarised, not listed
    df = ds.drop_dims("search_range").to_dataframe().reset_index()
    summary = searched.searched_summary(ds).reset_index()
    if args.json:
        _dump_json({"runs": df.to_dict(orient="records"), "summary": summary.to_dict(orient="records")})
        return 0
    cols = ["run", "dataset", "metric", "measured", "predicted_default", "predicted_searched", "rel_error_default",
            "rel_error_searched"] + [f"searched_{k}" for k in validation.SEARCHED_KNOBS]
    print(_table(df[cols].to_dict(orient="records")))
    print()
    print(_table(summary.to_dict(orient="records")))
    print("\nsearched: the best plan of `trainscale search` with every published field fixed and only the knobs "
          "the source leaves blank searched (blank searched_* cell: published, not searched)")
    return 0


def cmd_calibrate(args) -> int:
    from ...model import calibration, validation

    vtrain = _vtrain_arg(args)
    progress = (lambda msg: print(f"  refit without {msg} ...", file=sys.stderr, flush=True)) \
        if sys.stderr.isatty() else None
    result = calibration.fit(vtrain)
    cv = calibration.cross_validate(vtrain, full=result, progress=progress) if args.cv else None
    written = str(calibration.write_fitted(result, cv=cv)) if args.write else None
    if args.json:
        _dump_json({"fitted": result["fitted"], "at_bound": result["at_bound"], "errors": result["errors"],
                    "cross_validation": cv, "written": written})
        return 0
    print(f"datasets: {', '.join(result['datasets'])}   cost: {result['cost']:.6g}")
    print(_table([{"scope": f"{scope[:-1]} {owner}", "parameter": name, "value": value,
                   "at_bound": "AT BOUND" if f"{owner}.{name}" in result["at_bound"] else ""}
                  for scope, owners in result["fitted"].items() for owner, params in owners.items()
                  for name, value in params.items()]))
    print()
    rows = []
    size_out = validation.size_out_by_dataset(cv) if cv is not None else {}
    for d, e in result["errors"].items():
        row = {"dataset": d, "runs": e["runs"], "MAPE_%": 100 * e["mape"], "worst_APE_%": 100 * e["worst"]}
        if cv is not None and d in cv["leave_one_dataset_out"]:
            left = cv["leave_one_dataset_out"][d]
            row.update({"left-out_MAPE_%": 100 * left["mape"], "left-out_worst_%": 100 * left["worst"]})
        if d in size_out:
            row["size-out_MAPE_%"] = 100 * size_out[d]["mape"]
        rows.append(row)
    print(_table(rows))
    if cv is not None:
        print()
        print(_table([{"size class left out": k, "runs": v["runs"], "MAPE_%": 100 * v["mape"],
                       "worst_APE_%": 100 * v["worst"]} for k, v in cv["leave_one_size_out"].items()]))
    if result["at_bound"]:
        print(f"warning: fitted at a bound: {', '.join(result['at_bound'])} (the bound, not the data, "
              "sets these values)", file=sys.stderr)
    print(f"written: {written}" if written else "not written (use --write to update the package data)")
    return 0


def add_parsers(sub) -> None:
    """The ``validate`` and ``calibrate`` commands (``sub``: the parser's subcommands)."""
    p = sub.add_parser("validate", help="predicted vs measured on every published run the project carries")
    p.add_argument("--vtrain", metavar="DIR", help="vTrain folder with ground_truth_multi.csv "
                   "(default: the copy shipped in trainscale/data/vtrain)")
    p.add_argument("--all", action="store_true", help="also print vTrain's 1,440 single-node runs one by one (the summary always has them)")
    p.add_argument("--search-unpublished", action="store_true",
                   help="only the runs whose source leaves a knob blank (interleave, micro-batch, recompute): "
                        "the best plan with those knobs searched, beside their stack's defaults")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("calibrate", help="fit the performance-model parameters on the measured runs")
    p.add_argument("--vtrain", metavar="DIR", help="vTrain folder with ground_truth_multi.csv "
                   "(default: the copy shipped in trainscale/data/vtrain)")
    p.add_argument("--cv", action="store_true", help="also refit leaving out each dataset and each model-size "
                   "class, and report the error on what was left out (minutes)")
    p.add_argument("--write", action="store_true", help="write the fitted values into the package data")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)
