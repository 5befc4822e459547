r"""Chiplet meshes: the hardware spec, ring embeddings, weakly scaled models and one step's costs.

A package of ``n x n`` compute chiplets on a 2D mesh trains a transformer with tensor
parallelism over all of them, either Megatron's 1D scheme (``"1d-tp"``: activations all-reduced
over one ring through the whole mesh) or Hecaton's 2D scheme (``"2d"``: weights cut into an
``n x n`` grid of blocks, all-gathers and reduce-scatters along mesh rows and columns); see
:mod:`trainscale.kernels.chiplet` for every formula.

**Weak scaling** (:func:`weak_scaled_model`): the problem grows with the mesh. The catalog model
is the workload of a reference mesh of side ``n_ref``; on a mesh of side ``n`` every width
(hidden, key/value, FFN) is multiplied by ``n / n_ref``, the layers, sequence length and tokens
per step stay. The weights, and the GEMM FLOPs of a step, then grow like ``n^2 = N``: per chiplet
they stay fixed, which is the sense of Hecaton's weak scaling (workload and hardware grow in
proportion). Widths may come out non-integer on the smaller meshes: every count below is a
polynomial in the widths, so a scaled shape is used as real numbers, not rounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np
import yaml

from ..model import catalog
from ..common.checks import check_choice, check_float, check_int
from ..kernels import chiplet as K
from ..model.specs import ModelSpec, SpecError, resolve_model

__all__ = [
    "COST_FIELDS",
    "SCHEMES",
    "step_costs_grid",
    "ChipletSpec",
    "check_attention_local",
    "chiplets",
    "line_ring",
    "mesh_ring",
    "model_vector",
    "resolve_chiplet",
    "ring_edge_hops",
    "ring_link_loads",
    "step",
    "unpack",
    "weak_scaled_model",
]

SCHEMES = ("1d-tp", "2d")
SCHEME_CODES = {"1d-tp": K.SCHEME_1D, "2d": K.SCHEME_2D}
BYTES_PER_ELEMENT = 2.0  # bf16 activations, weights and gradients


def chiplets() -> dict:
    """Catalog chiplets by name; each numeric field is ``{value, source}``."""
    with open(catalog.data_path("chiplets.yaml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)["chiplets"]


@dataclass(frozen=True)
class ChipletSpec:
    """One compute chiplet of the mesh and its links (units in the field names; energies in pJ)."""

    name: str
    peak_flops: float
    matmul_efficiency: float
    dram_GBps: float
    dram_pJ_per_bit: float
    link_GBps: float
    link_pJ_per_bit: float
    hop_latency_s: float
    flop_pJ: float
    static_W: float

    @classmethod
    def numeric_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name != "name")

    def hardware_vector(self) -> np.ndarray:
        """The kernel's ``H_*`` vector, in SI units (B/s, s, J)."""
        hw = np.zeros(K.H_SIZE)
        hw[K.H_PEAK_FLOPS] = self.peak_flops
        hw[K.H_EFF] = self.matmul_efficiency
        hw[K.H_DRAM_BW] = self.dram_GBps * 1e9
        hw[K.H_LINK_BW] = self.link_GBps * 1e9
        hw[K.H_HOP_LATENCY] = self.hop_latency_s
        hw[K.H_FLOP_J] = self.flop_pJ * 1e-12
        hw[K.H_DRAM_J_BIT] = self.dram_pJ_per_bit * 1e-12
        hw[K.H_LINK_J_BIT] = self.link_pJ_per_bit * 1e-12
        hw[K.H_STATIC_W] = self.static_W
        return hw


_BOUNDS = {  # field: (minimum, open at the minimum)
    "peak_flops": (0.0, True), "matmul_efficiency": (0.0, True), "dram_GBps": (0.0, True),
    "dram_pJ_per_bit": (0.0, False), "link_GBps": (0.0, True), "link_pJ_per_bit": (0.0, False),
    "hop_latency_s": (0.0, False), "flop_pJ": (0.0, False), "static_W": (0.0, False),
}


def resolve_chiplet(value: str | Mapping | ChipletSpec, overrides: Mapping | None = None) -> ChipletSpec:
    """A :class:`ChipletSpec` from a catalog name or a mapping of every field, with ``overrides``
    (plain numbers) applied on top; every value is checked."""
    if isinstance(value, ChipletSpec):
        base = {f: getattr(value, f) for f in ChipletSpec.numeric_fields()}
        name = value.name
    elif isinstance(value, str):
        cat = chiplets()
        if value not in cat:
            raise SpecError("chiplet", value, f"expected a catalog chiplet ({', '.join(sorted(cat))}) "
                            "or a mapping of its fields")
        base = {f: cat[value][f]["value"] for f in ChipletSpec.numeric_fields()}
        name = value
    elif isinstance(value, Mapping):
        base = {f: (value[f]["value"] if isinstance(value.get(f), Mapping) else value.get(f))
                for f in ChipletSpec.numeric_fields()}
        name = str(value.get("name", "custom"))
    else:
        raise SpecError("chiplet", value, "expected a catalog name or a mapping")
    for key, v in dict(overrides or {}).items():
        check_choice("chiplet_overrides", key, ChipletSpec.numeric_fields())
        base[key] = v
    checked = {}
    for key in ChipletSpec.numeric_fields():
        lo, open_min = _BOUNDS[key]
        hi = 1.0 if key == "matmul_efficiency" else float("inf")
        checked[key] = check_float(key, base[key], lo, hi, open_min=open_min)
    return ChipletSpec(name=name, **checked)


# --------------------------------------------------------------------------- ring embeddings
def mesh_ring(n: int) -> list[int]:
    """A ring through every chiplet of an ``n x n`` mesh (indices ``r n + c``), in ring order.

    ``n`` even: row 0 left to right, rows 1..n-1 snaking over columns n-1..1, then up column 0 —
    every edge one hop. ``n`` odd (>= 3): up the last column from row n-3, rows 0..n-3 snaking
    leftwards-first over columns n-2..0, the last two rows in a zigzag from (n-2, 0) to
    (n-1, n-1), and one 2-hop edge back to (n-3, n-1).
    """
    n = check_int("n", n, 1)
    if n == 1:
        return [0]
    idx = lambda r, c: r * n + c
    if n % 2 == 0:
        order = [idx(0, c) for c in range(n)]
        for r in range(1, n):
            cols = range(n - 1, 0, -1) if r % 2 == 1 else range(1, n)
            order += [idx(r, c) for c in cols]
        order += [idx(r, 0) for r in range(n - 1, 0, -1)]
        return order
    order = [idx(r, n - 1) for r in range(n - 3, -1, -1)]
    for r in range(n - 2):
        cols = range(n - 2, -1, -1) if r % 2 == 0 else range(n - 1)
        order += [idx(r, c) for c in cols]
    for c in range(n):
        pair = [idx(n - 2, c), idx(n - 1, c)] if c % 2 == 0 else [idx(n - 1, c), idx(n - 2, c)]
        order += pair
    return order


def line_ring(p: int) -> list[int]:
    """The folded ring on a line of ``p`` chiplets: ``0, 2, 4, ...`` up, then the odd ones down."""
    p = check_int("p", p, 1)
    return list(range(0, p, 2)) + list(range(p - 1 - (p % 2 == 1), 0, -2))


def _xy_route(a: tuple[int, int], b: tuple[int, int]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Directed links of the XY route from ``a`` to ``b`` (columns first, then rows)."""
    links = []
    r, c = a
    while c != b[1]:
        nc = c + (1 if b[1] > c else -1)
        links.append(((r, c), (r, nc)))
        c = nc
    while r != b[0]:
        nr = r + (1 if b[0] > r else -1)
        links.append(((r, c), (nr, c)))
        r = nr
    return links


def ring_edge_hops(order: list[int], n: int) -> list[int]:
    """Hops of each ring edge ``order[i] -> order[i+1]`` (closing edge included) on an n x n mesh."""
    return [int(K.mesh_hops(order[i], order[(i + 1) % len(order)], n)) for i in range(len(order))] \
        if len(order) > 1 else []


def ring_link_loads(order: list[int], n: int, bidirectional: bool = False) -> dict:
    """Ring edges carried by each directed link (XY routes; the reverse ring too if bidirectional)."""
    loads: dict = {}
    rings = [order, order[::-1]] if bidirectional else [order]
    for ring in rings:
        if len(ring) < 2:
            continue
        for i in range(len(ring)):
            a, b = ring[i], ring[(i + 1) % len(ring)]
            for link in _xy_route(divmod(a, n), divmod(b, n)):
                loads[link] = loads.get(link, 0) + 1
    return loads


# --------------------------------------------------------------------------- workload
def weak_scaled_model(model: str | Mapping | ModelSpec, side: int, reference_side: int,
                      tokens_per_step: int) -> dict:
    """The workload run on a mesh of ``side``: ``model``'s widths times ``side / reference_side``.

    Returns the real-valued shape (``hidden``, ``kv_width``, ``ffn_hidden``, ``ffn_matrices``,
    ``layers``, ``seq_len``, ``tokens``, ``params`` of the transformer layers, ``scale``).
    """
    spec = resolve_model(model)
    side = check_int("mesh_sides", side, 1)
    reference_side = check_int("reference_side", reference_side, 1)
    tokens = check_int("tokens_per_step", tokens_per_step, 1)
    scale = side / reference_side
    h = spec.hidden * scale
    kv = spec.kv_heads * spec.head_dim * scale
    f = spec.ffn_hidden * scale
    g = spec.ffn_matrices
    params = spec.layers * (h * (h + 2 * kv) + h * h + g * h * f)
    return {"name": spec.name, "hidden": h, "kv_width": kv, "ffn_hidden": f, "ffn_matrices": g,
            "layers": spec.layers, "seq_len": spec.seq_len, "tokens": tokens, "params": params,
            "scale": scale}


def model_vector(shape: Mapping) -> np.ndarray:
    """The kernel's ``M_*`` vector of a :func:`weak_scaled_model` shape."""
    m = np.zeros(K.M_SIZE)
    m[K.M_HIDDEN] = shape["hidden"]
    m[K.M_KV] = shape["kv_width"]
    m[K.M_FFN] = shape["ffn_hidden"]
    m[K.M_FFN_MATRICES] = shape["ffn_matrices"]
    m[K.M_LAYERS] = shape["layers"]
    m[K.M_SEQ] = shape["seq_len"]
    m[K.M_TOKENS] = shape["tokens"]
    m[K.M_BYTES] = BYTES_PER_ELEMENT
    return m


def check_attention_local(shape: Mapping, side: int) -> None:
    """The 2D scheme computes attention locally: each of the ``side`` token blocks must hold whole
    sequences, so the sequences per step must be a multiple of ``side``."""
    tokens, seq = int(shape["tokens"]), int(shape["seq_len"])
    if tokens % seq:
        raise SpecError("tokens_per_step", tokens, f"expected a multiple of seq_len = {seq}")
    if (tokens // seq) % side:
        raise SpecError("tokens_per_step", tokens,
                        f"expected whole sequences per token block: tokens / seq_len = {tokens // seq} "
                        f"sequences must be a multiple of the mesh side {side}")


COST_FIELDS = {
    "compute_s": K.S_COMPUTE, "dram_s": K.S_DRAM, "local_s": K.S_LOCAL, "comm_s": K.S_COMM,
    "step_s": K.S_STEP, "flops_per_chiplet": K.S_FLOPS, "dram_bytes_per_chiplet": K.S_DRAM_BYTES,
    "comm_bytes_per_chiplet": K.S_COMM_BYTES, "link_byte_hops": K.S_LINK_BYTE_HOPS,
    "activation_bytes_per_chiplet": K.S_ACT_BYTES, "weight_bytes_per_chiplet": K.S_WEIGHT_BYTES,
    "energy_compute_J": K.S_E_COMPUTE, "energy_dram_J": K.S_E_DRAM, "energy_link_J": K.S_E_LINK,
    "energy_static_J": K.S_E_STATIC, "energy_J": K.S_E_TOTAL,
}


def unpack(costs: np.ndarray) -> dict[str, float]:
    """A kernel cost vector as a dict of named floats."""
    return {name: float(costs[i]) for name, i in COST_FIELDS.items()}


def step_costs_grid(sides, shapes, chiplet) -> dict[str, np.ndarray]:
    """Costs (fields of :data:`COST_FIELDS`) of every scheme (``SCHEMES`` order) on every
    ``side x side`` mesh, one (weakly scaled) model shape per side: arrays ``[scheme, side]``."""
    models = np.stack([model_vector(shape) for shape in shapes])
    codes = np.array([SCHEME_CODES[s] for s in SCHEMES], dtype=np.int64)
    costs = K.step_costs_grid(codes, np.asarray(sides, dtype=np.int64), models,
                              resolve_chiplet(chiplet).hardware_vector())
    return {name: costs[..., i] for name, i in COST_FIELDS.items()}


def step(scheme: str, side: int, model: str | Mapping | ModelSpec, chiplet: str | Mapping | ChipletSpec,
         tokens_per_step: int, reference_side: int | None = None) -> dict[str, float]:
    """Costs of one training step (fields of :data:`COST_FIELDS`) of ``scheme`` on a ``side x side``
    mesh, the model weakly scaled from ``reference_side`` (default: ``side``, the catalog shape)."""
    check_choice("scheme", scheme, SCHEMES)
    side = check_int("side", side, 1)
    shape = weak_scaled_model(model, side, side if reference_side is None else reference_side, tokens_per_step)
    if scheme == "2d":
        check_attention_local(shape, side)
    hw = resolve_chiplet(chiplet).hardware_vector()
    return unpack(K.step_costs(SCHEME_CODES[scheme], side, model_vector(shape), hw))
