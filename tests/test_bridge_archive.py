"""The transcription of Megatron-Bridge's performance archive (pkg/trainscale/data/bridge_archive.py, issue 36)."""

import csv
import importlib.util

from trainscale.model import validation
from trainscale.model.catalog import data_path

SPEC = importlib.util.spec_from_file_location("bridge_archive", data_path("bridge_archive.py"))
bridge_archive = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bridge_archive)

ARCHIVE = """
## 26.04 NeMo Container

### Pre-Training Performance

#### Model: Qwen3_235B_a22B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-GB300 | 256 | MXFP8 | 8192 | 2 | 4096 | 0 | 1 | 4 | 1 | 12 | 32 | 6944 | 1029 |
| DGX-H100 | 256 | FP8 | 8192 | 1 | 4096 | 0 | 2 | 8 | 1 | 4 | 32 | 1,712 | 253 |

### SFT Performance

#### Model: LLAMA3_70B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-H100 | 64 | FP8 | 128 | 1 | 4096 | 0 | 4 | 4 | 1 | 5 | 1 | 9999 | 1 |

## 25.11 NeMo Container

### Pre-Training Performance

#### Model: LLAMA3_70B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-H100 | 64 | FP8 | 128 | 1 | 4096 | 0 | 4 | 8 | 1 | 5 | 1 | 1602 | 1 |
"""


def current_rows():
    with open(data_path(validation.STACKS_FILE), newline="") as f:
        return list(csv.DictReader(f))


def test_a_pretraining_row_is_transcribed_by_the_rules():
    """One row made (H100), one skipped with its reason (GB300), SFT and the hand-made 25.11 release ignored."""
    made, skipped = bridge_archive.transcribe(ARCHIVE, [r for r in current_rows() if r["id"].startswith("bridge2511")])
    assert [r["id"] for r in made] == ["bridge2604-h100-qwen3-235b-a22b-256g-fp8"]
    row = made[0]
    assert (row["tp"], row["pp"], row["dp"], row["interleave"], row["ep"], row["etp"]) == (2, 8, 16, 4, 32, 1)
    assert (row["micro_batch"], row["global_batch"], row["value"]) == (1, 8192, 1712)
    assert (row["precision"], row["fp8_recipe"], row["dataset"]) == ("fp8", "", "bridge-2604")
    assert row["custom_pipeline_layout"] == "true"  # 94 layers over 8 x 4 chunks
    assert row["layers"] == "94" and row["experts"] == "128"  # the shape of the model's 25.11 row
    assert len(skipped) == 1 and "DGX-GB300" in skipped[0] and "not in systems.yaml" in skipped[0]


def test_the_transcribed_rows_are_held_out_datasets_of_the_archive():
    rows = [r for r in current_rows() if "bridge_archive.py" in r["source"]]
    assert len(rows) == 76
    assert {r["dataset"] for r in rows} == set(validation.ARCHIVE_DATASETS) <= set(validation.NOT_FITTED)
    for r in rows:
        assert int(r["dp"]) * int(r["tp"]) * int(r["pp"]) * int(r["cp"]) == int(r["gpus"])
        assert r["url"] == bridge_archive.URL


def test_a_row_made_twice_is_refused():
    """Two table rows that would make one id (one release, system, model, size, precision) stop the transcription."""
    import pytest

    row = next(line for line in ARCHIVE.splitlines() if line.startswith("| DGX-H100 | 256 |"))
    twice = ARCHIVE.replace(row, row + "\n" + row.replace("| 1,712 |", "| 1,700 |"), 1)
    with pytest.raises(ValueError, match="made twice"):
        bridge_archive.transcribe(twice, [r for r in current_rows() if r["id"].startswith("bridge2511")])
