// Bandwidth-bound fused base + LoRA for decode-sized batches, in swap-AB form (y^T = W x^T: the
// 16-row W tile is the mma's A operand, the batch rows are its N = 8 columns), one launch:
//
//   y[m, n] = sum_k x[m, k] W[n, k] + s_j * sum_i t[m, i] B_j[n, i],   t[m, i] = sum_k x[m, k] A_j[i, k]
//
// with j = slot[m] (one adapter for every row when slot is null). Blocks [0, n_prod) are producers:
// each computes a K chunk of t for one piece of rows (<= 8 rows of one adapter) and adds it into
// t_acc (fp32, global); blocks [n_prod, n_prod + N / ROWS) are consumers: each streams its ROWS
// rows of W over the whole K (the block's warps split K), reduces in shared memory, waits until
// every producer has arrived (a counter), adds s * t * B^T for its rows and stores y. The last
// consumer zeroes t_acc and both counters, so calls need no memset. W is read with 16-byte loads
// straight into mma.sync fragments: within each 64-wide K step a thread owns 16 contiguous K of
// its rows, which is a permutation of the fragment's K order applied to x alike (a sum over K does
// not depend on the order). Producers are dispatched first (lower block index) and never wait, so
// the consumers' wait cannot deadlock.
//
// Built by NVRTC at first use (triton_lora.py, through cupy) or by nvcc for sm_90.

typedef unsigned short bf16_t;
typedef unsigned int u32;

struct __align__(16) U4 { u32 x, y, z, w; };

__device__ __forceinline__ U4 ld_stream(const bf16_t* p) {
  U4 r;
#if LDW_VARIANT == 1
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
#else
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
#endif
  return r;
}

__device__ __forceinline__ U4 ld_x(const bf16_t* p) {
  U4 r;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf2f(bf16_t v) { return __uint_as_float(((u32)v) << 16); }

__device__ __forceinline__ bf16_t f2bf(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u32 word(const U4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// acc[g][mt][4] += W[rows of group g] . x[rows mt*8.. of x]^T over K in [kb, ke), 64 at a time,
// UNR steps of loads issued before their mmas. w0 points at this thread's row (group g, row lane/4).
template <int WR, int MT, int UNR>
__device__ __forceinline__ void stream_rows(const bf16_t* __restrict__ wbase, int ldw, const bool* wok,
                                            const bf16_t* __restrict__ xbase, int ldx, int mvalid,
                                            int kb, int ke, float (*acc)[MT][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const U4 zero = {0u, 0u, 0u, 0u};
  for (int k0 = kb; k0 < ke; k0 += 64 * UNR) {
    U4 wv[UNR][WR][2][2];
#pragma unroll
    for (int u = 0; u < UNR; ++u) {
      const int kc = k0 + u * 64 + tig * 16;
#pragma unroll
      for (int r = 0; r < WR; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bf16_t* p = wbase + (size_t)(r * 16 + h * 8 + g) * ldw + kc;
          const bool ok = wok[r * 2 + h];
          wv[u][r][h][0] = ok ? ld_stream(p) : zero;
          wv[u][r][h][1] = ok ? ld_stream(p + 8) : zero;
        }
    }
#pragma unroll
    for (int u = 0; u < UNR; ++u) {
      const int kc = k0 + u * 64 + tig * 16;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int m = mt * 8 + g;
        const bool ok = m < mvalid;
        const bf16_t* p = xbase + (size_t)(ok ? m : 0) * ldx + kc;
        U4 x0 = ok ? ld_x(p) : zero, x1 = ok ? ld_x(p + 8) : zero;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const U4& xa = j < 2 ? x0 : x1;
          const u32 b0 = word(xa, (2 * j) & 3), b1 = word(xa, (2 * j + 1) & 3);
#pragma unroll
          for (int r = 0; r < WR; ++r) {
            const U4& lo = j < 2 ? wv[u][r][0][0] : wv[u][r][0][1];
            const U4& hi = j < 2 ? wv[u][r][1][0] : wv[u][r][1][1];
            mma16816(acc[r][mt], word(lo, (2 * j) & 3), word(hi, (2 * j) & 3), word(lo, (2 * j + 1) & 3), word(hi, (2 * j + 1) & 3), b0, b1);
          }
        }
      }
    }
  }
}

// ROWS = 16 * WR * RG rows of W per consumer block; NW = RG * KW warps (RG row groups, KW K splits).
template <int WR, int RG, int KW, int MT, int UNR>
__global__ void __launch_bounds__(32 * RG * KW) lora_stream(
    const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, const bf16_t* __restrict__ a, const bf16_t* __restrict__ b,
    bf16_t* __restrict__ y, float* __restrict__ t_acc, int* __restrict__ sync, const int* __restrict__ slot,
    const int* __restrict__ rank, const float* __restrict__ scale, int M, int N, int K, int rmax, int piece_rows,
    int n_pieces, int kch, int n_cons) {
  constexpr int NW = RG * KW, ROWS = 16 * WR * RG, MP = 8 * MT;
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int n_prod = n_pieces * kch;
  if ((int)blockIdx.x < n_prod) {
    // Producer: t[piece rows, :] += x[piece rows, K chunk] . A_j[:, K chunk]^T.
    const int piece = blockIdx.x / kch, c = blockIdx.x % kch;
    const int m0 = piece * piece_rows, mv = min(piece_rows, M - m0);
    const int j = slot ? slot[m0] : 0;
    if (j >= 0) {
      const int r = rank[j];
      const int kper = K / kch, kw = kper / NW;
      const int kb = c * kper + warp * kw;
      for (int ga = 0; ga * 16 < r; ++ga) {
        float acc[1][1][4] = {{{0.f, 0.f, 0.f, 0.f}}};
        bool ok[2] = {ga * 16 + g < r, ga * 16 + 8 + g < r};
        stream_rows<1, 1, 1>(a + ((size_t)j * rmax + ga * 16) * K, K, ok, x + (size_t)m0 * K, K, mv, kb, kb + kw, acc);
        // c0,c1: A row g, cols 2tig, 2tig+1; c2,c3: A row g + 8.
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int i = ga * 16 + g + (q >> 1) * 8, m = 2 * tig + (q & 1);
          if (i < r && m < mv) atomicAdd(&t_acc[(size_t)(m0 + m) * rmax + i], acc[0][0][q]);
        }
      }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(&sync[0], 1);
    }
    return;
  }
  // Consumer.
  const int cb = blockIdx.x - n_prod;
  const int n0 = cb * ROWS;
  float* sred = smem;                 // [ROWS][MP]
  float* st = smem + ROWS * MP;       // [M][rmax]
  for (int i = threadIdx.x; i < ROWS * MP; i += 32 * NW) sred[i] = 0.f;
  {
    const int rg = warp % RG, ks = warp / RG;
    const int kw = K / KW;
    float acc[WR][MT][4];
#pragma unroll
    for (int r = 0; r < WR; ++r)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[r][mt][q] = 0.f;
    bool ok[2 * WR];
#pragma unroll
    for (int i = 0; i < 2 * WR; ++i) ok[i] = true;
    stream_rows<WR, MT, UNR>(w + (size_t)(n0 + rg * 16 * WR) * K, K, ok, x, K, M, ks * kw, (ks + 1) * kw, acc);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < WR; ++r)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int row = rg * 16 * WR + r * 16 + g + (q >> 1) * 8, m = mt * 8 + 2 * tig + (q & 1);
          if (KW == 1) sred[row * MP + m] = acc[r][mt][q];
          else atomicAdd(&sred[row * MP + m], acc[r][mt][q]);
        }
  }
  if (threadIdx.x == 0) {
    while (ld_acquire(&sync[0]) < n_prod) __nanosleep(64);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < M * rmax; i += 32 * NW) st[i] = __ldcg(&t_acc[i]);
  __syncthreads();
  for (int i = threadIdx.x; i < ROWS * M; i += 32 * NW) {
    const int m = i / ROWS, nl = i % ROWS, n = n0 + nl;
    float v = sred[nl * MP + m];
    const int j = slot ? slot[m] : 0;
    if (j >= 0) {
      const int r = rank[j];
      const bf16_t* bp = b + ((size_t)j * N + n) * rmax;
      const float* tp = st + m * rmax;
      float d = 0.f;
      for (int i0 = 0; i0 < r; i0 += 8) {
        const U4 bv = ld_x(bp + i0);
        const u32 wd[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          d += tp[i0 + 2 * q] * __uint_as_float(wd[q] << 16);
          d += tp[i0 + 2 * q + 1] * __uint_as_float(wd[q] & 0xffff0000u);
        }
      }
      v += scale[j] * d;
    }
    y[(size_t)m * N + n] = f2bf(v);
  }
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&sync[1], 1) == n_cons - 1;
  }
  __syncthreads();
  if (last) {
    for (int i = threadIdx.x; i < M * rmax; i += 32 * NW) t_acc[i] = 0.f;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      sync[0] = 0;
      sync[1] = 0;
      __threadfence();
    }
  }
}

// Cluster variant: a cluster of CL blocks covers ROWS = 16 * WR * RG rows over the whole K, block
// rank q of the cluster the K range [q K / CL, (q + 1) K / CL); the RG warps of a block stream
// different rows over the same K range, so they share each x fragment through L1 (x leaves L2
// N / ROWS times instead of N / 16). The partial sums meet through distributed shared memory:
// after a cluster barrier, rank q sums rows [q ROWS / CL, (q + 1) ROWS / CL) over the cluster's
// blocks and finishes them (LoRA term, store). Producers are padded to a multiple of CL blocks.
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ float ld_dsmem(const float* p, u32 rank) {
  u32 local = (u32)__cvta_generic_to_shared(p), remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

template <int WR, int RG, int MT, int UNR, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(32 * RG) lora_stream_cl(
    const bf16_t* __restrict__ x, const bf16_t* __restrict__ w, const bf16_t* __restrict__ a, const bf16_t* __restrict__ b,
    bf16_t* __restrict__ y, float* __restrict__ t_acc, int* __restrict__ sync, const int* __restrict__ slot,
    const int* __restrict__ rank, const float* __restrict__ scale, int M, int N, int K, int rmax, int piece_rows,
    int n_pieces, int kch, int n_cons) {
  constexpr int NW = RG, ROWS = 16 * WR * RG, MP = 8 * MT, SHARE = ROWS / CL;
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int n_real = n_pieces * kch;
  const int n_prod = (n_real + CL - 1) / CL * CL;
  if ((int)blockIdx.x < n_prod) {
    if ((int)blockIdx.x < n_real) {
      const int piece = blockIdx.x / kch, c = blockIdx.x % kch;
      const int m0 = piece * piece_rows, mv = min(piece_rows, M - m0);
      const int j = slot ? slot[m0] : 0;
      if (j >= 0) {
        const int r = rank[j];
        const int kper = K / kch, kw = kper / NW;
        const int kb = c * kper + warp * kw;
        for (int ga = 0; ga * 16 < r; ++ga) {
          float acc[1][1][4] = {{{0.f, 0.f, 0.f, 0.f}}};
          bool ok[2] = {ga * 16 + g < r, ga * 16 + 8 + g < r};
          stream_rows<1, 1, 1>(a + ((size_t)j * rmax + ga * 16) * K, K, ok, x + (size_t)m0 * K, K, mv, kb, kb + kw, acc);
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int i = ga * 16 + g + (q >> 1) * 8, m = 2 * tig + (q & 1);
            if (i < r && m < mv) atomicAdd(&t_acc[(size_t)(m0 + m) * rmax + i], acc[0][0][q]);
          }
        }
      }
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(&sync[0], 1);
    }
    return;
  }
  const int cb = (blockIdx.x - n_prod) / CL;
  const u32 q = cluster_rank();
  const int n0 = cb * ROWS;
  float* sred = smem;            // [ROWS][MP], this block's partial sums over its K range
  float* st = smem + ROWS * MP;  // [M][rmax]
  {
    const int kw = K / CL;
    float acc[WR][MT][4];
#pragma unroll
    for (int r = 0; r < WR; ++r)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][mt][e] = 0.f;
    bool ok[2 * WR];
#pragma unroll
    for (int i = 0; i < 2 * WR; ++i) ok[i] = true;
    stream_rows<WR, MT, UNR>(w + (size_t)(n0 + warp * 16 * WR) * K, K, ok, x, K, M, q * kw, (q + 1) * kw, acc);
#pragma unroll
    for (int r = 0; r < WR; ++r)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = warp * 16 * WR + r * 16 + g + (e >> 1) * 8, m = mt * 8 + 2 * tig + (e & 1);
          sred[row * MP + m] = acc[r][mt][e];
        }
  }
  cluster_sync();
  if (threadIdx.x == 0) {
    while (ld_acquire(&sync[0]) < n_prod) __nanosleep(64);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < M * rmax; i += 32 * NW) st[i] = __ldcg(&t_acc[i]);
  __syncthreads();
  for (int i = threadIdx.x; i < SHARE * M; i += 32 * NW) {
    const int m = i / SHARE, nl = q * SHARE + i % SHARE, n = n0 + nl;
    float v = 0.f;
#pragma unroll
    for (int c = 0; c < CL; ++c) v += ld_dsmem(&sred[nl * MP + m], c);
    const int j = slot ? slot[m] : 0;
    if (j >= 0) {
      const int r = rank[j];
      const bf16_t* bp = b + ((size_t)j * N + n) * rmax;
      const float* tp = st + m * rmax;
      float d = 0.f;
      for (int i0 = 0; i0 < r; i0 += 8) {
        const U4 bv = ld_x(bp + i0);
        const u32 wd[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          d += tp[i0 + 2 * e] * __uint_as_float(wd[e] << 16);
          d += tp[i0 + 2 * e + 1] * __uint_as_float(wd[e] & 0xffff0000u);
        }
      }
      v += scale[j] * d;
    }
    y[(size_t)m * N + n] = f2bf(v);
  }
  // No block leaves while another may still read its shared memory.
  cluster_sync();
  __shared__ int last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&sync[1], 1) == n_cons - 1;
  }
  __syncthreads();
  if (last) {
    for (int i = threadIdx.x; i < M * rmax; i += 32 * NW) t_acc[i] = 0.f;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      sync[0] = 0;
      sync[1] = 0;
      __threadfence();
    }
  }
}
