"""Fused base + LoRA for compute-bound row counts (hundreds to thousands of rows, one adapter).

What the dispatch uses (`stream.BIG_DEFAULT`, from 129 rows, and at 65-128 rows above rank 16):
("cx",), `cx_launch`: cuBLAS alone. t = x·Aᵀ, y = (s·t)·Bᵀ written, then cuBLAS's base GEMM adds
x·Wᵀ into y (addmm, β = 1: y read once in the GEMM's epilogue). On the H200 at 4096² it is
1.18-1.25× cuBLAS's base GEMM alone at 4096 rows, against 1.30-1.37× for the unfused ops
(bench/results/gpu-kernels.md); its floor is ~1.10× (reading x and writing the term once).

Measured, not dispatched: cuBLAS's base GEMM with the LoRA term (`lora_big.cu`'s `lora_lowrank`)
beside it. At 4096 rows the base GEMM is compute-bound (~175 µs on the H200) while the LoRA term
is memory-bound (t = x·Aᵀ reads x; s·t·Bᵀ writes or updates y), so the two could share the chip:
the rows are cut into CH chunks; for ORDER 0 ("pre") a side stream writes y_i = s·t_i·Bᵀ chunk by
chunk and the caller's stream runs cuBLAS y_i += x_i·Wᵀ (addmm, β = 1) as soon as chunk i is
there, so the side kernel of chunk i + 1 runs beside the GEMM of chunk i on the G SMs it leaves
free; ORDER 1 ("post") runs cuBLAS first per chunk and the side stream adds the term after it;
ORDER 2 ("mixed") runs chunk 0 "post" and the others "pre", so that no chunk's term waits alone.
CH = 1: both on the caller's stream, the term on the whole chip first (no overlap). None of these
beat "cx" (cuBLAS leaves no SMs free; the term kernel moves too few bytes per SM): they stay for
bench/gpu/bigrows.py.

Configurations ("big", ORDER, CH, G, NW, MG, U, BS): G blocks for the overlapped chunks (0: a block per
row block, the whole chip; the exposed chunk, the first for "pre" and the last for "post", always
gets them all), NW warps per block sharing MG 16-row groups (K split NW / MG ways for t, N split NW
ways for the product), U 64-wide K steps of loads issued together, BS 1: B (rank ≤ 16) read once
per block into shared memory. Streams and events:
the side stream first waits for the caller's stream (x written, y free), the caller's stream waits
for the side stream's last event before returning, so nothing leaks past the call and CUDA-graph
capture sees one fork and one join per call. Launched through the driver API (no PDL: cuBLAS may
let a dependent launch start early, and these kernels have no dependency wait). bf16 only,
rank ≤ 64 (padded to 16/32/64 in the kernel), N a multiple of 128·NW, K of 64·U·NW/MG (`suits`).

Banks (`bank_launch`, ("bx", KW, NB, CH)): the base GEMM in CH column chunks, `lora_expand_cols`
of chunk i on the side stream beside the GEMM of chunk i + 1; measured, not dispatched (the
memory-bound GEMM itself slows 1.5-2.4× in column chunks)."""

import ctypes
import os

import torch

from . import errors
from . import tma as _tma

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lora_big.cu")
NWS = (4, 8, 16)
MGS = (1, 2, 4)
US = (1, 2, 4)
RPS = (16, 32, 64)
MAX_CHUNKS = 16
_SIDE = {}
_EVENTS = {}
_FAILED = set()


def is_big(cfg):
    return cfg is not None and len(cfg) > 0 and cfg[0] == "big"


def check_big(cfg):
    """Validates a ("big", ORDER, CH, G, NW, MG, U, BS) tuple; raises WorkerError (RT_BAD_VALUE) naming what is wrong."""
    ok = (is_big(cfg) and len(cfg) == 8 and all(isinstance(v, int) for v in cfg[1:]) and cfg[1] in (0, 1, 2) and 1 <= cfg[2] <= MAX_CHUNKS
          and 0 <= cfg[3] <= 4096 and cfg[4] in NWS and cfg[5] in MGS and cfg[4] % cfg[5] == 0 and cfg[6] in US and cfg[7] in (0, 1))
    if not ok:
        raise errors.WorkerError(errors.BAD_VALUE, "big config must be ('big', ORDER 0|1|2, CH 1-%d, G 0-4096, NW in %s, MG in %s dividing NW, U in %s, BS 0|1), got %r"
                                 % (MAX_CHUNKS, NWS, MGS, US, cfg))
    return cfg


def rank_pad(rank):
    """The kernel's rank tile for `rank` (16, 32 or 64), or None when it is not a multiple of 8 ≤ 64."""
    if rank <= 0 or rank % 8 != 0:
        return None
    for rp in RPS:
        if rank <= rp:
            return rp
    return None


def suits(cfg, m, n, k, rank):
    nw, mg, u, bs = cfg[4:8]
    rp = rank_pad(rank)
    return (m > 0 and rp is not None and n % (128 * nw) == 0 and k % (64 * u * (nw // mg)) == 0 and n < 2**31 and k < 2**31
            and m * max(n, k) < 2**31 and (not bs or (rp == 16 and n * 32 <= BS_MAX_SMEM)))


BS_MAX_SMEM = 200 * 1024  # B in shared memory: N·32 bytes (rank ≤ 16) under the 227 KB a block may take


def chunks(m, ch):
    """Row ranges of the CH chunks: equal, multiples of 128 rows where m allows (cuBLAS tiles)."""
    if ch <= 1:
        return [(0, m)]
    step = -(-m // ch)
    step = -(-step // 128) * 128 if m >= 128 * ch else step
    out = []
    lo = 0
    while lo < m:
        out.append((lo, min(m, lo + step)))
        lo += step
    return out


def instantiation(rp, nw, mg, u, mode, bs=0):
    return "lora_lowrank<%d, %d, %d, %d, %d, %d>" % (rp, nw, mg, u, mode, bs)


def mangled(rp, nw, mg, u, mode, bs=0):
    return "_Z12lora_lowrankILi%dELi%dELi%dELi%dELi%dELi%dEEvPKtS1_S1_Ptfiiiii" % (rp, nw, mg, u, mode, bs)


def explicit_instantiations(keys):
    """C++ explicit instantiations of (rp, nw, mg, u, mode, bs) keys (for an nvcc-built cubin)."""
    sig = "(const bf16_t*, const bf16_t*, const bf16_t*, bf16_t*, float, int, int, int, int, int)"
    return "".join("template __global__ void lora_lowrank<%d, %d, %d, %d, %d, %d>%s;\n" % (k + (sig,)) for k in sorted(set(keys)))


_SMEM_SET = {}


def function(rp, nw, mg, u, mode, bs=0):
    """The CUfunction handle (an int) of one instantiation: from STAGEML_TMA_CUBIN's cubins, else NVRTC."""
    return _tma._wg_function(instantiation(rp, nw, mg, u, mode, bs), mangled(rp, nw, mg, u, mode, bs), _SRC)


def _side(device):
    s = _SIDE.get(str(device))
    if s is None:
        s = _SIDE[str(device)] = torch.cuda.Stream(device=device, priority=-100)  # clamped to the highest priority
    return s


def _events(device, n):
    key = str(device)
    ev = _EVENTS.get(key)
    if ev is None or len(ev) < n:
        ev = _EVENTS[key] = [torch.cuda.Event() for _ in range(max(n, MAX_CHUNKS))]
    return ev


def lowrank(x2, a, b, y, scale, rank, kern, mode, grid, stream):
    """One launch of the term on rows x2 [m, K] into y [m, ldy] (row stride ldy, N columns): MODE 0
    writes y = s·(x·Aᵀ)·Bᵀ, MODE 1 adds it. kern = (NW, MG, U, BS); grid ≤ 0: a block per 16·MG rows."""
    m, k = x2.shape
    n = b.shape[0]
    rp = rank_pad(rank)
    nw, mg, u, bs = kern
    f = function(rp, nw, mg, u, mode, bs)
    blocks = -(-m // (16 * mg))
    g = max(1, min(grid, blocks)) if grid > 0 else blocks
    lib = _tma._lib()
    smem = n * 32 if bs else 0
    key = (f, mode)
    if smem > 48 * 1024 and _SMEM_SET.get(key, 0) < smem:
        _tma._check(lib.cuFuncSetAttribute(ctypes.c_void_p(f), 8, smem), "cuFuncSetAttribute")  # MAX_DYNAMIC_SHARED_SIZE_BYTES
        _SMEM_SET[key] = smem
    vals = [ctypes.c_uint64(x2.data_ptr()), ctypes.c_uint64(a.data_ptr()), ctypes.c_uint64(b.data_ptr()), ctypes.c_uint64(y.data_ptr()),
            ctypes.c_float(scale)] + [ctypes.c_int32(v) for v in (m, n, k, rank, y.stride(0))]
    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
    _tma._check(lib.cuLaunchKernel(ctypes.c_void_p(f), g, 1, 1, 32 * nw, 1, 1, smem, ctypes.c_void_p(stream), params, None),
                "cuLaunchKernel(%s)" % instantiation(rp, nw, mg, u, mode, bs))
    return y


def launch(cfg, x2, w, a, b, y, scale):
    """y [M, N] (contiguous, written) = x2·wᵀ + scale·(x2·aᵀ)·bᵀ with cuBLAS and lora_lowrank as cfg says."""
    order, ch, g = cfg[1:4]
    kern = tuple(cfg[4:8])
    m = x2.shape[0]
    rank = a.shape[0]
    main = torch.cuda.current_stream(x2.device)
    parts = chunks(m, ch)
    if len(parts) == 1:
        if order == 0:
            lowrank(x2, a, b, y, scale, rank, kern, 0, 0, main.cuda_stream)
            y.addmm_(x2, w.t())
        else:
            torch.matmul(x2, w.t(), out=y)
            lowrank(x2, a, b, y, scale, rank, kern, 1, 0, main.cuda_stream)
        return y
    side = _side(x2.device)
    ev = _events(x2.device, len(parts))
    last = len(parts) - 1
    if order == 0:
        side.wait_stream(main)
        for i, (lo, hi) in enumerate(parts):
            lowrank(x2[lo:hi], a, b, y[lo:hi], scale, rank, kern, 0, 0 if i == 0 else g, side.cuda_stream)
            ev[i].record(side)
        for i, (lo, hi) in enumerate(parts):
            main.wait_event(ev[i])
            y[lo:hi].addmm_(x2[lo:hi], w.t())
    elif order == 1:
        for i, (lo, hi) in enumerate(parts):
            torch.matmul(x2[lo:hi], w.t(), out=y[lo:hi])
            ev[i].record(main)
            side.wait_event(ev[i])
            lowrank(x2[lo:hi], a, b, y[lo:hi], scale, rank, kern, 1, 0 if i == last else g, side.cuda_stream)
        main.wait_stream(side)
    else:
        # chunk 0 "post", the rest "pre": the side stream writes the terms of chunks 1.. beside the
        # GEMM of chunk 0 (which needs nothing), then adds chunk 0's term beside the later GEMMs.
        side.wait_stream(main)
        lo0, hi0 = parts[0]
        torch.matmul(x2[lo0:hi0], w.t(), out=y[lo0:hi0])
        ev[0].record(main)
        for i, (lo, hi) in enumerate(parts[1:], 1):
            lowrank(x2[lo:hi], a, b, y[lo:hi], scale, rank, kern, 0, g, side.cuda_stream)
            ev[i].record(side)
        side.wait_event(ev[0])
        lowrank(x2[lo0:hi0], a, b, y[lo0:hi0], scale, rank, kern, 1, g, side.cuda_stream)
        for i, (lo, hi) in enumerate(parts[1:], 1):
            main.wait_event(ev[i])
            y[lo:hi].addmm_(x2[lo:hi], w.t())
        main.wait_stream(side)
    return y



# -- banks at 17-256 rows: cuBLAS by column chunks, the expand of each chunk beside the next ---------


def expand_cols_fn(nb):
    return _tma._wg_function("lora_expand_cols<%d>" % nb, "_Z16lora_expand_colsILi%dEEvPKfPKtPtPKiS6_S1_iiiiii" % nb, _SRC)


def col_chunks(n, ch):
    """Column ranges of CH chunks, multiples of 128 columns."""
    step = -(-(-(-n // ch)) // 128) * 128
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _raw(f, grid, threads, stream, vals, what):
    lib = _tma._lib()
    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
    _tma._check(lib.cuLaunchKernel(ctypes.c_void_p(f), grid[0], grid[1], grid[2], threads, 1, 1, 0, ctypes.c_void_p(stream), params, None),
                "cuLaunchKernel(%s)" % what)


def bank_launch(cfg, x2, w, a, b, y, slots, ranks, scales, rmax):
    """("bx", KW, NB, CH): lora_shrink (KW warps) on the side stream beside cuBLAS, the base GEMM in CH
    column chunks on the caller's stream, lora_expand_cols (NB threads) of chunk i on the side
    stream once chunk i is written (beside the GEMM of chunk i + 1). y [M, N] written."""
    _, kw, nb, ch = cfg
    m, k = x2.shape
    n = w.shape[0]
    fs = _tma._shrink_fn(kw)
    fe = expand_cols_fn(nb)
    main = torch.cuda.current_stream(x2.device)
    side = _side(x2.device)
    t = _tma._tbuf(x2.device, main.cuda_stream, rmax)
    groups = -(-rmax // 16)
    kc = _tma.sx_slices(kw, m, groups, k)

    def p(v):
        return ctypes.c_uint64(v.data_ptr() if v is not None else 0)

    side.wait_stream(main)
    _raw(fs, (m, groups, kc), 32 * kw, side.cuda_stream, [p(x2), p(a), p(t), p(slots), p(ranks)] + [ctypes.c_int32(v) for v in (m, k, rmax)],
         "lora_shrink<%d>" % kw)
    parts = col_chunks(n, ch)
    ev = _events(x2.device, len(parts))
    for i, (lo, hi) in enumerate(parts):
        if len(parts) == 1:
            torch.matmul(x2, w.t(), out=y)
        else:
            torch.matmul(x2, w[lo:hi].t(), out=y[:, lo:hi])
        ev[i].record(main)
        side.wait_event(ev[i])
        _raw(fe, (-(-(hi - lo) // nb), m, 1), nb, side.cuda_stream,
             [p(t), p(b), p(y), p(slots), p(ranks), p(scales)] + [ctypes.c_int32(v) for v in (m, n, rmax, kc, lo, hi)], "lora_expand_cols<%d>" % nb)
    main.wait_stream(side)
    return y


# -- cuBLAS alone: t, the term written into y, then the base GEMM adding into it ------------------


def is_cx(cfg):
    return cfg is not None and len(cfg) > 0 and cfg[0] == "cx"


def check_cx(cfg):
    if not (is_cx(cfg) and len(cfg) == 1):
        raise errors.WorkerError(errors.BAD_VALUE, "cx config must be ('cx',), got %r" % (cfg,))
    return cfg


def cx_launch(x2, w, a, b, y, scale):
    """("cx",): t = x·Aᵀ (cuBLAS, bf16), y = (s·t)·Bᵀ (cuBLAS), then cuBLAS y += x·Wᵀ (addmm, β = 1:
    y read once in the GEMM's epilogue). Four launches on the caller's stream, the base GEMM's
    rounding once at the end; t rounded to bf16 as the unfused ops round it."""
    t = torch.matmul(x2, a.t())
    t.mul_(scale)
    torch.matmul(t, b.t(), out=y)
    y.addmm_(x2, w.t())
    return y
