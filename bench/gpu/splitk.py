"""Fused base + LoRA kernels against cuBLAS's base GEMM alone, 4096², bf16, one device call:

    y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ,  x [M, K], W [N, K], A [r, K], B [N, r]      (one adapter, r16)
    y[m] = x[m]·Wᵀ + s_j·(x[m]·A_jᵀ)·B_jᵀ, j = slot[m]                  (64-adapter bank, r16 / 8-16-64)

Variants (all from the package, native/stageml_torch: triton_lora.py and stream.py):
- cuda_stream: the swap-AB streaming CUDA kernel (lora_stream.cu), a sweep of configurations;
- triton_one: the one-launch split-K Triton kernel (the previous default);
- triton_swap[_tma]: the same scheme in swap-AB form, W through plain loads or TMA descriptors;
- punica_style: cuBLAS base + split-K shrink + expand (vLLM's scheme, reimplemented here);
- at 4096 rows: cuBLAS compositions (addmm into the LoRA term, stacked [W; A], K-concatenation,
  merged W + s·B·A for reference).
Correctness: ‖y − ref‖/‖ref‖ against float64 on fresh inputs, NaN-poisoned outputs. Times: µs per
call from CUDA-graph replay over operand sets larger than the 60 MB L2, median of replays.

    python3 bench/gpu/splitk.py --out gpu-kernels.json [--budget 240] [--no-triton] [--sweep old,cl]
    python3 bench/gpu/splitk.py --report RUN.json [RUN2.json ...] --out bench/results/gpu-kernels.md
"""
import argparse
import json
import os
import sys
import time
import traceback

if "--report" not in sys.argv:
    import torch
    import triton
    import triton.language as tl

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
    from stageml_torch import stream as st  # noqa: E402
    from stageml_torch import triton_lora as tlk  # noqa: E402
else:  # the report needs none of the GPU stack
    triton = type("triton", (), {"jit": staticmethod(lambda f: f)})
    tl = type("tl", (), {"constexpr": None})

N = K = 4096
SCALE = 2.0
SETS = 4
T0 = time.time()


# -- punica-style pair (vLLM's lora_shrink / lora_expand scheme), base through cuBLAS -------------


@triton.jit
def punica_shrink(x_ptr, a_ptr, t_ptr, M, K: tl.constexpr, R_PAD: tl.constexpr, RANK: tl.constexpr, M_BUCKET: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_k = tl.program_id(0)
    offs_m = tl.arange(0, M_BUCKET)
    offs_r = tl.arange(0, R_PAD)
    k_per = K // SPLIT_K
    acc = tl.zeros((M_BUCKET, R_PAD), dtype=tl.float32)
    for kk in range(0, k_per, BLOCK_K):
        offs_k = pid_k * k_per + kk + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=(offs_m < M)[:, None], other=0.0)
        a = tl.load(a_ptr + offs_r[:, None] * K + offs_k[None, :], mask=(offs_r < RANK)[:, None], other=0.0)
        acc = tl.dot(x, tl.trans(a), acc)
    tl.atomic_add(t_ptr + offs_m[:, None] * R_PAD + offs_r[None, :], acc, mask=(offs_m < M)[:, None], sem="relaxed")


@triton.jit
def punica_expand(t_ptr, b_ptr, y_ptr, scale, M, N: tl.constexpr, R_PAD: tl.constexpr, RANK: tl.constexpr, M_BUCKET: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_n = tl.program_id(0)
    offs_m = tl.arange(0, M_BUCKET)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, R_PAD)
    mask_m = offs_m < M
    t = tl.load(t_ptr + offs_m[:, None] * R_PAD + offs_r[None, :], mask=mask_m[:, None], other=0.0)
    b = tl.load(b_ptr + offs_n[:, None] * RANK + offs_r[None, :], mask=(offs_r < RANK)[None, :], other=0.0)
    y = tl.load(y_ptr + offs_m[:, None] * N + offs_n[None, :], mask=mask_m[:, None], other=0.0).to(tl.float32)
    y = tl.dot((t * scale).to(tl.bfloat16), tl.trans(b), y)
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], y.to(tl.bfloat16), mask=mask_m[:, None])


class Punica:
    def __init__(self, rank, max_rows=64):
        self.rank = rank
        self.r_pad = max(16, triton.next_power_of_2(rank))
        self.t = torch.zeros((max_rows, self.r_pad), device="cuda", dtype=torch.float32)

    def __call__(self, x, w, a, b, scale, out):
        m = x.shape[0]
        torch.matmul(x, w.t(), out=out)
        self.t.zero_()
        mb = max(16, triton.next_power_of_2(m))
        punica_shrink[(32,)](x, a, self.t, m, K, self.r_pad, self.rank, mb, 32, 128, num_warps=4)
        punica_expand[(N // 64,)](self.t, b, out, scale, m, N, self.r_pad, self.rank, mb, 64, num_warps=4)
        return out


# -- timing ---------------------------------------------------------------------------------------


def graph_us(fns, calls=8, reps=20):
    """µs per call replayed back to back from one CUDA graph over rotating operand sets."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls * len(fns)):
            fns[i % len(fns)]()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1000 / (calls * len(fns)))
    times.sort()
    del g
    return times[len(times) // 2]


def copy_tbs():
    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 10 / (e0.elapsed_time(e1) / 1000) / 1e12


def rel_err(y, ref):
    if not torch.isfinite(y).all():
        return float("inf")
    return float((y.to(ref.dtype) - ref).norm() / ref.norm())


def measure(row, name, run, refs, outs, calls=8, reps=20, extra=None):
    """Checks `run(i)` (writes outs[i]) against refs[i] on every set (NaN-poisoned first), then
    times it. Records µs, error or the exception."""
    try:
        errs = []
        for i in range(len(outs)):
            outs[i].fill_(float("nan"))
            run(i)
            torch.cuda.synchronize()
            errs.append(rel_err(outs[i], refs[i]))
        e = max(errs)
        rec = {"rel_err": e}
        if not e < 1e-2:
            rec["error"] = "wrong result (rel err %.3g)" % e
        else:
            rec["us"] = graph_us([lambda i=i: run(i) for i in range(len(outs))], calls=calls, reps=reps)
            # Same check after the timed replays: a race shows up as a moving error.
            outs[0].fill_(float("nan"))
            run(0)
            torch.cuda.synchronize()
            rec["rel_err_after"] = rel_err(outs[0], refs[0])
        if extra:
            rec.update(extra)
    except Exception as ex:  # noqa: BLE001 - record and continue
        rec = {"error": "%s: %s" % (type(ex).__name__, str(ex)[:300])}
        traceback.print_exc(limit=2)
    row.setdefault("variants", {})[name] = rec
    return rec


# -- configurations -------------------------------------------------------------------------------

CUDA_SWEEP = {
    1: [(1, 1, 8, 4, 0), (1, 1, 8, 4, 1), (1, 1, 16, 4, 0), (1, 1, 4, 4, 0), (1, 1, 8, 2, 0), (2, 1, 8, 2, 0), (1, 2, 8, 4, 0), (1, 1, 8, 8, 0), (1, 1, 16, 2, 0)],
    8: [(1, 1, 8, 2, 0), (1, 1, 8, 4, 0), (1, 1, 16, 2, 0), (2, 1, 8, 2, 0), (1, 1, 8, 1, 0), (1, 2, 4, 2, 0), (1, 1, 8, 2, 1), (2, 1, 4, 2, 0), (1, 1, 4, 2, 0)],
    16: [(1, 1, 8, 1, 0), (2, 1, 8, 1, 0), (1, 1, 16, 1, 0), (1, 1, 8, 2, 0), (1, 1, 4, 1, 0)],
    32: [(1, 1, 8, 1, 0), (1, 1, 16, 1, 0), (1, 1, 4, 1, 0), (1, 2, 4, 1, 0)],
}


# Cluster variant: (WR, RG, UNR, CL, LDW) per MT.
CL_SWEEP = {
    1: [(1, 8, 2, 8, 0), (1, 8, 4, 8, 0), (1, 4, 4, 8, 0), (1, 4, 2, 4, 0)],
    2: [(1, 8, 2, 8, 0), (1, 8, 4, 8, 0), (1, 4, 4, 8, 0), (1, 4, 2, 4, 0)],
    4: [(1, 8, 2, 8, 0), (1, 8, 4, 8, 0), (1, 4, 2, 8, 0), (2, 4, 2, 8, 0)],
    8: [(1, 8, 2, 8, 0), (1, 8, 1, 8, 0), (1, 4, 2, 8, 0), (2, 4, 1, 8, 0), (1, 8, 2, 4, 0)],
    16: [(1, 8, 1, 8, 0), (1, 4, 1, 8, 0), (1, 8, 2, 8, 0)],
    32: [(1, 8, 1, 8, 0), (1, 4, 1, 8, 0)],
}
SWEEP_KINDS = ["old", "cl"]
TRITON = True
TRITON_ONE = False
NOPDL = False
PRETILE = False
GEN = None  # the generated fused kernel's launcher module (--generated)


def cuda_cfgs(m, bank=False):
    mt = 1
    while 8 * mt < m:
        mt *= 2
    out = []
    if "old" in SWEEP_KINDS:
        base = CUDA_SWEEP[1] if mt <= 4 else CUDA_SWEEP[mt]
        out += [(wr, rg, kw, mt, unr, ldw) for wr, rg, kw, unr, ldw in base]
    if "old1" in SWEEP_KINDS and mt == 1:
        out.append((1, 1, 8, 1, 2, 0))
    if "cl" in SWEEP_KINDS:
        out += [("cl", wr, rg, mt, unr, cl, ldw) for wr, rg, unr, cl, ldw in CL_SWEEP[mt]]
    if "tma" in SWEEP_KINDS:
        out += st._tma.sweep(m, bank)
    if "wg" in SWEEP_KINDS:
        out += st._tma.wg_sweep(m, bank, 64 if bank else 16)
    if "wgx" in SWEEP_KINDS and not bank and m > 16:
        out += [c for c in WGX_EXTRA if c[3] == st._tma.bucket(m)]
    if "sx" in SWEEP_KINDS and m >= 8:
        out += list(st._tma.SX_SWEEP)
    if "tmadef" in SWEEP_KINDS and not bank:
        # the TMA ring's shipped configurations only (1-8 rows: the one shipped before lora_wg)
        c = ("tma", 64, 1, 2, 8, 12, 0, 1) if m <= 8 else st.config_for(m)
        if c is not None and st._tma.is_tma(c):
            out.append(c)
    return out


# one adapter at 32-64 rows: fewer, larger W tiles per cluster (less x re-read from L2; 64 blocks)
WGX_EXTRA = [("wg", 128, 2, 64, 8, 0), ("wg", 128, 2, 64, 6, 0), ("wg", 64, 1, 64, 10, 0), ("wg", 128, 2, 32, 10, 0), ("wg", 64, 1, 32, 12, 0)]
SWAP_SWEEP = [(128, 8, 128, 4, 4), (128, 4, 128, 4, 4), (64, 8, 128, 4, 4), (128, 8, 64, 6, 4), (256, 4, 128, 3, 8), (64, 16, 128, 4, 4), (128, 16, 64, 4, 4)]


def without_pdl(row, cfg, run, refs, outs):
    """The same TMA configuration launched without programmatic dependent launch."""
    st._tma.PDL[0] = False
    try:
        measure(row, "cuda_stream_nopdl %s" % (cfg,), run, refs, outs, extra={"config": list(cfg) if cfg != "default" else None, "pdl": False})
    finally:
        st._tma.PDL[0] = True


def must(y):
    if y is None:
        raise ValueError("the kernel does not suit this shape/configuration")
    return y


def best(row, prefix):
    cands = [(v["us"], k) for k, v in row["variants"].items() if k.startswith(prefix) and "us" in v]
    return min(cands) if cands else (None, None)


def out_of_time(budget):
    return time.time() - T0 > budget


# -- cases ----------------------------------------------------------------------------------------


def single_case(m, ws, budget, res):
    rank = 16
    As = [torch.randn((rank, K), device="cuda", dtype=torch.bfloat16) / 64 for _ in range(SETS)]
    Bs = [torch.randn((N, rank), device="cuda", dtype=torch.bfloat16) / 4 for _ in range(SETS)]
    xs = [torch.randn((m, K), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    outs = [torch.empty((m, N), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    hp = torch.float64 if m <= 256 else torch.float32  # f32 (no tf32) for the 4096-row reference: 1e-6 against a 1e-2 bound
    refs = [xs[i].to(hp) @ ws[i].to(hp).t() + SCALE * (xs[i].to(hp) @ As[i].to(hp).t()) @ Bs[i].to(hp).t() for i in range(SETS)]
    row = {"case": "single_r16", "rows": m}
    calls = 8 if m <= 256 else 2
    reps = 20 if m <= 256 else 5
    measure(row, "cublas_base", lambda i: torch.matmul(xs[i], ws[i].t(), out=outs[i]), [xs[i].to(hp) @ ws[i].to(hp).t() for i in range(SETS)], outs, calls, reps)
    base = row["variants"]["cublas_base"]["us"]
    if m <= 256:
        measure(row, "cublas_base_plus_lora", lambda i: outs[i].copy_(torch.addmm(torch.matmul(xs[i], ws[i].t()), torch.matmul(xs[i], As[i].t()), Bs[i].t(), alpha=SCALE)), refs, outs)
    if m <= 256 and st.available():
        for cfg in cuda_cfgs(m):
            run = lambda i, c=cfg: must(st.lora_linear(xs[i], ws[i], As[i], Bs[i], SCALE, cfg=c, out=outs[i]))  # noqa: E731
            measure(row, "cuda_stream %s" % (cfg,), run, refs, outs, extra={"config": list(cfg), "pdl": st._tma.PDL[0] if st._tma.is_tma(cfg) or st._tma.is_wg(cfg) or st._tma.is_sx(cfg) else None})
            if (st._tma.is_tma(cfg) or st._tma.is_wg(cfg)) and NOPDL:
                without_pdl(row, cfg, run, refs, outs)
            if st._tma.is_tma(cfg) and PRETILE:
                st._tma.PRETILE[0] = True
                try:
                    measure(row, "cuda_stream_pretiled %s" % (cfg,), run, refs, outs, extra={"config": list(cfg), "pretiled": True})
                finally:
                    st._tma.PRETILE[0] = False
        if st.config_for(m) is not None:
            run = lambda i: must(st.lora_linear(xs[i], ws[i], As[i], Bs[i], SCALE, out=outs[i]))  # noqa: E731
            measure(row, "cuda_stream_default", run, refs, outs, extra={"config": list(st.config_for(m))})
            if st._tma.is_tma(st.config_for(m)):
                without_pdl(row, "default", run, refs, outs)
    if m <= 64 and TRITON_ONE and not TRITON:
        measure(row, "triton_one", lambda i: outs[i].copy_(tlk.lora_linear_triton(xs[i], ws[i], As[i], Bs[i], SCALE)), refs, outs)
    if m <= 64 and TRITON:
        pu = Punica(rank)
        measure(row, "punica_style", lambda i: pu(xs[i], ws[i], As[i], Bs[i], SCALE, outs[i]), refs, outs)
        measure(row, "triton_one", lambda i: outs[i].copy_(tlk.lora_linear_triton(xs[i], ws[i], As[i], Bs[i], SCALE)), refs, outs)
        if GEN is not None:
            measure(row, "generated_fused", lambda i: GEN.run(xs[i], ws[i], As[i], Bs[i], out=outs[i]), refs, outs)
        for bn, sp, bk, stg, nw in SWAP_SWEEP:
            if out_of_time(budget):
                break
            cfg = dict(block_n=bn, split_k=sp, block_k=bk, num_stages=stg, num_warps=nw)
            measure(row, "triton_swap %d/%d/%d s%d w%d" % (bn, sp, bk, stg, nw), lambda i, c=cfg: must(tlk.lora_linear_swap(xs[i], ws[i], As[i], Bs[i], SCALE, out=outs[i], **c)), refs, outs, extra={"config": cfg})
        for bn, sp, bk, stg, nw in SWAP_SWEEP[:2]:
            if out_of_time(budget):
                break
            cfg = dict(block_n=bn, split_k=sp, block_k=bk, num_stages=stg, num_warps=nw, use_tma=True)
            measure(row, "triton_swap_tma %d/%d/%d s%d w%d" % (bn, sp, bk, stg, nw), lambda i, c=cfg: must(tlk.lora_linear_swap(xs[i], ws[i], As[i], Bs[i], SCALE, out=outs[i], **c)), refs, outs, extra={"config": cfg})
    if m >= 1024 and TRITON:
        big_variants(row, xs, ws, As, Bs, outs, refs, calls, reps)
    finish_row(row, base, res)


def big_variants(row, xs, ws, As, Bs, outs, refs, calls, reps):
    """Compute-bound rows: cuBLAS compositions that read/write as little beyond the base GEMM."""
    rank = As[0].shape[0]
    wa = [torch.cat([ws[i], As[i]], 0).contiguous() for i in range(SETS)]            # [N + r, K]: y0 and t in one GEMM
    wb = [torch.cat([ws[i], Bs[i]], 1).contiguous() for i in range(SETS)]            # [N, K + r]: K-concatenation
    merged = [(ws[i].float() + SCALE * Bs[i].float() @ As[i].float()).to(torch.bfloat16) for i in range(SETS)]
    m = xs[0].shape[0]
    ybig = [torch.empty((m, N + rank), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    xcat = [torch.empty((m, K + rank), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]

    def addmm_into_lora_scaled(i):
        t = torch.matmul(xs[i], As[i].t()).mul_(SCALE)
        torch.matmul(t, Bs[i].t(), out=outs[i])
        outs[i].addmm_(xs[i], ws[i].t())

    def stacked(i):
        torch.matmul(xs[i], wa[i].t(), out=ybig[i])
        t = ybig[i][:, N:]
        torch.addmm(ybig[i][:, :N], t, Bs[i].t(), alpha=SCALE, out=outs[i])

    def kconcat(i):
        torch.matmul(xs[i], As[i].t(), out=xcat[i][:, K:])
        xcat[i][:, K:].mul_(SCALE)
        xcat[i][:, :K].copy_(xs[i])
        torch.matmul(xcat[i], wb[i].t(), out=outs[i])

    measure(row, "cublas_t_then_addmm_beta1", addmm_into_lora_scaled, refs, outs, calls, reps)
    measure(row, "cublas_stacked_W_A_then_addmm", stacked, refs, outs, calls, reps)
    measure(row, "cublas_kconcat_x_copy", kconcat, refs, outs, calls, reps)
    measure(row, "merged_W_plus_sBA (reference, one adapter baked in)", lambda i: torch.matmul(xs[i], merged[i].t(), out=outs[i]), refs, outs, calls, reps)


def bank_case(m, ws, ranks_cycle, budget, res, banks):
    a_bank, b_bank, ranks, scales, rmax = banks
    slots = [torch.tensor([(j + 7 * i) % 64 for j in range(m)], device="cuda", dtype=torch.int32) for i in range(SETS)]
    xs = [torch.randn((m, K), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    outs = [torch.empty((m, N), device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
    rk = ranks.tolist()
    sc = scales.tolist()
    refs = []
    for i in range(SETS):
        bi = i % len(a_bank)
        ref = xs[i].double() @ ws[i].double().t()
        for r_, j in enumerate(slots[i].tolist()):
            a = a_bank[bi][j, :rk[j]].double()
            b = b_bank[bi][j, :, :rk[j]].double()
            ref[r_] += sc[j] * (xs[i][r_].double() @ a.t()) @ b.t()
        refs.append(ref)
    row = {"case": "bank64_" + ranks_cycle, "rows": m}
    measure(row, "cublas_base", lambda i: torch.matmul(xs[i], ws[i].t(), out=outs[i]), [xs[i].double() @ ws[i].double().t() for i in range(SETS)], outs)
    base = row["variants"]["cublas_base"]["us"]
    if st.available():
        for cfg in cuda_cfgs(m, bank=True):
            run = lambda i, c=cfg: must(st.lora_bank_linear(xs[i], ws[i], a_bank[i % len(a_bank)], b_bank[i % len(a_bank)], slots[i], ranks, scales, cfg=c, out=outs[i]))  # noqa: E731
            measure(row, "cuda_stream %s" % (cfg,), run, refs, outs, extra={"config": list(cfg), "pdl": st._tma.PDL[0] if st._tma.is_tma(cfg) or st._tma.is_wg(cfg) or st._tma.is_sx(cfg) else None})
            if (st._tma.is_tma(cfg) or st._tma.is_wg(cfg)) and NOPDL:
                without_pdl(row, cfg, run, refs, outs)
        if st.config_for(m, bank=True) is not None:
            run = lambda i: must(st.lora_bank_linear(xs[i], ws[i], a_bank[i % len(a_bank)], b_bank[i % len(a_bank)], slots[i], ranks, scales, out=outs[i]))  # noqa: E731
            measure(row, "cuda_stream_default", run, refs, outs, extra={"config": list(st.config_for(m, bank=True))})
            if st._tma.is_tma(st.config_for(m, bank=True)):
                without_pdl(row, "default", run, refs, outs)
    adapter_bytes = sum(2 * 2 * rk[j] * K for j in set(sum((s.tolist() for s in slots[:1]), [])))
    row["adapter_MB"] = adapter_bytes / 1e6
    finish_row(row, base, res, extra_bytes=adapter_bytes)


def make_banks(rank_list, nsets):
    rmax = max(rank_list)
    ranks = torch.tensor(rank_list, device="cuda", dtype=torch.int32)
    scales = torch.tensor([2.0 if j % 2 == 0 else 1.0 for j in range(64)], device="cuda", dtype=torch.float32)
    a_bank, b_bank = [], []
    for _ in range(nsets):
        a = torch.randn((64, rmax, K), device="cuda", dtype=torch.bfloat16) / 64
        b = torch.randn((64, N, rmax), device="cuda", dtype=torch.bfloat16) / 4
        for j, r in enumerate(rank_list):  # padding beyond each adapter's rank is zero, as a bank stores it
            a[j, r:] = 0
            b[j, :, r:] = 0
        a_bank.append(a)
        b_bank.append(b)
    return a_bank, b_bank, ranks, scales, rmax


def finish_row(row, base, res, extra_bytes=0):
    for k, v in row["variants"].items():
        if "us" in v:
            v["x_base"] = v["us"] / base
            v["TBps"] = (2 * N * K + extra_bytes) / (v["us"] * 1e-6) / 1e12
    row["cublas_base_us"] = base
    res["rows"].append(row)
    short = {k: (round(v["us"], 2), round(v.get("x_base", 0), 3)) if "us" in v else v.get("error", "?")[:80] for k, v in row["variants"].items()}
    print("%s rows %d (t=%.0fs): %s" % (row["case"], row["rows"], time.time() - T0, short), flush=True)


# vLLM's punica shrink/expand on the H200 (shared/reference/peers.md), × cuBLAS base in that run.
VLLM = {("single_r16", 1): 1.70, ("single_r16", 64): 1.75, ("single_r16", 256): 1.78, ("single_r16", 4096): 1.22,
        ("bank64_r16", 1): 1.71, ("bank64_r16", 64): 3.31, ("bank64_r16", 256): 3.33,
        ("bank64_r8-16-64", 1): 2.40, ("bank64_r8-16-64", 64): 6.36, ("bank64_r8-16-64", 256): 4.36}


def report(paths, out):
    """Markdown tables over one or more result files: per row, every family's fastest correct variant."""
    runs = [json.load(open(p)) for p in paths]
    L = []
    for n, r in enumerate(runs, 1):
        m = r["meta"]
        L.append("- run %d: %s, %s, torch %s, triton %s, copy %.2f TB/s (W read once ≥ %.1f µs), %d cases, %.0f s" % (
            n, m["date"], m["device"], m["torch"], m["triton"], m["copy_TBps"], m["floor_us"], len(r["rows"]), m.get("wall_s", 0)))
    L.append("")
    fams = [("cuda_stream_default", "shipped dispatch"), ("cuda_stream ('wg'", "CUDA wgmma ring (lora_wg)"), ("cuda_stream ('sx'", "cuBLAS base + lora_shrink + lora_expand"), ("cuda_stream ('tma'", "CUDA TMA ring (lora_tma.cu)"), ("cuda_stream_nopdl", "TMA ring without PDL"), ("cuda_stream_pretiled", "TMA ring, W pre-tiled"),
            ("cuda_stream (", "CUDA stream, per-block K split"), ("cuda_stream ('cl'", "CUDA stream, cluster K split"), ("triton_one", "Triton split-K"),
            ("triton_swap ", "Triton swap-AB"), ("triton_swap_tma", "Triton swap-AB + TMA"), ("punica_style", "cuBLAS + shrink + expand (punica-style)"),
            ("cublas_base_plus_lora", "cuBLAS base + cuBLAS LoRA")]

    def fam_best(row, prefix):
        c = [(v["us"], k, v) for k, v in row["variants"].items() if "us" in v and k.startswith(prefix)
             and not (prefix == "cuda_stream (" and ("'cl'" in k or "'tma'" in k or "'wg'" in k or "'sx'" in k))]
        return min(c, key=lambda t: t[0]) if c else None

    for case, title in (("single_r16", "One adapter, r16"), ("bank64_r16", "64-adapter bank, r16, one adapter per row"),
                        ("bank64_r8-16-64", "64-adapter bank, ranks 8/16/64 cycled, one adapter per row")):
        L.append("### %s" % title)
        L.append("")
        L.append("| rows | run | cuBLAS base µs | " + " | ".join("%s × base (µs)" % t for _, t in fams) + " | best TB/s | best rel err | vLLM × base (peers.md) |")
        L.append("| ---: | ---: | ---: | " + " | ".join("---:" for _ in fams) + " | ---: | ---: | ---: |")
        for n, r in enumerate(runs, 1):
            for row in r["rows"]:
                if row["case"] != case or row["rows"] > 256:
                    continue
                cells, best = [], None
                for prefix, _ in fams:
                    b = fam_best(row, prefix)
                    cells.append("%.2f (%.1f)" % (b[2]["x_base"], b[0]) if b else "-")
                    if b and (best is None or b[0] < best[0]):
                        best = b
                v = VLLM.get((case, row["rows"]))
                L.append("| %d | %d | %.1f | %s | %s | %s | %s |" % (row["rows"], n, row["cublas_base_us"], " | ".join(cells), "%.2f" % best[2]["TBps"] if best else "-",
                                                                     "%.1e" % best[2]["rel_err"] if best else "-", "%.2f" % v if v else "-"))
        L.append("")
    L.append("### One adapter, r16, 4096 rows (compute-bound)")
    L.append("")
    L.append("| variant | µs | × cuBLAS base | rel err |")
    L.append("| --- | ---: | ---: | ---: |")
    for r in runs:
        for row in r["rows"]:
            if row["case"] == "single_r16" and row["rows"] == 4096 and len(row["variants"]) > 1:
                for k, v in row["variants"].items():
                    L.append("| %s | %s | %s | %s |" % (k, "%.1f" % v["us"] if "us" in v else v.get("error", "-"), "%.3f" % v["x_base"] if "x_base" in v else "-", "%.1e" % v["rel_err"] if "rel_err" in v else "-"))
    L.append("")
    L.append("### Every variant")
    L.append("")
    L.append("| case | rows | run | variant | µs | × base | TB/s | rel err | rel err after timing |")
    L.append("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for n, r in enumerate(runs, 1):
        for row in r["rows"]:
            for k, v in row["variants"].items():
                if "us" in v:
                    L.append("| %s | %d | %d | %s | %.2f | %.3f | %.2f | %.1e | %.1e |" % (row["case"], row["rows"], n, k, v["us"], v["x_base"], v["TBps"], v["rel_err"], v.get("rel_err_after", float("nan"))))
                else:
                    L.append("| %s | %d | %d | %s | - | - | - | %s | %s |" % (row["case"], row["rows"], n, k, "%.1e" % v["rel_err"] if "rel_err" in v else "-", v.get("error", "")[:90].replace("|", "/")))
    with open(out, "w") as fh:
        fh.write("\n".join(L) + "\n")


def main():
    if "--report" in sys.argv:
        ap = argparse.ArgumentParser(description=__doc__)
        ap.add_argument("--report", nargs="+", required=True)
        ap.add_argument("--out", required=True)
        a = ap.parse_args()
        return report(a.report, a.out)
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds after which the Triton swap-AB sweep stops adding configurations")
    ap.add_argument("--rows", default="1,16,32,64,128,256,4096")
    ap.add_argument("--bank-rows", default="1,16,32,64,128,256")
    ap.add_argument("--sweep", default="old,cl", help="CUDA kernel families to sweep: old (per-block K split), old1 (its best 1-8 row config), cl (cluster), tma (TMA ring, lora_tma.cu), tmadef (its shipped configuration only), wg (wgmma ring), wgx (its 64-block variants), sx (cuBLAS + shrink + expand)")
    ap.add_argument("--no-triton", action="store_true", help="skip the Triton, punica and 4096-row cuBLAS variants")
    ap.add_argument("--pretile", action="store_true", help="also measure one-adapter TMA configurations with W pre-tiled (tma.pretile)")
    ap.add_argument("--no-pdl-too", action="store_true", help="also measure every TMA configuration without programmatic dependent launch")
    ap.add_argument("--triton-one", action="store_true", help="with --no-triton: still measure the shipped Triton split-K kernel at rows <= 64")
    ap.add_argument("--generated", default=None, help="a `stageml gen triton` dir of a 4096² bf16 r16 LoRA linear, measured at rows ≤ 64")
    ap.add_argument("--write-configs", default=None, help="write the fastest CUDA configuration per row bucket (single, bank) here")
    args = ap.parse_args()
    global TRITON, TRITON_ONE, NOPDL, PRETILE
    SWEEP_KINDS[:] = args.sweep.split(",")
    TRITON = not args.no_triton
    TRITON_ONE = args.triton_one
    NOPDL = args.no_pdl_too
    PRETILE = args.pretile
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    except Exception:  # noqa: BLE001 - older Triton: the TMA variants record their error
        pass
    tbs = copy_tbs()
    res = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__, "triton": triton.__version__,
                    "device": torch.cuda.get_device_name(), "copy_TBps": tbs, "cuda_stream_available": st.available(),
                    "shape": "x [M, 4096] · W [4096, 4096]ᵀ + s·(x·Aᵀ)·Bᵀ, bf16", "floor_us": 2 * N * K / (tbs * 1e12) * 1e6}, "rows": []}
    print("copy %.2f TB/s, cupy kernel available: %s" % (tbs, st.available()), flush=True)
    ws = [torch.randn((N, K), device="cuda", dtype=torch.bfloat16) / 64 for _ in range(SETS)]

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    global GEN
    if args.generated and os.path.isdir(args.generated):
        import importlib  # noqa: PLC0415

        sys.path.insert(0, args.generated)
        mod = [f[:-10] for f in os.listdir(args.generated) if f.endswith("_launch.py")][0]
        GEN = importlib.import_module(mod + "_launch")
    for m in [int(r) for r in args.rows.split(",") if r]:
        single_case(m, ws, args.budget, res)
        save()
    for name, rl, nsets in (("r16", [16] * 64, 4), ("r8-16-64", [(8, 16, 64)[j % 3] for j in range(64)], 2)):
        banks = make_banks(rl, nsets)
        for m in [int(r) for r in args.bank_rows.split(",") if r]:
            bank_case(m, ws, name, args.budget, res, banks)
            save()
        del banks
    res["meta"]["wall_s"] = time.time() - T0
    save()
    if args.write_configs:
        best_cfg = {"single": {}, "bank": {}}
        score = {}
        for row in res["rows"]:
            table = "single" if row["case"] == "single_r16" else "bank"
            if row["rows"] > 256:
                continue
            bucket = 8
            while bucket < row["rows"]:
                bucket *= 2
            tri = row["variants"].get("triton_one", {}).get("us")
            for k, v in row["variants"].items():
                if k.startswith("cuda_stream (") and "us" in v and not (st._tma.is_tma(v["config"]) and not st._tma.shippable(v["config"], table == "bank")):
                    # single: only where it beats the Triton kernel the caller falls back to
                    if table == "single" and tri is not None and v["us"] >= tri:
                        continue
                    d = score.setdefault((table, bucket), {})
                    prev = d.get(tuple(v["config"]), (0.0, 0))
                    d[tuple(v["config"])] = (prev[0] + v["x_base"], prev[1] + 1)
        for (table, bucket), d in score.items():
            most = max(c for _, c in d.values())  # configurations measured on every case of the bucket
            best_cfg[table][str(bucket)] = list(min((v[0], k) for k, v in d.items() if v[1] == most)[1])
        for row in res["rows"]:  # single rows where the Triton kernel won: the stream kernels stay off
            bucket = 8
            while bucket < row["rows"]:
                bucket *= 2
            if row["case"] == "single_r16" and row["rows"] <= 256 and str(bucket) not in best_cfg["single"]:
                best_cfg["single"][str(bucket)] = None
        with open(args.write_configs, "w") as f:
            json.dump(best_cfg, f, indent=1)
        print("configs: %s" % json.dumps(best_cfg), flush=True)


if __name__ == "__main__":
    main()
