"""What the hardware-scaling study compares against (Fernandez et al. 2024, arXiv 2411.13055): the paper's GPU
counts and system, its setting, and the numbers it reports (some second-hand, marked so). Comparison targets
only, never used in a computation; shared by :mod:`.hardware_scaling` (its records) and
:mod:`._hardware_scaling_figures` (the batch panels show FSDP on the paper's system), so that the figures need not
import the study module; a private module (``_``), not a study of its own.
"""

from __future__ import annotations

PAPER_GPUS = (128, 2048)
PAPER_SYSTEM = "dgx-h100"
PAPER_SETTING = "Llama-2 up to 70B on 128 -> 2048 H100 GPUs at a fixed global batch (Fernandez et al.)"
#: STUDIES.md: FSDP's per-GPU throughput from 128 to 2048 GPUs, about -37% (approximate, second-hand)
PAPER_FSDP_CHANGE = -0.37
#: second-hand (a published summary of the paper, not its text): power per GPU -5.87% from 128 to 2048 GPUs,
#: MFU 59.67% on A100 and 40.77% on H100
SECOND_HAND = "second-hand: a published summary of the paper, not read from its text"
PAPER_POWER_CHANGE = -0.0587
PAPER_MFU = {"dgx-a100-80gb": 0.5967, "dgx-h100": 0.4077}
