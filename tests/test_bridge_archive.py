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


DEEPSEEK_2604_01 = """
## 26.04.01 NeMo Container

### Pre-Training Performance

#### Model: DeepSeekV3

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-GB200 | 256 | MXFP8 | 4096 | 1 | 4096 | 0 | 1 | 4 | 1 | 4 | 64 | 4256 | 1106 |
| DGX-B200 | 256 | MXFP8 | 4096 | 1 | 4096 | 0 | 1 | 8 | 1 | 2 | 32 | 3328 | 864 |
"""


LLAMA_2604_01 = """
#### Model: LLAMA3_70B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-H100 | 64 | FP8 | 128 | 1 | 4096 | 0 | 4 | 8 | 1 | 5 | 1 | 1602 | 1 |
"""


def test_the_releases_own_ep_overlap_and_the_latent_attention_widths_are_carried():
    """26.04.01's B200 config turns the EP all-to-all overlap on (Megatron-Bridge v0.4.2, B200_FP8_MX_V2), its GB200
    config does not, and the B200 config dispatches with DeepEP; both rows copy DeepSeek-V3's latent-attention widths from its 25.11 row."""
    made, _ = bridge_archive.transcribe(DEEPSEEK_2604_01, [r for r in current_rows() if r["id"].startswith("bridge2511")])
    rows = {r["id"]: r for r in made}
    b200, gb200 = rows["bridge260401-b200-deepseek-v3-256g-fp8-mx"], rows["bridge260401-gb200-deepseek-v3-256g-fp8-mx"]
    assert b200["overlap_moe_expert_parallel_comm"] == "true" and "v0.4.2:" in b200["note"]
    assert (b200["moe_dispatcher"], gb200["moe_dispatcher"]) == ("deepep", "hybridep")  # GB200: in one NVLink domain
    assert gb200["overlap_moe_expert_parallel_comm"] == "" and "overlap off in the release's config" in gb200["note"]
    assert (b200["kv_lora_rank"], b200["q_lora_rank"], b200["kv_channels"]) == ("512", "1536", "")


def test_the_script_runs_as_its_docstring_says(tmp_path):
    """``PYTHONPATH=pkg python pkg/trainscale/data/bridge_archive.py ARCHIVE.md`` (no --write: prints, writes nothing).
    Run as a file it has no package: a relative import there failed after the package moved into floors."""
    import subprocess
    import sys
    from pathlib import Path

    archive = tmp_path / "archive.md"
    archive.write_text(DEEPSEEK_2604_01 + LLAMA_2604_01)  # a catalog model: its layer count read from the catalog
    before = Path(data_path(validation.STACKS_FILE)).read_bytes()
    out = subprocess.run([sys.executable, str(data_path("bridge_archive.py")), str(archive)], capture_output=True,
                         text=True, check=True)
    assert "bridge260401-b200-deepseek-v3-256g-fp8-mx 3328" in out.stdout
    assert "bridge260401-h100-llama3-70b-64g-fp8 1602" in out.stdout
    assert Path(data_path(validation.STACKS_FILE)).read_bytes() == before
