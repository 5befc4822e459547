r"""Host-side overheads of a training step and the quantised-weight size, one scalar function each.

The performance model (:mod:`trainscale.kernels.plan`) prices the accelerator's work. A real job
also waits for its host: these kernels price that wait, each as a formula of its inputs.

**Data loading.** ``w`` loader processes per GPU, each decoding ``R`` bytes/s of samples of ``B``
bytes, limited to the host's ``c`` cores per GPU, supply ``w_\mathrm{eff} R / B`` samples/s with
``w_\mathrm{eff} = \min(w, c)``. They prefetch while the GPU works, so of the load time of a step
of ``n`` samples only what exceeds the GPU's busy time ``T`` is exposed; with no workers
(``w = 0``) the training process decodes the samples itself, in series:

.. math::
    t_\mathrm{load} = \max\!\left(0,\ \frac{nB}{w_\mathrm{eff} R} - T\right) \quad (w \ge 1),
    \qquad t_\mathrm{load} = \frac{nB}{R} \quad (w = 0)

**Host-to-device copy** of the step's ``nB`` bytes at the PCIe bandwidth ``\beta`` (pinned or
pageable host memory), shared by the ``k`` GPUs behind one PCIe switch uplink:

.. math:: t_\mathrm{h2d} = \frac{nB}{\beta / \min(k, g)}

on ``g`` GPUs filled switch by switch.

**Kernel launches.** The host issues ``K = L k_\ell (1 + k_b) + k_o`` kernels per step (``L``
layers of ``k_\ell`` forward kernels, ``k_b`` backward kernels per forward one, ``k_o`` for the
optimizer) at ``\lambda`` seconds each; launches run ahead of the GPU, so only what exceeds the
GPU's busy time is exposed (small models and batches):

.. math:: t_\mathrm{launch} = \max(0,\ K\lambda - T)

**Synchronisation.** ``s`` host-device synchronisations per step each drain the launch queue
(``\sigma`` seconds); and with ``g`` data-parallel GPUs whose compute times vary with coefficient
of variation ``v``, every step waits at the gradient all-reduce for the slowest:

.. math:: t_\mathrm{sync} = s\sigma + v\,T_c\,\mathbb{E}\left[\max_{i \le g} Z_i\right]

with ``Z_i`` independent standard normals (0 for ``g = 1``, ``1/\sqrt{\pi}`` for ``g = 2``,
``3/(2\sqrt{\pi})`` for ``g = 3``).

**NF4 weights** (QLoRA): ``b``-bit codes in blocks of ``B_1`` with a ``b_1``-bit scale each, the
scales quantised again in blocks of ``B_2`` with a ``b_2``-bit constant:

.. math:: \mathrm{bits/param} = b + \frac{b_1}{B_1} + \frac{b_2}{B_1 B_2}

(4.127 for QLoRA's 4, 64, 8, 256, 32).
"""

import math

from numba import njit

__all__ = ["loader_exposed_s", "h2d_copy_s", "launch_exposed_s", "kernels_per_step", "expected_max_normal",
           "sync_s", "nf4_bits_per_param", "data_loading_grid"]


@njit(cache=True)
def loader_exposed_s(samples, workers, decode_Bps_per_worker, bytes_per_sample, cores_per_gpu, gpu_busy_s):
    """Seconds per step the GPU waits for its loader (formula in the module docstring)."""
    load_bytes = samples * bytes_per_sample
    if workers <= 0:
        return load_bytes / decode_Bps_per_worker
    w_eff = workers if workers < cores_per_gpu else cores_per_gpu
    if w_eff < 1.0:
        w_eff = 1.0
    exposed = load_bytes / (w_eff * decode_Bps_per_worker) - gpu_busy_s
    return exposed if exposed > 0.0 else 0.0


@njit(cache=True)
def h2d_copy_s(nbytes, bandwidth_Bps, gpus, gpus_per_switch):
    """Seconds to copy ``nbytes`` host-to-device when ``min(gpus, gpus_per_switch)`` GPUs share the
    PCIe uplink of bandwidth ``bandwidth_Bps``."""
    sharing = gpus if gpus < gpus_per_switch else gpus_per_switch
    if sharing < 1:
        sharing = 1
    return nbytes * sharing / bandwidth_Bps


@njit(cache=True)
def kernels_per_step(layers, kernels_per_layer, backward_per_forward, optimizer_kernels, micro_batches):
    """Kernels the host launches per step: every micro-batch runs each layer forward and backward."""
    return micro_batches * layers * kernels_per_layer * (1.0 + backward_per_forward) + optimizer_kernels


@njit(cache=True)
def launch_exposed_s(kernels, launch_latency_s, gpu_busy_s):
    """Launch time not hidden behind the GPU's own work: ``max(0, K lambda - T)``."""
    exposed = kernels * launch_latency_s - gpu_busy_s
    return exposed if exposed > 0.0 else 0.0


@njit(cache=True)
def expected_max_normal(n):
    r"""``E[max of n independent standard normals]`` by quadrature of
    ``\int z\, n \phi(z) \Phi(z)^{n-1} dz`` (Simpson's rule on [-12, 12], 4000 intervals)."""
    if n <= 1:
        return 0.0
    lo, hi, m = -12.0, 12.0, 4000
    h = (hi - lo) / m
    total = 0.0
    for i in range(m + 1):
        z = lo + i * h
        phi = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        cdf = 0.5 * math.erfc(-z / math.sqrt(2.0))
        f = z * n * phi * cdf ** (n - 1)
        weight = 1.0 if (i == 0 or i == m) else (4.0 if i % 2 == 1 else 2.0)
        total += weight * f
    return total * h / 3.0


@njit(cache=True)
def sync_s(sync_points, sync_latency_s, jitter, compute_s, gpus):
    """Seconds per step lost to host-device synchronisation and to waiting for the slowest GPU."""
    return sync_points * sync_latency_s + jitter * compute_s * expected_max_normal(gpus)


@njit(cache=True)
def nf4_bits_per_param(bits, block, scale_bits, scale_block, scale2_bits):
    """Bits per parameter of block-quantised weights with double-quantised scales."""
    return bits + scale_bits / block + scale2_bits / (block * scale_block)


@njit(cache=True)
def data_loading_grid(samples, workers, bytes_per_sample, bandwidth_Bps, decode_Bps_per_worker, cores_per_gpu,
                      gpus, gpus_per_switch, gpu_busy_s, load_out, copy_out):
    """Exposed loading and copy time over a grid: ``workers`` x ``bytes_per_sample`` for each of the
    ``bandwidth_Bps`` (pinned / pageable). Fills ``load_out`` and ``copy_out`` of shape
    ``(len(bandwidth_Bps), len(workers), len(bytes_per_sample))``; the GPU's busy time grows by the copy."""
    for i in range(bandwidth_Bps.shape[0]):
        for j in range(workers.shape[0]):
            for k in range(bytes_per_sample.shape[0]):
                copy = h2d_copy_s(samples * bytes_per_sample[k], bandwidth_Bps[i], gpus, gpus_per_switch)
                copy_out[i, j, k] = copy
                load_out[i, j, k] = loader_exposed_s(samples, workers[j], decode_Bps_per_worker,
                                                     bytes_per_sample[k], cores_per_gpu, gpu_busy_s + copy)

