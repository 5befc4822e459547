r"""Distributed and localized MPC of a chain of subsystems (Amo Alonso & Tseng, arXiv 2103.14990).

**Plant** (the paper's code, github camoalon/DLMPC-GPU, ``user_defined_scenario.py``): ``n`` subsystems in a
chain, each with two states (position, velocity) and two inputs. In continuous time subsystem ``i`` has
:math:`A_{ii} = [[0, 1], [-3, -3]]`, coupling :math:`A_{i,i\pm1} = [[0, 0], [1, 1]]` and :math:`B = I`;
discretised by Euler with step ``dt = 0.1``: :math:`A = I + dt\,A_c`, :math:`B = dt\,I`. States are bounded to
``[-x_max, x_max]`` (2), inputs to ``[-u_max, u_max]`` (100); horizon ``T = 5``; cost :math:`\|x\|^2 + \|u\|^2`
over the horizon (Q = R = I).

**Locality** ``d`` (the code's ``getLocalityRegion``): with ``S`` the support of ``A`` (state ``s`` depends on
state ``c``), the response of state ``c`` may reach state ``s`` iff :math:`(S^{d-1})_{sc} \ne 0`, and input ``s``
iff :math:`(B^T S^{d-1})_{sc} \ne 0`. ``d = 1`` leaves each subsystem alone and cannot cancel the coupling
(infeasible); ``d >= 2``. The patterns fix which entries of :math:`\Phi` exist; a column's patch has
``4 (d - 1)`` states of the chain's interior (and the same inputs), independent of ``n``.

**Layouts.** The entries are stored once in row-major order of the global matrix (CSR: serial and naive
schedules) and once in column-major order (CSC: the locality-aware schedule, each subsystem's two columns
together). Tables of positions (``rowpos``, ``colpos``; padded with 0 beyond ``rowlen``/``collen``) let the
same kernels read either layout. The column projections ``P_c = M_c^+ M_c``, ``b_c = M_c^+ e_c`` depend on the
plant only (not on the state): computed once, shared by columns whose neighbourhoods look alike (the chain is
translation invariant away from its ends). The ADMM itself is in :mod:`trainscale.kernels.mpc`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp

from ..common.checks import check_choice, check_float, check_int
from ..kernels import mpc as K
from ..model.specs import SpecError

__all__ = ["VARIANTS", "PAPER_PLANT", "PAPER_ADMM", "Problem", "AdmmState", "chain_plant", "build_problem",
           "new_state", "solve_step", "closed_loop", "time_step", "time_once", "initial_state", "flops_per_iteration",
           "admm_numpy", "localized_qp", "centralized_qp", "trajectory"]

#: the schedules of :mod:`trainscale.kernels.mpc`
VARIANTS = ("serial", "naive", "local")
#: the paper's plant (its code's scenario)
PAPER_PLANT = {"A_own": [[0.0, 1.0], [-3.0, -3.0]], "A_coupling": [[0.0, 0.0], [1.0, 1.0]], "dt": 0.1,
               "x_max": 2.0, "u_max": 100.0, "horizon": 5}
#: the paper's ADMM settings (rho, tolerances, iteration cap)
PAPER_ADMM = {"rho": 10.0, "eps_p": 1e-4, "eps_d": 1e-3, "max_iter": 10000}
STATES = 2  # per subsystem (position, velocity); inputs: as many


def chain_plant(n_subsystems: int, dt: float = 0.1) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """(A, B): the paper's chain discretised by Euler, :math:`A = I + dt A_c`, :math:`B = dt I`."""
    n = check_int("n_subsystems", n_subsystems, 2, 10**6)
    dt = check_float("dt", dt, 0.0, 1.0, open_min=True)
    own = np.asarray(PAPER_PLANT["A_own"])
    coupling = np.asarray(PAPER_PLANT["A_coupling"])
    chain = sp.diags([np.ones(n - 1), np.ones(n - 1)], [-1, 1], shape=(n, n))
    Ac = sp.kron(sp.identity(n), own) + sp.kron(chain, coupling)
    nx = STATES * n
    A = (sp.identity(nx) + dt * Ac).tocsr()
    A.eliminate_zeros()
    return A, (dt * sp.identity(nx)).tocsr()


@dataclass(frozen=True)
class Problem:
    """One chain, locality and horizon: the plant, the sparsity of :math:`\\Phi`, both layouts, the column
    projections and the per-row bounds (see the module docstring)."""

    n_subsystems: int
    locality_d: int
    horizon: int
    rho: float
    x_max: float
    u_max: float
    A: sp.csr_matrix
    B: sp.csr_matrix
    rowlen: np.ndarray
    rowcols: np.ndarray
    rowpos_csr: np.ndarray
    rowpos_csc: np.ndarray
    collen: np.ndarray
    colrows: np.ndarray
    colpos_csr: np.ndarray
    colpos_csc: np.ndarray
    pidx: np.ndarray
    P: np.ndarray
    b: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    row_perm: np.ndarray

    def tables(self, variant: str) -> tuple:
        """(rowpos, rowcols, rowlen, lo, hi, colpos) of the storage a schedule uses: CSR and the global row
        order for ``serial`` and ``naive``; CSC and rows numbered subsystem by subsystem (``row_perm``) for
        ``local``."""
        if variant == "local":
            q = self.row_perm
            return (self.rowpos_csc[q], self.rowcols[q], self.rowlen[q], self.lo[q], self.hi[q], self.colpos_csc)
        return self.rowpos_csr, self.rowcols, self.rowlen, self.lo, self.hi, self.colpos_csr

    @property
    def nx(self) -> int:
        return STATES * self.n_subsystems

    @property
    def n_rows(self) -> int:
        return self.rowlen.size

    @property
    def nnz(self) -> int:
        return int(self.rowlen.sum())


def _locality(A, B, d: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Boolean supports of the state and input responses: :math:`S^{d-1}` and :math:`B^T S^{d-1}`."""
    S = (A != 0).astype(np.int64)
    aux = sp.identity(A.shape[0], dtype=np.int64, format="csr")
    for _ in range(d - 1):
        aux = ((S @ aux) != 0).astype(np.int64)
    aux_u = (((B.T != 0).astype(np.int64) @ aux) != 0).astype(np.int64)
    return aux.tocsr(), aux_u.tocsr()


def _pattern(A, B, d: int, T: int) -> sp.csr_matrix:
    """The sparsity of :math:`\\Phi` (rows: ``x_0..x_{T-1}`` then ``u_0..u_{T-2}``; columns: states)."""
    nx, nu = A.shape[0], B.shape[1]
    sx, su = (m.tocoo() for m in _locality(A, B, d))
    rows = [sx.row + t * nx for t in range(T)] + [su.row + nx * T + t * nu for t in range(T - 1)]
    cols = [sx.col] * T + [su.col] * (T - 1)
    r, c = np.concatenate(rows), np.concatenate(cols)
    pattern = sp.csr_matrix((np.ones(r.size), (r, c)), shape=(nx * T + nu * (T - 1), nx))
    pattern.sum_duplicates()
    pattern.sort_indices()
    return pattern


def _dynamics(A, B, T: int) -> sp.csc_matrix:
    """:math:`Z_{AB}`: block row ``t`` says ``x_t - A x_{t-1} - B u_{t-1} = 0`` (``x_0`` = its column's unit
    vector, the right-hand side ``E``)."""
    nx, nu = A.shape[0], B.shape[1]
    blocks = [[None] * (2 * T - 1) for _ in range(T)]
    for t in range(T):
        blocks[t][t] = sp.identity(nx)
        if t > 0:
            blocks[t][t - 1] = -A
            blocks[t][T + t - 1] = -B
    blocks[0][T] = sp.csr_matrix((nx, nu))
    return sp.bmat(blocks, format="csc")


def _padded(lengths: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A (len(lengths), max length) table of ``values`` split by ``lengths`` (0 beyond each length)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    owner = np.repeat(np.arange(lengths.size), lengths)
    table = np.zeros((lengths.size, max(int(lengths.max()), 1)), dtype=np.int64)
    table[owner, np.arange(values.size) - starts[owner]] = values
    return table


def _column_class(c: int, n: int, d: int) -> tuple[int, int, int]:
    """Columns of one class have the same local constraint (chain translation invariance)."""
    j = c // STATES
    return c % STATES, min(j, d + 1), min(n - 1 - j, d + 1)


def _column_projection(Z, rows: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """(P, b) of one column: :math:`M^+ M` and :math:`M^+ e` on the constraint rows its patch touches."""
    M = Z[:, rows]
    touched = np.unique(M.indices)
    dense = M[touched].toarray()
    e = (touched == c).astype(float)
    if e.sum() != 1.0:
        raise ValueError(f"column {c}: its x_0 row is outside its patch")
    pinv = np.linalg.pinv(dense)
    return pinv @ dense, pinv @ e


def build_problem(n_subsystems: int, locality_d: int = 2, horizon: int = 5, rho: float = 10.0,
                  x_max: float = 2.0, u_max: float = 100.0, dt: float = 0.1) -> Problem:
    """The chain of ``n_subsystems`` with locality ``d``: patterns, layouts and column projections."""
    n = check_int("n_subsystems", n_subsystems, 2, 10**6)
    d = check_int("locality_d", locality_d, 2, 10**4)
    T = check_int("horizon", horizon, 2, 1000)
    rho = check_float("rho", rho, 0.0, 1e8, open_min=True)
    x_max = check_float("x_max", x_max, 0.0, 1e12, open_min=True)
    u_max = check_float("u_max", u_max, 0.0, 1e12, open_min=True)
    A, B = chain_plant(n, dt)
    pattern = _pattern(A, B, d, T)
    nnz = pattern.nnz
    ids = sp.csr_matrix((np.arange(1, nnz + 1, dtype=np.float64), pattern.indices, pattern.indptr),
                        shape=pattern.shape)
    csc = ids.tocsc()
    csc.sort_indices()
    csr_of_csc = csc.data.astype(np.int64) - 1  # CSR position of each CSC entry
    csc_of_csr = np.empty(nnz, dtype=np.int64)
    csc_of_csr[csr_of_csc] = np.arange(nnz)
    rowlen = np.diff(pattern.indptr).astype(np.int64)
    collen = np.diff(csc.indptr).astype(np.int64)
    colrows = _padded(collen, csc.indices.astype(np.int64))
    Z = _dynamics(A, B, T)
    classes: dict = {}
    pidx = np.empty(collen.size, dtype=np.int64)
    for c in range(collen.size):
        key = _column_class(c, n, d)
        if key not in classes:
            classes[key] = (len(classes), _column_projection(Z, colrows[c, :collen[c]], c))
        pidx[c] = classes[key][0]
    width = colrows.shape[1]
    P = np.zeros((len(classes), width, width))
    b = np.zeros((len(classes), width))
    for m, (Pm, bm) in classes.values():
        P[m, :Pm.shape[0], :Pm.shape[1]] = Pm
        b[m, :bm.size] = bm
    nx, R = A.shape[0], pattern.shape[0]
    is_state = np.arange(R) < nx * T
    lo = np.where(is_state, -x_max, -u_max)
    hi = np.where(is_state, x_max, u_max)
    lo[:nx], hi[:nx] = -np.inf, np.inf  # x_0 is the measured state, not a decision: not bounded
    row_perm = _ownership(n, T)
    return Problem(n, d, T, rho, x_max, u_max, A, B, rowlen, _padded(rowlen, pattern.indices.astype(np.int64)),
                   _padded(rowlen, np.arange(nnz, dtype=np.int64)), _padded(rowlen, csc_of_csr), collen, colrows,
                   _padded(collen, csr_of_csc), _padded(collen, np.arange(nnz, dtype=np.int64)), pidx, P, b,
                   lo, hi, row_perm)


def _ownership(n: int, T: int) -> np.ndarray:
    """The global rows in subsystem order: subsystem ``i``'s states at every step, then its inputs."""
    nx = STATES * n
    first = np.arange(n)[:, None] * STATES + np.arange(STATES)
    blocks = [first + t * nx for t in range(T)] + [first + nx * T + t * nx for t in range(T - 1)]
    return np.concatenate(blocks, axis=1).ravel().astype(np.int64)


@dataclass
class AdmmState:
    """ADMM variables of one layout (kept between MPC steps: the next step starts warm)."""

    variant: str
    phi: np.ndarray
    psi: np.ndarray
    lam: np.ndarray


def new_state(problem: Problem, variant: str) -> AdmmState:
    """All-zero ADMM variables for ``variant``'s layout."""
    check_choice("variant", variant, VARIANTS)
    z = problem.nnz
    return AdmmState(variant, np.zeros(z), np.zeros(z), np.zeros(z))


def _run(problem: Problem, x0: np.ndarray, state: AdmmState, eps_p: float, eps_d: float, max_iter: int) -> int:
    rowpos, rowcols, rowlen, lo, hi, colpos = problem.tables(state.variant)
    R, C = problem.n_rows, problem.collen.size
    scratch = np.empty((numba.config.NUMBA_NUM_THREADS, problem.colrows.shape[1]))
    args = (x0, problem.rho, eps_p, eps_d, max_iter, rowpos, rowcols, rowlen, lo, hi, colpos, problem.collen,
            problem.pidx, problem.P, problem.b, state.phi, state.psi, state.lam, np.empty(R), np.empty(R),
            np.empty(C), np.empty(C), scratch)
    if state.variant == "serial":
        return K.admm_serial(*args)
    if state.variant == "naive":
        return K.admm_naive(*args, np.empty(problem.nnz))
    return K.admm_local(*args, R // problem.n_subsystems, STATES)


def _state_vector(problem: Problem, x0) -> np.ndarray:
    x = np.asarray(x0, dtype=np.float64)
    if x.shape != (problem.nx,) or not np.all(np.isfinite(x)):
        raise SpecError("x0", x0, f"expected {problem.nx} finite numbers (two states per subsystem)")
    return x


def trajectory(problem: Problem, state: AdmmState, x0) -> np.ndarray:
    """The predicted trajectory :math:`y = \\Phi x_0` (rows: ``x_0..x_{T-1}``, then ``u_0..u_{T-2}``)."""
    rowpos, rowcols, rowlen, _, _, _ = problem.tables(state.variant)
    values = np.empty(problem.n_rows)
    K.row_values(rowpos, rowcols, rowlen, state.phi, np.asarray(x0, dtype=np.float64), values)
    if state.variant != "local":
        return values
    y = np.empty(problem.n_rows)
    y[problem.row_perm] = values
    return y


def solve_step(problem: Problem, x0, variant: str = "local", state: AdmmState | None = None,
               eps_p: float = 1e-4, eps_d: float = 1e-3, max_iter: int = 10000) -> tuple[np.ndarray, int, AdmmState]:
    """One MPC step from state ``x0``: (predicted trajectory, ADMM iterations, the ADMM variables).
    ``state`` (from the previous step) warm-starts the ADMM; None starts from zeros."""
    x = _state_vector(problem, x0)
    eps_p = check_float("eps_p", eps_p, 0.0, 1e3, open_min=True)
    eps_d = check_float("eps_d", eps_d, 0.0, 1e3, open_min=True)
    max_iter = check_int("max_iter", max_iter, 1, 10**7)
    state = new_state(problem, variant) if state is None else state
    iterations = _run(problem, x, state, eps_p, eps_d, max_iter)
    return trajectory(problem, state, x), iterations, state


def initial_state(n_subsystems: int, seed: int, scale: float = 2.0) -> np.ndarray:
    """A seeded initial state, uniform in ``[-scale, scale]`` for every state."""
    n = check_int("n_subsystems", n_subsystems, 2, 10**6)
    scale = check_float("x0_scale", scale, 0.0, 1e12)
    return np.random.default_rng(check_int("seed", seed, 0, 2**63 - 1)).uniform(-scale, scale, STATES * n)


def closed_loop(problem: Problem, x0, steps: int, variant: str = "local", eps_p: float = 1e-4, eps_d: float = 1e-3,
                max_iter: int = 10000) -> dict[str, np.ndarray]:
    """Receding horizon: each step solves the MPC problem (warm-started), applies ``u_0`` and moves the plant
    :math:`x^+ = A x + B u_0`. Returns states (steps+1, Nx), inputs (steps, Nu), predicted trajectories
    (steps, R) and ADMM iterations (steps,)."""
    steps = check_int("steps", steps, 1, 10**6)
    x = _state_vector(problem, x0)
    if np.any(np.abs(x) > problem.x_max):
        raise SpecError("x0", float(np.abs(x).max()), f"expected states within [-{problem.x_max:g}, {problem.x_max:g}]")
    nx, T = problem.nx, problem.horizon
    xs, us, ys, its = [x], [], [], []
    state = None
    for _ in range(steps):
        y, iterations, state = solve_step(problem, x, variant, state, eps_p, eps_d, max_iter)
        u = y[nx * T: nx * T + nx]
        x = problem.A @ x + problem.B @ u
        xs.append(x)
        us.append(u)
        ys.append(y)
        its.append(iterations)
    return {"x": np.array(xs), "u": np.array(us), "y": np.array(ys), "iterations": np.array(its, dtype=np.int64)}


def time_step(problem: Problem, x0, variant: str, threads: int = 1, repeats: int = 3,
              eps_p: float = 1e-4, eps_d: float = 1e-3, max_iter: int = 10000) -> tuple[float, int, np.ndarray]:
    """Wall time of one MPC step from a cold start (row constants and ADMM to convergence, the best of
    ``repeats``) on ``threads`` Numba threads: (seconds, iterations, predicted trajectory)."""
    repeats = check_int("repeats", repeats, 1, 1000)
    seconds, iterations, y = 0.0, 0, None
    for r in range(repeats):
        s, iterations, y = time_once(problem, x0, variant, threads, eps_p, eps_d, max_iter)
        seconds = s if r == 0 else min(seconds, s)
    return seconds, iterations, y


def time_once(problem: Problem, x0, variant: str, threads: int = 1, eps_p: float = 1e-4, eps_d: float = 1e-3,
              max_iter: int = 10000) -> tuple[float, int, np.ndarray]:
    """One timing of an MPC step from a cold start on ``threads`` Numba threads: (seconds, iterations, predicted
    trajectory). Callers interleave repetitions of the schedules they compare, so that a slower stretch of a
    shared machine falls on all of them."""
    x = _state_vector(problem, x0)
    threads = check_int("threads", threads, 1, numba.config.NUMBA_NUM_THREADS)
    previous = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        state = new_state(problem, variant)
        t0 = time.perf_counter()
        iterations = _run(problem, x, state, eps_p, eps_d, max_iter)
        seconds = time.perf_counter() - t0
    finally:
        numba.set_num_threads(previous)
    return seconds, iterations, trajectory(problem, state, x)


def flops_per_iteration(problem: Problem) -> np.ndarray:
    """Floating-point operations of one ADMM iteration, per subsystem (its rows and its columns):
    row ``r`` of patch ``n``: 7 n; column of patch ``m``: 2 m^2 + 9 m (projection, multiplier, residuals)."""
    rows = 7.0 * problem.rowlen[problem.row_perm].reshape(problem.n_subsystems, -1).sum(axis=1)
    m = problem.collen.reshape(problem.n_subsystems, STATES).astype(float)
    return rows + (2.0 * m * m + 9.0 * m).sum(axis=1)


# --------------------------------------------------------------------------- references (tests, benchmark)

def admm_numpy(problem: Problem, x0, iterations: int, state: AdmmState | None = None) -> AdmmState:
    """``iterations`` ADMM iterations in vectorised NumPy on the CSR layout (no stopping test): the reference
    the kernels are checked against (equal up to the order of floating-point sums)."""
    x = _state_vector(problem, x0)
    s = new_state(problem, "serial") if state is None else state
    rowmask = np.arange(problem.rowcols.shape[1]) < problem.rowlen[:, None]
    colmask = np.arange(problem.colrows.shape[1]) < problem.collen[:, None]
    xr = np.where(rowmask, x[problem.rowcols], 0.0)
    xx = (xr * xr).sum(axis=1)
    den = problem.rho + 2.0 * xx
    rp, cp = problem.rowpos_csr, problem.colpos_csr
    Pc, bc = problem.P[problem.pidx], problem.b[problem.pidx]
    for _ in range(iterations):
        a = np.where(rowmask, s.psi[rp] - s.lam[rp], 0.0)
        dot = (a * xr).sum(axis=1)
        value = problem.rho * dot / den
        safe = np.where(xx > 0, xx, 1.0)
        shift = np.where(xx > 0, np.where(value > problem.hi, (value - problem.hi) / safe,
                                          np.where(value < problem.lo, (value - problem.lo) / safe, 0.0)), 0.0)
        s.phi[rp[rowmask]] = (a - (2.0 * dot / den)[:, None] * xr - shift[:, None] * xr)[rowmask]
        a = np.where(colmask, s.phi[cp] + s.lam[cp], 0.0)
        new = bc + a - np.einsum("ckl,cl->ck", Pc, a)
        s.psi[cp[colmask]] = new[colmask]
        s.lam += s.phi - s.psi
    return s


def _qp_solve(P, q, A, l, u):
    import osqp

    solver = osqp.OSQP()
    solver.setup(sp.csc_matrix(P), q, sp.csc_matrix(A), l, u, verbose=False, eps_abs=1e-9, eps_rel=1e-9,
                 max_iter=200000, polishing=True)
    result = solver.solve(raise_error=False)
    if result.info.status_val not in (1, 2):  # solved, solved inaccurate (the tests compare to 1e-5)
        raise RuntimeError(f"OSQP: {result.info.status}")
    return result.x


def localized_qp(problem: Problem, x0) -> np.ndarray:
    """The same problem as the ADMM (:math:`\\Phi` on the locality pattern) solved centrally by OSQP: the
    predicted trajectory :math:`\\Phi x_0`."""
    x = _state_vector(problem, x0)
    nnz = problem.nnz
    owner = np.repeat(np.arange(problem.n_rows), problem.rowlen)
    G = sp.csr_matrix((x[_csr_columns(problem)], (owner, np.arange(nnz))), shape=(problem.n_rows, nnz))
    Z = _dynamics(problem.A, problem.B, problem.horizon)
    blocks, rhs = [], []
    for c in range(problem.nx):
        entries = problem.colpos_csr[c, :problem.collen[c]]  # the CSR positions (the QP's variables) of column c
        M = Z[:, problem.colrows[c, :problem.collen[c]]].tocsr()
        blocks.append(sp.csr_matrix((M.data, entries[M.indices], M.indptr), shape=(M.shape[0], nnz)))
        rhs.append((np.arange(M.shape[0]) == c).astype(float))
    Aeq = sp.vstack(blocks)
    beq = np.concatenate(rhs)
    A = sp.vstack([Aeq, G])
    l = np.concatenate([beq, problem.lo])
    u = np.concatenate([beq, problem.hi])
    z = _qp_solve(2.0 * (G.T @ G), np.zeros(nnz), A, l, u)
    return G @ z


def _csr_columns(problem: Problem) -> np.ndarray:
    mask = np.arange(problem.rowcols.shape[1]) < problem.rowlen[:, None]
    return problem.rowcols[mask]


def centralized_qp(problem: Problem, x0) -> np.ndarray:
    """Centralised MPC without locality (states and inputs as variables) by OSQP: the predicted trajectory
    in the rows' order (``x_0..x_{T-1}``, ``u_0..u_{T-2}``)."""
    x = _state_vector(problem, x0)
    Z = _dynamics(problem.A, problem.B, problem.horizon)
    R = problem.n_rows
    rhs = np.zeros(Z.shape[0])
    rhs[: problem.nx] = x
    A = sp.vstack([Z, sp.identity(R)])
    l = np.concatenate([rhs, problem.lo])
    u = np.concatenate([rhs, problem.hi])
    return _qp_solve(2.0 * sp.identity(R), np.zeros(R), A, l, u)
