// The LoRA term of a compute-bound fused linear (hundreds to thousands of rows), meant to run on a
// few SMs beside cuBLAS's base GEMM (a side stream), or on the whole chip before or after it:
//
//   MODE 0 (pre):  y[m, n]  = s * sum_i t[m, i] B[n, i]          (written; cuBLAS then adds x . W^T with beta = 1)
//   MODE 1 (add):  y[m, n] += s * sum_i t[m, i] B[n, i]          (y read, the sum rounded to bf16 once)
//   t[m, i] = sum_k x[m, k] A[i, k]   (f32 accumulation; s . t rounded to bf16 for the second product)
//
// One adapter: x [M, K], A [r, K], B [N, r] (r <= RP, a multiple of 8; A rows and B columns past r
// read as zeros), y [M, ldy] bf16. Blocks (gridDim.x of them: the host picks how many SMs the term
// may take) stride over 16 * MG-row blocks of x. Per row block: the NW warps split the MG 16-row
// groups and K (NW / MG slices) and compute t with mma.sync.m16n8k16 (x the A operand, loaded
// straight from global memory, 32 contiguous bytes per lane and row; the adapter's A the B
// operand, from L1/L2; K permuted identically for both, so each lane's loads are contiguous); the
// slices meet in shared memory, s . t is stored there as bf16; then each warp takes one NW-th of
// the N columns for all the block's rows: B fragments from global memory (four 16-column steps'
// loads issued together), t fragments by ldmatrix, the products stored as bf16 pairs. x is read
// once, y written (MODE 0) or read and written (MODE 1) once; A and B come from L2.

typedef unsigned short bf16_t;
typedef unsigned int u32;

struct __align__(16) V4 { u32 x, y, z, w; };

__device__ __forceinline__ V4 big_ld_stream(const bf16_t* p) {
  V4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ V4 big_ld_cached(const bf16_t* p) {
  V4 r;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ u32 big_ld32(const bf16_t* p) {
  u32 r;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}

// L2 prefetch of a contiguous range by the copy engine (no registers held while it is in flight).
__device__ __forceinline__ void big_prefetch_l2(const void* p, u32 bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

__device__ __forceinline__ u32 big_vword(const V4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

__device__ __forceinline__ void big_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// bf16 pair: lo in the low half (the lower column), both rounded to nearest even.
__device__ __forceinline__ u32 big_pack(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float big_lo(u32 v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float big_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ void big_ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

template <int RP, int NW, int MG, int U, int MODE, int BS>
__global__ void __launch_bounds__(32 * NW) lora_lowrank(const bf16_t* __restrict__ x, const bf16_t* __restrict__ a, const bf16_t* __restrict__ b,
                                                        bf16_t* __restrict__ y, float s, int M, int N, int K, int r, int ldy) {
  static_assert(RP % 16 == 0 && RP <= 64 && NW % MG == 0 && NW <= 16 && (MG == 1 || MG == 2 || MG == 4) && U >= 1 && U <= 4 && (BS == 0 || RP == 16),
                "lowrank shape");
  constexpr int NBR = RP / 8, KS = RP / 16, MR = 16 * MG, TS = RP * 2 + 16, SL = NW / MG;  // SL: K slices per row group
  constexpr int NBU = RP <= 32 ? 4 : 2;  // 16-column steps whose loads go out together (host: N / NW a multiple of 16 NBU)
  __shared__ __align__(16) unsigned char tsm[MR * TS];
  __shared__ float part[NW][16][RP + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const V4 zero = {0u, 0u, 0u, 0u};
  const int ncols = N / NW, nbeg = warp * ncols;  // host: N % (64 * NW) == 0
  const int grp = warp % MG, slice = warp / MG, kper = K / SL, kb = slice * kper;  // host: K % (64 * U * SL) == 0
  const u32 ts0 = (u32)__cvta_generic_to_shared(tsm) + (u32)((lane & 15) * TS + (lane >> 4) * 16);
  // BS: all of B ([N][16] bf16, 32 bytes a row) in dynamic shared memory, loaded once per block; 16-byte
  // chunk c of row n at c ^ ((n >> 2) & 1), so the ldmatrix rows below hit 8 distinct bank groups.
  extern __shared__ __align__(16) unsigned char bsm[];
  if (BS) {
    for (int i = threadIdx.x; i < 2 * N; i += 32 * NW) {
      const int n = i >> 1, c = i & 1;
      V4 v = zero;
      if (c * 8 < r) v = big_ld_cached(b + (size_t)n * r + c * 8);
      *(V4*)(bsm + n * 32 + ((c ^ ((n >> 2) & 1)) << 4)) = v;
    }
    __syncthreads();
  }
  // ldmatrix lane address into B (BS): matrix lane >> 3 = (8-row half, k half), its row lane & 7
  const int bl_n = ((lane >> 4) << 3) + (lane & 7), bl_c = (lane >> 3) & 1;
  for (int rb = blockIdx.x; rb * MR < M; rb += gridDim.x) {
    const int mb = rb * MR, m0 = mb + grp * 16;
    const bool v0 = m0 + g < M, v1 = m0 + g + 8 < M;
    const bf16_t* x0 = x + (size_t)(v0 ? m0 + g : 0) * K + tig * 16;
    const bf16_t* x1 = x + (size_t)(v1 ? m0 + g + 8 : 0) * K + tig * 16;
    float acc[NBR][4];
#pragma unroll
    for (int q = 0; q < NBR; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
    if (m0 < M) {
      for (int k0 = kb; k0 < kb + kper; k0 += 64 * U) {
        V4 xv[U][2][2], av[U][NBR][2];
#pragma unroll
        for (int uu = 0; uu < U; ++uu) {
          const int kc = k0 + 64 * uu;
          xv[uu][0][0] = big_ld_stream(x0 + kc);
          xv[uu][0][1] = big_ld_stream(x0 + kc + 8);
          xv[uu][1][0] = big_ld_stream(x1 + kc);
          xv[uu][1][1] = big_ld_stream(x1 + kc + 8);
#pragma unroll
          for (int q = 0; q < NBR; ++q) {
            const int row = 8 * q + g;
            const bf16_t* ap = a + (size_t)(row < r ? row : 0) * K + tig * 16 + kc;
            av[uu][q][0] = big_ld_cached(ap);  // unconditional (a clamped row), zeroed after: the loads stay batched
            av[uu][q][1] = big_ld_cached(ap + 8);
          }
        }
#pragma unroll
        for (int uu = 0; uu < U; ++uu)
#pragma unroll
          for (int q = 0; q < NBR; ++q)
            if (8 * q + g >= r) av[uu][q][0] = av[uu][q][1] = zero;
        // k16 step j: lane tig's logical k {2tig, 2tig+1} / {2tig+8, 2tig+9} are physical
        // 16 tig + 4 j + {0, 1} / {2, 3}: words 2j and 2j+1 of its 32 contiguous bytes.
#pragma unroll
        for (int uu = 0; uu < U; ++uu)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int h = j >> 1, w0 = (2 * j) & 3, w1 = (2 * j + 1) & 3;
            const u32 a0 = big_vword(xv[uu][0][h], w0), a1 = big_vword(xv[uu][1][h], w0), a2 = big_vword(xv[uu][0][h], w1),
                      a3 = big_vword(xv[uu][1][h], w1);
#pragma unroll
            for (int q = 0; q < NBR; ++q) big_mma(acc[q], a0, a1, a2, a3, big_vword(av[uu][q][h], w0), big_vword(av[uu][q][h], w1));
          }
      }
    }
    // the K slices' partial t (rows g, g + 8 of the warp's group; columns 8q + 2tig, +1) meet in shared memory
#pragma unroll
    for (int q = 0; q < NBR; ++q) {
      part[warp][g][8 * q + 2 * tig] = acc[q][0];
      part[warp][g][8 * q + 2 * tig + 1] = acc[q][1];
      part[warp][g + 8][8 * q + 2 * tig] = acc[q][2];
      part[warp][g + 8][8 * q + 2 * tig + 1] = acc[q][3];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < MR * RP / 2; e += 32 * NW) {
      const int row = e / (RP / 2), c = 2 * (e % (RP / 2)), gr = row / 16, rr = row % 16;
      float v0s = 0.f, v1s = 0.f;
#pragma unroll
      for (int sl = 0; sl < SL; ++sl) {
        v0s += part[sl * MG + gr][rr][c];
        v1s += part[sl * MG + gr][rr][c + 1];
      }
      *(u32*)(tsm + row * TS + c * 2) = big_pack(s * v0s, s * v1s);
    }
    __syncthreads();
    // the next row block's x rows into L2 while this one's products are written (lanes of every warp, one row each)
    {
      const int nb0 = (rb + (int)gridDim.x) * MR;
      for (int rr = threadIdx.x; rr < MR; rr += 32 * NW)
        if (nb0 + rr < M) big_prefetch_l2(x + (size_t)(nb0 + rr) * K, (u32)K * 2u);
    }
    // y[mb + 0 .. MR) x [nbeg, nbeg + ncols): B fragments (b0 = B[n][16 ks + 2 tig, +1], b1 = the
    // same + 8, n = n0 + 8 u + g) for NBU 16-column steps, double-buffered (the next steps' loads go
    // out before this step's products), t fragments by ldmatrix once per row group
    u32 tf[MG][KS][4];
#pragma unroll
    for (int rg = 0; rg < MG; ++rg)
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) big_ldsm_x4(ts0 + rg * 16 * TS + ks * 32, tf[rg][ks][0], tf[rg][ks][1], tf[rg][ks][2], tf[rg][ks][3]);
    u32 bf[2][NBU][2][KS][2];
    auto load_b = [&](u32 (&dst)[NBU][2][KS][2], int nn) {
#pragma unroll
      for (int st = 0; st < NBU; ++st)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const bf16_t* bp = b + (size_t)(nn + 16 * st + 8 * u + g) * r + 2 * tig;
#pragma unroll
          for (int ks = 0; ks < KS; ++ks) {
            const int c0 = 16 * ks + 2 * tig, c1 = c0 + 8;
            dst[st][u][ks][0] = big_ld32(bp + (c0 < r ? 16 * ks : 0));
            dst[st][u][ks][1] = big_ld32(bp + (c1 < r ? 16 * ks + 8 : 0));
          }
        }
    };
    constexpr int STEP = 16 * NBU;
    auto step = [&](u32 (&cb)[NBU][2][KS][2], u32 (&nb)[NBU][2][KS][2], int n0) {
      if (n0 + STEP < nbeg + ncols) load_b(nb, n0 + STEP);
#pragma unroll
      for (int st = 0; st < NBU; ++st)
#pragma unroll
        for (int u = 0; u < 2; ++u)
#pragma unroll
          for (int ks = 0; ks < KS; ++ks) {
            if (16 * ks + 2 * tig >= r) cb[st][u][ks][0] = 0u;
            if (16 * ks + 8 + 2 * tig >= r) cb[st][u][ks][1] = 0u;
          }
#pragma unroll
      for (int rg = 0; rg < MG; ++rg) {
        if (mb + rg * 16 >= M) break;
        const int ra = mb + rg * 16 + g, rc = ra + 8;
        u32 old[NBU][2][2];
        if (MODE == 1) {
#pragma unroll
          for (int st = 0; st < NBU; ++st)
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              const int n = n0 + 16 * st + 8 * u + 2 * tig;
              old[st][u][0] = ra < M ? *(const u32*)(y + (size_t)ra * ldy + n) : 0u;
              old[st][u][1] = rc < M ? *(const u32*)(y + (size_t)rc * ldy + n) : 0u;
            }
        }
#pragma unroll
        for (int st = 0; st < NBU; ++st)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) big_mma(d, tf[rg][ks][0], tf[rg][ks][1], tf[rg][ks][2], tf[rg][ks][3], cb[st][u][ks][0], cb[st][u][ks][1]);
            const int n = n0 + 16 * st + 8 * u + 2 * tig;
            if (MODE == 1) {
              d[0] += big_lo(old[st][u][0]);
              d[1] += big_hi(old[st][u][0]);
              d[2] += big_lo(old[st][u][1]);
              d[3] += big_hi(old[st][u][1]);
            }
            if (ra < M) *(u32*)(y + (size_t)ra * ldy + n) = big_pack(d[0], d[1]);
            if (rc < M) *(u32*)(y + (size_t)rc * ldy + n) = big_pack(d[2], d[3]);
          }
      }
    };
    if (BS) {
      const u32 bs0 = (u32)__cvta_generic_to_shared(bsm);
      for (int n0 = nbeg; n0 < nbeg + ncols; n0 += STEP) {
        u32 cb[NBU][2][KS][2];
#pragma unroll
        for (int st = 0; st < NBU; ++st) {
          const int n = n0 + 16 * st + bl_n;
          big_ldsm_x4(bs0 + n * 32 + ((bl_c ^ ((n >> 2) & 1)) << 4), cb[st][0][0][0], cb[st][0][0][1], cb[st][1][0][0], cb[st][1][0][1]);
        }
#pragma unroll
        for (int rg = 0; rg < MG; ++rg) {
          if (mb + rg * 16 >= M) break;
          const int ra = mb + rg * 16 + g, rc = ra + 8;
          u32 old[NBU][2][2];
          if (MODE == 1) {
#pragma unroll
            for (int st = 0; st < NBU; ++st)
#pragma unroll
              for (int u = 0; u < 2; ++u) {
                const int n = n0 + 16 * st + 8 * u + 2 * tig;
                old[st][u][0] = ra < M ? *(const u32*)(y + (size_t)ra * ldy + n) : 0u;
                old[st][u][1] = rc < M ? *(const u32*)(y + (size_t)rc * ldy + n) : 0u;
              }
          }
#pragma unroll
          for (int st = 0; st < NBU; ++st)
#pragma unroll
            for (int u = 0; u < 2; ++u) {
              float d[4] = {0.f, 0.f, 0.f, 0.f};
              big_mma(d, tf[rg][0][0], tf[rg][0][1], tf[rg][0][2], tf[rg][0][3], cb[st][u][0][0], cb[st][u][0][1]);
              const int n = n0 + 16 * st + 8 * u + 2 * tig;
              if (MODE == 1) {
                d[0] += big_lo(old[st][u][0]);
                d[1] += big_hi(old[st][u][0]);
                d[2] += big_lo(old[st][u][1]);
                d[3] += big_hi(old[st][u][1]);
              }
              if (ra < M) *(u32*)(y + (size_t)ra * ldy + n) = big_pack(d[0], d[1]);
              if (rc < M) *(u32*)(y + (size_t)rc * ldy + n) = big_pack(d[2], d[3]);
            }
        }
      }
    } else {
      load_b(bf[0], nbeg);
      for (int n0 = nbeg; n0 < nbeg + ncols; n0 += 2 * STEP) {  // host: ncols a multiple of 2 STEP
        step(bf[0], bf[1], n0);
        step(bf[1], bf[0], n0 + STEP);
      }
    }
    __syncthreads();  // tsm and part are rewritten by the next row block
  }
}

// The bank's expand over a column range [n0, n1) (lora_tma.cu's lora_expand, restricted): y[m][n] +=
// s_j . sum_i t[m][i] B_j[n][i], j = slot[m] (-1: none), t the sum of lora_shrink's kc K slices
// ([kc][M][rmax] f32), one thread per output column, NB per block, one batch row per block row. So
// the expand of one column chunk can run beside cuBLAS's GEMM of the next.
template <int NB>
__global__ void __launch_bounds__(NB) lora_expand_cols(const float* __restrict__ t, const bf16_t* __restrict__ b, bf16_t* __restrict__ y,
                                                       const int* __restrict__ slot, const int* __restrict__ rank, const float* __restrict__ scale,
                                                       int M, int N, int rmax, int kc, int n0, int n1) {
  __shared__ float tr[128];
  const int m = blockIdx.y, n = n0 + blockIdx.x * NB + threadIdx.x;
  const int j = slot ? slot[m] : 0;
  if (j < 0) return;
  const int r = rank[j];
  for (int i = threadIdx.x; i < r; i += NB) {
    float v = 0.f;
    for (int z = 0; z < kc; ++z) v += __ldcg(t + ((size_t)z * M + m) * rmax + i);
    tr[i] = v;
  }
  __syncthreads();
  if (n >= n1) return;
  const bf16_t* bp = b + ((size_t)j * N + n) * rmax;
  float d = 0.f;
  for (int i0 = 0; i0 < r; i0 += 64) {
    V4 v[8];
#pragma unroll
    for (int c = 0; c < 8; ++c)
      if (i0 + 8 * c < r) v[c] = big_ld_cached(bp + i0 + 8 * c);
#pragma unroll
    for (int c = 0; c < 8; ++c)
      if (i0 + 8 * c < r) {
        const u32 wd[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
        const float* tp = tr + i0 + 8 * c;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          d += tp[2 * e] * big_lo(wd[e]);
          d += tp[2 * e + 1] * big_hi(wd[e]);
        }
      }
  }
  bf16_t* yp = y + (size_t)m * N + n;
  const float yv = __uint_as_float(((u32)*yp) << 16);
  unsigned short o;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(o) : "f"(yv + scale[j] * d));
  *yp = o;
}
