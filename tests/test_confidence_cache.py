"""The measured table's disk cache (issue 38 item 5): the same confidence with and without it, and a cache that
is rebuilt when it is corrupt or when what it was computed from changes."""

import json
import math

import pytest

from trainscale.model import confidence
from trainscale.model.specs import PlanSpec, resolve_model, resolve_system


def _same(a, b) -> bool:
    """Equal, with equal types, NaN equal to NaN (the rows are compared as stored, not approximately)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    table = confidence.measured_table
    monkeypatch.setattr(confidence, "table_cache_dir", lambda: tmp_path)
    table.cache_clear()
    yield tmp_path
    table.cache_clear()


def _confidences(generation_system: str, stack: str) -> list[dict]:
    system = resolve_system(generation_system)
    out = []
    for model_name, tp, pp, gpus in (("llama2-7b", 1, 1, 64), ("llama2-70b", 8, 4, 256), ("gpt3-175b", 8, 16, 1024)):
        model = resolve_model(model_name)
        plan = PlanSpec(tp=tp, pp=pp, dp=gpus // (tp * pp), global_batch=512, stack=stack, zero=1)
        out.append(confidence.plan_confidence(model, system, plan, 0.5))
    return out


def test_cached_table_equals_computed(cache_dir):
    computed = confidence.measured_table("hopper", use_cache=False)
    first = confidence.measured_table("hopper")  # computes and writes
    (path,) = cache_dir.glob("trainscale-measured-table-hopper-*.json")
    assert confidence.table_key() in path.name
    confidence.measured_table.cache_clear()
    read = confidence.measured_table("hopper")  # read back from the file
    assert _same(computed, first) and _same(computed, read) and len(read) > 0
    assert all(r["generation"] == "hopper" for r in read)
    everything = confidence.measured_table(use_cache=False)
    assert _same(read, tuple(r for r in everything if r["generation"] == "hopper"))


@pytest.mark.parametrize("system, stack", [("dgx-a100-80gb", "megatron"), ("dgx-h100", "nemo"),
                                           ("dgx-h100", "fsdp")])
def test_confidence_same_with_and_without_cache(cache_dir, monkeypatch, system, stack):
    cold = _confidences(system, stack)  # computes the table, writes the file
    confidence.measured_table.cache_clear()
    warm = _confidences(system, stack)  # reads it back
    confidence.measured_table.cache_clear()
    real = confidence.measured_table
    monkeypatch.setattr(confidence, "measured_table", lambda generation=None: real(generation, use_cache=False))
    uncached = _confidences(system, stack)
    assert _same(cold, uncached) and _same(warm, uncached)
    assert uncached[0]["best_measured_mfu"] is not None


def test_corrupt_or_stale_cache_is_rebuilt(cache_dir):
    rows = confidence.measured_table("blackwell")
    (path,) = cache_dir.glob("trainscale-measured-table-blackwell-*.json")
    for broken in ("{not json", json.dumps({"key": "other", "generation": "blackwell", "rows": []}),
                   json.dumps({"key": confidence.table_key(), "generation": "blackwell", "rows": [{"id": 1}]})):
        path.write_text(broken)
        confidence.measured_table.cache_clear()
        assert _same(confidence.measured_table("blackwell"), rows)
        assert _same(tuple(json.loads(path.read_text())["rows"]), rows)  # rewritten whole


def test_key_changes_with_the_calibration(cache_dir, tmp_path_factory, monkeypatch):
    """A changed calibration file (here a copy of the package with one byte of calibration_fitted.yaml changed)
    gives another key, so another file: the old table is never read for the new calibration."""
    import shutil
    from pathlib import Path

    package = Path(confidence.__file__).resolve().parents[1]
    copy = tmp_path_factory.mktemp("pkg") / "trainscale"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    key = confidence.table_key()

    def key_of(folder):
        confidence.table_key.cache_clear()
        monkeypatch.setattr(confidence, "__file__", str(folder / "model" / "confidence.py"))
        try:
            return confidence.table_key()
        finally:
            monkeypatch.undo()
            monkeypatch.setattr(confidence, "table_cache_dir", lambda: cache_dir)
            confidence.table_key.cache_clear()

    assert key_of(copy) == key
    fitted = copy / "data" / "calibration_fitted.yaml"
    fitted.write_text(fitted.read_text() + "\n# changed\n")
    assert key_of(copy) != key
    assert confidence.table_key() == key
