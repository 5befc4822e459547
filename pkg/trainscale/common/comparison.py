"""Paper-vs-ours comparison records: one row per claim a study checks against its paper.

Every study module has a ``compare(folder)`` function that reads the study's *saved datasets* (the
committed full-mode ones in ``figures/<study>/``, or any run's output folder) and returns a list of
:class:`Record`. The study's notebook writes them to ``<folder>/comparison.csv``; ``trainscale verify``
(``make verify``) recomputes them from the committed datasets and fails when the committed records no
longer follow from the data; ``trainscale gallery`` builds the README's comparison table from them.

The verdict is not chosen by the study: :func:`judge` derives it from the two numbers with one rule for
every study (the README states it above the table),

* **reproduced** -- our value is within ``rel_tol`` (default 25%) of the paper's, in the paper's setting;
* **partly** -- the effect points the paper's way and its size is within a factor of two of the paper's
  (:data:`SIZE_FACTOR`; the size measured from ``neutral``, the value of no effect: a speed-up's excess over 1,
  see :func:`effect_ratio`), or the numbers agree within ``rel_tol`` but only in a labelled different setting
  (``same_setting=False``);
* **not reproduced** -- the effect is absent or reversed (whatever the size: a value close to the paper's but
  on the other side of ``neutral`` is a reversal), more than a factor of two off in size, our value is not
  finite, or (with no ``neutral``) outside the tolerance;
* **not tested** -- the claim needs what this project does not model or run (a GPU where we run a CPU, a
  production pipeline), said in one line (:func:`not_tested`), or the paper gives a direction and no size that
  ours could be weighed against (:func:`directional`); counted apart, never as partly.

A claim the paper states as a direction only (no number) is recorded with :func:`directional`: its paper value
is empty; pointing the other way it is not reproduced, pointing the paper's way it is not tested (the size test
cannot be run); a study that can state the size the paper implies records it with :func:`numeric` instead. An
accuracy target (an error that must stay at or below a bound, as the model's validation against measured runs)
is recorded with :func:`within_target`: reproduced at or below the bound, partly up to twice the bound (the same
factor), not reproduced beyond. A record true by construction (a search seeded with the baseline cannot do
worse than it) or a self-check (two schedules computing the same update, a textbook rate) is a test of the
study, not a record.

A study states the paper's setting and ours in words, and, where a free analysis choice (a target loss,
a reference size, a threshold) is not fixed by the paper, the range of our value over the swept choice
(``free_parameter``, ``our_low``, ``our_high``).
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["Record", "numeric", "directional", "within_target", "not_tested", "effect_ratio", "write_records",
           "read_records", "records_table", "counts", "SIZE_FACTOR", "VERDICTS", "DEFAULT_REL_TOL", "RECORDS_FILE", "diff_records"]

VERDICTS = ("reproduced", "partly", "not reproduced", "not tested")
DEFAULT_REL_TOL = 0.25
#: "partly" allows our effect (measured from no effect) to be up to this factor larger or smaller than the paper's.
SIZE_FACTOR = 2.0
RECORDS_FILE = "comparison.csv"
# Records recomputed on another machine may differ in the last bits (Numba, LLVM and BLAS do not
# promise bitwise equal floats across CPUs): values are compared with this relative tolerance.
VERIFY_RTOL = 1e-6


@dataclass(frozen=True)
class Record:
    """One claim of a paper and what this project finds for it."""

    study: str
    quantity: str
    units: str
    paper_value: float
    paper_setting: str
    our_value: float
    our_setting: str
    same_setting: bool
    rel_tol: float
    neutral: float
    verdict: str
    reason: str
    free_parameter: str = ""
    our_low: float = math.nan
    our_high: float = math.nan

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict: {self.verdict!r} is not one of {', '.join(VERDICTS)}")


def _side(value: float, neutral: float) -> int:
    return (value > neutral) - (value < neutral)


def effect_ratio(paper_value: float, our_value: float, neutral: float) -> float:
    """Our effect over the paper's, both measured from ``neutral`` (no effect): for speed-ups 1.9x against 50x,
    0.9 / 49 = 0.018. Positive when both point the same way."""
    return (our_value - neutral) / (paper_value - neutral)


def judge(paper_value: float, our_value: float, *, rel_tol: float = DEFAULT_REL_TOL,
          neutral: float = math.nan, same_setting: bool = True) -> tuple[str, str]:
    """(verdict, why) for one numeric claim; the rule of the module docstring."""
    if not math.isfinite(our_value):
        return "not reproduced", "our value is not finite (the effect is not reached)"
    gap = (our_value - paper_value) / abs(paper_value) if paper_value else math.inf
    within = abs(our_value - paper_value) <= rel_tol * abs(paper_value)
    if math.isfinite(neutral) and not (_side(our_value, neutral) != 0
                                       and _side(our_value, neutral) == _side(paper_value, neutral)):
        return "not reproduced", (f"the effect is absent or reversed (ours {our_value:.3g}, paper "
                                  f"{paper_value:.3g}, no effect at {neutral:g})")
    if within and same_setting:
        return "reproduced", f"within {rel_tol:.0%} of the paper ({gap:+.0%})"
    if within:
        return "partly", f"within {rel_tol:.0%} of the paper ({gap:+.0%}), but in a different setting"
    if not math.isfinite(neutral):
        return "not reproduced", f"differs from the paper by {gap:+.0%} (tolerance {rel_tol:.0%})"
    size = effect_ratio(paper_value, our_value, neutral)
    sized = f"the paper's direction, with {size:.2g}x the paper's effect (measured from {neutral:g})"
    if 1 / SIZE_FACTOR <= size <= SIZE_FACTOR:
        return "partly", f"{sized}: within a factor of {SIZE_FACTOR:g}"
    return "not reproduced", f"{sized}: more than a factor of {SIZE_FACTOR:g} off in size"


def numeric(study: str, quantity: str, units: str, *, paper_value: float, paper_setting: str,
            our_value: float, our_setting: str, same_setting: bool = True,
            rel_tol: float = DEFAULT_REL_TOL, neutral: float = math.nan, note: str = "",
            free_parameter: str = "", sweep: Iterable[float] = ()) -> Record:
    """A record whose verdict follows from the numbers (see :func:`judge`).

    ``note`` is appended to the automatic reason (the study's explanation of a gap); ``sweep`` is our
    value over the free analysis choice named in ``free_parameter`` (its min and max are recorded).
    """
    our_value = float(our_value)
    verdict, why = judge(float(paper_value), our_value, rel_tol=rel_tol, neutral=neutral,
                         same_setting=same_setting)
    low, high = _sweep_range(free_parameter, sweep)
    reason = why + (f"; {note}" if note else "")
    return Record(study, quantity, units, float(paper_value), paper_setting, our_value, our_setting,
                  bool(same_setting), float(rel_tol), float(neutral), verdict, reason, free_parameter,
                  low, high)


def _sweep_range(free_parameter: str, sweep) -> tuple[float, float]:
    values = [float(v) for v in sweep if math.isfinite(float(v))]
    if free_parameter and not values:
        raise ValueError(f"sweep: free parameter {free_parameter!r} needs our values over its range")
    return (min(values), max(values)) if values else (math.nan, math.nan)


def directional(study: str, quantity: str, units: str, *, paper_direction: int, paper_setting: str,
                our_value: float, our_setting: str, neutral: float, same_setting: bool = False, note: str = "",
                free_parameter: str = "", sweep=()) -> Record:
    """A record for a claim whose paper gives a direction only (no number): ``paper_value`` is NaN. Ours
    pointing the other way (or not finite) is "not reproduced"; pointing the paper's way it is "not tested":
    with no size from the paper the size test of :func:`judge` cannot be run, and a direction alone is never
    "partly". A study that can state the size the paper implies uses :func:`numeric` instead."""
    our_value = float(our_value)
    side = _side(our_value, neutral) if math.isfinite(our_value) else 0
    if side != 0 and side == paper_direction:
        verdict, why = "not tested", (f"the paper gives a direction and no size: ours points its way "
                                      f"({our_value:.3g}, no effect at {neutral:g}), but its size cannot be weighed")
    else:
        verdict, why = "not reproduced", (f"the paper gives the direction only: ours does not point its way "
                                          f"({our_value:.3g}, no effect at {neutral:g})")
    low, high = _sweep_range(free_parameter, sweep)
    return Record(study, quantity, units, math.nan, paper_setting, our_value, our_setting,
                  bool(same_setting), DEFAULT_REL_TOL, float(neutral), verdict,
                  why + (f"; {note}" if note else ""), free_parameter, low, high)


def not_tested(study: str, quantity: str, units: str, *, paper_value: float, paper_setting: str, needs: str,
               our_value: float = math.nan, our_setting: str = "", note: str = "") -> Record:
    """A claim this project cannot test: ``needs`` says, in one line, what it needs that the project does not
    model or run (a GPU, a production pipeline). ``our_value`` may carry the nearest quantity we do compute,
    for information only: it is not judged."""
    return Record(study, quantity, units, float(paper_value), paper_setting, float(our_value), our_setting,
                  False, DEFAULT_REL_TOL, math.nan, "not tested",
                  f"needs {needs}" + (f"; {note}" if note else ""))


def within_target(study: str, quantity: str, units: str, *, target: float, target_setting: str,
                  our_value: float, our_setting: str, same_setting: bool = True, note: str = "") -> Record:
    """A record for an error bound: ``our_value`` (an error, >= 0) against ``target`` (its upper bound).
    Reproduced at or below the bound (in the target's setting), partly up to :data:`SIZE_FACTOR` (2) times the
    bound, not reproduced beyond or when not finite. ``rel_tol`` is stored as 1 (the factor the partly band allows over the bound)."""
    our_value, target = float(our_value), float(target)
    if not math.isfinite(our_value):
        verdict, why = "not reproduced", "our error is not finite"
    elif our_value <= target and same_setting:
        verdict, why = "reproduced", f"at or below the target ({our_value:.3g} <= {target:.3g})"
    elif our_value <= SIZE_FACTOR * target:
        verdict, why = "partly", (f"within twice the target ({our_value:.3g} vs {target:.3g})" if our_value > target
                                  else f"at or below the target ({our_value:.3g}), but in a different setting")
    else:
        verdict, why = "not reproduced", f"more than twice the target ({our_value:.3g} vs {target:.3g})"
    return Record(study, quantity, units, target, target_setting, our_value, our_setting, bool(same_setting),
                  1.0, math.nan, verdict, why + (f"; {note}" if note else ""))


_FIELDS = [f.name for f in fields(Record)]
_FLOATS = {"paper_value", "our_value", "rel_tol", "neutral", "our_low", "our_high"}


def _format(name: str, value) -> str:
    if name in _FLOATS:
        return "" if not math.isfinite(value) else repr(float(value))
    if name == "same_setting":
        return "yes" if value else "no"
    return str(value)


def _parse(name: str, text: str, where: str):
    if name in _FLOATS:
        try:
            return float(text) if text != "" else math.nan
        except ValueError:
            raise ValueError(f"{where}: column {name}: {text!r} is not a number") from None
    if name == "same_setting":
        if text not in ("yes", "no"):
            raise ValueError(f"{where}: column same_setting: {text!r} is not yes or no")
        return text == "yes"
    return text


def write_records(records: Sequence[Record], path: str | os.PathLike) -> Path:
    """Write records as CSV (temporary name, then moved into place); returns the path."""
    path = Path(path)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_FIELDS)
    for record in records:
        row = asdict(record)
        writer.writerow([_format(name, row[name]) for name in _FIELDS])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(buffer.getvalue(), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_records(path: str | os.PathLike) -> list[Record]:
    """Records from a comparison CSV; a malformed file raises ValueError naming the row and column."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    if not rows or rows[0] != _FIELDS:
        raise ValueError(f"{path}: header must be {','.join(_FIELDS)}")
    records = []
    for number, row in enumerate(rows[1:], start=2):
        where = f"{path}, row {number}"
        if len(row) != len(_FIELDS):
            raise ValueError(f"{where}: {len(row)} columns, expected {len(_FIELDS)}")
        values = {name: _parse(name, text, where) for name, text in zip(_FIELDS, row)}
        try:
            records.append(Record(**values))
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    return records


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=VERIFY_RTOL, abs_tol=1e-12)


def diff_records(expected: Sequence[Record], found: Sequence[Record]) -> list[str]:
    """What differs between committed records (``found``) and records recomputed from the data
    (``expected``): one line per difference; empty when they agree."""
    problems = []
    exp = {r.quantity: r for r in expected}
    got = {r.quantity: r for r in found}
    for quantity in exp.keys() - got.keys():
        problems.append(f"{quantity!r}: missing from the committed records")
    for quantity in got.keys() - exp.keys():
        problems.append(f"{quantity!r}: committed but no longer computed")
    for quantity in exp.keys() & got.keys():
        a, b = exp[quantity], got[quantity]
        for name in _FIELDS:
            x, y = getattr(a, name), getattr(b, name)
            same = _close(x, y) if name in _FLOATS else x == y
            if not same:
                problems.append(f"{quantity!r}: {name} is {y!r} in the committed records, "
                                f"{x!r} from the datasets")
    return sorted(problems)


def counts(records: Iterable[Record]) -> dict[str, int]:
    """How many records have each verdict."""
    out = dict.fromkeys(VERDICTS, 0)
    for record in records:
        out[record.verdict] += 1
    return out


def _number(value: float) -> str:
    if not math.isfinite(value):
        return "–"
    return f"{value:.3g}"


def records_table(records: Sequence[Record]) -> str:
    """A Markdown table of records (the README's gallery table)."""
    lines = ["| study | quantity | paper | ours | over free choice | same setting | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        units = f" {r.units}" if r.units and r.units != "1" else ""
        free = (f"{_number(r.our_low)}–{_number(r.our_high)} ({r.free_parameter})"
                if r.free_parameter else "none")
        lines.append(f"| {r.study} | {r.quantity} | {_number(r.paper_value)}{units} | "
                     f"{_number(r.our_value)}{units} | {free} | {'yes' if r.same_setting else 'no'} | "
                     f"**{r.verdict}**: {r.reason} |")
    return "\n".join(lines)


def report(records: Sequence[Record]) -> str:
    """Plain-text lines for a notebook or a terminal: one claim per line, then the verdict counts."""
    lines = []
    for r in records:
        units = f" {r.units}" if r.units else ""
        free = (f"; over {r.free_parameter}: {_number(r.our_low)}–{_number(r.our_high)}"
                if r.free_parameter else "")
        same = "" if r.same_setting else " [different setting]"
        lines.append(f"{r.quantity}: paper {_number(r.paper_value)}{units} ({r.paper_setting}); "
                     f"ours {_number(r.our_value)}{units} ({r.our_setting}){same}{free} -> "
                     f"{r.verdict.upper()}: {r.reason}")
    tally = counts(records)
    lines.append(", ".join(f"{n} {v}" for v, n in tally.items()))
    return "\n".join(lines)
