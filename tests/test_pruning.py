"""pruning (DRPruning, arXiv 2411.14055) against its baseline: Sheared-LLaMA's dynamic batch loading (one update by
hand, the zero-excess case) and DRPruning's dynamic reference loss (the curve fit, and the static reference it
reduces to when the fitted curve is the true one)."""

import numpy as np
import pytest

from trainscale.workloads import pruning as P


def test_dbl_update_matches_a_hand_computed_step():
    w = np.array([0.5, 0.3, 0.2])
    loss = np.array([2.0, 1.5, 3.0])
    ref = np.array([1.8, 1.6, 2.5])
    # excess max(L - ref, 0) = (0.2, 0, 0.5); w e^excess = (0.5 e^0.2, 0.3, 0.2 e^0.5) = (0.610701, 0.3, 0.329744)
    a = np.array([0.5 * np.exp(0.2), 0.3, 0.2 * np.exp(0.5)])
    np.testing.assert_allclose(a, [0.6107014, 0.3, 0.3297443], rtol=1e-6)
    a /= a.sum()  # 1.2404457 -> (0.492324, 0.241849, 0.265827)
    np.testing.assert_allclose(a, [0.492324, 0.241849, 0.265827], atol=1e-6)
    np.testing.assert_allclose(P.dbl_update(w, loss, ref, c=0.0), a, rtol=1e-12)
    smoothed = (1 - 1e-4) * a + 1e-4 / 3  # Sheared-LLaMA's smoothing c = 1e-4 (sums to 1 already)
    np.testing.assert_allclose(P.dbl_update(w, loss, ref), smoothed, rtol=1e-12)
    # unclipped (the callback's code): the second domain's -0.1 counts too
    b = w * np.exp(loss - ref)
    np.testing.assert_allclose(P.dbl_update(w, loss, ref, c=0.0, clip=False), b / b.sum(), rtol=1e-12)


def test_dbl_keeps_the_mix_without_excess():
    w = P.START_MIX
    at_or_below = P.REFERENCE_LOSS["1.3b"] - np.array([0.0, 0.1, 0.0, 0.3, 0.0, 0.2, 0.05])
    np.testing.assert_allclose(P.dbl_update(w, at_or_below, P.REFERENCE_LOSS["1.3b"], c=0.0), w, rtol=1e-12)
    # with the smoothing, only (1 - c) w + c / k
    np.testing.assert_allclose(P.dbl_update(w, at_or_below, P.REFERENCE_LOSS["1.3b"]),
                               (1 - 1e-4) * w + 1e-4 / 7, rtol=1e-12)
    # uniform excess: exp multiplies every weight alike
    np.testing.assert_allclose(P.dbl_update(w, P.REFERENCE_LOSS["1.3b"] + 0.4, P.REFERENCE_LOSS["1.3b"], c=0.0),
                               w, rtol=1e-12)


def test_fit_recovers_the_true_curve():
    c = P.curves("1.3b", alpha=0.37, damage=1.2, unevenness=0.8)
    n = np.geomspace(1e8, 3e10, 25)[None, :] * np.arange(1, 8)[:, None]
    loss = np.stack([P._loss(c, n[:, j]) for j in range(n.shape[1])], axis=1)
    E, A, alpha = P.fit_curve(n, loss)
    np.testing.assert_allclose(alpha, 0.37, rtol=1e-7)
    np.testing.assert_allclose(E, c["E"], rtol=1e-7)
    np.testing.assert_allclose(A, c["A"], rtol=1e-6)


def test_dynamic_reference_equals_the_static_one_when_the_curve_ends_there():
    """A curve that ends training exactly at the static (scaling-law) reference: the fitted prediction at the
    extrapolated end tokens is that reference, so DRPruning's dynamic reference equals Sheared-LLaMA's."""
    ref = P.REFERENCE_LOSS["1.3b"]
    alpha, n_end = 0.3, 5e9
    E = 0.9 * ref
    A = (ref - E) * (n_end + P.N0_TOKENS) ** alpha  # L(n_end) = ref
    n = np.linspace(2e8, 2e9, 20)[None, :].repeat(7, axis=0)
    loss = E[:, None] + A[:, None] * (n + P.N0_TOKENS) ** -alpha
    np.testing.assert_allclose(P.predicted_reference(n, loss, np.full(7, n_end)), ref, rtol=1e-8)
    # and through the running estimator: history of 20 points, at t = 20 of 50 steps the end is n * 50 / 20 = 5e9
    dyn = P.DynamicReference(ref + 1.0, steps=50, start=0.0, fit_from=0.0)
    for t in range(20):
        out = dyn.update(t + 1, n[:, t] * 0 + (t + 1) * 1e8, E + A * ((t + 1) * 1e8 + P.N0_TOKENS) ** -alpha)
    np.testing.assert_allclose(out, ref, rtol=1e-8)
    # a later, higher prediction does not raise it (min), and a prediction never exceeds the lowest loss seen
    assert np.all(dyn.update(20, np.full(7, 2e9), loss[:, -1] + 5.0) <= ref + 1e-12)


def test_every_method_spends_the_same_tokens_and_dbl_starts_where_told():
    c = P.curves("1.3b", unevenness=1.0)
    runs = {m: P.train(c, 50e9, 40, m, interval=2) for m in P.METHODS}
    for m, r in runs.items():
        np.testing.assert_allclose(r["mix"].sum(axis=1), 1.0, err_msg=m)
        np.testing.assert_allclose(r["tokens"][-1], 50e9)
    # DBL updates at step 0 (eval_first), from its start mix with the losses right after pruning
    start = runs["dbl"]["loss"][0]
    np.testing.assert_allclose(runs["dbl"]["mix"][0], P.dbl_update(P.START_MIX, start, c["reference"]))
    np.testing.assert_allclose(runs["dbl-cpt"]["mix"][0], P.dbl_update(P.SHEARED_CPT_MIX, start, c["reference"]))
    np.testing.assert_allclose(runs["dbl"]["mix"][1], runs["dbl"]["mix"][0])  # held between updates (interval 2)
    # DRPruning's released callback holds the start mix until its first fitted reference (10% of training)
    np.testing.assert_allclose(runs["robust-dynamic"]["mix"][:4], np.broadcast_to(P.START_MIX, (4, 7)))
    # DBL moves the mix towards the most lagging domains; the static methods keep Sheared-LLaMA's reference
    assert np.argmax(runs["dbl"]["mix"][-1] / P.START_MIX) in (1, 5)  # github or arxiv: the most damaged
    np.testing.assert_allclose(runs["robust"]["reference"][-1], c["reference"])
    assert not np.allclose(runs["robust-dynamic"]["reference"][-1], c["reference"])


@pytest.mark.parametrize("call, field", [
    (lambda: P.dbl_update([0.5, 0.5], [1.0, np.nan], [1.0, 1.0]), "w/loss"),
    (lambda: P.train(P.curves(), steps=10, interval=0), "interval"),
    (lambda: P.fit_curve([1.0, 2.0], [1.0, 0.5]), "n/loss"),
])
def test_bad_input_names_the_field(call, field):
    from trainscale.model.specs import SpecError
    with pytest.raises(SpecError) as err:
        call()
    assert err.value.field == field
