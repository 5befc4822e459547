"""Pipeline-parallel schedules: simulate, closed forms, a plain-Python reference and a Gantt chart.

:func:`simulate` runs the discrete-event simulator of :mod:`trainscale.kernels.pipeline` for one
pipeline and returns a :class:`PipelineResult` (makespan, bubble, idle time and peak activation
bytes per device, the full timeline); :func:`simulate_many` runs a batch of pipelines in
parallel and returns arrays. :func:`closed_form` gives the textbook makespans for uniform
stages and free transfers, which the simulator reproduces exactly. :func:`simulate_reference`
is an independent pure-Python simulator (Kahn's topological order over the op graph) that tests
and benchmarks compare the kernel against. :func:`gantt` draws a timeline.

Model (see the kernel module for details): ``S = p * v`` virtual stages, virtual stage ``k`` on
device ``k % p``; per-stage times per micro-batch ``fwd``, ``bwd`` (input gradient),
``wgrad`` (weight gradient; folded into the backward op except in ZB-H1), ``send[k]`` the
transfer of one micro-batch's activation (or its gradient) between virtual stages ``k`` and
``k+1``; transfers delay the consumer but occupy no device. Activation bytes ``act_bytes[k]``
are held from the start of a micro-batch's ``F`` to the end of its ``B`` on stage ``k``
(for ZB-H1 too: the paper frees the backward activations ``M_B`` at ``B``; see the kernel).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels import pipeline as K
from .specs import SpecError

__all__ = [
    "SCHEDULES",
    "PipelineBatch",
    "PipelineResult",
    "closed_form",
    "gantt",
    "reference_orders",
    "simulate",
    "simulate_many",
    "simulate_reference",
]

SCHEDULES = {"gpipe": K.GPIPE, "1f1b": K.ONE_F_ONE_B, "interleaved": K.INTERLEAVED, "zb-h1": K.ZB_H1}
OP_NAMES = ("F", "B", "W")


@dataclass(frozen=True)
class PipelineResult:
    """One simulated pipeline. Per-device arrays are indexed by device ``0..p-1``."""

    schedule: str
    devices: int
    interleave: int
    micro_batches: int
    makespan_s: float
    bubble_fraction: float  # 1 - sum(busy) / (p * makespan)
    busy_s: np.ndarray
    idle_s: np.ndarray  # makespan - busy
    peak_activation_bytes: np.ndarray
    timeline: Any  # pandas.DataFrame: device, stage, micro_batch, op ('F','B','W'), start_s, end_s


@dataclass(frozen=True)
class PipelineBatch:
    """A batch of simulated pipelines: leading axis ``batch``; per-device arrays ``[batch, p]``.

    With ``timeline=True`` the op table (``op_device``, ``op_stage``, ``op_micro_batch``,
    ``op_kind``; flat, each device's ops in its order, shared by the batch) and ``start_s``/
    ``end_s`` (``[batch, n_ops]``, rows aligned with the op table).
    """

    schedule: str
    devices: int
    interleave: int
    micro_batches: int
    makespan_s: np.ndarray
    bubble_fraction: np.ndarray
    busy_s: np.ndarray
    idle_s: np.ndarray
    peak_activation_bytes: np.ndarray
    op_device: np.ndarray | None = None
    op_stage: np.ndarray | None = None
    op_micro_batch: np.ndarray | None = None
    op_kind: np.ndarray | None = None
    start_s: np.ndarray | None = None
    end_s: np.ndarray | None = None

    @property
    def ops(self) -> int:
        """Operations (F, B and W passes) simulated per pipeline."""
        return self.devices * int(K.ops_per_device(SCHEDULES[self.schedule], self.interleave, self.micro_batches))


# --------------------------------------------------------------------------- validation

def _schedule_code(schedule: str) -> int:
    if schedule not in SCHEDULES:
        raise SpecError("schedule", schedule, f"expected one of {', '.join(SCHEDULES)}")
    return SCHEDULES[schedule]


def _check_shape(schedule: str, micro_batches, interleave) -> tuple[int, int]:
    for name, value in (("micro_batches", micro_batches), ("interleave", interleave)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise SpecError(name, value, "expected an integer >= 1")
    if schedule == "interleaved" and interleave < 2:
        raise SpecError("interleave", interleave, "the interleaved schedule needs >= 2 chunks per device "
                        "(use '1f1b' for one)")
    if schedule != "interleaved" and interleave != 1:
        raise SpecError("interleave", interleave, f"schedule {schedule!r} runs one chunk per device; "
                        "expected 1 (or use 'interleaved')")
    return int(micro_batches), int(interleave)


def _times(name: str, value, shape: tuple[int, ...], default: float | None) -> np.ndarray:
    if value is None:
        if default is None:
            raise SpecError(name, value, "it is required (an array of seconds)")
        return np.full(shape, default, dtype=np.float64)
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise SpecError(name, value, "expected an array of finite numbers >= 0") from None
    if arr.ndim == 0:
        arr = np.full(shape, float(arr))
    if arr.shape != shape:
        raise SpecError(name, arr.shape, f"expected shape {shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise SpecError(name, value, "expected finite numbers >= 0")
    return np.ascontiguousarray(arr)


def _prepare(schedule, fwd, bwd, wgrad, send, act_bytes, micro_batches, interleave, batch: bool):
    code = _schedule_code(schedule)
    m, v = _check_shape(schedule, micro_batches, interleave)
    f = np.asarray(fwd, dtype=np.float64) if fwd is not None else None
    want_ndim = 2 if batch else 1
    if f is None or f.ndim != want_ndim or f.shape[-1] < 1:
        raise SpecError("fwd", None if f is None else f.shape,
                        f"expected a {'[batch, stages]' if batch else '[stages]'} array with >= 1 stage")
    S = f.shape[-1]
    if S % v != 0:
        raise SpecError("fwd", f.shape, f"the number of virtual stages must be a multiple of interleave={v}")
    p = S // v
    if schedule == "interleaved" and m % p != 0:
        raise SpecError("micro_batches", m, f"the interleaved schedule needs a multiple of the {p} devices")
    lead = f.shape[:-1]
    fwd = _times("fwd", f, lead + (S,), None)
    bwd = _times("bwd", bwd, lead + (S,), None)
    wgrad = _times("wgrad", wgrad, lead + (S,), 0.0)
    send = _times("send", send, lead + (S - 1,), 0.0)
    act = _times("act_bytes", act_bytes, lead + (S,), 0.0)
    return code, p, v, m, fwd, bwd, wgrad, send, act


# --------------------------------------------------------------------------- API

def simulate(schedule: str, fwd, bwd, wgrad=None, send=None, act_bytes=None, *, micro_batches: int,
             interleave: int = 1) -> PipelineResult:
    """Simulate one pipeline.

    ``fwd``, ``bwd``, ``wgrad`` and ``act_bytes`` have one entry per virtual stage (``p *
    interleave`` of them), ``send`` one per boundary (``p * interleave - 1``); scalars broadcast,
    ``wgrad``, ``send`` and ``act_bytes`` default to 0. Times in seconds per micro-batch.
    """
    import pandas as pd

    code, p, v, m, fwd, bwd, wgrad, send, act = _prepare(schedule, fwd, bwd, wgrad, send, act_bytes,
                                                         micro_batches, interleave, batch=False)
    kind, stage, mb = K.build_orders(code, p, v, m)
    n = kind.shape[1]
    S = p * v
    busy = np.empty(p)
    peak = np.empty(p)
    start = np.empty((p, n))
    end = np.empty((p, n))
    status, makespan = K.simulate_one(
        code == K.ZB_H1, p, m, kind, stage, mb, fwd, bwd, wgrad, send, act,
        np.empty(S * m), np.empty(S * m), np.empty(p, np.int64), np.empty(p), np.empty(p),
        np.empty(p, np.bool_), np.empty(p, np.int64), busy, peak, start, end, True)
    if status != K.OK:  # cannot happen for the built-in orders
        raise RuntimeError(f"schedule {schedule!r} deadlocked (p={p}, v={v}, m={m})")
    timeline = pd.DataFrame({
        "device": np.repeat(np.arange(p), n),
        "stage": stage.ravel(),
        "micro_batch": mb.ravel(),
        "op": pd.Categorical.from_codes(kind.ravel(), categories=list(OP_NAMES)),
        "start_s": start.ravel(),
        "end_s": end.ravel(),
    })
    bubble = 1.0 - busy.sum() / (p * makespan) if makespan > 0 else 0.0
    return PipelineResult(schedule, p, v, m, float(makespan), float(bubble), busy, makespan - busy, peak,
                          timeline)


def simulate_many(schedule: str, fwd, bwd, wgrad=None, send=None, act_bytes=None, *, micro_batches: int,
                  interleave: int = 1, timeline: bool = False) -> PipelineBatch:
    """Simulate a batch of independent pipelines (ranges of the batch side by side in threads, as
    :func:`trainscale.kernels.pipeline.simulate_many`).

    ``fwd``, ``bwd``, ``wgrad``, ``act_bytes``: ``[batch, p * interleave]``; ``send``:
    ``[batch, p * interleave - 1]``; scalars broadcast. All share schedule, ``p``, ``interleave``
    and ``micro_batches``.
    """
    code, p, v, m, fwd, bwd, wgrad, send, act = _prepare(schedule, fwd, bwd, wgrad, send, act_bytes,
                                                         micro_batches, interleave, batch=True)
    nb = fwd.shape[0]
    n = int(K.ops_per_device(code, v, m))
    makespan = np.empty(nb)
    status = np.empty(nb, np.int64)
    busy = np.empty((nb, p))
    peak = np.empty((nb, p))
    if timeline:
        start, end = np.empty((nb, p, n)), np.empty((nb, p, n))
    else:
        start, end = np.empty((1, 1, 1)), np.empty((1, 1, 1))
    K.simulate_many(code, p, v, m, fwd, bwd, wgrad, send, act, makespan, status, busy, peak, start, end,
                    bool(timeline))
    if np.any(status != K.OK):
        raise RuntimeError(f"schedule {schedule!r} deadlocked (p={p}, v={v}, m={m})")
    with np.errstate(invalid="ignore", divide="ignore"):
        bubble = np.where(makespan > 0, 1.0 - busy.sum(axis=1) / (p * makespan), 0.0)
    extra = {}
    if timeline:
        kind, stage, mbs = K.build_orders(code, p, v, m)
        extra = {"op_device": np.repeat(np.arange(p), n), "op_stage": stage.ravel(), "op_micro_batch": mbs.ravel(),
                     "op_kind": kind.ravel(), "start_s": start.reshape(nb, p * n), "end_s": end.reshape(nb, p * n)}
    return PipelineBatch(schedule, p, v, m, makespan, bubble, busy, makespan[:, None] - busy, peak, **extra)


def closed_form(schedule: str, f: float, b: float, w: float, p: int, m: int, v: int = 1) -> float:
    """Textbook makespan for uniform stages and free transfers.

    ``f``, ``b``, ``w``: forward, input-gradient and weight-gradient time of one micro-batch on
    one device (for ``interleaved``, of all ``v`` chunks together, i.e. ``v`` x per chunk).

    * ``gpipe``, ``1f1b``: ``(m + p - 1)(f + b + w)``;
    * ``interleaved`` (``m`` a multiple of ``p``): ``m (f + b + w) + (p - 1)(f + b + w) / v``;
    * ``zb-h1``: ``m (f + b + w) + (p - 1)(f + b - w)`` (Qi et al. 2023, sec. 3.1: bubble
      ``(p-1)(T_F + T_B - T_W)``), exact when ``m >= p`` and ``w <= min(f, b)``: then the
      deferred ``W`` passes fit in the gaps they are meant to fill. Otherwise the simulated
      schedule is longer (e.g. ``p=2, m=2, f=1, b=0.5, w=0.8``: 5.6 vs 5.3) and this raises
      ``SpecError`` rather than return a number that is not a makespan.
    """
    _schedule_code(schedule)
    m, v = _check_shape(schedule, m, v)
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise SpecError("p", p, "expected an integer >= 1")
    for name, value in (("f", f), ("b", b), ("w", w)):
        if not math.isfinite(value) or value < 0:
            raise SpecError(name, value, "expected a finite number >= 0")
    t = f + b + w
    if schedule in ("gpipe", "1f1b"):
        return (m + p - 1) * t
    if schedule == "interleaved":
        if m % p != 0:
            raise SpecError("m", m, f"the interleaved schedule needs a multiple of p={p}")
        return m * t + (p - 1) * t / v
    if p > 1 and m < p:
        raise SpecError("m", m, f"the ZB-H1 closed form holds for m >= p = {p}")
    if p > 1 and w > min(f, b):
        raise SpecError("w", w, f"the ZB-H1 closed form holds for w <= min(f, b) = {min(f, b)}")
    return m * t + (p - 1) * (f + b - w)


# --------------------------------------------------------------------------- reference

def reference_orders(schedule: str, p: int, m: int, v: int = 1) -> list[list[tuple[str, int, int]]]:
    """Per-device op orders ``[(op, stage, micro_batch), ...]``, written in plain Python."""
    orders = []
    for d in range(p):
        ops: list[tuple[str, int, int]] = []
        if schedule == "gpipe":
            ops = [("F", d, i) for i in range(m)] + [("B", d, i) for i in reversed(range(m))]
        elif schedule == "1f1b":
            warm = min(p - d - 1, m)
            fq, bq = deque(range(m)), deque(range(m))
            ops = [("F", d, fq.popleft()) for _ in range(warm)]
            while fq:
                ops += [("F", d, fq.popleft()), ("B", d, bq.popleft())]
            ops += [("B", d, i) for i in bq]
        elif schedule == "interleaved":
            total = m * v

            def step(j, forward, d=d):
                chunk = (j // p) % v
                return (chunk if forward else v - 1 - chunk) * p + d, (j // (p * v)) * p + j % p

            warm = min(2 * (p - d - 1) + (v - 1) * p, total)
            ops = [("F", *step(j, True)) for j in range(warm)]
            for j in range(total - warm):
                ops += [("F", *step(warm + j, True)), ("B", *step(j, False))]
            ops += [("B", *step(j, False)) for j in range(total - warm, total)]
        elif schedule == "zb-h1":
            fq, bq, wq = deque(range(m)), deque(range(m)), deque(range(m))
            ops = [("F", d, fq.popleft()) for _ in range(min(p - d - 1, m))]
            for _ in range(d):
                if fq:
                    ops += [("F", d, fq.popleft()), ("B", d, bq.popleft())]
            while fq:
                ops += [("F", d, fq.popleft()), ("B", d, bq.popleft()), ("W", d, wq.popleft())]
            while bq:
                ops += [("B", d, bq.popleft()), ("W", d, wq.popleft())]
            ops += [("W", d, i) for i in wq]
        else:
            raise SpecError("schedule", schedule, f"expected one of {', '.join(SCHEDULES)}")
        orders.append(ops)
    return orders


def simulate_reference(schedule: str, fwd, bwd, wgrad=None, send=None, act_bytes=None, *, micro_batches: int,
                       interleave: int = 1) -> dict:
    """Pure-Python simulator, independent of the kernel: builds the op graph (device-order edges
    and data edges with their transfer delays) and times it in Kahn's topological order.

    Returns ``makespan_s``, ``busy_s``, ``peak_activation_bytes`` (lists per device) and
    ``timeline``: a list of ``(device, stage, micro_batch, op, start_s, end_s)`` in each
    device's order, device by device. Raises ``RuntimeError`` on a cyclic (deadlocking) order.
    """
    v = interleave
    fwd = [float(x) for x in fwd]
    bwd = [float(x) for x in bwd]
    S = len(fwd)
    p = S // v
    m = micro_batches
    wgrad = [0.0] * S if wgrad is None else [float(x) for x in wgrad]
    send = [0.0] * (S - 1) if send is None else [float(x) for x in send]
    act = [0.0] * S if act_bytes is None else [float(x) for x in act_bytes]
    split = schedule == "zb-h1"
    orders = reference_orders(schedule, p, m, v)

    def duration(op, k):
        if op == "F":
            return fwd[k]
        if op == "B":
            return bwd[k] if split else bwd[k] + wgrad[k]
        return wgrad[k]

    # predecessors of each op: (op, delay); successors for Kahn's algorithm
    preds: dict[tuple, list] = {}
    for d, ops in enumerate(orders):
        for j, node in enumerate(ops):
            op, k, i = node
            pr = [(ops[j - 1], 0.0)] if j > 0 else []
            if op == "F" and k > 0:
                pr.append((("F", k - 1, i), send[k - 1]))
            elif op == "B":
                pr.append((("F", k, i), 0.0) if k == S - 1 else (("B", k + 1, i), send[k]))
            elif op == "W":
                pr.append((("B", k, i), 0.0))
            preds[node] = pr
    succs: dict[tuple, list] = {node: [] for node in preds}
    missing = {node: len(pr) for node, pr in preds.items()}
    for node, pr in preds.items():
        for q, _ in pr:
            succs[q].append(node)
    ready = deque(node for node, c in missing.items() if c == 0)
    start: dict[tuple, float] = {}
    end: dict[tuple, float] = {}
    while ready:
        node = ready.popleft()
        s = 0.0
        for q, delay in preds[node]:
            s = max(s, end[q] + delay)
        start[node] = s
        end[node] = s + duration(node[0], node[1])
        for nxt in succs[node]:
            missing[nxt] -= 1
            if missing[nxt] == 0:
                ready.append(nxt)
    if len(end) != len(preds):
        raise RuntimeError(f"schedule {schedule!r} deadlocks")
    busy, peak, timeline = [], [], []
    for d, ops in enumerate(orders):
        total, held, top = 0.0, 0.0, 0.0
        for node in ops:
            op, k, i = node
            total += duration(op, k)
            if op == "F":
                held += act[k]
                top = max(top, held)
            elif op == "B":
                held -= act[k]
            timeline.append((d, k, i, op, start[node], end[node]))
        busy.append(total)
        peak.append(top)
    makespan = max(end.values()) if end else 0.0
    return {"makespan_s": makespan, "busy_s": busy, "peak_activation_bytes": peak, "timeline": timeline}


# --------------------------------------------------------------------------- plotting

GANTT_COLORS = {"F": "#0072B2", "B": "#E69F00", "W": "#009E73"}


def gantt(result: PipelineResult, ax=None, labels: bool = True):
    """Draw ``result``'s timeline as a Gantt chart (one row per device, F/B/W colours, micro-batch
    labels when ``labels``); returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.45 * result.devices + 1.2))
    tl = result.timeline
    for (device, op), rows in tl.groupby(["device", "op"], observed=True):
        spans = list(zip(rows["start_s"], rows["end_s"] - rows["start_s"]))
        ax.broken_barh(spans, (device - 0.4, 0.8), facecolors=GANTT_COLORS[op], edgecolor="white",
                       linewidth=0.5)
    if labels:
        width = result.makespan_s
        for row in tl.itertuples(index=False):
            if (row.end_s - row.start_s) > 0.012 * width:
                text = str(row.micro_batch)
                if result.interleave > 1:
                    text += f".{row.stage // result.devices}"
                ax.text((row.start_s + row.end_s) / 2, row.device, text, ha="center", va="center",
                        fontsize=6, color="white")
    ax.set_yticks(range(result.devices))
    ax.set_yticklabels([f"device {d}" for d in range(result.devices)])
    ax.set_ylim(result.devices - 0.5, -0.5)
    ax.set_xlim(0, result.makespan_s)
    ax.set_xlabel("time [s]")
    ax.set_title(f"{result.schedule}: p={result.devices}, m={result.micro_batches}"
                 + (f", v={result.interleave}" if result.interleave > 1 else "")
                 + f", bubble {100 * result.bubble_fraction:.1f}%")
    used = [op for op in OP_NAMES if (tl["op"] == op).any()]
    ax.legend(handles=[Patch(color=GANTT_COLORS[o], label=o) for o in used], loc="upper right", ncols=len(used))
    return ax
