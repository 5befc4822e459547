"""pruning (DRPruning, arXiv 2411.14055): the robust mix's bisection and clamps, the modelled curves, the
study's datasets and records. The comparison is judged on the committed full data by ``trainscale verify``."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainscale.common import comparison
from trainscale.common import io as tsio
from trainscale.workloads import pruning as P
from trainscale.model.specs import SpecError
from trainscale.studies import pruning as study


@st.composite
def excess_and_mix(draw):
    k = draw(st.integers(2, 8))
    e = np.array([draw(st.floats(-1.0, 2.0)) for _ in range(k)])
    w = np.array([draw(st.floats(0.05, 1.0)) for _ in range(k)])
    return e, w / w.sum(), draw(st.sampled_from([0.05, 0.1, 0.2, 0.5]))


@settings(max_examples=200, deadline=None)
@given(excess_and_mix())
def test_bisection_meets_the_divergence_constraint(case):
    e, p, rho = case
    q = P.worst_case_mix(e, p, rho)
    assert q.sum() == pytest.approx(1.0) and np.all(q >= 0)
    if np.allclose(e, e[0]):
        np.testing.assert_array_equal(q, p)
        return
    # on the ball's surface when the worst case lies outside it; inside only if all mass on the top excess fits
    top = np.where(np.isclose(e, e.max()), p, 0.0)  # all mass on the largest excess (ties share it)
    top /= top.sum()
    if P.chi_square(top, p) > rho + 1e-9:
        assert P.chi_square(q, p) == pytest.approx(rho, rel=1e-6, abs=1e-9)
    # more weight (relative to p) never goes to a smaller excess
    order = np.argsort(e)
    ratio = q / p
    assert np.all(np.diff(ratio[order]) >= -1e-9)


def test_uniform_excess_gives_the_base_mix():
    p = P.START_MIX
    np.testing.assert_allclose(P.robust_mix(np.full(7, 0.3), p, 0.1), p, rtol=1e-12)


def test_clamps_and_following_base():
    p0 = P.START_MIX
    q = P.robust_mix(np.array([0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]), p0, 0.1)
    # clamped to min p0 and q/p0 >= 0.2, then renormalised (which can move a clamped value by a little)
    assert q.sum() == pytest.approx(1.0) and np.all(q >= 0.95 * p0.min()) and np.all(q / p0 >= 0.2 * 0.9)
    assert np.argmax(q / p0) == 1  # the lagging domain gains the most
    p = P.follow_base(p0, q, p0)
    assert p.sum() == pytest.approx(1.0)
    assert np.all(p >= 0.99 * p0.min()) and np.all(p <= 1.01 * p0.max())
    assert np.all(p >= 0.5 * p0 * 0.99) and np.all(p <= 2.0 * p0 * 1.01)


def test_curves_start_at_the_damaged_reference_and_fall():
    c = P.curves("1.3b", alpha=0.3, damage=1.0, unevenness=0.5, margin=0.05)
    start = P._loss(c, np.zeros(7))
    np.testing.assert_allclose(start, c["reference"] + 1.0 * (1 + 0.5 * P.DAMAGE_PATTERN), rtol=1e-12)
    later = P._loss(c, np.full(7, 1e10))
    assert np.all(later < start) and np.all(later > c["E"])


def test_robust_mixing_lowers_the_worst_domain_on_uneven_damage():
    c = P.curves("1.3b", alpha=0.3, damage=1.0, unevenness=1.0)
    fixed = P.train(c, 50e9, 100, "fixed")
    robust = P.train(c, 50e9, 100, "robust")
    worst = {m: float((r["loss"][-1] - c["reference"]).max()) for m, r in (("fixed", fixed), ("robust", robust))}
    assert worst["robust"] < worst["fixed"]
    np.testing.assert_allclose(fixed["mix"], np.broadcast_to(P.START_MIX, fixed["mix"].shape))
    np.testing.assert_allclose(robust["mix"].sum(axis=1), 1.0)


@pytest.mark.parametrize("call, field", [
    (lambda: P.curves("9b"), "size"), (lambda: P.curves(alpha=0.0), "alpha"),
    (lambda: P.train(P.curves(), method="dro"), "method"), (lambda: P.robust_mix([0.1, 0.2], [0.5, 0.5], 0.0), "rho"),
    (lambda: study.mixing_study(rhos=[]), "rhos"), (lambda: P.pruned_model("5b"), "size"),
    (lambda: study.mixing_study(intervals=[]), "intervals"),
])
def test_bad_input_names_the_field(call, field):
    with pytest.raises(SpecError) as err:
        call()
    assert err.value.field == field


def test_study_datasets_and_records(tmp_path):
    mixing = study.mixing_study(alphas=[0.3], damages=[1.0], unevenness=[0.0, 1.0], rhos=[0.1, 0.2], steps=20,
                                intervals=[1, 2])
    costs = study.inference_costs()
    assert mixing["loss"].dims == ("alpha", "damage", "unevenness", "rho", "interval", "mixing", "tokens", "domain")
    assert list(mixing["mixing"].values) == list(P.METHODS)
    assert mixing["updates"].values.tolist() == [20, 10]
    for name in ("final_reference", "sheared_cpt_mix", "updates", "interval"):
        assert mixing[name].attrs.get("units"), name
    assert np.all(np.diff(costs["decode_s"].values) < 0)  # smaller pruned sizes decode faster
    for ds in (mixing, costs):
        for name in list(ds.data_vars) + list(ds.coords):
            assert ds[name].attrs.get("long_name"), name
    tsio.write_dataset(mixing, tmp_path / "mixing.nc")
    records = study.compare(tmp_path)
    assert len(records) == 5 and all(r.verdict in comparison.VERDICTS for r in records)
    worst = records[0]
    assert worst.our_low <= worst.our_value <= worst.our_high and worst.our_value < 1.0
    by = {r.quantity: r for r in records}
    ppl = next(r for q, r in by.items() if q.startswith("perplexity reduction"))
    assert ppl.paper_value == pytest.approx(5.59) and ppl.neutral == 0.0 and ppl.units == "%"
    assert ppl.our_low <= ppl.our_value <= ppl.our_high and not ppl.same_setting
    assert "interval" in ppl.free_parameter and "DBL start mix" in ppl.free_parameter
    # the perplexity record recomputed from the dataset (interval 1 has 20 updates, nearest 120 of those swept)
    sel = mixing["mean_loss"].sel(rho=0.1, interval=1)
    expect = 100 * (1 - np.exp(sel.sel(mixing="robust-dynamic") - sel.sel(mixing="dbl")))
    assert ppl.our_value == pytest.approx(float(expect.median()))
    assert any("over Sheared-LLaMA's dynamic batch loading" in q and "worst" in q for q in by)
    assert any("dynamic over its static reference" in q for q in by)
    assert worst.quantity.startswith("worst-domain excess loss, DRPruning over fixed")


def test_trajectories_are_thinned_but_the_summary_is_not():
    full = study.mixing_study(unevenness=[1.0], steps=200, intervals=[2])
    assert full.sizes["tokens"] == 41 and full.sizes["step"] == 40 and float(full["tokens"][-1]) == 50e9
    c = P.curves("1.3b", 0.3, 1.0, 1.0, 0.05)
    run = P.train(c, 50e9, 200, "dbl", interval=2)
    np.testing.assert_allclose(full["loss"].sel(mixing="dbl").values.reshape(41, 7), run["loss"][::5])
    worst = float((run["loss"][-1] - c["reference"]).max())
    assert float(full["worst_excess"].sel(mixing="dbl").squeeze()) == pytest.approx(worst, rel=1e-12)


def test_compare_needs_the_new_methods(tmp_path):
    mixing = study.mixing_study(alphas=[0.3], damages=[1.0], unevenness=[0.5], rhos=[0.1], steps=20)
    tsio.write_dataset(mixing.sel(mixing=["fixed", "robust"]), tmp_path / "mixing.nc")
    with pytest.raises(SpecError) as err:
        study.compare(tmp_path)
    assert err.value.field == "mixing"
