r"""Distributed and localized MPC (DLMPC) by ADMM, as Numba kernels: serial, naive parallel, locality-aware parallel.

Plain arrays in, arrays out; the model layer (the plant, the locality patterns, the layouts) is
:mod:`trainscale.workloads.mpc`. The algorithm is Amo Alonso & Matni's DLMPC as parallelised by Amo Alonso & Tseng
(arXiv 2103.14990; code github camoalon/DLMPC-GPU).

**Problem of one MPC step.** With the current state ``x0`` (``Nx`` states) and horizon ``T``, the system-level
synthesis variable :math:`\Phi` has ``R = Nx T + Nu (T-1)`` rows (states ``x_0..x_{T-1}`` then inputs
``u_0..u_{T-2}``) and ``Nx`` columns; the predicted trajectory is :math:`y = \Phi x_0`. DLMPC solves

.. math:: \min_\Phi \|\Phi x_0\|^2 \ \ \text{s.t.}\ \ Z_{AB}\Phi = E,\ \ l \le \Phi x_0 \le h,\ \ \Phi \in \mathcal L_d,

where :math:`Z_{AB}\Phi = E` says that each column is a trajectory of the plant, and :math:`\mathcal L_d` (the
locality pattern, a fixed sparsity) lets column ``c`` be nonzero only on the rows of its d-neighbourhood.

**ADMM** (rho :math:`\rho`), on the sparse entries only:

* row update, for every row ``r`` with its patch of columns (the cost and the box constraint are row-separable),
  :math:`a = \Psi_r - \Lambda_r`, :math:`\xi = x_0` on the patch, :math:`s = a\cdot\xi`,
  :math:`q = \xi\cdot\xi`, :math:`\delta = \rho + 2q`. The unconstrained minimiser of
  :math:`(\Phi_r \xi)^2 + \frac\rho2\|\Phi_r - a\|^2` is :math:`\Phi_r = a - 2 s\,\xi/\delta`
  (Sherman-Morrison on :math:`(2\xi\xi^T + \rho I)^{-1}`), with :math:`\Phi_r\xi = \rho s/\delta`; if that value
  leaves ``[l_r, h_r]`` the one active constraint moves it back along :math:`\xi`:
  :math:`\Phi_r \mathrel{-}= (\rho s/\delta - h_r)\,\xi / q` (or with ``l_r``). The same closed form as the
  paper's code (its ``pinv(2 xi xi^T + rho I)``), evaluated in O(patch) instead of O(patch^2).
* column update, for every column ``c`` with its patch of rows: :math:`a = \Phi_c + \Lambda_c`,
  :math:`\Psi_c = b_c + a - P_c a`, the projection onto the column's dynamics constraint
  :math:`M_c\Psi_c = e_c` (``P_c = M_c^+ M_c``, ``b_c = M_c^+ e_c``, precomputed once per plant).
* multiplier: :math:`\Lambda \mathrel{+}= \Phi - \Psi`.
* stop when every column has :math:`\|\Phi_c - \Psi_c\| \le \epsilon_p` and
  :math:`\|\Psi_c - \Psi_c^{old}\| \le \epsilon_d`.

**Three schedules of the same arithmetic.** Every variant calls the same row and column helpers, which read and
write the entries through a table of positions, in the same order; the variants differ only in where the
entries lie in memory and how the work is spread over threads, so their iterates are bitwise identical.

* :func:`admm_serial`: one thread, rows then columns (the paper's CPU code), global row-major (CSR) storage.
* :func:`admm_naive`: ``prange`` over all rows of the global matrix, then over all columns, then over all
  entries (multiplier), then over all columns (residuals), each a separate parallel region (the paper's naive
  GPU: one kernel per ADMM step), global CSR storage: a thread's rows span every subsystem, and a column's
  entries lie ``~Nx`` rows apart.
* :func:`admm_local`: ``prange`` over subsystems; subsystem ``i`` updates its own rows, then (after the one
  barrier the ADMM needs) its own columns with the multiplier and residuals fused; entries stored by column
  (CSC) and rows numbered subsystem by subsystem, so each subsystem's rows and columns lie together and a row
  update reads only its neighbours' blocks.

No float reduction crosses ``prange`` iterations: residuals are stored per column and tested serially.
"""

import numba
from numba import njit, prange


@njit(cache=True)
def prepare_rows(r0, r1, x0, rowcols, rowlen, rho, xx, den):
    """Per-step constants of rows ``r0..r1-1``: :math:`q_r = \\sum_k x_0[c_k]^2`, :math:`\\delta_r = \\rho + 2 q_r`."""
    for r in range(r0, r1):
        q = 0.0
        for k in range(rowlen[r]):
            v = x0[rowcols[r, k]]
            q += v * v
        xx[r] = q
        den[r] = rho + 2.0 * q


@njit(cache=True)
def update_rows(r0, r1, rowpos, rowcols, rowlen, x0, psi, lam, phi, rho, xx, den, lo, hi):
    """The row update (closed form of the module docstring) of rows ``r0..r1-1``, writing ``phi``."""
    for r in range(r0, r1):
        n = rowlen[r]
        s = 0.0
        for k in range(n):
            p = rowpos[r, k]
            s += (psi[p] - lam[p]) * x0[rowcols[r, k]]
        g = 2.0 * s / den[r]
        value = rho * s / den[r]
        shift = 0.0
        if xx[r] > 0.0:
            if value > hi[r]:
                shift = (value - hi[r]) / xx[r]
            elif value < lo[r]:
                shift = (value - lo[r]) / xx[r]
        for k in range(n):
            p = rowpos[r, k]
            v = x0[rowcols[r, k]]
            phi[p] = (psi[p] - lam[p]) - g * v - shift * v


@njit(cache=True)
def project_columns(c0, c1, colpos, collen, pidx, P, b, phi, lam, psi, a, fused, rp, rd):
    """Columns ``c0..c1-1``: :math:`a = \\Phi_c + \\Lambda_c`, :math:`\\Psi_c = (b + a) - P a`; with ``fused``
    also the multiplier :math:`\\Lambda_c \\mathrel{+}= \\Phi_c - \\Psi_c` and both squared residuals in the
    same pass (else only the projection: the naive schedule's column kernel)."""
    for c in range(c0, c1):
        n, m = collen[c], pidx[c]
        for k in range(n):
            p = colpos[c, k]
            a[k] = phi[p] + lam[p]
        primal = 0.0
        dual = 0.0
        for k in range(n):
            acc = 0.0
            for l in range(n):
                acc += P[m, k, l] * a[l]
            new = (b[m, k] + a[k]) - acc
            p = colpos[c, k]
            if fused:
                step = new - psi[p]
                dual += step * step
                diff = phi[p] - new
                lam[p] += diff
                primal += diff * diff
            psi[p] = new
        if fused:
            rp[c] = primal
            rd[c] = dual


@njit(cache=True)
def column_residuals(c0, c1, colpos, collen, phi, psi, psi_old, rp, rd):
    """Squared primal and dual residuals of columns ``c0..c1-1`` (the naive schedule's convergence kernel)."""
    for c in range(c0, c1):
        primal = 0.0
        dual = 0.0
        for k in range(collen[c]):
            p = colpos[c, k]
            step = psi[p] - psi_old[p]
            dual += step * step
            diff = phi[p] - psi[p]
            primal += diff * diff
        rp[c] = primal
        rd[c] = dual


@njit(cache=True)
def converged(rp, rd, eps_p, eps_d):
    """Every column within both tolerances (a serial test over the stored residuals)."""
    ep, ed = eps_p * eps_p, eps_d * eps_d
    for c in range(rp.size):
        if rp[c] > ep or rd[c] > ed:
            return False
    return True


@njit(cache=True)
def admm_serial(x0, rho, eps_p, eps_d, max_iter, rowpos, rowcols, rowlen, lo, hi, colpos, collen, pidx, P, b,
                phi, psi, lam, xx, den, rp, rd, scratch):
    """One MPC step's ADMM on one thread; returns the iterations run (``max_iter`` if not converged)."""
    R, C = rowlen.size, collen.size
    prepare_rows(0, R, x0, rowcols, rowlen, rho, xx, den)
    for it in range(max_iter):
        update_rows(0, R, rowpos, rowcols, rowlen, x0, psi, lam, phi, rho, xx, den, lo, hi)
        project_columns(0, C, colpos, collen, pidx, P, b, phi, lam, psi, scratch[0], True, rp, rd)
        if converged(rp, rd, eps_p, eps_d):
            return it + 1
    return max_iter


@njit(cache=True, parallel=True)
def admm_naive(x0, rho, eps_p, eps_d, max_iter, rowpos, rowcols, rowlen, lo, hi, colpos, collen, pidx, P, b,
               phi, psi, lam, xx, den, rp, rd, scratch, psi_old):
    """The naive parallel schedule: one parallel region per ADMM step over the global rows, columns and entries."""
    R, C, E = rowlen.size, collen.size, psi.size
    for r in prange(R):
        prepare_rows(r, r + 1, x0, rowcols, rowlen, rho, xx, den)
    for it in range(max_iter):
        for e in prange(E):
            psi_old[e] = psi[e]
        for r in prange(R):
            update_rows(r, r + 1, rowpos, rowcols, rowlen, x0, psi, lam, phi, rho, xx, den, lo, hi)
        for c in prange(C):
            project_columns(c, c + 1, colpos, collen, pidx, P, b, phi, lam, psi, scratch[numba.get_thread_id()],
                            False, rp, rd)
        for e in prange(E):
            lam[e] += phi[e] - psi[e]
        for c in prange(C):
            column_residuals(c, c + 1, colpos, collen, phi, psi, psi_old, rp, rd)
        if converged(rp, rd, eps_p, eps_d):
            return it + 1
    return max_iter


@njit(cache=True, parallel=True)
def admm_local(x0, rho, eps_p, eps_d, max_iter, rowpos, rowcols, rowlen, lo, hi, colpos, collen, pidx, P, b,
               phi, psi, lam, xx, den, rp, rd, scratch, rows_each, cols_each):
    """The locality-aware schedule: rows numbered subsystem by subsystem (``rows_each`` per subsystem), so
    subsystem ``i`` updates rows ``i*rows_each..`` and then, fused, its columns ``i*cols_each..``."""
    S = collen.size // cols_each
    for i in prange(S):
        prepare_rows(i * rows_each, (i + 1) * rows_each, x0, rowcols, rowlen, rho, xx, den)
    for it in range(max_iter):
        for i in prange(S):
            update_rows(i * rows_each, (i + 1) * rows_each, rowpos, rowcols, rowlen, x0, psi, lam, phi, rho, xx, den,
                        lo, hi)
        for i in prange(S):
            project_columns(i * cols_each, (i + 1) * cols_each, colpos, collen, pidx, P, b, phi, lam, psi,
                            scratch[numba.get_thread_id()], True, rp, rd)
        if converged(rp, rd, eps_p, eps_d):
            return it + 1
    return max_iter


@njit(cache=True)
def row_values(rowpos, rowcols, rowlen, phi, x0, y):
    """The predicted trajectory :math:`y = \\Phi x_0`, row by row."""
    for r in range(rowlen.size):
        s = 0.0
        for k in range(rowlen[r]):
            s += phi[rowpos[r, k]] * x0[rowcols[r, k]]
        y[r] = s
