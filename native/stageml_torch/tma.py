"""Host side of the TMA-ring fused base + LoRA kernel (`lora_tma.cu`), bf16, sm_90 (Hopper).

A configuration is ("tma", RT, BPS, KS, MB, ST, PB, WR): RT rows of W per cluster, BPS 64-wide K
boxes per ring stage, KS blocks per cluster splitting K, MB batch rows (a multiple of 8, M ≤ MB), ST
ring stages, PB producer blocks (a bank's LoRA shrink; 0: the SMs the consumers leave free, at
least 4), WR 16-row W tiles per consumer warp (7-tuples mean WR = 1). One adapter needs no
producers: its A rows (rank padded to 16, FA ≤ 64) ride in the ring. `adapt` re-picks KS for
weights other than the 4096² one the tables were measured on.

Three more families live here (sections below): `lora_wg`, the same ring with wgmma consumers
(("wg", ...), sm_90a), `lora_wgt` (("wgt", ...): one adapter, t = x·Aᵀ once per launch instead of
A's rows in every ring stage, K optionally split across clusters too), and ("sx", ...): cuBLAS's
base GEMM between `lora_shrink` and `lora_expand`. What ships (stream.DEFAULT / DEFAULT_BANK /
DEFAULT_HIGH_RANK): lora_wg at 1-8 rows (lora_wgt there, and at 17-32 rows, for ranks 49-64) and
this kernel at 9-32 rows of one adapter; sx at 65-128 rows of one adapter and 17-64 rows of a bank. The bank path (producer blocks, FA = 0) gave
wrong results when two blocks shared an SM (bench/results/gpu-kernels.md; `ONE_PER_SM` now
prevents that), so `shippable` keeps it out of every table and override; the bench measures it.

The kernel takes three tensor maps (W, x, A; 128-byte swizzle) by value, which cupy's launcher
cannot pass, so the launch goes through the driver API with ctypes (`cuTensorMapEncodeTiled`,
`cuLaunchKernelEx` with programmatic dependent launch into a CUDA-graph capture unless
STAGEML_TMA_PDL=0, else `cuLaunchKernel`). The module comes from the cubins named by `STAGEML_TMA_CUBIN` (colon-separated;
bench/gpu/build_tma.py builds them with nvcc for sm_90a), else NVRTC through cupy compiles the
configuration at first use. Without cupy, libcuda or an sm_90 GPU `available()` is False and
stream.py never picks the family. A failed driver call raises `WorkerError` (RT_EVAL_FAILED, naming
the call and its CUresult); a malformed configuration `WorkerError` (RT_BAD_VALUE)."""

import ctypes
import hashlib
import json
import os
import tempfile
import time

import torch

from . import errors
from .errors import WorkerError

MAX_ROWS = 256
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lora_tma.cu")
SMS = 132  # H200/H100 SXM; replaced by the device's count at first launch


class KernelError(WorkerError):
    """A driver call of the TMA kernel failed (the message names which, with its CUresult)."""

    def __init__(self, message):
        super().__init__(errors.EVAL, message)


_LIB = [None]
_FUNCS = {}
_MODULES = {}
_SMEM = {}
_WMAPS = {}
_XMAPS = {}
_AVAIL = [None]


# What bench/gpu/splitk.py --sweep tma measures per row bucket: (RT, BPS, KS, ST, PB, WR); 128
# consumer blocks at N = K = 4096 (one per SM), ring depth, stage size and W tiles per warp varied.
SWEEP_SMALL = [(64, 1, 2, 8, 0, 1), (64, 1, 2, 12, 0, 1), (64, 1, 2, 10, 0, 1), (128, 1, 4, 8, 0, 1), (128, 1, 4, 6, 0, 1),
               (128, 2, 4, 4, 0, 1), (256, 1, 8, 4, 0, 2), (32, 1, 1, 12, 0, 1)]
SWEEP_BIG = [(64, 1, 2, 6, 0, 1), (128, 1, 4, 4, 0, 1)]
# Banks (FA = 0, producer blocks for the shrink): measured for the record, never shipped (shippable).
SWEEP_BANK_PB = [(64, 2, 2, 3, 64, 1), (64, 1, 2, 8, 64, 1)]


def bucket(m):
    """Batch rows padded to the kernel's MB: 8, 16, 32, ... 256."""
    mb = 8
    while mb < m:
        mb *= 2
    return mb


def sweep(m, bank=False):
    """The configurations the bench measures at m rows (all fitting the shared memory at rank 64)."""
    mb = bucket(m)
    base = SWEEP_SMALL if mb <= 64 else SWEEP_BIG
    if bank and m >= 16:
        out = [("tma", rt, bps, ks, mb, stg if mb <= 64 else 3, pb, wr) for rt, bps, ks, stg, pb, wr in SWEEP_BANK_PB]
    else:
        out = [("tma", rt, bps, ks, mb, stg, pb, wr) for rt, bps, ks, stg, pb, wr in base]
    fa = 0 if bank else 16
    return [c for c in out if smem_bytes(c, mb, 64 if bank else 16, fa) <= 227 * 1024 and fits_registers(c, fa)]


def shippable(cfg, bank):
    """False for banks (FA = 0: producer blocks). That path gave wrong results when two of its
    blocks shared an SM (before ONE_PER_SM); at one block per SM it checked right, but with its
    64 producer blocks then not co-resident it was not measured for speed again, and in the 8B
    decode step it was behind the cluster stream kernel, so no table or override selects it."""
    return not bank


def is_tma(cfg):
    return cfg is not None and len(cfg) > 0 and cfg[0] == "tma"


def check_cfg(cfg):
    """Validates a configuration tuple; raises WorkerError (RT_BAD_VALUE) naming what is wrong."""
    if not is_tma(cfg) or len(cfg) not in (7, 8) or not all(isinstance(v, int) for v in cfg[1:]):
        raise WorkerError(errors.BAD_VALUE, "tma config must be ('tma', RT, BPS, KS, MB, ST, PB[, WR]) with integers, got %r" % (cfg,))
    _, rt, bps, ks, mb, stg, pb, wr = norm(cfg)
    if wr not in (1, 2, 4) or rt % (16 * wr) != 0:
        raise WorkerError(errors.BAD_VALUE, "tma config %r: WR in 1/2/4, RT a multiple of 16 WR" % (cfg,))
    if rt not in (16, 32, 64, 128, 256) or bps not in (1, 2, 4, 8) or ks not in (1, 2, 4, 8) or rt % ks != 0:
        raise WorkerError(errors.BAD_VALUE, "tma config %r: RT in 16..256 (power of 2), BPS and KS in 1/2/4/8, KS dividing RT" % (cfg,))
    if mb % 8 != 0 or not 8 <= mb <= MAX_ROWS or not 2 <= stg <= 12 or pb < 0:
        raise WorkerError(errors.BAD_VALUE, "tma config %r: MB a multiple of 8 in 8..256, ST in 2..12, PB >= 0" % (cfg,))
    if consumer_warps(cfg, 0) > 16:
        raise WorkerError(errors.BAD_VALUE, "tma config %r: at most 16 W warps (RT / 16 / WR * BPS)" % (cfg,))
    return cfg


def fused_rows(rank, bank):
    """FA, the A rows a one-adapter launch carries in its ring (rank padded to 16; ≤ 64), or 0: the
    producer blocks compute t (banks, larger ranks)."""
    if bank or rank > 64:
        return 0
    return -(-rank // 16) * 16


def norm(cfg):
    """A configuration with its WR (default 1) spelled out: ("tma", RT, BPS, KS, MB, ST, PB, WR)."""
    cfg = tuple(cfg)
    return cfg + (1,) if len(cfg) == 7 else cfg


def consumer_warps(cfg, fa=0):
    _, rt, bps, ks, mb, stg, pb, wr = norm(cfg)
    return (rt // 16 // wr + fa // 16) * bps


def fits_registers(cfg, fa=0):
    """The accumulators (MB / 2 f32 per thread) fit beside the rest without spilling, under the cap
    __launch_bounds__(threads, 1) sets (65536 / threads): nvcc 13.0's report spilled at MB = 256
    with 8 consumer warps and at MB = 128 with 16, not at MB = 256 with 4 or MB = 64 with 16."""
    mb, cw, wr = cfg[4], consumer_warps(cfg, fa), norm(cfg)[7]
    cap = min(255, 65536 // (32 * (cw + 1)))
    return wr * mb // 2 + 64 + (mb // 4 if wr > 1 else 0) <= cap and (wr * mb < 256 or cw <= 4)


# At least this much dynamic shared memory per block, so that no two blocks share an SM (228 KB per
# SM, 1 KB reserved per block): with two per SM some blocks computed wrong base sums (rel. 1-4e-2
# over the rows, bench/gpu/tma_bankdiag.py: wrong with 98 KB, right with the same launch at 117 KB
# and with 132 blocks spread one per SM); the cause inside the SM was not isolated. Blocks of other
# kernels can still share an SM with one of these (the checked launches always followed a fill
# kernel, with PDL on: no wrong result seen), which this does not rule out.
ONE_PER_SM = 115 * 1024


def smem_bytes(cfg, m, rmax, fa=0):
    """Dynamic shared memory of a launch: alignment slack, barriers, then the ring or (after the
    main loop, in the same bytes) the partial sums [RT + FA][MB + 1] and t [M][rmax] in f32;
    never under ONE_PER_SM."""
    _, rt, bps, ks, mb, stg, pb, wr = norm(cfg)
    ring = stg * bps * (rt + fa + mb) * 128
    tail = (rt + fa) * (mb + 1) * 4 + m * rmax * 4
    return max(ONE_PER_SM, 1024 + 1024 + max(ring, tail))


def suits(cfg, m, n, k, rmax, bank=True):
    _, rt, bps, ks, mb, stg, pb, wr = norm(cfg)
    fa = fused_rows(rmax, bank)
    return (0 < m <= mb and n % rt == 0 and k % (ks * 64 * bps) == 0 and k % 64 == 0 and rmax % 8 == 0
            and 0 < rmax <= 128 and smem_bytes(cfg, mb, rmax, fa) <= 227 * 1024 and fits_registers(cfg, fa) and n < 2**31 and k < 2**31)


def adapt(cfg, n, k, rmax=16):
    """The configuration for an [n, k] weight: KS re-picked so that n / RT · KS clusters' blocks
    fill the SMs best (one block per SM), the smallest such KS; None when none suits."""
    _, rt, bps, ks, mb, stg, pb, wr = norm(cfg)
    if n % rt != 0:
        return None
    best = None
    for cand in (1, 2, 4, 8):
        if rt % cand != 0 or k % (cand * 64 * bps) != 0:
            continue
        blocks = n // rt * cand
        waves = -(-blocks // SMS)
        eff = blocks / (waves * SMS)
        key = (round(eff, 3), -cand)
        if best is None or key > best[0]:
            best = (key, cand)
    if best is None:
        return None
    return ("tma", rt, bps, best[1], mb, stg, pb, wr)


def mangled(cfg, fa=0, pre=0):
    _, rt, bps, ks, mb, stg, pb, wr = norm(cfg)
    return "_Z8lora_tmaILi%dELi%dELi%dELi%dELi%dELi%dELi%dELi%dEEv4TMapS0_S0_PKtS2_S2_S2_PtPfPiPKiS7_PKfiiiiiiiii" % (rt, bps, ks, mb, stg, fa, wr, pre)


def instantiation(cfg, fa=0, pre=0):
    _, rt, bps, ks, mb, stg, pb, wr = norm(cfg)
    return "lora_tma<%d,%d,%d,%d,%d,%d,%d,%d>" % (rt, bps, ks, mb, stg, fa, wr, pre)


def explicit_instantiations(cfgs):
    """C++ explicit instantiations of `cfgs`, (cfg, FA) or (cfg, FA, PRE) tuples (for an nvcc-built cubin)."""
    sig = ("(const __grid_constant__ TMap, const __grid_constant__ TMap, const __grid_constant__ TMap, const bf16_t*, const bf16_t*,"
           " const bf16_t*, const bf16_t*, bf16_t*, float*, int*, const int*, const int*, const float*, int, int, int, int, int, int, int, int, int)")
    names = sorted(set(instantiation(*c) for c in cfgs))
    return "".join("template __global__ void %s%s;\n" % (nm, sig) for nm in names)


# -- driver API through ctypes ---------------------------------------------------------------------


def _lib():
    if _LIB[0] is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            _LIB[0] = False
            return False
        u64p = ctypes.POINTER(ctypes.c_uint64)
        u32p = ctypes.POINTER(ctypes.c_uint32)
        lib.cuTensorMapEncodeTiled.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                                               ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                       ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.cuLaunchKernel.restype = ctypes.c_int
        lib.cuLaunchKernelEx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.cuLaunchKernelEx.restype = ctypes.c_int
        lib.cuStreamIsCapturing.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        lib.cuStreamIsCapturing.restype = ctypes.c_int
        lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.cuFuncSetAttribute.restype = ctypes.c_int
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuGetErrorName.restype = ctypes.c_int
        _LIB[0] = lib
    return _LIB[0]


def _check(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        lib = _lib()
        if lib:
            lib.cuGetErrorName(rc, ctypes.byref(name))
        raise KernelError("%s failed: CUresult %d (%s)" % (what, rc, (name.value or b"?").decode()))


class TensorMap(ctypes.Structure):
    _fields_ = [("v", ctypes.c_uint64 * 16)]


def encode_2d(ptr, inner, outer, row_bytes, box_inner, box_outer):
    """A bf16 2-D tensor map (inner dim contiguous), 128-byte swizzle, 256-byte L2 promotion, zero
    fill past the bounds."""
    lib = _lib()
    if not lib:
        raise KernelError("libcuda.so.1 not loadable")
    tm = TensorMap()
    dims = (ctypes.c_uint64 * 2)(inner, outer)
    strides = (ctypes.c_uint64 * 1)(row_bytes)
    box = (ctypes.c_uint32 * 2)(box_inner, box_outer)
    es = (ctypes.c_uint32 * 2)(1, 1)
    # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9, INTERLEAVE_NONE = 0, SWIZZLE_128B = 3, L2_PROMOTION_L2_256B = 3, FLOAT_OOB_FILL_NONE = 0
    _check(lib.cuTensorMapEncodeTiled(ctypes.byref(tm), 9, 2, ctypes.c_void_p(ptr), dims, strides, box, es, 0, 3, 3, 0), "cuTensorMapEncodeTiled")
    return tm


def _wmap(w, rt):
    n, k = w.shape
    key = (w.data_ptr(), n, k, rt)
    tm = _WMAPS.get(key)
    if tm is None:
        if len(_WMAPS) > 4096:
            _WMAPS.clear()
        tm = encode_2d(w.data_ptr(), k, n, k * 2, 64, rt)
        _WMAPS[key] = tm
    return tm


def _xmap(x2, mb):
    m, k = x2.shape
    key = (x2.data_ptr(), m, k, mb)
    tm = _XMAPS.get(key)
    if tm is None:
        if len(_XMAPS) > 4096:
            _XMAPS.clear()
        tm = encode_2d(x2.data_ptr(), k, m, k * 2, 64, mb)
        _XMAPS[key] = tm
    return tm


def available():
    """True when the family can run here: cupy and libcuda load, and the GPU is sm_90."""
    if _AVAIL[0] is None:
        ok = False
        try:
            from . import stream  # noqa: PLC0415

            if stream.available() and _lib():
                ok = torch.cuda.get_device_capability() == (9, 0)
        except Exception:  # noqa: BLE001 - any failure: the family is off
            ok = False
        _AVAIL[0] = ok
    return _AVAIL[0]


def _from_cubins(cp, mangled_name):
    """The kernel `mangled_name` from the first cubin in STAGEML_TMA_CUBIN (':'-separated) holding
    it, or None (then the caller builds it with NVRTC)."""
    for cub in (os.environ.get("STAGEML_TMA_CUBIN") or "").split(":"):
        if not cub or not os.path.exists(cub):
            continue
        mod = _MODULES.get(cub)
        if mod is None:
            mod = _MODULES[cub] = cp.RawModule(path=cub)
        try:
            return mod.get_function(mangled_name)
        except Exception:  # noqa: BLE001 - not in this cubin: the next, else NVRTC
            continue
    return None


def function(cfg, fa=0, pre=0):
    """The CUfunction handle (an int) of a configuration, compiled or loaded once per process, in
    cupy's current device (one GPU per worker process, as the executor runs it; a process driving
    several GPUs would need the handles per device, not done)."""
    key = tuple(norm(cfg)[:6]) + (fa, norm(cfg)[7], pre)
    f = _FUNCS.get(key)
    if f is None:
        from . import stream  # noqa: PLC0415

        cp = stream._cupy()
        fn = _from_cubins(cp, mangled(cfg, fa, pre))
        if fn is None:
            with open(_SRC) as fh:
                src = fh.read()
            mod = cp.RawModule(code=src, options=("-std=c++17",), name_expressions=[instantiation(cfg, fa, pre)])
            fn = mod.get_function(instantiation(cfg, fa, pre))
        # cupy's RawModule hands out RawKernel objects; the driver handle is their Function's ptr
        k = getattr(fn, "kernel", fn)
        f = (fn, int(k.ptr))
        _FUNCS[key] = f
    return f[1]


def producers(cfg, n, items):
    """Producer blocks (a multiple of KS): PB, or the SMs the consumer blocks leave free (≥ 4)."""
    _, rt, bps, ks, mb, stg, pb, wr = norm(cfg)
    n_cons = n // rt * ks
    want = pb if pb > 0 else max(4, SMS - n_cons if n_cons < SMS else 4)
    want = max(1, min(want, items))
    return -(-want // ks) * ks


def producer_chunks(pieces, groups, k, warps):
    """K chunks per (piece, A group) task: about two tasks per producer warp, chunks of 64-multiples."""
    kch = 1
    while kch < 64 and pieces * groups * kch < 2 * warps and k % (kch * 2 * 64) == 0:
        kch *= 2
    return kch


def geometry(cfg, m, n, k, rmax, piece_rows, bank=True):
    """(fa, pieces, kch, n_prod, n_cons, threads, smem) of a launch."""
    _, rt, bps, ks, mb, stg, pb, wr = norm(cfg)
    fa = fused_rows(rmax, bank)
    cw = consumer_warps(cfg, fa)
    n_cons = n // rt * ks
    if fa > 0:
        pieces, kch, n_prod = 0, 1, 0
    else:
        pieces = -(-m // piece_rows)
        groups = -(-rmax // 16)
        n_prod = producers(cfg, n, pieces * groups * 64)
        kch = producer_chunks(pieces, groups, k, n_prod * cw)
    return fa, pieces, kch, n_prod, n_cons, 32 * (cw + 1), smem_bytes(cfg, m, rmax, fa)


class LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint), ("by", ctypes.c_uint),
                ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttr)),
                ("nattrs", ctypes.c_uint)]


# Pre-tiled W (the kernel's PRE): measured by the bench only (bench/gpu/splitk.py --pretile); a
# repacked copy of every weight is kept per (pointer, shape, RT, version), so it doubles W's memory.
PRETILE = [False]
_PRETILED = {}


def pretile(w, rt):
    """W [N, K] bf16 as [N / RT][K / 64][RT][64] tiles, each in the copy engine's 128-byte swizzle
    (16-byte chunk c of tile row r stored at chunk c ^ (r % 8)), contiguous."""
    n, k = w.shape
    if n % rt != 0 or k % 64 != 0 or rt % 8 != 0:
        raise WorkerError(errors.BAD_VALUE, "pretile: [%d, %d] does not tile into %d x 64" % (n, k, rt))
    t = w.reshape(n // rt, rt, k // 64, 8, 8).permute(0, 2, 1, 3, 4)  # [nb, kb, r, chunk, 8]
    r = torch.arange(rt, device=w.device).view(rt, 1)
    src = torch.arange(8, device=w.device).view(1, 8) ^ (r % 8)  # destination chunk p holds source chunk p ^ (r % 8)
    return t[:, :, r, src].contiguous()


def pretiled(w, rt):
    key = (w.data_ptr(), tuple(w.shape), rt, w._version)
    t = _PRETILED.get(key)
    if t is None:
        t = _PRETILED[key] = pretile(w, rt)
    return t


# Programmatic dependent launch (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION): on unless
# STAGEML_TMA_PDL=0; bench/gpu/splitk.py measures both. Only for launches into a CUDA-graph capture:
# launched eagerly, a kernel with the attribute made the cuDNN attention after it (SDPA's cuDNN
# backend) spend ~12 ms of host time per call (the torch worker's eager decode step of a 4-layer
# 4096-wide model: 48.7 ms with it, 8.7 ms without; bench/results/gpu-worker.md).
PDL = [os.environ.get("STAGEML_TMA_PDL", "1") != "0"]
_PDL_ATTR = LaunchAttr()
_PDL_ATTR.id = 6
_PDL_ATTR.value = (1).to_bytes(4, "little") + bytes(60)
_CAPTURE_STATUS = ctypes.c_int()


def _pdl(lib, stream):
    """Whether this launch into `stream` (a CUstream handle) takes the PDL attribute: PDL on and the
    stream capturing into a CUDA graph (cudaStreamCaptureStatusActive)."""
    if not PDL[0] or lib.cuStreamIsCapturing(ctypes.c_void_p(stream), ctypes.byref(_CAPTURE_STATUS)) != 0:
        return False
    return _CAPTURE_STATUS.value == 1


def launch(cfg, x2, w, a, b, y, slots, ranks, scales, rmax, piece_rows, t_acc, sync, bank=True):
    global SMS
    m, k = x2.shape
    n = w.shape[0]
    if SMS == 132 and torch.cuda.is_available():
        SMS = torch.cuda.get_device_properties(x2.device).multi_processor_count
    fa, pieces, kch, n_prod, n_cons, threads, smem = geometry(cfg, m, n, k, rmax, piece_rows, bank)
    wt = pretiled(w, cfg[1]) if PRETILE[0] else None
    pre = 1 if wt is not None else 0
    f = function(cfg, fa, pre)
    key = tuple(norm(cfg)[:6]) + (fa, norm(cfg)[7], pre)
    lib = _lib()
    if _SMEM.get(key, 0) < smem:
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
        _check(lib.cuFuncSetAttribute(ctypes.c_void_p(f), 8, smem), "cuFuncSetAttribute")
        _SMEM[key] = smem
    wm = _wmap(w, cfg[1])
    xm = _xmap(x2, cfg[4])
    am = _wmap(a, fa) if fa > 0 else _ZERO_MAP

    def p(t):
        return ctypes.c_uint64(t.data_ptr() if t is not None else 0)

    vals = [wm, xm, am, p(x2), p(a), p(b), p(wt), p(y), p(t_acc), p(sync), p(slots), p(ranks), p(scales)]
    vals += [ctypes.c_int32(v) for v in (m, n, k, rmax, piece_rows, pieces, kch, n_prod, n_cons)]
    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
    stream = torch.cuda.current_stream(x2.device).cuda_stream
    if _pdl(lib, stream):
        lc = LaunchConfig(n_prod + n_cons, 1, 1, threads, 1, 1, smem, ctypes.c_void_p(stream), ctypes.pointer(_PDL_ATTR), 1)
        _check(lib.cuLaunchKernelEx(ctypes.byref(lc), ctypes.c_void_p(f), params, None), "cuLaunchKernelEx(%s)" % (cfg,))
    else:
        _check(lib.cuLaunchKernel(ctypes.c_void_p(f), n_prod + n_cons, 1, 1, threads, 1, 1, smem, ctypes.c_void_p(stream), params, None),
               "cuLaunchKernel(%s)" % (cfg,))
    return y


_ZERO_MAP = TensorMap()


# -- lora_wg: the ring with wgmma (sm_90a) ---------------------------------------------------------
#
# A configuration ("wg", RT, KS, MB, ST, EW[, XL]): RT rows of W per cluster (64 or 128: one warpgroup
# per 64), KS blocks per cluster splitting K, MB batch rows (8, 16, 32, 64 or 128: the wgmma's N), ST
# ring stages of one 64-K box each, EW expand warps (0: one adapter, its shrink in the ring; ≥ 1: a
# bank, t from lora_shrink launched just before), XL 1: x comes into the ring through the issuing
# warp's cp.async chunks instead of a tensor copy (the copy engine then carries W and A only). NVRTC builds it for sm_90a (cupy's RawModule
# compiles for the plain sm_90 target, which has no wgmma), else the STAGEML_TMA_CUBIN cubins.

WG_MB = (8, 16, 32, 64, 128)
SHRINK_WARPS = 32
_TBUF = {}
_FAILED = set()


def is_wg(cfg):
    return cfg is not None and len(cfg) > 0 and cfg[0] == "wg"


def check_wg(cfg):
    """Validates a ("wg", RT, KS, MB, ST, EW[, XL]) tuple; raises WorkerError (RT_BAD_VALUE) naming what is wrong."""
    if not is_wg(cfg) or len(cfg) not in (6, 7) or not all(isinstance(v, int) and not isinstance(v, bool) for v in cfg[1:]):
        raise WorkerError(errors.BAD_VALUE, "wg config must be ('wg', RT, KS, MB, ST, EW[, XL]) with integers, got %r" % (cfg,))
    _, rt, ks, mb, stg, ew = cfg[:6]
    if len(cfg) == 7 and cfg[6] not in (0, 1):
        raise WorkerError(errors.BAD_VALUE, "wg config %r: XL 0 or 1" % (cfg,))
    if rt not in (64, 128) or ks not in (1, 2, 4, 8) or rt % ks != 0:
        raise WorkerError(errors.BAD_VALUE, "wg config %r: RT 64 or 128, KS in 1/2/4/8 dividing RT" % (cfg,))
    if mb not in WG_MB or not 2 <= stg <= 16 or not 0 <= ew <= 8:
        raise WorkerError(errors.BAD_VALUE, "wg config %r: MB in 8/16/32/64/128, ST in 2..16, EW in 0..8" % (cfg,))
    return cfg


def wg_fa(cfg, rmax):
    """The A rows a one-adapter launch carries (rank padded to 16), 0 for a bank (EW > 0)."""
    return 0 if cfg[5] > 0 else -(-rmax // 16) * 16


def wg_threads(cfg):
    return 32 * (cfg[1] // 16 + cfg[5] + 1)


def wg_smem(cfg, m, rmax):
    """Dynamic shared memory of a lora_wg launch (the kernel's layout: alignment slack, barriers,
    the ring or the partial sums in its bytes, then the B tile and t (one adapter) or t, the
    expand sums and the row offsets (bank)); never under ONE_PER_SM."""
    _, rt, ks, mb, stg, ew = cfg[:6]
    fa = wg_fa(cfg, rmax)
    sh = rt // ks
    ring = stg * (rt + fa + mb) * 128 + (8192 if fa else 0)
    tail = (rt + (64 if fa else 0)) * (mb + 1) * 4
    extra0 = -(-max(ring, tail) // 1024) * 1024
    if fa:
        extra = -(-(sh * rmax * 2) // 16) * 16 + m * rmax * 4
    else:
        extra = m * rmax * 4 + m * sh * 4 + (m + 1) * 4
    return max(ONE_PER_SM, 2048 + extra0 + extra)


def wg_fits_registers(cfg):
    """Spill-free under the cap __launch_bounds__(threads, 1) sets (65536 / threads), as nvcc 13.0's
    report read: one adapter keeps 2 · MB / 2 accumulators (W and A products) beside ~48 registers; a
    bank's expand warps hold 8 chunk loads in flight (spilled at 157 registers, not at 186)."""
    cap = min(255, 65536 // wg_threads(cfg))
    return cap >= 168 if cfg[5] > 0 else cfg[3] + 48 <= cap


def wg_suits(cfg, m, n, k, rmax, bank):
    _, rt, ks, mb, stg, ew = cfg[:6]
    if bank != (ew > 0) or not 0 < m <= mb or rmax % 8 != 0 or not 0 < rmax <= (128 if bank else 64):
        return False
    if bank and k % (SHRINK_WARPS * 64) != 0:
        return False
    return (n % rt == 0 and k % (ks * 64) == 0 and wg_smem(cfg, mb, rmax) <= 227 * 1024 and wg_fits_registers(cfg)
            and n < 2**31 and k < 2**31)


def wg_adapt(cfg, n, k):
    """KS re-picked for an [n, k] weight as `adapt` does (one block per SM, fewest waves); None when none suits."""
    _, rt, ks, mb, stg, ew = cfg[:6]
    a = adapt(("tma", rt, 1, ks, mb, stg, 0, 1), n, k)
    return None if a is None else ("wg", rt, a[3], mb, stg, ew) + tuple(cfg[6:])


def wg_xl(cfg):
    return cfg[6] if len(cfg) > 6 else 0


def wg_instantiation(cfg, rmax):
    _, rt, ks, mb, stg, ew = cfg[:6]
    return "lora_wg<%d,%d,%d,%d,%d,%d,%d>" % (rt, ks, mb, stg, wg_fa(cfg, rmax), ew, wg_xl(cfg))


def wg_mangled(cfg, rmax):
    _, rt, ks, mb, stg, ew = cfg[:6]
    return "_Z7lora_wgILi%dELi%dELi%dELi%dELi%dELi%dELi%dEEv4TMapS0_S0_PKtS2_PKfPtPKiS7_S4_iiii" % (rt, ks, mb, stg, wg_fa(cfg, rmax), ew, wg_xl(cfg))


SHRINK_INST = "lora_shrink<%d>" % SHRINK_WARPS
SHRINK_MANGLED = "_Z11lora_shrinkILi%dEEvPKtS1_PfPKiS4_iii" % SHRINK_WARPS


def wg_explicit_instantiations(pairs):
    """C++ explicit instantiations of (cfg, rmax) pairs and the shrink kernel (for an nvcc cubin)."""
    sig = ("(const __grid_constant__ TMap, const __grid_constant__ TMap, const __grid_constant__ TMap, const bf16_t*, const bf16_t*, const float*, bf16_t*,"
           " const int*, const int*, const float*, int, int, int, int)")
    names = sorted(set(wg_instantiation(c, r) for c, r in pairs))
    out = "".join("template __global__ void %s%s;\n" % (nm, sig) for nm in names)
    for kw in sorted({SHRINK_WARPS} | set(SX_KW)):
        out += "template __global__ void lora_shrink<%d>(const bf16_t*, const bf16_t*, float*, const int*, const int*, int, int, int);\n" % kw
        out += "template __global__ void lora_shrink_set<%d>(const bf16_t*, const int*, BankSet, int, int);\n" % kw
    for nb in SX_NB:
        out += "template __global__ void lora_expand<%d>(const float*, const bf16_t*, bf16_t*, const int*, const int*, const float*, int, int, int, int);\n" % nb
        out += "template __global__ void lora_expand2<%d>(const float*, const bf16_t*, bf16_t*, const int*, const int*, const float*, int, int, int, int);\n" % nb
    for mode in (0, 1):
        out += ("template __global__ void lora_expand3<%d,%d,%d>(const float*, const bf16_t*, bf16_t*, float*, const int*, const int*, const float*, int, int, int, int);\n"
                % (EXPAND3_NT, EXPAND3_P, mode))
    for lw in (1, 2, 4, 8, 16):
        for mode in (0, 1):
            out += ("template __global__ void lora_expand4<%d,%d>(const float*, const bf16_t*, bf16_t*, float*, const int*, const int*, const float*, int, int, int, int);\n"
                    % (lw, mode))
        out += "template __global__ void lora_expand4_set<%d>(const int*, BankSet, int, int);\n" % lw
    return out


#: Kernel builds of this process (NVRTC compilations and images read from the disk cache): what the
#: worker reports as `kernelBuilds`, `kernelBuildUs` and `kernelCacheHits` (stream.py counts its
#: cupy builds here too).
BUILDS = {"builds": 0, "us": 0, "cached": 0}
_OPTIONS = ("-std=c++17", "--gpu-architecture=sm_90a")


def _cache_dir():
    """Where built sm_90a images are kept between processes: $XDG_CACHE_HOME/stageml/kernels (or
    ~/.cache/stageml/kernels); None where neither can be named."""
    home = os.path.expanduser("~")
    base = os.environ.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home != "~" else None)
    return os.path.join(base, "stageml", "kernels") if base else None


def cache_key(src, exprs, options, version):
    """The disk cache's name of an image: everything it depends on (the source text, the name
    expressions it instantiates, the options, NVRTC's version) hashed."""
    h = hashlib.sha256()
    for part in (src, "\0".join(exprs), "\0".join(options), repr(version)):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()


def cached_image(key, build, directory=None):
    """(image, lowered names) for `key`: read from the disk cache where a valid entry is there, else
    `build()` (returning the same pair), written to the cache (atomically: a temporary file renamed;
    a cache that cannot be written is skipped, the build is still returned). An entry that does not
    parse is rebuilt and replaced."""
    directory = _cache_dir() if directory is None else directory
    path = os.path.join(directory, key + ".bin") if directory else None
    if path and os.path.exists(path):
        try:
            with open(path, "rb") as fh:
                blob = fh.read()
            head, image = blob.split(b"\n\n", 1)
            names = json.loads(head.decode())
            if isinstance(names, dict) and image:
                BUILDS["cached"] += 1
                return image, names
        except (OSError, ValueError):
            pass  # unreadable or malformed: rebuilt below and replaced
    image, names = build()
    if path:
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(json.dumps(names).encode() + b"\n\n" + image)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only or full cache: this process keeps its build, the next builds again
    return image, names


def _nvrtc_sm90a_many(exprs, path=None):
    """Compiles the name expressions `exprs` (instantiations in lora_tma.cu, or in the file `path`)
    in one NVRTC program for sm_90a (cupy's NVRTC binding) — the source is parsed once for all of
    them — or reads the image from the disk cache (`cached_image`); loads the cubin, or the PTX
    (JIT-compiled by the driver) where this cupy cannot hand out cubins. Returns {expr: function};
    the module is kept alive in _MODULES."""
    from cupy_backends.cuda.libs import nvrtc  # noqa: PLC0415 - GPU hosts only
    from cupy.cuda import function as cpf  # noqa: PLC0415

    path = path or _SRC
    with open(path) as fh:
        src = fh.read()
    exprs = list(dict.fromkeys(exprs))

    def build():
        t0 = time.perf_counter()
        prog = nvrtc.createProgram(src, os.path.basename(path), [], [])
        try:
            add = getattr(nvrtc, "addNameExpression", None) or nvrtc.addAddNameExpression  # the binding's name varies by cupy version
            for e in exprs:
                add(prog, e)
            try:
                nvrtc.compileProgram(prog, list(_OPTIONS))
            except Exception as ex:  # noqa: BLE001 - name the log
                raise KernelError("NVRTC (sm_90a) failed for %s: %s %s" % (", ".join(exprs), ex, nvrtc.getProgramLog(prog)[:2000])) from ex
            try:
                image = bytes(nvrtc.getCUBIN(prog))
            except Exception:  # noqa: BLE001 - no cubin from this binding: the PTX
                image = nvrtc.getPTX(prog).encode() + b"\0"
            names = {e: nvrtc.getLoweredName(prog, e) for e in exprs}
        finally:
            nvrtc.destroyProgram(prog)
        BUILDS["builds"] += 1
        BUILDS["us"] += int((time.perf_counter() - t0) * 1e6)
        return image, names

    image, names = cached_image(cache_key(src, exprs, _OPTIONS, nvrtc.getVersion()), build)
    mod = cpf.Module()
    mod.load(image)
    _MODULES[("nvrtc", tuple(exprs))] = mod
    return {e: mod.get_function(names[e]) for e in exprs}


def _nvrtc_sm90a(expr, path=None):
    """`_nvrtc_sm90a_many` of one expression: its function."""
    return _nvrtc_sm90a_many([expr], path)[expr]


def prebuild(items, path=None):
    """Builds the kernels `items` ((expr, mangled name) pairs of lora_tma.cu, or of `path`) that are
    not built yet, in one NVRTC program (what `_wg_function` would build one at a time): those
    STAGEML_TMA_CUBIN's cubins hold are loaded from there. Raises `KernelError` where NVRTC fails."""
    from . import stream  # noqa: PLC0415

    todo = []
    for expr, mangled_name in items:
        if expr in _FUNCS:
            continue
        fn = _from_cubins(stream._cupy(), mangled_name)
        if fn is None:
            todo.append(expr)
        else:
            _FUNCS[expr] = (fn, int(getattr(fn, "kernel", fn).ptr))
    if todo:
        for expr, fn in _nvrtc_sm90a_many(todo, path).items():
            _FUNCS[expr] = (fn, int(getattr(fn, "kernel", fn).ptr))


def _wg_function(expr, mangled_name, path=None):
    f = _FUNCS.get(expr)
    if f is None:
        from . import stream  # noqa: PLC0415

        fn = _from_cubins(stream._cupy(), mangled_name)
        if fn is None:
            fn = _nvrtc_sm90a(expr, path)
        k = getattr(fn, "kernel", fn)
        f = (fn, int(k.ptr))
        _FUNCS[expr] = f
    return f[1]


def wg_function(cfg, rmax):
    """The CUfunction handle of a lora_wg configuration (and, for a bank, the shrink's), built once."""
    f = _wg_function(wg_instantiation(cfg, rmax), wg_mangled(cfg, rmax))
    if cfg[5] > 0:
        _wg_function(SHRINK_INST, SHRINK_MANGLED)
    return f


def _tbuf(device, stream, rmax):
    """t for lora_shrink's consumers ([SX_MAX_KC, MAX_ROWS, rmax] f32 at most, per stream: lora_shrink
    writes it, lora_wg or lora_expand reads it; its own buffer, since the producer-block path expects
    a zeroed one)."""
    key = (str(device), stream, rmax)
    t = _TBUF.get(key)
    if t is None:
        t = _TBUF[key] = torch.empty((SX_MAX_KC * MAX_ROWS * rmax,), device=device, dtype=torch.float32)
    return t


def _launch_raw(f, grid, threads, smem, stream, vals, what):
    lib = _lib()
    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals])
    if _pdl(lib, stream):
        lc = LaunchConfig(grid[0], grid[1], grid[2], threads, 1, 1, smem, ctypes.c_void_p(stream), ctypes.pointer(_PDL_ATTR), 1)
        _check(lib.cuLaunchKernelEx(ctypes.byref(lc), ctypes.c_void_p(f), params, None), "cuLaunchKernelEx(%s)" % (what,))
    else:
        _check(lib.cuLaunchKernel(ctypes.c_void_p(f), grid[0], grid[1], grid[2], threads, 1, 1, smem, ctypes.c_void_p(stream), params, None),
               "cuLaunchKernel(%s)" % (what,))


def wg_launch(cfg, x2, w, a, b, y, slots, ranks, scales, rmax):
    """One adapter: a [rank, K], b [N, rank] (rmax = rank). Bank: a [S, rmax, K], b [S, N, rmax],
    slots [M] (−1: none); then lora_shrink writes t first. y [M, N] is written."""
    global SMS
    m, k = x2.shape
    n = w.shape[0]
    if SMS == 132 and torch.cuda.is_available():
        SMS = torch.cuda.get_device_properties(x2.device).multi_processor_count
    _, rt, ks, mb, stg, ew = cfg[:6]
    f = wg_function(cfg, rmax)
    smem = wg_smem(cfg, m, rmax)
    key = wg_instantiation(cfg, rmax)  # the attribute belongs to the function: its largest launch so far
    lib = _lib()
    if _SMEM.get(key, 0) < smem:
        _check(lib.cuFuncSetAttribute(ctypes.c_void_p(f), 8, smem), "cuFuncSetAttribute")
        _SMEM[key] = smem
    stream = torch.cuda.current_stream(x2.device).cuda_stream

    def p(t):
        return ctypes.c_uint64(t.data_ptr() if t is not None else 0)

    fa = wg_fa(cfg, rmax)
    t = None
    if ew > 0:
        t = _tbuf(x2.device, stream, rmax)
        fs = _wg_function(SHRINK_INST, SHRINK_MANGLED)
        vals = [p(x2), p(a), p(t), p(slots), p(ranks)] + [ctypes.c_int32(v) for v in (m, k, rmax)]
        _launch_raw(fs, (m, -(-rmax // 16), 1), 32 * SHRINK_WARPS, 0, stream, vals, SHRINK_INST)
    wm = _wmap(w, rt)
    xm = _xmap(x2, mb)
    am = _wmap(a, fa) if fa > 0 else _ZERO_MAP
    vals = [wm, xm, am, p(x2), p(b), p(t), p(y), p(slots), p(ranks), p(scales)] + [ctypes.c_int32(v) for v in (m, n, k, rmax)]
    _launch_raw(f, (n // rt * ks, 1, 1), wg_threads(cfg), smem, stream, vals, cfg)
    return y


# What bench/gpu/splitk.py --sweep wg measures per row bucket: (RT, KS, ST, EW, XL) with EW = 0 for
# one adapter; the largest ST that fits is kept where one does not.
WG_SWEEP_SINGLE = [(64, 2, 12, 0, 0), (64, 2, 8, 0, 0), (64, 2, 12, 0, 1), (64, 2, 10, 0, 1), (64, 2, 8, 0, 1), (64, 2, 6, 0, 1)]
WG_SWEEP_BANK = [(64, 2, 8, 4, 0), (64, 2, 12, 6, 0), (64, 2, 8, 4, 1)]


def wg_sweep(m, bank=False, rmax=16):
    mb = bucket(m)
    if mb > 128:
        return []
    out = []
    for rt, ks, stg, ew, xl in (WG_SWEEP_BANK if bank else WG_SWEEP_SINGLE):
        c = ("wg", rt, ks, mb, stg, ew, xl)
        while stg > 2 and wg_smem(c, mb, rmax) > 227 * 1024:
            stg -= 1
            c = ("wg", rt, ks, mb, stg, ew, xl)
        if c not in out and wg_fits_registers(c):
            out.append(c)
    return out


# -- lora_wgt: one adapter, t once per launch, K split across clusters too --------------------------
#
# ("wgt", RT, KS, KG, MB, ST, TW[, XB]): RT rows of W per row tile (64, 128 or 256: one warpgroup per
# 64), KS blocks per cluster splitting K (1 or 2; partial sums in distributed shared memory), KG
# clusters splitting K further (1, 2, 4 or 8; partial sums through a global workspace), MB batch rows
# (8, 16, 32 or 64: the wgmma's N), ST ring stages (a W box and an x box each), TW t warps (t = x·Aᵀ
# over the whole grid, added into a zeroed f32 buffer that the launch leaves zeroed), XB 1: the x box
# is the call's M rows, not MB (no zero rows copied; default 0). The kernel waits on
# the whole grid (t, and the KG partial sums), so `wgt_suits` admits one wave at most (one block per
# SM); `wgt_adapt` re-picks KS and KG per weight and gives None where no split fits one wave (N /
# RT row tiles beyond it: the caller then takes stream.WGT_FALLBACK). Rank ≤ 64 (one adapter).

WGT_MB = (8, 16, 32, 64)
WGT_MAX_TILES = 1024
_WGT_STATE = {}
_WGT_WS = {}


def is_wgt(cfg):
    return cfg is not None and len(cfg) > 0 and cfg[0] == "wgt"


def check_wgt(cfg):
    """Validates a ("wgt", RT, KS, KG, MB, ST, TW[, XB]) tuple; raises WorkerError (RT_BAD_VALUE) naming what is wrong."""
    if not is_wgt(cfg) or len(cfg) not in (7, 8) or not all(isinstance(v, int) and not isinstance(v, bool) for v in cfg[1:]):
        raise WorkerError(errors.BAD_VALUE, "wgt config must be ('wgt', RT, KS, KG, MB, ST, TW[, XB]) with integers, got %r" % (cfg,))
    _, rt, ks, kg, mb, stg, tw = cfg[:7]
    if len(cfg) == 8 and cfg[7] not in (0, 1):
        raise WorkerError(errors.BAD_VALUE, "wgt config %r: XB 0 or 1" % (cfg,))
    if rt not in (64, 128, 256) or ks not in (1, 2) or kg not in (1, 2, 4, 8):
        raise WorkerError(errors.BAD_VALUE, "wgt config %r: RT 64/128/256, KS 1 or 2, KG 1/2/4/8" % (cfg,))
    if (rt // (ks * kg)) % 8 != 0 or rt // (ks * kg) == 0:
        raise WorkerError(errors.BAD_VALUE, "wgt config %r: RT / (KS KG) a multiple of 8" % (cfg,))
    if mb not in WGT_MB or not 2 <= stg <= 16 or not 1 <= tw <= 8:
        raise WorkerError(errors.BAD_VALUE, "wgt config %r: MB in 8/16/32/64, ST in 2..16, TW in 1..8" % (cfg,))
    return cfg


def wgt_threads(cfg):
    return 32 * (cfg[1] // 16 + cfg[6] + 1)


def wgt_blocks(cfg, n):
    return n // cfg[1] * cfg[2] * cfg[3]


def wgt_max_blocks(ks):
    """The largest grid that is one wave at one block per SM: every SM, or for clusters of 2 a
    multiple of 8 below the SM count (128 of 132: what the shipped 2-block clusters fill)."""
    return SMS if ks == 1 else SMS - SMS % 8


def wgt_smem(cfg, m, rmax):
    """Dynamic shared memory of a lora_wgt launch (the kernel's layout: alignment slack, barriers,
    the ring or the partial sums in its bytes, then B's rows [OW][rmax] bf16, t [M][rmax] f32 and
    the block's part of the sums [OW][MB + 1] f32); never under ONE_PER_SM."""
    _, rt, ks, kg, mb, stg, tw = cfg[:7]
    ow = rt // ks // kg
    ring = stg * (rt + mb) * 128
    tail = rt * (mb + 1) * 4
    extra0 = -(-max(ring, tail) // 1024) * 1024
    extra = -(-(ow * rmax * 2) // 16) * 16 + m * rmax * 4 + ow * (mb + 1) * 4
    return max(ONE_PER_SM, 2048 + extra0 + extra)


def wgt_fits_registers(cfg):
    """Spill-free under the cap __launch_bounds__(threads, 1) sets, as nvcc 13.0's report read for
    every configuration bench/gpu/wgt.py builds: MB / 2 accumulators beside ~60 registers (the
    256-row form's t warps keep one 64-K step of loads in flight to stay within 96)."""
    cap = min(255, 65536 // wgt_threads(cfg)) // 8 * 8
    return cfg[4] // 2 + 60 <= cap


def wgt_suits(cfg, m, n, k, rmax):
    _, rt, ks, kg, mb, stg, tw = cfg[:7]
    if not 0 < m <= mb or rmax % 8 != 0 or not 0 < rmax <= 64 or n % rt != 0 or k % (ks * kg * 64) != 0:
        return False
    return (wgt_blocks(cfg, n) <= wgt_max_blocks(ks) and n // rt * ks <= WGT_MAX_TILES and wgt_smem(cfg, mb, rmax) <= 227 * 1024
            and wgt_fits_registers(cfg) and n < 2**31 and k < 2**31)


def wgt_adapt(cfg, n, k):
    """KS and KG re-picked for an [n, k] weight: the most blocks within one wave (ties: the
    configuration's own KG, then its KS); None when no split fits (more row tiles than SMs)."""
    _, rt, ks, kg, mb, stg, tw = cfg[:7]
    if n % rt != 0:
        return None
    best = None
    for cks in (1, 2):
        for ckg in (1, 2, 4, 8):
            ow = rt // (cks * ckg)
            if ow == 0 or ow % 8 != 0 or k % (cks * ckg * 64) != 0:
                continue
            c = ("wgt", rt, cks, ckg, mb, stg, tw) + tuple(cfg[7:])
            blocks = wgt_blocks(c, n)
            if blocks > wgt_max_blocks(cks):
                continue
            key = (blocks, ckg == kg, cks == ks)
            if best is None or key > best[0]:
                best = (key, c)
    return None if best is None else best[1]


def wgt_kch(m, rmax, k, blocks, tw):
    """K chunks per (A group, x group) t task: doubled while the tasks stay within one per t warp of
    the grid (each chunk a multiple of 64 of K)."""
    groups, mgroups, kch = -(-rmax // 16), -(-m // 8), 1
    while kch * 2 * 64 <= k and k % (kch * 2 * 64) == 0 and groups * mgroups * kch * 2 <= blocks * tw:
        kch *= 2
    return kch


def wgt_instantiation(cfg):
    return "lora_wgt<%d,%d,%d,%d,%d,%d>" % tuple(cfg[1:7])


def wgt_mangled(cfg):
    return "_Z8lora_wgtILi%dELi%dELi%dELi%dELi%dELi%dEEv4TMapS0_PKtS2_S2_PtPfS4_PiPKfiiiiii" % tuple(cfg[1:7])


def wgt_explicit_instantiations(cfgs):
    """C++ explicit instantiations of lora_wgt configurations (for an nvcc cubin)."""
    sig = ("(const __grid_constant__ TMap, const __grid_constant__ TMap, const bf16_t*, const bf16_t*, const bf16_t*, bf16_t*, float*, float*, int*,"
           " const float*, int, int, int, int, int, int)")
    return "".join("template __global__ void %s%s;\n" % (nm, sig) for nm in sorted(set(wgt_instantiation(c) for c in cfgs)))


def wgt_function(cfg):
    """The CUfunction handle of a lora_wgt configuration (built once: cubin, else NVRTC for sm_90a)."""
    return _wg_function(wgt_instantiation(cfg), wgt_mangled(cfg))


def _wgt_state(device, stream, ws_floats):
    """(t_acc, ws, sync) of a stream: t_acc [64 · 64] f32 and sync [2 + WGT_MAX_TILES] int32 zeroed
    once (every launch leaves t_acc, sync[0] and sync[1] zeroed; the tile tickets sync[2 + tile]
    grow by 8 a launch, compared modulo 2^32), the workspace ws (no zeroing needed) grown to the
    largest launch so far (outgrown ones stay allocated: CUDA graphs may hold their addresses)."""
    key = (str(device), stream)
    s = _WGT_STATE.get(key)
    if s is None:
        s = _WGT_STATE[key] = (torch.zeros((64 * 64,), device=device, dtype=torch.float32),
                               torch.zeros((2 + WGT_MAX_TILES,), device=device, dtype=torch.int32))
    held = _WGT_WS.setdefault(key, [])
    if not held or held[-1].numel() < ws_floats:
        held.append(torch.empty((max(ws_floats, 1),), device=device, dtype=torch.float32))
    return s[0], held[-1], s[1]


def wgt_launch(cfg, x2, w, a, b, y, scales, rmax):
    """One adapter: x2 [M, K], w [N, K], a [rank, K], b [N, rank] (rmax = rank), y [M, N] written."""
    global SMS
    m, k = x2.shape
    n = w.shape[0]
    if SMS == 132 and torch.cuda.is_available():
        SMS = torch.cuda.get_device_properties(x2.device).multi_processor_count
    _, rt, ks, kg, mb, stg, tw = cfg[:7]
    xr = m if len(cfg) > 7 and cfg[7] else mb
    f = wgt_function(cfg)
    smem = wgt_smem(cfg, m, rmax)
    key = wgt_instantiation(cfg)
    lib = _lib()
    if _SMEM.get(key, 0) < smem:
        _check(lib.cuFuncSetAttribute(ctypes.c_void_p(f), 8, smem), "cuFuncSetAttribute")
        _SMEM[key] = smem
    stream = torch.cuda.current_stream(x2.device).cuda_stream
    t_acc, ws, sync = _wgt_state(x2.device, stream, n * kg * mb if kg > 1 else 1)
    blocks = wgt_blocks(cfg, n)
    kch = wgt_kch(m, rmax, k, blocks, tw)

    def p(t):
        return ctypes.c_uint64(t.data_ptr() if t is not None else 0)

    vals = [_wmap(w, rt), _xmap(x2, xr), p(x2), p(a), p(b), p(y), p(t_acc), p(ws), p(sync), p(scales)]
    vals += [ctypes.c_int32(v) for v in (m, n, k, rmax, kch, xr)]
    _launch_raw(f, (blocks, 1, 1), wgt_threads(cfg), smem, stream, vals, cfg)
    return y


# What bench/gpu/wgt.py measures per row bucket: (RT, KS, KG, ST, TW, XB); ST lowered while the
# shared memory (rank 64) does not fit.
WGT_SWEEP = {
    8: [(64, 2, 1, 12, 4, 0), (64, 2, 1, 12, 4, 1), (64, 2, 1, 16, 4, 1), (64, 2, 1, 12, 2, 1), (128, 2, 2, 10, 4, 1), (128, 1, 4, 10, 4, 1)],
    16: [(64, 2, 1, 12, 4, 0), (64, 2, 1, 12, 4, 1), (64, 2, 1, 16, 4, 1), (128, 2, 2, 8, 4, 1), (128, 1, 4, 8, 4, 1)],
    32: [(64, 2, 1, 12, 4, 0), (64, 2, 1, 12, 4, 1), (128, 1, 4, 8, 4, 1), (128, 2, 2, 8, 4, 1), (256, 1, 8, 5, 2, 1)],
    64: [(64, 2, 1, 10, 4, 0), (64, 2, 1, 10, 4, 1), (128, 1, 4, 8, 4, 1), (128, 2, 2, 8, 4, 1), (256, 1, 8, 5, 2, 1)],
}


def wgt_sweep(m, rmax=16):
    mb = bucket(m)
    out = []
    for rt, ks, kg, stg, tw, xb in WGT_SWEEP.get(mb, []):
        c = ("wgt", rt, ks, kg, mb, stg, tw, xb)
        while stg > 2 and wgt_smem(c, mb, rmax) > 227 * 1024:
            stg -= 1
            c = ("wgt", rt, ks, kg, mb, stg, tw, xb)
        if c not in out and wgt_fits_registers(c):
            out.append(c)
    return out


# -- cuBLAS base + lora_shrink + lora_expand ("sx") ------------------------------------------------
#
# ("sx", KW, NB[, SIDE[, EV]]): the base GEMM through cuBLAS (torch.matmul into y), t = x·A_jᵀ by lora_shrink (one
# block of KW warps per (row, 16-row A group, K slice: sx_slices), written once), then lora_expand
# sums the slices and adds s_j·t·B_jᵀ into
# y (NB columns per block, one row per block row). Three launches (the two kernels with
# programmatic dependent launch; SIDE = 1: the shrink on a side stream beside the GEMM), one
# adapter (slots None) or a bank (slot per row). EV picks the expand: 0 lora_expand, 1 lora_expand2
# (its loads reordered), 2 lora_expand3 (the factor rows read by whole columns per warp load, y
# updated 16 bytes at a time), 3 lora_expand3 writing s_j·t·B_jᵀ to an f32 buffer on the side
# stream right after the shrink, beside the base GEMM, and lora_add folding it into y after the
# join (needs SIDE = 1). EV 2 and 3 need N a multiple of 8 (else EV 1 runs).

SX_KW = (8, 32)
SX_NB = (128, 256)
SX_MAX_KC = 8


def is_sx(cfg):
    return cfg is not None and len(cfg) > 0 and cfg[0] == "sx"


def check_sx(cfg):
    """Validates a ("sx", KW, NB[, SIDE]) tuple; raises WorkerError (RT_BAD_VALUE) naming what is wrong."""
    if (not is_sx(cfg) or len(cfg) not in (3, 4, 5) or cfg[1] not in SX_KW or cfg[2] not in SX_NB
            or (len(cfg) >= 4 and cfg[3] not in (0, 1)) or (len(cfg) == 5 and cfg[4] not in (0, 1, 2, 3))
            or (len(cfg) == 5 and cfg[4] == 3 and cfg[3] != 1)):
        raise WorkerError(errors.BAD_VALUE, "sx config must be ('sx', KW, NB[, SIDE[, EV]]), KW in %s, NB in %s, SIDE 0 or 1, EV 0-3 (3 with SIDE 1), got %r"
                          % (SX_KW, SX_NB, cfg))
    return cfg


_SIDE = {}


def _side_stream(device):
    """The side stream lora_shrink runs on beside the base GEMM (SIDE = 1), one per device."""
    s = _SIDE.get(str(device))
    if s is None:
        s = _SIDE[str(device)] = torch.cuda.Stream(device=device)
    return s


def sx_suits(cfg, m, n, k, rmax):
    return 0 < m <= MAX_ROWS and k % (cfg[1] * 64) == 0 and rmax % 8 == 0 and 0 < rmax <= 128 and 0 < n < 2**31 and k < 2**31


def _shrink_name(kw):
    return "lora_shrink<%d>" % kw, "_Z11lora_shrinkILi%dEEvPKtS1_PfPKiS4_iii" % kw


def _shrink_fn(kw):
    return _wg_function(*_shrink_name(kw))


# lora_expand3's block (threads) and loads per thread (template NT, P)
EXPAND3_NT = 256
EXPAND3_P = 8


ADD_MANGLED = "_Z8lora_addPtPKfPKiii"


def expand3_mangled(mode):
    return "_Z12lora_expand3ILi%dELi%dELi%dEEvPKfPKtPtPfPKiS7_S1_iiii" % (EXPAND3_NT, EXPAND3_P, mode)


def expand4_mangled(lw, mode):
    return "_Z12lora_expand4ILi%dELi%dEEvPKfPKtPtPfPKiS7_S1_iiii" % (lw, mode)


def _expand3_name(mode):
    return "lora_expand3<%d,%d,%d>" % (EXPAND3_NT, EXPAND3_P, mode), expand3_mangled(mode)


def _expand3_fn(mode):
    return _wg_function(*_expand3_name(mode))


def _add_fn():
    return _wg_function("lora_add", ADD_MANGLED)


def expand3_lanes(rmax):
    """lora_expand3's lanes per column for the bank's widest rank: the power of two ≥ rmax / 8."""
    lanes = 1
    while lanes * 8 < rmax:
        lanes *= 2
    return lanes


def expand3_grid(n, m, rmax):
    """lora_expand3's grid: column blocks sized for the widest rank's lanes, one row per block row."""
    return (-(-n // (EXPAND3_P * EXPAND3_NT // expand3_lanes(rmax))), m, 1)


def expand4_lw(rmax):
    """lora_expand4's factor rows per warp for the bank's widest rank: the power of two ≥ rmax / 8."""
    return expand3_lanes(rmax)


def _expand4_name(rmax, mode):
    lw = expand4_lw(rmax)
    return "lora_expand4<%d,%d>" % (lw, mode), expand4_mangled(lw, mode)


def _expand4_fn(rmax, mode):
    return _wg_function(*_expand4_name(rmax, mode))


def _expand_name(nb, ev=0):
    if ev >= 2:
        return _expand3_name(ev - 2)
    if ev:
        return "lora_expand2<%d>" % nb, "_Z12lora_expand2ILi%dEEvPKfPKtPtPKiS6_S1_iiii" % nb
    return "lora_expand<%d>" % nb, "_Z11lora_expandILi%dEEvPKfPKtPtPKiS6_S1_iiii" % nb


def _expand_fn(nb, ev=0):
    return _wg_function(*_expand_name(nb, ev))


def sx_ev(cfg):
    """The expand kernel of an sx configuration: 0 lora_expand, 1 lora_expand2 (loads reordered)."""
    return cfg[4] if len(cfg) > 4 else 0


def sx_kernel_names(cfg, rmax, bt):
    """(expr, mangled name) of every kernel an sx configuration's launch builds (`sx_function`, and
    with factors stored [S, R, N] (`bt`) at EV 2-3 lora_expand4's): what `prebuild` takes."""
    names = [_shrink_name(cfg[1]), _expand_name(cfg[2], sx_ev(cfg))]
    if sx_ev(cfg) == 3:
        names.append(("lora_add", ADD_MANGLED))
    if bt and sx_ev(cfg) >= 2:
        names.append(_expand4_name(rmax, 1 if sx_ev(cfg) == 3 else 0))
    return names


def sx_function(cfg):
    """Both kernels' handles (built once; EV 3 also lora_add's); raises when they cannot be built here."""
    if sx_ev(cfg) == 3:
        _add_fn()
    return _shrink_fn(cfg[1]), _expand_fn(cfg[2], sx_ev(cfg))


# EV 3 (the expand beside the base GEMM) with factors stored [S, N, R] only up to this widest rank:
# beyond it lora_expand3 spends more on the padded rank rows than the overlap saves (64 rows of
# ranks 8/16/64: 3.04x cuBLAS base against EV 1's 2.54x), so EV 1 runs; with the factors also
# stored [S, R, N] (bt) lora_expand4 reads no padding and EV 3 wins at every measured rank.
SX_SIDE_EXPAND_MAX_RANK = 16


def sx_launch(cfg, x2, w, a, b, y, slots, ranks, scales, rmax, bt=None):
    """y = x2·wᵀ (cuBLAS) + the rows' LoRA terms; a [S, rmax, K] or [rank, K], b [S, N, rmax] or [N, rank]."""
    m, k = x2.shape
    n = w.shape[0]
    ev = sx_ev(cfg)
    if ev >= 2 and (n % 8 != 0 or y.data_ptr() % 16 != 0):
        cfg, ev, bt = cfg[:4] + (1,), 1, None  # lora_expand3/4 update y 8 columns (16 bytes) at a time
    if ev == 3 and bt is None and rmax > SX_SIDE_EXPAND_MAX_RANK:
        cfg, ev = cfg[:4] + (1,), 1
    fs, fe = sx_function(cfg)
    egrid, ethreads = expand3_grid(n, m, rmax), EXPAND3_NT
    if bt is not None and ev >= 2:
        # the factors stored [S, R, N] too: lora_expand4 reads them (3: its d-writing form)
        b = bt
        fe = _expand4_fn(rmax, 1 if ev == 3 else 0)
        egrid, ethreads = (-(-n // 256), m, 1), 256
    stream = torch.cuda.current_stream(x2.device).cuda_stream
    t = _tbuf(x2.device, stream, rmax)

    def p(v):
        return ctypes.c_uint64(v.data_ptr() if v is not None else 0)

    groups = -(-rmax // 16)
    kc = sx_slices(cfg[1], m, groups, k)
    vals = [p(x2), p(a), p(t), p(slots), p(ranks)] + [ctypes.c_int32(v) for v in (m, k, rmax)]
    tail = [ctypes.c_int32(v) for v in (m, n, rmax, kc)]
    if ev == 3:
        # the whole LoRA term beside the base GEMM: side stream shrink -> expand into d (f32), the
        # caller's stream GEMM -> join -> lora_add (y += d); d is this call's, freed on the caller's
        # stream after the join, so its memory is reused only behind the side stream's work. The
        # GEMM is launched first (the side stream waits only for the work before it): 0.4-0.6 µs
        # faster per call at every measured shape than the side kernels first (bench/gpu/carve.py).
        main = torch.cuda.current_stream(x2.device)
        side = _side_stream(x2.device)
        d = torch.empty((m, n), device=x2.device, dtype=torch.float32)
        side.wait_stream(main)
        torch.matmul(x2, w.t(), out=y)
        _launch_raw(fs, (m, groups, kc), 32 * cfg[1], 0, side.cuda_stream, vals, "lora_shrink<%d>" % cfg[1])
        _launch_raw(fe, egrid, ethreads, 0, side.cuda_stream,
                    [p(t), p(b), p(None), p(d), p(slots), p(ranks), p(scales)] + tail, "lora_expand%d<MODE 1>" % (4 if bt is not None else 3))
        main.wait_stream(side)
        _launch_raw(_add_fn(), (-(-(m * n // 8) // 256), 1, 1), 256, 0, stream, [p(y), p(d), p(slots), ctypes.c_int32(m), ctypes.c_int32(n)], "lora_add")
        return y
    if len(cfg) > 3 and cfg[3]:
        # SIDE: the shrink on a side stream, concurrent with the base GEMM (it reads only x and A);
        # the side stream waits for the work before (x, and the previous call's expand reading t),
        # the expand waits for both.
        main = torch.cuda.current_stream(x2.device)
        side = _side_stream(x2.device)
        side.wait_stream(main)
        _launch_raw(fs, (m, groups, kc), 32 * cfg[1], 0, side.cuda_stream, vals, "lora_shrink<%d>" % cfg[1])
        torch.matmul(x2, w.t(), out=y)
        main.wait_stream(side)
    else:
        _launch_raw(fs, (m, groups, kc), 32 * cfg[1], 0, stream, vals, "lora_shrink<%d>" % cfg[1])
        torch.matmul(x2, w.t(), out=y)
    if ev == 2:
        _launch_raw(fe, egrid, ethreads, 0, stream, [p(t), p(b), p(y), p(None), p(slots), p(ranks), p(scales)] + tail,
                    "lora_expand%d<MODE 0>" % (4 if bt is not None else 3))
        return y
    _launch_raw(fe, (-(-n // cfg[2]), m, 1), cfg[2], 0, stream, [p(t), p(b), p(y), p(slots), p(ranks), p(scales)] + tail,
                ("lora_expand2<%d>" if ev else "lora_expand<%d>") % cfg[2])
    return y


#: Most projections one BankSet launch takes (lora_tma.cu's SET_MAX).
SET_MAX = 4


class BankSet(ctypes.Structure):
    """lora_tma.cu's BankSet, passed by value: up to SET_MAX projections of one x and one row→slot map."""

    _fields_ = [("a", ctypes.c_uint64 * SET_MAX), ("bt", ctypes.c_uint64 * SET_MAX), ("t", ctypes.c_uint64 * SET_MAX),
                ("d", ctypes.c_uint64 * SET_MAX), ("y", ctypes.c_uint64 * SET_MAX), ("rank", ctypes.c_uint64 * SET_MAX),
                ("scale", ctypes.c_uint64 * SET_MAX), ("rmax", ctypes.c_int32 * SET_MAX), ("n", ctypes.c_int32 * SET_MAX),
                ("first", ctypes.c_int32 * (SET_MAX + 1)), ("cols", ctypes.c_int32 * (SET_MAX + 1)), ("adds", ctypes.c_int32 * (SET_MAX + 1)),
                ("count", ctypes.c_int32)]


def set_mangled(kw, lw):
    """The BankSet kernels' names as nvcc 13 mangles them: lora_shrink_set<kw>, lora_expand4_set<lw>, lora_add_set."""
    return ("_Z15lora_shrink_setILi%dEEvPKtPKi7BankSetii" % kw, "_Z16lora_expand4_setILi%dEEvPKi7BankSetii" % lw, "_Z12lora_add_setPKi7BankSeti")


def set_kernel_names(cfg, rmax):
    """(expr, mangled name) of the BankSet kernels of an EV 3 configuration and a set's widest rank."""
    kw, lw = cfg[1], expand4_lw(rmax)
    ms, me, ma = set_mangled(kw, lw)
    return [("lora_shrink_set<%d>" % kw, ms), ("lora_expand4_set<%d>" % lw, me), ("lora_add_set", ma)]


def _set_fns(kw, lw):
    ms, me, ma = set_mangled(kw, lw)
    return (_wg_function("lora_shrink_set<%d>" % kw, ms), _wg_function("lora_expand4_set<%d>" % lw, me), _wg_function("lora_add_set", ma))


def set_function(cfg, rmax):
    """The BankSet kernels' handles for an EV 3 configuration and the set's widest rank (built once);
    raises when they cannot be built here."""
    return _set_fns(cfg[1], expand4_lw(rmax))


def sx_launch_set(cfg, x2, items, slots):
    """EV 3 for several bank linears of one input x2 [M, K] and one row→slot map: items are (w [N, K],
    a [S, rmax, K], bt [S, rmax, N], y [M, N], ranks, scales, rmax), 2 to SET_MAX of them, every N a
    multiple of 8, every y 16-byte aligned. The caller's stream runs the base GEMMs one after the
    other while the side stream runs one shrink and one expand for the whole set (lora_shrink_set,
    lora_expand4_set); after the join one lora_add_set folds every projection's term into its y.
    One fork and join per set instead of per projection, and launches as wide as the set."""
    m, k = x2.shape
    count = len(items)
    rmax_all = max(it[6] for it in items)
    fs, fe, fa = set_function(cfg, rmax_all)
    dev = x2.device
    main = torch.cuda.current_stream(dev)
    side = _side_stream(dev)
    s = BankSet()
    s.count = count
    groups_all = sum(-(-it[6] // 16) for it in items)
    kc = sx_slices(cfg[1], m, groups_all, k)
    d = torch.empty((sum(m * it[0].shape[0] for it in items),), device=dev, dtype=torch.float32)
    ts = []
    first = cols = adds = off = 0
    for g, (w, a, bt, y, ranks, scales, rmax) in enumerate(items):
        n = w.shape[0]
        t = torch.empty((kc * m * rmax,), device=dev, dtype=torch.float32)
        ts.append(t)
        s.a[g], s.bt[g], s.t[g], s.y[g] = a.data_ptr(), bt.data_ptr(), t.data_ptr(), y.data_ptr()
        s.d[g] = d.data_ptr() + 4 * off
        s.rank[g], s.scale[g], s.rmax[g], s.n[g] = ranks.data_ptr(), scales.data_ptr(), rmax, n
        s.first[g], s.cols[g], s.adds[g] = first, cols, adds
        first += -(-rmax // 16)
        cols += -(-n // 256)
        adds += -(-(m * n // 8) // 256)
        off += m * n
    s.first[count], s.cols[count], s.adds[count] = first, cols, adds
    sp = ctypes.c_uint64(slots.data_ptr() if slots is not None else 0)
    side.wait_stream(main)
    for w, _, _, y, _, _, _ in items:
        torch.matmul(x2, w.t(), out=y)
    _launch_raw(fs, (m, first, kc), 32 * cfg[1], 0, side.cuda_stream, [ctypes.c_uint64(x2.data_ptr()), sp, s, ctypes.c_int32(m), ctypes.c_int32(k)],
                "lora_shrink_set<%d>" % cfg[1])
    _launch_raw(fe, (cols, m, 1), 256, 0, side.cuda_stream, [sp, s, ctypes.c_int32(m), ctypes.c_int32(kc)], "lora_expand4_set")
    main.wait_stream(side)
    # t and d were allocated on the caller's stream and are used on the side stream before the join:
    # freed after it (their memory is reused only behind the join).
    _launch_raw(fa, (adds, 1, 1), 256, 0, main.cuda_stream, [sp, s, ctypes.c_int32(m)], "lora_add_set")
    return [it[3] for it in items]


def sx_slices(kw, m, groups, k):
    """lora_shrink's K slices (grid z): doubled while the launch has under ~2048 warps (one DRAM
    round trip of A in flight) and each warp keeps a multiple of 64 of K; at most SX_MAX_KC."""
    kc = 1
    while kc < SX_MAX_KC and m * groups * kc * kw < SX_SHRINK_WARPS and k % (kw * 64 * kc * 2) == 0:
        kc *= 2
    return kc


# the warps sx_slices aims lora_shrink's launch at (four times as many measured slower: gpu-kernels.md)
SX_SHRINK_WARPS = 2048


SX_SWEEP = [("sx", 32, 128), ("sx", 8, 128), ("sx", 8, 128, 1), ("sx", 32, 128, 1)]
