"""Host side of the swap-AB streaming CUDA kernel (`lora_stream.cu`): fused base + LoRA in one
launch for one adapter or a bank (one adapter per row), bf16, rows ≤ 256; and the dispatch of every
CUDA path of `lora_linear` / `lora_bank_linear` (tables below).

Compiled at first use by NVRTC through cupy (present on the GPU image), one instantiation per
configuration; `STAGEML_STREAM_CUBIN` may name a prebuilt cubin (nvcc, sm_90) holding them instead.
Without cupy every entry point returns None and the caller falls back (Triton, then torch ops).
Two kernel families. `lora_stream` (WR, RG, KW, MT, UNR, LDW): WR 16-row W groups per warp, RG
row groups and KW K splits per block (RG·KW warps), MT 8-row batch tiles (rows ≤ 8·MT), UNR
64-wide K steps of loads issued before their MMAs, LDW the W load flavour (0:
ld.global.nc.L1::no_allocate, 1: the same with an L2 256-byte prefetch hint). `lora_stream_cl`
("cl", WR, RG, MT, UNR, CL, LDW): a cluster of CL blocks splits K, the partial sums meet in
distributed shared memory, so x fragments are shared by a block's RG warps through L1.

A third family, the TMA ring (`lora_tma.cu`, host side `tma.py`, configurations ("tma", ...)),
streams W through the copy engine into a shared-memory ring; its wgmma forms ("wg", ...: lora_wg,
sm_90a; ("wgt", ...): lora_wgt, one adapter with t computed once per launch) and the three-launch ("sx", ...) path (cuBLAS base GEMM, then lora_shrink and lora_expand,
one adapter or a slot per row) are dispatched from here too, and for one adapter beyond 128 rows
big.py's ("cx",) (cuBLAS alone: the LoRA term written into y first, the base GEMM adding into it).

`DEFAULT` / `DEFAULT_BANK` / `BIG_DEFAULT` hold, per row bucket, the fastest correct configuration
measured on the H200 (bench/results/gpu-kernels.md: 2026-12-01, runs ~20:30-21:00 UTC and
~22:55-23:20 UTC; 2026-12-02 ~01:31 UTC for DEFAULT_HIGH_RANK, banks at 9-64 rows 2026-12-02
~00:55-01:27 UTC; × cuBLAS's base GEMM alone in the same run, 4096², r16 / r64 and 64-adapter banks
of ranks 8/16/64, LoRA fused). Banks may pass their B factors a second time stored [S, R, N]
(`lora_bank_linear(..., b_bank_t=)`): the sx path then reads them with lora_expand4, touching no
padded rank column; without it sx reads B [S, N, R] and, for ranks above 16, keeps the expand after
the GEMM (EV 1: tma.SX_SIDE_EXPAND_MAX_RANK):

| entry point | rows | kernel | × cuBLAS base |
| --- | --- | --- | ---: |
| lora_linear | 1-8 | wgmma ring ("wg", 64, 2, 8, 12, 0), PDL | 0.92-0.95 (TMA ring 0.94-0.96) |
| lora_linear | 1-8, rank 49-64 | lora_wgt ("wgt", 64, 2, 1, 8, 12, 4, 1): t once per launch (DEFAULT_HIGH_RANK) | 0.96-1.13 at rank 64 (wgmma ring 1.01-1.44) |
| lora_linear | 17-32, rank 49-64 | lora_wgt ("wgt", 64, 2, 1, 32, 12, 4, 1) | 1.39-1.50 at rank 64 (was: the Triton kernel raised; torch ops 2.10-2.11) |
| lora_linear | 9-16 | TMA ring ("tma", 64, 1, 2, 16, 12, 0, 1) | 1.00 |
| lora_linear | 17-32 | TMA ring, MB 32 | 1.14-1.17 (Triton 1.20) |
| lora_linear | 33-64 | None: triton_lora's split-K kernel | 1.44-1.48 (wgmma ring 1.62) |
| lora_linear | 65-128, rank ≤ 16 | cuBLAS + lora_shrink + lora_expand2 ("sx", 32, 128, 0, 1) | 1.68-1.75 (torch ops 1.76-1.98) |
| lora_linear | 65-128, rank > 16; 129 and more | cuBLAS alone ("cx": t, s·t·Bᵀ into y, y += x·Wᵀ) | 1.68 at 128 rows r64; 1.58-1.84 at 129-256, 1.45-1.51 at 512, 1.29-1.35 at 1024, 1.19-1.26 at 2048, 1.18-1.25 at 4096 (torch ops 1.31-1.75) |
| lora_bank_linear | 1-8 | lora_stream (1, 1, 8, 1, 2, 0) | 1.02-1.06 |
| lora_bank_linear | 9-16 | lora_stream_cl ("cl", 1, 4, 2, 4, 8, 0); with b_bank_t and ranks above 16 ("sx", 32, 128, 1, 3) (DEFAULT_BANK_T_WIDE) | 1.32-1.37 r16; 8/16/64 1.39-1.43 (cluster kernel 1.54-1.55) |
| lora_bank_linear | 17-32 | ("sx", 32, 128, 1, 3): shrink, then the expand into an f32 buffer, on a side stream beside cuBLAS; lora_add after the join | 1.36-1.44 r16, 1.28-1.30 r8; 8/16/64 1.54-1.61 with b_bank_t (EV 1 without: 1.81-1.88) |
| lora_bank_linear | 33-64 | ("sx", 32, 128, 1, 3) | 1.66-1.74 r16, 1.48-1.52 r8; 8/16/64 2.27-2.30 with b_bank_t (EV 1 without: 2.54-2.57) |
| both | beyond | None: the caller's fallback (torch ops, the generated SGMV kernels) | - |

`lora_bank_linear_set` (2-4 bank linears of one input, e.g. a layer's q, k and v) takes the rows
whose every member's entry above is ("sx", 32, 128, 1, 3) with b_bank_t: the members' base GEMMs in
a row beside one lora_shrink_set and one lora_expand4_set, lora_add_set after the join (64 rows of
8/16/64: q/k/v 1.80x their base GEMMs against 2.04x one by one; gate/up 1.65-1.69x against
1.67-1.72x; bench/gpu/bankset.py, 2026-12-02 ~04:26-04:55 UTC); elsewhere it declines.

The TMA ring's bank path (producer blocks) is never taken (tma.shippable): it computed wrong sums
when two of its blocks shared an SM (now prevented) and is behind the cluster kernel in the decode.
Without an sm_90 GPU, cupy or libcuda the TMA, wg and sx rows return None too, and the callers
fall back (Triton split-K, torch ops); a configuration NVRTC cannot build is switched off for the
process (tma._FAILED) and falls back the same way."""

import os
import time

import torch

from . import big as _big
from . import tma as _tma

MAX_ROWS = 256
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lora_stream.cu")

# rows bucket (8·MT) -> configuration; bench/gpu/splitk.py sweeps the alternatives.
DEFAULT = {
    8: ("wg", 64, 2, 8, 12, 0),
    16: ("tma", 64, 1, 2, 16, 12, 0, 1),
    32: ("tma", 64, 1, 2, 32, 12, 0, 1),
    128: ("sx", 32, 128, 0, 1),
}

# one adapter of rank >= HIGH_RANK_MIN: per row bucket, the entry that replaces DEFAULT's. lora_wgt
# computes t once per launch, where lora_wg and lora_tma carry A's rows (the rank padded to 16) in
# every ring stage of every cluster: ranks 49-64 pad to 64 rows, 8 KB beside each 8 KB of W, and at
# 17-32 rows the TMA ring's 12 stages do not fit them at all (the Triton kernel after it then raises:
# it asks for 256 KB of shared memory). Measured at rank 64 (bench/results/gpu-kernels.md, session
# gpuk5); at rank 32 lora_wgt was level at 1 row and behind the TMA ring at 9-32 rows, so below 49
# the tables above apply.
HIGH_RANK_MIN = 49
DEFAULT_HIGH_RANK = {
    8: ("wgt", 64, 2, 1, 8, 12, 4, 1),
    32: ("wgt", 64, 2, 1, 32, 12, 4, 1),
}

# one adapter: what a row bucket whose DEFAULT entry is a lora_wgt ("wgt", ...) takes for a weight
# that no K split of it fits into one wave (more row tiles than SMs, e.g. N = 14336 at RT 64)
WGT_FALLBACK = {
    8: ("wg", 64, 2, 8, 12, 0),
    16: ("tma", 64, 1, 2, 16, 12, 0, 1),
    32: ("tma", 64, 1, 2, 32, 12, 0, 1),
}

# one adapter at 65-128 rows: "sx" reads A row by row (its shrink), which loses beyond rank 16
# (128 rows, r64: 51-54 µs against cuBLAS alone's 26.8); above this rank those rows take "cx"
SX_SINGLE_MAX_RANK = 16

# one adapter beyond 128 rows (compute-bound): (least rows, configuration), the last that applies wins
BIG_DEFAULT = [
    (129, ("cx",)),
]

DEFAULT_BANK = {
    8: (1, 1, 8, 1, 2, 0),
    16: ("cl", 1, 4, 2, 4, 8, 0),
    32: ("sx", 32, 128, 1, 3),
    64: ("sx", 32, 128, 1, 3),
}

# banks whose factors also come stored [S, R, N] (lora_bank_linear's b_bank_t) and whose widest rank
# is above tma.SX_SIDE_EXPAND_MAX_RANK: at 9-16 rows the side-stream sx path, not the cluster kernel
# (64 adapters of ranks 8/16/64 at 16 rows: 1.41x cuBLAS base against 1.55x; r16 stays with the
# cluster kernel, 1.38x against 1.44x)
DEFAULT_BANK_T_WIDE = {
    16: ("sx", 32, 128, 1, 3),
}

_CUPY = None
_FUNCS = {}
_STATE = {}
_CONSTS = {}
_STREAMS = {}
_SMEM = {}


def _cupy():
    global _CUPY
    if _CUPY is None:
        try:
            import cupy  # noqa: PLC0415 - optional, GPU hosts only

            _CUPY = cupy
        except Exception:  # noqa: BLE001 - no cupy: no CUDA kernel
            _CUPY = False
    return _CUPY


def available():
    """True when the kernel can be built and launched here (cupy importable, a CUDA device)."""
    return bool(_cupy()) and torch.cuda.is_available()


def is_cluster(cfg):
    return cfg[0] == "cl"


def _ints(cfg):
    """The template arguments (and the W load flavour last) of a configuration."""
    return tuple(cfg[1:]) if is_cluster(cfg) else tuple(cfg)


def mangled(cfg):
    t = _ints(cfg)[:5]
    name = "14lora_stream_cl" if is_cluster(cfg) else "11lora_stream"
    return "_Z%sILi%dELi%dELi%dELi%dELi%dEEvPKtS1_S1_S1_PtPfPiPKiS6_PKfiiiiiiii" % ((name,) + t)


def instantiation(cfg):
    return "%s<%d,%d,%d,%d,%d>" % (("lora_stream_cl" if is_cluster(cfg) else "lora_stream",) + _ints(cfg)[:5])


def explicit_instantiations(cfgs):
    """C++ explicit instantiations of `cfgs` (for an nvcc-built cubin)."""
    sig = "(const bf16_t*, const bf16_t*, const bf16_t*, const bf16_t*, bf16_t*, float*, int*, const int*, const int*, const float*, int, int, int, int, int, int, int, int)"
    names = sorted(set(instantiation(c) for c in cfgs))
    return "".join("template __global__ void %s%s;\n" % (n, sig) for n in names)


def function(cfg):
    """The launchable kernel of a configuration (compiled once per process)."""
    cfg = tuple(cfg)
    f = _FUNCS.get(cfg)
    if f is None:
        cp = _cupy()
        ldw = _ints(cfg)[5]
        cubin = os.environ.get("STAGEML_STREAM_CUBIN_%d" % ldw) or (os.environ.get("STAGEML_STREAM_CUBIN") if ldw == 0 else None)
        f = None
        if cubin and os.path.exists(cubin):
            try:
                f = cp.RawModule(path=cubin).get_function(mangled(cfg))
            except Exception:  # noqa: BLE001 - not in that cubin: compile it
                f = None
        if f is None:
            t0 = time.perf_counter()
            with open(_SRC) as fh:
                src = "#define LDW_VARIANT %d\n" % ldw + fh.read()
            # cupy keeps what it compiles in its own disk cache (~/.cupy/kernel_cache)
            mod = cp.RawModule(code=src, options=("-std=c++17",), name_expressions=[instantiation(cfg)])
            f = mod.get_function(instantiation(cfg))
            _tma.BUILDS["builds"] += 1
            _tma.BUILDS["us"] += int((time.perf_counter() - t0) * 1e6)
        _FUNCS[cfg] = f
    return f


def _bucket(m):
    b = 8
    while b < m:
        b *= 2
    return b


def _load_overrides():
    """STAGEML_STREAM_CONFIGS: a JSON file {"single": {bucket: cfg}, "bank": {bucket: cfg},
    "single_high_rank": {bucket: cfg}, "bank_t_wide": {bucket: cfg}} (written by bench/gpu/splitk.py --write-configs or
    bench/gpu/wgt.py) replacing the built-in tables' entries."""
    path = os.environ.get("STAGEML_STREAM_CONFIGS")
    if not path or not os.path.exists(path):
        return
    import json  # noqa: PLC0415

    with open(path) as fh:
        data = json.load(fh)
    for table, dest in (("single", DEFAULT), ("bank", DEFAULT_BANK), ("single_high_rank", DEFAULT_HIGH_RANK), ("bank_t_wide", DEFAULT_BANK_T_WIDE)):
        for bucket, cfg in data.get(table, {}).items():
            dest[int(bucket)] = tuple(cfg) if cfg is not None else None


def config_for(m, bank=False, rank=0, bank_t=False):
    """The configuration for m rows of an adapter of rank `rank` (None: the kernel is not the fastest
    choice there); one adapter above HIGH_RANK_MIN - 1 takes DEFAULT_HIGH_RANK's entry where it has one,
    a bank passing b_bank_t (bank_t) with ranks above tma.SX_SIDE_EXPAND_MAX_RANK DEFAULT_BANK_T_WIDE's."""
    if not bank and m > 128:
        cfg = None
        for lo, c in BIG_DEFAULT:
            if m >= lo:
                cfg = c
        return cfg
    if not bank and rank >= HIGH_RANK_MIN and _bucket(m) in DEFAULT_HIGH_RANK:
        return DEFAULT_HIGH_RANK[_bucket(m)]
    if bank and bank_t and rank > _tma.SX_SIDE_EXPAND_MAX_RANK and _bucket(m) in DEFAULT_BANK_T_WIDE:
        return DEFAULT_BANK_T_WIDE[_bucket(m)]
    return (DEFAULT_BANK if bank else DEFAULT).get(_bucket(m))


def _pick(m, n, k, rmax, bank, cfg, bank_t=False):
    """The configuration a call runs: `cfg` as given, else the table's for m rows (a TMA one with its
    K split re-picked for [n, k], and only where that family can run here); None: no kernel."""
    if cfg is not None:
        return tuple(cfg)
    cfg = config_for(m, bank, rmax, bank_t)
    if cfg is None:
        return None
    if _tma.is_wgt(cfg):
        if bank or not _tma.available():
            return None
        a = _tma.wgt_adapt(cfg, n, k)
        if a is not None and a not in _tma._FAILED:
            return a
        cfg = WGT_FALLBACK.get(_bucket(m))  # no split of this weight fits one wave: the ring before lora_wgt
        if cfg is None:
            return None
    if _tma.is_tma(cfg):
        if not _tma.shippable(cfg, bank) or not _tma.available():
            return None  # an override naming the bank path measured wrong: not taken
        return _tma.adapt(cfg, n, k, rmax)
    if _tma.is_sx(cfg):
        if not bank and rmax > SX_SINGLE_MAX_RANK:
            return ("cx",)
        return cfg if _tma.available() and cfg not in _tma._FAILED else None
    if _big.is_big(cfg):
        return cfg if _tma.available() and not bank and cfg not in _big._FAILED else None
    if _big.is_cx(cfg):
        return None if bank else cfg
    if _tma.is_wg(cfg):
        if not _tma.available():
            return None
        cfg = _tma.wg_adapt(cfg, n, k)
        return None if cfg is None or cfg in _tma._FAILED else cfg
    return cfg


def _suits(cfg, m, n, k, rmax, bank):
    if _tma.is_wgt(cfg):
        _tma.check_wgt(cfg)
        return not bank and _tma.available() and _tma.wgt_suits(cfg, m, n, k, rmax)
    if _tma.is_tma(cfg):
        _tma.check_cfg(cfg)
        return _tma.available() and _tma.suits(cfg, m, n, k, rmax, bank)
    if _tma.is_sx(cfg):
        _tma.check_sx(cfg)
        return _tma.available() and _tma.sx_suits(cfg, m, n, k, rmax)
    if _big.is_big(cfg):
        _big.check_big(cfg)
        return not bank and _tma.available() and _big.suits(cfg, m, n, k, rmax)
    if _big.is_cx(cfg):
        _big.check_cx(cfg)
        return not bank and m > 0
    if _tma.is_wg(cfg):
        _tma.check_wg(cfg)
        return _tma.available() and _tma.wg_suits(cfg, m, n, k, rmax, bank)
    return suits(cfg, m, n, k, rmax)


def _run(cfg, x2, w, a, b, y, slots, ranks, scales, rmax, piece_rows, bank, scales_host=None, bt=None):
    """Launches cfg; None when the TMA family cannot be built or launched here (the family is then
    switched off for the process and the caller falls back; nothing was written)."""
    if _tma.is_sx(cfg):
        try:
            _tma.sx_function(cfg)
            if bt is not None and _tma.sx_ev(cfg) >= 2:
                _tma._expand4_fn(rmax, 1 if _tma.sx_ev(cfg) == 3 else 0)
        except Exception:  # noqa: BLE001 - NVRTC or the module load failed: this configuration falls back
            _tma._FAILED.add(tuple(cfg))
            return None
        return _tma.sx_launch(cfg, x2, w, a, b, y, slots, ranks, scales, rmax, bt=bt)
    if _big.is_cx(cfg):
        return _big.cx_launch(x2, w, a, b, y, float(scales_host[0]))
    if _big.is_big(cfg):
        try:
            _big.function(_big.rank_pad(rmax), cfg[4], cfg[5], cfg[6], 0 if cfg[1] == 0 else 1, cfg[7])
            if cfg[1] == 2:
                _big.function(_big.rank_pad(rmax), cfg[4], cfg[5], cfg[6], 0, cfg[7])
        except Exception:  # noqa: BLE001 - NVRTC or the module load failed: this configuration falls back
            _big._FAILED.add(tuple(cfg))
            return None
        return _big.launch(cfg, x2, w, a, b, y, float(scales_host[0]))
    if _tma.is_wgt(cfg):
        try:
            _tma.wgt_function(cfg)
        except Exception:  # noqa: BLE001 - NVRTC (sm_90a) or the module load failed: this configuration falls back
            _tma._FAILED.add(tuple(cfg))
            return None
        return _tma.wgt_launch(cfg, x2, w, a, b, y, scales, rmax)
    if _tma.is_wg(cfg):
        try:
            _tma.wg_function(cfg, rmax)
        except Exception:  # noqa: BLE001 - NVRTC (sm_90a) or the module load failed: this configuration falls back
            _tma._FAILED.add(tuple(cfg))
            return None
        return _tma.wg_launch(cfg, x2, w, a, b, y, slots, ranks, scales, rmax)
    if _tma.is_tma(cfg):
        t_acc, sync = _state(x2.device, torch.cuda.current_stream(x2.device).cuda_stream, rmax)
        try:
            _tma.function(cfg, _tma.fused_rows(rmax, bank), 1 if _tma.PRETILE[0] else 0)
        except Exception:  # noqa: BLE001 - NVRTC or the module load failed: fall back
            _tma._AVAIL[0] = False
            return None
        return _tma.launch(cfg, x2, w, a, b, y, slots, ranks, scales, rmax, piece_rows, t_acc, sync, bank)
    return launch(cfg, x2, w, a, b, y, slots, ranks, scales, rmax, piece_rows)


def _shape(cfg):
    """(rows per block group, warps per block, mt, K splits, unroll, cluster size)."""
    if is_cluster(cfg):
        wr, rg, mt, unr, cl = cfg[1:6]
        return 16 * wr * rg, rg, mt, cl, unr, cl
    wr, rg, kw, mt, unr = cfg[:5]
    return 16 * wr * rg, rg * kw, mt, kw, unr, 1


def suits(cfg, m, n, k, rmax):
    rows, nw, mt, splits, unr, cl = _shape(cfg)
    return (0 < m <= 8 * mt and m <= MAX_ROWS and n % rows == 0 and k % (splits * 64 * unr) == 0 and k % (nw * 64) == 0
            and rows % cl == 0 and rmax % 8 == 0 and 0 < rmax <= 128)


def _kch(pieces, k, nw):
    """K chunks per producer piece: about 64-128 producer blocks, each warp ≥ 64 K."""
    kch = 1
    while kch < 16 and pieces * kch * 2 <= 128 and k % (kch * 2 * nw * 64) == 0:
        kch *= 2
    return kch


def _state(device, stream, rmax):
    key = (str(device), stream, rmax)
    st = _STATE.get(key)
    if st is None:
        st = (torch.zeros((MAX_ROWS * rmax,), device=device, dtype=torch.float32), torch.zeros((2,), device=device, dtype=torch.int32))
        _STATE[key] = st
    return st


def _consts(rank, scale, device):
    key = (int(rank), float(scale), str(device))
    c = _CONSTS.get(key)
    if c is None:
        # Filled on the device (a copy from the host is refused inside a CUDA graph's capture);
        # one made while capturing is the graph's own (its fill replays with it), not kept.
        c = (torch.full((1,), int(rank), device=device, dtype=torch.int32), torch.full((1,), float(scale), device=device, dtype=torch.float32))
        if not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            _CONSTS[key] = c
    return c


def _ext_stream(ptr):
    s = _STREAMS.get(ptr)
    if s is None:
        s = _cupy().cuda.ExternalStream(ptr)
        _STREAMS[ptr] = s
    return s


def launch(cfg, x2, w, a, b, y, slots, ranks, scales, rmax, piece_rows):
    """One launch: x2 [M, K], w [N, K], a [S, rmax, K], b [S, N, rmax], y [M, N] (written),
    slots [M] int32 or None (every row adapter 0), ranks [S] int32, scales [S] f32."""
    import numpy as np  # noqa: PLC0415

    m, k = x2.shape
    n = w.shape[0]
    rows, nw, mt, splits, unr, cl = _shape(cfg)
    pieces = -(-m // piece_rows)
    kch = _kch(pieces, k, nw)
    n_cons = n // rows * cl
    n_prod = -(-(pieces * kch) // cl) * cl
    stream = torch.cuda.current_stream(x2.device).cuda_stream
    t_acc, sync = _state(x2.device, stream, rmax)
    smem = (rows * 8 * mt + m * rmax) * 4
    cfg = tuple(cfg)
    f = function(cfg)
    if smem > 40 * 1024 and _SMEM.get(cfg, 0) < smem:
        f.max_dynamic_shared_size_bytes = smem
        _SMEM[cfg] = smem
    p = _ptr if _MODE[0] == "np" else _ptr_cupy
    args = (p(x2), p(w), p(a), p(b), p(y), p(t_acc), p(sync), p(slots), p(ranks), p(scales),
            np.int32(m), np.int32(n), np.int32(k), np.int32(rmax), np.int32(piece_rows), np.int32(pieces), np.int32(kch), np.int32(n_cons))
    with _ext_stream(stream):
        try:
            f((n_prod + n_cons,), (32 * nw,), args, shared_mem=smem)
        except TypeError:
            if _MODE[0] != "np":
                raise
            # This cupy takes no numpy scalars for pointers: pass the tensors as cupy arrays.
            _MODE[0] = "cupy"
            return launch(cfg, x2, w, a, b, y, slots, ranks, scales, rmax, piece_rows)
    return y


_MODE = ["np"]


def _ptr(t):
    import numpy as np  # noqa: PLC0415

    return np.uint64(t.data_ptr() if t is not None else 0)


def _ptr_cupy(t):
    if t is None:
        return _ptr(None)
    v = t.view(torch.int16) if t.element_size() == 2 else t
    return _cupy().asarray(v)


def _ok(*ts):
    return all(t.is_cuda and t.is_contiguous() and t.data_ptr() % 16 == 0 for t in ts)


def lora_linear(x, w, a, b, scale, cfg=None, out=None):
    """y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ through the kernel, or None when it does not suit."""
    if not available() or x.dtype != torch.bfloat16 or not (w.dtype == a.dtype == b.dtype == x.dtype):
        return None
    n, k = w.shape
    rank = a.shape[0]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    cfg = _pick(m, n, k, rank, False, cfg)
    if cfg is None or b.shape != (n, rank) or a.shape != (rank, k) or not _suits(cfg, m, n, k, rank, False):
        return None
    x2 = x2.contiguous()
    if not _ok(x2, w, a, b):
        return None
    ranks, scales = _consts(rank, scale, x.device)
    y = out if out is not None else torch.empty((m, n), device=x.device, dtype=x.dtype)
    if _run(cfg, x2, w, a, b, y, None, ranks, scales, rank, 8, False, (float(scale),)) is None:
        return None
    return y.reshape(*x.shape[:-1], n)


def lora_bank_linear(x, w, a_bank, b_bank, slots, ranks, scales, cfg=None, out=None, b_bank_t=None):
    """y = x·Wᵀ + scales[j]·(x·A_jᵀ)·B_jᵀ, j = slots[row] (−1: no adapter), or None when the kernel
    does not suit. a_bank [S, R, K], b_bank [S, N, R], ranks [S] int32 multiples of 8 ≤ R.
    b_bank_t: optionally the same factors stored [S, R, N] (contiguous: b_bank.transpose(1, 2)
    copied), which the 17-64-row path reads without touching any padded rank column (lora_expand4;
    ranks 8/16/64 at 64 rows: 2.29x cuBLAS base against 2.54x from b_bank alone); the fused
    kernels at ≤ 16 rows read b_bank. It costs a second copy of B; a wrong shape or dtype declines."""
    if not available() or x.dtype != torch.bfloat16 or not (w.dtype == a_bank.dtype == b_bank.dtype == x.dtype):
        return None
    n, k = w.shape
    if a_bank.dim() != 3 or b_bank.dim() != 3:
        return None
    s_, rmax, ka = a_bank.shape
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    cfg = _pick(m, n, k, rmax, True, cfg, b_bank_t is not None)
    if (cfg is None or ka != k or b_bank.shape != (s_, n, rmax) or slots.shape != (m,) or ranks.shape != (s_,) or scales.shape != (s_,)
            or slots.dtype != torch.int32 or ranks.dtype != torch.int32 or scales.dtype != torch.float32 or not _suits(cfg, m, n, k, rmax, True)):
        return None
    x2 = x2.contiguous()
    if not _ok(x2, w, a_bank, b_bank, slots, ranks, scales):
        return None
    if b_bank_t is not None and (b_bank_t.shape != (s_, rmax, n) or b_bank_t.dtype != x.dtype or not _ok(b_bank_t)):
        return None
    y = out if out is not None else torch.empty((m, n), device=x.device, dtype=x.dtype)
    if _run(cfg, x2, w, a_bank, b_bank, y, slots, ranks, scales, rmax, 1, True, bt=b_bank_t) is None:
        return None
    return y.reshape(*x.shape[:-1], n)


def lora_bank_linear_set(x, items, slots, cfg=None):
    """Several bank linears of one input x and one row→slot map at once (a layer's q, k and v; its
    gate and up): items are (w, a_bank, b_bank, ranks, scales, b_bank_t) as `lora_bank_linear` takes
    them, 2 to `tma.SET_MAX` of them, each with b_bank_t; cfg: the sx configuration for them all
    instead of the dispatch table's (benches). Returns their outputs, or None when the
    set path does not suit (then nothing ran: call `lora_bank_linear` for each). It suits where every
    item's dispatch is the side-stream sx path (EV 3 reading b_bank_t): the base GEMMs run one after
    the other on the caller's stream while one shrink and one expand for the whole set run beside
    them, and one add folds the terms in after the join (`tma.sx_launch_set`)."""
    if not available() or not 2 <= len(items) <= _tma.SET_MAX or x.dtype != torch.bfloat16 or slots is None:
        return None
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if slots.shape != (m,) or slots.dtype != torch.int32:
        return None
    want = tuple(cfg) if cfg is not None else None
    cfg = None
    run = []
    for w, a_bank, b_bank, ranks, scales, b_bank_t in items:
        if b_bank_t is None or a_bank.dim() != 3 or b_bank.dim() != 3 or not (w.dtype == a_bank.dtype == b_bank.dtype == b_bank_t.dtype == x.dtype):
            return None
        n, kw = w.shape
        s_, rmax, ka = a_bank.shape
        c = _pick(m, n, k, rmax, True, want, True)
        if (c is None or not _tma.is_sx(c) or _tma.sx_ev(c) != 3 or (cfg is not None and c[:2] != cfg[:2]) or kw != k or ka != k or n % 8 != 0
                or b_bank.shape != (s_, n, rmax) or b_bank_t.shape != (s_, rmax, n) or ranks.shape != (s_,) or scales.shape != (s_,)
                or ranks.dtype != torch.int32 or scales.dtype != torch.float32 or not _suits(c, m, n, k, rmax, True)):
            return None
        cfg = c
        run.append((w, a_bank, b_bank_t, ranks, scales, rmax))
    x2 = x2.contiguous()
    if not _ok(x2, slots, *[t for it in run for t in it[:5]]):
        return None
    if ("set",) + tuple(cfg) in _tma._FAILED:
        return None
    try:
        _tma.set_function(cfg, max(it[5] for it in run))
    except Exception:  # noqa: BLE001 - NVRTC or the module load failed: the set path is off, each item runs alone
        _tma._FAILED.add(("set",) + tuple(cfg))
        return None
    ys = [torch.empty((m, w.shape[0]), device=x.device, dtype=x.dtype) for w, *_ in run]
    _tma.sx_launch_set(cfg, x2, [(w, a, bt, y, r, sc, rmax) for (w, a, bt, r, sc, rmax), y in zip(run, ys)], slots)
    return [y.reshape(*x.shape[:-1], y.shape[1]) for y in ys]


_load_overrides()


#: Rows a bank step can run through the kernels, one per row bucket of the dispatch tables
#: (`_bucket`: 8, 16, 32, 64 — bank.MAX_ROWS).
WARM_ROWS = (8, 16, 32, 64)


def warm_bank(device, sets, rows=WARM_ROWS):
    """Builds and loads, before a program's first run, every kernel its bank linears can reach at
    `rows` rows, so that no step of a serving batch pays a build (NVRTC compiles a configuration at
    its first launch: seconds for the side-stream path's kernels). `sets` lists the program's bank
    linears by input: [(k, [(n, rmax), ...]), ...] — a set of 2 to tma.SET_MAX members runs as
    `lora_bank_linear_set` would, one member alone as `lora_bank_linear`. The sx kernels are built
    first in one NVRTC program (the source parsed once), then each bucket's call runs once on
    zero-filled stand-ins of the real shapes (one slot of the widest rank) and the device is
    synchronised. Returns the number of (input, rows) runs made; 0 when the kernels are not available."""
    if not available():
        return 0
    names = []
    for k, members in sets:
        for m in rows:
            cfgs = [_pick(m, n, k, rmax, True, None, True) for n, rmax in members]
            for (n, rmax), c in zip(members, cfgs):
                if c is not None and _tma.is_sx(c) and _suits(c, m, n, k, rmax, True):
                    names.extend(_tma.sx_kernel_names(c, rmax, True))
            if 2 <= len(members) <= _tma.SET_MAX and all(c is not None and _tma.is_sx(c) and _tma.sx_ev(c) == 3 for c in cfgs):
                names.extend(_tma.set_kernel_names(cfgs[0], max(r for _, r in members)))
    if names:
        try:
            _tma.prebuild(list(dict.fromkeys(names)))
        except Exception:  # noqa: BLE001 - left to each configuration's first launch, which falls back as it does today
            pass
    calls = 0
    bf = torch.bfloat16
    with torch.no_grad():
        for k, members in sets:
            items = []
            for n, rmax in members:
                items.append((torch.zeros((n, k), device=device, dtype=bf), torch.zeros((1, rmax, k), device=device, dtype=bf),
                              torch.zeros((1, n, rmax), device=device, dtype=bf), torch.full((1,), rmax, device=device, dtype=torch.int32),
                              torch.ones(1, device=device, dtype=torch.float32), torch.zeros((1, rmax, n), device=device, dtype=bf)))
            for m in rows:
                x = torch.zeros((m, 1, k), device=device, dtype=bf)
                slots = torch.zeros(m, device=device, dtype=torch.int32)
                calls += 1
                if 2 <= len(items) <= _tma.SET_MAX and lora_bank_linear_set(x, items, slots) is not None:
                    continue
                for w, a, b, ranks, scales, bt in items:
                    lora_bank_linear(x, w, a, b, slots, ranks, scales, b_bank_t=bt)
            del items
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    return calls
