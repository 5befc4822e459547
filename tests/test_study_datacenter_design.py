"""Data-centre design study (Tithi et al., arXiv 2506.15006): MFU rises with the scale-up domain and a
flat network beats a two-tier fat-tree at 1.8T MoE, on the quick workflow's outputs; and fast unit
tests of the study functions."""

import json

import numpy as np
import pytest
from conftest import notebook_text
from trainscale import io as tsio
from trainscale.specs import SpecError, SystemSpec, resolve_model
from trainscale.studies import datacenter_design as dcd

STUDY = "datacenter-design"


def _dataset(results):
    return tsio.read_dataset(results / "figures" / STUDY / "datacenter_design.nc")


# --------------------------------------------------------------------------- unit tests
SMALL = dict(models=["gpt3-175b", "moe-1.8t"], gpus=1024, global_batch_tokens=2**21, domains=[8, 72],
             base_domain=72, hbm_capacities_GiB=[185.0], hbm_bandwidths_GBps=[8000.0], link_GBps=[50.0],
             link_latencies_s=[5e-6], rerank=8)


@pytest.fixture(scope="module")
def small():
    return dcd.datacenter_design(**SMALL)


def test_dataset_is_complete_and_described(small):
    for name, var in small.data_vars.items():
        assert var.attrs.get("units") and var.attrs.get("long_name"), name
    assert json.loads(small.attrs["parameters"])["gpus"] == 1024
    assert small.attrs["global_batch_sequences"] == [1024, 256]  # 2^21 tokens / 2048 and / 8192
    assert np.isfinite(small["mfu_domain"].values).all()
    assert ((small["mfu_domain"] > 0) & (small["mfu_domain"] < 1)).all()
    # the dense model never gets expert parallelism; the sweeps share their design point
    assert (small["best_ep_domain"].sel(model="gpt3-175b") == 1).all()
    same = small["mfu_domain"].sel(network="two-tier", domain=72)
    np.testing.assert_array_equal(same.values, small["mfu_hbm_capacity"].sel(hbm_capacity_GiB=185.0).values)
    np.testing.assert_array_equal(same.values, small["mfu_link_bandwidth"].sel(network="two-tier", link_GBps=50.0))


def test_best_point_is_the_search_optimum():
    model, system = resolve_model("moe-1.8t"), SystemSpec.from_catalog("gb200-nvl72")
    r = dcd.best_point(model, system, 1024, 256, rerank=4)
    assert r["ep"] in dcd.design_space(model, 1024)["ep"]
    assert r["tp"] * r["pp"] * r["dp"] == 1024 and r["dp"] % r["ep"] == 0
    tokens = 256 * model.seq_len
    assert r["tokens_per_s"] == pytest.approx(tokens / r["step_time_s"], rel=1e-12)
    # MFU is model FLOPs (6 x active parameters x tokens, plus attention) over peak: within 20% of 6N
    six_n = 6 * model.active_params() * r["tokens_per_s"] / 1024 / system.peak_flops_bf16
    assert r["mfu"] == pytest.approx(six_n, rel=0.2)


def test_network_overrides():
    two = dcd.network_overrides("two-tier", 32, 2.0, 1e-7)
    assert two == {"scale_out_leaf_gpus": 32, "scale_out_oversubscription": 2.0, "scale_out_hop_latency_s": 1e-7}
    flat = dcd.network_overrides("flat", 32, 2.0, 1e-7)
    assert flat["scale_out_leaf_gpus"] == 0 and flat["scale_out_oversubscription"] == 1.0


def test_flat_network_is_never_slower(small):
    diff = small["mfu_domain"].sel(network="flat") - small["mfu_domain"].sel(network="two-tier")
    assert (diff >= -1e-12).all()


@pytest.mark.parametrize("kwargs, field", [
    (dict(domains=[10]), "domains"),
    (dict(oversubscription=0.5), "oversubscription"),
    (dict(global_batch_tokens=1000), "global_batch_tokens"),
    (dict(models="gpt3-175b"), "models"),
    (dict(hbm_capacities_GiB=[0.0]), "hbm_capacities_GiB"),
    (dict(leaf_gpus=6), "leaf_gpus"),
])
def test_bad_input_names_the_field(kwargs, field):
    with pytest.raises(SpecError) as err:
        dcd.datacenter_design(**{**SMALL, **kwargs})
    assert err.value.field == field
    with pytest.raises(SpecError) as err:
        dcd.network_overrides("optical", 32, 2.0, 0.0)
    assert err.value.field == "network"


# --------------------------------------------------------------------------- quick workflow outputs
@pytest.mark.workflow
def test_mfu_rises_with_the_scale_up_domain(quick_workflow):
    ds = _dataset(quick_workflow)
    mfu = ds["mfu_domain"]
    domains = ds["domain"].values
    assert {8, 72, 576} <= set(int(d) for d in domains)
    for model in ds["model"].values:
        for net in ds["network"].values:
            sel = mfu.sel(model=model, network=net).values
            assert (np.diff(sel) >= -1e-9).all(), (model, net, sel)  # never falls
            assert sel[-1] > sel[0] * 1.1, (model, net, sel)  # and rises by > 10% from 8 to 576
    # the MoE gains the most: 8 -> 576 GPUs lifts its MFU by more than a third on the two-tier network
    moe = mfu.sel(model="moe-1.8t", network="two-tier")
    assert float(moe.sel(domain=576) / moe.sel(domain=8)) > 1.33
    assert "MFU rises with the scale-up domain: yes" in notebook_text(quick_workflow, STUDY)


@pytest.mark.workflow
def test_flat_network_beats_two_tier_at_moe_scale(quick_workflow):
    ds = _dataset(quick_workflow)
    mfu = ds["mfu_domain"].sel(model="moe-1.8t")
    gain = (mfu.sel(network="flat") / mfu.sel(network="two-tier")).values - 1
    assert (gain >= -1e-12).all()
    assert gain[0] > 0.05, gain  # on 8-GPU domains the spine carries the all-to-all: > 5% better flat
    link = ds["mfu_link_bandwidth"].sel(model="moe-1.8t")
    assert (link.sel(network="flat") > link.sel(network="two-tier")).all()
    assert (link.diff("link_GBps") >= -1e-9).all()  # more bandwidth never lowers the best MFU
    assert "the flat network beats the two-tier one at 1.8T MoE: yes" in notebook_text(quick_workflow, STUDY)


@pytest.mark.workflow
def test_more_hbm_never_lowers_the_best_mfu(quick_workflow):
    ds = _dataset(quick_workflow)
    for var, dim in (("mfu_hbm_capacity", "hbm_capacity_GiB"), ("mfu_hbm_bandwidth", "hbm_bandwidth_GBps")):
        assert (ds[var].diff(dim) >= -1e-9).all(), var
