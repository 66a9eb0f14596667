// NOTE: the split-K partial reduction below repeats cuda-gemm.ts's on purpose (the duplicates report lists it):
// each kernel inlines it into its own tile loop, and the emitted header is pinned by the golden snapshot.
/** Second half of `stageml_sm90.cuh`: grouped shrink/expand templates and the checked host launch helpers. */
export const GROUPED_TEMPLATES = `// ---- grouped shrink (SGMV / BGMV / single adapter) ------------------------------------------
// One CTA per (block of ≤16 rows of one adapter, K split); 4 warps each take one k16 step of every
// 64-wide K tile, then the warps' partial sums are added through shared memory.
template <typename T, int K, int RPAD, int STAGES, bool DENSE>
__global__ void __launch_bounds__(128) shrink_kernel(const T* __restrict__ x, const T* __restrict__ a, const int64_t* __restrict__ offset,
                                                     const int32_t* __restrict__ rank, int dense_rank, StagemlRows rows,
                                                     float* __restrict__ t, int64_t M, int split) {
  constexpr int BK = 64, BMS = 16, RT = RPAD / 8;
  constexpr int STAGE = (BMS + RPAD) * BK;
  static_assert(STAGES * STAGE * sizeof(T) >= 4 * BMS * RPAD * sizeof(float), "the reduction reuses the pipeline's shared memory");
  __shared__ __align__(128) T smem[STAGES * STAGE];
  __shared__ int32_t row_ids[BMS];
  float (*red)[BMS][RPAD] = reinterpret_cast<float (*)[BMS][RPAD]>(smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int blk = blockIdx.x, sp = blockIdx.y;
  int valid, r_a;
  int64_t first;
  if constexpr (DENSE) {
    const int64_t m0 = static_cast<int64_t>(blk) * BMS;
    valid = static_cast<int>(M - m0 < BMS ? M - m0 : BMS);
    if (threadIdx.x < BMS) row_ids[threadIdx.x] = static_cast<int32_t>(m0 + threadIdx.x);
    r_a = dense_rank;
    first = 0;
  } else {
    valid = rows.nrows[blk];
    if (valid == 0) return;
    const int g = rows.group[blk];
    r_a = rank[g];
    first = offset[g];
    if (threadIdx.x < BMS) row_ids[threadIdx.x] = threadIdx.x < valid ? rows.order[rows.row0[blk] + threadIdx.x] : 0;
  }
  __syncthreads();
  constexpr int KT = (K + BK - 1) / BK;
  const int kt_per = (KT + split - 1) / split;
  const int kt0 = sp * kt_per;
  const int kt1 = kt0 + kt_per < KT ? kt0 + kt_per : KT;
  const T* as = a + first * K;
  auto load_stage = [&](int stage, int kt) {
    T* s = smem + stage * STAGE;
    load_tile64<T, BMS, 128>(s, x, K, valid, row_ids, kt * BK, K);
    load_tile64<T, RPAD, 128>(s + BMS * BK, as, K, r_a, nullptr, kt * BK, K);
  };
  float acc[RT][4];
#pragma unroll
  for (int j = 0; j < RT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (kt0 + s < kt1) load_stage(s, kt0 + s);
    cp_async_commit();
  }
  for (int kt = kt0; kt < kt1; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (kt + STAGES - 1 < kt1) load_stage((kt - kt0 + STAGES - 1) % STAGES, kt + STAGES - 1);
    cp_async_commit();
    const T* xs = smem + ((kt - kt0) % STAGES) * STAGE;
    const T* ss = xs + BMS * BK;
    uint32_t af[4];
    ldmatrix_x4(af, smem_addr(xs + swz(lane & 15, warp * 2 + (lane >> 4))));
#pragma unroll
    for (int j = 0; j < RT; j += 2) {
      uint32_t bf[4];
      ldmatrix_x4(bf, smem_addr(ss + swz(j * 8 + (lane & 7) + ((lane >> 4) << 3), warp * 2 + ((lane >> 3) & 1))));
      Elem<T>::mma(acc[j], af, bf[0], bf[1]);
      Elem<T>::mma(acc[j + 1], af, bf[2], bf[3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int j = 0; j < RT; ++j) {
    const int r = lane >> 2, c = j * 8 + (lane & 3) * 2;
    red[warp][r][c] = acc[j][0];
    red[warp][r][c + 1] = acc[j][1];
    red[warp][r + 8][c] = acc[j][2];
    red[warp][r + 8][c + 1] = acc[j][3];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < BMS * RPAD; e += 128) {
    const int r = e / RPAD, c = e % RPAD;
    if (r < valid) t[(static_cast<int64_t>(sp) * M + row_ids[r]) * RPAD + c] = red[0][r][c] + red[1][r][c] + red[2][r][c] + red[3][r][c];
  }
}

// ---- grouped expand ---------------------------------------------------------------------------
// One CTA per (block of ≤16 rows of one adapter, 128-wide slice of N); 4 warps × 32 columns.
template <typename T, int N, int RPAD>
__global__ void __launch_bounds__(128) expand_kernel(const float* __restrict__ t, const T* __restrict__ b, const int64_t* __restrict__ offset,
                                                     const int32_t* __restrict__ rank, const float* __restrict__ scale, StagemlRows rows,
                                                     T* __restrict__ y, int64_t M, int split) {
  constexpr int BMS = 16, BN = 128, NI = 4;
  __shared__ __align__(128) T ts[BMS * (RPAD + 8)];
  __shared__ __align__(128) T bs[BN * (RPAD + 8)];
  __shared__ int32_t row_ids[BMS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int blk = blockIdx.y, n0 = blockIdx.x * BN;
  const int valid = rows.nrows[blk];
  if (valid == 0) return;
  const int g = rows.group[blk];
  const int r_a = rank[g];
  const float s = scale[g];
  const T* bg = b + offset[g] * N;
  if (threadIdx.x < BMS) row_ids[threadIdx.x] = threadIdx.x < valid ? rows.order[rows.row0[blk] + threadIdx.x] : 0;
  const int nvalid = N - n0 < BN ? N - n0 : BN;
  // B_g is [N, r_g] row-major: rows n0 … n0+BN are one contiguous run of BN·r_g elements.
  for (int c = threadIdx.x; c < BN * (RPAD / 8); c += 128) {
    const int r = c / (RPAD / 8), ch = c % (RPAD / 8);
    const bool ok = r < nvalid && ch * 8 < r_a;
    cp_async16(smem_addr(bs + padded<RPAD>(r, ch * 8)), ok ? bg + static_cast<int64_t>(n0 + r) * r_a + ch * 8 : bg, ok);
  }
  cp_async_commit();
  __syncthreads();
  for (int c = threadIdx.x; c < BMS * (RPAD / 2); c += 128) {
    const int r = c / (RPAD / 2), col = (c % (RPAD / 2)) * 2;
    float v0 = 0.f, v1 = 0.f;
    if (r < valid && col < r_a) {
      for (int sp = 0; sp < split; ++sp) {
        const float2 p = *reinterpret_cast<const float2*>(t + (static_cast<int64_t>(sp) * M + row_ids[r]) * RPAD + col);
        v0 += p.x;
        v1 += p.y;
      }
    }
    *reinterpret_cast<uint32_t*>(ts + padded<RPAD>(r, col)) = Elem<T>::pack(s * v0, s * v1);
  }
  cp_async_wait<0>();
  __syncthreads();
  float acc[NI][4];
#pragma unroll
  for (int j = 0; j < NI; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < RPAD / 16; ++kk) {
    uint32_t af[4];
    ldmatrix_x4(af, smem_addr(ts + padded<RPAD>(lane & 15, kk * 16 + ((lane >> 4) << 3))));
#pragma unroll
    for (int j = 0; j < NI; j += 2) {
      uint32_t bf[4];
      const int r = warp * 32 + j * 8 + (lane & 7) + ((lane >> 4) << 3);
      ldmatrix_x4(bf, smem_addr(bs + padded<RPAD>(r, kk * 16 + (((lane >> 3) & 1) << 3))));
      Elem<T>::mma(acc[j], af, bf[0], bf[1]);
      Elem<T>::mma(acc[j + 1], af, bf[2], bf[3]);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = (lane >> 2) + h * 8;
    if (r >= valid) continue;
    T* yr = y + static_cast<int64_t>(row_ids[r]) * N;
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      const int col = n0 + warp * 32 + j * 8 + (lane & 3) * 2;
      if (col >= N) continue;
      uint32_t* p = reinterpret_cast<uint32_t*>(yr + col);
      const float2 old = Elem<T>::unpack(*p);
      *p = Elem<T>::pack(old.x + acc[j][2 * h], old.y + acc[j][2 * h + 1]);
    }
  }
}

// ---- host side --------------------------------------------------------------------------------
#define STAGEML_CHECK(expr)                   \\
  do {                                        \\
    const cudaError_t stageml_err_ = (expr);  \\
    if (stageml_err_ != cudaSuccess) return stageml_err_; \\
  } while (0)

// Raises the dynamic shared-memory limit of KERNEL once (a static per kernel instantiation), then
// launches it and returns the launch's error (cudaGetLastError), so no failure goes unnoticed.
template <auto KERNEL, typename... Args>
cudaError_t launch_dyn(dim3 grid, dim3 block, int smem, cudaStream_t stream, Args... args) {
  static const cudaError_t configured = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  STAGEML_CHECK(configured);
  KERNEL<<<grid, block, smem, stream>>>(args...);
  return cudaGetLastError();
}

template <typename T, int K, int N, int R, int RPAD, int BM, int BN, int WM, int WN, int STAGES, int LORA, bool GROUPED>
cudaError_t run_gemm(const void* x, const void* w, const void* a, const void* b, const float* t, int split, const void* bias, void* y,
                     int64_t M, float scale, StagemlRows rows, cudaStream_t stream) {
  using S = GemmShape<T, BM, BN, WM, WN, STAGES, (LORA == 1 ? RPAD : 0)>;
  constexpr int EPI = LORA == 0 ? 0 : (BM + BN) * (RPAD + 8) * 2;
  constexpr int MAIN = STAGES * (BM + BN + (LORA == 1 ? RPAD : 0)) * 64 * 2;
  constexpr int SMEM = MAIN > EPI ? MAIN : EPI;
  const dim3 grid((N + BN - 1) / BN, GROUPED ? rows.num_blocks : static_cast<unsigned>((M + BM - 1) / BM));
  const auto* xt = static_cast<const T*>(x);
  const auto* wt = static_cast<const T*>(w);
  const auto* at = static_cast<const T*>(a);
  const auto* bt = static_cast<const T*>(b);
  const auto* biast = static_cast<const T*>(bias);
  auto* yt = static_cast<T*>(y);
  if (bias != nullptr) {
    return launch_dyn<gemm_kernel<T, K, N, R, RPAD, BM, BN, WM, WN, STAGES, LORA, GROUPED, true>>(grid, dim3(S::THREADS), SMEM, stream, xt, wt, at,
                                                                                                   bt, t, split, biast, yt, M, scale, rows);
  }
  return launch_dyn<gemm_kernel<T, K, N, R, RPAD, BM, BN, WM, WN, STAGES, LORA, GROUPED, false>>(grid, dim3(S::THREADS), SMEM, stream, xt, wt, at,
                                                                                                  bt, t, split, biast, yt, M, scale, rows);
}

template <typename T, int K, int RPAD, bool DENSE>
cudaError_t run_shrink(const void* x, const void* a, const int64_t* offset, const int32_t* rank, int dense_rank, StagemlRows rows, float* t,
                       int64_t M, int split, cudaStream_t stream) {
  const unsigned blocks = DENSE ? static_cast<unsigned>((M + 15) / 16) : static_cast<unsigned>(rows.num_blocks);
  shrink_kernel<T, K, RPAD, 4, DENSE><<<dim3(blocks, split), dim3(128), 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(a), offset, rank,
                                                                                      dense_rank, rows, t, M, split);
  return cudaGetLastError();
}

template <typename T, int N, int RPAD>
cudaError_t run_expand(const float* t, const void* b, const int64_t* offset, const int32_t* rank, const float* scale, StagemlRows rows, void* y,
                       int64_t M, int split, cudaStream_t stream) {
  expand_kernel<T, N, RPAD><<<dim3((N + 127) / 128, rows.num_blocks), dim3(128), 0, stream>>>(t, static_cast<const T*>(b), offset, rank, scale, rows,
                                                                                              static_cast<T*>(y), M, split);
  return cudaGetLastError();
}

}  // namespace
}  // namespace stageml
`;
