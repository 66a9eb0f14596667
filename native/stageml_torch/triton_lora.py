"""Fused base + LoRA kernels for decode-sized batches (bench/gpu/splitk.py measures them all;
bench/results/gpu-kernels.md has the numbers and which one is the default per shape).

- `lora_linear(x, w, a, b, scale)`: y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ, or None when no kernel suits.
  bf16 on an sm_90 GPU with cupy, rows 1-32 and from 65: the paths `stream.py` picks (the TMA
  rings of `lora_tma.cu`, 0.92-1.17x cuBLAS's base GEMM alone with the LoRA fused; cuBLAS +
  lora_shrink + lora_expand2 at 65-128 rows up to rank 16, 1.68-1.75x; from 129 rows, and at 65-128
  above rank 16, cuBLAS alone with the LoRA term written into y first and the base GEMM adding into
  it, 1.18-1.25x at 4096 rows); otherwise (33-64 rows, f16, no cupy) the
  one-launch split-K Triton kernel below (1.20-1.49x): every
  (N block, K split) program streams its W tile once and adds its slices of x·Wᵀ and t = x·Aᵀ into
  f32 accumulators; the last program of an N block to arrive adds s·t·Bᵀ, stores y and zeroes the
  accumulators and its counter, so calls need no memset. A tile the GPU's shared memory cannot hold
  (rank 49-64 at 17-64 rows: 256 KB) returns None, before anything ran, and is not tried again.
- `lora_bank_linear(x, w, a_bank, b_bank, slots, ranks, scales)`: one adapter per row out of a
  bank (SGMV/BGMV), through the CUDA kernels at ≤ 64 rows (stream kernels to 16, cuBLAS + shrink +
  expand at 17-64); None otherwise (the caller falls back).
- `lora_linear_swap(...)`: the same one-launch split-K scheme in swap-AB form (yᵀ = W·xᵀ, W the
  MMA's big operand), optionally loading W through TMA tensor descriptors; measured, not default:
  128 × 4 × 128 reached 1.04-1.06x at 1-16 rows, but its results are wrong (rel. error 1-3e-2)
  from 32 rows and for several configurations at 16, an unresolved bug, so it is not used.
"""

import torch
import triton
import triton.language as tl

from . import stream as _stream

try:
    from triton.runtime.errors import OutOfResources
except ImportError:  # noqa: BLE001 - a Triton without that module: nothing to catch by name
    class OutOfResources(Exception):  # noqa: N818 - Triton's name
        pass

MAX_ROWS = 64
BLOCK_N, BLOCK_K = 128, 128


def split_for(n, k):
    """K splits: about one wave of programs (N/128 blocks × splits ≤ 160 on 132 SMs), splits dividing K
    into 128-wide steps. bench/gpu/splitk.py's sweep at 4096² picked 128 × 4 × 128, 4 stages, 4 warps
    for every row count; no autotuning at run time (it would stall the first call of every shape)."""
    blocks = n // BLOCK_N
    split = 1
    while split < 16 and blocks * split * 2 <= 160 and k % (split * 2 * BLOCK_K) == 0:
        split *= 2
    return split


@triton.jit(do_not_specialize=["M"])
def _kernel(x_ptr, w_ptr, a_ptr, b_ptr, y_ptr, y_acc_ptr, t_acc_ptr, count_ptr, scale, M, N: tl.constexpr, K: tl.constexpr,
            R_PAD: tl.constexpr, RANK: tl.constexpr, MAXR: tl.constexpr, M_BUCKET: tl.constexpr,
            BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, M_BUCKET)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, R_PAD)
    k_per = K // SPLIT_K
    k0 = pid_k * k_per
    mask_m = offs_m < M
    acc = tl.zeros((M_BUCKET, BLOCK_N), dtype=tl.float32)
    acc_t = tl.zeros((M_BUCKET, R_PAD), dtype=tl.float32)
    for kk in range(0, k_per, BLOCK_K):
        offs_k = k0 + kk + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None], other=0.0)
        w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :])
        a = tl.load(a_ptr + offs_r[:, None] * K + offs_k[None, :], mask=(offs_r < RANK)[:, None], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        acc_t = tl.dot(x, tl.trans(a), acc_t)
    y_acc = y_acc_ptr + offs_m[:, None] * N + offs_n[None, :]
    t_acc = t_acc_ptr + pid_n * (MAXR * R_PAD) + offs_m[:, None] * R_PAD + offs_r[None, :]
    tl.atomic_add(y_acc, acc, mask=mask_m[:, None], sem="relaxed")
    tl.atomic_add(t_acc, acc_t, mask=mask_m[:, None], sem="relaxed")
    tl.debug_barrier()
    count = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
    if count == SPLIT_K - 1:
        tot = tl.load(y_acc, mask=mask_m[:, None], other=0.0, cache_modifier=".cg")
        t = tl.load(t_acc, mask=mask_m[:, None], other=0.0, cache_modifier=".cg")
        b = tl.load(b_ptr + offs_n[:, None] * RANK + offs_r[None, :], mask=(offs_r < RANK)[None, :], other=0.0)
        tot = tl.dot((t * scale).to(b.dtype), tl.trans(b), tot)
        tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], tot.to(y_ptr.dtype.element_ty), mask=mask_m[:, None])
        tl.store(y_acc, tl.zeros((M_BUCKET, BLOCK_N), dtype=tl.float32), mask=mask_m[:, None])
        tl.store(t_acc, tl.zeros((M_BUCKET, R_PAD), dtype=tl.float32), mask=mask_m[:, None])
        tl.atomic_xchg(count_ptr + pid_n, 0)


_STATE = {}


def _state(n, r_pad, device):
    key = (n, r_pad, str(device))
    st = _STATE.get(key)
    if st is None:
        st = (torch.zeros((MAX_ROWS, n), device=device, dtype=torch.float32),
              torch.zeros((n // BLOCK_N, MAX_ROWS, r_pad), device=device, dtype=torch.float32),
              torch.zeros((n // BLOCK_N,), device=device, dtype=torch.int32))
        _STATE[key] = st
    return st


def lora_linear(x, w, a, b, scale):
    """y [..., N] or None when the shapes do not suit the kernels (the caller then runs torch ops)."""
    y = _stream.lora_linear(x, w, a, b, scale)
    if y is not None:
        return y
    return lora_linear_triton(x, w, a, b, scale)


def lora_bank_linear(x, w, a_bank, b_bank, slots, ranks, scales):
    """y [..., N] = x·Wᵀ + scales[j]·(x·A_jᵀ)·B_jᵀ with j = slots[row] (−1: base only), a_bank
    [S, R, K], b_bank [S, N, R], ranks [S] int32 (≤ R, multiples of 8), scales [S] f32, all on x's
    device; None when the CUDA kernel does not suit (the caller then runs torch ops)."""
    return _stream.lora_bank_linear(x, w, a_bank, b_bank, slots, ranks, scales)


def lora_linear_triton(x, w, a, b, scale):
    """The one-launch split-K Triton kernel: y [..., N], or None when the shapes do not suit it."""
    n, k = w.shape
    rank = a.shape[0]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0 or m > MAX_ROWS or rank > 128 or n % BLOCK_N != 0 or k % BLOCK_K != 0 or b.shape != (n, rank):
        return None
    if not (w.dtype == a.dtype == b.dtype == x.dtype):
        return None
    x2 = x2.contiguous()
    r_pad = max(16, triton.next_power_of_2(rank))
    # Two row tiles only (16, 64): each is compiled once per shape, never once per batch size.
    mb = 16 if m <= 16 else 64
    if (r_pad, mb, x.dtype) in _TOO_BIG:
        return None
    y_acc, t_acc, count = _state(n, r_pad, x.device)
    y = torch.empty((m, n), device=x.device, dtype=x.dtype)
    split = split_for(n, k)
    try:
        _kernel[(n // BLOCK_N, split)](x2, w.contiguous(), a.contiguous(), b.contiguous(), y, y_acc, t_acc, count, scale, m, n, k, r_pad, rank, MAX_ROWS, mb,
                                       BLOCK_N, split, BLOCK_K, num_warps=4, num_stages=4)
    except OutOfResources:
        # the tile does not fit this GPU (rank 64 at 64 rows asks for 256 KB of shared memory): raised
        # before the launch, so nothing ran; the caller's unfused ops take these shapes from now on
        _TOO_BIG.add((r_pad, mb, x.dtype))
        return None
    return y.reshape(*x.shape[:-1], n)


# (padded rank, row tile, dtype) whose compiled kernel did not fit the device's shared memory
_TOO_BIG = set()


@triton.jit(do_not_specialize=["M"])
def _swap_kernel(x_ptr, w_ptr, a_ptr, b_ptr, y_ptr, y_acc_ptr, t_acc_ptr, count_ptr, scale, M, N: tl.constexpr, K: tl.constexpr,
                 R_PAD: tl.constexpr, RANK: tl.constexpr, MAXR: tl.constexpr, M_BUCKET: tl.constexpr,
                 BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr):
    """Swap-AB: acc [BLOCK_N, M_BUCKET] = W tile · xᵀ, so the MMA's M is W's side (wgmma-sized)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, M_BUCKET)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, R_PAD)
    k_per = K // SPLIT_K
    k0 = pid_k * k_per
    mask_m = offs_m < M
    acc = tl.zeros((BLOCK_N, M_BUCKET), dtype=tl.float32)
    acc_t = tl.zeros((R_PAD, M_BUCKET), dtype=tl.float32)
    if USE_TMA:
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    for kk in range(0, k_per, BLOCK_K):
        offs_k = k0 + kk + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=mask_m[:, None], other=0.0)
        if USE_TMA:
            w = w_desc.load([pid_n * BLOCK_N, k0 + kk])
        else:
            w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :])
        a = tl.load(a_ptr + offs_r[:, None] * K + offs_k[None, :], mask=(offs_r < RANK)[:, None], other=0.0)
        xt = tl.trans(x)
        acc = tl.dot(w, xt, acc)
        acc_t = tl.dot(a, xt, acc_t)
    y_acc = y_acc_ptr + offs_m[None, :] * N + offs_n[:, None]
    t_acc = t_acc_ptr + pid_n * (MAXR * R_PAD) + offs_m[None, :] * R_PAD + offs_r[:, None]
    tl.atomic_add(y_acc, acc, mask=mask_m[None, :], sem="relaxed")
    tl.atomic_add(t_acc, acc_t, mask=mask_m[None, :], sem="relaxed")
    tl.debug_barrier()
    count = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
    if count == SPLIT_K - 1:
        tot = tl.load(y_acc, mask=mask_m[None, :], other=0.0, cache_modifier=".cg")
        t = tl.load(t_acc, mask=mask_m[None, :], other=0.0, cache_modifier=".cg")
        b = tl.load(b_ptr + offs_n[:, None] * RANK + offs_r[None, :], mask=(offs_r < RANK)[None, :], other=0.0)
        tot = tl.dot(b, (t * scale).to(b.dtype), tot)
        tl.store(y_ptr + offs_m[None, :] * N + offs_n[:, None], tot.to(y_ptr.dtype.element_ty), mask=mask_m[None, :])
        tl.store(y_acc, tl.zeros((BLOCK_N, M_BUCKET), dtype=tl.float32), mask=mask_m[None, :])
        tl.store(t_acc, tl.zeros((R_PAD, M_BUCKET), dtype=tl.float32), mask=mask_m[None, :])
        tl.atomic_xchg(count_ptr + pid_n, 0)


_SWAP_STATE = {}


def lora_linear_swap(x, w, a, b, scale, block_n=128, split_k=8, block_k=128, num_warps=4, num_stages=4, use_tma=False, out=None):
    """The swap-AB one-launch kernel at one configuration (bench/gpu/splitk.py sweeps them).

    Experimental, for measurement only: on the H200 its results were wrong from 32 rows and for 5 of
    7 configurations at 16 rows (rel. error 1e-2 to 5.6e-2, cause not found;
    bench/results/gpu-kernels.md), so nothing in the executor calls it; check its output."""
    n, k = w.shape
    rank = a.shape[0]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0 or m > MAX_ROWS or rank > 128 or n % block_n != 0 or k % (block_k * split_k) != 0:
        return None
    r_pad = max(16, triton.next_power_of_2(rank))
    mb = 16 if m <= 16 else (32 if m <= 32 else 64)
    key = (n, r_pad, block_n, str(x.device))
    st = _SWAP_STATE.get(key)
    if st is None:
        st = (torch.zeros((MAX_ROWS, n), device=x.device, dtype=torch.float32),
              torch.zeros((n // block_n, MAX_ROWS, r_pad), device=x.device, dtype=torch.float32),
              torch.zeros((n // block_n,), device=x.device, dtype=torch.int32))
        _SWAP_STATE[key] = st
    y = out if out is not None else torch.empty((m, n), device=x.device, dtype=x.dtype)
    _swap_kernel[(n // block_n, split_k)](x2, w, a, b, y, st[0], st[1], st[2], scale, m, n, k, r_pad, rank, MAX_ROWS, mb,
                                          block_n, split_k, block_k, use_tma, num_warps=num_warps, num_stages=num_stages)
    return y
