r"""Training only in renewable-curtailment windows: carbon-intensity traces, the controller, the training side.

After Wiesner et al., "Distributed LLM Pretraining During Renewable Curtailment Windows: A Feasibility
Study" (arXiv 2602.22760). A site trains while its grid's marginal carbon intensity is below a
threshold; several sites synchronise by averaging their models. Three parts:

**Traces** (:func:`generate_traces`, :func:`read_trace`). A trace is an xarray Dataset with the
variable ``intensity`` (gCO2/kWh) on ``time x site``, one value per 5 minutes (UTC). The generator
draws, for every region and day independently (seeded):

* the day's curtailed share ``q_d ~ Beta(kappa * q, kappa * (1 - q))`` around the region's share
  ``q`` of time below the reference threshold (``share_below``; ``kappa = day_concentration``);
  ``q = 0`` gives no window at all;
* windows of lognormal length (median ``window_median_h``, log-sd ``window_sigma``), clipped to
  ``[window_min_h, window_max_h]`` (10 minutes .. 11 hours) and rounded to 5-minute slots, until
  their total reaches ``q_d * 24 h`` (the last one is cut to fit);
* gaps between them of ``1 + Poisson`` slots with mean ``gap_mean_h``: the day's windows form one
  block in random order, centred at local hour ``peak_hour_local + N(0, spread_h)`` (UTC offset
  ``utc_offset_h``), wrapped around the UTC day (a day never spills into the next; a window crossing
  00:00 UTC is cut, its tail placed at the same day's start), so that the
  curtailed share of each day is exactly ``q_d`` and the long-run share is ``q``;
* in a window, an intensity ``Gamma(shape 2)`` of mean ``in_level``, kept below the reference
  threshold (100 gCO2/kWh, the paper's); outside, ``off_level * (1 + x_t)`` with ``x_t`` an AR(1)
  process of lag-one correlation ``off_corr`` and standard deviation ``off_noise``, kept above it.

:data:`REGIONS` holds the parameters for California, Texas, South Australia and Germany: the
shares and off-window levels are the paper's (``STUDIES.md``); window lengths, daytime clustering,
in-window level and noise are our reading of the paper's description and of the 18-hour WattTime
excerpt in the paper's repository (``mci.csv``: in-window 5-90 g/kWh, off-window noise of a few
per cent, windows of 2 to 10 hours broken by gaps of 5 to 15 minutes), not a fit to the full traces, which we do not have.

**Controller** (:mod:`trainscale.kernels.curtailment`, run by :func:`run_policy`): the paper's
policy, polled every 10 s: a site provisions (240 s, idle power) when below the threshold, trains,
and stops after 600 s above it; with two or more sites training a round ends after 600 s and the
models are averaged (weighted by batches; the transfer takes :func:`averaging_time_s`); a lone
site trains on. The policy's parameters are a :class:`Policy`.

**Training side.** :func:`site_step` prices one iteration (one global batch of the paper, 524,288
tokens) on one site with the performance model (:func:`trainscale.model.perfmodel.predict`: nanochat-d20
data parallel on 4 A100); :func:`averaging_time_s` is a ring all-reduce of the model over the WAN
link (:func:`trainscale.training.wallclock.allreduce_time_s`). Energy is the integral of the sites' power
over the timeline, emissions the integral of power times intensity. The statistical
cost of averaging comes from the convergence engine (:func:`averaging_cost`): SGD on a generated
problem over each run's measured schedule of rounds (:func:`round_schedule`: the steps each site
took between averages, who joined, who averaged), against one site taking the same steps in
sequence (the paper finds perplexity 14.64 vs 14.73, i.e. no cost).
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import xarray as xr

from ..model import perfmodel
from ..common.checks import check_float, check_int
from ..common.io import provenance
from ..kernels import curtailment as K
from ..model.specs import PlanSpec, RunSpec, SpecError, resolve_model, resolve_system
from ..training.wallclock import Link, allreduce_time_s

__all__ = ["RegionTrace", "REGIONS", "Policy", "PAPER_POLICY", "SLOT_S", "REFERENCE_THRESHOLD",
           "generate_traces", "read_trace", "site_step", "averaging_time_s", "run_policy", "always_on",
           "round_schedule", "averaging_cost", "STATE_NAMES", "PAPER_TRACE", "PAPER_TRACE_URL",
           "paper_trace_path", "fetch_paper_trace", "read_paper_trace", "window_timing"]

SLOT_S = 300.0  # 5-minute trace resolution (WattTime's marginal operating emissions rate)
SLOTS_PER_DAY = 288
#: The threshold the regions' shares and levels refer to (the paper's, gCO2/kWh).
REFERENCE_THRESHOLD = 100.0
STATE_NAMES = ("off", "provisioning", "training")
DEFAULT_START = "2026-01-11T00:00:00"


@dataclass(frozen=True)
class RegionTrace:
    """Parameters of one region's generated trace (see the module docstring)."""

    name: str
    utc_offset_h: float
    share_below: float
    off_level: float
    window_median_h: float = 3.0
    window_sigma: float = 0.8
    window_min_h: float = 10 / 60
    window_max_h: float = 11.0
    gap_mean_h: float = 0.5
    peak_hour_local: float = 13.0
    spread_h: float = 1.5
    day_concentration: float = 8.0
    in_level: float = 35.0
    off_noise: float = 0.03
    off_corr: float = 0.98

    def check(self) -> "RegionTrace":
        """The parameters' ranges; a bad one raises :class:`SpecError` naming the field and the region."""
        if not isinstance(self.name, str) or not self.name:
            raise SpecError("name", self.name, "expected a non-empty region name")
        try:
            self._check_ranges()
        except SpecError as err:
            raise SpecError(err.field, err.value, err.valid, f"region {self.name}") from None
        return self

    def _check_ranges(self) -> None:
        check_float("share_below", self.share_below, 0.0, 0.95)
        check_float("utc_offset_h", self.utc_offset_h, -14.0, 14.0)
        check_float("off_level", self.off_level, REFERENCE_THRESHOLD, 5000.0, open_min=True)
        check_float("window_min_h", self.window_min_h, 2 * SLOT_S / 3600 - 1e-9, 24.0)
        check_float("window_max_h", self.window_max_h, self.window_min_h, 24.0)
        check_float("window_median_h", self.window_median_h, self.window_min_h, self.window_max_h)
        for name in ("window_sigma", "gap_mean_h", "spread_h", "off_noise"):
            check_float(name, getattr(self, name), 0.0, 24.0)
        check_float("peak_hour_local", self.peak_hour_local, 0.0, 24.0)
        check_float("day_concentration", self.day_concentration, 0.0, 1e6, open_min=True)
        check_float("in_level", self.in_level, 0.0, REFERENCE_THRESHOLD, open_min=True, open_max=True)
        check_float("off_corr", self.off_corr, 0.0, 1.0, open_max=True)


#: The paper's regions, fitted to the paper's trace (:data:`PAPER_TRACE`, :func:`window_timing`): share of
#: time below 100 g/kWh, off-window level and the windows' centre in local time (California 12:18 and South
#: Australia 13:25, solar; Texas 00:35, wind at night), so that the windows are staggered as in the trace;
#: UTC offsets of January (the paper's runs). South Australia's windows are longer (its share is the
#: largest; one 10.5-hour window in the trace). Window lengths, spread and noise are ours (module docstring).
REGIONS = {
    "CA": RegionTrace("CA", utc_offset_h=-8.0, share_below=0.34, off_level=443.0, peak_hour_local=12.3),
    "TX": RegionTrace("TX", utc_offset_h=-6.0, share_below=0.38, off_level=642.0, peak_hour_local=0.6),
    "SA": RegionTrace("SA", utc_offset_h=10.5, share_below=0.58, off_level=835.0, window_median_h=6.0,
                      peak_hour_local=13.4),
    "DE": RegionTrace("DE", utc_offset_h=1.0, share_below=0.0, off_level=752.0),
}


def _region(value) -> RegionTrace:
    if isinstance(value, RegionTrace):
        return value.check()
    if isinstance(value, str) and value in REGIONS:
        return REGIONS[value]
    raise SpecError("regions", value, f"expected one of {', '.join(REGIONS)} or a RegionTrace")


def _day_windows(rng: np.random.Generator, r: RegionTrace) -> np.ndarray:
    """Boolean mask of one day's curtailed slots (288, in UTC slots of that day)."""
    mask = np.zeros(SLOTS_PER_DAY, dtype=bool)
    if r.share_below <= 0.0:
        return mask
    q = rng.beta(r.day_concentration * r.share_below, r.day_concentration * (1.0 - r.share_below))
    want = int(round(q * SLOTS_PER_DAY))
    lo, hi = int(round(r.window_min_h * 12)), int(round(r.window_max_h * 12))
    lengths = []
    while sum(lengths) < want:
        h = r.window_median_h * math.exp(r.window_sigma * rng.standard_normal())
        lengths.append(int(np.clip(round(h * 12), lo, hi)))
    if not lengths:
        return mask
    lengths[-1] -= sum(lengths) - want
    if lengths[-1] < lo and len(lengths) == 1:  # a day with less than one shortest window: all or nothing
        if rng.random() >= want / lo:
            return mask
        lengths[-1] = want = lo
    if lengths[-1] < lo and len(lengths) > 1:
        tail = lengths.pop()
        lengths[-1] += tail  # a sliver (under 10 minutes) joins its neighbour
    gaps = 1 + rng.poisson(max(r.gap_mean_h * 12 - 1, 0.0), size=len(lengths) - 1)
    room = SLOTS_PER_DAY - want - 1
    while gaps.sum() > room and gaps.max() > 1:  # the day's block must fit in the day
        gaps = np.maximum(1, gaps // 2)
    order = rng.permutation(len(lengths))
    block = sum(lengths) + int(gaps.sum())
    centre_local = r.peak_hour_local + r.spread_h * rng.standard_normal()
    start = int(round((centre_local - r.utc_offset_h) * 12 - block / 2))
    pos = start
    for i, w in enumerate(order):
        mask[np.arange(pos, pos + lengths[w]) % SLOTS_PER_DAY] = True
        pos += lengths[w] + (int(gaps[i]) if i < len(gaps) else 0)
    return mask


def _levels(rng: np.random.Generator, r: RegionTrace, mask: np.ndarray) -> np.ndarray:
    n = mask.size
    x = np.empty(n)
    innov = r.off_noise * math.sqrt(1.0 - r.off_corr ** 2) * rng.standard_normal(n)
    x[0] = r.off_noise * rng.standard_normal()
    for i in range(1, n):
        x[i] = r.off_corr * x[i - 1] + innov[i]
    off = np.maximum(r.off_level * (1.0 + x), REFERENCE_THRESHOLD * 1.01)
    inside = np.minimum(rng.gamma(2.0, r.in_level / 2.0, size=n), REFERENCE_THRESHOLD * 0.99)
    return np.where(mask, inside, off)


def generate_traces(regions: Sequence = ("CA", "TX", "SA", "DE"), days: int = 14, seed: int = 0,
                    start: str = DEFAULT_START) -> xr.Dataset:
    """Seeded 5-minute marginal-carbon-intensity traces, ``time x site`` (gCO2/kWh), ``days`` long from
    ``start`` (UTC). Each region draws from its own stream (``SeedSequence(seed).spawn``), so adding a
    region leaves the others' traces unchanged."""
    rs = [_region(v) for v in (regions if not isinstance(regions, str) else [regions])]
    if not rs or len({r.name for r in rs}) != len(rs):
        raise SpecError("regions", [r.name for r in rs], "expected a non-empty list of distinct regions")
    days = check_int("days", days, 1, 3650)
    seed = check_int("seed", seed, 0)
    streams = np.random.SeedSequence(seed).spawn(len(rs))
    data = np.empty((days * SLOTS_PER_DAY, len(rs)))
    for j, (r, ss) in enumerate(zip(rs, streams)):
        rng = np.random.default_rng(ss)
        mask = np.concatenate([_day_windows(rng, r) for _ in range(days)])
        data[:, j] = _levels(rng, r, mask)
    time = np.datetime64(start, "ns") + np.arange(days * SLOTS_PER_DAY) * np.timedelta64(int(SLOT_S), "s")
    ds = _trace_dataset(data, time, [r.name for r in rs])
    ds.attrs.update(provenance({"regions": [asdict(r) for r in rs], "days": days, "start": start}, seed))
    return ds


def _trace_dataset(data: np.ndarray, time, sites: list[str]) -> xr.Dataset:
    ds = xr.Dataset({"intensity": (("time", "site"), data, {"units": "gCO2/kWh",
                                                               "long_name": "marginal carbon intensity"})},
                    coords={"time": time, "site": sites})
    ds["time"].attrs.update({"long_name": "time (UTC), start of the 5-minute interval"})
    ds["site"].attrs.update({"long_name": "site (grid region)"})
    return ds


# ---------------------------------------------------------------------------------------------
# a user's own trace

TRACE_SCHEMA = ("CSV: a header row 'time,<site>,<site>,...'; 'time' is an ISO 8601 UTC timestamp, one row per "
                "5 minutes, increasing without gaps; each site column a finite intensity >= 0 in gCO2/kWh. "
                "netCDF: a variable 'intensity' (gCO2/kWh) on dims (time, site) with the same time rule")


def _check_times(times: np.ndarray, where: str, first_row: int) -> None:
    if times.size < 1:
        raise SpecError("time", "", f"expected at least one row; {TRACE_SCHEMA}", where)
    steps = np.diff(times).astype("timedelta64[s]").astype(np.int64)
    bad = np.flatnonzero(steps != int(SLOT_S))
    if bad.size:
        i = int(bad[0]) + 1
        raise SpecError("time", str(times[i]), f"row {i + first_row}: expected {int(SLOT_S)} s after the previous row", where)


def _read_csv(path: Path) -> xr.Dataset:
    where = str(path)
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows or not rows[0] or rows[0][0].strip() != "time":
        raise SpecError("header", rows[0] if rows else "", "expected the first column 'time'; " + TRACE_SCHEMA, where)
    sites = [c.strip() for c in rows[0][1:]]
    if not sites or any(not s for s in sites) or len(set(sites)) != len(sites):
        raise SpecError("header", rows[0], "expected one or more distinct, non-empty site columns after 'time'", where)
    times, values = [], np.empty((len(rows) - 1, len(sites)))
    for i, row in enumerate(rows[1:]):
        rowno = i + 2  # 1-based, the header is row 1
        if len(row) != len(sites) + 1:
            raise SpecError("row", rowno, f"has {len(row)} fields; expected {len(sites) + 1} (time and each site)", where)
        try:
            times.append(np.datetime64(row[0].strip().replace("Z", "").split("+")[0], "ns"))
        except ValueError:
            raise SpecError("time", row[0], f"row {rowno}: expected an ISO 8601 timestamp", where) from None
        for j, site in enumerate(sites):
            try:
                v = float(row[j + 1])
            except ValueError:
                v = math.nan
            if not (math.isfinite(v) and v >= 0):
                raise SpecError(site, row[j + 1], f"row {rowno}: expected a finite intensity >= 0 (gCO2/kWh)", where)
            values[i, j] = v
    times = np.asarray(times, dtype="datetime64[ns]")
    _check_times(times, where, 2)
    return _trace_dataset(values, times, sites)


def _read_netcdf(path: Path) -> xr.Dataset:
    where = str(path)
    try:
        raw = xr.open_dataset(path).load()
    except Exception as err:  # noqa: BLE001 - any reader failure is one line
        raise SpecError("file", path.name, f"is not a readable netCDF file ({type(err).__name__})", where) from None
    if "intensity" not in raw or tuple(raw["intensity"].dims) != ("time", "site"):
        raise SpecError("intensity", sorted(raw.data_vars), "expected a variable 'intensity' on dims (time, site); "
                        + TRACE_SCHEMA, where)
    values = np.asarray(raw["intensity"].values, dtype=float)
    bad = np.argwhere(~(np.isfinite(values) & (values >= 0)))
    if bad.size:
        i, j = map(int, bad[0])
        raise SpecError(str(raw["site"].values[j]), float(values[i, j]),
                        f"row {i + 1}: expected a finite intensity >= 0 (gCO2/kWh)", where)
    times = np.asarray(raw["time"].values).astype("datetime64[ns]")
    _check_times(times, where, 1)
    return _trace_dataset(values, times, [str(s) for s in raw["site"].values])


def read_trace(path) -> xr.Dataset:
    """A user's trace (``.csv`` or ``.nc``, schema :data:`TRACE_SCHEMA`) as a trace Dataset; a bad file
    raises :class:`SpecError` with one line naming the column and row."""
    path = Path(path)
    if not path.is_file():
        raise SpecError("trace", str(path), "no such file")
    if path.suffix.lower() == ".csv":
        return _read_csv(path)
    if path.suffix.lower() in (".nc", ".nc4", ".netcdf"):
        return _read_netcdf(path)
    raise SpecError("trace", path.name, "expected a .csv or .nc file; " + TRACE_SCHEMA)


# ---------------------------------------------------------------------------------------------
# the paper's own trace

#: The paper's trace: ``evaluation/mci.csv`` of the paper's repository (github.com/exalsius/curtail-llm, read
#: at the commit below): WattTime's 5-minute marginal operating emissions rate (gCO2/kWh) of CAISO_NORTH,
#: SPP_TX, NEM_SA and DE from 2026-01-11 17:00 UTC to 2026-01-12 11:00 UTC (217 rows), which the
#: repository's ``evaluation/energy_simulation.py`` replays from ``SIM_START = 2026-01-11 17:00 UTC`` for the
#: paper's runs (``analysis/notebook.py`` integrates power times this trace for every emission the paper
#: reports). Licence: the repository states none (no LICENSE file; README and pyproject name none) and the
#: values are WattTime's data, so the file is not redistributed with trainscale: :func:`fetch_paper_trace`
#: copies it into ``external/`` (git-ignored), and :func:`read_paper_trace` refuses any file whose sha256
#: differs from the one recorded here.
PAPER_TRACE = {
    "repo": "exalsius/curtail-llm",
    "commit": "017258ff2d0f83abe77264be7f958421daf81c00",
    "path": "evaluation/mci.csv",
    "sha256": "5f557c35977f361deac9f64ea0721efeafa95d8f7e38295010c98bd475bb21a0",
    "start": "2026-01-11T17:00:00",
    "columns": {"CAISO_NORTH": "CA", "SPP_TX": "TX", "NEM_SA": "SA", "DE": "DE"},
    "licence": ("none stated by the repository (no LICENSE file); the values are WattTime data: not "
                "redistributed, fetched by `trainscale fetch-trace` and checked by sha256"),
}
PAPER_TRACE_URL = ("https://raw.githubusercontent.com/{repo}/{commit}/{path}".format(**PAPER_TRACE))


def paper_trace_path() -> Path:
    """Where :func:`fetch_paper_trace` puts the paper's trace and :func:`read_paper_trace` looks for it:
    ``$TRAINSCALE_EXTERNAL/curtail-llm/mci.csv``, by default ``external/`` at the checkout's root."""
    import os

    root = os.environ.get("TRAINSCALE_EXTERNAL")
    base = Path(root) if root else Path(__file__).resolve().parents[3] / "external"
    return base / "curtail-llm" / "mci.csv"


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def fetch_paper_trace(dest=None, git_dir=None) -> Path:
    """Copy the paper's trace (:data:`PAPER_TRACE`) to ``dest`` (default :func:`paper_trace_path`), from a
    local clone of the paper's repository (``git_dir``: ``git show <commit>:<path>``) or else from
    :data:`PAPER_TRACE_URL`; the bytes must have the recorded sha256, else nothing is written. Run by hand
    (``trainscale fetch-trace``), never by a study: studies read only local files."""
    import subprocess
    import urllib.request

    dest = Path(dest) if dest is not None else paper_trace_path()
    if git_dir is not None:
        spec = f"{PAPER_TRACE['commit']}:{PAPER_TRACE['path']}"
        done = subprocess.run(["git", "--git-dir", str(git_dir), "show", spec], capture_output=True, check=False)
        if done.returncode:
            raise SpecError("git_dir", str(git_dir), f"has no {spec}: {done.stderr.decode().strip()[:200]}")
        data = done.stdout
    else:
        with urllib.request.urlopen(PAPER_TRACE_URL, timeout=60) as response:  # noqa: S310 - fixed https URL
            data = response.read()
    got = _sha256(data)
    if got != PAPER_TRACE["sha256"]:
        raise SpecError("sha256", got, f"expected {PAPER_TRACE['sha256']} (the paper's mci.csv at "
                        f"{PAPER_TRACE['commit'][:10]}); nothing written")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def read_paper_trace(path=None) -> xr.Dataset:
    """The paper's trace as a trace Dataset (sites ``CA``, ``TX``, ``SA``, ``DE``; time from 2026-01-11
    17:00 UTC), after checking the file's sha256 against :data:`PAPER_TRACE`. A missing file raises
    :class:`SpecError` saying how to fetch it."""
    path = Path(path) if path is not None else paper_trace_path()
    if not path.is_file():
        raise SpecError("paper_trace", str(path), "no such file: run `trainscale fetch-trace` (it downloads "
                        f"{PAPER_TRACE_URL} and checks its sha256), or `trainscale fetch-trace --git-dir "
                        "<clone of exalsius/curtail-llm>/.git`")
    data = path.read_bytes()
    got = _sha256(data)
    if got != PAPER_TRACE["sha256"]:
        raise SpecError("paper_trace", str(path), f"sha256 {got} is not the paper's {PAPER_TRACE['sha256']}")
    rows = list(csv.reader(data.decode().splitlines()))
    header, body = rows[0], rows[1:]
    if header[0] != "point_time" or set(header[1:]) != set(PAPER_TRACE["columns"]):
        raise SpecError("header", header, f"expected point_time and {', '.join(PAPER_TRACE['columns'])}", str(path))
    times = np.asarray([np.datetime64(r[0].split("+")[0].replace(" ", "T"), "ns") for r in body])
    _check_times(times, str(path), 2)
    values = np.asarray([[float(v) for v in r[1:]] for r in body])
    ds = _trace_dataset(values, times, [PAPER_TRACE["columns"][c] for c in header[1:]])
    ds.attrs.update({"source": f"github.com/{PAPER_TRACE['repo']} {PAPER_TRACE['path']} at {PAPER_TRACE['commit']}",
                     "sha256": PAPER_TRACE["sha256"], "licence": PAPER_TRACE["licence"]})
    return ds


def window_timing(trace: xr.Dataset, threshold: float = REFERENCE_THRESHOLD,
                  utc_offsets_h: Mapping[str, float] | None = None) -> dict:
    r"""Each site's curtailment timing in a trace: ``share`` below ``threshold``, the ``centre_local_h`` of its
    curtailed slots (circular mean of their local hour of day, the slot's middle; UTC offset from
    :data:`REGIONS` unless given) and ``windows`` (start, end) in hours since the trace's start. The
    generator's ``peak_hour_local`` of each region is this centre on the paper's trace.

    .. math:: c = \frac{24}{2\pi}\,\operatorname{atan2}\Big(\sum_t \sin\frac{2\pi h_t}{24},\ \sum_t \cos\frac{2\pi h_t}{24}\Big) \bmod 24
    """
    offsets = dict(utc_offsets_h or {k: v.utc_offset_h for k, v in REGIONS.items()})
    t0 = trace["time"].values[0]
    hours_utc = ((trace["time"].values - t0.astype("datetime64[D]")) / np.timedelta64(1, "s") + SLOT_S / 2) / 3600
    since = (trace["time"].values - t0) / np.timedelta64(1, "s") / 3600
    out = {}
    for site in trace["site"].values:
        below = np.asarray(trace["intensity"].sel(site=site).values) < threshold
        entry = {"share": float(below.mean()), "centre_local_h": float("nan"), "windows": []}
        if below.any():
            ang = 2 * np.pi * ((hours_utc[below] + offsets[str(site)]) % 24) / 24
            entry["centre_local_h"] = float((np.arctan2(np.sin(ang).sum(), np.cos(ang).sum()) * 24 / (2 * np.pi)) % 24)
            edges = np.diff(np.concatenate([[0], below.astype(np.int8), [0]]))
            starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
            entry["windows"] = [(float(since[a]), float(since[b - 1] + SLOT_S / 3600)) for a, b in zip(starts, ends)]
        out[str(site)] = entry
    return out


# ---------------------------------------------------------------------------------------------
# training side


def site_step(model: str = "nanochat-d20", system: str = "dgx-a100-80gb", gpus: int = 4,
              batch_tokens: int = 524288, micro_batch: int = 8) -> dict:
    """One iteration (a global batch of ``batch_tokens``) on one site of ``gpus`` GPUs, data parallel
    with gradient accumulation (as nanochat: ``micro_batch`` sequences per GPU and micro-step), priced by
    the performance model: ``step_s``, ``tokens``, ``params``, ``power_W`` (the GPUs' predicted power)."""
    m = resolve_model(model)
    s = resolve_system(system)
    gpus = check_int("gpus", gpus, 1, s.gpus_per_node)
    micro_batch = check_int("micro_batch", micro_batch, 1, 1024)
    batch_tokens = check_int("batch_tokens", batch_tokens, 1)
    if batch_tokens % (m.seq_len * gpus * micro_batch):
        raise SpecError("batch_tokens", batch_tokens,
                        f"expected a multiple of seq_len x gpus x micro_batch = {m.seq_len * gpus * micro_batch}")
    plan = PlanSpec(dp=gpus, micro_batch=micro_batch, global_batch=batch_tokens // m.seq_len, recompute="none",
                    flash_attention=True, overlap_grad_reduce=True)
    pred = perfmodel.predict(RunSpec(id=f"{m.name}@{s.name}x{gpus}", model=m, system=s, plan=plan))
    if not pred.fits:
        raise SpecError("micro_batch", micro_batch, f"{m.name} does not fit on {s.name}: {pred.reason}")
    return {"step_s": float(pred.step_time_s), "tokens": batch_tokens, "params": int(m.params()),
            "power_W": float(pred.power_W_per_gpu) * gpus}


def averaging_time_s(params: int, sites: int, bandwidth_GBps: float, latency_s: float,
                     bytes_per_value: float = 2.0) -> float:
    """Seconds to average ``sites`` models of ``params`` values over WAN links of ``bandwidth_GBps`` and
    ``latency_s`` per site: a ring all-reduce (:func:`trainscale.training.wallclock.allreduce_time_s`)."""
    link = Link(bandwidth_GBps, latency_s)
    return allreduce_time_s(params * check_float("bytes_per_value", bytes_per_value, 0.0, open_min=True),
                            check_int("sites", sites, 1), link)


@dataclass(frozen=True)
class Policy:
    """The controller's parameters (s and gCO2/kWh); :data:`PAPER_POLICY` is the paper's."""

    threshold: float = 100.0
    poll_s: float = 10.0
    provision_s: float = 240.0
    hysteresis_s: float = 600.0
    round_s: float = 600.0

    def check(self) -> "Policy":
        check_float("threshold", self.threshold, 0.0, open_min=True)
        check_float("poll_s", self.poll_s, 0.0, SLOT_S, open_min=True)
        if abs(SLOT_S / self.poll_s - round(SLOT_S / self.poll_s)) > 1e-9:
            raise SpecError("poll_s", self.poll_s, f"expected a divisor of the trace step, {SLOT_S:g} s")
        for name in ("provision_s", "hysteresis_s", "round_s"):
            check_float(name, getattr(self, name), 0.0, 7 * 86400.0)
        return self


PAPER_POLICY = Policy()


def run_policy(trace: xr.Dataset, policy: Policy, step_s: Sequence[float], train_W: Sequence[float],
               idle_W: Sequence[float], target_batches: float, sync_s: Sequence[float]) -> dict:
    """Run the controller (:func:`trainscale.kernels.curtailment.simulate`) over every site of ``trace``.

    ``step_s``, ``train_W``, ``idle_W``: per site; ``sync_s[n]``: seconds to average ``n`` models (index
    0 .. sites). Returns per-site arrays (``train_s``, ``idle_s``, ``energy_J``, ``emissions_g``,
    ``batches``, ``starts``), the run's ``end_s`` (NaN: not finished within the trace),
    ``first_start_s``, ``rounds``, ``sync_s``, ``batches``, ``states`` (sites x polls, ``STATE_NAMES``),
    ``batches_log`` (sites x polls: batches trained in each poll interval) and ``sync_log`` (polls: sites
    averaging where a round closes, else 0); the last three feed :func:`round_schedule`."""
    policy = policy.check()
    values = np.ascontiguousarray(np.asarray(trace["intensity"].transpose("site", "time").values, dtype=float))
    S = values.shape[0]
    arrays = {}
    for name, v in (("step_s", step_s), ("train_W", train_W), ("idle_W", idle_W)):
        a = np.asarray(v, dtype=float).reshape(-1)
        if a.size != S or not np.all(np.isfinite(a)) or np.any(a < 0) or (name == "step_s" and np.any(a <= 0)):
            raise SpecError(name, list(a), f"expected {S} finite values {'> 0' if name == 'step_s' else '>= 0'}, one per site")
        arrays[name] = a
    sync = np.asarray(sync_s, dtype=float)
    if sync.size != S + 1 or not np.all(np.isfinite(sync)) or np.any(sync < 0):
        raise SpecError("sync_s", list(sync), f"expected {S + 1} finite values >= 0 (index: sites averaging)")
    target = check_float("target_batches", target_batches, 0.0, open_min=True)
    polls = int(values.shape[1] * SLOT_S / policy.poll_s)
    states = np.zeros((S, polls), dtype=np.int8)
    batches_log = np.zeros((S, polls))
    sync_log = np.zeros(polls, dtype=np.int8)
    per_site, run = K.simulate(values, SLOT_S, policy.poll_s, policy.threshold, policy.provision_s,
                               policy.hysteresis_s, policy.round_s, arrays["step_s"], sync, arrays["train_W"],
                               arrays["idle_W"], target, states, batches_log, sync_log)
    out = {name: per_site[:, slot].copy() for name, slot in (
        ("train_s", K.R_TRAIN_S), ("idle_s", K.R_IDLE_S), ("energy_J", K.R_ENERGY_J),
        ("emissions_g", K.R_EMISSIONS_G), ("batches", K.R_BATCHES), ("starts", K.R_STARTS))}
    out.update({"end_s": float(run[K.G_END_S]), "first_start_s": float(run[K.G_FIRST_START_S]),
                "rounds": int(run[K.G_ROUNDS]), "sync_s": float(run[K.G_SYNC_S]),
                "batches_total": float(run[K.G_BATCHES]), "states": states, "batches_log": batches_log,
                "sync_log": sync_log})
    return out


def round_schedule(result: Mapping) -> dict:
    """The averaging schedule of a :func:`run_policy` result, for the convergence engine.

    Rounds are the stretches between two polls where a round closes (``sync_log``); in each, a
    site's ``steps`` are the whole batches it completed (``floor`` of its cumulative batches at the
    round's end minus at its start, so no batch is counted twice), ``joins`` marks the round in
    which a site starts a spell of training (it then restarts from the last average), and
    ``averages`` the sites training at the poll where the round closes."""
    states = np.asarray(result["states"])
    log = np.asarray(result["batches_log"], dtype=float)
    syncs = np.flatnonzero(np.asarray(result["sync_log"]) > 0)
    S, polls = states.shape
    bounds = np.concatenate([[0], syncs, [polls]])
    cum = np.floor(np.concatenate([np.zeros((S, 1)), np.cumsum(log, axis=1)], axis=1) + 1e-9)
    steps = np.diff(cum[:, bounds], axis=1).T.astype(np.int64)
    training = states == K.TRAINING
    spell_start = training & ~np.concatenate([np.zeros((S, 1), bool), training[:, :-1]], axis=1)
    round_of = np.searchsorted(bounds, np.arange(polls), side="right") - 1
    joins = np.zeros(steps.shape, bool)
    for k, i in zip(*np.nonzero(spell_start)):
        joins[round_of[i], k] = True
    averages = np.zeros(steps.shape, bool)
    averages[: len(syncs)] = training[:, syncs].T
    return {"steps": steps, "joins": joins, "averages": averages}


def averaging_cost(result: Mapping, problem, lr: float = 0.05, batch_size: int = 8, seed: int = 0) -> dict:
    """The statistical cost of the run's model averaging: the convergence engine's SGD on
    ``problem`` (:func:`trainscale.training.convergence.run_schedule`) over the run's schedule
    (:func:`round_schedule`), against one site taking the same number of steps in sequence with
    the same mini-batches. Returns ``loss``, ``single_loss``, ``loss_ratio`` (multi-site over one
    site) and ``steps``."""
    from ..training import convergence

    sched = round_schedule(result)
    multi = convergence.run_schedule(problem, sched["steps"], sched["joins"], sched["averages"], lr, batch_size, seed)
    total = np.array([[multi["steps"]]], dtype=np.int64)
    single = convergence.run_schedule(problem, total, np.ones((1, 1), bool), np.zeros((1, 1), bool), lr,
                                      batch_size, seed)
    return {"loss": multi["loss"], "single_loss": single["loss"], "loss_ratio": multi["loss"] / single["loss"],
            "steps": multi["steps"]}


def always_on(trace: xr.Dataset, site: str, step_s: float, train_W: float, target_batches: float) -> dict:
    """The single-site baseline: one site training from the trace's start without pause (``end_s``,
    ``energy_J``, ``emissions_g``; NaN when the trace is too short)."""
    values = np.ascontiguousarray(np.asarray(trace["intensity"].sel(site=site).values, dtype=float))
    end, energy, emissions = K.always_on(values, SLOT_S, check_float("step_s", step_s, 0.0, open_min=True),
                                         check_float("train_W", train_W, 0.0),
                                         check_float("target_batches", target_batches, 0.0, open_min=True))
    return {"end_s": float(end), "energy_J": float(energy), "emissions_g": float(emissions)}


def share_below(trace: xr.Dataset, threshold: float = REFERENCE_THRESHOLD) -> xr.DataArray:
    """Share of each site's time with the intensity below ``threshold``."""
    return (trace["intensity"] < threshold).mean("time")


def trace_parameters(regions: Mapping[str, RegionTrace] | None = None) -> dict:
    """The generator's parameters of each region, as plain dicts (for provenance)."""
    return {k: asdict(v) for k, v in (regions or REGIONS).items()}
