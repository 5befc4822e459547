"""How far a plan lies from what was measured (issue 38 item 4): the nearest measured run and the best measured MFU.

A plan's *distance* from the validated runs is measured against the runs of its own stack and GPU generation
(:func:`trainscale.model.validation.measured_runs`, those whose dataset has a stored left-out error):

- ``knobs_differing``: the mechanisms (:data:`MECHANISMS`: ZeRO stage, recomputation, flash attention,
  sequence parallelism, TP overlap, overlapped gradient reduction, pipelining, interleaving, context and
  expert parallelism, tensor parallelism across nodes, hybrid sharding, per-tensor ZeRO-3 fetches, torch.compile,
  the precision of the linear layers)
  in which the plan differs from the nearest run, each as ``[plan's, run's]``: each one is a formula of
  the model the run did not test in that combination;
- ``model_size_ratio`` and ``gpus_ratio``: the plan's parameters and GPUs over the run's.

The nearest run has the fewest differing mechanisms, then the smallest ``|log size ratio| + |log gpus ratio|``.
``left_out_error`` is the MAPE of the nearest run's dataset when that dataset is left out of the fit
(``trainscale calibrate --cv``, stored in calibration_fitted.yaml): how wrong the model was on runs like it
that it had not seen. ``best_measured_mfu`` is the highest MFU measured on the plan's generation over all
the measured runs of the plan's precision (any stack; each run's measured step and its model FLOPs as the model
counts them, over the BF16 peak as the plan's predicted ``mfu`` is, so an FP8 run, whose MFU so counted can pass
80% on H100, is compared only with FP8 plans); ``above_best_measured`` flags a plan predicted above it by
more than ``left_out_error`` (``mfu > best * (1 + error)``): an optimum no measurement supports.
``best_measured_mfu_stack`` and ``above_best_measured_stack`` do the same with the runs of the plan's stack
on that generation only (of its precision too).

Both need the measured runs of the plan's generation only, each predicted once for its MFU
(:func:`measured_table`): seconds for the ~1,600 Ampere runs, so the rows are kept on disk next to Numba's
cache, under a hash of the data files, the package's source and its version (:func:`table_key`), and a
new process reads them back instead of predicting them again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Mapping

import numpy as np

from .specs import PlanSpec, SystemSpec


def _shard(plan: PlanSpec) -> bool:
    return plan.zero > 0 and plan.shard_group not in (0, plan.dp)


MECHANISMS = {
    "zero": lambda p, s: p.zero,
    "recompute": lambda p, s: p.recompute,
    "flash_attention": lambda p, s: p.flash_attention,
    "sequence_parallel": lambda p, s: p.sequence_parallel and p.tp > 1,
    "tp_comm_overlap": lambda p, s: p.tp_comm_overlap and p.sequence_parallel and p.tp > 1,
    "overlap_grad_reduce": lambda p, s: p.overlap_grad_reduce,
    "pipelined": lambda p, s: p.pp > 1,
    "interleaved": lambda p, s: p.interleave > 1,
    "context_parallel": lambda p, s: p.cp > 1,
    "expert_parallel": lambda p, s: p.ep > 1,
    "tp_across_nodes": lambda p, s: p.tp > s.gpus_per_node,
    "hybrid_shard": lambda p, s: _shard(p),
    "zero3_per_tensor": lambda p, s: p.zero3_per_tensor and p.zero == 3,
    "compiled": lambda p, s: p.compiled,
    "precision": lambda p, s: p.precision,
}


def mechanisms(plan: PlanSpec, system: SystemSpec) -> dict:
    """The plan's value of each mechanism of :data:`MECHANISMS`."""
    return {name: f(plan, system) for name, f in MECHANISMS.items()}


def measured_mfu(m) -> float:
    """The MFU a measured run reached: its measured step (from the metric it was published in) and the
    model FLOPs of its plan as the model counts them (those of the predicted ``mfu``)."""
    from .perfmodel import predict

    p = predict(m.run, pipeline_simulation=False)
    model_flops = p.model_tflops_per_gpu * 1e12 * p.step_time_s
    tokens = m.run.plan.global_batch * m.run.model.seq_len
    step = {"step_time_s": lambda: m.measured,
            "model_tflops_per_gpu": lambda: model_flops / (m.measured * 1e12),
            "hardware_tflops_per_gpu": lambda: p.hardware_tflops_per_gpu * p.step_time_s / m.measured,
            "tokens_per_s_per_gpu": lambda: tokens / m.run.gpus / m.measured}[m.metric]()
    return model_flops / step / m.run.system.peak_flops_bf16


TABLE_FIELDS = ("id", "dataset", "stack", "generation", "mechanisms", "params", "gpus", "mfu", "left_out_error")
# bump when the rows' form or how they are computed changes in a way the hashed files do not show
TABLE_FORMAT = 2  # 2: the precision among the mechanisms


def _table_rows(runs, errors) -> list[dict]:
    return [{"id": m.run.id, "dataset": m.dataset, "stack": m.run.plan.stack,
             "generation": m.run.system.generation, "mechanisms": mechanisms(m.run.plan, m.run.system),
             "params": m.run.model.params(), "gpus": m.run.gpus, "mfu": measured_mfu(m),
             "left_out_error": float(err)} for m, err in zip(runs, errors)]


def _compute_table(generation: str | None) -> list[dict]:
    """The rows of :func:`measured_table`, predicted here (only those of ``generation`` if given)."""
    from . import validation

    runs = validation.measured_runs(validation.vtrain_dir(), include_vtrain_single=True)
    if generation is not None:
        runs = [m for m in runs if m.run.system.generation == generation]
    return _table_rows(runs, validation.left_out_mape([m.dataset for m in runs]))


@functools.lru_cache(maxsize=None)
def table_key() -> str:
    """What the measured table depends on, hashed: the package version, :data:`TABLE_FORMAT`, every file of
    ``trainscale/data`` (calibration, fitted calibration with its left-out errors, catalogs, measured runs,
    vTrain's) and the package's Python source (the model that predicts each run; an editable install changes it
    without a new version)."""
    from .. import __version__

    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(f"{__version__} {TABLE_FORMAT}".encode())
    files = sorted(p for p in package.rglob("*") if p.is_file() and (p.suffix == ".py" or "data" in
                                                                        p.relative_to(package).parts[:1]))
    for path in files:
        digest.update(str(path.relative_to(package)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def table_cache_dir() -> Path:
    """Where the measured table is kept between processes: in Numba's cache folder, the one
    :mod:`trainscale.kernels` chooses (under ``NUMBA_CACHE_DIR``, else the checkout's ``.numba_cache``, else the
    user's cache folder)."""
    import numba

    from .. import kernels  # noqa: F401  (sets numba.config.CACHE_DIR)

    return Path(numba.config.CACHE_DIR)


def _table_path(generation: str | None) -> Path:
    return table_cache_dir() / f"trainscale-measured-table-{generation or 'all'}-{table_key()}.json"


def _read_table(path: Path, generation: str | None) -> list[dict] | None:
    """The cached rows at ``path``, or None where there are none or they are not this table's (corrupt, partial,
    of another key or form)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        rows = data["rows"]
        ok = (data["key"] == table_key() and data["generation"] == generation and isinstance(rows, list)
              and all(isinstance(r, dict) and tuple(r) == TABLE_FIELDS and tuple(r["mechanisms"]) == tuple(MECHANISMS)
                      for r in rows))
        return rows if ok else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_table(path: Path, generation: str | None, rows: list[dict]) -> None:
    """Write the rows atomically (a temporary file renamed over ``path``) and remove this generation's tables of
    other keys; a folder that cannot be written is left as it is (the table is then computed per process)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.",
                                         suffix=".tmp", delete=False) as fh:
            tmp = fh.name
            json.dump({"key": table_key(), "generation": generation, "rows": rows}, fh)
        os.replace(tmp, path)
        tmp = None
        for old in path.parent.glob(f"trainscale-measured-table-{generation or 'all'}-*.json"):
            if old != path:
                old.unlink(missing_ok=True)
    except (OSError, TypeError, ValueError):  # unwritable folder, a value JSON does not hold: not cached
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@functools.lru_cache(maxsize=None)
def measured_table(generation: str | None = None, use_cache: bool = True) -> tuple[dict, ...]:
    """Every measured run (vTrain's single-node runs included; only those on ``generation`` if given) with its
    stack, generation, mechanisms, size, GPUs, measured MFU and its dataset's left-out MAPE (NaN where the
    dataset is not fitted), in :func:`trainscale.model.validation.measured_runs`' order.

    Predicting every run takes seconds, so the rows are kept on disk (:func:`table_cache_dir`, one JSON file per
    generation named by :func:`table_key`) and read back by later processes; a missing, corrupt or stale file
    is recomputed and rewritten. ``use_cache=False`` computes them here and touches no file."""
    if not use_cache:
        return tuple(_compute_table(generation))
    path = _table_path(generation)
    rows = _read_table(path, generation)
    if rows is None:
        rows = _compute_table(generation)
        _write_table(path, generation, rows)
    return tuple(rows)


def best_measured_mfu(generation: str, stack: str | None = None, precision: str | None = None
                      ) -> tuple[float, str] | None:
    """The highest measured MFU on ``generation`` (of ``stack``'s runs only, and of ``precision``'s, if given)
    and the run that reached it (None: nothing measured)."""
    rows = [r for r in measured_table(generation) if stack in (None, r["stack"])
            and precision in (None, r["mechanisms"]["precision"])]
    if not rows:
        return None
    best = max(rows, key=lambda r: r["mfu"])
    return best["mfu"], best["id"]


def _distance(row: Mapping, mech: Mapping, params: int, gpus: int) -> tuple:
    differing = {k: [mech[k], row["mechanisms"][k]] for k in mech if mech[k] != row["mechanisms"][k]}
    spread = abs(math.log(params / row["params"])) + abs(math.log(gpus / row["gpus"]))
    return len(differing), spread, differing


def nearest_run(model, system: SystemSpec, plan: PlanSpec) -> dict | None:
    """The nearest measured run of the plan's stack and generation with a stored left-out error (module
    docstring), or None where there is none."""
    mech = mechanisms(plan, system)
    rows = [r for r in measured_table(system.generation) if r["stack"] == plan.stack
            and np.isfinite(r["left_out_error"])]
    if not rows:
        return None
    scored = [(_distance(r, mech, model.params(), plan.gpus), i) for i, r in enumerate(rows)]
    (count, _, differing), i = min(scored, key=lambda t: (t[0][0], t[0][1], t[1]))
    row = rows[i]
    return {"run": row["id"], "dataset": row["dataset"], "knobs_differing": differing,
            "model_size_ratio": model.params() / row["params"], "gpus_ratio": plan.gpus / row["gpus"],
            "left_out_error": row["left_out_error"]}


def plan_confidence(model, system: SystemSpec, plan: PlanSpec, mfu: float) -> dict:
    """The confidence fields of a plan predicted at ``mfu`` (module docstring)."""
    near = nearest_run(model, system, plan)
    best = best_measured_mfu(system.generation, precision=plan.precision)
    best_stack = best_measured_mfu(system.generation, plan.stack, plan.precision)
    out = {"nearest_measured_run": near["run"] if near else None,
           "nearest_dataset": near["dataset"] if near else None,
           "knobs_differing": near["knobs_differing"] if near else None,
           "model_size_ratio": near["model_size_ratio"] if near else None,
           "gpus_ratio": near["gpus_ratio"] if near else None,
           "left_out_error": near["left_out_error"] if near else None,
           "best_measured_mfu": best[0] if best else None,
           "best_measured_run": best[1] if best else None}
    error = near["left_out_error"] if near else None
    out.update(best_measured_mfu_stack=best_stack[0] if best_stack else None,
               best_measured_run_stack=best_stack[1] if best_stack else None)
    for key, ref in (("above_best_measured", best), ("above_best_measured_stack", best_stack)):
        out[key] = None if ref is None or error is None else bool(mfu > ref[0] * (1.0 + error))
    return out


def confidence_text(conf: Mapping) -> str:
    """The table's ``validated`` column: ``3 knobs, 1x size, 2x gpus, 4.8% err`` (distance from the nearest
    measured run of the stack and generation, and that dataset's left-out error)."""
    if conf.get("nearest_measured_run") is None:
        return "no run of this stack+gen"
    return (f"{len(conf['knobs_differing'])} knobs, {conf['model_size_ratio']:.2g}x size, "
            f"{conf['gpus_ratio']:.2g}x gpus, {100 * conf['left_out_error']:.1f}% err")


def above_text(conf: Mapping) -> str:
    """The table's ``above best`` column: which best measured MFU the plan's exceeds by more than the error
    (``gen 67%``: its generation's, any stack; ``stack 56%``: its stack's on that generation), or ``-``."""
    parts = [f"{name} {100 * conf[best]:.0f}%" for name, flag, best in
             (("gen", "above_best_measured", "best_measured_mfu"),
              ("stack", "above_best_measured_stack", "best_measured_mfu_stack")) if conf.get(flag)]
    return ", ".join(parts) or "-"


__all__ = ["MECHANISMS", "mechanisms", "measured_mfu", "measured_table", "table_key", "table_cache_dir", "best_measured_mfu", "nearest_run",
           "plan_confidence", "confidence_text", "above_text"]
