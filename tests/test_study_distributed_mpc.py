"""distributed-mpc (Amo Alonso & Tseng, arXiv 2103.14990): the ADMM against a centralized QP (OSQP), identical
iterates of the three schedules, the kernels against a NumPy reference, the closed loop, bad input, and the
plumbing of the study's records. The comparison with the paper is judged on the committed full datasets by
``trainscale verify``, not here."""

import numpy as np
import pytest
from trainscale.common import comparison
from trainscale.common import io as tsio
from trainscale.workloads import mpc
from trainscale.model.specs import SpecError
from trainscale.studies import distributed_mpc as study

STUDY = "distributed-mpc"
TIGHT = {"eps_p": 1e-9, "eps_d": 1e-9, "max_iter": 200000}


@pytest.fixture(scope="module")
def small():
    return mpc.build_problem(5, 2)


def test_plant_is_the_papers_chain():
    A, B = mpc.chain_plant(3)
    A = A.toarray()
    np.testing.assert_allclose(A[2:4, 2:4], np.eye(2) + 0.1 * np.array([[0, 1], [-3, -3]]))
    np.testing.assert_allclose(A[2:4, 0:2], 0.1 * np.array([[0, 0], [1, 1]]))
    np.testing.assert_allclose(A[0:2, 4:6], 0.0)
    np.testing.assert_allclose(B.toarray(), 0.1 * np.eye(6))


@pytest.mark.parametrize("n, d, seed", [(4, 2, 0), (4, 3, 1), (6, 2, 2)])
def test_admm_equals_the_centralized_localized_qp(n, d, seed):
    problem = mpc.build_problem(n, d)
    x0 = mpc.initial_state(n, seed)
    y, iterations, _ = mpc.solve_step(problem, x0, "serial", **TIGHT)
    assert iterations < TIGHT["max_iter"]
    y_qp = mpc.localized_qp(problem, x0)
    np.testing.assert_allclose(y, y_qp, atol=1e-5 * max(1.0, np.abs(y_qp).max()))


def test_without_locality_the_admm_equals_centralized_mpc():
    n = 4
    problem = mpc.build_problem(n, 2 * n + 2)  # S^(d-1) covers the chain: no locality constraint
    x0 = mpc.initial_state(n, 3)
    y, _, _ = mpc.solve_step(problem, x0, "local", **TIGHT)
    np.testing.assert_allclose(y, mpc.centralized_qp(problem, x0), atol=1e-5)


def test_all_schedules_give_identical_iterates(small):
    x0 = mpc.initial_state(small.n_subsystems, 4)
    runs = {v: mpc.solve_step(small, x0, v, max_iter=37) for v in mpc.VARIANTS}
    for v in mpc.VARIANTS:
        assert runs[v][1] == runs["serial"][1]
        assert np.array_equal(runs[v][0], runs["serial"][0])
    # the same entries, moved between layouts (CSR and CSC)
    serial, local = runs["serial"][2], runs["local"][2]
    mask = np.arange(small.colrows.shape[1]) < small.collen[:, None]
    for name in ("phi", "psi", "lam"):
        a, b = getattr(serial, name), getattr(local, name)
        assert np.array_equal(a[small.colpos_csr[mask]], b[small.colpos_csc[mask]])


def test_kernels_equal_the_numpy_reference(small):
    x0 = mpc.initial_state(small.n_subsystems, 5)
    _, iterations, state = mpc.solve_step(small, x0, "serial", eps_p=1e-300, eps_d=1e-300, max_iter=25)
    ref = mpc.admm_numpy(small, x0, 25)
    assert iterations == 25
    for name in ("phi", "psi", "lam"):
        np.testing.assert_allclose(getattr(state, name), getattr(ref, name), rtol=0, atol=1e-11)


def test_column_update_lands_on_the_dynamics(small):
    """After a column update every column of Psi is a trajectory of the plant from its unit state."""
    x0 = mpc.initial_state(small.n_subsystems, 6)
    _, _, state = mpc.solve_step(small, x0, "serial", max_iter=3)
    from trainscale.workloads.mpc import _dynamics

    Z = _dynamics(small.A, small.B, small.horizon)
    for c in range(small.nx):
        rows = small.colrows[c, :small.collen[c]]
        values = state.psi[small.colpos_csr[c, :small.collen[c]]]
        rhs = np.zeros(Z.shape[0])
        rhs[c] = 1.0
        np.testing.assert_allclose(Z[:, rows] @ values, rhs, atol=1e-9)


def test_column_classes_equal_the_per_column_projection():
    from trainscale.workloads.mpc import _column_projection, _dynamics

    problem = mpc.build_problem(9, 3)
    Z = _dynamics(problem.A, problem.B, problem.horizon)
    for c in range(problem.nx):
        n = problem.collen[c]
        P, b = _column_projection(Z, problem.colrows[c, :n], c)
        np.testing.assert_allclose(problem.P[problem.pidx[c], :n, :n], P, atol=1e-12)
        np.testing.assert_allclose(problem.b[problem.pidx[c], :n], b, atol=1e-12)


def test_work_per_subsystem_is_flat_in_n_and_grows_with_d():
    interior = [mpc.flops_per_iteration(mpc.build_problem(n, 2))[n // 2] for n in (16, 64, 256)]
    assert interior[0] == interior[1] == interior[2]
    by_d = [mpc.flops_per_iteration(mpc.build_problem(64, d))[32] for d in (2, 3, 4)]
    assert by_d[0] < by_d[1] < by_d[2]
    assert mpc.build_problem(64, 3).collen.max() == 4 * 2 * (5 + 4)  # 4 (d - 1) states over x_0..x_4, u_0..u_3


def test_closed_loop_respects_the_bounds_and_converges():
    problem = mpc.build_problem(8, 3)
    x0 = mpc.initial_state(8, 0, 2.0)
    run = mpc.closed_loop(problem, x0, 8, "local")
    assert np.all(run["iterations"] < 10000)
    assert np.abs(run["x"]).max() <= 2.0 + 1e-3  # the bound, up to the ADMM tolerance
    assert np.abs(run["u"]).max() <= 100.0
    assert np.all(np.abs(run["y"][:, problem.nx: problem.nx * 5]) <= 2.0 + 1e-12)  # the row variable holds it
    norms = np.linalg.norm(run["x"], axis=1)
    assert norms[-1] < 0.7 * norms[0]


@pytest.mark.parametrize("call, field", [
    (lambda: mpc.build_problem(1, 2), "n_subsystems"),
    (lambda: mpc.build_problem(8, 1), "locality_d"),
    (lambda: mpc.build_problem(8, 2, rho=0.0), "rho"),
    (lambda: mpc.build_problem(8, 2, horizon=1), "horizon"),
    (lambda: mpc.new_state(mpc.build_problem(4, 2), "gpu"), "variant"),
    (lambda: mpc.solve_step(mpc.build_problem(4, 2), np.zeros(3)), "x0"),
    (lambda: mpc.closed_loop(mpc.build_problem(4, 2), np.full(8, 2.5), 2), "x0"),
    (lambda: study.runtime_study(n_subsystems=[16], localities=[2]), "n_subsystems"),
    (lambda: study.closed_loop_study(8, [2], x0_scale=3.0), "x0_scale"),
    (lambda: study.runtime_study([16, 32], [2], flop_budget=0.0), "flop_budget"),
])
def test_bad_input_gets_one_line_naming_the_field(call, field):
    with pytest.raises(SpecError) as err:
        call()
    assert err.value.field == field and "\n" not in str(err.value)


def test_study_datasets_and_records(tmp_path):
    cl = study.closed_loop_study(6, [2], steps=2)
    rt = study.runtime_study([8, 16], [2, 3], flop_budget=2e5, repeats=3)
    assert np.all(cl["variant_difference"].values == 0.0)
    for ds in (cl, rt):
        for name in list(ds.data_vars) + list(ds.coords):
            assert ds[name].attrs.get("long_name"), name
            if ds[name].dtype.kind in "fiub":
                assert ds[name].attrs.get("units"), name
    assert np.all(np.isfinite(rt["parallel_s_per_iter"].values)) and np.all(rt["serial_s_per_iter"].values > 0)
    tsio.write_dataset(cl, tmp_path / "closed_loop.nc")
    tsio.write_dataset(rt, tmp_path / "runtime.nc")
    records = study.compare(tmp_path)
    assert len(records) == 3 and all(not r.same_setting for r in records)
    for r in records:
        assert r.study == STUDY and r.verdict in comparison.VERDICTS and np.isfinite(r.our_value)
    for r in records[1:]:
        assert r.our_low <= r.our_value <= r.our_high
    assert rt.sizes["repeat"] == 3 and np.all(rt["serial_s_per_iter"] == rt["serial_s_per_iter_samples"].median("repeat"))
    top = rt.sel(threads=rt["threads"].max())
    paired = rt["serial_s_per_iter_samples"] / top["parallel_s_per_iter_samples"].sel(schedule="local")
    expected = float(np.median(paired.values))  # the median over cells and repetitions, not the largest
    naive = (top["parallel_s_per_iter_samples"].sel(schedule="naive")
             / top["parallel_s_per_iter_samples"].sel(schedule="local")).values
    assert records[1].our_value == pytest.approx(np.median(naive), rel=1e-12)
    assert (records[1].our_low, records[1].our_high) == pytest.approx(tuple(np.percentile(naive, [25, 75])), rel=1e-12)
    # the paper's 50x is a GPU over a CPU: not tested here; our CPU speed-up is carried, not judged
    assert records[0].verdict == "not tested" and records[0].reason.startswith("needs a GPU")
    assert records[0].our_value == pytest.approx(expected, rel=1e-12)
    assert comparison.diff_records(records, study.compare(tmp_path)) == []


@pytest.mark.workflow
def test_quick_workflow_writes_the_outputs(quick_workflow):
    folder = quick_workflow / "figures" / STUDY
    for name in study.OUTPUTS:
        assert (folder / name).stat().st_size > 0, name
    written = comparison.read_records(folder / comparison.RECORDS_FILE)
    assert comparison.diff_records(study.compare(folder), written) == []


def test_the_work_record_takes_each_cells_fastest_repetition():
    """A repetition slowed by another process (here 5x) does not move the record: each cell's minimum is used."""
    rt = study.runtime_study([8, 16], [2], flop_budget=2e5, repeats=3)
    samples = np.array([[[1.0, 1.0, 5.0], [2.4, 12.0, 2.2]]]) * 1e-6  # (d, n, repeat) seconds per iteration
    rt["serial_s_per_iter_samples"] = (rt["serial_s_per_iter_samples"].dims, samples,
                                       rt["serial_s_per_iter_samples"].attrs)
    record = study._work_record(rt, "test")
    assert record.our_value == pytest.approx((2.2 / 16) / (1.0 / 8), rel=1e-12)
    assert "fastest of 3 repetitions" in record.reason
