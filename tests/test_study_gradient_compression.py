"""Study `gradient-compression` (Shulgin & Richtárik, ICML 2024, arXiv 2306.16484): IST's heterogeneity
floor vs compressed gradient descent at matched bits — unit tests of the study functions and of its
comparison records, and the quick workflow's plumbing (the paper comparison is judged on the committed
full datasets by ``trainscale verify``)."""

import numpy as np
import pytest

from trainscale.common import comparison
from trainscale.training import convergence
from trainscale.common import io as tsio
from trainscale.training.compression import CompressorSpec
from trainscale.model.specs import SpecError
from trainscale.studies import gradient_compression as gc

STUDY = "gradient-compression"
SMALL = dict(dim=16, n_samples=128, workers=4, steps=200, evals=20, seed=3)


# ---------------------------------------------------------------------------------------------
# unit tests (fast, no workflow)


@pytest.fixture(scope="module")
def small():
    return gc.ist_vs_compression([0.0, 1.0], **SMALL)


def test_dataset_shape_units_and_determinism(small):
    assert small["suboptimality"].dims == ("method", "heterogeneity", "step")
    assert small["method"].values.tolist() == list(gc.METHODS)
    assert small.sizes["step"] == SMALL["evals"] + 1
    for name in small.variables:
        if name in small.coords and name in ("method",):
            continue
        assert "units" in small[name].attrs and "long_name" in small[name].attrs, name
    assert "parameters" in small.attrs and small.attrs["seed"] == SMALL["seed"]
    again = gc.ist_vs_compression([0.0, 1.0], **SMALL)
    assert small.identical(again)


def test_bits_per_step_match_the_compression_level(small):
    p, W = SMALL["dim"], SMALL["workers"]
    bits = small["bits_per_step_per_worker"]
    assert np.all(bits.sel({"method": "ist"}).values == 32 * p / W)
    index_bits = int(np.ceil(np.log2(p)))
    for m in ("rand_k", "rand_k_ef", "top_k", "top_k_ef"):
        assert np.all(bits.sel({"method": m}).values == (p // W) * (32 + index_bits))
    assert np.all(bits.sel({"method": "gd"}).values == 32 * p)
    # cumulative bits grow by exactly that per step
    steps = small["step"].values
    ist_bits = small["bits_sent_per_worker"].sel({"method": "ist", "heterogeneity": 1.0}).values
    np.testing.assert_array_equal(ist_bits, 32 * p / W * steps)
    # communication time is monotone and proportional to the bits on a latency-free link
    t = small["comm_time_s"].sel({"method": "ist", "heterogeneity": 1.0}).values
    np.testing.assert_allclose(t, ist_bits / 8 / 0.125e9, rtol=1e-12)


def test_ist_floor_matches_the_closed_form_fixed_point(small):
    pred = small["ist_predicted_floor"].values
    floor = small["floor"].sel({"method": "ist"}).values
    assert np.all(pred > 0)
    np.testing.assert_allclose(floor, pred, rtol=0.25)
    # GD keeps descending below IST's floor where IST stalls (200 steps only: not yet at the optimum)
    gd = small["suboptimality"].sel({"method": "gd"}).isel(step=-1).values
    assert np.all(gd < 0.2 * floor), (gd, floor)


def test_fixed_point_formula_is_the_mean_iterate_fixed_point():
    """``M x = b`` is where the expected IST step ``-(M x - b)`` vanishes: check the expected step
    by averaging the exact IST update over many permutations drawn by the kernel."""
    from trainscale.kernels import optim as K

    p = convergence.make_problem("least_squares", 48, 6, workers=3, heterogeneity=0.7, seed=1, sigma=0.0)
    M, b, fixed = gc.ist_fixed_point(p)
    rng = np.random.default_rng(0)
    x = rng.normal(size=6)
    owner = np.empty(6, np.int64)
    mean_step = np.zeros(6)
    trials = 4000
    for t in range(trials):
        K.ist_owners(6, 3, np.uint64(K.call_key(5, 0, t)), owner)
        for k in range(3):
            mask = owner == k
            sl = p.shard(k)
            g = p.grad(3 * mask * x, np.arange(sl.start, sl.stop))
            mean_step[mask] += g[mask] / trials
    np.testing.assert_allclose(mean_step, M @ x - b, atol=0.05 * np.linalg.norm(M @ x - b))
    np.testing.assert_allclose(M @ fixed, b, rtol=1e-10)


def test_compare_gives_one_well_formed_record_per_claim(small, tmp_path):
    tsio.write_dataset(small, tmp_path / "ist_vs_compression.nc")
    records = gc.compare(tmp_path)
    assert len(records) == 2
    assert {r.study for r in records} == {STUDY}
    assert all(r.verdict in comparison.VERDICTS for r in records)
    assert len({r.quantity for r in records}) == len(records)
    floor, growth = records
    assert floor.paper_value == pytest.approx(float(small["ist_predicted_floor"].values[-1]))
    assert floor.our_value == pytest.approx(float(small["floor"].sel({"method": "ist"}).values[-1]))
    ist = small["floor"].sel({"method": "ist"}).values
    assert growth.our_value == pytest.approx(ist[-1] / ist[0])
    assert comparison.diff_records(gc.compare(tmp_path), records) == []  # deterministic


def test_compressor_specs_are_valid():
    for m in gc.METHODS:
        spec = gc.compressor_for(m, 4)
        if spec is not None:
            assert CompressorSpec.from_dict(spec).k_for(16) == 4


@pytest.mark.parametrize("kwargs, field", [
    (dict(heterogeneities=[0.5, 0.2]), "heterogeneities"),
    (dict(heterogeneities=[0.0, 1.5]), "heterogeneities"),
    (dict(heterogeneities=[0.0], dim=30, workers=4), "dim"),
    (dict(heterogeneities=[0.0], n_samples=130, workers=4), "n_samples"),
    (dict(heterogeneities=[0.0], methods=["ist", "powersgd"]), "methods"),
    (dict(heterogeneities=[0.0], steps=100, evals=30), "evals"),
    (dict(heterogeneities=[0.0], lr_fraction=0.0), "lr_fraction"),
    (dict(heterogeneities=[0.0], workers=1), "workers"),
    (dict(heterogeneities=[0.0], bandwidth_GBps=-1.0), "bandwidth_GBps"),
])
def test_bad_input_raises_spec_error_naming_the_field(kwargs, field):
    hets = kwargs.pop("heterogeneities")
    with pytest.raises(SpecError) as err:
        gc.ist_vs_compression(hets, **kwargs)
    assert err.value.field == field


# ---------------------------------------------------------------------------------------------
# the paper's effects on the quick workflow's outputs


def _quick(results):
    return tsio.read_dataset(results / "figures" / STUDY / "ist_vs_compression.nc")


@pytest.mark.workflow
def test_quick_outputs_are_written_and_consistent(quick_workflow):
    folder = quick_workflow / "figures" / STUDY
    for name in (*gc.OUTPUTS, comparison.RECORDS_FILE):
        assert (folder / name).stat().st_size > 0, name
    assert comparison.diff_records(gc.compare(folder), comparison.read_records(folder / comparison.RECORDS_FILE)) == []
    ds = _quick(quick_workflow)
    p, W = int(ds.attrs["n_params"]), int(ds.attrs["workers"])
    assert np.all(ds["bits_per_step_per_worker"].sel({"method": "ist"}).values == 32 * p / W)
