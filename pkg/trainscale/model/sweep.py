"""Plan sweeps too large for one job: cut into chunks, evaluate each chunk as its own job, gather.

A sweep is a model, several systems and GPU counts, one global batch and a plan space (the grid
axes of :func:`trainscale.model.perfmodel.evaluate_grid`). Its work units are the (system, GPU count,
tp) combinations; chunk ``i`` of ``n`` takes every ``n``-th unit, so chunks are balanced and
deterministic. Every plan is priced independently, so the gathered dataset is identical to the
unsplit evaluation (tests check it). Sweeps whose result would exceed ``ZARR_THRESHOLD_BYTES``
are written as a zarr store (one chunk per (system, GPU count)), others as netCDF.

Command line (used by the workflow's sweep rules)::

    python -m trainscale.model.sweep chunk  SPEC.json --chunk I --chunks N --out chunk.nc
    python -m trainscale.model.sweep gather SPEC.json --out sweep.nc|sweep.zarr chunk-0.nc ...
    python -m trainscale.model.sweep combine --out combined.nc --dim parameter_set --labels L0 L1 -- a.nc b.nc
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import xarray as xr

from . import perfmodel
from ..common.io import provenance, read_dataset, write_dataset
from .specs import SpecError, resolve_model, resolve_system

SWEEP_VARS = ("step_time_s", "tokens_per_s", "mfu", "memory_gib_per_gpu", "fits", "reason", "dp")
ZARR_THRESHOLD_BYTES = 2 * 2**30
AXES = tuple(a for a in perfmodel.GRID_AXES if a != "tp")


def check_spec(spec: Mapping) -> dict:
    """Validate a sweep spec; returns it with defaults filled in."""
    known = {"model", "systems", "gpus", "global_batch", "space", "chunks"}
    for key in spec:
        if key not in known:
            raise SpecError(key, spec[key], f"unknown sweep field; valid fields: {', '.join(sorted(known))}")
    for key in ("model", "systems", "gpus", "global_batch", "space"):
        if key not in spec:
            raise SpecError(key, None, "a sweep needs model, systems, gpus, global_batch and space")
    model = resolve_model(spec["model"])
    systems = list(spec["systems"])
    for s in systems:
        resolve_system(s)
    gpus = [int(g) for g in spec["gpus"]]
    if not gpus or min(gpus) < 1:
        raise SpecError("gpus", spec["gpus"], "expected positive integers")
    space = dict(spec["space"])
    for name in space:
        if name not in perfmodel.GRID_AXES:
            raise SpecError(f"space.{name}", space[name], f"valid axes: {', '.join(perfmodel.GRID_AXES)}")
    if "tp" not in space:
        raise SpecError("space.tp", None, "the sweep is split along tp: give its values")
    chunks = int(spec.get("chunks", 1))
    if chunks < 1:
        raise SpecError("chunks", spec.get("chunks"), "expected an integer >= 1")
    return {"model": model.name, "systems": systems, "gpus": gpus, "global_batch": int(spec["global_batch"]),
            "space": space, "chunks": chunks}


def units(spec: Mapping) -> list[tuple[str, int, int]]:
    """Work units in a fixed order: (system, GPU count, tp)."""
    return [(s, g, int(t)) for s in spec["systems"] for g in spec["gpus"] for t in spec["space"]["tp"]]


def chunk_units(spec: Mapping, chunk: int, chunks: int) -> list[tuple[str, int, int]]:
    if not 0 <= chunk < chunks:
        raise SpecError("chunk", chunk, f"expected 0 <= chunk < {chunks}")
    return units(spec)[chunk::chunks]


def _coords(spec: Mapping) -> dict:
    return {name: list(spec["space"].get(name, _default(name))) for name in perfmodel.GRID_AXES}


def _default(name: str) -> list:
    return {"recompute": ["full"], "zero": [0], "shard_group": [0],
            **{axis: [0] for axis in perfmodel.BOOLEAN_AXES}}.get(name, [1])


def evaluate_units(spec: Mapping, work: Sequence[tuple[str, int, int]]) -> xr.Dataset:
    """Evaluate some work units; dims ``unit`` + the plan axes other than tp."""
    spec = check_spec(spec)
    coords = _coords(spec)
    parts = []
    from ..common.progress import progress  # a bar on a terminal, nothing under the workflow

    for system, gpus, tp in progress(work, len(work), "sweep units"):
        axes = {name: coords[name] for name in AXES}
        grid = perfmodel.evaluate_grid(spec["model"], system, gpus, spec["global_batch"], tp=[tp], **axes)
        parts.append(grid[list(SWEEP_VARS)].isel(tp=0, drop=True))
    if not parts:
        raise SpecError("chunk", len(work), "this chunk has no work units: use fewer chunks")
    ds = xr.concat(parts, dim="unit", coords="minimal", compat="override", join="exact")
    ds = ds.assign_coords(unit=np.arange(len(work)), unit_system=("unit", [u[0] for u in work]),
                          unit_gpus=("unit", np.array([u[1] for u in work], dtype=np.int64)),
                          unit_tp=("unit", np.array([u[2] for u in work], dtype=np.int64)))
    ds.attrs.clear()
    return ds


def _empty_result(spec: Mapping, like: xr.Dataset) -> xr.Dataset:
    coords = _coords(spec)
    dims = ("system", "gpus", "tp") + AXES
    shape = (len(spec["systems"]), len(spec["gpus"]), len(coords["tp"])) + tuple(len(coords[a]) for a in AXES)
    data = {}
    for name in SWEEP_VARS:
        var = like[name]
        fill = False if var.dtype == bool else (np.nan if var.dtype.kind == "f" else -1)
        data[name] = (dims, np.full(shape, fill, dtype=var.dtype), dict(var.attrs))
    all_coords = {"system": list(spec["systems"]), "gpus": np.asarray(spec["gpus"], dtype=np.int64)}
    all_coords.update({name: coords[name] for name in perfmodel.GRID_AXES})
    ds = xr.Dataset(data, coords=all_coords)
    ds.attrs.update(provenance({"sweep": dict(spec)}))
    ds.attrs["model"] = spec["model"]
    ds.attrs["global_batch"] = int(spec["global_batch"])
    return ds


def gather(spec: Mapping, chunk_datasets: Sequence[xr.Dataset]) -> xr.Dataset:
    """Reassemble chunk results into one Dataset with dims (system, gpus, tp, <plan axes>)."""
    spec = check_spec(spec)
    result = None
    seen = set()
    for part in chunk_datasets:
        if result is None:
            result = _empty_result(spec, part)
        for i in range(part.sizes["unit"]):
            key = (str(part["unit_system"].values[i]), int(part["unit_gpus"].values[i]), int(part["unit_tp"].values[i]))
            if key in seen:
                raise SpecError("chunks", key, "a work unit appears in two chunks")
            seen.add(key)
            where = {"system": spec["systems"].index(key[0]), "gpus": spec["gpus"].index(key[1]),
                     "tp": [int(t) for t in spec["space"]["tp"]].index(key[2])}
            for name in SWEEP_VARS:
                result[name][where] = part[name].isel(unit=i).transpose(*AXES).values
    missing = set(units(spec)) - seen
    if result is None or missing:
        raise SpecError("chunks", sorted(missing)[:3], "work units missing from the chunks")
    return result


def evaluate(spec: Mapping) -> xr.Dataset:
    """The whole sweep in one process (the reference the chunked run must equal)."""
    spec = check_spec(spec)
    return gather(spec, [evaluate_units(spec, units(spec))])


def result_bytes(spec: Mapping) -> int:
    coords = _coords(check_spec(spec))
    n = len(spec["systems"]) * len(spec["gpus"]) * int(np.prod([len(v) for v in coords.values()]))
    return n * 8 * len(SWEEP_VARS)


def output_format(spec: Mapping) -> str:
    """``"zarr"`` for sweeps too large for one netCDF file, else ``"nc"``."""
    return "zarr" if result_bytes(spec) > ZARR_THRESHOLD_BYTES else "nc"


def write(ds: xr.Dataset, path: str | Path) -> Path:
    """netCDF (atomic, byte-reproducible) or a zarr store (written beside, then moved into place)."""
    path = Path(path)
    if path.suffix == ".zarr":
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        encoding = {name: {"chunks": tuple(1 if d in ("system", "gpus") else n for d, n in var.sizes.items())}
                    for name, var in ds.data_vars.items()}
        ds.to_zarr(tmp, mode="w", consolidated=False, encoding=encoding, zarr_format=2)
        shutil.rmtree(path, ignore_errors=True)
        tmp.replace(path)
        return path
    return write_dataset(ds, path)


def read(path: str | Path) -> xr.Dataset:
    path = Path(path)
    if path.suffix == ".zarr":
        return xr.open_zarr(path, consolidated=False).load()
    return read_dataset(path)


def swept_parameters(parameter_sets: Sequence[Mapping]) -> dict[str, list]:
    """The parameters whose values differ between the parameter sets, with one value per set
    (a list or mapping value as its JSON text, so that every coordinate is a plain array)."""
    keys = sorted({k for ps in parameter_sets for k in ps})
    swept = {}
    for key in keys:
        values = [ps.get(key) for ps in parameter_sets]
        texts = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(texts)) > 1:
            scalar = all(isinstance(v, (int, float, str, bool)) for v in values)
            swept[key] = values if scalar else texts
    return swept


def combine(paths: Sequence[str | Path], dim: str, labels: Sequence[str]) -> xr.Dataset:
    """Stack the datasets of a papermill sweep (one per parameter set) along ``dim``; each swept
    parameter becomes a coordinate along it (named after the parameter, ``swept_<name>`` where that
    name is taken), so ``ds.swap_dims({dim: name}).sel(name=value)`` and plots against it work."""
    if len(paths) != len(labels):
        raise SpecError("labels", list(labels), f"expected one label per dataset ({len(paths)})")
    parts = [read_dataset(p) for p in paths]
    parameters = [json.loads(part.attrs.get("parameters") or "{}") for part in parts]
    attrs = {f"{dim}_{label}": part.attrs.get("parameters", "") for label, part in zip(labels, parts)}
    for part in parts:
        part.attrs.clear()
    ds = xr.concat(parts, dim=dim, join="outer").assign_coords({dim: list(labels)})
    for key, values in swept_parameters(parameters).items():
        name = key if key not in ds.variables and key not in ds.dims else f"swept_{key}"
        ds = ds.assign_coords({name: (dim, np.asarray(values))})
        ds[name].attrs.update({"units": "as the notebook parameter", "long_name": f"swept notebook parameter {key}"})
    ds.attrs.update(attrs)
    return ds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainscale.model.sweep", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("chunk")
    c.add_argument("spec")
    c.add_argument("--chunk", type=int, required=True)
    c.add_argument("--chunks", type=int, required=True)
    c.add_argument("--out", required=True)
    g = sub.add_parser("gather")
    g.add_argument("spec")
    g.add_argument("--out", required=True)
    g.add_argument("parts", nargs="+")
    m = sub.add_parser("combine")
    m.add_argument("--out", required=True)
    m.add_argument("--dim", default="parameter_set")
    m.add_argument("--labels", nargs="+", required=True)
    m.add_argument("parts", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "combine":
            write_dataset(combine(args.parts, args.dim, args.labels), args.out)
            return 0
        text = args.spec if args.spec.lstrip().startswith("{") else Path(args.spec).read_text()
        spec = check_spec(json.loads(text))
        if args.command == "chunk":
            write_dataset(evaluate_units(spec, chunk_units(spec, args.chunk, args.chunks)), args.out)
        else:
            write(gather(spec, [read_dataset(p) for p in args.parts]), args.out)
    except SpecError as exc:
        print(f"trainscale sweep: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
