"""recsys-meta-learning: first-order MAML of a DLRM-style model in two schedules (G-Meta, arXiv 2401.04338)."""

import numpy as np
import pytest

from trainscale.common import comparison
from trainscale.model import perfmodel
from trainscale.common import io as tsio
from trainscale.workloads import metarec as M
from trainscale.kernels import metarec as K
from trainscale.model.specs import SpecError
from trainscale.studies import recsys_meta_learning as study

STUDY = "recsys-meta-learning"
H = 8


@pytest.fixture(scope="module")
def problem():
    return M.make_problem(3, 60, 4, 20, 8, 1.5, 3.0, seed=4)


def _batch(problem, n=10, seed=0):
    rng = np.random.default_rng(seed)
    return M.sample_batch(problem, rng.integers(0, problem["n_tasks"], n), 6, 5, rng)


@pytest.mark.parametrize("workers", [1, 2, 3, 7])
def test_hybrid_and_data_parallel_give_the_same_update(problem, workers):
    """Row-sharded tables with all-to-all lookups and gradient returns give the data-parallel update, to 1e-12,
    over several steps, with uneven splits of the tasks (10 tasks over 3 or 7 workers)."""
    table, dense = M.init_params(3, 60, 4, H, seed=1)
    shards, dense_h = M.shard_table(table, workers), dense.copy()
    for step in range(4):
        batch = _batch(problem, seed=step)
        dp = M.dp_step(table, dense, batch, workers, H, 0.4, 2, 0.7)
        hy = M.hybrid_step(shards, dense_h, batch, H, 0.4, 2, 0.7)
        scale = max(np.abs(table).max(), np.abs(dense).max())
        assert np.abs(M.unshard(shards) - table).max() <= 1e-12 * scale
        assert np.abs(dense_h - dense).max() <= 1e-12 * scale
        np.testing.assert_allclose(hy["losses"], dp["losses"], rtol=1e-12)


def test_kernel_step_equals_the_numpy_reference(problem):
    table, dense = M.init_params(3, 60, 4, H, seed=2)
    t2, d2 = table.copy(), dense.copy()
    batch = _batch(problem, seed=5)
    a = M.dp_step(table, dense, batch, 2, H, 0.3, 3, 0.5)
    b = M.outer_step_numpy(t2, d2, batch, H, 0.3, 3, 0.5)
    scale = max(np.abs(t2).max(), np.abs(d2).max())
    assert np.abs(table - t2).max() <= 1e-12 * scale and np.abs(dense - d2).max() <= 1e-12 * scale
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=1e-12)


def test_gradient_matches_finite_differences(problem):
    table, dense = M.init_params(3, 60, 4, H, seed=3)
    batch = _batch(problem, seed=1)
    ids, off, sup, qry = M._task_layout(batch, [0])
    rows, idx, y = table[ids[0]].copy(), qry[0], batch["qry_y"][0]
    g_rows, g_dense = np.zeros_like(rows), np.zeros_like(dense)
    loss = K.forward_backward(rows, idx, y, dense, H, g_rows, g_dense)
    assert loss == pytest.approx(K.loss_only(rows, idx, y, dense, H), rel=1e-14)
    eps = 1e-6
    for k in np.random.default_rng(0).choice(dense.size, 12, replace=False):
        up, down = dense.copy(), dense.copy()
        up[k] += eps
        down[k] -= eps
        fd = (K.loss_only(rows, idx, y, up, H) - K.loss_only(rows, idx, y, down, H)) / (2 * eps)
        assert fd == pytest.approx(g_dense[k], abs=1e-8)
    for r, e in [(0, 0), (1, 2), (rows.shape[0] - 1, 3)]:
        up, down = rows.copy(), rows.copy()
        up[r, e] += eps
        down[r, e] -= eps
        fd = (K.loss_only(up, idx, y, dense, H) - K.loss_only(down, idx, y, dense, H)) / (2 * eps)
        assert fd == pytest.approx(g_rows[r, e], abs=1e-8)


def test_meta_gradient_is_the_query_gradient_at_the_adapted_parameters(problem):
    """First-order MAML: two support steps by hand (NumPy), then the query gradient, equals the task kernel."""
    table, dense = M.init_params(3, 60, 4, H, seed=6)
    batch = _batch(problem, n=1, seed=2)
    ids, off, sup, qry = M._task_layout(batch, [0])
    rows, d = table[ids[0]].copy(), dense.copy()
    for _ in range(2):
        _, gr, gd = M.loss_and_gradient(rows, sup[0], batch["sup_y"][0], d, H)
        rows, d = rows - 0.5 * gr, d - 0.5 * gd
    q, gr, gd = M.loss_and_gradient(rows, qry[0], batch["qry_y"][0], d, H)
    g_rows, g_dense = np.zeros_like(rows), np.zeros_like(dense)
    s, q_kernel = K.task_meta_gradient(table[ids[0]], sup[0], batch["sup_y"][0], qry[0], batch["qry_y"][0], dense, H,
                                       0.5, 2, g_rows, g_dense)
    assert q_kernel == pytest.approx(q, rel=1e-12)
    np.testing.assert_allclose(g_rows, gr, atol=1e-14)
    np.testing.assert_allclose(g_dense, gd, atol=1e-14)


def test_all_to_all_row_counts(problem):
    """Each worker fetches its distinct support rows, then the distinct query rows not among them, and returns a
    gradient for each distinct query row; the row owner is g mod P."""
    P = 3
    batch = _batch(problem, seed=3)
    table, dense = M.init_params(3, 60, 4, H, seed=1)
    out = M.hybrid_step(M.shard_table(table, P), dense, batch, H, 0.4, 1, 0.5)
    bounds = M.split_bounds(10, P)
    for w in range(P):
        t = slice(bounds[w], bounds[w + 1])
        s, q = np.unique(batch["sup_gid"][t]), np.unique(batch["qry_gid"][t])
        assert out["lookup_support"][w].sum() == s.size
        assert out["lookup_query"][w].sum() == np.setdiff1d(q, s).size
        assert out["gradients"][:, w].sum() == q.size
        assert out["lookup_support"][w, (w + 1) % P] == np.sum(s % P == (w + 1) % P)
    np.testing.assert_array_equal(M.unshard(M.shard_table(table, P)), table)


def test_expected_unique_rows():
    assert M.expected_unique_rows(1000, 1) == pytest.approx(1.0)
    assert M.expected_unique_rows(10, 10**6) == pytest.approx(10.0)
    assert M.expected_unique_rows(10**9, 1000) == pytest.approx(1000.0, rel=1e-5)
    rng = np.random.default_rng(0)
    mc = np.mean([np.unique(rng.integers(0, 50, 40)).size for _ in range(4000)])
    assert M.expected_unique_rows(50, 40) == pytest.approx(mc, rel=0.01)


WORK = {"fields": 8, "rows_per_table": 10**6, "embedding_dim": 64, "hidden": 256, "tasks_per_gpu": 64, "support": 32,
        "query": 32, "inner_steps": 1, "bytes_per_value": 4}


def test_step_time_prices_with_the_project_collectives():
    one = [M.step_time("dgx-a100-80gb", 1, s, WORK) for s in M.SCHEDULES]
    assert one[0]["comm_s"] == one[1]["comm_s"] == 0.0
    assert one[0]["step_s"] == pytest.approx(one[1]["step_s"], rel=1e-12)  # one GPU: the same work
    hy = M.step_time("dgx-a100-80gb", 64, "hybrid", WORK)
    u = 8 * M.expected_unique_rows(10**6, 64 * 32)
    u_all = 8 * M.expected_unique_rows(10**6, 64 * 64)
    row = 64 * 4 + 8
    coll = perfmodel.collective_time_s
    expected = (2 * coll("dgx-a100-80gb", "alltoall", u * row, 64) + coll("dgx-a100-80gb", "alltoall", (u_all - u) * row, 64)
                + coll("dgx-a100-80gb", "allreduce", M.dense_size(8, 64, 256) * 4, 64))
    assert hy["comm_s"] == pytest.approx(expected, rel=1e-12)
    slow = M.step_time("dgx-a100-80gb", 64, "hybrid", WORK, bandwidth_GBps=3.125)
    assert slow["comm_s"] > hy["comm_s"] and slow["compute_s"] == pytest.approx(hy["compute_s"])
    big = M.step_time("dgx-a100-80gb", 64, "data-parallel", {**WORK, "rows_per_table": 10**8})
    assert not big["feasible"] and M.step_time("dgx-a100-80gb", 64, "hybrid", {**WORK, "rows_per_table": 10**8})["feasible"]
    tiny = M.step_time("dgx-a100-80gb", 64, "data-parallel", {**WORK, "rows_per_table": 1000})
    assert tiny["table_allreduce"]  # a 2 MB table: all-reducing it whole beats the all-gather


@pytest.mark.parametrize("call,field", [
    (lambda: M.make_problem(fields=0), "fields"),
    (lambda: M.make_problem(rows_per_table=10, items_per_task=11), "items_per_task"),
    (lambda: M.init_params(2, 10, 4, 0), "hidden"),
    (lambda: M.shard_table(np.ones((3, 2)), 4), "workers"),
    (lambda: M.step_time("dgx-a100-80gb", 8, "pipeline", WORK), "schedule"),
    (lambda: M.step_time("dgx-a100-80gb", 0, "hybrid", WORK), "gpus"),
    (lambda: M.step_time("dgx-a100-80gb", 8, "hybrid", WORK, bandwidth_GBps=-1.0), "bandwidth_GBps"),
    (lambda: M.step_time("no-such-system", 8, "hybrid", WORK), "no-such-system"),
    (lambda: study.problem_parameters(inner_steps=0), "inner_steps"),
    (lambda: study.scaling_study(gpus=[1, 8], reference_gpus=64), "reference_gpus"),
    (lambda: study.equivalence_study(study.problem_parameters(), workers=[0]), "equal_workers"),
])
def test_bad_input_is_one_line_naming_the_field(call, field):
    with pytest.raises(SpecError) as err:
        call()
    message = str(err.value)
    assert field in message and "\n" not in message


def test_bad_batch_and_sizes(problem):
    table, dense = M.init_params(3, 60, 4, H, seed=1)
    batch = _batch(problem)
    with pytest.raises(SpecError, match="workers"):
        M.dp_step(table, dense, batch, 11, H, 0.1, 1, 0.1)  # more workers than tasks
    with pytest.raises(SpecError, match="dense"):
        M.dp_step(table, dense[:-1], batch, 2, H, 0.1, 1, 0.1)
    with pytest.raises(SpecError, match="task_ids"):
        M.sample_batch(problem, [problem["n_tasks"]], 4, 4, np.random.default_rng(0))


def test_study_datasets_and_records(tmp_path):
    p = study.problem_parameters(rows_per_table=100, n_tasks=16, heldout_tasks=8, tasks_per_step=8, support=8, query=8)
    eq = study.equivalence_study(p, [2, 3], 3)
    tr = study.training_study(p, 20, 2, [0])
    sc = study.scaling_study("dgx-a100-80gb", [1, 8, 64], 8, [10**4, 10**6, 10**8], [64], 256, 64, 32, 32, 1, 4,
                             [3.125], 64, 10**6, 64)
    for name, ds in (("equivalence.nc", eq), ("training.nc", tr), ("scaling.nc", sc)):
        for v in [*ds.data_vars, *ds.coords]:
            assert "long_name" in ds[v].attrs, v
        tsio.write_dataset(ds, tmp_path / name)
    assert float(eq["max_rel_diff"].max()) <= 1e-12
    assert sorted(sc["bandwidth_GBps"].values.tolist()) == [3.125, 25.0]  # the catalog link is always included
    np.testing.assert_allclose(sc["step_s"], sc["compute_s"] + sc["comm_s"], rtol=1e-12)
    np.testing.assert_allclose(sc["efficiency"].sel(gpus=1, rows_per_table=[10**4, 10**6]), 1.0, rtol=1e-12)
    assert np.isnan(sc["efficiency"].sel(gpus=1, rows_per_table=10**8)).all()  # 2 x 205 GB do not fit one GPU
    assert (sc["crossover_gpus"].sel(rows_per_table=10**8) == 8).all()  # the hybrid fits only from 8 GPUs on
    hy = sc["samples_per_s"].sel(schedule="hybrid")
    np.testing.assert_allclose(sc["speedup"].where(np.isfinite(sc["speedup"]), drop=True),
                               (hy / sc["samples_per_s"].sel(schedule="data-parallel")).where(
                                   np.isfinite(sc["speedup"]), drop=True), rtol=1e-12)
    assert np.isnan(sc["speedup"].sel(rows_per_table=10**8)).all()  # 1e8 rows do not fit replicated
    records = study.compare(tmp_path)
    assert len(records) == 8 and all(r.study == STUDY and not r.same_setting for r in records)
    delivery = records[1]  # the paper's 4x is model delivery in production: not tested, our step ratio not judged
    assert delivery.paper_value == 4.0 and delivery.verdict == "not tested" and "production" in delivery.reason
    # like with like against G-Meta's own throughput and scaling figures (RQ1, RQ3, RQ4): not read, so not tested,
    # each saying what it needs; ours (the project's setting) carried for information only
    rq1_speed, rq1_eff, rq3, rq4 = records[2:6]
    for r, tag in ((rq1_speed, "RQ1"), (rq1_eff, "RQ1"), (rq3, "RQ3"), (rq4, "RQ4")):
        assert tag in r.quantity and r.verdict == "not tested" and np.isnan(r.paper_value)
        assert r.reason.startswith("needs the paper's experiment section") and "stored copies searched" in r.reason
    ref = sc.sel(bandwidth_GBps=25.0, rows_per_table=10**6, embedding_dim=64)
    assert rq1_speed.our_value == pytest.approx(float(ref["speedup"].sel(gpus=64)), rel=1e-12)
    assert rq1_eff.our_value == pytest.approx(float(ref["efficiency"].sel(gpus=64, schedule="hybrid")), rel=1e-12)
    assert np.isnan(rq3.our_value) and np.isnan(rq4.our_value) and "I/O pipeline model" in rq4.reason


def test_docstring_names_what_was_read_and_the_queries():
    """The paper's experiment section could not be read: the module says where it looked and with what."""
    doc = study.__doc__
    for source in ("researchtrend.ai/papers/2401.04338", "liner.com/review/gmeta", "sciencestack.ai/paper/2401.04338",
                   "awsmpapers.org/papers/g-meta", "G-Meta distributed meta learning GPU clusters recommender"):
        assert source in doc, source


def test_committed_records():
    """The committed full-run records: all 8 not tested; the project-setting numbers they carry."""
    from conftest import REPO_ROOT

    recs = study.compare(REPO_ROOT / "figures" / STUDY)
    assert [r.verdict for r in recs] == ["not tested"] * 8
    by = {r.quantity: r for r in recs}
    speed = by["training throughput, G-Meta over DMAML, in the paper's cluster and model (RQ1)"]
    assert speed.our_value == pytest.approx(1.4616, rel=1e-3)  # hybrid over data-parallel, 64 GPUs, 1e6 rows, dim 64
    assert "0.302 to 2.72" in speed.reason  # over rows, dimension and scale-out bandwidth
    eff = by["G-Meta's scaling efficiency over the paper's GPU counts (RQ1)"]
    assert eff.our_value == pytest.approx(0.1096, rel=1e-3) and "0.0395 to 0.138" in eff.reason  # hybrid, 128 GPUs


def test_committed_hybrid_computes_the_data_parallel_update():
    """What was a record (a self-check of the two schedules, not the paper's claim), on the committed full
    dataset: the hybrid's parameters equal the data-parallel ones to 1e-12 relative, at every step and worker count."""
    from conftest import REPO_ROOT

    eq = tsio.read_dataset(REPO_ROOT / "figures" / STUDY / "equivalence.nc")
    assert eq.sizes["step"] > 0 and float(eq["max_rel_diff"].max()) <= 1e-12


@pytest.mark.workflow
def test_quick_workflow_writes_the_outputs(quick_workflow):
    folder = quick_workflow / "figures" / STUDY
    for name in study.OUTPUTS:
        assert (folder / name).stat().st_size > 0, name
    written = comparison.read_records(folder / comparison.RECORDS_FILE)
    assert comparison.diff_records(study.compare(folder), written) == []
