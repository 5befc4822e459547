"""Stack rules: which plans each software stack runs (``data/stack_rules.yaml``, each rule with its source).

A rule holds where its ``when`` conditions hold and requires its ``then`` conditions; a plan that breaks
one is a plan the stack does not run. :func:`rules` loads and validates the file once (a bad entry is one
line naming the field, the value and what is valid); :func:`broken_rules` checks one plan (``predict``);
:func:`broken_mask` checks a whole priced space at once, by broadcasting (``search``).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from . import catalog
from .spec_fields import CUDA_GRAPH_IMPLS, MOE_DISPATCHERS, PRECISIONS
from .specs import RECOMPUTE_MODES, STACKS, SpecError

RULES_FILE = "stack_rules.yaml"
FIELDS = ("tp", "pp", "cp", "dp", "interleave", "micro_batch", "recompute", "sequence_parallel", "zero",
          "shard_group", "overlap_grad_reduce", "flash_attention", "zero3_per_tensor", "tp_comm_overlap", "ep",
          "etp", "compiled", "overlap_moe_expert_parallel_comm", "moe_dispatcher", "recompute_modules", "precision",
          "cuda_graph_impl", "fused_grouped_mlp")
SYSTEM_FIELDS = ("scale_up_domain", "gpus_per_node")
# fields whose values are names (a rule may name recompute_modules only as "": no modules named)
NAMED_VALUES = {"recompute": RECOMPUTE_MODES, "moe_dispatcher": MOE_DISPATCHERS, "recompute_modules": ("",),
                "precision": PRECISIONS, "cuda_graph_impl": CUDA_GRAPH_IMPLS}
OPERATORS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq,
             "!=": operator.ne}
RULE_KEYS = ("id", "when", "then", "why", "source")


@dataclass(frozen=True)
class Condition:
    """``field`` takes one of ``values``, or compares (``op``) with ``rhs`` (an integer or a system field)."""

    field: str
    values: tuple | None = None
    op: str = ""
    rhs: int | str = 0

    def holds(self, value, system) -> Any:
        """Where ``value`` (a scalar or an array) meets the condition (a bool or a bool array)."""
        if self.values is not None:
            if np.ndim(value) == 0:  # one plan (every prediction checks its stack's rules): no array
                return any(value == allowed for allowed in self.values)
            return np.isin(value, self.values)
        rhs = getattr(system, self.rhs) if isinstance(self.rhs, str) else self.rhs
        return OPERATORS[self.op](value, rhs)

    def text(self, system=None) -> str:
        if self.values is not None:
            return f"{self.field} in {list(self.values)}"
        rhs = self.rhs if system is None or not isinstance(self.rhs, str) else f"{self.rhs} = {getattr(system, self.rhs)}"
        return f"{self.field} {self.op} {rhs}"


@dataclass(frozen=True)
class Rule:
    id: str
    stack: str
    when: tuple
    then: tuple
    why: str
    source: str


def _fail(where: str, key: str, value, valid: str):
    raise SpecError(key, value, valid, where=f"{RULES_FILE}: {where}")


def _condition(where: str, name: str, spec) -> Condition:
    if name not in FIELDS:
        _fail(where, "field", name, f"expected a plan field: {', '.join(FIELDS)}")
    if isinstance(spec, list) and spec:
        if name in NAMED_VALUES and not set(spec) <= set(NAMED_VALUES[name]):
            _fail(where, name, spec, f"expected values of {', '.join(NAMED_VALUES[name])}")
        if name not in NAMED_VALUES and not all(isinstance(v, (bool, int)) for v in spec):
            _fail(where, name, spec, "expected a list of integers or true/false")
        return Condition(name, values=tuple(spec))
    parts = spec.split() if isinstance(spec, str) else []
    if len(parts) != 2 or parts[0] not in OPERATORS:
        _fail(where, name, spec, f"expected a non-empty list of values or '<op> <rhs>' with op one of "
              f"{', '.join(OPERATORS)}")
    rhs = parts[1]
    if rhs.lstrip("-").isdigit():
        return Condition(name, op=parts[0], rhs=int(rhs))
    if rhs not in SYSTEM_FIELDS:
        _fail(where, name, spec, f"expected the right-hand side to be an integer or one of {', '.join(SYSTEM_FIELDS)}")
    return Condition(name, op=parts[0], rhs=rhs)


def _conditions(where: str, key: str, spec) -> tuple:
    if spec is None and key == "when":
        return ()
    if not isinstance(spec, Mapping) or not spec:
        _fail(where, key, spec, "expected a mapping of plan fields to conditions")
    return tuple(_condition(f"{where} {key}", name, cond) for name, cond in spec.items())


def parse_rules(doc: Any) -> dict[str, tuple[Rule, ...]]:
    """The rules of a parsed ``stack_rules.yaml`` per stack, validated (:class:`SpecError` on the first bad entry)."""
    stacks = doc.get("stacks") if isinstance(doc, Mapping) else None
    if not isinstance(stacks, Mapping):
        _fail("top level", "stacks", stacks, "expected a mapping of stack name to a list of rules")
    out, seen = {}, set()
    for stack, entries in stacks.items():
        if stack not in STACKS:
            _fail("stacks", "stack", stack, f"expected one of {', '.join(STACKS)}")
        if not isinstance(entries, list):
            _fail(f"stack {stack}", "rules", entries, "expected a list of rules")
        out[stack] = tuple(_rule(stack, i, entry, seen) for i, entry in enumerate(entries))
    return {stack: out.get(stack, ()) for stack in STACKS}


def _rule(stack: str, index: int, entry, seen: set) -> Rule:
    where = f"stack {stack} rule {index}"
    if not isinstance(entry, Mapping):
        _fail(where, "rule", entry, f"expected a mapping with {', '.join(RULE_KEYS)}")
    for key in entry:
        if key not in RULE_KEYS:
            _fail(where, key, entry[key], f"unknown rule field; valid fields: {', '.join(RULE_KEYS)}")
    for key in ("id", "why", "source"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            _fail(where, key, entry.get(key), "expected a non-empty string")
    if entry["id"] in seen:
        _fail(where, "id", entry["id"], "expected an id no other rule has")
    seen.add(entry["id"])
    where = f"rule {entry['id']}"
    return Rule(entry["id"], stack, _conditions(where, "when", entry.get("when")),
                _conditions(where, "then", entry.get("then")), entry["why"], entry["source"])


@functools.lru_cache(maxsize=None)
def rules() -> dict[str, tuple[Rule, ...]]:
    """The shipped rules per stack, loaded and validated once."""
    from ..common.inputs import load_yaml

    return parse_rules(load_yaml(catalog.data_path(RULES_FILE)))


def effective_fields(plan: Mapping) -> dict:
    """A plan's fields as the model prices them (scalars or broadcastable arrays): TP overlap only with
    sequence parallelism and tp > 1, sequence parallelism only with tp > 1, per-tensor fetches only under ZeRO-3,
    named recompute modules only on a selective recompute."""
    p = dict(plan)
    tp_split = np.asarray(p.get("tp", 1)) > 1
    p["sequence_parallel"] = np.logical_and(p.get("sequence_parallel", False), tp_split)
    p["tp_comm_overlap"] = np.logical_and(p.get("tp_comm_overlap", False), p["sequence_parallel"])
    p["zero3_per_tensor"] = np.logical_and(p.get("zero3_per_tensor", False), np.asarray(p.get("zero", 0)) == 3)
    if p.get("recompute_modules"):  # named modules only where the plan recomputes selectively
        p["recompute_modules"] = np.where(np.asarray(p.get("recompute", "full")) == "selective",
                                          p["recompute_modules"], "")
    return p


def _all(conditions, fields, system):
    out = True
    for c in conditions:
        out = np.logical_and(out, c.holds(fields.get(c.field, _DEFAULTS[c.field]), system))
    return out


_DEFAULTS = {"tp": 1, "pp": 1, "cp": 1, "dp": 1, "interleave": 1, "micro_batch": 1, "recompute": "full",
             "sequence_parallel": False, "zero": 0, "shard_group": 0, "overlap_grad_reduce": False,
             "flash_attention": False, "zero3_per_tensor": False, "tp_comm_overlap": False, "ep": 1, "etp": 0,
             "compiled": False, "overlap_moe_expert_parallel_comm": False, "moe_dispatcher": "alltoall",
             "recompute_modules": "", "precision": "bf16", "cuda_graph_impl": "none", "fused_grouped_mlp": False}


def rule_broken(rule: Rule, fields: Mapping, system):
    """Where ``rule`` is broken by ``fields`` (:func:`effective_fields`): a bool, or a bool array."""
    return np.logical_and(_all(rule.when, fields, system), np.logical_not(_all(rule.then, fields, system)))


def broken_rules(plan, system, stack: str | None = None) -> list[Rule]:
    """The rules of the plan's stack that ``plan`` (a :class:`~trainscale.model.specs.PlanSpec` or a mapping) breaks."""
    fields = {name: getattr(plan, name) for name in FIELDS} if not isinstance(plan, Mapping) else dict(plan)
    fields = effective_fields(fields)
    stack = stack or fields.get("stack") or getattr(plan, "stack", "megatron")
    return [rule for rule in rules()[stack] if bool(rule_broken(rule, fields, system))]


def failed_condition(rule: Rule, plan, system) -> Condition:
    """The first ``then`` condition of ``rule`` that ``plan`` fails."""
    fields = effective_fields({name: getattr(plan, name) for name in FIELDS})
    return next(c for c in rule.then if not bool(c.holds(fields[c.field], system)))


def refusal(rule: Rule, plan, system) -> tuple[str, Any, str]:
    """``(field, value, what is valid)`` of the plan field that breaks ``rule``, for a :class:`SpecError`."""
    cond = failed_condition(rule, plan, system)
    value = effective_fields({name: getattr(plan, name) for name in FIELDS})[cond.field]
    value = value.item() if hasattr(value, "item") else value
    when = f" where {', '.join(c.text() for c in rule.when)}" if rule.when else ""
    return (f"plan.{cond.field}", value,
            f"the {rule.stack} stack does not run it: it needs {cond.text(system)}{when} (stack rule {rule.id}: "
            f"{rule.why}); allow_unrunnable / --allow-unrunnable prices it anyway")


def check_runnable(plan, system, where: str | None = None) -> None:
    """Raise :class:`SpecError` naming the first stack rule ``plan`` breaks."""
    broken = broken_rules(plan, system)
    if broken:
        raise SpecError(*refusal(broken[0], plan, system), where=where)


def broken_mask(stack: str, fields: Mapping, system, eligible: np.ndarray) -> tuple[np.ndarray, dict]:
    """Over the plans of ``eligible`` (a bool array; ``fields`` broadcast to its shape): where the stack
    refuses an eligible plan, and per rule id how many plans that rule is the first to refuse."""
    fields = effective_fields(fields)
    broken = np.zeros(eligible.shape, dtype=bool)
    by_rule = {}
    for rule in rules()[stack]:
        hit = rule_broken(rule, fields, system) & eligible
        by_rule[rule.id] = int(np.count_nonzero(hit & ~broken))
        broken |= hit
    return broken, by_rule


__all__ = ["Rule", "Condition", "rules", "parse_rules", "broken_rules", "check_runnable", "broken_mask",
           "effective_fields", "refusal", "FIELDS", "RULES_FILE"]
