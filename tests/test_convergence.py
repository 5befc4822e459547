"""Convergence layer: problems reach their optimum, distributed optimisers match plain-NumPy
references, reproducibility, heterogeneity, the gradient noise scale against closed forms, and
compressors inside the distributed loops (bitwise no-op for none, bit counts, error feedback on a
constructed stall)."""

import math

import numba
import numpy as np
import pytest
from trainscale.training import compression as CP
from trainscale.training import convergence as C
from trainscale.model.specs import SpecError

# ---------------------------------------------------------------------------------------------
# problems: full-batch gradient descent reaches the optimum


def _gd(problem, x, lr, iters, tol=None):
    for it in range(iters):
        g = problem.grad(x)
        if tol is not None and np.linalg.norm(g) < tol:
            return x, it
        x = x - lr * g
    return x, iters


def test_least_squares_gd_reaches_closed_form():
    p = C.make_problem("least_squares", 600, 6, workers=3, heterogeneity=0.5, seed=11, kappa=20.0, sigma=0.3)
    X = p.X
    L = np.linalg.eigvalsh(X.T @ X / p.n_samples).max()
    x, _ = _gd(p, np.zeros(6), 1.0 / L, 3000)
    rel = np.linalg.norm(x - p.optimum) / np.linalg.norm(p.optimum)
    assert rel < 1e-6
    assert p.loss(x) == pytest.approx(p.optimum_loss, rel=1e-10)
    # the closed form solves the normal equations
    assert np.linalg.norm(X.T @ (X @ p.optimum - p.y)) / p.n_samples < 1e-12
    # conditioning is what was asked for
    assert p.eigenvalues.max() / p.eigenvalues.min() == pytest.approx(20.0)


def test_logistic_gd_reaches_unique_optimum():
    p = C.make_problem("logistic", 800, 5, workers=2, heterogeneity=0.0, seed=5, kappa=4.0, lam=1e-2)
    assert set(np.unique(p.y)) == {-1.0, 1.0}
    # not separable: the optimum misclassifies some examples
    assert np.mean(np.sign(p.X @ p.optimum) != p.y) > 0.02
    L = np.linalg.eigvalsh(p.X.T @ p.X / p.n_samples).max() / 4 + p.lam
    x, iters = _gd(p, np.zeros(5), 1.0 / L, 20000, tol=1e-8)
    assert np.linalg.norm(p.grad(x)) < 1e-8, iters
    assert np.linalg.norm(p.grad(p.optimum)) < 1e-12  # Newton's optimum, checked by the kernel
    mu = p.lam  # strong convexity: |x - x*| <= |grad| / mu
    assert np.linalg.norm(x - p.optimum) < 1e-8 / mu


def test_two_layer_gd_reaches_noise_floor_from_nearby_init():
    sigma = 0.2
    p = C.make_problem("two_layer", 2000, 4, workers=2, heterogeneity=0.0, seed=3, sigma=sigma, hidden=6)
    noise_floor = sigma**2 / 2  # loss of the teacher: half the noise variance
    assert p.optimum_loss == pytest.approx(noise_floor)
    assert p.loss(p.teacher) == pytest.approx(noise_floor, rel=0.1)
    rng = np.random.default_rng(0)
    x0 = p.teacher + 1.0 * rng.normal(size=p.n_params) * p.teacher.std()
    loss0 = p.loss(x0)
    x, _ = _gd(p, x0, 0.5, 2000)
    assert p.loss(x) <= 1.2 * noise_floor
    assert p.loss(x) >= 0.8 * noise_floor  # 2000 examples, 37 parameters: little overfitting
    assert loss0 / p.loss(x) > 3.0


def test_two_layer_gradient_matches_finite_differences():
    p = C.make_problem("two_layer", 50, 3, workers=1, seed=2, hidden=4, lam=0.05)
    x = p.initial_params(seed=1)
    g = p.grad(x)
    fd = np.empty_like(x)
    h = 1e-6
    for j in range(x.size):
        e = np.zeros_like(x)
        e[j] = h
        fd[j] = (p.loss(x + e) - p.loss(x - e)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# distributed optimisers: equivalences, references, reproducibility


def test_local_sgd_with_H1_equals_sync_sgd():
    for kind in ("least_squares", "two_layer"):
        p = C.make_problem(kind, 300, 4, workers=3, heterogeneity=0.5, seed=7, hidden=5)
        a = C.run(p, "sync", "sgd", lr=0.2, steps=60, batch_size=4, eval_every=5, seed=9)
        b = C.run(p, "local", "sgd", lr=0.2, steps=60, batch_size=4, H=1, outer_lr=1.0,
                  outer_momentum=0.0, eval_every=5, seed=9)
        np.testing.assert_allclose(b.loss.values, a.loss.values, rtol=0, atol=1e-12)
        np.testing.assert_allclose(b.params.values, a.params.values, rtol=0, atol=1e-12)
        assert a.loss.values[-1] < a.loss.values[0]


def _ref_grad(X, y, w, idx, lam):
    g = np.zeros_like(w)
    for i in idx:
        g += (X[i] @ w - y[i]) * X[i]
    return g / len(idx) + lam * w


def _ref_loss(X, y, w, lam):
    r = X @ w - y
    return 0.5 * np.mean(r * r) + 0.5 * lam * w @ w


def _ref_update(opt, x, g, m, v, lr, t, b1=0.9, b2=0.999, eps=1e-8):
    if opt == "sgd":
        x -= lr * g
    elif opt == "momentum":
        m[:] = b1 * m + g
        x -= lr * m
    else:
        m[:] = b1 * m + (1 - b1) * g
        v[:] = b2 * v + (1 - b2) * g * g
        x -= lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)


def _ref_sync(p, batches, opt, lr, eval_every):
    x = np.zeros(p.dim)
    m, v = np.zeros(p.dim), np.zeros(p.dim)
    losses = [_ref_loss(p.X, p.y, x, p.lam)]
    for s in range(batches.shape[0]):
        g = np.zeros(p.dim)
        for k in range(batches.shape[1]):
            g += _ref_grad(p.X, p.y, x, batches[s, k], p.lam)
        g /= batches.shape[1]
        _ref_update(opt, x, g, m, v, lr, s + 1)
        if (s + 1) % eval_every == 0:
            losses.append(_ref_loss(p.X, p.y, x, p.lam))
    return x, np.array(losses)


def _ref_local(p, batches, opt, lr, H, outer_lr, mu, delayed):
    W = batches.shape[1]
    x = np.zeros(p.dim)
    u, prev = np.zeros(p.dim), np.zeros(p.dim)
    M, V = np.zeros((W, p.dim)), np.zeros((W, p.dim))
    losses = [_ref_loss(p.X, p.y, x, p.lam)]
    for r in range(batches.shape[0] // H):
        delta = np.zeros(p.dim)
        for k in range(W):
            xk = x.copy()
            for h in range(H):
                s = r * H + h
                _ref_update(opt, xk, _ref_grad(p.X, p.y, xk, batches[s, k], p.lam), M[k], V[k], lr, s + 1)
            delta += x - xk
        delta /= W
        a, prev = (prev, delta) if delayed else (delta, prev)
        u = mu * u + a
        x = x - outer_lr * (a + mu * u)
        losses.append(_ref_loss(p.X, p.y, x, p.lam))
    return x, np.array(losses)


@pytest.mark.parametrize("opt", ["sgd", "momentum", "adam"])
def test_sync_matches_numpy_reference(opt):
    p = C.make_problem("least_squares", 40, 3, workers=2, heterogeneity=0.7, seed=1, kappa=5, lam=0.01)
    lr = 0.05 if opt == "adam" else 0.1
    ds = C.run(p, "sync", opt, lr=lr, steps=30, batch_size=3, eval_every=3, seed=4)
    x, losses = _ref_sync(p, C.run_batches(p, 30, 3, seed=4), opt, lr, 3)
    np.testing.assert_allclose(ds.params.values, x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ds.loss.values, losses, rtol=0, atol=1e-12)


@pytest.mark.parametrize("opt,delayed", [("sgd", False), ("momentum", True), ("adam", False), ("sgd", True)])
def test_local_matches_numpy_reference(opt, delayed):
    p = C.make_problem("least_squares", 45, 3, workers=3, heterogeneity=0.7, seed=2, kappa=5, lam=0.01)
    H, steps = 3, 30
    lr = 0.05 if opt == "adam" else 0.1
    ds = C.run(p, "local", opt, lr=lr, steps=steps, batch_size=2, H=H, outer_lr=0.8, outer_momentum=0.6,
               delayed=delayed, eval_every=H, seed=5)
    x, losses = _ref_local(p, C.run_batches(p, steps, 2, seed=5), opt, lr, H, 0.8, 0.6, delayed)
    np.testing.assert_allclose(ds.params.values, x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ds.loss.values, losses, rtol=0, atol=1e-12)
    # one message per round per worker, 32 bits per float
    np.testing.assert_array_equal(ds.bits_sent_per_worker.values[-1], 32 * 3 * (steps // H))


def test_delayed_outer_step_with_H1_is_one_step_delayed_sgd():
    p = C.make_problem("least_squares", 40, 3, workers=2, seed=3)
    ds = C.run(p, "local", "sgd", lr=0.1, steps=20, batch_size=2, delayed=True, seed=1)
    assert ds.loss.values[1] == ds.loss.values[0]  # round 0 applies nothing
    batches = C.run_batches(p, 20, 2, seed=1)
    xs = [np.zeros(3), np.zeros(3)]  # x_{-1}, x_0
    for s in range(20):
        g = sum(_ref_grad(p.X, p.y, xs[-2], batches[s - 1, k], 0.0) for k in range(2)) / 2 if s else 0.0
        xs.append(xs[-1] - 0.1 * g)
    np.testing.assert_allclose(ds.params.values, xs[-1], rtol=0, atol=1e-12)


def test_reproducible_and_thread_count_independent():
    p = C.make_problem("two_layer", 400, 5, workers=4, heterogeneity=0.3, seed=8, hidden=6)
    kw = dict(lr=0.05, steps=40, batch_size=8, seed=21)
    a = C.run(p, "sync", "adam", eval_every=4, **kw)
    b = C.run(p, "sync", "adam", eval_every=4, **kw)
    assert a.identical(b)
    c = C.run(p, "sync", "adam", eval_every=4, **{**kw, "seed": 22})
    assert not np.array_equal(a.loss.values, c.loss.values)
    local = dict(H=4, outer_lr=0.7, outer_momentum=0.9, eval_every=8, **kw)
    before = numba.get_num_threads()
    try:
        results = []
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            results.append((C.run(p, "sync", "momentum", eval_every=4, **kw), C.run(p, "local", "adam", **local)))
    finally:
        numba.set_num_threads(before)
    for x, y in zip(results[0], results[1]):
        np.testing.assert_array_equal(x.loss.values, y.loss.values)
        np.testing.assert_array_equal(x.params.values, y.params.values)


def test_problem_generation_is_seeded():
    a = C.make_problem("logistic", 100, 4, workers=2, heterogeneity=0.5, seed=3)
    b = C.make_problem("logistic", 100, 4, workers=2, heterogeneity=0.5, seed=np.random.SeedSequence(3))
    c = C.make_problem("logistic", 100, 4, workers=2, heterogeneity=0.5, seed=4)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    assert not np.array_equal(a.X, c.X)


# ---------------------------------------------------------------------------------------------
# heterogeneity


def _worker_optima(p):
    return np.array([C.least_squares_optimum(p.X[p.shard(k)], p.y[p.shard(k)]) for k in range(p.workers)])


def test_heterogeneity_zero_is_iid_and_one_separates_worker_optima():
    kw = dict(n_samples=4000, dim=4, workers=4, seed=12, sigma=0.5)
    iid = C.make_problem("least_squares", heterogeneity=0.0, **kw)
    het = C.make_problem("least_squares", heterogeneity=1.0, **kw)
    # IID: every shard's optimum is the pooled one up to sampling noise sigma sqrt(d / (m lambda))
    # (here lambda = 1: kappa = 1), and the shard feature means agree to a few standard errors
    m = 1000
    noise = 0.5 * math.sqrt(4 / m)
    spread_iid = np.linalg.norm(_worker_optima(iid) - iid.optimum, axis=1)
    spread_het = np.linalg.norm(_worker_optima(het) - het.optimum, axis=1)
    assert spread_iid.max() < 3 * noise
    assert spread_het.min() > 10 * noise
    means = np.array([iid.X[iid.shard(k)].mean(axis=0) for k in range(4)])
    assert np.abs(means).max() < 4 / math.sqrt(m)
    hmeans = np.array([het.X[het.shard(k)].mean(axis=0) for k in range(4)])
    assert np.linalg.norm(hmeans, axis=1).max() > 0.5  # covariate shift of about one std
    # the per-worker teachers are the pooled teacher plus centred perturbations
    np.testing.assert_allclose(het.worker_teachers.mean(axis=0), het.teacher, atol=1e-12)
    np.testing.assert_array_equal(iid.worker_teachers, np.broadcast_to(iid.teacher, (4, 4)))


def test_heterogeneity_slows_local_sgd():
    kw = dict(n_samples=800, dim=4, workers=4, seed=2, sigma=0.1)
    gaps = []
    for h in (0.0, 1.0):
        p = C.make_problem("least_squares", heterogeneity=h, **kw)
        ds = C.run(p, "local", "sgd", lr=0.2, steps=200, batch_size=8, H=20, seed=0)
        gaps.append(float(ds.suboptimality.values[-5:].mean()))
    assert gaps[1] > 5 * gaps[0]  # client drift: shard optima pull workers apart


# ---------------------------------------------------------------------------------------------
# measurements


def test_steps_and_tokens_to_target_and_bits():
    p = C.make_problem("least_squares", 200, 3, workers=2, seed=0, sigma=0.1)
    ds = C.run(p, "sync", "sgd", lr=0.3, steps=50, batch_size=5, eval_every=5, seed=0)
    target = float(ds.loss.values[3]) * (1 + 1e-12)
    first = int(np.flatnonzero(ds.loss.values <= target)[0])
    assert C.steps_to_target(ds, target) == ds.step.values[first]
    assert C.tokens_to_target(ds, target) == ds.step.values[first] * 2 * 5
    assert math.isnan(C.steps_to_target(ds, 0.0))
    np.testing.assert_array_equal(ds.bits_sent_per_worker.sel(step=50).values, [32 * 3 * 50] * 2)
    for name in ("loss", "grad_norm", "bits_sent_per_worker", "suboptimality"):
        assert {"units", "long_name"} <= set(ds[name].attrs)
    assert ds.samples.values[-1] == 50 * 10


def test_noise_scale_matches_linear_closed_form():
    # x ~ N(0, C), y = x . w* + sigma eps; at w = w* + delta the per-example gradient is
    # x x^T delta - eps x, so G = C delta and, for Gaussian x,
    # tr(Sigma) = |C delta|^2 + (delta^T C delta) tr C + sigma^2 tr C.
    sigma, d = 0.5, 4
    p = C.make_problem("least_squares", 60000, d, workers=1, seed=4, kappa=4.0, sigma=sigma)
    # the population covariance
    eig = p.eigenvalues
    rng = np.random.default_rng(1)
    delta = 0.3 * rng.normal(size=d)
    # C = Q diag(eig) Q^T is not stored; estimate it from the data only via its action through the model
    Cov = np.cov(p.X.T, bias=True)  # sample covariance (exact population eig up to 1%)
    np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(Cov)), np.sort(eig), rtol=0.03)
    Cd = Cov @ delta
    tr_expected = Cd @ Cd + (delta @ Cd) * eig.sum() + sigma**2 * eig.sum()
    ns = C.gradient_noise_scale(p, p.teacher + delta)
    assert ns.trace_sigma == pytest.approx(tr_expected, rel=0.05)
    assert ns.b_simple == pytest.approx(tr_expected / (Cd @ Cd), rel=0.1)
    # at the dataset optimum the gradient vanishes and tr(Sigma) is the noise term
    at_opt = C.gradient_noise_scale(p, p.optimum)
    assert at_opt.grad_sq_norm < 1e-20
    assert at_opt.trace_sigma == pytest.approx(sigma**2 * eig.sum(), rel=0.05)


def test_noise_scale_grows_with_label_noise():
    bs = []
    for sigma in (0.1, 0.5, 2.0):
        p = C.make_problem("least_squares", 3000, 5, seed=0, sigma=sigma)
        bs.append(C.gradient_noise_scale(p, p.teacher + 0.2).b_simple)
    assert bs[0] < bs[1] < bs[2]


def test_noise_scale_exact_and_unbiased_against_brute_force():
    p = C.make_problem("logistic", 300, 3, workers=1, seed=6)
    w = p.optimum + 0.5
    # brute force per-example gradients in NumPy
    m = p.y * (p.X @ w)
    G = (-(p.y / (1 + np.exp(m))))[:, None] * p.X + p.lam * w
    tr = ((G - G.mean(0)) ** 2).sum() / len(G)
    gsq = G.mean(0) @ G.mean(0)
    exact = C.gradient_noise_scale(p, w)
    assert exact.trace_sigma == pytest.approx(tr, rel=1e-12)
    assert exact.grad_sq_norm == pytest.approx(gsq, rel=1e-12)
    # subsampled estimates are unbiased: average over many draws
    draws = [C.gradient_noise_scale(p, w, seed=s, n_examples=20) for s in range(400)]
    trs = np.array([d.trace_sigma for d in draws])
    gsqs = np.array([d.grad_sq_norm for d in draws])
    assert abs(trs.mean() - tr) < 4 * trs.std() / math.sqrt(len(trs))
    assert abs(gsqs.mean() - gsq) < 4 * gsqs.std() / math.sqrt(len(gsqs))


def test_fit_critical_batch_recovers_law():
    B = np.array([1, 2, 4, 8, 16, 32, 64])
    S = 100.0 * (1 + 12.0 / B)
    s_min, b_crit = C.fit_critical_batch(B, S)
    assert s_min == pytest.approx(100.0)
    assert b_crit == pytest.approx(12.0)


def test_batch_size_sweep_steps_fall_then_flatten():
    p = C.make_problem("least_squares", 2000, 4, workers=1, seed=3, sigma=0.5)
    target = p.optimum_loss + 0.02
    ds = C.batch_size_sweep(p, [1, 4, 16, 64], [0.05, 0.2, 0.6], target, steps=400, eval_every=4, seed=1)
    best = ds.best_steps.values
    assert np.all(np.isfinite(best))
    assert best[0] > best[-1]
    assert best[0] * 1 < best[-1] * 64  # samples to target grow with batch (diminishing returns)
    assert ds.attrs["B_crit"] > 0


# ---------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize("kwargs,field", [
    (dict(kind="resnet"), "kind"),
    (dict(heterogeneity=1.5), "heterogeneity"),
    (dict(kappa=0.5), "kappa"),
    (dict(workers=0), "workers"),
    (dict(kind="logistic", lam=0.0), "lam"),
    (dict(seed=-1), "seed"),
])
def test_make_problem_validates(kwargs, field):
    args = dict(kind="least_squares", n_samples=50, dim=3, workers=2, heterogeneity=0.0, seed=0)
    args.update(kwargs)
    with pytest.raises(SpecError) as err:
        C.make_problem(**args)
    assert err.value.field == field


@pytest.mark.parametrize("kwargs,field", [
    (dict(method="gossip"), "method"),
    (dict(optimizer="lion"), "optimizer"),
    (dict(lr=0.0), "lr"),
    (dict(steps=10, eval_every=3), "steps"),
    (dict(method="local", H=4, eval_every=2, steps=8), "eval_every"),
    (dict(H=2), "method"),
    (dict(method="local", outer_momentum=1.0), "outer_momentum"),
    (dict(compressor="topk"), "compressor"),
    (dict(compressor=3), "compressor"),
    (dict(compressor={"name": "top_k"}), "k"),
    (dict(compressor={"name": "top_k", "k": 4}), "k"),  # k > d = 3
    (dict(compressor={"name": "qsgd"}), "levels"),
    (dict(compressor={"name": "powersgd", "rank": 2}), "rank"),  # the 1 x 3 view has rank <= 1
    (dict(compressor={"name": "top_k", "k": 1, "ef": True}), "ef"),
    (dict(method="async", speeds=[1.0]), "speeds"),
    (dict(method="async", speeds=[1.0, 0.0]), "speeds"),
    (dict(method="async", speeds=[1.0, float("nan")]), "speeds"),
    (dict(method="async", speeds="fast"), "speeds"),
    (dict(method="async", time_per_step_s=0.0), "time_per_step_s"),
    (dict(method="async", jitter=-0.1), "jitter"),
    (dict(method="async", H=2), "method"),
    (dict(method="sync", speeds=[1.0, 1.0]), "method"),
    (dict(method="local", jitter=0.1), "method"),
])
def test_run_validates(kwargs, field):
    p = C.make_problem("least_squares", 50, 3, workers=2, seed=0)
    args = dict(method="sync", optimizer="sgd", lr=0.1, steps=10, batch_size=2, eval_every=1)
    args.update(kwargs)
    with pytest.raises(SpecError) as err:
        C.run(p, **args)
    assert err.value.field == field


# ---------------------------------------------------------------------------------------------
# compression inside the distributed loops

# 'none' in any spelling must reproduce the run without a compressor argument bit for bit. The
# reference is computed in the same process: bit-for-bit equality holds between two code paths on one
# machine, not across CPUs (Numba/LLVM may contract or vectorise differently), so nothing is stored.
# The uncompressed runs themselves are checked against NumPy references to a tolerance above.
def _runs_with(**comp):
    p = C.make_problem("least_squares", 120, 4, workers=3, heterogeneity=0.6, seed=13, kappa=8.0, sigma=0.2)
    a = C.run(p, "sync", "momentum", lr=0.1, steps=12, batch_size=4, eval_every=4, seed=17, **comp)
    b = C.run(p, "local", "adam", lr=0.05, steps=12, batch_size=4, H=3, outer_lr=0.8, outer_momentum=0.5,
              delayed=True, eval_every=6, seed=17, **comp)
    return a, b


@pytest.fixture(scope="module")
def uncompressed_runs():
    return _runs_with()


@pytest.mark.parametrize("comp", [dict(compressor="none"), dict(compressor={"name": "none"}),
                                  dict(compressor=CP.CompressorSpec()), dict(compressor=None),
                                  dict(compressor={"name": "none", "error_feedback": True})])
def test_no_compression_is_bitwise_the_uncompressed_run(comp, uncompressed_runs):
    a, b = _runs_with(**comp)
    for ds, ref in zip((a, b), uncompressed_runs):
        np.testing.assert_array_equal(ds.loss.values, ref.loss.values)
        np.testing.assert_array_equal(ds.params.values, ref.params.values)
    np.testing.assert_array_equal(a.bits_sent_per_worker.values[-1], [32 * 4 * 12] * 3)
    np.testing.assert_array_equal(b.bits_sent_per_worker.values[-1], [32 * 4 * 4] * 3)
    assert a.attrs["compressor"] == "none"


def test_top_k_with_ratio_one_is_no_compression():
    p = C.make_problem("two_layer", 200, 3, workers=3, heterogeneity=0.5, seed=4, hidden=3)
    d = p.n_params  # 3*3 + 2*3 + 1 = 16
    for method, kw in (("sync", dict(eval_every=5)), ("local", dict(H=5, outer_momentum=0.5))):
        a = C.run(p, method, "momentum", lr=0.05, steps=30, batch_size=4, seed=2, **kw)
        for ef in (False, True):
            b = C.run(p, method, "momentum", lr=0.05, steps=30, batch_size=4, seed=2,
                      compressor={"name": "top_k", "ratio": 1.0, "error_feedback": ef}, **kw)
            np.testing.assert_array_equal(b.loss.values, a.loss.values)
            np.testing.assert_array_equal(b.params.values, a.params.values)
            msgs = 30 if method == "sync" else 6
            # values and indices of all d entries: d (32 + ceil(log2 d)) bits
            np.testing.assert_array_equal(b.bits_sent_per_worker.values[-1], [msgs * d * (32 + 4)] * 3)


def test_bits_per_message_and_local_sgd_sends_once_per_round():
    p = C.make_problem("least_squares", 200, 10, workers=2, seed=0)
    d, steps, H = 10, 40, 10
    per_msg = {
        "none": 32 * d,
        "top_k_3": 3 * (32 + 4),  # ceil(log2 10) = 4
        "random_k_3": 3 * (32 + 4),
        "qsgd_4": 32 + d * (1 + 3),  # sign + level in 0..4 (3 bits) per entry, plus the norm
        "powersgd_1": 32 * 1 * (3 + 4),  # 10 entries viewed as 3 x 4
    }
    specs = {"none": "none", "top_k_3": {"name": "top_k", "k": 3, "error_feedback": True},
             "random_k_3": {"name": "random_k", "k": 3}, "qsgd_4": {"name": "qsgd", "levels": 4},
             "powersgd_1": {"name": "powersgd", "rank": 1}}
    for name, spec in specs.items():
        sync = C.run(p, "sync", "sgd", lr=0.05, steps=steps, batch_size=4, eval_every=H, seed=3, compressor=spec)
        local = C.run(p, "local", "sgd", lr=0.05, steps=steps, batch_size=4, H=H, seed=3, compressor=spec)
        assert CP.resolve_compressor(spec).nominal_bits(d) == per_msg[name]
        # cumulative bits at steps 0, 10, 20, ...: one message per step (sync) or per round (local)
        expected_sync = np.arange(steps // H + 1)[:, None] * H * per_msg[name] * np.ones(2)
        np.testing.assert_array_equal(sync.bits_sent_per_worker.values, expected_sync)
        np.testing.assert_array_equal(local.bits_sent_per_worker.values * H, expected_sync)
    # QSGD with Elias coding sends data-dependent, fewer bits than fixed width at s = 1
    el = C.run(p, "sync", "sgd", lr=0.05, steps=steps, batch_size=4, eval_every=H, seed=3,
               compressor={"name": "qsgd", "levels": 1, "elias": True})
    assert np.all(el.bits_sent_per_worker.values[-1] < steps * (32 + d * 2))
    assert np.all(el.bits_sent_per_worker.values[-1] > steps * 32)


def _ef_stall_problem():
    """Two workers, one example each: ``x_0 = (2, 1)``, ``x_1 = (-2, 1)``, labels ``-1``.

    The pooled optimum is ``(0, -1)``, where both examples fit exactly (so every worker's gradient
    vanishes there). From ``w = 0`` the workers' gradients are ``(2, 1)`` and ``(-2, 1)``: top-1
    sends ``(2, 0)`` and ``(-2, 0)``, whose mean is zero, so without error feedback the run never
    moves, a distance 1 from the optimum. With error feedback the second coordinates accumulate
    until they are sent."""
    X = np.array([[2.0, 1.0], [-2.0, 1.0]])
    y = np.array([-1.0, -1.0])
    opt = np.array([0.0, -1.0])
    return C.Problem("least_squares", X, y, np.array([0, 1, 2]), dim=2, hidden=1, lam=0.0, sigma=0.0,
                     kappa=4.0, heterogeneity=1.0, teacher=opt, worker_teachers=np.array([opt, opt]),
                     eigenvalues=np.array([4.0, 1.0]), optimum=opt, optimum_loss=0.0,
                     parameters={"hand_built": "ef_stall"})


@pytest.mark.parametrize("method,kw", [("sync", dict(eval_every=10)), ("local", dict(H=4, eval_every=40))])
def test_error_feedback_recovers_what_top_k_loses(method, kw):
    p = _ef_stall_problem()
    assert np.linalg.norm(p.grad(p.optimum)) == 0.0
    runs = {}
    for name, comp in (("none", "none"), ("top1", {"name": "top_k", "k": 1}),
                       ("top1_ef", {"name": "top_k", "k": 1, "error_feedback": True})):
        runs[name] = C.run(p, method, "sgd", lr=0.2, steps=400, batch_size=1, seed=0, compressor=comp, **kw)
    dist = {k: np.linalg.norm(ds.params.values - p.optimum) / np.linalg.norm(p.optimum) for k, ds in runs.items()}
    assert dist["none"] < 1e-6
    assert dist["top1"] >= 0.99  # stalled at the start
    np.testing.assert_array_equal(runs["top1"].loss.values, 0.5)
    assert dist["top1_ef"] < 1e-6
    # same bits for the plain and the error-feedback run: one value and a 1-bit index per message
    np.testing.assert_array_equal(runs["top1"].bits_sent_per_worker.values,
                                  runs["top1_ef"].bits_sent_per_worker.values)
    assert runs["top1"].bits_sent_per_worker.values[-1, 0] == (400 if method == "sync" else 100) * 33


def _ls_for_compression():
    return C.make_problem("least_squares", 800, 10, workers=2, heterogeneity=0.3, seed=3, sigma=0.1)


def test_random_k_unbiased_converges_slower_than_uncompressed():
    p = _ls_for_compression()
    kw = dict(lr=0.1, steps=600, batch_size=8, eval_every=10, seed=1)
    base = C.run(p, "sync", "sgd", **kw)
    rk = C.run(p, "sync", "sgd", compressor={"name": "random_k", "k": 3}, **kw)
    init = float(base.suboptimality.values[0])
    floor = {n: float(ds.suboptimality.values[-10:].mean()) for n, ds in (("none", base), ("rk", rk))}
    # converges to a neighbourhood of the optimum ...
    assert floor["rk"] < 1e-2 * init
    # ... more slowly (the d/k = 10/3 variance factor): later to a target, and a wider neighbourhood
    target = p.optimum_loss + 1e-2 * init
    assert C.steps_to_target(rk, target) > C.steps_to_target(base, target)
    assert floor["rk"] > 2 * floor["none"]
    # unbiased random-k (kept entries times d/k) at lr is plain random-k at lr d/k, same draws
    plain = C.run(p, "sync", "sgd", compressor={"name": "random_k", "k": 3, "unbiased": False},
                  **{**kw, "lr": 0.1 * 10 / 3})
    np.testing.assert_allclose(plain.params.values, rk.params.values, rtol=1e-9)


@pytest.mark.parametrize("levels", [4, 8])
def test_qsgd_converges_on_least_squares(levels):
    p = _ls_for_compression()
    kw = dict(lr=0.1, steps=600, batch_size=8, eval_every=10, seed=1)
    base = C.run(p, "sync", "sgd", **kw)
    q = C.run(p, "sync", "sgd", compressor={"name": "qsgd", "levels": levels}, **kw)
    init = float(base.suboptimality.values[0])
    floor_q = float(q.suboptimality.values[-10:].mean())
    floor_none = float(base.suboptimality.values[-10:].mean())
    # variance at most min(d/s^2, sqrt(d)/s) |g|^2 more: a neighbourhood within a small factor
    assert floor_q < 3 * floor_none
    assert floor_q < 2e-3 * init
    assert math.isfinite(C.steps_to_target(q, p.optimum_loss + 1e-3 * init))


def test_compressed_sync_matches_numpy_reference():
    """The kernel's loop against a NumPy loop calling ``compression.compress`` per worker with the
    documented keys ``(compressor_seed(seed), worker, step)`` and per-worker initial states."""
    p = C.make_problem("least_squares", 60, 6, workers=3, heterogeneity=0.7, seed=1, lam=0.01)
    steps, B, lr, seed = 20, 3, 0.1, 4
    batches = C.run_batches(p, steps, B, seed=seed)
    cseed = C.compressor_seed(seed)
    for spec in ({"name": "top_k", "k": 2, "error_feedback": True}, {"name": "random_k", "k": 2},
                 {"name": "qsgd", "levels": 2}, {"name": "powersgd", "rank": 1, "error_feedback": True}):
        ds = C.run(p, "sync", "sgd", lr=lr, steps=steps, batch_size=B, eval_every=steps, seed=seed, compressor=spec)
        assert ds.attrs["compressor_seed"] == cseed
        sp = CP.resolve_compressor(spec)
        states = [sp.init_state(6, cseed, k) for k in range(3)]
        x = np.zeros(6)
        bits = np.zeros(3)
        for s in range(steps):
            g = np.zeros(6)
            for k in range(3):
                c = CP.compress(_ref_grad(p.X, p.y, x, batches[s, k], p.lam), sp, seed=cseed, step=s, worker=k,
                                state=states[k])
                g += c.out
                bits[k] += c.bits
            x = x - lr * (g / 3)
        np.testing.assert_allclose(ds.params.values, x, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(ds.bits_sent_per_worker.values[-1], bits)


def test_compressed_runs_do_not_depend_on_thread_count():
    p = C.make_problem("least_squares", 300, 12, workers=4, heterogeneity=0.5, seed=5, sigma=0.2)
    kw = dict(lr=0.05, steps=24, batch_size=4, seed=8)
    specs = ({"name": "top_k", "k": 3, "error_feedback": True}, {"name": "random_k", "ratio": 0.25},
             {"name": "powersgd", "rank": 2, "error_feedback": True})
    before = numba.get_num_threads()
    results = []
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            results.append([C.run(p, m, "momentum", compressor=sp, **kw, **extra)
                            for sp in specs for m, extra in (("sync", dict(eval_every=4)), ("local", dict(H=4)))])
    finally:
        numba.set_num_threads(before)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a.loss.values, b.loss.values)
        np.testing.assert_array_equal(a.params.values, b.params.values)
        np.testing.assert_array_equal(a.bits_sent_per_worker.values, b.bits_sent_per_worker.values)
    # and compression changed the runs (different compressors, different curves)
    assert not np.array_equal(results[0][0].params.values, results[0][2].params.values)


# ---------------------------------------------------------------------------------------------
# asynchronous SGD: event-driven staleness from worker speeds


@pytest.mark.parametrize("opt,comp", [("sgd", "none"), ("adam", "none"),
                                      ("momentum", {"name": "top_k", "k": 1, "error_feedback": True})])
def test_async_with_one_worker_is_sync(opt, comp):
    p = C.make_problem("least_squares", 60, 3, workers=1, seed=4, lam=0.01)
    kw = dict(lr=0.05, steps=24, batch_size=3, eval_every=4, seed=6, compressor=comp)
    a = C.run(p, "sync", opt, **kw)
    b = C.run(p, "async", opt, speeds=[2.5], time_per_step_s=0.1, jitter=0.3, **kw)
    np.testing.assert_array_equal(b.loss.values, a.loss.values)
    np.testing.assert_array_equal(b.params.values, a.params.values)
    np.testing.assert_array_equal(b.bits_sent_per_worker.values, a.bits_sent_per_worker.values)
    np.testing.assert_array_equal(b.update_staleness.values, 0)
    assert np.all(np.diff(b.update_time_s.values) > 0)


def test_async_equal_speeds_staleness_is_workers_minus_one():
    W = 4
    p = C.make_problem("least_squares", 200, 3, workers=W, seed=1)
    ds = C.run(p, "async", "sgd", lr=0.02, steps=40, batch_size=2, eval_every=4, seed=3,
               speeds=[1.5] * W, time_per_step_s=0.3)
    st = ds.update_staleness.values
    np.testing.assert_array_equal(st[:W], np.arange(W))  # the first round: all read x0
    np.testing.assert_array_equal(st[W:], W - 1)
    np.testing.assert_array_equal(ds.update_worker.values, np.tile(np.arange(W), 10))  # ties by index
    np.testing.assert_allclose(ds.update_time_s.values, np.repeat(np.arange(1, 11), W) * 0.2, rtol=1e-12)
    np.testing.assert_array_equal(ds.staleness.values[2:], W - 1)
    assert ds.time_s.values[0] == 0.0 and ds.time_s.values[-1] == pytest.approx(2.0)
    assert ds.attrs["samples_per_step"] == 2
    np.testing.assert_array_equal(ds.samples.values, ds.step.values * 2)


@pytest.mark.parametrize("jitter", [0.0, 0.3])
def test_async_slower_workers_see_more_staleness(jitter):
    speeds = [1.0, 2.0, 4.0]
    p = C.make_problem("least_squares", 300, 3, workers=3, seed=2)
    ds = C.run(p, "async", "sgd", lr=0.01, steps=700, batch_size=2, eval_every=7, seed=5,
               speeds=speeds, jitter=jitter)
    st, wk = ds.update_staleness.values, ds.update_worker.values
    mean = [st[wk == k].mean() for k in range(3)]
    assert mean[0] > mean[1] > mean[2]
    # worker k's updates arrive at rate speeds[k]; in one of its gradients the others land
    # sum_{q != k} speeds[q] / speeds[k] updates
    for k in range(3):
        expect = (sum(speeds) - speeds[k]) / speeds[k]
        assert mean[k] == pytest.approx(expect, rel=0.1)
        assert np.mean(wk == k) == pytest.approx(speeds[k] / sum(speeds), abs=0.03)


def test_async_is_seeded():
    p = C.make_problem("two_layer", 200, 3, workers=3, heterogeneity=0.3, seed=8, hidden=4)
    kw = dict(lr=0.05, steps=30, batch_size=4, eval_every=5, speeds=[1.0, 0.5, 2.0], jitter=0.5,
              compressor={"name": "random_k", "k": 4})
    a = C.run(p, "async", "adam", seed=3, **kw)
    b = C.run(p, "async", "adam", seed=3, **kw)
    assert a.identical(b)
    c = C.run(p, "async", "adam", seed=4, **kw)
    assert not np.array_equal(a.update_time_s.values, c.update_time_s.values)
    assert not np.array_equal(a.loss.values, c.loss.values)


def _ref_async(p, batches, durations, opt, lr, eval_every):
    """Plain-Python event loop: a heap of (finish time, worker), each worker's gradient taken on
    the parameters it read when it started."""
    import heapq

    steps, W = durations.shape
    x = np.zeros(p.dim)
    m, v = np.zeros(p.dim), np.zeros(p.dim)
    grads, read, count, heap = {}, {}, {}, []
    for k in range(W):
        grads[k], read[k], count[k] = _ref_grad(p.X, p.y, x, batches[0, k], p.lam), 0, 1
        heapq.heappush(heap, (durations[0, k], k))
    losses, times, stale, workers = [_ref_loss(p.X, p.y, x, p.lam)], [], [], []
    for u in range(steps):
        now, k = heapq.heappop(heap)
        _ref_update(opt, x, grads[k], m, v, lr, u + 1)
        times.append(now)
        stale.append(u - read[k])
        workers.append(k)
        if (u + 1) % eval_every == 0:
            losses.append(_ref_loss(p.X, p.y, x, p.lam))
        j = count[k]
        if u + 1 < steps:
            grads[k], read[k], count[k] = _ref_grad(p.X, p.y, x, batches[j, k], p.lam), u + 1, j + 1
            heapq.heappush(heap, (now + durations[j, k], k))
    return x, np.array(losses), np.array(times), np.array(stale), np.array(workers)


@pytest.mark.parametrize("opt,jitter", [("sgd", 0.0), ("momentum", 0.4), ("adam", 0.2)])
def test_async_matches_python_event_loop(opt, jitter):
    p = C.make_problem("least_squares", 40, 3, workers=3, heterogeneity=0.5, seed=1, kappa=5, lam=0.01)
    speeds, tps, steps, B = [1.0, 1.7, 3.0], 0.25, 36, 2
    lr = 0.02 if opt == "adam" else 0.05
    ds = C.run(p, "async", opt, lr=lr, steps=steps, batch_size=B, eval_every=3, seed=4,
               speeds=speeds, time_per_step_s=tps, jitter=jitter)
    dur = C.run_durations(p, steps, speeds, tps, jitter, seed=4)
    if jitter == 0.0:
        np.testing.assert_array_equal(dur, np.broadcast_to(tps / np.array(speeds), (steps, 3)))
    x, losses, times, stale, workers = _ref_async(p, C.run_batches(p, steps, B, seed=4), dur, opt, lr, 3)
    np.testing.assert_allclose(ds.params.values, x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ds.loss.values, losses, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(ds.update_time_s.values, times)
    np.testing.assert_array_equal(ds.update_staleness.values, stale)
    np.testing.assert_array_equal(ds.update_worker.values, workers)
    np.testing.assert_array_equal(ds.time_s.values[1:], times[2::3])
    np.testing.assert_allclose(ds.staleness.values[1:], stale.reshape(-1, 3).mean(axis=1))
    counts = np.bincount(workers, minlength=3)
    np.testing.assert_array_equal(ds.bits_sent_per_worker.values[-1], 32 * 3 * counts)


def test_async_converges_on_least_squares():
    speeds = np.array([1.0, 1.5, 2.0, 3.0])
    p = C.make_problem("least_squares", 800, 5, workers=4, heterogeneity=0.0, seed=9, kappa=4.0, sigma=0.1)
    ds = C.run(p, "async", "sgd", lr=0.005, steps=4000, batch_size=8, eval_every=100, seed=1,
               speeds=speeds, jitter=0.2)
    sub = ds.suboptimality.values
    assert sub[-5:].mean() < 2e-4 * sub[0]
    assert ds.update_staleness.values.max() > 3  # the slow worker is genuinely stale
    # non-IID shards: fast workers apply more updates, so async SGD heads for the optimum of the
    # speed-weighted objective sum_k speeds[k] f_k, not the pooled one
    p = C.make_problem("least_squares", 800, 5, workers=4, heterogeneity=0.5, seed=9, kappa=4.0, sigma=0.1)
    A, b = np.zeros((5, 5)), np.zeros(5)
    for k in range(4):
        Xk, yk = p.X[p.shard(k)], p.y[p.shard(k)]
        A += speeds[k] * Xk.T @ Xk / len(yk)
        b += speeds[k] * Xk.T @ yk / len(yk)
    weighted = np.linalg.solve(A, b)
    ds = C.run(p, "async", "sgd", lr=0.003, steps=8000, batch_size=8, eval_every=100, seed=1,
               speeds=speeds, jitter=0.2)
    gap = np.linalg.norm(weighted - p.optimum)
    assert np.linalg.norm(ds.params.values - weighted) < 0.25 * gap
    assert np.linalg.norm(ds.params.values - p.optimum) > 0.75 * gap
