"""Gradient compression: a validated spec, the kernel's parameter array, and one-call compression.

The kernels (:mod:`trainscale.kernels.compress`) take a compressor *code* and a float parameter
array; optimiser kernels call ``compress(code, x, out, state, params, key)`` directly with them.
This module is the boundary: :class:`CompressorSpec` validates a compressor once (every error a
:class:`~trainscale.model.specs.SpecError` naming the field, the value and what is valid) and turns it
into ``code``, ``params(d)``, ``state_size(d)`` and ``init_state(d, seed, worker)``.

Randomness: the draws of one call depend only on ``(seed, worker, step)`` through
``key(seed, worker, step)`` (a counter-based hash; see the kernel module). The initial state
(PowerSGD's ``Q``) uses ``key(seed, worker, -1)``.

Compressors and their bit counts (floats are 32-bit on the wire; ``d`` entries):

============  ===========================================  ==============================================
name          ``C(x)``                                     bits per message
============  ===========================================  ==============================================
``none``      ``x``                                        ``32 d``
``top_k``     the ``k`` largest ``|x_i|`` (ties: low index)  ``k (32 + ⌈log2 d⌉)``
``random_k``  a uniform ``k``-subset, × ``d/k`` if unbiased   ``k (32 + ⌈log2 d⌉)``
``qsgd``      stochastic rounding to ``s`` levels of ‖x‖      ``32 + d (1 + ⌈log2(s+1)⌉)``, or Elias-ω Code_s
``powersgd``  rank-``r`` power step on an ``m × n`` view      ``32 r (m + n)``
============  ===========================================  ==============================================

Any of them can run under error feedback (``error_feedback=True``): ``e ← e + x; c = C(e); e ← e − c``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..kernels import compress as K
from ..model.specs import SpecError

CODES = {"none": K.NONE, "top_k": K.TOP_K, "random_k": K.RANDOM_K, "qsgd": K.QSGD,
         "powersgd": K.POWER_SGD}
NAMES = {code: name for name, code in CODES.items()}
_FIELDS = ("name", "k", "ratio", "unbiased", "levels", "elias", "rank", "rows", "error_feedback")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_int(field: str, value, minimum: int, where, allow_none=False):
    if value is None and allow_none:
        return None
    if not _is_int(value):
        raise SpecError(field, value, f"expected an integer >= {minimum}", where)
    if value < minimum:
        raise SpecError(field, value, f"expected an integer >= {minimum}", where)
    return int(value)


def _check_bool(field: str, value, where):
    if not isinstance(value, (bool, np.bool_)):
        raise SpecError(field, value, "expected true or false", where)
    return bool(value)


@dataclass(frozen=True)
class CompressorSpec:
    """One compressor, validated.

    * ``top_k`` / ``random_k`` need ``k`` (entries kept) or ``ratio`` (``k = max(1, round(ratio d))``);
      ``unbiased`` (random-k only, default true) scales the kept entries by ``d/k``;
    * ``qsgd`` needs ``levels`` (``s >= 1``); ``elias`` counts bits with QSGD's Elias-ω Code_s
      instead of fixed width;
    * ``powersgd`` needs ``rank`` (``r >= 1``); ``rows`` fixes the matrix view's rows
      (default: ``⌊√d⌋``);
    * ``error_feedback`` wraps any of them.
    """

    name: str = "none"
    k: int | None = None
    ratio: float | None = None
    unbiased: bool = True
    levels: int | None = None
    elias: bool = False
    rank: int | None = None
    rows: int | None = None
    error_feedback: bool = False
    where: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        w = self.where
        if self.name not in CODES:
            raise SpecError("name", self.name, f"expected one of {', '.join(CODES)}", w)
        _check_bool("unbiased", self.unbiased, w)
        _check_bool("elias", self.elias, w)
        _check_bool("error_feedback", self.error_feedback, w)
        sparse = self.name in ("top_k", "random_k")
        if sparse:
            if (self.k is None) == (self.ratio is None):
                raise SpecError("k", self.k, f"{self.name} needs exactly one of k (an integer >= 1) "
                                "or ratio (a number in (0, 1])", w)
            _check_int("k", self.k, 1, w, allow_none=True)
            if self.ratio is not None:
                r = self.ratio
                if (isinstance(r, bool) or not isinstance(r, (int, float, np.floating))
                        or not math.isfinite(r) or not 0.0 < r <= 1.0):
                    raise SpecError("ratio", r, "expected a number in (0, 1]", w)
        else:
            for f in ("k", "ratio"):
                if getattr(self, f) is not None:
                    raise SpecError(f, getattr(self, f), "only top_k and random_k take it", w)
        if self.name == "qsgd":
            if self.levels is None:
                raise SpecError("levels", None, "qsgd needs levels, an integer s >= 1", w)
            _check_int("levels", self.levels, 1, w)
        elif self.levels is not None:
            raise SpecError("levels", self.levels, "only qsgd takes it", w)
        if self.name == "powersgd":
            if self.rank is None:
                raise SpecError("rank", None, "powersgd needs rank, an integer r >= 1", w)
            _check_int("rank", self.rank, 1, w)
            _check_int("rows", self.rows, 1, w, allow_none=True)
        else:
            for f in ("rank", "rows"):
                if getattr(self, f) is not None:
                    raise SpecError(f, getattr(self, f), "only powersgd takes it", w)

    @classmethod
    def from_dict(cls, d: Mapping | str, where: str | None = None) -> CompressorSpec:
        """From a config mapping (``{name: top_k, ratio: 0.01, error_feedback: true}``) or a bare name."""
        if isinstance(d, str):
            return cls(name=d, where=where)
        if not isinstance(d, Mapping):
            raise SpecError("compressor", d, "expected a name or a mapping", where)
        for key in d:
            if key not in _FIELDS:
                raise SpecError(key, d[key], f"unknown compressor field; valid fields: {', '.join(_FIELDS)}",
                                where)
        return cls(**dict(d), where=where)

    @property
    def code(self) -> int:
        """The kernel's compressor code (``kernels.compress.NONE`` ... ``POWER_SGD``)."""
        return CODES[self.name]

    def k_for(self, d: int) -> int:
        """Entries kept out of ``d`` (sparse compressors)."""
        if self.k is not None:
            k = self.k
        else:
            k = max(1, round(self.ratio * d))
        if k > d:
            raise SpecError("k", k, f"expected k <= d = {d}", self.where)
        return k

    def shape_for(self, d: int) -> tuple[int, int]:
        """PowerSGD's matrix view ``(m, n)`` of a length-``d`` vector."""
        if self.rows is not None and self.rows > d:
            raise SpecError("rows", self.rows, f"expected rows <= d = {d}", self.where)
        return K.matrix_shape(d, self.rows or 0)

    def params(self, d: int) -> np.ndarray:
        """The kernel's ``float64[NPARAM]`` parameter array for vectors of length ``d``."""
        d = _check_int("d", d, 1, self.where)
        k = self.k_for(d) if self.name in ("top_k", "random_k") else 0
        rank = rows = 0
        if self.name == "powersgd":
            m, n = self.shape_for(d)
            if self.rank > min(m, n):
                raise SpecError("rank", self.rank, f"expected rank <= min(m, n) = {min(m, n)} "
                                f"for the {m} x {n} view of d = {d}", self.where)
            rank, rows = self.rank, m
        return K.make_params(float(k), 1.0 if self.unbiased else 0.0, float(self.levels or 0),
                             1.0 if self.elias else 0.0, float(rank), float(rows),
                             1.0 if self.error_feedback else 0.0)

    def state_size(self, d: int) -> int:
        return int(K.state_size(self.code, d, self.params(d)))

    def init_state(self, d: int, seed: int, worker: int = 0) -> np.ndarray:
        """A fresh state: zero error (with error feedback) and PowerSGD's ``Q`` from ``key(seed, worker, -1)``."""
        p = self.params(d)
        state = np.zeros(K.state_size(self.code, d, p))
        K.init_state(self.code, d, p, key(seed, worker, -1), state)
        return state

    def nominal_bits(self, d: int) -> int:
        """Bits per message where they do not depend on the data (QSGD: the fixed-width count)."""
        return int(K.nominal_bits(self.code, d, self.params(d)))


def resolve_compressor(value: str | Mapping | CompressorSpec | None, where: str | None = None) -> CompressorSpec:
    if value is None:
        return CompressorSpec()
    if isinstance(value, CompressorSpec):
        return value
    return CompressorSpec.from_dict(value, where=where)


def key(seed: int, worker: int, step: int) -> np.uint64:
    """The random key of one call: a hash of ``(seed, worker, step)``; seed and worker >= 0, step >= -1."""
    _check_int("seed", seed, 0, None)
    _check_int("worker", worker, 0, None)
    _check_int("step", step, -1, None)
    return np.uint64(K.call_key(int(seed), int(worker), int(step)))


class Compressed(NamedTuple):
    out: np.ndarray      # C(x), what the receiver reconstructs
    bits: int            # bits of the message
    state: np.ndarray    # the state after the call (updated in place when passed in)


def compress(x: Any, spec: CompressorSpec | str | Mapping, *, seed: int, step: int, worker: int = 0,
             state: np.ndarray | None = None) -> Compressed:
    """Compress one vector: ``C(x)`` and its bits, with draws from ``key(seed, worker, step)``.

    ``state`` (from :meth:`CompressorSpec.init_state`, updated in place) carries error feedback's
    error and PowerSGD's ``Q`` from call to call; ``None`` starts a fresh one.
    """
    spec = resolve_compressor(spec)
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise SpecError("x", getattr(x, "shape", x), "expected a non-empty 1-D array", spec.where)
    if not np.all(np.isfinite(arr)):
        raise SpecError("x", "non-finite entries", "expected finite numbers", spec.where)
    arr = np.ascontiguousarray(arr)
    d = arr.size
    p = spec.params(d)
    k = key(seed, worker, step)
    if state is None:
        state = spec.init_state(d, seed, worker)
    else:
        need = int(K.state_size(spec.code, d, p))
        if not isinstance(state, np.ndarray) or state.dtype != np.float64 or state.shape != (need,):
            raise SpecError("state", getattr(state, "shape", state),
                            f"expected a float64 array of shape ({need},) from init_state", spec.where)
    out = np.empty(d)
    bits = int(K.compress(spec.code, arr, out, state, p, k))
    return Compressed(out, bits, state)
