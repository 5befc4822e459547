r"""Meta-learning of a DLRM-style recommender in two distributed schedules (G-Meta, Xiao et al., CIKM 2023,
arXiv 2401.04338): a real small run in Numba (:mod:`trainscale.kernels.metarec`) and the price of each schedule
at scale from the project's performance model.

**Generated data** (:func:`make_problem`, :func:`sample_batch`). ``F`` fields of ``R`` rows each. A hidden
teacher has its own tables (``N(0, 1/E)`` rows of ``E`` values) and a shared scoring vector ``a`` of ``F E``
values; each of ``n_tasks`` tasks (a cold-start cohort: a user group or ad scenario) draws ``items_per_task``
rows per field (its items) and its own shift ``b_t = task_scale * N(0, 1/F)``. An example of task ``t`` picks
one of the task's rows in every field uniformly; its label is ``y ~ Bernoulli(sigmoid(gain (a + b_t) . x*))``
with ``x*`` the teacher's concatenated rows. A batch holds ``support`` and ``query`` examples per task (the
two task-specific sets of meta-learning), drawn independently.

**Two schedules of the same first-order MAML step** (:func:`dp_step`, :func:`hybrid_step`). Tasks are split
over ``P`` workers in contiguous blocks.

* Data-parallel with replicated embeddings (DMAML-style): every worker holds all tables and the dense
  layers; after its tasks it holds a full-size gradient of the tables and of the dense layers, and the
  workers' gradients are summed (an all-reduce) before every replica applies the same update.
* G-Meta's hybrid: the tables are sharded by rows (global row ``g`` lives on worker ``g mod P``); a worker
  fetches the rows its tasks' support sets read from their owners (all-to-all 1), then the rows only its
  query sets read (all-to-all 2), runs the inner loop on its local copies, and sends the query gradients
  of the rows back to their owners (all-to-all 3), who add them in worker order and update their shard;
  the dense layers are replicated and their gradients all-reduced.

Both run the same task kernel on the same local rows, so they compute the same update; the test is that
the parameters agree to 1e-12 after every step. The hybrid step also counts the rows each pair of workers
exchanges.

**Price at scale** (:func:`step_time`). Per GPU and outer step (``T`` tasks of ``S`` support and ``Q`` query
examples, ``k`` inner steps): the dense GEMMs as batched GEMMs (one per task) and the embedding gathers,
scatters and updates as memory-bound kernels, by the performance model's compute formulas
(:mod:`trainscale.kernels.compute`, the generation's calibration); the collectives by
:func:`trainscale.model.perfmodel.collective_time_s` (all-to-all and all-reduce over NVLink inside a node and the
scale-out network between, the catalog system with its scale-out bandwidth overridden). The rows a GPU reads
are the expected distinct rows of uniform draws, :math:`R(1 - (1 - 1/R)^n)` per table for ``n`` lookups.
The data-parallel baseline takes the cheaper of an all-reduce of the whole tables' gradient and an
all-gather of each GPU's touched rows (index + values); it needs the whole tables (and as much again for
their gradient or optimizer state) in every GPU's memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..model import perfmodel
from ..common.checks import check_float, check_int
from ..kernels import compute as KC
from ..kernels import metarec as K
from ..model.specs import SpecError, resolve_system

__all__ = ["SCHEDULES", "make_problem", "sample_batch", "init_params", "dense_size", "dp_step", "hybrid_step",
           "shard_table", "unshard", "outer_step_numpy", "loss_and_gradient", "evaluate_adapted", "train",
           "expected_unique_rows", "step_time", "split_bounds"]

SCHEDULES = ("data-parallel", "hybrid")
ID_BYTES = 8  # one int64 row index travels with every row exchanged


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(check_int("seed", seed, 0, 2**63 - 1))


def dense_size(fields: int, embedding_dim: int, hidden: int) -> int:
    """Number of dense parameters: ``W1`` (hidden x fields*dim), ``c1``, ``w2`` (hidden each) and ``c2``."""
    return hidden * fields * embedding_dim + 2 * hidden + 1


def make_problem(fields: int = 4, rows_per_table: int = 500, embedding_dim: int = 8, n_tasks: int = 64,
                 items_per_task: int = 20, task_scale: float = 1.5, gain: float = 3.0, seed: int = 0) -> dict:
    """The generated meta-learning problem (module docstring): teacher tables, scoring vector, and per task
    its rows (``task_rows``: n_tasks x fields x items_per_task global row ids) and shift."""
    F = check_int("fields", fields, 1, 1024)
    R = check_int("rows_per_table", rows_per_table, 1, 10**7)
    E = check_int("embedding_dim", embedding_dim, 1, 1024)
    n = check_int("n_tasks", n_tasks, 1, 10**6)
    m = check_int("items_per_task", items_per_task, 1, R)
    rng = _rng(seed)
    teacher = rng.normal(0.0, 1.0 / math.sqrt(E), size=(F * R, E))
    a = rng.normal(0.0, 1.0 / math.sqrt(F), size=F * E)
    shift = check_float("task_scale", task_scale, 0.0, 100.0) * rng.normal(0.0, 1.0 / math.sqrt(F), size=(n, F * E))
    rows = np.stack([np.stack([f * R + rng.choice(R, m, replace=False) for f in range(F)]) for _ in range(n)])
    return {"fields": F, "rows_per_table": R, "embedding_dim": E, "n_tasks": n, "items_per_task": m,
            "teacher": teacher, "a": a, "shift": shift, "task_rows": rows,
            "gain": check_float("gain", gain, 0.0, 100.0), "task_scale": float(task_scale), "seed": seed}


def _examples(problem, task, count, rng):
    F, m = problem["fields"], problem["items_per_task"]
    pick = rng.integers(0, m, size=(count, F))
    gid = problem["task_rows"][task][np.arange(F)[None, :], pick]
    x = problem["teacher"][gid].reshape(count, -1)
    logit = problem["gain"] * (x @ (problem["a"] + problem["shift"][task]))
    y = (rng.random(count) < 1.0 / (1.0 + np.exp(-logit))).astype(float)
    return gid.astype(np.int64), y


def sample_batch(problem: dict, task_ids, support: int, query: int, rng: np.random.Generator) -> dict:
    """Support and query sets of the tasks ``task_ids``: ``sup_gid`` (N x S x F global rows), ``sup_y``
    (N x S), ``qry_gid``, ``qry_y``."""
    S, Q = check_int("support", support, 1, 10**5), check_int("query", query, 1, 10**5)
    task_ids = np.asarray(task_ids, dtype=np.int64)
    if task_ids.ndim != 1 or task_ids.size == 0 or task_ids.min() < 0 or task_ids.max() >= problem["n_tasks"]:
        raise SpecError("task_ids", task_ids.tolist(), f"expected a non-empty list of tasks in [0, {problem['n_tasks']})")
    sup = [_examples(problem, t, S, rng) for t in task_ids]
    qry = [_examples(problem, t, Q, rng) for t in task_ids]
    return {"sup_gid": np.stack([s[0] for s in sup]), "sup_y": np.stack([s[1] for s in sup]),
            "qry_gid": np.stack([q[0] for q in qry]), "qry_y": np.stack([q[1] for q in qry])}


def init_params(fields: int, rows_per_table: int, embedding_dim: int, hidden: int, seed: int = 0) -> tuple:
    """(tables: fields*rows x dim, dense vector) of the student, small random values."""
    F, R = check_int("fields", fields, 1, 1024), check_int("rows_per_table", rows_per_table, 1, 10**7)
    E, H = check_int("embedding_dim", embedding_dim, 1, 1024), check_int("hidden", hidden, 1, 4096)
    rng = _rng(seed)
    table = rng.normal(0.0, 0.1, size=(F * R, E))
    dense = np.zeros(dense_size(F, E, H))
    dense[: H * F * E] = rng.normal(0.0, 1.0 / math.sqrt(F * E), size=H * F * E)
    dense[H * F * E + H: H * F * E + 2 * H] = rng.normal(0.0, 1.0 / math.sqrt(H), size=H)
    return table, dense


def split_bounds(total: int, parts: int, name: str = "workers") -> np.ndarray:
    """Contiguous split of ``total`` items over ``parts`` (the first ``total mod parts`` get one more)."""
    parts = check_int(name, parts, 1, max(1, total))
    return np.concatenate([[0], np.cumsum([total // parts + (i < total % parts) for i in range(parts)])]).astype(np.int64)


def _task_layout(batch, tasks):
    """Local rows of each task (sorted unique global ids) and its examples re-indexed to them."""
    ids, sup, qry = [], [], []
    for t in tasks:
        u, inv = np.unique(np.concatenate([batch["sup_gid"][t].ravel(), batch["qry_gid"][t].ravel()]),
                           return_inverse=True)
        n_sup = batch["sup_gid"][t].size
        ids.append(u)
        sup.append(inv[:n_sup].reshape(batch["sup_gid"][t].shape))
        qry.append(inv[n_sup:].reshape(batch["qry_gid"][t].shape))
    off = np.concatenate([[0], np.cumsum([len(u) for u in ids])]).astype(np.int64)
    return ids, off, np.stack(sup).astype(np.int64), np.stack(qry).astype(np.int64)


def _run_tasks(rows, off, sup, qry, batch, tasks, dense, hidden, inner_lr, inner_steps):
    g_rows = np.zeros_like(rows)
    g_dense = np.zeros((len(tasks), dense.size))
    losses = np.zeros((len(tasks), 2))
    K.tasks_meta_gradients(rows, off, sup, np.ascontiguousarray(batch["sup_y"][tasks]), qry,
                           np.ascontiguousarray(batch["qry_y"][tasks]), dense, hidden, inner_lr, inner_steps,
                           g_rows, g_dense, losses)
    return g_rows, g_dense, losses


def _check_step(table, dense, batch, workers, hidden, inner_lr, inner_steps, outer_lr):
    N = batch["sup_gid"].shape[0]
    P = check_int("workers", workers, 1, N)
    H = check_int("hidden", hidden, 1, 4096)
    F, E = batch["sup_gid"].shape[2], table.shape[1]
    if dense.size != dense_size(F, E, H):
        raise SpecError("dense", dense.size, f"expected {dense_size(F, E, H)} dense parameters for {F} fields, "
                        f"dim {E}, hidden {H}")
    return (P, H, check_float("inner_lr", inner_lr, 0.0, 100.0), check_int("inner_steps", inner_steps, 0, 1000),
            check_float("outer_lr", outer_lr, 0.0, 100.0))


def dp_step(table, dense, batch, workers: int, hidden: int, inner_lr: float, inner_steps: int,
            outer_lr: float) -> dict:
    """One outer step of the data-parallel schedule (replicated tables), in place on ``table`` and ``dense``
    (every replica is identical, so one is stored). Returns the tasks' losses."""
    P, H, a, k, b = _check_step(table, dense, batch, workers, hidden, inner_lr, inner_steps, outer_lr)
    N = batch["sup_gid"].shape[0]
    bounds = split_bounds(N, P)
    g_tables = np.zeros((P, table.size))
    g_dense = np.zeros((P, dense.size))
    losses = []
    for w in range(P):
        tasks = np.arange(bounds[w], bounds[w + 1])
        ids, off, sup, qry = _task_layout(batch, tasks)
        rows = table[np.concatenate(ids)]
        g_rows, g_d, loss = _run_tasks(rows, off, sup, qry, batch, tasks, dense, H, a, k)
        K.scatter_add_rows(g_tables[w].reshape(table.shape), np.concatenate(ids), g_rows)
        K.sum_in_order(g_d, g_dense[w])
        losses.append(loss)
    G, Gd = np.empty(table.size), np.empty(dense.size)
    K.sum_in_order(g_tables, G)  # the all-reduce of the tables' gradient
    K.sum_in_order(g_dense, Gd)  # the all-reduce of the dense gradient
    K.sgd_apply(table, G.reshape(table.shape), b / N)
    K.sgd_apply(dense, Gd, b / N)
    return {"losses": np.concatenate(losses)}


def shard_table(table, workers: int) -> list[np.ndarray]:
    """Row shards: worker ``p`` holds global rows ``p, p + P, p + 2P, ...`` (row ``g`` at local ``g // P``)."""
    P = check_int("workers", workers, 1, table.shape[0])
    return [table[p::P].copy() for p in range(P)]  # copies: a shard never aliases the table


def unshard(shards) -> np.ndarray:
    """The whole table from its row shards (inverse of :func:`shard_table`)."""
    P = len(shards)
    out = np.empty((sum(s.shape[0] for s in shards), shards[0].shape[1]))
    for p, s in enumerate(shards):
        out[p::P] = s
    return out


def _alltoall_rows(shards, wanted, P):
    """Worker ``w`` receives the rows ``wanted[w]`` (sorted global ids) from their owners; returns the
    received values per worker and the rows each pair exchanged (``count[w, o]``: rows from ``o`` to ``w``)."""
    count = np.zeros((P, P), dtype=np.int64)
    got = []
    for w in range(P):
        vals = np.empty((len(wanted[w]), shards[0].shape[1]))
        owner = wanted[w] % P
        for o in range(P):
            sel = np.flatnonzero(owner == o)
            part = np.empty((sel.size, vals.shape[1]))
            K.gather_rows(shards[o], wanted[w][sel] // P, part)
            vals[sel] = part
            count[w, o] = sel.size
        got.append(vals)
    return got, count


def hybrid_step(shards, dense, batch, hidden: int, inner_lr: float, inner_steps: int, outer_lr: float) -> dict:
    """One outer step of G-Meta's hybrid schedule, in place on the row ``shards`` (one per worker) and the
    replicated ``dense`` vector. Returns the tasks' losses and the rows exchanged by each all-to-all
    (``lookup_support``, ``lookup_query``, ``gradients``: P x P, ``[receiver, sender]``)."""
    P = len(shards)
    E = shards[0].shape[1]
    full = np.empty((1, E))  # only for the argument check
    _, H, a, k, b = _check_step(full, dense, batch, P, hidden, inner_lr, inner_steps, outer_lr)
    N = batch["sup_gid"].shape[0]
    bounds = split_bounds(N, P)
    tasks_of = [np.arange(bounds[w], bounds[w + 1]) for w in range(P)]
    sup_rows = [np.unique(batch["sup_gid"][t]) for t in tasks_of]
    qry_all = [np.unique(batch["qry_gid"][t]) for t in tasks_of]
    qry_new = [np.setdiff1d(q, s, assume_unique=True) for q, s in zip(qry_all, sup_rows)]
    got_s, c1 = _alltoall_rows(shards, sup_rows, P)  # all-to-all 1: support lookups
    got_q, c2 = _alltoall_rows(shards, qry_new, P)  # all-to-all 2: rows only the query sets read
    g_shards = [np.zeros_like(s) for s in shards]
    g_dense = np.zeros((P, dense.size))
    sends, losses = [], []
    for w in range(P):
        cache_ids = np.concatenate([sup_rows[w], qry_new[w]])
        order = np.argsort(cache_ids)
        cache_ids, cache = cache_ids[order], np.concatenate([got_s[w], got_q[w]])[order]
        ids, off, sup, qry = _task_layout(batch, tasks_of[w])
        flat = np.concatenate(ids)
        pos = np.searchsorted(cache_ids, flat)
        rows = cache[pos]
        g_rows, g_d, loss = _run_tasks(rows, off, sup, qry, batch, tasks_of[w], dense, H, a, k)
        acc = np.zeros_like(cache)
        K.scatter_add_rows(acc, pos, g_rows)
        keep = np.searchsorted(cache_ids, qry_all[w])  # only query-read rows carry a gradient
        sends.append((qry_all[w], acc[keep]))
        K.sum_in_order(g_d, g_dense[w])
        losses.append(loss)
    c3 = np.zeros((P, P), dtype=np.int64)
    for w in range(P):  # all-to-all 3: gradients to the owners, added in sender order
        ids, vals = sends[w]
        owner = ids % P
        for o in range(P):
            sel = np.flatnonzero(owner == o)
            K.scatter_add_rows(g_shards[o], ids[sel] // P, vals[sel])
            c3[o, w] = sel.size
    Gd = np.empty(dense.size)
    K.sum_in_order(g_dense, Gd)  # the all-reduce of the dense gradient
    for o in range(P):
        K.sgd_apply(shards[o], g_shards[o], b / N)
    K.sgd_apply(dense, Gd, b / N)
    return {"losses": np.concatenate(losses), "lookup_support": c1, "lookup_query": c2, "gradients": c3}


# ------------------------------------------------------------------------------------------ NumPy reference
def loss_and_gradient(rows, idx, y, dense, hidden):
    """NumPy: mean binary cross-entropy and its gradients (rows' shape, dense vector's shape)."""
    n, F = idx.shape
    E = rows.shape[1]
    D, H = F * E, hidden
    W1 = dense[: H * D].reshape(H, D)
    c1, w2, c2 = dense[H * D: H * D + H], dense[H * D + H: H * D + 2 * H], dense[-1]
    X = rows[idx].reshape(n, D)
    h = np.tanh(X @ W1.T + c1)
    z = h @ w2 + c2
    loss = float(np.mean(np.logaddexp(0.0, z) - y * z))
    delta = (1.0 / (1.0 + np.exp(-z)) - y) / n
    A = np.outer(delta, w2) * (1.0 - h * h)
    g_dense = np.concatenate([(A.T @ X).ravel(), A.sum(0), h.T @ delta, [delta.sum()]])
    g_rows = np.zeros_like(rows)
    np.add.at(g_rows, idx.ravel(), (A @ W1).reshape(n * F, E))
    return loss, g_rows, g_dense


def outer_step_numpy(table, dense, batch, hidden: int, inner_lr: float, inner_steps: int, outer_lr: float) -> dict:
    """The same first-order MAML outer step in NumPy (one process, all tables local), in place."""
    N = batch["sup_gid"].shape[0]
    G, Gd, losses = np.zeros_like(table), np.zeros_like(dense), np.zeros((N, 2))
    ids, off, sup, qry = _task_layout(batch, np.arange(N))
    for t in range(N):
        rows, d = table[ids[t]].copy(), dense.copy()
        losses[t, 0] = loss_and_gradient(rows, sup[t], batch["sup_y"][t], d, hidden)[0]
        for _ in range(inner_steps):
            _, gr, gd = loss_and_gradient(rows, sup[t], batch["sup_y"][t], d, hidden)
            rows -= inner_lr * gr
            d -= inner_lr * gd
        losses[t, 1], gr, gd = loss_and_gradient(rows, qry[t], batch["qry_y"][t], d, hidden)
        np.add.at(G, ids[t], gr)
        Gd += gd
    table -= outer_lr / N * G
    dense -= outer_lr / N * Gd
    return {"losses": losses}


def evaluate_adapted(table, dense, batch, hidden: int, inner_lr: float, inner_steps: int) -> np.ndarray:
    """(support loss before, query loss after adaptation) of every task of ``batch`` (no update)."""
    N = batch["sup_gid"].shape[0]
    ids, off, sup, qry = _task_layout(batch, np.arange(N))
    return _run_tasks(table[np.concatenate(ids)], off, sup, qry, batch, np.arange(N), dense, hidden, inner_lr,
                      inner_steps)[2]


def train(problem: dict, schedule: str, workers: int, steps: int, tasks_per_step: int, support: int, query: int,
          hidden: int, inner_lr: float, inner_steps: int, outer_lr: float, seed: int = 0) -> dict:
    """Meta-train for ``steps`` outer steps on tasks drawn uniformly from the problem's tasks; returns the final
    parameters and the mean (support-before, query-after) loss per step."""
    if schedule not in SCHEDULES:
        raise SpecError("schedule", schedule, f"expected one of {', '.join(SCHEDULES)}")
    steps = check_int("steps", steps, 1, 10**6)
    N = check_int("tasks_per_step", tasks_per_step, 1, 10**5)
    rng = _rng(seed)
    table, dense = init_params(problem["fields"], problem["rows_per_table"], problem["embedding_dim"], hidden, seed)
    shards = shard_table(table, workers) if schedule == "hybrid" else None
    curve = np.zeros((steps, 2))
    for s in range(steps):
        batch = sample_batch(problem, rng.integers(0, problem["n_tasks"], N), support, query, rng)
        if shards is None:
            out = dp_step(table, dense, batch, workers, hidden, inner_lr, inner_steps, outer_lr)
        else:
            out = hybrid_step(shards, dense, batch, hidden, inner_lr, inner_steps, outer_lr)
        curve[s] = out["losses"].mean(0)
    return {"table": unshard(shards) if shards is not None else table, "dense": dense, "curve": curve}


# ------------------------------------------------------------------------------------------ price at scale
def expected_unique_rows(rows: float, draws: float) -> float:
    """Expected distinct rows among ``draws`` uniform draws from ``rows``: ``R (1 - (1 - 1/R)^n)``."""
    if rows <= 0 or draws <= 0:
        return 0.0
    return float(rows * -math.expm1(draws * math.log1p(-1.0 / rows))) if rows > 1 else 1.0


def _workload(w: Mapping) -> dict:
    F, R, E = w["fields"], w["rows_per_table"], w["embedding_dim"]
    T, S, Q = w["tasks_per_gpu"], w["support"], w["query"]
    u_sup = F * expected_unique_rows(R, T * S)
    u_all = F * expected_unique_rows(R, T * (S + Q))
    u_qry = F * expected_unique_rows(R, T * Q)
    row_B = E * w["bytes_per_value"]
    return {"u_sup": u_sup, "u_new": u_all - u_sup, "u_qry": u_qry, "row_B": row_B,
            "table_B": F * R * row_B, "dense_B": dense_size(F, E, w["hidden"]) * w["bytes_per_value"]}


def _compute_s(system, calib, w: Mapping, updated_rows: float) -> float:
    """One GPU's work in one outer step: batched per-task GEMMs (forward + backward) of both layers for the
    inner steps and the query, embedding gathers / gradient scatters, the inner updates of the task copies
    and the outer update of ``updated_rows`` rows and the dense layers (memory-bound kernels)."""
    F, E, H = w["fields"], w["embedding_dim"], w["hidden"]
    T, S, Q, k = w["tasks_per_gpu"], w["support"], w["query"], w["inner_steps"]
    args = (float(system.peak_flops_bf16), float(system.hbm_bandwidth_GBps) * 1e9, int(system.sm_count), calib)
    t = 0.0
    for m, times in ((S, k), (Q, 1)):
        for n_out, n_in in ((H, F * E), (1, H)):
            fwd, bwd = KC.gemm_fwd_bwd_time(m, n_out, n_in, T, *args)
            t += times * (fwd + bwd)
    bpv = w["bytes_per_value"]
    lookups = T * (S * (k + 1) + Q) * F * E * bpv  # reads; the scatters of the row gradients as much again
    dense_B = dense_size(F, E, H) * bpv
    inner = k * 3.0 * T * (dense_B + (S + Q) * F * E * bpv)  # read param + grad, write param, per task copy
    outer = 3.0 * (updated_rows * E * bpv + dense_B)
    kernels = 6 * (k + 1) + 4
    return t + float(KC.memory_bound_time(2.0 * lookups + inner + outer, kernels, args[1], calib))


def step_time(system, gpus: int, schedule: str, workload: Mapping, bandwidth_GBps: float | None = None) -> dict:
    """Seconds of one outer step per GPU (``compute_s``, ``comm_s``, ``step_s``), samples per second, whether
    the tables fit (``feasible``) and, for the data-parallel schedule, whether the whole-table all-reduce
    beat the sparse all-gather (``table_allreduce``). ``workload``: fields, rows_per_table, embedding_dim,
    hidden, tasks_per_gpu, support, query, inner_steps, bytes_per_value. ``bandwidth_GBps`` replaces the
    system's scale-out bandwidth per GPU."""
    if schedule not in SCHEDULES:
        raise SpecError("schedule", schedule, f"expected one of {', '.join(SCHEDULES)}")
    base = resolve_system(system, "step_time")
    sysx = base if bandwidth_GBps is None else resolve_system(
        {"name": base.name, "scale_out_GBps_per_gpu": check_float("bandwidth_GBps", bandwidth_GBps, 0.0, 1e6,
                                                                  open_min=True)})
    P = check_int("gpus", gpus, 1, 10**6)
    v = _workload(workload)
    calib = perfmodel.calibration_vector(sysx.generation)

    def coll(kind, nbytes):
        return perfmodel.collective_time_s(sysx, kind, float(nbytes), P)

    dense_s = coll("allreduce", v["dense_B"])
    hbm_B = float(sysx.hbm_capacity_GiB) * 2**30
    if schedule == "hybrid":
        rowx = v["row_B"] + ID_BYTES
        comm = coll("alltoall", v["u_sup"] * rowx) + coll("alltoall", v["u_new"] * rowx) + \
            coll("alltoall", v["u_qry"] * rowx) + dense_s
        compute = _compute_s(sysx, calib, workload, v["u_qry"])
        feasible, table_ar = 2.0 * v["table_B"] / P <= hbm_B, False
    else:
        full = coll("allreduce", v["table_B"])
        sparse = coll("allgather", P * v["u_qry"] * (v["row_B"] + ID_BYTES))
        table_ar = P > 1 and full < sparse
        union = min(P * v["u_qry"], workload["fields"] * workload["rows_per_table"])
        rows = workload["fields"] * workload["rows_per_table"] if table_ar else union
        comm = (full if table_ar else sparse) + dense_s
        compute = _compute_s(sysx, calib, workload, rows)
        feasible = 2.0 * v["table_B"] <= hbm_B
    step = compute + comm
    samples = P * workload["tasks_per_gpu"] * (workload["support"] + workload["query"])
    return {"compute_s": compute, "comm_s": comm, "step_s": step, "samples_per_s": samples / step,
            "feasible": bool(feasible), "table_allreduce": bool(table_ar)}
