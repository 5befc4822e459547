"""geo-distributed (FusionLLM, arXiv 2410.12707): placement by link bandwidth and adaptive top-k
compression speed up a pipeline across sites, the more the slower the links."""

import numpy as np
import pytest
from trainscale.common import io as tsio
from trainscale.model.specs import SpecError
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
    assert float(g.sel(bandwidth_GBps=0.01 / 8)) > float(g.sel(bandwidth_GBps=1.0 / 8)) > 1.0
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
    conv = geo.compression_convergence([0.1], dim=8, hidden=4, n_samples=200, workers=2, steps=100, evals=20,
                                       target_fractions=[0.1, 0.5])
    assert (conv["steps_ratio"].values[:, 0] == 1.0).all()
    assert np.isfinite(conv["steps_ratio"].values).all()
    # an earlier target is a higher loss on the uncompressed curve
    assert conv["target_loss"].values[0] > conv["target_loss"].values[1]
    assert conv["bits_ratio"].values[0] == pytest.approx(1.0)
    assert conv["bits_ratio"].values[1] < 0.2


def test_crossing_step_interpolates_between_evaluations():
    steps = [0, 25, 50]
    # halfway in log-loss between 1.0 (step 0) and 0.25 (step 25) is 0.5, at step 12.5
    assert geo.crossing_step(steps, [1.0, 0.25, 0.1], 0.5) == pytest.approx(12.5)
    assert geo.crossing_step(steps, [1.0, 0.25, 0.1], 0.25) == pytest.approx(25.0)
    assert geo.crossing_step(steps, [1.0, 0.25, 0.1], 2.0) == 0.0
    assert np.isnan(geo.crossing_step(steps, [1.0, 0.25, 0.1], 0.05))
    # a run that misses the target by 0.1% at one evaluation is not charged the whole interval
    late = geo.crossing_step(steps, [1.0, 0.2502, 0.1], 0.25)
    assert 25.0 < late < 26.0


# ------------------------------------------------------------------ on the quick workflow's outputs

@pytest.mark.workflow
def test_geo_distributed_speedup_grows_as_links_slow(quick_workflow):
    ds = tsio.read_dataset(quick_workflow / "figures" / STUDY / "geo_pipeline.nc")
    assert int(ds.attrs["gpus"]) == 48
    bw = ds["bandwidth_GBps"].values
    best = ds["speedup_geomean"].sel(approach="placement+compression").values
    assert (ds["speedup"].sel(approach="placement+compression").values >= 1.0 - 1e-12).all()
    order = np.argsort(bw)
    # never smaller as links slow (the exact placement and adaptive compression only gain)
    assert np.all(np.diff(best[order]) <= 1e-9)
    # compression is adaptive: at the fastest regime the links are compressed mildly or not at all
    keep = ds["min_keep_fraction"].sel(approach="placement+compression")
    assert float(keep.sel(bandwidth_GBps=bw[order[-1]]).min()) >= float(keep.sel(bandwidth_GBps=bw[order[0]]).max())


@pytest.mark.workflow
def test_time_to_target_divides_by_the_steps_ratio_of_each_target(quick_workflow):
    ds = tsio.read_dataset(quick_workflow / "figures" / STUDY / "geo_pipeline.nc")
    conv = tsio.read_dataset(quick_workflow / "figures" / STUDY / "compression_convergence.nc")
    np.testing.assert_array_equal(ds["target_fraction"].values, conv["target_fraction"].values)
    np.testing.assert_allclose(ds["time_to_target_speedup"].values,
                               ds["speedup"].values[None] / ds["steps_ratio"].values)
    base = ds["steps_ratio"].sel(approach="baseline").values
    np.testing.assert_allclose(base, 1.0)  # the uncompressed pipeline needs the uncompressed steps


def test_compare_reads_the_range_over_regimes(tmp_path):
    pipe = geo.geo_pipeline(sites=4, slowest_Gbps=[0.01, 1.0], draws=2, micro_batches=8, keep_fractions=[0.3, 0.1])
    conv = geo.compression_convergence([0.3, 0.1], dim=8, hidden=4, n_samples=200, workers=2, steps=100, evals=20,
                                       target_fractions=[0.1, 0.5])
    tsio.write_dataset(geo.add_time_to_target(pipe, conv), tmp_path / "geo_pipeline.nc")
    high, low, t2t = geo.compare(tmp_path)
    best = pipe["speedup_geomean"].sel(approach="placement+compression").values
    assert high.our_value == pytest.approx(best.max()) and low.our_value == pytest.approx(best.min())
    assert (high.our_low, high.our_high) == (pytest.approx(best.min()), pytest.approx(best.max()))
    assert not high.same_setting and t2t.neutral == 1.0
