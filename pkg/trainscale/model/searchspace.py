"""The search's plan space: priced sparsely, ranked, and folded into distinct answers.

A search space is the dense grid of :func:`trainscale.model.perfmodel.evaluate_grid` (one list of values per plan
axis), but :func:`price_space` visits only its structurally valid *layouts* (tp, pp, cp, interleave,
micro_batch: the grid's five leading axes) and prices every knob combination of those
(:func:`trainscale.kernels.grid.evaluate_layouts`, the same per-plan kernel as the dense grid). A space with
every micro-batch that divides the global batch and every interleave depth that divides the layers is mostly
invalid layouts; they are counted by reason, never priced, and nothing is stored per plan but its step time,
memory and reason (20 bytes instead of the dense grid's 288).

:func:`fold_equal_plans` folds plans that are the same answer: equal predicted step time and memory (to
``FOLD_REL_TOL``) on the same layout, differing only in ``FOLD_KNOBS`` (recompute none and selective under
flash attention, ZeRO stages and shard groups that the model prices alike).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping

import numpy as np
import xarray as xr

from ..common import jitaside
from ..kernels import layout as K
from ..kernels.grid import evaluate_layouts, invalid_plan_counts, layer_cost_table, layout_reasons, scan_layouts
from .grid import BOOLEAN_AXES, EXPERT_AXES, GRID_AXES, _axis, canonical_plan, expert_axes, expert_pairs
from .vectors import GiB, model_vector, system_vector
from .specs import SpecError

LAYOUT_AXES = GRID_AXES[:5]  # tp, pp, cp, interleave, micro_batch: what decides whether a plan is valid
FOLD_KNOBS = ("recompute", "sequence_parallel", "zero", "shard_group", "overlap_grad_reduce", "flash_attention",
              "zero3_per_tensor", "tp_comm_overlap", "etp")
FOLD_REL_TOL = 1e-12  # two plans fold only when step time and memory agree to this relative tolerance
AXIS_DEFAULTS = {"recompute": ["full"], "zero": [0], "shard_group": [0], **{name: [0] for name in BOOLEAN_AXES}}


def space_values(space: Mapping) -> dict:
    """Every axis of a space (``GRID_AXES``, then ``ep`` and ``etp`` if present) with its values, defaults filled
    in; an unknown axis is refused naming the valid ones."""
    unknown = set(space) - set(GRID_AXES) - set(EXPERT_AXES)
    if unknown:
        name = sorted(unknown)[0]
        raise SpecError(name, space[name], f"unknown grid axis; valid axes: {', '.join(GRID_AXES + EXPERT_AXES)}")
    names = GRID_AXES + expert_axes(space)
    return {name: list(space.get(name, AXIS_DEFAULTS.get(name, [1]))) for name in names}


def space_size(space: Mapping) -> int:
    """Plans in a space: the product of its axis lengths (defaults filled in)."""
    return int(np.prod([len(v) for v in space_values(space).values()], dtype=np.int64))


class _Plans:
    """Decoding of the flat index of a priced plan (layout first, then the knob axes in C order)."""

    @property
    def knob_axes(self) -> tuple:
        return tuple(self.values)[len(LAYOUT_AXES):]

    @property
    def knob_shape(self) -> tuple:
        return tuple(len(self.values[name]) for name in self.knob_axes)

    @property
    def size(self) -> int:
        return int(self.plans_by_reason.sum())

    def plan(self, index: int) -> dict:
        """The plan at flat index ``index`` of the priced plans, as :func:`trainscale.model.perfmodel.rank` gives it."""
        n_knob = int(np.prod(self.knob_shape, dtype=np.int64))
        layout, knob = divmod(int(index), n_knob)
        plan = {name: self.values[name][self.layouts[layout, i]] for i, name in enumerate(LAYOUT_AXES)}
        for name, i in zip(self.knob_axes, np.unravel_index(knob, self.knob_shape)):
            plan[name] = self.values[name][int(i)]
        plan = {name: (v.item() if hasattr(v, "item") else v) for name, v in plan.items()}
        plan["dp"] = int(self.dp[layout])
        for key in BOOLEAN_AXES:
            plan[key] = bool(plan[key])
        return plan


@dataclass
class SpacePrices(_Plans):
    """A priced space: ``values`` (axis -> values), the valid ``layouts[n, 5]`` (values of ``LAYOUT_AXES``)
    with their ``dp``, and per plan of those layouts (layout first, then the knob axes in C order)
    ``step_s``, ``mem_bytes`` and ``reason``; ``plans_by_reason[r]`` counts the whole space's plans by reason."""

    values: dict
    layouts: np.ndarray
    dp: np.ndarray
    step_s: np.ndarray
    mem_bytes: np.ndarray
    reason: np.ndarray
    plans_by_reason: np.ndarray
    plans_by_rule: dict = field(default_factory=dict)

    @property
    def feasible(self) -> np.ndarray:
        return np.flatnonzero((self.reason == K.R_OK) & np.isfinite(self.step_s))

    @property
    def plans_priced(self) -> int:
        return int(self.reason.size)

    @property
    def plans_feasible(self) -> int:
        return int(self.feasible.size)

    def ranked(self) -> Iterator[tuple[int, float, float]]:
        """``(flat index, step time, memory bytes)`` of the feasible plans, fastest first by the closed form
        (ties in the dense grid's order)."""
        flat = self.feasible
        order = flat[np.argsort(self.step_s[flat], kind="stable")]
        for index in order:
            yield int(index), float(self.step_s[index]), float(self.mem_bytes[index])


def price_space(model, system, calib: np.ndarray, gpus: int, global_batch: int, space: Mapping,
                split_ends: int = 0, stack_rules: str | None = None, fixed: Mapping | None = None) -> SpacePrices:
    """Price every structurally valid plan of ``space`` (resolved ``model``/``system``, calibration vector);
    ``split_ends`` the pipeline split of every pipelined plan (:func:`trainscale.kernels.pipesplit.split_reason`).
    ``stack_rules`` (a stack name; None: none) masks the priced plans that stack does not run
    (:mod:`trainscale.model.stackrules`, reason ``R_STACK_RULE``; ``fixed``: the search-wide plan fields such as
    ``compiled``), counted per rule in ``plans_by_rule``. Keeps every priced plan's step time, memory and reason;
    the search itself needs none of them (:func:`scan_space`)."""
    sp = _Space(model, system, calib, gpus, global_batch, space, split_ends)
    step_s, mem_bytes, reason = _price_layouts(sp.mvec, sp.svec, calib, gpus, global_batch, sp.layout_values,
                                               sp.knobs, sp.ends)
    counts = sp.invalid_counts()
    by_rule = {}
    if stack_rules is not None:
        by_rule = _mask_stack_rules(reason, sp.values, sp.layout_values, sp.dps, stack_rules, system, fixed or {})
    counts += np.bincount(reason, minlength=len(K.REASONS))
    return SpacePrices(sp.values, sp.layouts, sp.dps, step_s, mem_bytes, reason, counts, by_rule)


def _knob_arrays(arrays: Mapping) -> list:
    """The kernels' knob arrays: the grid's knob axes, then the expert layout as (ep, etp) pairs."""
    return [arrays[n] for n in GRID_AXES[len(LAYOUT_AXES):]] + list(expert_pairs(arrays))


class _Space:
    """A space's valid layouts and knob arrays, as the kernels take them."""

    def __init__(self, model, system, calib, gpus, global_batch, space, split_ends):
        self.values = values = space_values(space)
        self.arrays = arrays = {name: _axis(vals, name) for name, vals in values.items()}
        self.mvec, self.svec = model_vector(model), system_vector(system)
        self.gpus, self.global_batch = int(gpus), int(global_batch)
        self.even_split = bool(calib[K.C_EVEN_SPLIT] > 0.0)
        self.ends = int(split_ends)
        reasons, dps = layout_reasons(self.mvec, self.gpus, self.global_batch, *(arrays[n] for n in LAYOUT_AXES),
                                      self.even_split, self.ends)
        self.knobs = _knob_arrays(arrays)
        self.valid = reasons == K.R_OK
        self.layouts = _layout_indices(values, self.valid)
        self.layout_values = _layout_values(arrays, self.layouts)
        self.dps = dps[self.valid]
        self.n_knob = int(np.prod([len(values[n]) for n in tuple(values)[len(LAYOUT_AXES):]], dtype=np.int64))

    def invalid_counts(self) -> np.ndarray:
        """Plans of the invalid layouts by reason (``[len(REASONS)]``)."""
        shard_v, ep_v, etp_v = self.knobs[3], self.knobs[-2], self.knobs[-1]
        other_knobs = self.n_knob // (shard_v.shape[0] * ep_v.shape[0])
        return other_knobs * invalid_plan_counts(self.mvec, self.gpus, self.global_batch,
                                                 _layout_values(self.arrays, _layout_indices(self.values, ~self.valid)),
                                                 shard_v, ep_v, etp_v, self.even_split, len(K.REASONS), self.ends)


def _rule_fields(values: Mapping, layout_values: np.ndarray, dps: np.ndarray, fixed: Mapping) -> tuple[dict, tuple]:
    """The plan fields of the priced plans as arrays broadcast over ``[layout, *knob axes]``, and that shape."""
    knob_axes = tuple(values)[len(LAYOUT_AXES):]
    ndim = 1 + len(knob_axes)
    fields = {name: layout_values[:, i].reshape((-1,) + (1,) * (ndim - 1)) for i, name in enumerate(LAYOUT_AXES)}
    fields["dp"] = dps.reshape((-1,) + (1,) * (ndim - 1))
    for axis, name in enumerate(knob_axes, start=1):
        shape = [1] * ndim
        shape[axis] = len(values[name])
        fields[name] = np.asarray(values[name]).reshape(shape)
    fields.update({k: v for k, v in fixed.items() if k not in fields})
    return fields, (layout_values.shape[0],) + tuple(len(values[n]) for n in knob_axes)


def _mask_stack_rules(reason: np.ndarray, values: Mapping, layout_values: np.ndarray, dps: np.ndarray, stack: str,
                      system, fixed: Mapping) -> dict:
    """Set ``R_STACK_RULE`` (in place) on the valid priced plans the stack does not run; plans per rule.
    Each field is an array broadcast over ``[layout, *knob axes]``: no per-plan Python."""
    from .stackrules import broken_mask

    fields, shape = _rule_fields(values, layout_values, dps, fixed)
    view = reason.reshape(shape)
    eligible = (view == K.R_OK) | (view == K.R_MEMORY)
    broken, by_rule = broken_mask(stack, fields, system, eligible)
    view[broken] = K.R_STACK_RULE
    return by_rule


def _stack_rule_ids(values: Mapping, layout_values: np.ndarray, dps: np.ndarray, stack: str, system,
                    fixed: Mapping) -> tuple[np.ndarray, list]:
    """Per priced plan (flat, int8) the first rule of ``stack`` it breaks, 1-based (0: none), and the rules' ids:
    what :func:`_mask_stack_rules` applies, before the kernel knows which plans are eligible."""
    from .stackrules import effective_fields, rule_broken, rules

    fields, shape = _rule_fields(values, layout_values, dps, fixed)
    fields = effective_fields(fields)
    stack_rules = rules()[stack]
    assert len(stack_rules) < 127
    ids = np.zeros(shape, dtype=np.int8)
    for r, rule in enumerate(stack_rules, start=1):
        hit = np.broadcast_to(rule_broken(rule, fields, system), shape)
        ids[hit & (ids == 0)] = r
    return ids.reshape(-1), [rule.id for rule in stack_rules]


def _layout_indices(values: Mapping, mask: np.ndarray) -> np.ndarray:
    """Per-axis value indices ``[n, 5]`` of the layouts where ``mask`` (over the C-order layout product) holds."""
    shape = tuple(len(values[n]) for n in LAYOUT_AXES)
    return np.stack(np.unravel_index(np.flatnonzero(mask), shape), axis=1).astype(np.int64).reshape(-1, 5)


def _layout_values(arrays: Mapping, layouts: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.stack([arrays[n][layouts[:, i]] for i, n in enumerate(LAYOUT_AXES)], axis=1),
                                dtype=np.int64)


def _layer_table(sp: "_Space", calib: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Layer costs once per distinct (tp, cp, micro_batch) of the valid layouts: ``(layout_key, table)``."""
    rc_v, sp_v, _, _, _, flash_v, _, tpo_v, ep_v, etp_v = sp.knobs
    keys, layout_key = np.unique(sp.layout_values[:, [0, 2, 4]], axis=0, return_inverse=True)
    table = layer_cost_table(sp.mvec, sp.svec, calib, np.ascontiguousarray(keys, dtype=np.int64), rc_v, sp_v, flash_v,
                             tpo_v, ep_v, etp_v)
    return np.ascontiguousarray(layout_key.ravel(), dtype=np.int64), table


def _price_layouts(mvec, svec, calib, gpus, global_batch, layout_values, knobs, ends=0):
    """The kernels' calls: layer costs once per distinct (tp, cp, micro_batch), then every plan."""
    rc_v, sp_v, zero_v, shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v, etp_v = knobs
    keys, layout_key = np.unique(layout_values[:, [0, 2, 4]], axis=0, return_inverse=True)
    table = layer_cost_table(mvec, svec, calib, np.ascontiguousarray(keys, dtype=np.int64), rc_v, sp_v, flash_v,
                             tpo_v, ep_v, etp_v)
    return evaluate_layouts(mvec, svec, calib, int(gpus), int(global_batch),
                            np.ascontiguousarray(layout_values, dtype=np.int64),
                            np.ascontiguousarray(layout_key.ravel(), dtype=np.int64), table, rc_v, sp_v, zero_v,
                            shard_v, ovl_v, flash_v, tensor_v, tpo_v, ep_v, etp_v, ends)


# feasible plans the search's first pass keeps (fastest by the closed form); a search that needs more (many
# spellings of one plan, folds) gets the next ones from another pass, CANDIDATE_GROWTH times as many
CANDIDATES = 2048
CANDIDATE_GROWTH = 8


@dataclass
class SpaceScan(_Plans):
    """A space scanned in one pass (:func:`scan_space`): counts, and the fastest feasible plans by the closed form.

    ``values``, ``layouts``, ``dp`` as :class:`SpacePrices`; ``plans_by_reason``, ``plans_by_rule``,
    ``plans_priced`` and ``plans_feasible`` count the space; ``top`` holds ``(step_s, index, mem_bytes)`` of the
    ``k`` feasible plans of smallest (closed-form step time, flat index), in that order; ``rescan(step, index, k)``
    gives the next ``k`` after a plan the same way (another pass). No per-plan array is kept."""

    values: dict
    layouts: np.ndarray
    dp: np.ndarray
    plans_by_reason: np.ndarray
    plans_by_rule: dict
    plans_priced: int
    plans_feasible: int
    top: tuple
    k: int
    rescan: object = field(repr=False)

    def ranked(self) -> Iterator[tuple[int, float, float]]:
        """``(flat index, step time, memory bytes)`` of the feasible plans, fastest first by the closed form
        (ties in the dense grid's order), as :meth:`SpacePrices.ranked`; passes again for more when the kept
        ones run out."""
        step, index, mem = self.top
        k = self.k
        while True:
            for i in range(step.size):
                yield int(index[i]), float(step[i]), float(mem[i])
            if step.size < k:
                return
            k *= CANDIDATE_GROWTH
            step, index, mem = self.rescan(float(step[-1]), int(index[-1]), k)


def scan_threads() -> int:
    """Threads of :func:`scan_space`: Numba's thread count (``NUMBA_NUM_THREADS``, default the CPUs)."""
    import numba

    return max(1, int(numba.get_num_threads()))


def _compile_plan_pricing(model, system, calib: np.ndarray, sp: "_Space") -> None:
    """Compile (or load) what :func:`trainscale.model.perfmodel.predict` prices a plan with: the closed form on the
    space's first valid layout, and the pipeline simulator on a two-stage pipeline of two micro-batches."""
    from . import pipeline
    from .vectors import plan_vector
    from .specs import PlanSpec

    pipeline.simulate_many("1f1b", np.ones((1, 2)), np.ones((1, 2)), send=np.zeros((1, 1)), micro_batches=2)
    if sp.layout_values.shape[0]:
        tp, pp, cp, interleave, micro_batch = (int(x) for x in sp.layout_values[0])
        try:
            plan = PlanSpec(tp=tp, pp=pp, dp=int(sp.dps[0]), cp=cp, interleave=interleave, micro_batch=micro_batch,
                            global_batch=sp.global_batch, recompute="full", flash_attention=True)
            plan_vector(model, system, plan, calib)
        except (SpecError, ValueError):  # a plan the closed form refuses: it compiles at the first real one
            pass


def scan_space(model, system, calib: np.ndarray, gpus: int, global_batch: int, space: Mapping,
               split_ends: int = 0, stack_rules: str | None = None, fixed: Mapping | None = None,
               k: int = CANDIDATES, threads: int | None = None) -> SpaceScan:
    """The search's pass over ``space`` (arguments as :func:`price_space`): the same plans priced by the same
    kernels, the same counts, but nothing kept per plan (but the int8 stack rule each breaks), only the ``k``
    fastest feasible plans (:func:`trainscale.kernels.grid.scan_layouts`; a plan is timed only if it fits and the
    stack runs it). ``threads`` (default :func:`scan_threads`) chunks of the layouts run side by side (the kernel
    releases the GIL); counts and candidates are merged, the same for any thread count."""
    from concurrent.futures import ThreadPoolExecutor

    n_chunks = max(1, int(threads or scan_threads()))
    # from an empty cache, the one pass compiles in a second process while this one finds the valid layouts and
    # prices their layers (placeholders of the arguments' types: the layouts, table and rule ids come next)
    arrays = {name: _axis(vals, name) for name, vals in space_values(space).items()}
    compiling = jitaside.compile_aside(scan_layouts, (
        model_vector(model), system_vector(system), calib, int(gpus), int(global_batch),
        np.zeros((0, len(LAYOUT_AXES)), dtype=np.int64), np.zeros(0, dtype=np.int64), np.empty((0, K.L_SIZE)),
        *_knob_arrays(arrays), int(split_ends), np.zeros(0, dtype=np.int8), 0, len(K.REASONS), 0, n_chunks, int(k),
        -np.inf, -1))
    sp = _Space(model, system, calib, gpus, global_batch, space, split_ends)
    layout_key, table = _layer_table(sp, calib)
    if stack_rules is not None:
        rule_id, rule_names = _stack_rule_ids(sp.values, sp.layout_values, sp.dps, stack_rules, system, fixed or {})
    else:
        rule_id, rule_names = np.zeros(0, dtype=np.int8), []
    invalid = sp.invalid_counts()
    if compiling is not None:  # meanwhile, what prices the search's best plans again: one plan, its pipeline
        _compile_plan_pricing(model, system, calib, sp)
    jitaside.wait(compiling)
    args = (sp.mvec, sp.svec, calib, sp.gpus, sp.global_batch, sp.layout_values, layout_key, table, *sp.knobs,
            sp.ends, rule_id, len(rule_names), len(K.REASONS))

    def one_pass(after_step: float, after_index: int, k: int):
        def chunk(c):
            return scan_layouts(*args, c, n_chunks, k, after_step, after_index)

        if n_chunks == 1:
            parts = [chunk(0)]
        else:
            with ThreadPoolExecutor(n_chunks) as pool:
                parts = list(pool.map(chunk, range(n_chunks)))
        step = np.concatenate([p[3] for p in parts])
        index = np.concatenate([p[4] for p in parts])
        mem = np.concatenate([p[5] for p in parts])
        order = np.lexsort((index, step))[:k]
        return parts, (step[order], index[order], mem[order])

    parts, top = one_pass(-np.inf, -1, k)
    counts = invalid + sum(p[0] for p in parts)
    by_rule_counts = sum(p[2] for p in parts)
    by_rule = {name: int(by_rule_counts[r]) for r, name in enumerate(rule_names, start=1)}
    return SpaceScan(sp.values, sp.layouts, sp.dps, counts, by_rule, sp.layout_values.shape[0] * sp.n_knob,
                     int(sum(p[1] for p in parts)), top, int(k), lambda s, i, n: one_pass(s, i, n)[1])


def distinct_plans(prices: SpacePrices | SpaceScan) -> Iterator[dict]:
    """Feasible plans fastest first by the closed form (ties in the dense grid's order), each spelling of a plan
    (:func:`trainscale.model.perfmodel.canonical_plan`) once, as :func:`trainscale.model.perfmodel.rank`'s entries."""
    seen = set()
    for index, step, mem in prices.ranked():
        plan = prices.plan(index)
        key = canonical_plan(plan)
        if key in seen:
            continue
        seen.add(key)
        yield {"plan": plan, "step_time_s": step, "memory_gib_per_gpu": mem / GiB}


class CandidateStream:
    """Plans of :func:`distinct_plans` taken in batches that never cut a fold in two: a batch ends only
    where the next plan's closed-form step time or memory differs from the last one's (:func:`same_cost`)."""

    def __init__(self, plans: Iterator[dict]):
        self._plans = plans
        self._next = next(plans, None)

    @property
    def exhausted(self) -> bool:
        return self._next is None

    def take(self, count: int) -> list[dict]:
        taken = []
        while self._next is not None and (len(taken) < count or same_cost(self._next, taken[-1])):
            taken.append(self._next)
            self._next = next(self._plans, None)
        return taken


def same_cost(a: Mapping | None, b: Mapping | None, rel_tol: float = FOLD_REL_TOL) -> bool:
    """Equal step time and memory to ``rel_tol``."""
    if a is None or b is None:
        return False
    return all(abs(a[k] - b[k]) <= rel_tol * max(abs(a[k]), abs(b[k]))
               for k in ("step_time_s", "memory_gib_per_gpu"))


def plan_differences(plan: Mapping, other: Mapping) -> dict:
    """The plan axes (and dp, and the precision of a search of several) where ``plan`` differs from ``other``:
    name -> ``plan``'s value."""
    names = GRID_AXES + EXPERT_AXES + ("dp", "precision")
    return {k: plan.get(k) for k in names if plan.get(k) != other.get(k)}


def fold_equal_plans(entries: list[dict], rel_tol: float = FOLD_REL_TOL) -> list[dict]:
    """Fold entries (sorted fastest first) that are one answer: same cost (:func:`same_cost`) and differing
    only in ``FOLD_KNOBS``. Each row is the first entry of its fold with ``folded``: the other entries' values
    of the knobs in which they differ from it (a list of dicts, in order)."""
    rows = []
    for entry in entries:
        for row in rows:
            differs = plan_differences(entry["plan"], row["plan"])
            if same_cost(entry, row, rel_tol) and set(differs) <= set(FOLD_KNOBS):
                row["folded"].append(differs)
                break
        else:
            rows.append({**entry, "folded": []})
    return rows


def fold_text(row: Mapping) -> str:
    """What a fold says, knob by knob: ``recompute none = selective; zero 1 = 2`` ('' for none)."""
    parts = []
    for knob in FOLD_KNOBS:
        alternatives = [f[knob] for f in row["folded"] if knob in f]
        if alternatives:
            shown = [row["plan"][knob]] + [v for i, v in enumerate(alternatives) if v not in alternatives[:i]]
            parts.append(f"{knob} " + " = ".join(_short(v) for v in shown))
    return "; ".join(parts)


def differs_text(plan: Mapping, best: Mapping) -> str:
    """How a plan differs from the best one: ``interleave 6, micro_batch 4`` ('' for the best itself)."""
    return ", ".join(f"{k} {_short(v)}" for k, v in plan_differences(plan, best).items())


def _short(value) -> str:
    return {True: "yes", False: "no"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def space_summary(prices: SpacePrices | SpaceScan) -> xr.Dataset:
    """The searched space in numbers: plans by reason (``R_OK`` = feasible; ``does not fit`` counted after
    pricing), with the space's axes and the counts as attributes."""
    plans = xr.DataArray(prices.plans_by_reason.astype(np.int64), dims=("reason",),
                         coords={"reason": list(K.REASONS)},
                         attrs={"units": "plans", "long_name": "plans of the space by why they are masked "
                                "('ok': feasible)"})
    return xr.Dataset({"plans": plans}, attrs={
        "space_size": prices.size, "plans_priced": int(prices.plans_priced),
        "plans_feasible": int(prices.plans_feasible),
        "plans_by_stack_rule": dict(prices.plans_by_rule),
        "space": {name: [_short(v) if isinstance(v, bool) else v for v in vals]
                  for name, vals in prices.values.items()}})


def merge_summaries(summaries: list[xr.Dataset]) -> xr.Dataset:
    """One summary of the spaces of several searches (one per precision, :func:`trainscale.model.planner.search`):
    plans by reason and the counts added up, the stack rules' counts added rule by rule, the precisions listed."""
    merged = summaries[0].copy(deep=True)
    merged["plans"] = sum(s["plans"] for s in summaries).assign_attrs(summaries[0]["plans"].attrs)
    for key in ("space_size", "plans_priced", "plans_feasible"):
        merged.attrs[key] = int(sum(s.attrs[key] for s in summaries))
    by_rule = {}
    for s in summaries:
        for rule, n in s.attrs["plans_by_stack_rule"].items():
            by_rule[rule] = by_rule.get(rule, 0) + int(n)
    merged.attrs["plans_by_stack_rule"] = by_rule
    merged.attrs["precision"] = [p for s in summaries for p in s.attrs.get("precision", [])]
    return merged


__all__ = ["merge_summaries", "LAYOUT_AXES", "FOLD_KNOBS", "FOLD_REL_TOL", "SpacePrices", "price_space", "SpaceScan", "scan_space",
           "CANDIDATES", "space_values", "space_size",
           "distinct_plans", "CandidateStream", "same_cost", "fold_equal_plans", "fold_text", "differs_text",
           "plan_differences", "space_summary"]
