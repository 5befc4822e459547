"""Specifications: what is trained (model), on what (system), and how (plan).

Following Calculon's separation of application, system and execution, a prediction takes
three specs. They are validated once, at the boundary: every error names the field,
the value and what would be valid. Kernels downstream trust their input.

This module is the specs' public entry point (the package imports them from here): :class:`RunSpec`, one run's
three specs read from a mapping, is defined here; the field vocabularies and parsers live in :mod:`.spec_fields`,
:class:`ModelSpec` in :mod:`.model_spec`, :class:`SystemSpec` in :mod:`.system_spec`, and :class:`PlanSpec` with
the stack defaults and the pipeline-split rules in :mod:`.plan_spec`, re-exported below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..common.errors import SpecError, short_repr  # noqa: F401 - defined apart so that inputs (the strict YAML
# loader the catalogs use) needs no specs: specs reads data/stack_defaults.yaml when it is imported
from .model_spec import ModelSpec, resolve_model
from .plan_spec import PlanSpec, check_split, split_rule, stack_defaults, stack_defaults_text, suggest_split
from .spec_fields import (DEFAULT_STACK, FFN_TYPES, FP8_RECIPES, INT_LIMITS, INT_MAX, POSITION_EMBEDDINGS, PRECISIONS,
                          RECOMPUTE_MODES, ROTARY_KERNELS, STACK_DEFAULT_FIELDS, STACKS, TP_RULE, _int,
                          _reject_unknown)
from .system_spec import SystemSpec, resolve_system

__all__ = [
    # the specs
    "ModelSpec", "SystemSpec", "PlanSpec", "RunSpec", "resolve_model", "resolve_system",
    # the error every bad input raises
    "SpecError", "short_repr",
    # the plan's stack defaults and pipeline-split rules
    "stack_defaults", "stack_defaults_text", "split_rule", "check_split", "suggest_split",
    # the fields' vocabularies and limits
    "RECOMPUTE_MODES", "STACKS", "DEFAULT_STACK", "STACK_DEFAULT_FIELDS", "TP_RULE", "FFN_TYPES",
    "POSITION_EMBEDDINGS", "ROTARY_KERNELS", "PRECISIONS", "FP8_RECIPES", "INT_MAX", "INT_LIMITS",
]


@dataclass(frozen=True)
class RunSpec:
    id: str
    model: ModelSpec
    system: SystemSpec
    plan: PlanSpec

    @property
    def gpus(self) -> int:
        return self.plan.gpus

    @classmethod
    def from_dict(cls, d: Mapping, index: int = 0) -> "RunSpec":
        if not isinstance(d, Mapping):
            raise SpecError("run", d, "expected a mapping with model, system, gpus and plan", f"run {index}")
        run_id = str(d.get("id", index))
        where = f"run {run_id!r}"
        _reject_unknown(d, {"id", "model", "system", "gpus", "plan"}, where, "run")
        for key in ("model", "system", "gpus", "plan"):
            if key not in d:
                raise SpecError(key, None, "it is required", where)
        model = resolve_model(d["model"], where)
        system = resolve_system(d["system"], where)
        gpus = _int(d, "gpus", where)
        if not isinstance(d["plan"], Mapping):
            raise SpecError("plan", d["plan"], "expected a mapping", where)
        plan = PlanSpec.from_dict(d["plan"], gpus=gpus, where=where)
        plan.check_against(model, where)
        plan.check_precision(system, where)
        return cls(id=run_id, model=model, system=system, plan=plan)
