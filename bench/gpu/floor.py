"""Three questions for one device call (twelfth session), each timed as splitk.py times (CUDA-graph
replay of back-to-back calls over 4 operand sets past the L2, median of 20; outputs NaN-poisoned and
checked against float64 before and after timing, bound 1e-2):

A. The read floor: how fast can one kernel launch read a 32 MB weight (the 4096² bf16 W) when
   launched back to back? Plain 16-byte loads (grid-stride or one contiguous chunk per block, 8-16
   in flight per thread, 1-8 blocks per SM) and bulk copies into a shared-memory ring (the copy
   engine, 16-32 KB chunks, 8-12 deep, one block per SM). A fused base + LoRA kernel that must read
   W cannot be faster than this; ≤ 0.9× cuBLAS's base GEMM needs it well under 0.9× cuBLAS.
B. 4096 rows (1024, 2048 too) by K-concatenation with x in place: the executor owns X' [M, K + R']
   (the producer of x writes its left K columns, not timed), the weight is stored packed
   W' = [W | s·B | 0] (adapter binding time), and the fused linear is one shrink kernel writing
   t = x·Aᵀ (bf16) straight into X'[:, K:K+r] plus one cuBLAS GEMM with K + R'. The shrink: Triton
   (rows per program BM, K step BK) against cuBLAS into t plus a copy (the earlier kconcat.py).
C. lora_wg with 256 W rows per cluster of 8 (K split 8 ways, partial sums through distributed
   shared memory: x re-read from L2 once per 256 W rows, a quarter of the shipped RT 64 × KS 2) and
   128 rows per cluster of 4, at 1-64 rows, r16, against cuBLAS and the shipped dispatch.

    python3 bench/gpu/floor.py OUTDIR [--parts A,B,C]
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import splitk as sk  # noqa: E402  (torch, triton, stream, triton_lora)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

st = sk.st
tma = st._tma
N = K = 4096

READ_SRC = r"""
template <int U>
__device__ __forceinline__ void rd_grid(const uint4* __restrict__ p, unsigned long long n16, unsigned int* out) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned int acc = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n16; i += stride * U) {
    uint4 v[U];
    if (i + (U - 1) * stride < n16) {
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = __ldcs(p + i + u * stride);
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = i + u * stride < n16 ? __ldcs(p + i + u * stride) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}
template <int U>
__device__ __forceinline__ void rd_chunk(const uint4* __restrict__ p, unsigned long long n16, unsigned int* out) {
  const unsigned long long per = (n16 + gridDim.x - 1) / gridDim.x, beg = blockIdx.x * per, end = beg + per < n16 ? beg + per : n16;
  unsigned int acc = 0;
  for (unsigned long long i = beg + threadIdx.x; i < end; i += (unsigned long long)blockDim.x * U) {
    uint4 v[U];
    if (i + (U - 1) * blockDim.x < end) {
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = __ldcs(p + i + u * blockDim.x);
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = i + u * blockDim.x < end ? __ldcs(p + i + u * blockDim.x) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}
extern "C" __global__ void rd_grid8(const uint4* p, unsigned long long n16, unsigned int* out) { rd_grid<8>(p, n16, out); }
extern "C" __global__ void rd_grid16(const uint4* p, unsigned long long n16, unsigned int* out) { rd_grid<16>(p, n16, out); }
extern "C" __global__ void rd_chunk8(const uint4* p, unsigned long long n16, unsigned int* out) { rd_chunk<8>(p, n16, out); }
extern "C" __global__ void rd_chunk16(const uint4* p, unsigned long long n16, unsigned int* out) { rd_chunk<16>(p, n16, out); }

// One lane per block streams its contiguous share of the buffer through a ring of `stages` chunks
// with bulk copies (the copy engine), each completing on its stage's mbarrier; a stage is reissued
// once its previous copy completed. Nothing reads the ring: what is timed is the transfer.
extern "C" __global__ void rd_bulk(const unsigned char* __restrict__ p, unsigned long long nbytes, unsigned int* out, unsigned int chunk, int stages) {
  extern __shared__ __align__(1024) unsigned char sm[];
  const unsigned int bar0 = (unsigned int)__cvta_generic_to_shared(sm);
  const unsigned int ring0 = bar0 + 1024;
  const unsigned long long nch = nbytes / chunk;
  const unsigned long long c0 = nch * blockIdx.x / gridDim.x, c1 = nch * (blockIdx.x + 1) / gridDim.x;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + 8 * s) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    for (unsigned long long c = c0; c < c1; ++c) {
      const unsigned long long i = c - c0;
      const int s = (int)(i % stages);
      const unsigned int bar = bar0 + 8 * s;
      if (i >= (unsigned long long)stages) {
        const unsigned int par = (unsigned int)((i / stages - 1) & 1);
        unsigned int done = 0;
        while (!done)
          asm volatile("{\n\t.reg .pred q;\n\tmbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2;\n\tselp.u32 %0, 1, 0, q;\n\t}" : "=r"(done) : "r"(bar), "r"(par) : "memory");
      }
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(chunk) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(ring0 + s * chunk), "l"(p + c * chunk), "r"(chunk), "r"(bar) : "memory");
    }
    const unsigned long long n = c1 - c0;
    for (unsigned long long i = (n > (unsigned long long)stages ? n - stages : 0); i < n; ++i) {
      const unsigned int bar = bar0 + 8 * (int)(i % stages), par = (unsigned int)((i / stages) & 1);
      unsigned int done = 0;
      while (!done)
        asm volatile("{\n\t.reg .pred q;\n\tmbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2;\n\tselp.u32 %0, 1, 0, q;\n\t}" : "=r"(done) : "r"(bar), "r"(par) : "memory");
    }
    if (sm[1024] == 0xAB && sm[1025] == 0xCD && sm[1026] == 0xEF) out[blockIdx.x] = 1;
  }
}
"""


def part_a(res):
    cp = st._cupy()
    mod = cp.RawModule(code=READ_SRC, options=("-std=c++17",))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bufs = [torch.randint(0, 2**15, (N * K,), device="cuda", dtype=torch.int16) for _ in range(sk.SETS)]
    sink = torch.zeros(8192, device="cuda", dtype=torch.int32)
    nbytes = N * K * 2
    rows = []

    def launcher(name, grid, block, smem=0, extra=()):
        kern = mod.get_function(name)
        if smem > 48 * 1024:
            kern.max_dynamic_shared_size_bytes = smem

        def run(i):
            with st._ext_stream(torch.cuda.current_stream().cuda_stream):
                if name == "rd_bulk":
                    kern((grid,), (block,), (bufs[i].data_ptr(), cp.uint64(nbytes), sink.data_ptr(), cp.uint32(extra[0]), cp.int32(extra[1])), shared_mem=smem)
                else:
                    kern((grid,), (block,), (bufs[i].data_ptr(), cp.uint64(nbytes // 16), sink.data_ptr()))
        return run

    cases = []
    for name in ("rd_grid8", "rd_grid16", "rd_chunk8", "rd_chunk16"):
        for bps, thr in ((1, 1024), (2, 1024), (2, 512), (4, 512), (8, 256), (16, 128)):
            cases.append((name, sms * bps, thr, 0, (), "%s %d blocks/SM x %d" % (name, bps, thr)))
    for chunk, stages in ((16384, 8), (16384, 12), (32768, 6), (8192, 16), (32768, 4)):
        cases.append(("rd_bulk", sms, 32, 1024 + chunk * stages, (chunk, stages), "rd_bulk %d KB x %d, 1 block/SM" % (chunk // 1024, stages)))
    cases.append(("rd_bulk", 2 * sms, 32, 1024 + 16384 * 6, (16384, 6), "rd_bulk 16 KB x 6, 2 blocks/SM"))
    for name, grid, block, smem, extra, label in cases:
        try:
            run = launcher(name, grid, block, smem, extra)
            us = sk.graph_us([lambda i=i: run(i) for i in range(sk.SETS)])
            rows.append({"variant": label, "us": us, "TBps": nbytes / (us * 1e-6) / 1e12})
        except Exception as ex:  # noqa: BLE001
            rows.append({"variant": label, "error": "%s: %s" % (type(ex).__name__, str(ex)[:200])})
        print("A", rows[-1], flush=True)
    # cuBLAS's base GEMM at 1 and 64 rows and torch's copy of the same 32 MB, in the same process
    ws = [b.view(torch.bfloat16).view(N, K) for b in bufs]
    for m in (1, 64):
        xs = [torch.randn((m, K), device="cuda", dtype=torch.bfloat16) for _ in range(sk.SETS)]
        ys = [torch.empty((m, N), device="cuda", dtype=torch.bfloat16) for _ in range(sk.SETS)]
        us = sk.graph_us([lambda i=i: torch.matmul(xs[i], ws[i].t(), out=ys[i]) for i in range(sk.SETS)])
        rows.append({"variant": "cublas base GEMM, %d rows" % m, "us": us, "TBps": nbytes / (us * 1e-6) / 1e12})
        print("A", rows[-1], flush=True)
    dst = torch.empty_like(bufs[0])
    us = sk.graph_us([lambda i=i: dst.copy_(bufs[i]) for i in range(sk.SETS)])
    rows.append({"variant": "torch copy of the 32 MB (read + write)", "us": us, "TBps": 2 * nbytes / (us * 1e-6) / 1e12})
    print("A", rows[-1], flush=True)
    res["read_floor"] = rows


@triton.jit
def shrink_into(x_ptr, a_ptr, o_ptr, M, sxm, som, K: tl.constexpr, R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """o[m, :R] = x[m, :K] · a[:R, :K]ᵀ rounded to o's dtype (a [R, K] contiguous, R a multiple of 16)."""
    pid = tl.program_id(0)
    rm = pid * BM + tl.arange(0, BM)
    rr = tl.arange(0, R)
    rk = tl.arange(0, BK)
    mm = rm < M
    acc = tl.zeros((BM, R), dtype=tl.float32)
    for k0 in range(0, K, BK):
        xk = tl.load(x_ptr + rm[:, None].to(tl.int64) * sxm + (k0 + rk)[None, :], mask=mm[:, None], other=0.0)
        ak = tl.load(a_ptr + rr[None, :] * K + (k0 + rk)[:, None])
        acc = tl.dot(xk, ak, acc)
    tl.store(o_ptr + rm[:, None].to(tl.int64) * som + rr[None, :], acc.to(o_ptr.dtype.element_ty), mask=mm[:, None])


SHRINK_CFGS = [(32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 4), (16, 256, 4, 4), (64, 64, 4, 6), (32, 64, 4, 8)]


def part_b(res):
    s = sk.SCALE
    rows_out = []
    for m in (4096, 2048, 1024):
        for rank in (16, 64):
            rp16 = -(-rank // 16) * 16
            for rpad in sorted({64, 16 if rank <= 16 else 64}):
                row = {"case": "kcat_r%d" % rank, "rows": m, "R_pad": rpad}
                ops = []
                for _ in range(sk.SETS):
                    x = torch.randn((m, K), device="cuda", dtype=torch.bfloat16)
                    w = torch.randn((N, K), device="cuda", dtype=torch.bfloat16) / 64
                    a = torch.randn((rank, K), device="cuda", dtype=torch.bfloat16) / 64
                    b = torch.randn((N, rank), device="cuda", dtype=torch.bfloat16) / 4
                    xp = torch.zeros((m, K + rpad), device="cuda", dtype=torch.bfloat16)
                    xp[:, :K] = x  # the producer's write: not timed
                    wp = torch.zeros((N, K + rpad), device="cuda", dtype=torch.bfloat16)
                    wp[:, :K] = w
                    wp[:, K:K + rank] = (b.float() * s).to(torch.bfloat16)
                    ap = torch.zeros((rp16, K), device="cuda", dtype=torch.bfloat16)
                    ap[:rank] = a
                    ops.append((x, w, a, b, xp, wp, ap))
                outs = [torch.empty((m, N), device="cuda", dtype=torch.bfloat16) for _ in range(sk.SETS)]
                hp = torch.float64
                base_refs, refs = [], []
                for (x, w, a, b, xp, wp, ap) in ops:
                    br = x.to(hp) @ w.to(hp).t()
                    base_refs.append(br)
                    refs.append(br + s * (x.to(hp) @ a.to(hp).t()) @ b.to(hp).t())
                sk.measure(row, "cublas_base", lambda i: torch.matmul(ops[i][0], ops[i][1].t(), out=outs[i]), base_refs, outs)
                base = row["variants"]["cublas_base"]["us"]
                sk.measure(row, "shipped", lambda i: st.lora_linear(ops[i][0], ops[i][1], ops[i][2], ops[i][3], s, out=outs[i]), refs, outs,
                           extra={"config": list(st._pick(m, N, K, rank, False, None) or ["none"])})
                tbuf = [torch.empty((m, rank), device="cuda", dtype=torch.bfloat16) for _ in range(sk.SETS)]

                def kc_torch(i):
                    x, w, a, b, xp, wp, ap = ops[i]
                    torch.matmul(xp[:, :K], a.t(), out=tbuf[i])
                    xp[:, K:K + rank].copy_(tbuf[i])
                    torch.matmul(xp, wp.t(), out=outs[i])
                sk.measure(row, "kcat cuBLAS t + copy", kc_torch, refs, outs)
                for (bm, bk, nw, ns) in SHRINK_CFGS:
                    def kc_tri(i, bm=bm, bk=bk, nw=nw, ns=ns):
                        x, w, a, b, xp, wp, ap = ops[i]
                        shrink_into[(triton.cdiv(m, bm),)](xp, ap, xp[:, K:], m, xp.stride(0), xp.stride(0), K=K, R=rp16, BM=bm, BK=bk, num_warps=nw, num_stages=ns)
                        torch.matmul(xp, wp.t(), out=outs[i])
                    sk.measure(row, "kcat triton shrink %s" % ((bm, bk, nw, ns),), kc_tri, refs, outs, extra={"shrink": [bm, bk, nw, ns]})
                # the shrink alone (fastest config) and the K + R' GEMM alone
                ok = [k for k, v in row["variants"].items() if k.startswith("kcat triton") and "us" in v]
                if ok:
                    bm, bk, nw, ns = row["variants"][min(ok, key=lambda k: row["variants"][k]["us"])]["shrink"]
                    row["shrink_alone_us"] = sk.graph_us([lambda i=i: shrink_into[(triton.cdiv(m, bm),)](ops[i][4], ops[i][6], ops[i][4][:, K:], m, ops[i][4].stride(0), ops[i][4].stride(0), K=K, R=rp16, BM=bm, BK=bk, num_warps=nw, num_stages=ns)
                                                          for i in range(sk.SETS)])
                    row["gemm_kpad_alone_us"] = sk.graph_us([lambda i=i: torch.matmul(ops[i][4], ops[i][5].t(), out=outs[i]) for i in range(sk.SETS)])
                    torch.backends.cuda.preferred_blas_library("cublaslt")
                    try:
                        def kc_lt(i):
                            x, w, a, b, xp, wp, ap = ops[i]
                            shrink_into[(triton.cdiv(m, bm),)](xp, ap, xp[:, K:], m, xp.stride(0), xp.stride(0), K=K, R=rp16, BM=bm, BK=bk, num_warps=nw, num_stages=ns)
                            torch.matmul(xp, wp.t(), out=outs[i])
                        sk.measure(row, "kcat triton shrink, cuBLASLt GEMM", kc_lt, refs, outs)
                        sk.measure(row, "cublasLt_base", lambda i: torch.matmul(ops[i][0], ops[i][1].t(), out=outs[i]), base_refs, outs)
                    finally:
                        torch.backends.cuda.preferred_blas_library("cublas")
                # the base again, last: the spread between two timings of one thing
                sk.measure(row, "cublas_base_again", lambda i: torch.matmul(ops[i][0], ops[i][1].t(), out=outs[i]), base_refs, outs)
                for k, v in row["variants"].items():
                    if "us" in v:
                        v["x_base"] = v["us"] / base
                rows_out.append(row)
                print("B", m, rank, rpad, {k: (round(v["us"], 2), round(v["x_base"], 4)) if "us" in v else v.get("error", "?")[:100] for k, v in row["variants"].items()},
                      "shrink %.2f gemm %.2f" % (row.get("shrink_alone_us", 0), row.get("gemm_kpad_alone_us", 0)), flush=True)
                del ops, outs, base_refs, refs, tbuf
                torch.cuda.empty_cache()
    res["kcat"] = rows_out


def part_c(res):
    ws = [torch.randn((N, K), device="cuda", dtype=torch.bfloat16) / 64 for _ in range(sk.SETS)]
    out_rows = []
    for m in (1, 8, 16, 32, 64):
        mb = tma.bucket(m)
        rank = 16
        As = [torch.randn((rank, K), device="cuda", dtype=torch.bfloat16) / 64 for _ in range(sk.SETS)]
        Bs = [torch.randn((N, rank), device="cuda", dtype=torch.bfloat16) / 4 for _ in range(sk.SETS)]
        xs = [torch.randn((m, K), device="cuda", dtype=torch.bfloat16) for _ in range(sk.SETS)]
        outs = [torch.empty((m, N), device="cuda", dtype=torch.bfloat16) for _ in range(sk.SETS)]
        hp = torch.float64
        base_refs = [xs[i].to(hp) @ ws[i].to(hp).t() for i in range(sk.SETS)]
        refs = [base_refs[i] + sk.SCALE * (xs[i].to(hp) @ As[i].to(hp).t()) @ Bs[i].to(hp).t() for i in range(sk.SETS)]
        row = {"case": "single_r16", "rows": m}
        sk.measure(row, "cublas_base", lambda i: torch.matmul(xs[i], ws[i].t(), out=outs[i]), base_refs, outs)
        base = row["variants"]["cublas_base"]["us"]
        sk.measure(row, "shipped", lambda i: st.lora_linear(xs[i], ws[i], As[i], Bs[i], sk.SCALE, out=outs[i]), refs, outs,
                   extra={"config": list(st._pick(m, N, K, rank, False, None) or ["none"])})
        ranks, scales = st._consts(rank, sk.SCALE, xs[0].device)
        for rt, ks in ((256, 8), (128, 4), (256, 4), (128, 8)):
            for stg in (6, 5, 4, 3):
                cfg = ("wg", rt, ks, mb, stg, 0)
                if tma.wg_smem(cfg, mb, rank) <= 227 * 1024:
                    break
            run = lambda i, c=cfg: tma.wg_launch(c, xs[i], ws[i], As[i], Bs[i], outs[i], None, ranks, scales, rank)  # noqa: E731
            sk.measure(row, "wg %s" % (cfg,), run, refs, outs, extra={"config": list(cfg)})
        sk.finish_row(row, base, res)
        out_rows.append(row)
    res["cluster8"] = out_rows


def main():
    out = sys.argv[1]
    parts = "A,B,C"
    if "--parts" in sys.argv:
        parts = sys.argv[sys.argv.index("--parts") + 1]
    os.makedirs(out, exist_ok=True)
    res = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "triton": triton.__version__, "copy_TBps": sk.copy_tbs()}, "rows": []}
    print("meta", res["meta"], flush=True)
    for p, fn in (("A", part_a), ("C", part_c), ("B", part_b)):
        if p in parts:
            t = time.time()
            try:
                fn(res)
            except Exception as ex:  # noqa: BLE001
                import traceback  # noqa: PLC0415
                traceback.print_exc()
                res.setdefault("errors", []).append("%s: %s: %s" % (p, type(ex).__name__, str(ex)[:300]))
            res["meta"]["part_%s_s" % p] = time.time() - t
            with open(os.path.join(out, "floor.json"), "w") as fh:
                json.dump(res, fh, indent=1)
    print("done", res["meta"], flush=True)


if __name__ == "__main__":
    main()
