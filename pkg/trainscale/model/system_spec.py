"""On what it is trained: :class:`SystemSpec`, a cluster building block (accelerator, scale-up domain, scale-out
network) read from the catalog with checked overrides and plausible ranges, and :func:`resolve_system`. Public
through :mod:`.specs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import catalog
from ..common.errors import SpecError
from .spec_fields import _float, _int, _reject_unknown


@dataclass(frozen=True)
class SystemSpec:
    """A cluster building block: nodes of identical accelerators, a scale-up domain (NVLink /
    NVSwitch / Infinity Fabric) and a scale-out network. Bandwidths are unidirectional per GPU.

    The scale-out topology fields are optional. ``scale_out_leaf_gpus`` (default 0: one flat
    tier, every NIC on the same switch layer) is the number of GPUs under one leaf switch of a
    two-tier fat-tree; collectives whose group spans more than one leaf cross the spine, where
    the bandwidth is divided by ``scale_out_oversubscription`` (default 1.0, non-blocking).
    ``scale_out_hop_latency_s`` (default 0.0: the hops are inside ``scale_out_latency_s``) is
    added per link hop to every scale-out step: 2 hops inside a leaf, 4 across the spine.
    ``scale_up_nvls_efficiency`` (default 0.0: none) is NCCL's efficiency of an NVLink SHARP
    all-reduce in the scale-up switches (:func:`trainscale.kernels.collectives.nvls_allreduce_time`).
    """

    name: str
    accelerator: str
    generation: str
    peak_flops_bf16: float
    peak_flops_fp8: float | None
    sm_count: int
    hbm_capacity_GiB: float
    hbm_bandwidth_GBps: float
    tdp_W: float
    idle_W: float
    gpus_per_node: int
    scale_up_domain: int
    scale_up_GBps_per_gpu: float
    scale_up_latency_s: float
    scale_out_GBps_per_gpu: float
    scale_out_latency_s: float
    node_overhead_W: float = 0.0
    scale_out_leaf_gpus: int = 0
    scale_out_oversubscription: float = 1.0
    scale_out_hop_latency_s: float = 0.0
    peak_flops_fp4: float | None = None  # dense FP4 (NVFP4) tensor-core peak; None: no FP4 tensor cores
    scale_up_nvls_efficiency: float = 0.0  # NVLS all-reduce in the scale-up switches, NCCL's efficiency; 0: none
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    NUMERIC_FIELDS = (
        "peak_flops_bf16", "peak_flops_fp8", "sm_count", "hbm_capacity_GiB", "hbm_bandwidth_GBps",
        "tdp_W", "idle_W", "gpus_per_node", "scale_up_domain", "scale_up_GBps_per_gpu",
        "scale_up_latency_s", "scale_out_GBps_per_gpu", "scale_out_latency_s", "node_overhead_W",
        "scale_out_leaf_gpus", "scale_out_oversubscription", "scale_out_hop_latency_s", "peak_flops_fp4",
        "scale_up_nvls_efficiency",
    )
    # optional fields and their defaults (an entry without them loads unchanged)
    # plausible ranges, so that a unit slip (TFLOP/s for FLOP/s, Gb/s for GB/s by 1e3) is an error
    RANGES = {
        "peak_flops_bf16": (1e12, 1e17, "FLOP/s per GPU (a value under 1e12 looks like TFLOP/s)"),
        "peak_flops_fp8": (1e12, 1e17, "FLOP/s per GPU (a value under 1e12 looks like TFLOP/s)"),
        "peak_flops_fp4": (1e12, 1e17, "FLOP/s per GPU (a value under 1e12 looks like TFLOP/s)"),
        "hbm_capacity_GiB": (0.5, 1e5, "GiB"), "hbm_bandwidth_GBps": (1.0, 1e6, "GB/s"),
        "tdp_W": (1.0, 1e5, "W"), "idle_W": (0.0, 1e5, "W"), "node_overhead_W": (0.0, 1e7, "W"),
        "scale_up_GBps_per_gpu": (1e-6, 1e6, "GB/s"), "scale_out_GBps_per_gpu": (1e-6, 1e6, "GB/s"),
        "scale_up_latency_s": (0.0, 10.0, "seconds"), "scale_out_latency_s": (0.0, 10.0, "seconds"),
        "scale_out_oversubscription": (1.0, 1e3, "a ratio"), "scale_out_hop_latency_s": (0.0, 1.0, "seconds"),
        "scale_up_nvls_efficiency": (0.0, 1.0, "a fraction of the scale-up bandwidth (0: no NVLS)"),
    }
    OPTIONAL_DEFAULTS = {"node_overhead_W": 0.0, "scale_out_leaf_gpus": 0, "scale_out_oversubscription": 1.0,
                         "scale_out_hop_latency_s": 0.0, "scale_up_nvls_efficiency": 0.0}

    @classmethod
    def overridable_fields(cls) -> tuple[str, ...]:
        return ("accelerator", "generation") + cls.NUMERIC_FIELDS

    @classmethod
    def from_catalog(cls, name: str, overrides: Mapping | None = None,
                     where: str | None = None) -> "SystemSpec":
        systems = catalog.systems()
        if name not in systems:
            raise SpecError("system", name, f"expected a catalog system ({', '.join(sorted(systems))})",
                            where)
        entry = systems[name]
        values: dict[str, Any] = {"name": name}
        sources: dict[str, str] = {}
        for key, item in entry.items():
            if isinstance(item, Mapping) and "value" in item:
                values[key] = item["value"]
                sources[key] = item.get("source", "")
            elif key != "description":
                values[key] = item
        overrides = dict(overrides or {})
        overrides.pop("name", None)
        _reject_unknown(overrides, set(cls.overridable_fields()), where, "system")
        for key, value in overrides.items():
            values[key] = value
            sources[key] = "override in the run's input"
        return cls._checked(values, sources, where)

    @classmethod
    def _checked(cls, values: dict, sources: dict, where: str | None) -> "SystemSpec":
        generations = catalog.generations()
        if values.get("generation") not in generations:
            raise SpecError("generation", values.get("generation"),
                            f"expected one of {', '.join(generations)}", where)
        kwargs: dict[str, Any] = {"name": values["name"], "accelerator": str(values.get("accelerator", "")),
                                  "generation": values["generation"], "sources": sources}
        for key in cls.NUMERIC_FIELDS:
            if key in ("sm_count", "gpus_per_node", "scale_up_domain"):
                kwargs[key] = _int(values, key, where)
            elif key in ("peak_flops_fp8", "peak_flops_fp4"):
                kwargs[key] = _float(values, key, where, allow_none=True)
            elif key == "scale_out_leaf_gpus":
                kwargs[key] = _int(values, key, where, default=0, minimum=0)
            elif key == "scale_out_oversubscription":
                kwargs[key] = _float(values, key, where, default=1.0, minimum=1.0)
            elif key in cls.OPTIONAL_DEFAULTS:
                kwargs[key] = _float(values, key, where, default=cls.OPTIONAL_DEFAULTS[key])
            else:
                kwargs[key] = _float(values, key, where)
        for key, (lo, hi, unit) in cls.RANGES.items():
            value = kwargs[key]
            if value is not None and not lo <= value <= hi:
                raise SpecError(key, value, f"expected {unit} in [{lo:g}, {hi:g}]", where)
        if kwargs["idle_W"] > kwargs["tdp_W"]:
            raise SpecError("idle_W", kwargs["idle_W"], f"must not exceed tdp_W = {kwargs['tdp_W']}", where)
        leaf = kwargs["scale_out_leaf_gpus"]
        if leaf and leaf % kwargs["gpus_per_node"]:
            raise SpecError("scale_out_leaf_gpus", leaf,
                            f"must be 0 (one flat tier) or a multiple of gpus_per_node = {kwargs['gpus_per_node']}",
                            where)
        if kwargs["scale_up_domain"] % kwargs["gpus_per_node"]:
            raise SpecError("scale_up_domain", kwargs["scale_up_domain"],
                            f"must be a multiple of gpus_per_node = {kwargs['gpus_per_node']}", where)
        return cls(**kwargs)


def resolve_system(value: str | Mapping | SystemSpec, where: str | None = None) -> SystemSpec:
    if isinstance(value, SystemSpec):
        return value
    if isinstance(value, str):
        return SystemSpec.from_catalog(value, where=where)
    if isinstance(value, Mapping):
        if "name" not in value:
            raise SpecError("system.name", None, "an overriding mapping needs the catalog name it starts from",
                            where)
        return SystemSpec.from_catalog(value["name"], overrides=value, where=where)
    raise SpecError("system", value, "expected a catalog name or a mapping with name and overrides", where)
