"""Asynchronous local SGD, hierarchical asynchronous local SGD (HALoS) and independent subnetwork
training: event schedules against hand computations and a plain-Python event queue, the numeric
replay against a plain-Python reference, reductions to simpler methods, and the effects the
studies rely on."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainscale.training import convergence as C
from trainscale.kernels import hierarchical as KH
from trainscale.kernels import optim as K
from trainscale.model.specs import SpecError

# ---------------------------------------------------------------------------------------------
# the event schedule


def test_schedule_by_hand():
    """Two workers (1 s and 2 s per round), one region pushing every K = 2 updates, 0.1 s to the
    regional server, 0.5 s to the global one."""
    dur = np.tile([1.0, 2.0], (6, 1))
    kind, who, rnd, when = KH.hierarchical_schedule(dur, np.array([0.1, 0.1]), np.array([0, 0]),
                                                   np.array([0.5]), 2, 5)
    W_, P_, G_, M_ = KH.EV_WORKER, KH.EV_PUSH, KH.EV_GLOBAL, KH.EV_MERGE
    expected = [  # (kind, who, round, time)
        (W_, 0, 0, 1.1),   # worker 0: 1 s compute + 0.1 s upload
        (W_, 1, 0, 2.1),   # worker 1: 2 s + 0.1 s; the region now has K = 2 updates ...
        (P_, 0, -1, 2.1),  # ... and pushes at once
        (W_, 0, 1, 2.3),   # worker 0 downloaded at 1.2, computed until 2.2, uploaded
        (G_, 0, -1, 2.6),  # the push reaches the global server
        (M_, 0, -1, 3.1),  # and the global model is back
        (W_, 0, 2, 3.5),
        (P_, 0, -1, 3.5),  # two updates since the last push, none in flight
        (G_, 0, -1, 4.0),
        (W_, 1, 1, 4.3),   # the fifth message ends the schedule
    ]
    got = list(zip(kind.tolist(), who.tolist(), rnd.tolist(), when.tolist()))
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    np.testing.assert_allclose([g[3] for g in got], [e[3] for e in expected], rtol=0, atol=1e-12)


def _ref_schedule(dur, wcomm, region_of, rcomm, K_push, messages):
    """Plain-Python event queue: pending events as (time, priority, index, kind), sorted each time."""
    W, R = dur.shape[1], len(rcomm)
    prio = {KH.EV_GLOBAL: 0, KH.EV_MERGE: 1, KH.EV_WORKER: 2}
    pending = [(dur[0, k] + wcomm[k], prio[KH.EV_WORKER], k, KH.EV_WORKER) for k in range(W)]
    rounds, count, busy, out, done = [0] * W, [0] * R, [False] * R, [], 0
    while done < messages:
        pending.sort()
        t, _, i, kind = pending.pop(0)
        out.append((kind, i, rounds[i] if kind == KH.EV_WORKER else -1, t))
        if kind == KH.EV_GLOBAL:
            pending.append((t + rcomm[i], prio[KH.EV_MERGE], i, KH.EV_MERGE))
            continue
        if kind == KH.EV_MERGE:
            r, busy[i] = i, False
        else:
            r = region_of[i]
            rounds[i] += 1
            done += 1
            count[r] += 1
            if done < messages:
                pending.append((t + 2 * wcomm[i] + dur[rounds[i], i], prio[KH.EV_WORKER], i, KH.EV_WORKER))
        if K_push > 0 and count[r] >= K_push and not busy[r] and done < messages:
            out.append((KH.EV_PUSH, r, -1, t))
            count[r], busy[r] = 0, True
            pending.append((t + rcomm[r], prio[KH.EV_GLOBAL], r, KH.EV_GLOBAL))
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(0, 4), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_schedule_matches_python_event_queue(W, R, K_push, messages, seed):
    rng = np.random.default_rng(seed)
    R = min(R, W)
    region_of = np.sort(np.concatenate([np.arange(R), rng.integers(0, R, W - R)])).astype(np.int64)
    if K_push == 0:
        region_of[:], R = 0, 1
    dur = rng.uniform(0.1, 3.0, (messages, W))
    wcomm = rng.uniform(0.0, 0.5, W)
    rcomm = rng.uniform(0.0, 4.0, R)
    got = KH.hierarchical_schedule(dur, wcomm, region_of, rcomm, K_push, messages)
    ref = _ref_schedule(dur, wcomm, region_of, rcomm, K_push, messages)
    assert list(zip(*(a.tolist() for a in got[:3]))) == [r[:3] for r in ref]
    np.testing.assert_allclose(got[3], [r[3] for r in ref], rtol=1e-12, atol=0)
    assert (np.diff(got[3]) >= 0).all()
    assert (got[0] == KH.EV_WORKER).sum() == messages


# ---------------------------------------------------------------------------------------------
# the numeric replay


def _grad(p, x, idx):
    g = np.zeros_like(x)
    for i in idx:
        g += (p.X[i] @ x - p.y[i]) * p.X[i]
    return g / len(idx) + p.lam * x


def _nesterov(x, u, delta, lr, mu):
    u[:] = mu * u + delta
    change = lr * (delta + mu * u)
    x -= change
    return change


def _ref_hierarchical(p, kw, seed):
    """Plain Python over the kernel's schedule (itself checked above): SGD inner steps."""
    W, H, B = p.workers, kw["H"], kw["batch_size"]
    flat = "regions" not in kw
    region_of = np.zeros(W, int) if flat else C.region_assignment(W, kw["regions"])
    R = region_of.max() + 1
    dur = C.run_durations(p, kw["steps"] * H, kw["speeds"], 1.0, 0.0, seed).reshape(kw["steps"], H, W).sum(axis=1)
    wcomm = np.full(W, kw.get("worker_comm_s", 0.0))
    rcomm = np.full(R, kw.get("region_comm_s", 0.0))
    ev = KH.hierarchical_schedule(dur, wcomm, region_of.astype(np.int64), rcomm, 0 if flat else kw["updates_per_push"],
                                 kw["steps"])
    batches = C.run_batches(p, (ev[2].max() + 1) * H, B, seed)
    x0 = np.zeros(p.dim)
    xs = [x0.copy() for _ in range(W)]
    xr = [x0.copy() for _ in range(R)]
    ur = [np.zeros(p.dim) for _ in range(R)]
    acc = [np.zeros(p.dim) for _ in range(R)]
    pushed, returned = [None] * R, [None] * R
    xg, ug = x0.copy(), np.zeros(p.dim)
    losses = [p.loss(x0)]
    u = 0
    for kind, who, rnd, _ in zip(*ev):
        if kind == KH.EV_WORKER:
            r = 0 if flat else region_of[who]
            xk = xs[who].copy()
            for h in range(H):
                xk -= kw["lr"] * _grad(p, xk, batches[rnd * H + h, who])
            acc[r] += _nesterov(xr[r], ur[r], xs[who] - xk, kw["outer_lr"], kw["outer_momentum"])
            xs[who] = xr[r].copy()
            u += 1
            losses.append(p.loss(xr[0] if flat else xg))
        elif kind == KH.EV_PUSH:
            pushed[who], acc[who] = acc[who].copy(), np.zeros(p.dim)
        elif kind == KH.EV_GLOBAL:
            _nesterov(xg, ug, pushed[who], kw["global_lr"], kw["global_momentum"])
            returned[who] = xg.copy()
        else:
            a = kw["merge_weight"]
            xr[who] = (1 - a) * xr[who] + a * returned[who]
    return (xr[0] if flat else xg), np.array(losses)


@pytest.mark.parametrize("kw", [
    dict(method="async_local", H=3, outer_lr=0.8, outer_momentum=0.5, worker_comm_s=0.3),
    dict(method="hierarchical", H=2, outer_lr=1.0, outer_momentum=0.0, regions=2, updates_per_push=2,
         region_comm_s=1.5, worker_comm_s=0.1, global_lr=0.9, global_momentum=0.6, merge_weight=0.25),
    dict(method="hierarchical", H=1, outer_lr=0.5, outer_momentum=0.3, regions=[0, 1, 1, 0], updates_per_push=3,
         region_comm_s=0.7, global_lr=1.0, global_momentum=0.0, merge_weight=1.0),
])
def test_replay_matches_python_reference(kw):
    p = C.make_problem("least_squares", 48, 3, workers=4, heterogeneity=0.5, seed=2, kappa=5, lam=0.01)
    kw = dict(kw, lr=0.05, steps=30, batch_size=2, speeds=[1.0, 0.4, 0.7, 0.2])
    if isinstance(kw.get("regions"), list):
        kw["regions"] = np.array(kw["regions"])
    ds = C.run(p, optimizer="sgd", seed=5, **kw)
    x, losses = _ref_hierarchical(p, kw, seed=5)
    np.testing.assert_allclose(ds.params.values, x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ds.loss.values, losses, rtol=0, atol=1e-12)
    if kw["method"] == "hierarchical":
        pushes = ds.region_bits_sent.values / (32 * 3)
        assert pushes.sum() >= 1 and np.all(pushes == np.round(pushes))


@pytest.mark.parametrize("opt", ["sgd", "momentum"])
def test_async_local_with_H1_is_async_sgd(opt):
    """One inner SGD step, outer step 1 without momentum and free links: the server applies
    ``x_read - (x_read - lr g) = lr g``, asynchronous SGD up to that rounding."""
    p = C.make_problem("least_squares", 200, 4, workers=4, heterogeneity=0.3, seed=1, kappa=10)
    kw = dict(lr=0.05, steps=120, batch_size=4, speeds=[1.0, 0.5, 0.3, 0.9], jitter=0.2, seed=3, eval_every=4)
    a = C.run(p, "async", "sgd", **kw)
    b = C.run(p, "async_local", "sgd", **kw)
    np.testing.assert_allclose(b.loss.values, a.loss.values, rtol=1e-12)
    for var in ("update_time_s", "update_worker", "update_staleness"):
        np.testing.assert_array_equal(b[var].values, a[var].values)
    np.testing.assert_array_equal(b.time_s.values, a.time_s.values)


def test_hierarchical_with_immediate_full_merge_is_async_local():
    """One region, a push after every update, free links, global step 1 and merge weight 1: the
    regional and global models take the same steps, so the global model is the flat server's."""
    p = C.make_problem("least_squares", 200, 4, workers=4, heterogeneity=0.3, seed=1, kappa=10)
    kw = dict(lr=0.05, steps=60, batch_size=4, H=3, outer_lr=0.8, speeds=[1.0, 0.5, 0.3, 0.9], seed=3,
              worker_comm_s=0.2)
    a = C.run(p, "async_local", "sgd", **kw)
    b = C.run(p, "hierarchical", "sgd", regions=1, updates_per_push=1, region_comm_s=0.0, merge_weight=1.0, **kw)
    # the global model is evaluated when a message lands, before that message's push reaches it
    # (same instant, later event), so it is the flat server's model of one message earlier
    np.testing.assert_allclose(b.loss.values[2:], a.loss.values[1:-1], rtol=1e-12)
    assert b.loss.values[1] == a.loss.values[0]
    np.testing.assert_array_equal(b.update_time_s.values, a.update_time_s.values)
    assert float(b.region_bits_sent.sum()) == 32 * 4 * 59  # no push after the last message


def test_hierarchical_is_seeded_and_converges():
    p = C.make_problem("least_squares", 800, 8, workers=8, heterogeneity=0.2, seed=4, kappa=5)
    kw = dict(lr=0.02, steps=400, batch_size=8, H=4, outer_lr=0.5, outer_momentum=0.3, regions=4,
              updates_per_push=4, region_comm_s=3.0, worker_comm_s=0.01, global_momentum=0.3, merge_weight=0.25,
              speeds=np.linspace(0.1, 1.0, 8), eval_every=20, seed=7)
    a = C.run(p, "hierarchical", "sgd", **kw)
    b = C.run(p, "hierarchical", "sgd", **kw)
    assert a.identical(b)
    sub = a.suboptimality.values
    assert sub[-1] < 0.05 * sub[0]
    # every worker contributed, fast workers more often
    counts = np.bincount(a.update_worker.values, minlength=8)
    assert (counts > 0).all() and counts[-1] > 3 * counts[0]
    assert np.isnan(a.staleness.values[0]) and np.nanmax(a.staleness.values) > 0


@pytest.mark.parametrize("kwargs,field", [
    (dict(method="hierarchical", regions=3), "regions"),
    (dict(method="hierarchical", regions=[0, 0, 2, 2]), "regions"),
    (dict(method="hierarchical", regions=2, updates_per_push=0), "updates_per_push"),
    (dict(method="hierarchical", regions=2, region_comm_s=[1.0, 2.0, 3.0]), "region_comm_s"),
    (dict(method="hierarchical", merge_weight=1.5), "merge_weight"),
    (dict(method="async_local", worker_comm_s=-1.0), "worker_comm_s"),
    (dict(method="async_local", regions=2), "method"),
    (dict(method="sync", worker_comm_s=1.0), "method"),
    (dict(method="async", full_batch=True), "full_batch"),
    (dict(method="ist", optimizer="adam"), "method"),
    (dict(method="ist", compressor={"name": "top_k", "k": 1}), "method"),
])
def test_event_methods_validate(kwargs, field):
    p = C.make_problem("least_squares", 40, 3, workers=4, seed=0)
    args = dict(method="sync", optimizer="sgd", lr=0.1, steps=8, batch_size=2)
    args.update(kwargs)
    with pytest.raises(SpecError) as err:
        C.run(p, **args)
    assert err.value.field == field


# ---------------------------------------------------------------------------------------------
# independent subnetwork training


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 50), st.integers(1, 8), st.integers(0, 2**40))
def test_ist_owners_is_a_balanced_partition(p, W, key):
    owner = np.empty(p, np.int64)
    K.ist_owners(p, W, np.uint64(key), owner)
    counts = np.bincount(owner, minlength=W)
    assert counts.sum() == p and owner.min() >= 0 and owner.max() < W
    assert counts.max() - counts.min() <= 1


def test_ist_owners_are_uniform():
    p, W, trials = 6, 3, 6000
    owner = np.empty(p, np.int64)
    freq = np.zeros((p, W))
    for t in range(trials):
        K.ist_owners(p, W, np.uint64(K.call_key(11, 0, t)), owner)
        freq[np.arange(p), owner] += 1
    np.testing.assert_allclose(freq / trials, 1 / W, atol=0.03)  # ~5 standard deviations


def _ref_ist(p, batches, lr, seed):
    W, d = batches.shape[1], p.dim
    x = np.zeros(d)
    owner = np.empty(d, np.int64)
    losses = [p.loss(x)]
    for s in range(batches.shape[0]):
        K.ist_owners(d, W, np.uint64(K.call_key(seed, 0, s)), owner)
        step = np.zeros(d)
        for k in range(W):
            mask = owner == k
            g = _grad(p, W * mask * x, batches[s, k])
            step[mask] = g[mask]
        x = x - lr * step
        losses.append(p.loss(x))
    return x, np.array(losses)


def test_ist_matches_python_reference_and_counts_block_bits():
    p = C.make_problem("least_squares", 60, 7, workers=3, heterogeneity=0.5, seed=3, kappa=4, lam=0.01)
    ds = C.run(p, "ist", lr=0.02, steps=25, batch_size=3, eval_every=1, seed=6)
    x, losses = _ref_ist(p, C.run_batches(p, 25, 3, seed=6), 0.02, C.compressor_seed(6))
    np.testing.assert_allclose(ds.params.values, x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ds.loss.values, losses, rtol=0, atol=1e-12)
    # each step every coordinate is sent once, by its owner
    assert ds.bits_sent_per_worker.values[-1].sum() == 32 * 7 * 25


def test_ist_with_one_worker_is_gradient_descent():
    p = C.make_problem("least_squares", 64, 5, workers=1, seed=3, kappa=4)
    a = C.run(p, "sync", lr=0.1, steps=30, full_batch=True)
    b = C.run(p, "ist", lr=0.1, steps=30, full_batch=True)
    np.testing.assert_array_equal(a.loss.values, b.loss.values)


def test_ist_stalls_at_a_floor_that_grows_with_heterogeneity():
    """Shulgin & Richtárik: IST converges to a neighbourhood, not the optimum, where full-gradient
    descent on the same data reaches it; the floor grows with the heterogeneity."""
    floors = []
    for het in (0.0, 1.0):
        p = C.make_problem("least_squares", 256, 16, workers=4, heterogeneity=het, seed=1, kappa=4, sigma=0.0)
        gd = C.run(p, "sync", lr=0.5, steps=400, full_batch=True, eval_every=400)
        assert gd.grad_norm.values[-1] < 1e-6
        ist = C.run(p, "ist", lr=0.05, steps=400, full_batch=True, eval_every=40)
        floors.append(float(ist.suboptimality.values[-3:].mean()))
    assert 0.01 < floors[0] < floors[1], floors


# slow: 400 Monte-Carlo runs (8 s); CI runs it (make test-all)
@pytest.mark.slow
def test_ist_mean_iterate_reaches_the_biased_fixed_point():
    """With full shard gradients ``f_i(x) = x'L_i x/2 - b_i'x`` and a fresh permutation each step,
    ``E x_{k+1} = E x_k - lr (M E x_k - b)`` with ``b = mean_i b_i`` and
    ``M = mean_i E[C_i L_i C_i] = mean_i W (diag L_i + (q-1)/(p-1) offdiag L_i)`` (block size
    ``q = p/W``; a pair of coordinates shares a block with probability ``(q-1)/(W(p-1))``), so
    the mean iterate goes to ``M^-1 b``, not to the optimum ``L^-1 b``."""
    p = C.make_problem("least_squares", 60, 6, workers=3, heterogeneity=0.5, seed=2, kappa=3, sigma=0.1)
    W, d, q = 3, 6, 2
    M, b = np.zeros((d, d)), np.zeros(d)
    for k in range(W):
        Xk, yk = p.X[p.shard(k)], p.y[p.shard(k)]
        L = Xk.T @ Xk / len(yk)
        M += W * (np.diag(np.diag(L)) + (q - 1) / (d - 1) * (L - np.diag(np.diag(L)))) / W
        b += Xk.T @ yk / len(yk) / W
    fixed = np.linalg.solve(M, b)
    finals = np.array([C.run(p, "ist", lr=0.02, steps=300, full_batch=True, eval_every=300, seed=s).params.values
                       for s in range(400)])
    mean, sem = finals.mean(axis=0), finals.std(axis=0) / np.sqrt(len(finals))
    assert np.all(np.abs(mean - fixed) < 5 * sem + 1e-9), (mean, fixed, sem)
    assert np.linalg.norm(fixed - p.optimum) > 20 * np.linalg.norm(sem)  # the bias is resolved
