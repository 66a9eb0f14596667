// Fused base + LoRA for decode-sized batches with W streamed by the Hopper copy engine (TMA) into a
// shared-memory ring, swap-AB (y^T = W x^T: 16-row W tiles are the mma's A operand, batch rows its
// N), one launch:
//
//   y[m, n] = sum_k x[m, k] W[n, k] + s_j * sum_i t[m, i] B_j[n, i],   t[m, i] = sum_k x[m, k] A_j[i, k]
//
// with j = slot[m] (adapter 0 for every row when slot is null). Blocks [0, n_prod) are producers of
// t (the scheme of lora_stream.cu: K chunks of x . A_j^T added into the fp32 buffer t_acc, then a
// counter; here n_prod blocks loop over the (piece, K chunk) items, so the host sizes them to the SMs
// the consumers leave free). Every later cluster of KS blocks owns RT rows of W; its block of cluster rank q streams
// the K range [q K / KS, (q + 1) K / KS). Per block: one producer warp (one lane) issues, per ring
// stage, BPS tensor copies of W (RT rows x 64 K) and BPS of x (MB rows x 64 K, rows past M
// zero-filled by the copy engine), 128-byte swizzled, completing on the stage's `full` mbarrier;
// RT / 16 / WR * BPS consumer warps (16 WR W rows x one 64-K box each) read both with ldmatrix (conflict
// free under the swizzle) into mma.sync.m16n8k16 and release the stage on its `empty` mbarrier. x
// leaves L2 once per RT rows of W (not once per 16 as in lora_stream.cu). Partial sums meet in
// shared memory (the BPS warps of a row group) and then across the cluster in distributed shared
// memory: rank q finishes rows [q RT / KS, (q + 1) RT / KS) (sum, LoRA term, store). The last
// consumer block zeroes t_acc and the counters, so calls need no memset and replay in CUDA graphs.
//
// One adapter (FA > 0): no producer blocks; A's rows (rank padded to FA, zero-filled by the copy
// engine) ride in every ring stage as FA / 16 more row groups, so each cluster computes its own
// t over the whole K (A is small and stays in L2) and sums it across the cluster with the rest.
//
// Programmatic dependent launch (when the host asks for it): the issuing lane copies the first ring
// of weights before `griddepcontrol.wait`, every other access (x, t_acc, counters, y) comes after
// it, and each block signals `launch_dependents` once its weights are read, so the next launch's
// prefetch overlaps this one's tail. Without the launch attribute both instructions are no-ops.
//
// The host gives every launch at least 115 KB of dynamic shared memory (tma.ONE_PER_SM), so no two
// blocks share an SM: with two per SM some blocks' base sums came out wrong (bank configurations
// under 115 KB; bench/gpu/tma_bankdiag.py), the cause inside the SM not isolated.
//
// The tensor maps are built on the host (cuTensorMapEncodeTiled) and passed by value as
// __grid_constant__ parameters. Built by nvcc for sm_90a (a cubin) or by NVRTC through cupy.

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;

struct __align__(64) TMap {
  u64 v[16];
};

struct __align__(16) V4 { u32 x, y, z, w; };

__device__ __forceinline__ V4 ldg_stream(const bf16_t* p) {
  V4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ V4 ldg_x(const bf16_t* p) {
  V4 r;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ u32 vword(const V4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

__device__ __forceinline__ void mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ bf16_t to_bf16(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

__device__ __forceinline__ int ld_acq(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void tma_2d(u32 dst, const TMap* map, int c0, int c1, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"((u64)map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void ldsm_x2(u32 addr, u32& r0, u32& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

__device__ __forceinline__ u32 cta_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cl_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ float ld_remote(const float* p, u32 rank) {
  u32 remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(p)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void griddep_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Producer blocks' shrink: acc += A rows (16, rows >= r_valid zero) . x rows (8, rows >= mvalid
// zero)^T over K in [kb, ke) (a multiple of 64), two 64-wide steps of loads in flight.
__device__ __forceinline__ void shrink_rows(const bf16_t* __restrict__ abase, int lda, int r_valid, const bf16_t* __restrict__ xbase,
                                            int ldx, int mvalid, int kb, int ke, float* acc) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const V4 zero = {0u, 0u, 0u, 0u};
  const bool ok0 = g < r_valid, ok1 = g + 8 < r_valid, okx = g < mvalid;
  const bf16_t* p0 = abase + (size_t)g * lda + tig * 16;
  const bf16_t* p1 = abase + (size_t)(g + 8) * lda + tig * 16;
  const bf16_t* px = xbase + (size_t)(okx ? g : 0) * ldx + tig * 16;
  for (int k0 = kb; k0 < ke; k0 += 128) {
    const int steps = ke - k0 >= 128 ? 2 : 1;
    V4 lo[2][2], hi[2][2], xv[2][2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int kc = k0 + u * 64;
      const bool on = u < steps;
      lo[u][0] = on && ok0 ? ldg_stream(p0 + kc) : zero;
      lo[u][1] = on && ok0 ? ldg_stream(p0 + kc + 8) : zero;
      hi[u][0] = on && ok1 ? ldg_stream(p1 + kc) : zero;
      hi[u][1] = on && ok1 ? ldg_stream(p1 + kc + 8) : zero;
      xv[u][0] = on && okx ? ldg_x(px + kc) : zero;
      xv[u][1] = on && okx ? ldg_x(px + kc + 8) : zero;
    }
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const V4& xa = xv[u][j >> 1];
        const V4& l = lo[u][j >> 1];
        const V4& h = hi[u][j >> 1];
        const int w0 = (2 * j) & 3, w1 = (2 * j + 1) & 3;
        mma_bf16(acc, vword(l, w0), vword(h, w0), vword(l, w1), vword(h, w1), vword(xa, w0), vword(xa, w1));
      }
  }
}

// RT rows of W per cluster, BPS 64-K boxes per ring stage, KS blocks per cluster (K split), MB
// batch rows (M <= MB, a multiple of 8), ST ring stages, FA fused A rows (one adapter: its rank
// padded to 16, the shrink rides in the ring as extra rows; 0: producer blocks compute t), WR
// 16-row W tiles per consumer warp (each x fragment read from shared memory feeds WR mmas), PRE:
// W comes pre-tiled (wt: [N / RT][K / 64][RT x 64], each tile already in the 128-byte swizzle the
// copy engine would write), so every stage is one contiguous bulk copy instead of a tensor copy.
template <int RT, int BPS, int KS, int MB, int ST, int FA, int WR, int PRE>
__global__ void __cluster_dims__(KS, 1, 1) __launch_bounds__(32 * ((RT / 16 / WR + FA / 16) * BPS + 1), 1) lora_tma(
    const __grid_constant__ TMap wmap, const __grid_constant__ TMap xmap, const __grid_constant__ TMap amap,
    const bf16_t* __restrict__ x, const bf16_t* __restrict__ a, const bf16_t* __restrict__ b, const bf16_t* __restrict__ wt, bf16_t* __restrict__ y,
    float* __restrict__ t_acc, int* __restrict__ sync, const int* __restrict__ slot, const int* __restrict__ rank,
    const float* __restrict__ scale, int M, int N, int K, int rmax, int piece_rows, int n_pieces, int kch, int n_prod, int n_cons) {
  constexpr int RG = RT / 16, WG = RG / WR, AG = FA / 16, CWB = WG + AG, CW = CWB * BPS, NT = 32 * (CW + 1);
  constexpr int WBOX = RT * 128, ABOX = FA * 128, XBOX = MB * 128, STAGE = BPS * (WBOX + ABOX + XBOX), RS = MB + 1;
  static_assert(RT % (16 * WR) == 0 && RT <= 256 && FA % 16 == 0 && FA <= 64 && MB % 8 == 0 && MB <= 256 && RT % KS == 0, "tile shape");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sm = (unsigned char*)(((size_t)smem_raw + 1023) & ~(size_t)1023);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  // Producers (FA == 0): blocks [0, n_prod) (a multiple of KS); their warps loop over the
  // (piece, K chunk, 16-row A group) tasks.
  if ((int)blockIdx.x < n_prod) {
    griddep_wait();
    if (warp < CW) {
      const int ngroups = (rmax + 15) / 16, ntask = n_pieces * kch * ngroups, kper = K / kch;
      for (int task = blockIdx.x * CW + warp; task < ntask; task += n_prod * CW) {
        const int ga = task % ngroups, pc = task / ngroups, piece = pc / kch, c = pc % kch;
        const int m0 = piece * piece_rows, mv = min(piece_rows, M - m0);
        const int j = slot ? slot[m0] : 0;
        if (j < 0) continue;
        const int r = rank[j];
        if (ga * 16 >= r) continue;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        shrink_rows(a + ((size_t)j * rmax + ga * 16) * K, K, r - ga * 16, x + (size_t)m0 * K, K, mv, c * kper, (c + 1) * kper, acc);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = ga * 16 + g + (e >> 1) * 8, m = 2 * tig + (e & 1);
          if (i < r && m < mv) atomicAdd(&t_acc[(size_t)(m0 + m) * rmax + i], acc[e]);
        }
      }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(&sync[0], 1);
    }
    griddep_launch();
    return;
  }
  // Consumer cluster: rows [n0, n0 + RT), this block's K range.
  const int cb = (blockIdx.x - n_prod) / KS;
  const u32 q = KS > 1 ? cta_rank() : 0u;
  const int n0 = cb * RT;
  const int kper = K / KS, kbeg = (int)q * kper, NS = kper / (64 * BPS);
  const u32 bar0 = smem_u32(sm);  // full[ST], empty[ST], then the `last` flag
  int* last = (int*)(sm + 16 * ST);
  unsigned char* ring = sm + 1024;
  const u32 ring0 = smem_u32(ring);
  const bool issuer = warp == CW && lane == 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(bar0 + 8 * s, 1);
      mbar_init(bar0 + 8 * (ST + s), CW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  // Everything but the weight prefetch waits for the previous grid (programmatic dependent launch;
  // returns at once without it): x, t_acc, the counters and y may belong to it.
  if (!issuer) griddep_wait();
  float acc[WR][MB / 8][4];
#pragma unroll
  for (int t = 0; t < WR; ++t)
#pragma unroll
    for (int i = 0; i < MB / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][i][e] = 0.f;
  // Warp roles per 64-K box kbx: WG W warps (WR tiles each), then AG A warps (one tile each).
  const int kbx = warp / CWB, wl = warp % CWB;
  const bool wwarp = wl < WG;
  if (warp == CW) {
    if (lane == 0) {
      if (!PRE) asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&wmap) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&xmap) : "memory");
      if (FA > 0) asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&amap) : "memory");
      const int pre = NS < ST ? NS : ST;
      // The first ring's weights (W and A never change) before the dependency wait, x after it.
      for (int it = 0; it < pre; ++it) {
        const u32 full = bar0 + 8 * it, st0 = ring0 + it * STAGE;
        const int k = kbeg + it * 64 * BPS;
        mbar_expect_tx(full, STAGE);
#pragma unroll
        for (int bx = 0; bx < BPS; ++bx) {
          if (PRE) bulk_copy(st0 + bx * WBOX, wt + ((size_t)cb * (K / 64) + (k / 64) + bx) * (RT * 64), WBOX, full);
          else tma_2d(st0 + bx * WBOX, &wmap, k + bx * 64, n0, full);
          if (FA > 0) tma_2d(st0 + BPS * WBOX + bx * ABOX, &amap, k + bx * 64, 0, full);
        }
      }
      griddep_wait();
      for (int it = 0; it < NS; ++it) {
        const int s = it % ST;
        const u32 full = bar0 + 8 * s, st0 = ring0 + s * STAGE;
        const int k = kbeg + it * 64 * BPS;
        if (it >= pre) {
          mbar_wait(bar0 + 8 * (ST + s), ((it / ST) & 1) ^ 1);
          mbar_expect_tx(full, STAGE);
#pragma unroll
          for (int bx = 0; bx < BPS; ++bx) {
            if (PRE) bulk_copy(st0 + bx * WBOX, wt + ((size_t)cb * (K / 64) + (k / 64) + bx) * (RT * 64), WBOX, full);
            else tma_2d(st0 + bx * WBOX, &wmap, k + bx * 64, n0, full);
            if (FA > 0) tma_2d(st0 + BPS * WBOX + bx * ABOX, &amap, k + bx * 64, 0, full);
          }
        }
#pragma unroll
        for (int bx = 0; bx < BPS; ++bx) tma_2d(st0 + BPS * (WBOX + ABOX) + bx * XBOX, &xmap, k + bx * 64, 0, full);
      }
    }
  } else {
    // Lane addresses within a 128-byte-swizzled box (row r at r * 128, 16-byte chunk c at c ^ (r & 7)).
    const int ra = (lane & 7) + ((lane >> 3) & 1) * 8, ca = lane >> 4;
    const int rb = (lane & 7) + ((lane >> 4) & 1) * 8, cb8 = (lane >> 3) & 1;
    const int sw = lane & 7;
    const u32 wofs = wwarp ? kbx * WBOX + wl * WR * 16 * 128 : BPS * WBOX + kbx * ABOX + (wl - WG) * 16 * 128;
    for (int it = 0; it < NS; ++it) {
      const int s = it % ST;
      mbar_wait(bar0 + 8 * s, (it / ST) & 1);
      const u32 wt = ring0 + s * STAGE + wofs;
      const u32 xt = ring0 + s * STAGE + BPS * (WBOX + ABOX) + kbx * XBOX;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        u32 bf[MB / 8][2];
        if (MB == 8) {
          ldsm_x2(xt + (lane & 7) * 128 + (((2 * kk + cb8) ^ sw) << 4), bf[0][0], bf[0][1]);
        } else {
#pragma unroll
          for (int np = 0; np < MB / 16; ++np)
            ldsm_x4(xt + (np * 16 + rb) * 128 + (((2 * kk + cb8) ^ sw) << 4), bf[2 * np][0], bf[2 * np][1], bf[2 * np + 1][0], bf[2 * np + 1][1]);
        }
#pragma unroll
        for (int t = 0; t < WR; ++t) {
          if (t > 0 && !wwarp) break;  // an A warp has one tile
          u32 a0, a1, a2, a3;
          ldsm_x4(wt + t * 16 * 128 + ra * 128 + (((2 * kk + ca) ^ sw) << 4), a0, a1, a2, a3);
#pragma unroll
          for (int nt = 0; nt < MB / 8; ++nt) mma_bf16(acc[t][nt], a0, a1, a2, a3, bf[nt][0], bf[nt][1]);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bar0 + 8 * (ST + s));
    }
  }
  __syncthreads();  // every stage consumed: the ring is free for the partial sums
  griddep_launch();  // this grid reads no more weights: the next may start its prefetch
  float* red = (float*)ring;          // [RT + FA][RS]: rows of W, then (FA) t^T
  float* st = red + (RT + FA) * RS;   // [M][rmax]
  if (BPS > 1) {
    for (int i = threadIdx.x; i < (RT + FA) * RS; i += NT) red[i] = 0.f;
    __syncthreads();
  }
  if (warp < CW) {
#pragma unroll
    for (int t = 0; t < WR; ++t) {
      if (t > 0 && !wwarp) break;
      const int tile = wwarp ? wl * WR + t : RG + (wl - WG);
#pragma unroll
      for (int mt = 0; mt < MB / 8; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = tile * 16 + g + (e >> 1) * 8, m = mt * 8 + 2 * tig + (e & 1);
          if (BPS > 1) atomicAdd(&red[row * RS + m], acc[t][mt][e]);
          else red[row * RS + m] = acc[t][mt][e];
        }
    }
  }
  if (KS > 1) cl_sync();
  else __syncthreads();
  if (FA > 0) {
    // t = the cluster's partial shrinks summed (rows RT.. of every block's red).
    for (int i = threadIdx.x; i < M * rmax; i += NT) {
      const int m = i / rmax, r = i % rmax;
      float v = 0.f;
      if (KS > 1) {
#pragma unroll
        for (int c = 0; c < KS; ++c) v += ld_remote(&red[(RT + r) * RS + m], c);
      } else {
        v = red[(RT + r) * RS + m];
      }
      st[i] = v;
    }
  } else {
    if (threadIdx.x == 0) {
      while (ld_acq(&sync[0]) < n_prod) __nanosleep(64);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < M * rmax; i += NT) st[i] = __ldcg(&t_acc[i]);
  }
  __syncthreads();
  constexpr int SH = RT / KS;
  for (int i = threadIdx.x; i < SH * M; i += NT) {
    const int m = i / SH, nl = (int)q * SH + i % SH, n = n0 + nl;
    float v;
    if (KS > 1) {
      v = 0.f;
#pragma unroll
      for (int c = 0; c < KS; ++c) v += ld_remote(&red[nl * RS + m], c);
    } else {
      v = red[nl * RS + m];
    }
    const int j = slot ? slot[m] : 0;
    if (j >= 0) {
      const int r = rank[j];
      const bf16_t* bp = b + ((size_t)j * N + n) * rmax;
      const float* tp = st + m * rmax;
      float d = 0.f;
      for (int i0 = 0; i0 < r; i0 += 8) {
        const V4 bv = ldg_x(bp + i0);
        const u32 wd[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          d += tp[i0 + 2 * e] * __uint_as_float(wd[e] << 16);
          d += tp[i0 + 2 * e + 1] * __uint_as_float(wd[e] & 0xffff0000u);
        }
      }
      v += scale[j] * d;
    }
    y[(size_t)m * N + n] = to_bf16(v);
  }
  // No block leaves while another of its cluster may still read its shared memory.
  if (KS > 1) cl_sync();
  else __syncthreads();
  if (FA > 0) return;  // no producer state to reset
  if (threadIdx.x == 0) {
    __threadfence();
    *last = atomicAdd(&sync[1], 1) == n_cons - 1;
  }
  __syncthreads();
  if (*last) {
    for (int i = threadIdx.x; i < M * rmax; i += NT) t_acc[i] = 0.f;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      sync[0] = 0;
      sync[1] = 0;
      __threadfence();
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// lora_wg: the same ring with the W tiles multiplied by wgmma (sm_90a) instead of mma.sync. One
// warpgroup (4 warps) per 64 rows of W issues wgmma.m64nMBk16 with both operands read by the tensor
// cores straight from the swizzled ring (W tile: A operand, x box: B operand, K-major, 128-byte
// swizzle descriptors), four per 64-K stage, one commit group per stage, the stage released once
// the next stage's group is issued (wait_group 1). One adapter (FA > 0): warpgroup 0 also multiplies
// the 64 ring rows starting at the stage's A box (its FA rows, then x and whatever follows: rows
// past FA are discarded; the ring carries 8 KB of slack so the last stage's read stays in bounds),
// and the issuing lane bulk-copies the B rows this block finishes ([SH][rank] bf16, contiguous) into
// shared memory at the start, so the epilogue reads no global memory but y's stores.
// A bank (FA == 0): t = x . A_j^T comes from the previous launch (lora_shrink, in global memory, f32
// [M][rmax]); EW expand warps compute s_j . t[m] . B_j[n]^T for the rows this block finishes while
// the W warps stream, their B loads spread over the warps as 16-byte chunks of each row's first
// rank_j columns (8 chunks per lane in flight), partial dot products added into shared memory.
// The warp roles: [0, RT / 16) W warps, then EW expand warps, then the issuing warp.

template <int Z = 0>
__device__ __forceinline__ void wgmma_n8(float* d, u64 da, u64 db) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %6, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n\t}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "l"(da), "l"(db), "r"(1));
}

template <int Z = 0>
__device__ __forceinline__ void wgmma_n16(float* d, u64 da, u64 db) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %10, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n\t}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "l"(da), "l"(db), "r"(1));
}

template <int Z = 0>
__device__ __forceinline__ void wgmma_n32(float* d, u64 da, u64 db) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %18, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n\t}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "l"(da), "l"(db), "r"(1));
}

template <int Z = 0>
__device__ __forceinline__ void wgmma_n64(float* d, u64 da, u64 db) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %34, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n\t}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "l"(da), "l"(db), "r"(1));
}

template <int Z = 0>
__device__ __forceinline__ void wgmma_n128(float* d, u64 da, u64 db) {
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %66, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n\t}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(da), "l"(db), "r"(1));
}


template <int NB>
__device__ __forceinline__ void wgmma_nb(float* d, u64 da, u64 db) {
  if constexpr (NB == 8) wgmma_n8<0>(d, da, db);
  else if constexpr (NB == 16) wgmma_n16<0>(d, da, db);
  else if constexpr (NB == 32) wgmma_n32<0>(d, da, db);
  else if constexpr (NB == 64) wgmma_n64<0>(d, da, db);
  else wgmma_n128<0>(d, da, db);
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ u64 wg_desc(u32 addr) {
  return (u64)((addr >> 4) & 0x3FFF) | ((u64)1 << 16) | ((u64)64 << 32) | ((u64)1 << 62);
}
template <int Z = 0>
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
template <int Z = 0>
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int P>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(P) : "memory");
}
template <int R>
__device__ __forceinline__ void wg_hold(float* d) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// One warpgroup's main loop: per stage four wgmma k-steps on its 64 W rows (at byte offset wrow of
// the W box) and, with FA > 0, on the 64 rows from the A box; the stage before is released once
// this stage's group is issued. Each call site is one warpgroup-uniform branch (no divergent wgmma).
template <int MB, int ST, int STAGE, int FA, int WBOX, int ABOX, int XL>
__device__ __forceinline__ void wg_loop(float* acc, float* acca, u32 bar0, u32 ring0, u32 wrow, int NS, int lane) {
  for (int it = 0; it < NS; ++it) {
    const int s = it % ST;
    mbar_wait(bar0 + 8 * s, (it / ST) & 1);
    const u32 st0 = ring0 + s * STAGE;
    // XL: x came through cp.async (the generic proxy); the tensor cores read it through the async one
    if (XL) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    wg_fence<0>();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const u64 db = wg_desc(st0 + WBOX + ABOX + kk * 32);
      wgmma_nb<MB>(acc, wg_desc(st0 + wrow + kk * 32), db);
      if (FA > 0) wgmma_nb<MB>(acca, wg_desc(st0 + WBOX + kk * 32), db);
    }
    wg_commit<0>();
    if (it > 0) {
      wg_wait<1>();
      if (lane == 0) mbar_arrive(bar0 + 8 * (ST + (it - 1) % ST));
    }
  }
  wg_wait<0>();
  wg_hold<MB / 2>(acc);
  if (FA > 0) wg_hold<MB / 2>(acca);
}

// d plus the dot product of eight bf16 values (one 16-byte load) with eight f32 values, summed in
// order (the expands' inner step).
__device__ __forceinline__ float dot8_acc(float d, const V4& v, const float* tp) {
  const u32 wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    d += tp[2 * e] * __uint_as_float(wd[e] << 16);
    d += tp[2 * e + 1] * __uint_as_float(wd[e] & 0xffff0000u);
  }
  return d;
}

// The wgmma rings' barriers (one thread): full[s] with `full` arrivals, empty[s] with one per
// consumer warp, and the B-tile barrier; made visible to the cluster and to the copy engine.
__device__ __forceinline__ void ring_init(u32 bar0, int stages, u32 full, u32 consumers, u32 bbar) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(bar0 + 8 * s, full);
    mbar_init(bar0 + 8 * (stages + s), consumers);
  }
  mbar_init(bbar, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The epilogue's loads of UE items' partial sums from the cluster's KS blocks (distributed shared
// memory; red holds RS floats per W row): item i = i0 + u NT (clamped to the last of `items`) is
// batch row i / SH of W row i % SH of rank q's share. All loads are issued before any is used.
template <int UE, int KS, int NT, int SH, int RS>
__device__ __forceinline__ void cluster_loads(float (&lv)[UE][KS], const float* red, u32 q, int i0, int items) {
#pragma unroll
  for (int u = 0; u < UE; ++u) {
    const int i = min(i0 + u * NT, items - 1), m = i / SH, nl = i % SH;
#pragma unroll
    for (int c = 0; c < KS; ++c) lv[u][c] = KS > 1 ? ld_remote(&red[((int)q * SH + nl) * RS + m], c) : red[((int)q * SH + nl) * RS + m];
  }
}

template <int RT, int KS, int MB, int ST, int FA, int EW, int XL>
__global__ void __cluster_dims__(KS, 1, 1) __launch_bounds__(32 * (RT / 16 + EW + 1), 1) lora_wg(
    const __grid_constant__ TMap wmap, const __grid_constant__ TMap xmap, const __grid_constant__ TMap amap,
    const bf16_t* __restrict__ x, const bf16_t* __restrict__ b, const float* __restrict__ t_in, bf16_t* __restrict__ y, const int* __restrict__ slot,
    const int* __restrict__ rank, const float* __restrict__ scale, int M, int N, int K, int rmax) {
  constexpr int WW = RT / 16, NT = 32 * (WW + EW + 1);
  constexpr int WBOX = RT * 128, ABOX = FA * 128, XBOX = MB * 128, STAGE = WBOX + ABOX + XBOX, RS = MB + 1, SH = RT / KS;
  constexpr int RING = ST * STAGE + (FA > 0 ? 8192 : 0), AR = FA > 0 ? 64 : 0, TAIL = (RT + AR) * RS * 4;
  constexpr int EXTRA0 = ((RING > TAIL ? RING : TAIL) + 1023) / 1024 * 1024;
  static_assert(RT % 64 == 0 && RT <= 256 && FA % 16 == 0 && FA <= 64 && MB % 8 == 0 && MB <= 128 && RT % KS == 0 && (FA == 0) == (EW > 0), "wg shape");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sm = (unsigned char*)(((size_t)smem_raw + 1023) & ~(size_t)1023);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const u32 q = KS > 1 ? cta_rank() : 0u;
  const int cb = blockIdx.x / KS, n0 = cb * RT, nq = n0 + (int)q * SH;
  const int kper = K / KS, kbeg = (int)q * kper, NS = kper / 64;
  const u32 bar0 = smem_u32(sm);  // full[ST], empty[ST], then the B-tile barrier
  const u32 bbar = bar0 + 16 * ST;
  unsigned char* ring = sm + 1024;
  const u32 ring0 = smem_u32(ring);
  unsigned char* extra = ring + EXTRA0;
  // One adapter: bs [SH][rmax] bf16, then st [M][rmax] f32. Bank: ts [M][rmax] f32, ls [M][SH] f32, off [M + 1].
  bf16_t* bs = (bf16_t*)extra;
  float* st = (float*)(extra + ((SH * rmax * 2 + 15) / 16) * 16);
  float* ts = (float*)extra;
  float* ls = ts + M * rmax;
  int* off = (int*)(ls + M * SH);
  const bool issuer = warp == WW + EW && lane == 0;
  if (threadIdx.x == 0) ring_init(bar0, ST, XL ? 33 : 1, WW, bbar);  // XL: the issuing lane's arrive + one per lane's cp.async group
  __syncthreads();
  if (!issuer) griddep_wait();
  float acc[MB / 2];
  float acca[FA > 0 ? MB / 2 : 1];
#pragma unroll
  for (int i = 0; i < MB / 2; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < (FA > 0 ? MB / 2 : 1); ++i) acca[i] = 0.f;
  if (warp == WW + EW) {
    // The issuing warp. Lane 0: the tensor copies of W (and A), the first ring's before the
    // dependency wait. x: lane 0's tensor copy, or (XL) every lane's 16-byte cp.async chunks written
    // in the same 128-byte swizzle (chunk c of row r at c ^ (r & 7)), rows past M zero-filled, each
    // lane's group completing on the stage's full barrier (so the copy engine carries W only).
    constexpr u32 TX = XL ? WBOX + ABOX : STAGE;
    const int pre = NS < ST ? NS : ST;
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&wmap) : "memory");
      if (!XL) asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&xmap) : "memory");
      if (FA > 0) {
        asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&amap) : "memory");
        mbar_expect_tx(bbar, SH * rmax * 2);
        bulk_copy(smem_u32(bs), b + (size_t)nq * rmax, SH * rmax * 2, bbar);
      }
      for (int it = 0; it < pre; ++it) {
        const u32 full = bar0 + 8 * it, st0 = ring0 + it * STAGE;
        const int k = kbeg + it * 64;
        mbar_expect_tx(full, TX);
        tma_2d(st0, &wmap, k, n0, full);
        if (FA > 0) tma_2d(st0 + WBOX, &amap, k, 0, full);
      }
    }
    griddep_wait();
    if (lane == 0 || XL) {
      for (int it = 0; it < NS; ++it) {
        const int s = it % ST;
        const u32 full = bar0 + 8 * s, st0 = ring0 + s * STAGE;
        const int k = kbeg + it * 64;
        if (it >= pre) {
          mbar_wait(bar0 + 8 * (ST + s), ((it / ST) & 1) ^ 1);
          if (lane == 0) {
            mbar_expect_tx(full, TX);
            tma_2d(st0, &wmap, k, n0, full);
            if (FA > 0) tma_2d(st0 + WBOX, &amap, k, 0, full);
          }
        }
        if (XL) {
          const u32 xs = st0 + WBOX + ABOX;
#pragma unroll 4
          for (int c = lane; c < MB * 8; c += 32) {
            const int r = c >> 3, ch = c & 7;
            const bf16_t* src = x + (size_t)(r < M ? r : 0) * K + k + ch * 8;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(xs + r * 128 + ((ch ^ (r & 7)) << 4)), "l"(src), "r"(r < M ? 16 : 0)
                         : "memory");
          }
          asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(full) : "memory");
        } else {
          tma_2d(st0 + WBOX + ABOX, &xmap, k, 0, full);
        }
      }
    }
  } else if (warp < 4) {
    wg_loop<MB, ST, STAGE, FA, WBOX, ABOX, XL>(acc, acca, bar0, ring0, 0u, NS, lane);
  } else if (warp < WW) {
    wg_loop<MB, ST, STAGE, 0, WBOX, ABOX, XL>(acc, acca, bar0, ring0, (u32)(warp >> 2) * 64 * 128, NS, lane);
  } else if (EW > 0) {
    // Expand warps (bank): t rows into shared memory, the chunk offsets per row, then the chunks.
    const int et = threadIdx.x - 32 * WW;
    for (int i = et; i < M * rmax; i += 32 * EW) ts[i] = __ldcg(t_in + i);
    for (int i = et; i < M * SH; i += 32 * EW) ls[i] = 0.f;
    if (et == 0) {
      int o = 0;
      for (int m = 0; m < M; ++m) {
        off[m] = o;
        const int j = slot ? slot[m] : 0;
        o += j >= 0 ? SH * (rank[j] >> 3) : 0;
      }
      off[M] = o;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(32 * EW) : "memory");
    const int total = off[M];
    const int ew = et >> 5;
    for (int base = ew * 256; base < total; base += EW * 256) {
      V4 v[8];
      int row[8], col[8];
      float sc[8];
      int m = 0;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int c = base + u * 32 + lane;
        row[u] = -1;
        if (c < total) {
          while (off[m + 1] <= c) ++m;
          const int j = slot ? slot[m] : 0;
          const int per = rank[j] >> 3, w = c - off[m], nl = w / per, i8 = w - nl * per;
          row[u] = m;
          col[u] = nl * 64 + i8;  // packed (nl, chunk)
          sc[u] = scale[j];
          v[u] = ldg_stream(b + ((size_t)j * N + nq + nl) * rmax + i8 * 8);
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (row[u] < 0) continue;
        const int nl = col[u] >> 6, i8 = col[u] & 63;
        const float* tp = ts + row[u] * rmax + i8 * 8;
        const u32 wd[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          d += tp[2 * e] * __uint_as_float(wd[e] << 16);
          d += tp[2 * e + 1] * __uint_as_float(wd[e] & 0xffff0000u);
        }
        atomicAdd(&ls[row[u] * SH + nl], sc[u] * d);
      }
    }
  }
  __syncthreads();  // every stage consumed (and the expand done): the ring is free for the partial sums
  griddep_launch();
  float* red = (float*)ring;  // [RT + AR][RS]
  if (warp < WW) {
#pragma unroll
    for (int i = 0; i < MB / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = 16 * warp + g + 8 * (e >> 1), m = 8 * i + 2 * tig + (e & 1);
        red[row * RS + m] = acc[4 * i + e];
        if (FA > 0 && warp < 4 && 16 * warp + g + 8 * (e >> 1) < FA) red[(RT + row) * RS + m] = acca[4 * i + e];
      }
  }
  if (KS > 1) cl_sync();
  else __syncthreads();
  // The cluster's partial sums are read UE items at a time, all their (distributed) shared-memory
  // loads issued before the first is used: the epilogue is latency-bound, one item per thread at a
  // time cost ~0.7 us per NT items.
  constexpr int UE = 4;
  if (FA > 0) {
    const int total = M * rmax;
    for (int i0 = threadIdx.x; i0 < total; i0 += NT * UE) {
      float lv[UE][KS];
#pragma unroll
      for (int u = 0; u < UE; ++u) {
        const int i = min(i0 + u * NT, total - 1), m = i / rmax, r = i % rmax;
#pragma unroll
        for (int c = 0; c < KS; ++c) lv[u][c] = KS > 1 ? ld_remote(&red[(RT + r) * RS + m], c) : red[(RT + r) * RS + m];
      }
#pragma unroll
      for (int u = 0; u < UE; ++u) {
        float v = 0.f;
#pragma unroll
        for (int c = 0; c < KS; ++c) v += lv[u][c];
        if (i0 + u * NT < total) st[i0 + u * NT] = v;
      }
    }
    mbar_wait(bbar, 0);
    __syncthreads();
  }
  const float s0 = FA > 0 ? scale[0] : 0.f;
  const int items = SH * M;
  for (int i0 = threadIdx.x; i0 < items; i0 += NT * UE) {
    float lv[UE][KS];
    cluster_loads<UE, KS, NT, SH, RS>(lv, red, q, i0, items);
#pragma unroll
    for (int u = 0; u < UE; ++u) {
      const int i = i0 + u * NT;
      if (i >= items) break;
      const int m = i / SH, nl = i % SH;
      float v = 0.f;
#pragma unroll
      for (int c = 0; c < KS; ++c) v += lv[u][c];
      if (FA > 0) {
        const float* tp = st + m * rmax;
        const bf16_t* bp = bs + nl * rmax;
        float d = 0.f;
        for (int r0 = 0; r0 < rmax; r0 += 2) {
          const u32 w2 = *(const u32*)(bp + r0);
          d += tp[r0] * __uint_as_float(w2 << 16) + tp[r0 + 1] * __uint_as_float(w2 & 0xffff0000u);
        }
        v += s0 * d;
      } else {
        v += ls[m * SH + nl];
      }
      y[(size_t)m * N + nq + nl] = to_bf16(v);
    }
  }
  if (KS > 1) cl_sync();
}

// ---------------------------------------------------------------------------------------------------
// lora_wgt: one adapter, lora_wg's ring (W and x boxes only) with t = x . A^T computed once per
// launch instead of once per cluster (lora_wg's A box made every cluster read all of A: 8 MB at r16,
// 32 MB at r64, on top of W's 32 MB). TW extra warps per block take (16-row A group, 8-row x group,
// K chunk) tasks spread over the whole grid (mma.sync on plain loads of x and A), add them into the
// f32 buffer t_acc [M][rmax] (red.global.add) and count themselves in sync[0]; then, still beside
// the main loop, they wait for all gridDim.x * TW counts (acquire), take t into shared memory and
// count the block's read in sync[1]: the last block to read zeroes t_acc and both counters (no
// memset per call, CUDA-graph safe), so t costs the epilogue nothing.
// KG > 1 splits K further across KG clusters (clusters of 4 and 8 did not fit one wave), so that a
// block can hold more W rows (RT up to 256: x is re-read from L2 once per RT rows, not once per 64):
// the KG blocks holding the same rows' partial sums (each summed over its cluster in distributed
// shared memory first) exchange them through the f32 workspace ws, each finalizing 1 / KG of the
// rows (the sum, the LoRA term, the bf16 store), meeting at a ticket counter per row tile in
// sync[2 + tile] that is never reset. The x box is `xrows` rows (M, or MB): rows of the ring's x
// tile past it are left as they were, which only the discarded accumulator columns m >= M read.
// Every wait needs the whole grid co-resident: the host launches one wave at most (one block per
// SM, ONE_PER_SM). Warp roles: [0, RT / 16) W warps (RT / 64 warpgroups, wgmma), then TW t warps,
// then the issuing warp.
// lora_wgt's grid-wide waits: *p >= want (acquire); a wait past 10 s (a grid not co-resident, which
// the host's one-wave rule prevents) traps instead of hanging the device.
__device__ __forceinline__ void spin_until(const int* p, int want) {
  u64 t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (ld_acq(p) < want) {
    __nanosleep(32);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (t1 - t0 > 10000000000ull) __trap();
  }
}

// ... and the KG blocks' ticket wait: until the counter reaches `want` modulo 2^32.
__device__ __forceinline__ void spin_until_ticket(const int* p, u32 want) {
  u64 t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while ((int)((u32)ld_acq(p) - want) < 0) {
    __nanosleep(32);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (t1 - t0 > 10000000000ull) __trap();
  }
}

// lora_wgt's t tasks: shrink_rows with U 64-wide K steps of loads in flight (U = 1 keeps the
// 256-row form's 21 warps within their 96 registers; shrink_rows keeps two).
template <int U>
__device__ __forceinline__ void shrink_rows_u(const bf16_t* __restrict__ abase, int lda, int r_valid, const bf16_t* __restrict__ xbase, int ldx,
                                              int mvalid, int kb, int ke, float* acc) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const V4 zero = {0u, 0u, 0u, 0u};
  const bool ok0 = g < r_valid, ok1 = g + 8 < r_valid, okx = g < mvalid;
  const bf16_t* p0 = abase + (size_t)g * lda + tig * 16;
  const bf16_t* p1 = abase + (size_t)(g + 8) * lda + tig * 16;
  const bf16_t* px = xbase + (size_t)(okx ? g : 0) * ldx + tig * 16;
  for (int k0 = kb; k0 < ke; k0 += 64 * U) {
    V4 lo[U][2], hi[U][2], xv[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kc = k0 + u * 64;
      const bool on = kc < ke;
      lo[u][0] = on && ok0 ? ldg_stream(p0 + kc) : zero;
      lo[u][1] = on && ok0 ? ldg_stream(p0 + kc + 8) : zero;
      hi[u][0] = on && ok1 ? ldg_stream(p1 + kc) : zero;
      hi[u][1] = on && ok1 ? ldg_stream(p1 + kc + 8) : zero;
      xv[u][0] = on && okx ? ldg_x(px + kc) : zero;
      xv[u][1] = on && okx ? ldg_x(px + kc + 8) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const V4& xa = xv[u][j >> 1];
        const V4& l = lo[u][j >> 1];
        const V4& h = hi[u][j >> 1];
        const int w0 = (2 * j) & 3, w1 = (2 * j + 1) & 3;
        mma_bf16(acc, vword(l, w0), vword(h, w0), vword(l, w1), vword(h, w1), vword(xa, w0), vword(xa, w1));
      }
  }
}

template <int RT, int KS, int KG, int MB, int ST, int TW>
__global__ void __cluster_dims__(KS, 1, 1) __launch_bounds__(32 * (RT / 16 + TW + 1), 1) lora_wgt(
    const __grid_constant__ TMap wmap, const __grid_constant__ TMap xmap, const bf16_t* __restrict__ x, const bf16_t* __restrict__ a,
    const bf16_t* __restrict__ b, bf16_t* __restrict__ y, float* __restrict__ t_acc, float* __restrict__ ws, int* __restrict__ sync,
    const float* __restrict__ scale, int M, int N, int K, int rmax, int kch, int xrows) {
  constexpr int WW = RT / 16, NT = 32 * (WW + TW + 1);
  constexpr int WBOX = RT * 128, XBOX = MB * 128, STAGE = WBOX + XBOX, RS = MB + 1, SH = RT / KS, OW = SH / KG;
  constexpr int RING = ST * STAGE, TAIL = RT * RS * 4;
  constexpr int EXTRA0 = ((RING > TAIL ? RING : TAIL) + 1023) / 1024 * 1024;
  static_assert(RT % 64 == 0 && RT <= 256 && MB % 8 == 0 && MB <= 64 && RT % (KS * KG) == 0 && OW % 8 == 0 && TW >= 1 && ST <= 16, "wgt shape");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sm = (unsigned char*)(((size_t)smem_raw + 1023) & ~(size_t)1023);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const u32 q = KS > 1 ? cta_rank() : 0u;
  const int cl = blockIdx.x / KS, cb = cl / KG, kg = cl % KG, tile = cb * KS + (int)q;
  const int n0 = cb * RT, nq = n0 + (int)q * SH, no = nq + kg * OW;  // this block finishes rows [no, no + OW)
  const int kper = K / (KS * KG), kbeg = (kg * KS + (int)q) * kper, NS = kper / 64;
  const u32 bar0 = smem_u32(sm);  // full[ST], empty[ST], the B-tile barrier, then the `last` flag
  const u32 bbar = bar0 + 16 * ST;
  int* last = (int*)(sm + 16 * ST + 8);
  unsigned char* ring = sm + 1024;
  const u32 ring0 = smem_u32(ring);
  unsigned char* extra = ring + EXTRA0;
  bf16_t* bs = (bf16_t*)extra;                                     // [OW][rmax] bf16: B's rows this block finishes
  float* st = (float*)(extra + ((OW * rmax * 2 + 15) / 16) * 16);  // [M][rmax]: t
  float* own = st + M * rmax;                                      // [OW][RS]: this block's part of the cluster sums
  const bool issuer = warp == WW + TW && lane == 0;
  if (threadIdx.x == 0) ring_init(bar0, ST, 1, WW, bbar);
  __syncthreads();
  // Everything but the weights (W, B) waits for the previous grid (programmatic dependent launch;
  // returns at once without it): x, t_acc, ws, the counters and y may belong to it.
  if (!issuer) griddep_wait();
  float acc[MB / 2];
  float dummy[1] = {0.f};
#pragma unroll
  for (int i = 0; i < MB / 2; ++i) acc[i] = 0.f;
  if (warp == WW + TW) {
    if (lane == 0) {
      const int pre = NS < ST ? NS : ST;
      asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&wmap) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"((u64)&xmap) : "memory");
      mbar_expect_tx(bbar, OW * rmax * 2);
      bulk_copy(smem_u32(bs), b + (size_t)no * rmax, OW * rmax * 2, bbar);
      const u32 tx = WBOX + xrows * 128;
      for (int it = 0; it < pre; ++it) {
        const u32 full = bar0 + 8 * it;
        mbar_expect_tx(full, tx);
        tma_2d(ring0 + it * STAGE, &wmap, kbeg + it * 64, n0, full);
      }
      griddep_wait();
      for (int it = 0; it < NS; ++it) {
        const int s = it % ST;
        const u32 full = bar0 + 8 * s, st0 = ring0 + s * STAGE;
        const int k = kbeg + it * 64;
        if (it >= pre) {
          mbar_wait(bar0 + 8 * (ST + s), ((it / ST) & 1) ^ 1);
          mbar_expect_tx(full, tx);
          tma_2d(st0, &wmap, k, n0, full);
        }
        tma_2d(st0 + WBOX, &xmap, k, 0, full);
      }
    }
  } else if (warp < WW) {
    wg_loop<MB, ST, STAGE, 0, WBOX, 0, 0>(acc, dummy, bar0, ring0, (u32)(warp >> 2) * 64 * 128, NS, lane);
  } else {
    // t warps: this grid's share of the (A group, x group, K chunk) tasks, then one count each.
    const int tw = warp - WW, groups = (rmax + 15) / 16, mgroups = (M + 7) / 8, ntask = groups * mgroups * kch, kc = K / kch;
    for (int task = blockIdx.x * TW + tw; task < ntask; task += gridDim.x * TW) {
      const int c = task % kch, rest = task / kch, mg = rest % mgroups, ga = rest / mgroups;
      const int m0 = mg * 8, mv = min(8, M - m0);
      float ta[4] = {0.f, 0.f, 0.f, 0.f};
      shrink_rows_u<RT >= 256 ? 1 : 2>(a + (size_t)ga * 16 * K, K, rmax - ga * 16, x + (size_t)m0 * K, K, mv, c * kc, (c + 1) * kc, ta);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = ga * 16 + g + (e >> 1) * 8, m = 2 * tig + (e & 1);
        if (i < rmax && m < mv) atomicAdd(&t_acc[(size_t)(m0 + m) * rmax + i], ta[e]);
      }
    }
    __threadfence();
    __syncwarp();
    if (lane == 0) atomicAdd(&sync[0], 1);
    // Still beside the main loop: wait for every task of the grid (acquire), take t into shared
    // memory, count this block's read; the last block to read zeroes t_acc and both counters.
    constexpr int TT = 32 * TW;
    const int tt = threadIdx.x - 32 * WW;
    if (tt == 0) spin_until(&sync[0], (int)gridDim.x * TW);
    asm volatile("bar.sync 1, %0;" ::"n"(TT) : "memory");
    for (int i = tt; i < M * rmax; i += TT) st[i] = __ldcg(&t_acc[i]);
    asm volatile("bar.sync 1, %0;" ::"n"(TT) : "memory");
    if (tt == 0) {
      __threadfence();
      *last = atomicAdd(&sync[1], 1) == (int)gridDim.x - 1;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(TT) : "memory");
    if (*last) {
      for (int i = tt; i < M * rmax; i += TT) t_acc[i] = 0.f;
      __threadfence();
      asm volatile("bar.sync 1, %0;" ::"n"(TT) : "memory");
      if (tt == 0) {
        sync[0] = 0;
        sync[1] = 0;
        __threadfence();
      }
    }
  }
  __syncthreads();  // every stage consumed (and t read): the ring is free for the partial sums
  griddep_launch();
  float* red = (float*)ring;  // [RT][RS]
  if (warp < WW) {
#pragma unroll
    for (int i = 0; i < MB / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(16 * warp + g + 8 * (e >> 1)) * RS + 8 * i + 2 * tig + (e & 1)] = acc[4 * i + e];
  }
  if (KS > 1) cl_sync();
  else __syncthreads();
  // Stage 1: the cluster's partial sums of this block's SH rows (UE items' distributed shared-memory
  // loads in flight at a time); part kg stays here, the other KG - 1 parts go to their blocks via ws
  // ([tile][destination part][source part][M][OW] f32).
  constexpr int UE = 4;
  const int items = SH * M;
  for (int i0 = threadIdx.x; i0 < items; i0 += NT * UE) {
    float lv[UE][KS];
    cluster_loads<UE, KS, NT, SH, RS>(lv, red, q, i0, items);
#pragma unroll
    for (int u = 0; u < UE; ++u) {
      const int i = i0 + u * NT;
      if (i >= items) break;
      const int m = i / SH, nl = i % SH, p = nl / OW, r = nl % OW;
      float v = 0.f;
#pragma unroll
      for (int c = 0; c < KS; ++c) v += lv[u][c];
      if (p == kg) own[r * RS + m] = v;
      else ws[((((size_t)tile * KG + p) * KG + kg) * MB + m) * OW + r] = v;
    }
  }
  // The KG blocks of this row tile: every part in ws (fenced, then one ticket per block), wait for
  // all KG. The counters are never reset: each block adds 8 / KG, so a launch moves its tile's
  // counter by 8 whatever its KG, and the wait compares with wrap-around.
  if (KG > 1) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const u32 t0 = (u32)atomicAdd(&sync[2 + tile], 8 / KG);
      spin_until_ticket(&sync[2 + tile], (t0 & ~7u) + 8u);
    }
  }
  __syncthreads();
  mbar_wait(bbar, 0);
  // Stage 2: rows [no, no + OW): own part + the other KG - 1 blocks' parts, the LoRA term, bf16.
  const float s0 = scale[0];
  for (int i = threadIdx.x; i < OW * M; i += NT) {
    const int m = i / OW, r = i % OW;
    float v = own[r * RS + m];
#pragma unroll
    for (int src = 0; src < KG; ++src)
      if (src != kg) v += __ldcg(&ws[((((size_t)tile * KG + kg) * KG + src) * MB + m) * OW + r]);
    const float* tp = st + m * rmax;
    const bf16_t* bp = bs + r * rmax;
    float d = 0.f;
    // The row's 16-byte chunks from chunk r mod nc on: a warp's lanes (consecutive rows, rmax * 2
    // bytes apart) then read different banks; in order from 0, every lane of a quarter-warp hit the
    // same four (32-way at rank 64: ~9 us of a 64-row epilogue).
    const int nc = rmax >> 3;
    int c = r % nc;
    for (int s = 0; s < nc; ++s) {
      const V4 bv = *(const V4*)(bp + c * 8);
      const float4 t0 = *(const float4*)(tp + c * 8), t1 = *(const float4*)(tp + c * 8 + 4);
      d += t0.x * __uint_as_float(bv.x << 16) + t0.y * __uint_as_float(bv.x & 0xffff0000u);
      d += t0.z * __uint_as_float(bv.y << 16) + t0.w * __uint_as_float(bv.y & 0xffff0000u);
      d += t1.x * __uint_as_float(bv.z << 16) + t1.y * __uint_as_float(bv.z & 0xffff0000u);
      d += t1.z * __uint_as_float(bv.w << 16) + t1.w * __uint_as_float(bv.w & 0xffff0000u);
      if (++c == nc) c = 0;
    }
    y[(size_t)m * N + no + r] = to_bf16(v + s0 * d);
  }
  // No block leaves while another of its cluster may still read its shared memory.
  if (KS > 1) cl_sync();
}

// The expands' t row: tr[i] = sum over lora_shrink's kc K slices of t[z][m][i], i < r, the block's
// nt threads striding over i.
__device__ __forceinline__ void sum_t_row(float* tr, const float* __restrict__ t, int m, int M, int rmax, int kc, int r, int tid, int nt) {
  for (int i = tid; i < r; i += nt) {
    float s = 0.f;
    for (int z = 0; z < kc; ++z) s += __ldcg(t + ((size_t)z * M + m) * rmax + i);
    tr[i] = s;
  }
}

// The bank's shrink: t[z][m][i] = x[m, Kz] . A_j[i, Kz]^T (j = slot[m], i < rank_j; f32) over the
// z-th of gridDim.z K slices, one block per (row, 16-row A group, slice), KW warps splitting the
// slice, summed in shared memory, written once (no atomics, no reset; lora_expand sums the slices,
// lora_wg takes one). Launched right before lora_wg: it lets that launch start (its weight
// prefetch) at once and writes t only after the previous grid is done (programmatic dependent
// launch; without it both are no-ops).
// One lora_shrink block's work: batch row m, 16-row A group ga, K slice z of kc (KW warps splitting it).
template <int KW>
__device__ __forceinline__ void shrink_block(const bf16_t* __restrict__ x, const bf16_t* __restrict__ a, float* __restrict__ t,
                                             const int* __restrict__ slot, const int* __restrict__ rank, int M, int K, int rmax, int m,
                                             int ga, int z, int kc) {
  __shared__ float part[KW][16];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int j = slot ? slot[m] : 0;
  const int r = j >= 0 ? rank[j] : 0;
  if (ga * 16 >= r) return;
  const int kper = K / (KW * kc), k0 = (z * KW + warp) * kper;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  shrink_rows(a + ((size_t)j * rmax + ga * 16) * K, K, r - ga * 16, x + (size_t)m * K, K, 1, k0, k0 + kper, acc);
  if ((lane & 3) == 0) {
    part[warp][lane >> 2] = acc[0];
    part[warp][(lane >> 2) + 8] = acc[2];
  }
  __syncthreads();
  if (threadIdx.x < 16 && ga * 16 + (int)threadIdx.x < r) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < KW; ++w) v += part[w][threadIdx.x];
    t[((size_t)z * M + m) * rmax + ga * 16 + threadIdx.x] = v;
  }
}

// The bank's shrink: t[z][m][i] = x[m, Kz] . A_j[i, Kz]^T (j = slot[m], i < rank_j; f32) over the
// z-th of gridDim.z K slices, one block per (row, 16-row A group, slice), KW warps splitting the
// slice, summed in shared memory, written once (no atomics, no reset; lora_expand sums the slices,
// lora_wg takes one). Launched right before lora_wg: it lets that launch start (its weight
// prefetch) at once and writes t only after the previous grid is done (programmatic dependent
// launch; without it both are no-ops).
template <int KW>
__global__ void __launch_bounds__(32 * KW) lora_shrink(const bf16_t* __restrict__ x, const bf16_t* __restrict__ a, float* __restrict__ t,
                                                       const int* __restrict__ slot, const int* __restrict__ rank, int M, int K, int rmax) {
  griddep_launch();  // (lora_wg's prefetch may start; lora_expand waits for this grid anyway)
  griddep_wait();
  shrink_block<KW>(x, a, t, slot, rank, M, K, rmax, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.z);
}

// Up to SET_MAX bank linears of one input x and one set of per-row slots (a layer's q, k and v, or
// its gate and up): each projection g has its own tables (A [S, rmax_g, K], B^T [S, rmax_g, N_g]),
// ranks and scales, t buffer ([kc][M][rmax_g] f32), f32 term d_g [M, N_g] and output y_g [M, N_g].
// The launches below take the whole set at once: one grid covers every projection (blockIdx.y of
// the shrink walks the projections' 16-row A groups, blockIdx.x of the expand and the add their
// column blocks), so a layer's LoRA half beside its base GEMMs is three launches, not three per
// projection, and each is wide enough to keep DRAM busy.
#define SET_MAX 4
struct BankSet {
  const bf16_t* a[SET_MAX];
  const bf16_t* bt[SET_MAX];
  float* t[SET_MAX];
  float* d[SET_MAX];
  bf16_t* y[SET_MAX];
  const int* rank[SET_MAX];
  const float* scale[SET_MAX];
  int rmax[SET_MAX];
  int n[SET_MAX];
  int first[SET_MAX + 1];  // the shrink's: projection g owns blockIdx.y in [first[g], first[g + 1])
  int cols[SET_MAX + 1];   // the expand's (256 columns per block), likewise over blockIdx.x
  int adds[SET_MAX + 1];   // the add's (2048 elements of [M, N_g] per block), likewise
  int count;
};

__device__ __forceinline__ int set_member(const int* start, int count, int i) {
  int g = 0;
  while (g + 1 < count && i >= start[g + 1]) ++g;
  return g;
}

// lora_shrink over a BankSet: block (m, y, z) is projection g's 16-row A group y - first[g].
template <int KW>
__global__ void __launch_bounds__(32 * KW) lora_shrink_set(const bf16_t* __restrict__ x, const int* __restrict__ slot, BankSet s, int M, int K) {
  griddep_wait();
  const int g = set_member(s.first, s.count, blockIdx.y);
  shrink_block<KW>(x, s.a[g], s.t[g], slot, s.rank[g], M, K, s.rmax[g], blockIdx.x, blockIdx.y - s.first[g], blockIdx.z, gridDim.z);
}

// The LoRA half of a linear whose base GEMM ran before (cuBLAS wrote y = x . W^T in bf16): y[m][n]
// += s_j . sum_i t[m][i] B_j[n][i], j = slot[m] (-1: none), t the sum of lora_shrink's kc K slices. One thread per
// output column, NB per block, one batch row per block row; each thread streams its B row's first
// rank_j columns (16-byte loads, up to 8 in flight), t's row sits in shared memory. Waits for the
// previous grids (t, y) first.
template <int NB>
__global__ void __launch_bounds__(NB) lora_expand(const float* __restrict__ t, const bf16_t* __restrict__ b, bf16_t* __restrict__ y,
                                                  const int* __restrict__ slot, const int* __restrict__ rank, const float* __restrict__ scale,
                                                  int M, int N, int rmax, int kc) {
  __shared__ float tr[128];
  griddep_wait();
  const int m = blockIdx.y, n = blockIdx.x * NB + threadIdx.x;
  const int j = slot ? slot[m] : 0;
  if (j < 0) return;
  const int r = rank[j];
  sum_t_row(tr, t, m, M, rmax, kc, r, threadIdx.x, NB);
  __syncthreads();
  if (n >= N) return;
  const bf16_t* bp = b + ((size_t)j * N + n) * rmax;
  float d = 0.f;
  for (int i0 = 0; i0 < r; i0 += 64) {
    V4 v[8];
#pragma unroll
    for (int c = 0; c < 8; ++c)
      if (i0 + 8 * c < r) v[c] = ldg_x(bp + i0 + 8 * c);
#pragma unroll
    for (int c = 0; c < 8; ++c)
      if (i0 + 8 * c < r) d = dot8_acc(d, v[c], tr + i0 + 8 * c);
  }
  bf16_t* yp = y + (size_t)m * N + n;
  const float yv = __uint_as_float(((u32)*yp) << 16);
  *yp = to_bf16(yv + scale[j] * d);
}

// lora_expand with its loads reordered: the row's B_j chunks (a weight: before the dependency wait,
// as lora_wg takes its first W ring) and y's element are requested before t's K slices are summed,
// so one thread's B, y and t round trips overlap instead of following one another. Same sums and
// rounding as lora_expand.
template <int NB>
__global__ void __launch_bounds__(NB) lora_expand2(const float* __restrict__ t, const bf16_t* __restrict__ b, bf16_t* __restrict__ y,
                                                   const int* __restrict__ slot, const int* __restrict__ rank, const float* __restrict__ scale,
                                                   int M, int N, int rmax, int kc) {
  __shared__ float tr[128];
  const int m = blockIdx.y, n = blockIdx.x * NB + threadIdx.x;
  const int j = slot ? slot[m] : 0;
  if (j < 0) {
    griddep_wait();
    return;
  }
  const int r = rank[j];
  const bool on = n < N;
  const bf16_t* bp = b + ((size_t)j * N + (on ? n : 0)) * rmax;
  V4 v[8];
#pragma unroll
  for (int c = 0; c < 8; ++c)
    if (8 * c < r) v[c] = ldg_x(bp + 8 * c);
  griddep_wait();
  bf16_t* yp = y + (size_t)m * N + (on ? n : 0);
  const u32 yraw = on ? (u32)*yp : 0u;
  sum_t_row(tr, t, m, M, rmax, kc, r, threadIdx.x, NB);
  __syncthreads();
  if (!on) return;
  float d = 0.f;
  for (int i0 = 0; i0 < r; i0 += 64) {
    if (i0 > 0) {
#pragma unroll
      for (int c = 0; c < 8; ++c)
        if (i0 + 8 * c < r) v[c] = ldg_x(bp + i0 + 8 * c);
    }
#pragma unroll
    for (int c = 0; c < 8; ++c)
      if (i0 + 8 * c < r) d = dot8_acc(d, v[c], tr + i0 + 8 * c);
  }
  *yp = to_bf16(__uint_as_float(yraw << 16) + scale[j] * d);
}

// y's eight bf16 values (one 16-byte load) plus eight f32 addends, each sum rounded to bf16 once.
__device__ __forceinline__ V4 add8_bf16(V4 yv, const float* d) {
  u32 wd[4] = {yv.x, yv.y, yv.z, yv.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const u32 lo = to_bf16(__uint_as_float(wd[e] << 16) + d[2 * e]);
    const u32 hi = to_bf16(__uint_as_float(wd[e] & 0xffff0000u) + d[2 * e + 1]);
    wd[e] = lo | (hi << 16);
  }
  yv.x = wd[0];
  yv.y = wd[1];
  yv.z = wd[2];
  yv.w = wd[3];
  return yv;
}

// The LoRA half again, with the factor reads coalesced (lora_expand's thread per column reads 16
// bytes of 32 different B_j rows per warp load). Block (bx, m): batch row m, j = slot[m], rank r (a
// multiple of 8). L, the power of two >= r / 8, lanes share a column, each loading one 16-byte
// chunk of B_j[n][0 : r] (lanes past r / 8 idle), so one warp load takes 32 / L whole columns;
// P loads per thread, all issued before the dependency wait (B is a weight), NT / L columns per
// load, P NT / L per block: the grid's x is sized for the bank's widest rank (lmax lanes), and a
// narrower row's blocks cover more columns each (those starting past N exit). Each column's dot
// with t's row is summed over its L lanes by shuffles and staged in shared memory, then y is
// updated with 16-byte accesses: MODE 0 y[m][n] = bf16(y + s_j d) (y written by the base GEMM
// before); MODE 1 writes s_j d in f32 to d_out instead and does not touch y (it runs beside the
// base GEMM; lora_add folds it in after). t is the sum of lora_shrink's kc K slices.
template <int NT, int P, int MODE>
__global__ void __launch_bounds__(NT) lora_expand3(const float* __restrict__ t, const bf16_t* __restrict__ b, bf16_t* __restrict__ y,
                                                   float* __restrict__ d_out, const int* __restrict__ slot, const int* __restrict__ rank,
                                                   const float* __restrict__ scale, int M, int N, int rmax, int kc) {
  __shared__ float tr[128];
  __shared__ __align__(16) float ds[P * NT];
  const int m = blockIdx.y, tid = threadIdx.x;
  const int j = slot ? slot[m] : 0;
  const int r = j >= 0 ? rank[j] : 0;
  int lanes = 1;
  while (lanes * 8 < r) lanes <<= 1;
  const int per = NT / lanes, cols_blk = P * per, n0 = blockIdx.x * cols_blk;
  if (j < 0 || n0 >= N) {
    griddep_wait();
    return;
  }
  const int q = tid & (lanes - 1), c0 = tid / lanes;
  const bool on = q * 8 < r;
  const V4 zero = {0u, 0u, 0u, 0u};
  V4 v[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int n = n0 + p * per + c0;
    v[p] = on && n < N ? ldg_x(b + ((size_t)j * N + n) * rmax + q * 8) : zero;
  }
  griddep_wait();
  sum_t_row(tr, t, m, M, rmax, kc, r, tid, NT);
  __syncthreads();
  float tv[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) tv[e] = on ? tr[q * 8 + e] : 0.f;
  const float sj = scale[j];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    float d = dot8_acc(0.f, v[p], tv);
    for (int o = 1; o < lanes; o <<= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (q == 0) ds[p * per + c0] = sj * d;
  }
  __syncthreads();
  const int cols = min(cols_blk, N - n0);
  for (int c = tid * 8; c < cols; c += NT * 8) {
    const size_t at = (size_t)m * N + n0 + c;
    if (c + 8 <= cols) {
      if (MODE == 0) {
        *(V4*)(y + at) = add8_bf16(*(const V4*)(y + at), ds + c);
      } else {
        *(float4*)(d_out + at) = *(const float4*)(ds + c);
        *(float4*)(d_out + at + 4) = *(const float4*)(ds + c + 4);
      }
    } else {
      for (int e = 0; c + e < cols; ++e) {
        if (MODE == 0)
          y[at + e] = to_bf16(__uint_as_float(((u32)y[at + e]) << 16) + ds[c + e]);
        else
          d_out[at + e] = ds[c + e];
      }
    }
  }
}

// y[m][n] = bf16(y + d[m][n]) over the rows whose slot is not -1 (slot null: every row), eight
// columns per thread (N a multiple of 8): the join of lora_expand3<MODE 1> beside the base GEMM.
__device__ __forceinline__ void add_block(bf16_t* __restrict__ y, const float* __restrict__ d, const int* __restrict__ slot, int M, int N, int blk) {
  const size_t i = ((size_t)blk * 256 + threadIdx.x) * 8, total = (size_t)M * N;
  if (i >= total) return;
  const int m = (int)(i / N);
  if (slot && slot[m] < 0) return;
  const float4 d0 = __ldcs((const float4*)(d + i)), d1 = __ldcs((const float4*)(d + i + 4));
  const float dv[8] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
  *(V4*)(y + i) = add8_bf16(*(const V4*)(y + i), dv);
}

__global__ void __launch_bounds__(256) lora_add(bf16_t* __restrict__ y, const float* __restrict__ d, const int* __restrict__ slot, int M, int N) {
  griddep_wait();
  add_block(y, d, slot, M, N, blockIdx.x);
}

// The LoRA half for factors stored transposed (bt [S][rmax][N]: row i of B_j^T holds column i of
// B_j for every output n), so a row's rank_j factor rows are read whole: one batch row m and 256
// columns per block, 8 per lane (16-byte loads), warp w taking factor rows i = w, w + 8, ... < r
// (at most LW each: LW = the power of two >= rmax / 8, the bank's widest rank), all requested
// before the dependency wait (a weight). No byte of a padded rank row is fetched, where
// [S][N][rmax] storage spreads a narrow row's r elements over 32- or 64-byte sectors. The warps'
// sums meet in shared memory; one warp updates the block's 256 columns 16 bytes at a time, as
// lora_expand3 (MODE 0: y += s_j d; MODE 1: d_out = s_j d in f32, for lora_add after the join).
template <int LW, int MODE>
__device__ __forceinline__ void expand4_block(const float* __restrict__ t, const bf16_t* __restrict__ bt, bf16_t* __restrict__ y,
                                              float* __restrict__ d_out, const int* __restrict__ slot, const int* __restrict__ rank,
                                              const float* __restrict__ scale, int M, int N, int rmax, int kc, int m, int bx) {
  __shared__ float tr[128];
  __shared__ __align__(16) float part[8][256];
  __shared__ __align__(16) float ds[256];
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int j = slot ? slot[m] : 0;
  const int r = j >= 0 ? rank[j] : 0;
  const int n0 = bx * 256, nl = n0 + lane * 8;
  if (j < 0) {
    griddep_wait();
    return;
  }
  const V4 zero = {0u, 0u, 0u, 0u};
  V4 v[LW];
#pragma unroll
  for (int u = 0; u < LW; ++u) {
    const int i = w + 8 * u;
    v[u] = i < r && nl < N ? ldg_x(bt + ((size_t)j * rmax + i) * N + nl) : zero;
  }
  griddep_wait();
  sum_t_row(tr, t, m, M, rmax, kc, r, tid, 256);
  __syncthreads();
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int u = 0; u < LW; ++u) {
    const int i = w + 8 * u;
    if (i < r) {
      const float ti = tr[i];
      const u32 wd[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[2 * e] += ti * __uint_as_float(wd[e] << 16);
        acc[2 * e + 1] += ti * __uint_as_float(wd[e] & 0xffff0000u);
      }
    }
  }
  *(float4*)&part[w][lane * 8] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  *(float4*)&part[w][lane * 8 + 4] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int ww = 0; ww < 8; ++ww) s += part[ww][tid];
  ds[tid] = scale[j] * s;
  __syncthreads();
  if (tid >= 32 || nl >= N) return;
  const size_t at = (size_t)m * N + nl;
  if (MODE == 0) {
    *(V4*)(y + at) = add8_bf16(*(const V4*)(y + at), ds + lane * 8);
  } else {
    *(float4*)(d_out + at) = *(const float4*)(ds + lane * 8);
    *(float4*)(d_out + at + 4) = *(const float4*)(ds + lane * 8 + 4);
  }
}

template <int LW, int MODE>
__global__ void __launch_bounds__(256) lora_expand4(const float* __restrict__ t, const bf16_t* __restrict__ bt, bf16_t* __restrict__ y,
                                                    float* __restrict__ d_out, const int* __restrict__ slot, const int* __restrict__ rank,
                                                    const float* __restrict__ scale, int M, int N, int rmax, int kc) {
  expand4_block<LW, MODE>(t, bt, y, d_out, slot, rank, scale, M, N, rmax, kc, blockIdx.y, blockIdx.x);
}

// lora_expand4<MODE 1> over a BankSet (LW for the set's widest rank): block (x, m) is projection g's
// column block x - cols[g], writing s_j t B_j^T to d_g.
template <int LW>
__global__ void __launch_bounds__(256) lora_expand4_set(const int* __restrict__ slot, BankSet s, int M, int kc) {
  const int g = set_member(s.cols, s.count, blockIdx.x);
  expand4_block<LW, 1>(s.t[g], s.bt[g], nullptr, s.d[g], slot, s.rank[g], s.scale[g], M, s.n[g], s.rmax[g], kc, blockIdx.y, blockIdx.x - s.cols[g]);
}

// lora_add over a BankSet: block x is projection g's block x - adds[g].
__global__ void __launch_bounds__(256) lora_add_set(const int* __restrict__ slot, BankSet s, int M) {
  griddep_wait();
  const int g = set_member(s.adds, s.count, blockIdx.x);
  add_block(s.y[g], s.d[g], slot, M, s.n[g], blockIdx.x - s.adds[g]);
}
