"""Each study's comparison with its paper, checked on the quick workflow's outputs, and
byte-identical reruns."""

import hashlib
import json

import numpy as np
import pytest

from conftest import notebook_text, run_snakemake, tail
from trainscale import catalog
from trainscale import io as tsio

pytestmark = pytest.mark.workflow




def test_validation_meets_the_published_accuracy_targets(quick_workflow):
    ds = tsio.read_dataset(quick_workflow / "figures" / "validation" / "validation.nc")
    pub = np.flatnonzero(ds["dataset"].values == "published")
    assert pub.size == len(catalog.published_runs())
    ape = np.abs(ds["rel_error"].values[pub])
    assert ape.mean() <= 0.10, f"published MAPE {ape.mean():.1%} > 10%"
    assert ape.max() <= 0.20, f"worst published run {ape.max():.1%} > 20%"
    assert ds.attrs["mape_published"] == pytest.approx(ape.mean(), rel=1e-12)


def test_hardware_scaling_shows_the_papers_effects(quick_workflow):
    ds = tsio.read_dataset(quick_workflow / "figures" / "hardware-scaling" / "hardware_scaling.nc")
    per_gpu = ds["tokens_per_s_per_gpu"]
    gpus = ds["gpus"].values
    small, large = 128, int(gpus.max())
    assert small in gpus and large >= 2048, "the quick grid must span 128 -> 2048 GPUs"
    for model in ds["model"].values:
        for system in ds["system"].values:
            sel = per_gpu.sel(model=model, system=system)
            fsdp = sel.sel(strategy="fsdp")
            # diminishing returns: FSDP loses at least a fifth of its per-GPU throughput 128 -> 2048
            drop = float(fsdp.sel(gpus=large) / fsdp.sel(gpus=small)) - 1
            assert drop < -0.2, f"{model} on {system}: FSDP per-GPU change {drop:+.0%}"
            # at scale FSDP falls behind TP/PP (and hybrid sharding)
            assert float(sel.sel(strategy="tp-pp", gpus=large)) > float(fsdp.sel(gpus=large))
            # and every strategy has lost per-GPU throughput by the largest count
            for strategy in ds["strategy"].values:
                assert float(sel.sel(strategy=strategy, gpus=large)) < float(sel.sel(strategy=strategy, gpus=small))
    # newer GPUs gain less than their FLOP ratio
    if {"dgx-a100-80gb", "dgx-h100"} <= set(ds["system"].values):
        peak = {n: catalog.systems()[n]["peak_flops_bf16"]["value"] for n in ("dgx-a100-80gb", "dgx-h100")}
        ratio = (per_gpu.sel(system="dgx-h100") / per_gpu.sel(system="dgx-a100-80gb")).max()
        assert float(ratio) < peak["dgx-h100"] / peak["dgx-a100-80gb"]
    assert "-37%" in notebook_text(quick_workflow, "hardware-scaling")


def test_allreduce_bus_bandwidth_rises_with_message_size(quick_workflow):
    bw = tsio.read_dataset(quick_workflow / "figures" / "hardware-scaling" / "allreduce_busbw.nc")
    busbw = bw["busbw_GBps"].values
    assert (np.diff(busbw, axis=-1) >= -1e-9).all()
    # more nodes never give more bus bandwidth for small messages (latency grows with the ring)
    assert (np.diff(busbw[..., 0], axis=-1) <= 1e-9).all()


def test_pipeline_schedules_match_dapple_and_successors(quick_workflow):
    folder = quick_workflow / "figures" / "pipeline-planning"
    ds = tsio.read_dataset(folder / "schedules.nc")
    pp = json.loads(ds.attrs["parameters"])["pp"]
    tput, mem = ds["tokens_per_s"], ds["peak_activation_gib"]
    grid = [int(m) for m in ds["micro_batches"].values]
    assert any(m >= 2 * pp for m in grid), "the quick grid needs micro-batch counts >= 2 pp"
    for m in grid:
        gpipe, one_f_one_b = (float(tput.sel(schedule=s, micro_batches=m)) for s in ("gpipe", "1f1b"))
        # same operations, same dependencies: equal makespan at equal micro-batch counts
        assert one_f_one_b == pytest.approx(gpipe, rel=1e-9), m
        # ZB-H1 fills the bubble with weight gradients; interleaving shrinks it
        assert float(tput.sel(schedule="zb-h1", micro_batches=m)) >= one_f_one_b * (1 - 1e-9), m
        assert float(tput.sel(schedule="interleaved", micro_batches=m)) >= one_f_one_b * (1 - 1e-9), m
        if m >= 2 * pp:
            # 1F1B holds at most pp micro-batches of activations, GPipe all m
            ratio = float(mem.sel(schedule="1f1b", micro_batches=m) / mem.sel(schedule="gpipe", micro_batches=m))
            assert ratio < 1.0, f"m={m}: 1F1B / GPipe peak activation memory {ratio:.2f}"
    # 1F1B's memory does not grow with the micro-batch count; GPipe's does
    assert np.ptp(mem.sel(schedule="1f1b").values) == pytest.approx(0.0, abs=1e-12)
    assert (np.diff(mem.sel(schedule="gpipe").values) > 0).all()
    text = notebook_text(quick_workflow, "pipeline-planning")
    m = max(grid)
    r = float(mem.sel(schedule="1f1b", micro_batches=m) / mem.sel(schedule="gpipe", micro_batches=m))
    assert f"m={m:<3d} throughput ratio 1.00, peak activation memory ratio {r:.2f}" in text
    assert "1.6x" in text and "3.23x" in text


def test_pipeline_planner_beats_its_baselines(quick_workflow):
    pl = tsio.read_dataset(quick_workflow / "figures" / "pipeline-planning" / "planner.nc")
    tput = pl["tokens_per_s"]
    planner = tput.sel(approach="planner").values
    assert np.isfinite(planner).all() and (pl["dp"].values >= 1).all()
    for baseline in ("data-parallel", "even-pipeline"):
        base = tput.sel(approach=baseline).values
        assert (planner >= base * (1 - 1e-9)).all(), baseline
    slowest = float(pl["network_GBps"].min())
    at_slowest = tput.sel(network_GBps=slowest)
    speedup = float(at_slowest.sel(approach="planner") / at_slowest.sel(approach="data-parallel"))
    assert speedup > 1.5, f"planner only {speedup:.2f}x data parallel at {slowest} GB/s"
    # on a slow network the planner prefers pipelining (fewer replicas) over data parallelism
    assert int(pl["dp"].sel(network_GBps=slowest)) <= int(pl["dp"].sel(network_GBps=float(pl["network_GBps"].max())))
    text = notebook_text(quick_workflow, "pipeline-planning")
    if 3.125 in pl["network_GBps"].values:
        at_ethernet = tput.sel(network_GBps=3.125)
        s = float(at_ethernet.sel(approach="planner") / at_ethernet.sel(approach="data-parallel"))
        assert f"at 25 Gb/s Ethernet (3.125 GB/s): planner {s:.2f}x data parallel" in text


def _hashes(results):
    files = sorted(p for p in (results / "figures").rglob("*") if p.suffix in (".nc", ".png"))
    assert files
    return {str(p.relative_to(results)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.mark.slow
def test_rerun_is_byte_identical(quick_workflow):
    """A forced rerun at the same commit writes the same bytes. The session run is the reference
    when its datasets record the current commit (a fresh clone, as in CI); outputs left from an
    earlier commit record that commit's id, so then a first forced run makes the reference."""
    def forced_run():
        proc = run_snakemake("--cores", "2", "--config", "mode=quick", "--forceall")
        assert proc.returncode == 0, tail(proc.stdout)
        return _hashes(quick_workflow)

    commit = tsio.git_commit()
    recorded = {tsio.read_dataset(p).attrs.get("git_commit")
                for p in (quick_workflow / "figures").rglob("*.nc")}
    before = _hashes(quick_workflow) if recorded == {commit} else forced_run()
    after = forced_run()
    changed = sorted(name for name in before if before[name] != after.get(name))
    assert before.keys() == after.keys() and not changed, f"rerun changed {changed}"
