"""geo-distributed (FusionLLM, arXiv 2410.12707): placement by link bandwidth and adaptive top-k
compression speed up a pipeline across sites, the more the slower the links."""

import numpy as np
import pytest
from conftest import notebook_text

from trainscale import io as tsio
from trainscale.specs import SpecError
from trainscale.studies import geo_distributed as geo

STUDY = "geo-distributed"




# ------------------------------------------------------------------ unit tests (fast, no workflow)

def test_links_span_the_regime_and_are_symmetric():
    links = geo.link_bandwidths(4, [0.008, 1.0], draws=3, spread_decades=1.0, seed=3)
    assert links.shape == (2, 3, 4, 4)
    off = ~np.eye(4, dtype=bool)
    for r, slow in enumerate((0.008, 1.0)):
        for d in range(3):
            L = links[r, d]
            np.testing.assert_array_equal(L, L.T)
            assert L[off].min() == pytest.approx(slow, rel=1e-12)
            assert L[off].max() == pytest.approx(min(10 * slow, 10.0), rel=1e-12)
    np.testing.assert_array_equal(links, geo.link_bandwidths(4, [0.008, 1.0], 3, 1.0, 3))


def test_compressed_bytes_follow_the_top_k_bit_count():
    d = 4096 * 4096
    assert geo.compressed_bytes(d, 1.0) == 2 * d
    k = round(0.1 * d)
    assert geo.compressed_bytes(d, 0.1) == pytest.approx(k * (32 + 24) / 8)


def test_small_pipeline_is_deterministic_and_ordered():
    kw = dict(sites=4, slowest_Gbps=[0.01, 1.0], draws=2, micro_batches=8, keep_fractions=[0.3, 0.1])
    ds = geo.geo_pipeline(**kw)
    assert ds.equals(geo.geo_pipeline(**kw)) and ds.attrs == geo.geo_pipeline(**kw).attrs
    sp = ds["speedup"]
    np.testing.assert_allclose(sp.sel(approach="baseline"), 1.0)
    # the exact search includes the site order: placement never loses
    assert (sp.sel(approach="placement") >= 1 - 1e-12).all()
    assert (sp.sel(approach="placement+compression") >= sp.sel(approach="compression") - 1e-12).all()
    g = ds["speedup_geomean"].sel(approach="placement+compression")
    assert float(g.sel(bandwidth=0.01)) > float(g.sel(bandwidth=1.0)) > 1.0
    for name, var in ds.data_vars.items():
        assert "units" in var.attrs and "long_name" in var.attrs, name


def test_bad_inputs_raise_spec_errors_naming_the_field():
    with pytest.raises(SpecError) as e:
        geo.geo_pipeline(sites=4, keep_fractions=[0.1, 0.3])
    assert "keep_fractions" in str(e.value)
    with pytest.raises(SpecError) as e:
        geo.link_bandwidths(4, [0.0], 1, 1.0, 0)
    assert "slowest_Gbps" in str(e.value)
    with pytest.raises(SpecError) as e:
        geo.geo_pipeline(sites=9)
    assert "sites" in str(e.value)


def test_convergence_proxy_is_consistent():
    conv = geo.compression_convergence([0.1], dim=8, hidden=4, n_samples=200, workers=2, steps=100, evals=20)
    assert conv["steps_ratio"].values[0] == 1.0
    assert np.isfinite(conv["steps_ratio"].values).all()
    assert conv["bits_ratio"].values[0] == pytest.approx(1.0)
    assert conv["bits_ratio"].values[1] < 0.2


# ------------------------------------------------------------------ on the quick workflow's outputs

@pytest.mark.workflow
def test_geo_distributed_speedup_grows_as_links_slow(quick_workflow):
    ds = tsio.read_dataset(quick_workflow / "figures" / STUDY / "geo_pipeline.nc")
    assert int(ds.attrs["gpus"]) == 48
    bw = ds["bandwidth"].values
    assert bw.min() <= 0.008 + 1e-12 and bw.max() >= 10.0 - 1e-9, "regimes must span 8 Mb/s .. 10 Gb/s"
    best = ds["speedup_geomean"].sel(approach="placement+compression").values
    assert (best > 1.0).all(), f"speedup {best}"
    assert (ds["speedup"].sel(approach="placement+compression").values > 1.0).all()
    order = np.argsort(bw)
    # larger at lower bandwidth: slowest regime beats the fastest by > 5x, and never decreases as links slow
    assert best[order[0]] > 5 * best[order[-1]]
    assert np.all(np.diff(best[order]) <= 1e-9)
    # both parts contribute at slow links
    slow = ds.sel(bandwidth=bw[order[0]])["speedup_geomean"]
    assert float(slow.sel(approach="placement")) > 1.2
    assert float(slow.sel(approach="compression")) > 2.0
    # compression is adaptive: at the fastest regime the links are compressed mildly or not at all
    keep = ds["min_keep_fraction"].sel(approach="placement+compression")
    assert float(keep.sel(bandwidth=bw[order[-1]]).min()) >= float(keep.sel(bandwidth=bw[order[0]]).max())


@pytest.mark.workflow
def test_geo_distributed_convergence_cost_and_sentence(quick_workflow):
    conv = tsio.read_dataset(quick_workflow / "figures" / STUDY / "compression_convergence.nc")
    ratio = conv["steps_ratio"].values
    assert ratio[0] == 1.0 and np.isfinite(ratio).all()
    assert (ratio < 1.5).all(), "error-feedback top-k should cost little at these keep fractions"
    ds = tsio.read_dataset(quick_workflow / "figures" / STUDY / "geo_pipeline.nc")
    t2t = ds["time_to_target_speedup"].values
    np.testing.assert_allclose(t2t, ds["speedup"].values / ds["steps_ratio"].values)
    best = ds["speedup_geomean"].sel(approach="placement+compression").values
    text = notebook_text(quick_workflow, STUDY)
    assert (f"speedup over the uncompressed baseline: {best.min():.2f}–{best.max():.2f}× across the link regimes "
            "(paper: 1.45–9.39× on 48 GPUs)") in text
