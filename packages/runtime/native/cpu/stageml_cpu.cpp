// The `cpu-native` executor's program runner and kernels (Node-API addon). On linux-x64 it ships
// prebuilt in three variants (-march=x86-64-v3: AVX2 + FMA, the generic loops vectorized by the
// compiler; x86-64-v4: the AVX-512 paths; x86-64-v4 + VNNI: the int8 dot products too), chosen at
// load by src/native/addon.ts from the CPU's flags; elsewhere, or when no variant fits, it is
// built on first use with the machine's g++ -O3 -march=native. scripts/build-cpu-prebuilt.mjs
// rebuilds the prebuilt files; a test checks they were built from this source.
//
// A program is what src/native/compile.ts encodes from an IR graph: symbolic dimension
// expressions, a value table (dtype, shape as expression ids, where the value lives) and a list of
// instructions. Each run binds the symbols, evaluates every shape, sizes the liveness-shared slots,
// and executes the instructions on a small thread pool. Heavy kernels: f32 linear / matmul
// (register-tiled AVX-512 dot products on row-major weights, no repacking; 17–64 rows as yᵀ = W·xᵀ
// on x packed transposed), the gathered LoRA bank (f32 or int8 factor tables), block-quantized linear
// (int4 / int8 codes repacked into 16-row interleaved tiles, activations quantized per 32 inputs to
// int8, VNNI dot products), attention over the cache with a vectorized exp, the MoE expert GEMM
// (rows grouped by expert onto the f32 tiles). Everything else is generic strided code. Values of
// dtype i64 are stored as double (the IR's host representation).

#include <node_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cfloat>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define SML_AVX512 1
#if defined(__AVX512VNNI__)
#define SML_VNNI 1
#endif
#endif

namespace {

using i64 = int64_t;

// ---------------------------------------------------------------------------------------------
// Errors: a code (the TS side maps it to RuntimeError codes) and a message.

struct Fail : std::runtime_error {
  std::string code;
  Fail(std::string c, const std::string& m) : std::runtime_error(m), code(std::move(c)) {}
};

[[noreturn]] void fail(const char* code, const std::string& msg) { throw Fail(code, msg); }

// ---------------------------------------------------------------------------------------------
// Thread pool: the calling thread takes part. A job is split into parts claimed through one
// atomic word (generation | parts | next index), so a part runs exactly once, whoever claims it:
// when a worker is descheduled (a busy machine) the caller runs its parts instead of waiting for
// it. Workers spin briefly between jobs, then sleep.

class Pool {
 public:
  explicit Pool(int n) : n_(std::max(1, n)) {
    for (int t = 1; t < n_; t++) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
      epoch_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return n_; }

  // Runs f(begin, end) over contiguous chunks of [0, n).
  // `per_thread`: parts per thread (more for uneven items, e.g. causal attention rows).
  void parallel(i64 n, const std::function<void(i64, i64)>& f, bool serial = false, int per_thread = 2) {
    if (n <= 0) return;
    if (n_ == 1 || serial || n == 1) {
      f(0, n);
      return;
    }
    const uint64_t parts = static_cast<uint64_t>(std::min<i64>({n, static_cast<i64>(per_thread) * n_, 0xFFFF}));
    fn_ = &f;
    total_ = n;
    completed_.store(0, std::memory_order_relaxed);
    gen_ = (gen_ + 1) & 0xFFFFFF;
    claim_.store((gen_ << 40) | (parts << 24), std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    if (sleeping_.load() > 0) {
      std::lock_guard<std::mutex> lk(m_);
      cv_.notify_all();
    }
    work();
    // The parts left are running on workers: spin (yielding only when one seems descheduled).
    for (uint32_t spins = 0; completed_.load(std::memory_order_acquire) < parts; spins++) {
      if (spins > (1u << 16)) std::this_thread::yield();
      else cpu_relax();
    }
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lk(err_m_);
      std::swap(e, err_);
    }
    if (e) std::rethrow_exception(e);
  }

 private:
  static inline void cpu_relax() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  // Claims and runs parts of the current job until none is left.
  void work() {
    for (;;) {
      const uint64_t v = claim_.fetch_add(1, std::memory_order_acq_rel);
      const uint64_t parts = (v >> 24) & 0xFFFF, i = v & 0xFFFFFF;
      if (i >= parts) return;
      const i64 n = total_;
      try {
        (*fn_)(n * static_cast<i64>(i) / static_cast<i64>(parts), n * static_cast<i64>(i + 1) / static_cast<i64>(parts));
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_m_);
        if (!err_) err_ = std::current_exception();
      }
      completed_.fetch_add(1, std::memory_order_acq_rel);
    }
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      int spins = 0;
      while (epoch_.load(std::memory_order_acquire) == seen) {
        if (++spins < (1 << 14)) {
          cpu_relax();
          continue;
        }
        std::unique_lock<std::mutex> lk(m_);
        sleeping_.fetch_add(1);
        cv_.wait(lk, [&] { return epoch_.load() != seen || stop_; });
        sleeping_.fetch_sub(1);
        spins = 0;
      }
      seen = epoch_.load();
      if (stop_) return;
      work();
    }
  }
  int n_;
  std::vector<std::thread> workers_;
  const std::function<void(i64, i64)>* fn_ = nullptr;
  i64 total_ = 0;
  uint64_t gen_ = 0;
  std::atomic<uint64_t> claim_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> sleeping_{0};
  std::mutex m_, err_m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::exception_ptr err_;
};

std::unique_ptr<Pool> g_pool;
std::mutex g_run_mutex;  // one run at a time per process (the pool and the arena are shared)

Pool& pool() {
  if (!g_pool) g_pool = std::make_unique<Pool>(1);
  return *g_pool;
}

// Work below this many multiply-adds runs on the calling thread alone.
constexpr i64 kParallelMin = 1 << 15;

// ---------------------------------------------------------------------------------------------
// Vector helpers.

#ifdef SML_AVX512
inline __m512 exp512(__m512 x) {
  // e^x = 2^n · 2^f, n = round(x·log2 e), f ∈ [−½, ½]; 2^f by its Taylor series to degree 7.
  const __m512 lo = _mm512_set1_ps(-87.33f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(88.37f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.5252733804059840e-5f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381608e-4f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}
inline __mmask16 tail_mask(i64 n) { return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1); }
#endif

inline float dot_f32(const float* a, const float* b, i64 n) {
#ifdef SML_AVX512
  __m512 acc = _mm512_setzero_ps();
  i64 i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
#else
  float s = 0;
  for (i64 i = 0; i < n; i++) s += a[i] * b[i];
  return s;
#endif
}

// Four dot products of q with k₀…k₃ (length n), reduced together.
inline void dot4_f32(const float* q, const float* k0, const float* k1, const float* k2, const float* k3, i64 n, float* out) {
#ifdef SML_AVX512
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (i64 i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + i);
    a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k0 + i), a0);
    a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k1 + i), a1);
    a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k2 + i), a2);
    a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k3 + i), a3);
  }
  // Per 128-bit lane: [a0, a1, a2, a3] partial sums, then the four lanes added.
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))), _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
  const __m512 v = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 w = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  _mm_storeu_ps(out, _mm512_castps512_ps128(w));
#else
  out[0] = dot_f32(q, k0, n);
  out[1] = dot_f32(q, k1, n);
  out[2] = dot_f32(q, k2, n);
  out[3] = dot_f32(q, k3, n);
#endif
}

// y[0..n) += s · x[0..n)
inline void axpy_f32(float* y, const float* x, float s, i64 n) {
#ifdef SML_AVX512
  const __m512 sv = _mm512_set1_ps(s);
  i64 i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(sv, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(sv, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
#else
  for (i64 i = 0; i < n; i++) y[i] += s * x[i];
#endif
}

// ---------------------------------------------------------------------------------------------
// f32 GEMM, y[M, N] (+)= x[M, K] · w[N, K]ᵀ: tiles of 4 weight rows × MR activation rows, K in
// chunks of kKc so a chunk of x stays in L2 while the weight rows stream once. The weight rows are
// taken kNb at a time (more than 12 activation rows), each block swept by every activation tile
// before the next, so the tile's [MR, kNb] patch of y stays in L1 (row-major y of a wide layer puts its rows 4·N bytes apart: with
// one 4-column tile at a time, the MR rows' lines share cache sets and were evicted between tiles).
//
// An optional extra K segment (GemmExtra) joins the last chunk: y = x·wᵀ + xe·weᵀ is computed as
// one GEMM over K + ke columns, [x | xe] · [w | we]ᵀ, the extra columns added to the accumulators
// while they are in registers. The LoRA layer passes its rank-r shrink s·(x·Aᵀ) and B this way.

constexpr i64 kKc = 512;
constexpr i64 kNb = 64;

// The extra columns of a GEMM: xe [M, ke] (row stride ldx), we [N, ke] (row stride ldw).
struct GemmExtra {
  const float* x;
  i64 ldx;
  const float* w;
  i64 ldw;
  i64 k;
};

#ifdef SML_AVX512
// Lane r of the result: the sum of a_r's 16 lanes (four horizontal sums at the cost of about one).
inline __m128 reduce4_ps(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))), _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
  const __m512 v = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 w = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(w);
}
#endif

// y[MR, nr] (+)= x[MR, k] · w[nr, k]ᵀ (+ the extra columns, with xe and we at this tile's row and
// column), nr ≤ 4.
template <int MR>
void tile_nt(const float* x, i64 lda, const float* w, i64 ldb, float* y, i64 ldc, i64 k, int nr, bool accum, const GemmExtra* ex, const float* xe, const float* we) {
#ifdef SML_AVX512
  __m512 acc[4][MR];
  for (int r = 0; r < 4; r++)
    for (int m = 0; m < MR; m++) acc[r][m] = _mm512_setzero_ps();
  const float* wr[4];
  for (int r = 0; r < 4; r++) wr[r] = w + (r < nr ? r : 0) * ldb;
  i64 i = 0;
  for (; i + 16 <= k; i += 16) {
    __m512 xv[MR];
    for (int m = 0; m < MR; m++) xv[m] = _mm512_loadu_ps(x + m * lda + i);
    for (int r = 0; r < 4; r++) {
      const __m512 wv = _mm512_loadu_ps(wr[r] + i);
      for (int m = 0; m < MR; m++) acc[r][m] = _mm512_fmadd_ps(wv, xv[m], acc[r][m]);
    }
  }
  if (i < k) {
    const __mmask16 msk = tail_mask(k - i);
    __m512 xv[MR];
    for (int m = 0; m < MR; m++) xv[m] = _mm512_maskz_loadu_ps(msk, x + m * lda + i);
    for (int r = 0; r < 4; r++) {
      const __m512 wv = _mm512_maskz_loadu_ps(msk, wr[r] + i);
      for (int m = 0; m < MR; m++) acc[r][m] = _mm512_fmadd_ps(wv, xv[m], acc[r][m]);
    }
  }
  if (ex != nullptr) {
    for (i64 j = 0; j < ex->k; j += 16) {
      const __mmask16 msk = tail_mask(ex->k - j);
      __m512 xv[MR];
      for (int m = 0; m < MR; m++) xv[m] = _mm512_maskz_loadu_ps(msk, xe + m * ex->ldx + j);
      for (int r = 0; r < 4; r++) {
        const __m512 wv = _mm512_maskz_loadu_ps(msk, we + (r < nr ? r : 0) * ex->ldw + j);
        for (int m = 0; m < MR; m++) acc[r][m] = _mm512_fmadd_ps(wv, xv[m], acc[r][m]);
      }
    }
  }
  const __mmask8 cols = static_cast<__mmask8>((1u << nr) - 1);
  for (int m = 0; m < MR; m++) {
    __m128 v = reduce4_ps(acc[0][m], acc[1][m], acc[2][m], acc[3][m]);
    float* o = y + m * ldc;
    if (accum) v = _mm_add_ps(v, _mm_maskz_loadu_ps(cols, o));
    _mm_mask_storeu_ps(o, cols, v);
  }
#else
  for (int m = 0; m < MR; m++)
    for (int r = 0; r < nr; r++) {
      float v = dot_f32(x + m * lda, w + r * ldb, k);
      if (ex != nullptr) v += dot_f32(xe + m * ex->ldx, we + r * ex->ldw, ex->k);
      float* o = y + m * ldc + r;
      *o = accum ? *o + v : v;
    }
#endif
}

void tiles_nt(const float* x, i64 lda, const float* w, i64 ldb, float* y, i64 ldc, i64 m, i64 k, i64 n0, i64 n1, bool accum, const GemmExtra* ex) {
  // Up to two activation tiles (12 rows of y fit L1's ways whatever their stride): one 4-row weight
  // tile at a time, so both activation tiles read it from L1.
  const i64 nb = m <= 12 ? 4 : kNb;
  for (i64 b0 = n0; b0 < n1; b0 += nb) {
    const i64 b1 = std::min(n1, b0 + nb);
    for (i64 r = 0; r < m;) {
      const i64 left = m - r;
      const int mr = static_cast<int>(std::min<i64>(left, 6));
      const float* xp = x + r * lda;
      const float* xe = ex != nullptr ? ex->x + r * ex->ldx : nullptr;
      for (i64 n = b0; n < b1; n += 4) {
        const int nr = static_cast<int>(std::min<i64>(4, b1 - n));
        float* yp = y + r * ldc + n;
        const float* wp = w + n * ldb;
        const float* we = ex != nullptr ? ex->w + n * ex->ldw : nullptr;
        switch (mr) {
          case 6: tile_nt<6>(xp, lda, wp, ldb, yp, ldc, k, nr, accum, ex, xe, we); break;
          case 5: tile_nt<5>(xp, lda, wp, ldb, yp, ldc, k, nr, accum, ex, xe, we); break;
          case 4: tile_nt<4>(xp, lda, wp, ldb, yp, ldc, k, nr, accum, ex, xe, we); break;
          case 3: tile_nt<3>(xp, lda, wp, ldb, yp, ldc, k, nr, accum, ex, xe, we); break;
          case 2: tile_nt<2>(xp, lda, wp, ldb, yp, ldc, k, nr, accum, ex, xe, we); break;
          default: tile_nt<1>(xp, lda, wp, ldb, yp, ldc, k, nr, accum, ex, xe, we); break;
        }
      }
      r += mr;
    }
  }
}

// Few activation rows (decode): one weight row at a time, read as one sequential stream, 64 inputs
// a step into 4 sums per activation row. 4 KB pages stop the hardware prefetchers at every page,
// so the stream is fed by software prefetches, whose best distances differ by CPU (`RowsPrefetch`,
// chosen once at load). On the Intel Xeons measured, each cache line gets two: 8 KB ahead into L2
// (prefetcht1) and 1 KB ahead into L1 (prefetcht0); a 2 KB prefetcht0 alone (before) kept fewer
// lines in flight: the f32 GEMVs of a Qwen3-shaped batch-1 step (8 layers, the 622 MB LM head)
// streamed at 0.78-0.85 of the bandwidth probe's rate, and a standalone replay of the step's GEMVs
// ran 8-10 % faster with both (docs/cpu-native.md). On the AMD EPYC measured, the pair was the
// slowest choice (a 622 MB GEMV on 2 threads: 31-33 GB/s; none at all 31-35; one prefetcht1 4 KB
// ahead 35-36.5; at 1, 2 or 8 KB 30-35): one prefetcht1 4 KB ahead there. The extra columns, if
// any, join each row's sums.
struct RowsPrefetch {
  i64 far;   // floats ahead of the prefetcht1
  i64 near;  // floats ahead of the prefetcht0 (0: none)
};
RowsPrefetch rows_prefetch_for_cpu() {
#if defined(__x86_64__)
  // Run at load, before the compiler's own CPU detection is guaranteed to have run.
  __builtin_cpu_init();
  if (__builtin_cpu_is("amd")) return {1024, 0};
#endif
  return {2048, 256};
}
const RowsPrefetch kRowsPrefetch = rows_prefetch_for_cpu();

template <int MR>
void rows_nt(const float* x, i64 lda, const float* w, i64 ldb, float* y, i64 ldc, i64 k, i64 n0, i64 n1, const GemmExtra* ex = nullptr) {
#ifdef SML_AVX512
  for (i64 n = n0; n < n1; n++) {
    const float* wr = w + n * ldb;
    __m512 acc[MR][4];
    for (int m = 0; m < MR; m++)
      for (int l = 0; l < 4; l++) acc[m][l] = _mm512_setzero_ps();
    i64 i = 0;
    const i64 far = kRowsPrefetch.far, near = kRowsPrefetch.near;
    for (; i + 64 <= k; i += 64) {
      for (int l = 0; l < 4; l++) _mm_prefetch(reinterpret_cast<const char*>(wr + i + far + 16 * l), _MM_HINT_T1);
      if (near != 0)
        for (int l = 0; l < 4; l++) _mm_prefetch(reinterpret_cast<const char*>(wr + i + near + 16 * l), _MM_HINT_T0);
      for (int l = 0; l < 4; l++) {
        const __m512 wv = _mm512_loadu_ps(wr + i + 16 * l);
        for (int m = 0; m < MR; m++) acc[m][l] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + m * lda + i + 16 * l), acc[m][l]);
      }
    }
    for (; i < k; i += 16) {
      const __mmask16 msk = tail_mask(k - i);
      const __m512 w0 = _mm512_maskz_loadu_ps(msk, wr + i);
      for (int m = 0; m < MR; m++) acc[m][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(msk, x + m * lda + i), acc[m][0]);
    }
    if (ex != nullptr) {
      const float* we = ex->w + n * ex->ldw;
      for (i64 j = 0; j < ex->k; j += 16) {
        const __mmask16 msk = tail_mask(ex->k - j);
        const __m512 w0 = _mm512_maskz_loadu_ps(msk, we + j);
        for (int m = 0; m < MR; m++) acc[m][1] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(msk, ex->x + m * ex->ldx + j), acc[m][1]);
      }
    }
    for (int m = 0; m < MR; m++) y[m * ldc + n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3])));
  }
#else
  for (i64 n = n0; n < n1; n++)
    for (int m = 0; m < MR; m++) y[m * ldc + n] = dot_f32(x + m * lda, w + n * ldb, k) + (ex != nullptr ? dot_f32(ex->x + m * ex->ldx, ex->w + n * ex->ldw, ex->k) : 0.0f);
#endif
}

// Few-row GEMM (a batched decode step: 5 to 64 activation rows), y[M, N] = x[M, K] · w[N, K]ᵀ
// (+ the extra columns): the product is computed transposed, yᵀ = w · xᵀ. x is packed once per
// GEMM into xt [K + ke][16·mv] (its M rows as mv vectors of 16 lanes, padded with zeros, the extra
// columns' xe after K), and a tile of NR weight rows × mv vectors keeps NR·mv = 24 sums in
// registers over the whole K: each step loads mv vectors of xt (L1/L2: M·(K + ke) floats) and
// broadcasts NR weight values, each weight element read exactly once from memory and multiplied
// into every row. The dot-product tiles (`tiles_nt`, 6 rows × 4 weight rows) reduce 24 vectors
// horizontally per tile and read x from L2 once the 32 rows outgrow L1: at M = 32 on the serving
// model's shapes they ran at about 0.45 of this kernel's rate (measured on this machine, 1 thread,
// weights hot in cache: 98 vs 150–168 GFLOP/s; streaming 30 layers' weights from memory: 50 vs
// 98). The tile's sums leave through a small transpose in L1.

/** Inputs a block of the few-row GEMM's sums runs over before it joins the tile's totals. */
constexpr i64 kFewBlock = 64;
/** Rows a few-row GEMM takes: fewer go to `rows_nt` (one weight row at a time), more to the tiles. */
// From 17 rows: at 5–16 the 6 × 4 dot-product tiles ran 1.1–4× faster on SmolLM2's projections
// (bench/results/no-slower.md), and 8 decode streams lost a quarter of their rate to it.
inline bool few_rows(i64 m) { return m >= 17 && m <= 64; }
/** Vectors of 16 rows for m activation rows. */
inline i64 few_vectors(i64 m) { return (m + 15) / 16; }
/** Weight rows per tile for mv vectors: 24 accumulators (of 32 registers). */
inline i64 few_tile_rows(i64 mv) { return mv == 1 ? 24 : mv == 2 ? 12 : mv == 3 ? 8 : 6; }

// xt[(k + ke) · W + j] = x[j, k] (xe[j, k − K] past K), zero for rows j ≥ m; W = 16 · mv.
void pack_few(const float* x, i64 lda, i64 m, i64 k, const GemmExtra* ex, float* xt) {
  const i64 mv = few_vectors(m), W = 16 * mv, ke = ex != nullptr ? ex->k : 0;
#ifdef SML_AVX512
  for (i64 v = 0; v < mv; v++) {
    const i64 rows = std::min<i64>(16, m - 16 * v);
    const __mmask16 live = tail_mask(rows);
    const __m512i ix = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(static_cast<int>(lda)));
    const float* xv = x + 16 * v * lda;
    for (i64 i = 0; i < k; i++) _mm512_storeu_ps(xt + i * W + 16 * v, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, ix, xv + i, 4));
    if (ke > 0) {
      const __m512i ie = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(static_cast<int>(ex->ldx)));
      const float* ev = ex->x + 16 * v * ex->ldx;
      for (i64 i = 0; i < ke; i++) _mm512_storeu_ps(xt + (k + i) * W + 16 * v, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, ie, ev + i, 4));
    }
  }
#else
  for (i64 i = 0; i < k + ke; i++)
    for (i64 j = 0; j < W; j++) xt[i * W + j] = j >= m ? 0.0f : i < k ? x[j * lda + i] : ex->x[j * ex->ldx + (i - k)];
#endif
}

#ifdef SML_AVX512
// y[0:m, n:n+nr] = the tile's NR weight rows (w, stride ldb; the extra columns we, stride ldw)
// times xt; nr ≤ NR (rows past nr repeat row 0 and are not stored).
template <int NR, int MV>
void few_tile(const float* xt, i64 m, i64 k, const float* w, i64 ldb, const float* we, i64 ldw, i64 ke, float* y, i64 ldc, int nr) {
  constexpr i64 W = 16 * MV;
  __m512 acc[NR][MV];
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < MV; v++) acc[r][v] = _mm512_setzero_ps();
  const float* wr[NR];
  for (int r = 0; r < NR; r++) wr[r] = w + (r < nr ? r : 0) * ldb;
  // NOTE: the sums run in blocks of kFewBlock inputs, each block's added to `tot` (in L1): one
  // chain over all of K lost 1e-4 relative to cancellation at K = 1100, the tiles' 16 partial
  // sums did not; blocks of 64 keep the error of those (64 + K / 64 terms a chain).
  alignas(64) float tot[NR][W];
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < MV; v++) _mm512_store_ps(&tot[r][16 * v], _mm512_setzero_ps());
  for (i64 i0 = 0; i0 < k; i0 += kFewBlock) {
    const i64 i1 = std::min(k, i0 + kFewBlock);
    for (i64 i = i0; i < i1; i++) {
      __m512 b[MV];
      for (int v = 0; v < MV; v++) b[v] = _mm512_loadu_ps(xt + i * W + 16 * v);
      // NOTE: the NR weight rows are NR sequential streams 4·ldb bytes apart; a prefetch a few
      // lines ahead of each (one per line) keeps them coming (measured: the LM head's 113 MB at
      // 1.3× the rate without).
      if ((i & 15) == 0)
        for (int r = 0; r < NR; r++) __builtin_prefetch(reinterpret_cast<const char*>(wr[r] + i + 64));
      for (int r = 0; r < NR; r++) {
        const __m512 a = _mm512_set1_ps(wr[r][i]);
        for (int v = 0; v < MV; v++) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
      }
    }
    if (i1 < k) {
      for (int r = 0; r < NR; r++)
        for (int v = 0; v < MV; v++) {
          _mm512_store_ps(&tot[r][16 * v], _mm512_add_ps(_mm512_load_ps(&tot[r][16 * v]), acc[r][v]));
          acc[r][v] = _mm512_setzero_ps();
        }
    }
  }
  for (i64 i = 0; i < ke; i++) {
    __m512 b[MV];
    for (int v = 0; v < MV; v++) b[v] = _mm512_loadu_ps(xt + (k + i) * W + 16 * v);
    for (int r = 0; r < NR; r++) {
      const __m512 a = _mm512_set1_ps(we[(r < nr ? r : 0) * ldw + i]);
      for (int v = 0; v < MV; v++) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < MV; v++) _mm512_store_ps(&tot[r][16 * v], _mm512_add_ps(_mm512_load_ps(&tot[r][16 * v]), acc[r][v]));
  for (i64 j = 0; j < m; j++) {
    float* o = y + j * ldc;
    for (int r = 0; r < nr; r++) o[r] = tot[r][j];
  }
}
#endif

// Serial: y[0:m, n0:n1] from the packed xt (pack_few of the same m, k and extra columns).
void few_range(const float* xt, i64 m, i64 k, const float* w, i64 ldb, float* y, i64 ldc, i64 n0, i64 n1, const GemmExtra* ex) {
  const i64 mv = few_vectors(m), nr = few_tile_rows(mv), ke = ex != nullptr ? ex->k : 0;
#ifdef SML_AVX512
  for (i64 n = n0; n < n1; n += nr) {
    const int left = static_cast<int>(std::min(nr, n1 - n));
    const float* we = ex != nullptr ? ex->w + n * ex->ldw : nullptr;
    const i64 ldw = ex != nullptr ? ex->ldw : 0;
    switch (mv) {
      case 1: few_tile<24, 1>(xt, m, k, w + n * ldb, ldb, we, ldw, ke, y + n, ldc, left); break;
      case 2: few_tile<12, 2>(xt, m, k, w + n * ldb, ldb, we, ldw, ke, y + n, ldc, left); break;
      case 3: few_tile<8, 3>(xt, m, k, w + n * ldb, ldb, we, ldw, ke, y + n, ldc, left); break;
      default: few_tile<6, 4>(xt, m, k, w + n * ldb, ldb, we, ldw, ke, y + n, ldc, left); break;
    }
  }
#else
  const i64 W = 16 * mv;
  for (i64 n = n0; n < n1; n++)
    for (i64 j = 0; j < m; j++) {
      float s = 0.0f;
      for (i64 i0 = 0; i0 < k; i0 += kFewBlock) {
        float b = 0.0f;
        for (i64 i = i0; i < std::min(k, i0 + kFewBlock); i++) b += xt[i * W + j] * w[n * ldb + i];
        s += b;
      }
      for (i64 i = 0; i < ke; i++) s += xt[(k + i) * W + j] * ex->w[n * ex->ldw + i];
      y[j * ldc + n] = s;
    }
  (void)nr;
#endif
}

// The calling thread's packing buffer (grown, never shrunk: a per-call allocation of up to
// 64 × (K + ke) floats would be an mmap and its page faults at the addon's 128 KiB threshold),
// 64-byte aligned: each k of the packed rows is mv whole vectors, and from the heap's 16-byte
// alignment every one of those loads would straddle two cache lines (measured: the M = 32 tile on
// one thread, weights hot, 115 GFLOP/s aligned vs 92-97 at the three other offsets).
float* few_buffer(i64 floats) {
  thread_local std::vector<float> buf;
  if (static_cast<i64>(buf.size()) < floats + 15) buf.resize(static_cast<size_t>(floats + 15));
  const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<float*>((p + 63) & ~static_cast<uintptr_t>(63));
}

/** The packed size (floats) of m rows of k (+ ke extra) columns. */
inline i64 few_packed_size(i64 m, i64 k, const GemmExtra* ex) { return (k + (ex != nullptr ? ex->k : 0)) * 16 * few_vectors(m); }

// y[M, N] (+ extra columns) over the pool for few_rows(m): x packed once on the calling thread,
// the weight rows split in tiles' multiples.
void few_gemm(const float* x, i64 lda, const float* w, i64 ldb, float* y, i64 ldc, i64 m, i64 k, i64 n, const GemmExtra* ex) {
  float* xt = few_buffer(few_packed_size(m, k, ex));
  pack_few(x, lda, m, k, ex, xt);
  const i64 nr = few_tile_rows(few_vectors(m));
  // 4 parts a thread: a descheduled worker's unclaimed parts are run by the others.
  pool().parallel((n + nr - 1) / nr, [&](i64 b, i64 e) { few_range(xt, m, k, w, ldb, y, ldc, b * nr, std::min(n, e * nr), ex); }, m * n * (k + (ex != nullptr ? ex->k : 0)) < kParallelMin, 4);
}

// Serial: y[M, n0:n1] over the whole K (chunked), plus the extra columns `ex` (with the last chunk).
void gemm_nt_range(const float* x, i64 lda, const float* w, i64 ldb, float* y, i64 ldc, i64 m, i64 k, i64 n0, i64 n1, const GemmExtra* ex = nullptr) {
  if (m <= 4 && k <= 8192) {
    switch (m) {
      case 4: rows_nt<4>(x, lda, w, ldb, y, ldc, k, n0, n1, ex); return;
      case 3: rows_nt<3>(x, lda, w, ldb, y, ldc, k, n0, n1, ex); return;
      case 2: rows_nt<2>(x, lda, w, ldb, y, ldc, k, n0, n1, ex); return;
      case 1: rows_nt<1>(x, lda, w, ldb, y, ldc, k, n0, n1, ex); return;
      default: return;
    }
  }
  if (few_rows(m) && k > 0 && n1 - n0 >= 48) {
    // NOTE: packs x for this range alone (M·K moves against M·K·(n1 − n0) multiply-adds: worth it
    // from a few tiles of columns); callers splitting one GEMM over the pool pack once through
    // few_gemm instead.
    float* xt = few_buffer(few_packed_size(m, k, ex));
    pack_few(x, lda, m, k, ex, xt);
    few_range(xt, m, k, w, ldb, y, ldc, n0, n1, ex);
    return;
  }
  if (k == 0) {
    // Only the extra columns (a zero-width K): one pass over them.
    if (ex != nullptr) tiles_nt(x, lda, w, ldb, y, ldc, m, 0, n0, n1, false, ex);
    return;
  }
  for (i64 kc = 0; kc < k; kc += kKc) {
    const i64 kl = std::min(kKc, k - kc);
    tiles_nt(x + kc, lda, w + kc, ldb, y, ldc, m, kl, n0, n1, kc > 0, kc + kl >= k ? ex : nullptr);
  }
}

#ifdef SML_AVX512
// One row over a short K (a batch-1 decode step's LoRA expand, y = t · B over the adapter's rank
// rows of B): y[0, n0:n1) = a[0, 0:K) · b[0:K, n0:n1), 64 columns at a time with every live row of
// b read side by side (K streams in flight, each prefetched 1 KB ahead) and the sums in registers,
// instead of one axpy pass over y per row of b that waits for each row's first lines. The same
// multiply-adds in the same order as that loop (rows j ascending from zero, one fused multiply-add
// each, rows whose coefficient is zero skipped), so the same bits.
constexpr i64 kNnShortK = 64;
void nn_row_short(const float* a, const float* b, i64 ldb, float* y, i64 k, i64 n0, i64 n1) {
  const float* live[kNnShortK];
  __m512 coef[kNnShortK];
  int nl = 0;
  for (i64 j = 0; j < k; j++)
    if (a[j] != 0.0f) {
      live[nl] = b + j * ldb;
      coef[nl++] = _mm512_set1_ps(a[j]);
    }
  for (i64 c = n0; c < n1; c += 64) {
    const i64 w = std::min<i64>(64, n1 - c);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    if (w == 64) {
      for (int q = 0; q < nl; q++) {
        const float* br = live[q] + c;
        for (int l = 0; l < 4; l++) _mm_prefetch(reinterpret_cast<const char*>(br + 256 + 16 * l), _MM_HINT_T0);
        for (int l = 0; l < 4; l++) acc[l] = _mm512_fmadd_ps(coef[q], _mm512_loadu_ps(br + 16 * l), acc[l]);
      }
      for (int l = 0; l < 4; l++) _mm512_storeu_ps(y + c + 16 * l, acc[l]);
    } else {
      for (int q = 0; q < nl; q++)
        for (int l = 0; 16 * l < w; l++) acc[l] = _mm512_fmadd_ps(coef[q], _mm512_maskz_loadu_ps(tail_mask(w - 16 * l), live[q] + c + 16 * l), acc[l]);
      for (int l = 0; 16 * l < w; l++) _mm512_mask_storeu_ps(y + c + 16 * l, tail_mask(w - 16 * l), acc[l]);
    }
  }
}
#endif

// Serial: y[M, n0:n1] = a[M, K] · b[K, N] (b row-major, vectorized over N).
void gemm_nn_range(const float* a, i64 lda, const float* b, i64 ldb, float* y, i64 ldc, i64 m, i64 k, i64 n0, i64 n1) {
#ifdef SML_AVX512
  if (m == 1 && k <= kNnShortK) {
    nn_row_short(a, b, ldb, y, k, n0, n1);
    return;
  }
#endif
  for (i64 r = 0; r < m; r++) {
    float* yr = y + r * ldc;
    std::memset(yr + n0, 0, sizeof(float) * static_cast<size_t>(n1 - n0));
    const float* ar = a + r * lda;
    for (i64 j = 0; j < k; j++) {
      if (j + 2 < k) __builtin_prefetch(reinterpret_cast<const char*>(b + (j + 2) * ldb + n0));
      const float s = ar[j];
      if (s != 0.0f) axpy_f32(yr + n0, b + j * ldb + n0, s, n1 - n0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Block-quantized weights, repacked: rows in groups of 16, inputs in sub-blocks of 32. Per (group,
// sub-block): codes (int4: 4 × 64 bytes, lane r byte b = code(k₀+b) | code(k₀+4+b) << 4 for
// k₀ = 8q; int8: 8 × 64 bytes, lane r byte b = code(4q + b)), 16 f32 scales, 16 u8 zero points
// (asymmetric only).

struct QPacked {
  int bits = 4;
  i64 n = 0, k = 0, groups = 0, kb = 0;  // kb: sub-blocks of 32 inputs
  bool asym = false;
  float zp = 8;  // symmetric zero point 2^(bits−1)
  std::vector<uint8_t, std::allocator<uint8_t>> codes;
  std::vector<float> scales;
  std::vector<uint8_t> zps;
  // Fallback (block sizes that do not tile by 32): the dequantized weight [n, k].
  std::vector<float> dense;
};

inline int unpack_code(const uint8_t* row, i64 j, int bits) {
  if (bits == 8) return row[j];
  const uint8_t b = row[j >> 1];
  return (j & 1) == 0 ? (b & 0x0F) : (b >> 4);
}

std::shared_ptr<QPacked> pack_quant(const uint8_t* q, const float* s, const uint8_t* zp, i64 n, i64 k, int bits, i64 bs) {
  auto p = std::make_shared<QPacked>();
  p->bits = bits;
  p->n = n;
  p->k = k;
  p->asym = zp != nullptr;
  p->zp = static_cast<float>(1 << (bits - 1));
  const i64 blocks = (k + bs - 1) / bs;
  const i64 bb = (bs * bits + 7) / 8;
  const i64 zb = (blocks * bits + 7) / 8;
  auto code = [&](i64 o, i64 i) -> int {
    const i64 blk = i / bs;
    return unpack_code(q + (o * blocks + blk) * bb, i - blk * bs, bits);
  };
  auto zero = [&](i64 o, i64 blk) -> int { return zp == nullptr ? (1 << (bits - 1)) : unpack_code(zp + o * zb, blk, bits); };
#ifdef SML_VNNI
  const bool tiles = bs % 32 == 0;
#else
  const bool tiles = false;
#endif
  if (!tiles) {
    p->dense.resize(static_cast<size_t>(n * k));
    for (i64 o = 0; o < n; o++)
      for (i64 i = 0; i < k; i++) p->dense[o * k + i] = static_cast<float>(code(o, i) - zero(o, i / bs)) * s[o * blocks + i / bs];
    return p;
  }
  p->groups = (n + 15) / 16;
  p->kb = (k + 31) / 32;
  const i64 cb = bits == 4 ? 256 : 512;
  p->codes.assign(static_cast<size_t>(p->groups * p->kb * cb), 0);
  p->scales.assign(static_cast<size_t>(p->groups * p->kb * 16), 0.0f);
  if (p->asym) p->zps.assign(static_cast<size_t>(p->groups * p->kb * 16), 0);
  for (i64 g = 0; g < p->groups; g++)
    for (i64 kb = 0; kb < p->kb; kb++) {
      uint8_t* c = p->codes.data() + (g * p->kb + kb) * cb;
      for (int r = 0; r < 16; r++) {
        const i64 o = g * 16 + r;
        if (o >= n) continue;
        const i64 blk = (kb * 32) / bs;
        p->scales[(g * p->kb + kb) * 16 + r] = s[o * blocks + blk];
        if (p->asym) p->zps[(g * p->kb + kb) * 16 + r] = static_cast<uint8_t>(zero(o, blk));
        auto at = [&](i64 i) -> int { return i < k ? code(o, i) : 0; };
        if (bits == 4) {
          for (int qq = 0; qq < 4; qq++)
            for (int b = 0; b < 4; b++) {
              const i64 k0 = kb * 32 + 8 * qq;
              c[qq * 64 + r * 4 + b] = static_cast<uint8_t>(at(k0 + b) | (at(k0 + 4 + b) << 4));
            }
        } else {
          for (int qq = 0; qq < 8; qq++)
            for (int b = 0; b < 4; b++) c[qq * 64 + r * 4 + b] = static_cast<uint8_t>(at(kb * 32 + 4 * qq + b));
        }
      }
    }
  return p;
}

// Programs sharing one quantized weight (the engine's slot forms and base program read the same
// parameter arrays) share its repacked copy: keyed by the arrays' addresses and the attributes,
// held weakly (each program pins its arrays, so an address is not reused while its entry lives).
std::shared_ptr<QPacked> shared_pack(const uint8_t* q, const float* s, const uint8_t* zp, i64 n, i64 k, int bits, i64 bs) {
  static std::mutex m;
  static std::map<std::tuple<const void*, const void*, const void*, i64, i64, int, i64>, std::weak_ptr<QPacked>> cache;
  const auto key = std::make_tuple(static_cast<const void*>(q), static_cast<const void*>(s), static_cast<const void*>(zp), n, k, bits, bs);
  std::lock_guard<std::mutex> lk(m);
  for (auto it = cache.begin(); it != cache.end();) it = it->second.expired() ? cache.erase(it) : std::next(it);
  if (auto hit = cache[key].lock()) return hit;
  auto p = pack_quant(q, s, zp, n, k, bits, bs);
  cache[key] = p;
  return p;
}

// Activations of one linear, quantized per (row, 32 inputs): int8 codes, scale d, and zd =
// zp · d · Σ codes (the weights' zero point folded in). Laid out block-major ([block][row]) so
// that a tile's rows of one block are adjacent.
struct QAct {
  std::vector<int8_t> q;
  std::vector<float> d, zd;
  i64 kb = 0, m = 0;
  // Bytes from one block's codes to the next's: m · 32, padded so that consecutive blocks do not
  // start 4 KB apart (m = 128: every block's rows would fall in the same L1 sets, 8 or 12 ways).
  i64 stride = 0;
};

void quantize_act(const float* x, i64 m, i64 k, float zp, QAct& a) {
  a.kb = (k + 31) / 32;
  a.m = m;
  a.stride = (m * 32 + 63) / 64 * 64;
  if (a.stride % 512 == 0) a.stride += 64;
  a.q.resize(static_cast<size_t>(a.stride * a.kb));
  a.d.resize(static_cast<size_t>(m * a.kb));
  a.zd.resize(static_cast<size_t>(m * a.kb));
  pool().parallel(m, [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; r++)
      for (i64 b = 0; b < a.kb; b++) {
        const float* xs = x + r * k + b * 32;
        const i64 len = std::min<i64>(32, k - b * 32);
        int8_t* qs = a.q.data() + b * a.stride + r * 32;
#ifdef SML_AVX512
        const __mmask16 m0 = tail_mask(len), m1 = tail_mask(std::max<i64>(0, len - 16));
        const __m512 v0 = _mm512_maskz_loadu_ps(m0, xs), v1 = _mm512_maskz_loadu_ps(m1, xs + 16);
        const float amax = std::max(_mm512_reduce_max_ps(_mm512_abs_ps(v0)), _mm512_reduce_max_ps(_mm512_abs_ps(v1)));
        const float d = amax / 127.0f;
        const __m512 id = _mm512_set1_ps(d > 0 ? 1.0f / d : 0.0f);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtsepi32_epi8(q1));
        const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
        float amax = 0;
        for (i64 i = 0; i < len; i++) amax = std::max(amax, std::fabs(xs[i]));
        const float d = amax / 127.0f;
        const float id = d > 0 ? 1.0f / d : 0.0f;
        int sum = 0;
        for (i64 i = 0; i < 32; i++) {
          const int v = i < len ? static_cast<int>(std::nearbyint(xs[i] * id)) : 0;
          qs[i] = static_cast<int8_t>(std::max(-127, std::min(127, v)));
          sum += qs[i];
        }
#endif
        a.d[b * m + r] = d;
        a.zd[b * m + r] = zp * d * static_cast<float>(sum);
      }
  }, m * k < kParallelMin);
}

#ifdef SML_VNNI
template <int MT>
void qtile(const QPacked& w, const QAct& a, i64 m0, i64 g, float* y, i64 ldc) {
  __m512 facc[MT];
  for (int m = 0; m < MT; m++) facc[m] = _mm512_setzero_ps();
  const i64 cb = w.bits == 4 ? 256 : 512;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (i64 kb = 0; kb < w.kb; kb++) {
    const uint8_t* c = w.codes.data() + (g * w.kb + kb) * cb;
    // Every line of the block 2 KB ahead (the codes of a row group are one sequential stream).
    for (i64 o = 0; o < cb; o += 64) __builtin_prefetch(reinterpret_cast<const char*>(c + 2048 + o));
    __builtin_prefetch(reinterpret_cast<const char*>(w.scales.data() + (g * w.kb + kb + 8) * 16));
    // NA independent accumulators per activation row: with few rows, one chain of dependent
    // vpdpbusd would bound the kernel by its latency, not by memory.
    constexpr int NA = MT == 1 ? 4 : MT == 2 ? 2 : 1;
    const int8_t* xb = a.q.data() + kb * a.stride + m0 * 32;
    const float* db = a.d.data() + kb * a.m + m0;
    const float* zb = a.zd.data() + kb * a.m + m0;
    __m512i ia[MT][NA];
    for (int m = 0; m < MT; m++)
      for (int a = 0; a < NA; a++) ia[m][a] = _mm512_setzero_si512();
    if (w.bits == 4) {
      for (int qq = 0; qq < 4; qq++) {
        const __m512i v = _mm512_loadu_si512(c + 64 * qq);
        const __m512i lo = _mm512_and_si512(v, nib);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        for (int m = 0; m < MT; m++) {
          const int32_t* xq = reinterpret_cast<const int32_t*>(xb + m * 32);
          __m512i& acc = ia[m][qq % NA];
          acc = _mm512_dpbusd_epi32(acc, lo, _mm512_set1_epi32(xq[2 * qq]));
          acc = _mm512_dpbusd_epi32(acc, hi, _mm512_set1_epi32(xq[2 * qq + 1]));
        }
      }
    } else {
      for (int qq = 0; qq < 8; qq++) {
        const __m512i v = _mm512_loadu_si512(c + 64 * qq);
        for (int m = 0; m < MT; m++) {
          const int32_t* xq = reinterpret_cast<const int32_t*>(xb + m * 32);
          __m512i& acc = ia[m][qq % NA];
          acc = _mm512_dpbusd_epi32(acc, v, _mm512_set1_epi32(xq[qq]));
        }
      }
    }
    __m512i iacc[MT];
    for (int m = 0; m < MT; m++) {
      iacc[m] = ia[m][0];
      for (int q2 = 1; q2 < NA; q2++) iacc[m] = _mm512_add_epi32(iacc[m], ia[m][q2]);
    }
    const __m512 dw = _mm512_loadu_ps(w.scales.data() + (g * w.kb + kb) * 16);
    if (!w.asym) {
      for (int m = 0; m < MT; m++) {
        const __m512 t = _mm512_fmsub_ps(_mm512_cvtepi32_ps(iacc[m]), _mm512_set1_ps(db[m]), _mm512_set1_ps(zb[m]));
        facc[m] = _mm512_fmadd_ps(dw, t, facc[m]);
      }
    } else {
      const __m128i z8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.zps.data() + (g * w.kb + kb) * 16));
      const __m512 dwz = _mm512_mul_ps(dw, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(z8)));
      for (int m = 0; m < MT; m++) {
        facc[m] = _mm512_fmadd_ps(dw, _mm512_mul_ps(_mm512_cvtepi32_ps(iacc[m]), _mm512_set1_ps(db[m])), facc[m]);
        facc[m] = _mm512_fnmadd_ps(dwz, _mm512_set1_ps(zb[m]), facc[m]);
      }
    }
  }
  const i64 rows = std::min<i64>(16, w.n - g * 16);
  const __mmask16 msk = tail_mask(rows);
  for (int m = 0; m < MT; m++) _mm512_mask_storeu_ps(y + (m0 + m) * ldc + g * 16, msk, facc[m]);
}

// qtile over rows [r, m) of group g, 8 rows at a time.
void qtile_rows(const QPacked& w, const QAct& a, i64 r, i64 m, i64 g, float* y) {
  while (r < m) {
    const i64 left = m - r;
    switch (left >= 8 ? 8 : left) {
      case 8: qtile<8>(w, a, r, g, y, w.n); r += 8; break;
      case 7: qtile<7>(w, a, r, g, y, w.n); r += 7; break;
      case 6: qtile<6>(w, a, r, g, y, w.n); r += 6; break;
      case 5: qtile<5>(w, a, r, g, y, w.n); r += 5; break;
      case 4: qtile<4>(w, a, r, g, y, w.n); r += 4; break;
      case 3: qtile<3>(w, a, r, g, y, w.n); r += 3; break;
      case 2: qtile<2>(w, a, r, g, y, w.n); r += 2; break;
      default: qtile<1>(w, a, r, g, y, w.n); r += 1; break;
    }
  }
}

#endif

void qlinear(const QPacked& w, const float* x, i64 m, float* y) {
  Pool& P = pool();
  if (!w.dense.empty()) {
    P.parallel((w.n + 3) / 4, [&](i64 b, i64 e) { gemm_nt_range(x, w.k, w.dense.data(), w.k, y, w.n, m, w.k, b * 4, std::min(w.n, e * 4)); }, m * w.n * w.k < kParallelMin);
  } else {
#ifdef SML_VNNI
    QAct a;
    // Symmetric: the weights' single zero point is folded into zd; asymmetric ones apply their own.
    quantize_act(x, m, w.k, w.asym ? 1.0f : w.zp, a);
    P.parallel(w.groups, [&](i64 g0, i64 g1) {
      for (i64 g = g0; g < g1; g++) qtile_rows(w, a, 0, m, g, y);
    }, m * w.n * w.k < kParallelMin);
#else
    fail("CPU_INTERNAL", "quantized tiles without VNNI");
#endif
  }
}

// ---------------------------------------------------------------------------------------------
// The program.

enum DType { DT_F32 = 0, DT_I64 = 1, DT_U8 = 2, DT_BOOL = 3, DT_I32 = 4, DT_I8 = 5 };
inline size_t dtype_bytes(int dt) { return dt == DT_F32 || dt == DT_I32 ? 4 : dt == DT_I64 ? 8 : 1; }

enum Storage { ST_SLOT = 0, ST_INPUT = 1, ST_PARAM = 2, ST_VIEW = 3, ST_OUTPUT = 4 };

enum Op {
  OP_COPY = 0,
  OP_TRANSPOSE = 1,
  OP_CAST = 2,
  OP_BINARY = 3,
  OP_UNARY = 4,
  OP_CONCAT = 5,
  OP_GATHER = 6,
  OP_SLICE = 7,
  OP_RMSNORM = 8,
  OP_LINEAR = 9,
  OP_MATMUL = 10,
  OP_QLINEAR = 11,
  OP_ROTARY = 12,
  OP_ATTENTION = 13,
  OP_SOFTMAX = 14,
  OP_RESHAPE = 15,     // view of operand 0
  OP_GATHER_VIEW = 16, // view of table[index] (rank-0 index, axis 0)
  OP_BROADCAST = 17,
  OP_LAYERNORM = 18,
  OP_WHERE = 19,
  OP_ATTENTION_KV = 20,
  OP_LORA = 21,
  OP_LORA_LINEAR = 22,
  OP_GROUPED_MATMUL = 23,
  OP_SCATTER_ADD = 24,
  OP_TOPK = 25,
  OP_REDUCE = 26,
  OP_ARGMAX = 27,
  OP_IOTA = 28,
  OP_LORA_Q = 29,  // the gathered LoRA term over int8 factor tables with per-row scales
  OP_LINEAR_MULTI = 30,   // sibling f32 linears of one input (a layer's q/k/v, gate/up), one dispatch at few rows
  OP_QLINEAR_MULTI = 31,  // the same over block-quantized weights
  OP_COUNT = 32,   // instructions this runner knows: compile refuses others
};

// The runner's ABI: bumped whenever instructions are added or their encoding changes, so a
// prebuilt addon older than the TypeScript encoder (src/native/addon.ts, CPU_ADDON_ABI) is
// detected at load instead of failing on an instruction it lacks.
constexpr int kAbi = 8;  // 2: MoE instructions (23-28) and abi(); 3: bandwidth(), profile(), LORA's i[0] (zeroTail); 4: fixed malloc mmap threshold at load, i8 values, LORA_Q; 5: LORA_LINEAR as one GEMM over K + R columns; 6: few-row GEMM (x packed transposed), gathered LoRA kernels, fmaPeak(); 7: row inputs (run takes an array of per-row buffers for a cache input of ATTENTION_KV; rowInputs()); 8: argmax(), LINEAR_MULTI and QLINEAR_MULTI

enum Binary { B_ADD = 0, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN, B_POW };
enum Unary { U_NEG = 0, U_ABS, U_EXP, U_LOG, U_SQRT, U_RSQRT, U_TANH, U_SIGMOID, U_SILU, U_SIN, U_COS, U_GELU, U_GELU_TANH };

struct Term {
  i64 coef;
  std::vector<int> vars;
};
struct Expr {
  i64 c = 0;
  std::vector<Term> terms;
};
struct Val {
  int dtype = DT_F32;
  std::vector<int> dims;  // expression ids
  int storage = ST_SLOT;
  int index = 0;  // slot / input / param / output index, or for views the source value
};
struct Instr {
  int op = 0;
  std::vector<int> a, r;
  std::vector<i64> i;
  std::vector<double> f;
  std::shared_ptr<QPacked> pack;
  std::vector<std::shared_ptr<QPacked>> packs;  // QLINEAR_MULTI: one per sibling weight
};

struct Program {
  int nsym = 0, nslots = 0, ninputs = 0, noutputs = 0;
  std::vector<Expr> exprs;
  std::vector<Val> vals;
  std::vector<Instr> code;
  std::vector<void*> params;
  std::vector<size_t> param_bytes;
  std::vector<napi_ref> refs;
  std::vector<int> output_vals;
  // Per input: whether a run may give it as per-row buffers (see RowInput): every read of it is
  // an ATTENTION_KV cache operand in the position-major layout.
  std::vector<uint8_t> row_ok;
  // Spare run states (their shape vectors keep their capacity from run to run).
  std::mutex spare_m;
  std::vector<std::unique_ptr<struct Run>> spare;
  // Where this run's slots lie in the intermediates' arena (g_arena; runs hold g_run_mutex).
  std::vector<size_t> slot_bytes, slot_off;
};

// The intermediates' arena, one for every program of the process: runs are serialized
// (g_run_mutex) and copy their outputs out, so the arena is the largest run's intermediates, not
// the sum of every prepared program's (the engine prepares four slot forms).
void* g_arena = nullptr;
size_t g_arena_bytes = 0;

i64 numel(const std::vector<i64>& s) {
  i64 n = 1;
  for (i64 d : s) n *= d;
  return n;
}

// An input given per batch row (a cache operand of ATTENTION_KV, [B, S, h, d] position-major):
// row b's first len[b] ≤ S positions at p[b], each row in its own buffer (a sequence's own KV,
// read in place instead of copied into one contiguous batch); positions at or past len[b] read
// as zeros (the caller masks them).
struct RowInput {
  std::vector<const float*> p;
  std::vector<i64> len;
};

// One run's bindings: symbol values, every value's shape and where its data is.
struct Run {
  const std::vector<Val>& vals;
  const std::vector<Expr>& exprs;
  std::vector<i64> dimv;
  std::vector<std::vector<i64>> shapes;
  std::vector<void*> ptr;
  // Per value: its index in `rows` when the run gives it per row, else -1.
  std::vector<int> row_of;
  std::vector<RowInput> rows;
  // One zero row (the widest head dim read so far): what a per-row input's missing positions read.
  std::vector<float> zeros;
  explicit Run(const Program& p) : vals(p.vals), exprs(p.exprs) {}
};


std::string shape_str(const std::vector<i64>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); i++) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

// Strides (in elements) of operand shape `s` broadcast against `out` (right-aligned).
std::vector<i64> bstrides(const std::vector<i64>& s, const std::vector<i64>& out) {
  std::vector<i64> st(out.size(), 0);
  i64 acc = 1;
  const size_t off = out.size() - s.size();
  for (size_t d = s.size(); d-- > 0;) {
    st[off + d] = (s[d] == 1 && out[off + d] != 1) ? 0 : acc;
    acc *= s[d];
  }
  return st;
}

// Elements before and after axis `ax` of `shape`.
std::pair<i64, i64> split_at(const std::vector<i64>& shape, size_t ax) {
  i64 outer = 1, inner = 1;
  for (size_t d = 0; d < ax; d++) outer *= shape[d];
  for (size_t d = ax + 1; d < shape.size(); d++) inner *= shape[d];
  return {outer, inner};
}

// Row-major (contiguous) strides of `shape`, in elements.
std::vector<i64> row_major(const std::vector<i64>& shape) {
  std::vector<i64> st(shape.size());
  i64 acc = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    st[d] = acc;
    acc *= shape[d];
  }
  return st;
}

// Calls f(offsets…) for every index of `shape` except the last axis, with each operand's offset.
template <int N, typename F>
void for_rows(const std::vector<i64>& shape, const std::vector<i64>* strides, F f) {
  const size_t rank = shape.size();
  if (rank == 0) {
    i64 o[N] = {};
    f(o);
    return;
  }
  for (i64 d : shape)
    if (d == 0) return;
  std::vector<i64> idx(rank, 0);
  i64 o[N] = {};
  for (;;) {
    f(o);
    size_t d = rank - 1;
    for (;;) {
      if (d == 0) return;
      d--;
      idx[d]++;
      for (int n = 0; n < N; n++) o[n] += strides[n][d];
      if (idx[d] < shape[d]) break;
      for (int n = 0; n < N; n++) o[n] -= strides[n][d] * shape[d];
      idx[d] = 0;
    }
  }
}

inline float* F(Run& p, int v) { return static_cast<float*>(p.ptr[v]); }
inline double* D(Run& p, int v) { return static_cast<double*>(p.ptr[v]); }

template <typename T>
void strided_copy_t(const T* src, T* dst, const std::vector<i64>& shape, const std::vector<i64>& sst) {
  const size_t rank = shape.size();
  const i64 inner = rank == 0 ? 1 : shape[rank - 1];
  const i64 is = rank == 0 ? 1 : sst[rank - 1];
  const std::vector<i64> dst_st = row_major(shape);
  const std::vector<i64> st[2] = {sst, dst_st};
  for_rows<2>(shape, st, [&](const i64* o) {
    const T* s = src + o[0];
    T* t = dst + o[1];
    if (is == 1) std::memcpy(t, s, sizeof(T) * static_cast<size_t>(inner));
    else
      for (i64 j = 0; j < inner; j++) t[j] = s[j * is];
  });
}

void strided_copy_serial(const void* src, void* dst, size_t elem, const std::vector<i64>& shape, const std::vector<i64>& sst) {
  switch (elem) {
    case 8: strided_copy_t(static_cast<const double*>(src), static_cast<double*>(dst), shape, sst); break;
    case 4: strided_copy_t(static_cast<const float*>(src), static_cast<float*>(dst), shape, sst); break;
    default: strided_copy_t(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), shape, sst); break;
  }
}

// A copy of 64 K+ elements is split over the pool along its first axis longer than 1 (a prefill's
// head transposes, [1, 128, 16, 128] → [1, 16, 128, 128], ran on one thread).
void strided_copy(const void* src, void* dst, size_t elem, const std::vector<i64>& shape, const std::vector<i64>& sst) {
  size_t ax = 0;
  while (ax + 1 < shape.size() && shape[ax] == 1) ax++;
  const i64 n = numel(shape);
  if (n < (1 << 16) || ax + 1 >= shape.size() || shape[ax] < 2) {
    strided_copy_serial(src, dst, elem, shape, sst);
    return;
  }
  const std::vector<i64> sub(shape.begin() + static_cast<std::ptrdiff_t>(ax + 1), shape.end());
  const std::vector<i64> sub_st(sst.begin() + static_cast<std::ptrdiff_t>(ax + 1), sst.end());
  const i64 slice = n / shape[ax];
  const uint8_t* s8 = static_cast<const uint8_t*>(src);
  uint8_t* d8 = static_cast<uint8_t*>(dst);
  pool().parallel(shape[ax], [&](i64 b, i64 e) {
    for (i64 i = b; i < e; i++) strided_copy_serial(s8 + static_cast<size_t>(i * sst[ax]) * elem, d8 + static_cast<size_t>(i * slice) * elem, elem, sub, sub_st);
  });
}

inline float apply_binary(int k, float a, float b) {
  switch (k) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_MAX: return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case B_MIN: return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    default: return std::pow(a, b);
  }
}

// Calls row(pa, pb, py, inner, ia, ib) for each row of the broadcast output: pointers to the
// row's first elements and the operands' strides along it (1, or 0 where broadcast).
template <typename T, typename Row>
void binary_rows(const T* a, const T* b, T* y, const std::vector<i64>& out, const std::vector<i64>& sa, const std::vector<i64>& sb, Row row) {
  const size_t rank = out.size();
  const i64 inner = rank == 0 ? 1 : out[rank - 1];
  const i64 ia = rank == 0 ? 0 : sa[rank - 1], ib = rank == 0 ? 0 : sb[rank - 1];
  const std::vector<i64> st[3] = {sa, sb, row_major(out)};
  for_rows<3>(out, st, [&](const i64* o) { row(a + o[0], b + o[1], y + o[2], inner, ia, ib); });
}

// f(begin, end) over [0, n): split over the pool in chunks of 4096 elements when n is large
// (a prefill's activations: the MLP's silu and product over 128 × 3072 values ran on one thread).
template <typename F>
void elementwise_parallel(i64 n, F f) {
  constexpr i64 kChunk = 1 << 12;
  if (n < (1 << 16)) {
    f(0, n);
    return;
  }
  pool().parallel((n + kChunk - 1) / kChunk, [&](i64 b, i64 e) { f(b * kChunk, std::min(n, e * kChunk)); });
}

void binary_f32(int kind, const float* a, const float* b, float* y, const std::vector<i64>& out, const std::vector<i64>& sa, const std::vector<i64>& sb) {
  const std::vector<i64> dense = row_major(out);
  // Whether strides st walk the output's elements in order (dims of size 1 have any stride).
  const auto in_order = [&](const std::vector<i64>& st) {
    for (size_t d = 0; d < out.size(); d++)
      if (out[d] != 1 && st[d] != dense[d]) return false;
    return true;
  };
  if (in_order(sa) && in_order(sb)) {
    // Same-shape operands: one flat loop, split over the threads.
    elementwise_parallel(numel(out), [&](i64 i0, i64 i1) {
      switch (kind) {
        case B_ADD: for (i64 j = i0; j < i1; j++) y[j] = a[j] + b[j]; return;
        case B_MUL: for (i64 j = i0; j < i1; j++) y[j] = a[j] * b[j]; return;
        case B_SUB: for (i64 j = i0; j < i1; j++) y[j] = a[j] - b[j]; return;
        default: for (i64 j = i0; j < i1; j++) y[j] = apply_binary(kind, a[j], b[j]); return;
      }
    });
    return;
  }
  binary_rows(a, b, y, out, sa, sb, [&](const float* pa, const float* pb, float* py, i64 inner, i64 ia, i64 ib) {
    if (ia == 1 && ib == 1) {
      switch (kind) {
        case B_ADD: for (i64 j = 0; j < inner; j++) py[j] = pa[j] + pb[j]; return;
        case B_MUL: for (i64 j = 0; j < inner; j++) py[j] = pa[j] * pb[j]; return;
        case B_SUB: for (i64 j = 0; j < inner; j++) py[j] = pa[j] - pb[j]; return;
        default: break;
      }
    }
    if (ia == 1 && ib == 0 && kind == B_MUL) {
      const float sc = pb[0];
      for (i64 j = 0; j < inner; j++) py[j] = pa[j] * sc;
      return;
    }
    for (i64 j = 0; j < inner; j++) py[j] = apply_binary(kind, pa[j * ia], pb[j * ib]);
  });
}

// Integer operands (i64 stored as double, i32, u8), wrapping to the result type like the IR.
template <typename T>
void binary_int(int kind, const T* a, const T* b, T* y, const std::vector<i64>& out, const std::vector<i64>& sa, const std::vector<i64>& sb) {
  binary_rows(a, b, y, out, sa, sb, [&](const T* pa, const T* pb, T* py, i64 inner, i64 ia, i64 ib) {
    for (i64 j = 0; j < inner; j++) {
      const double x = static_cast<double>(pa[j * ia]), z = static_cast<double>(pb[j * ib]);
      double v;
      switch (kind) {
        case B_ADD: v = x + z; break;
        case B_SUB: v = x - z; break;
        case B_MUL: v = x * z; break;
        case B_DIV: v = z == 0 ? 0 : std::trunc(x / z); break;
        case B_MAX: v = std::max(x, z); break;
        case B_MIN: v = std::min(x, z); break;
        default: v = std::trunc(std::pow(x, z)); break;
      }
      if (sizeof(T) == 4) v = static_cast<double>(static_cast<int32_t>(static_cast<int64_t>(v)));
      if (sizeof(T) == 1) v = static_cast<double>(static_cast<int64_t>(v) & 0xFF);
      py[j] = static_cast<T>(v);
    }
  });
}

inline float sigmoidf(float v) { return 1.0f / (1.0f + std::exp(-v)); }

void unary_f32_range(int kind, const float* x, float* y, i64 n) {
#ifdef SML_AVX512
  if (kind == U_SILU || kind == U_EXP || kind == U_SIGMOID) {
    i64 i = 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i < n; i += 16) {
      const __mmask16 m = tail_mask(n - i);
      const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
      __m512 r;
      if (kind == U_EXP) r = exp512(v);
      else {
        const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), v))));
        r = kind == U_SILU ? _mm512_mul_ps(v, s) : s;
      }
      _mm512_mask_storeu_ps(y + i, m, r);
    }
    return;
  }
#endif
  for (i64 i = 0; i < n; i++) {
    const float v = x[i];
    float r;
    switch (kind) {
      case U_NEG: r = -v; break;
      case U_ABS: r = std::fabs(v); break;
      case U_EXP: r = std::exp(v); break;
      case U_LOG: r = std::log(v); break;
      case U_SQRT: r = std::sqrt(v); break;
      case U_RSQRT: r = 1.0f / std::sqrt(v); break;
      case U_TANH: r = std::tanh(v); break;
      case U_SIGMOID: r = sigmoidf(v); break;
      case U_SILU: r = v * sigmoidf(v); break;
      case U_SIN: r = std::sin(v); break;
      case U_COS: r = std::cos(v); break;
      case U_GELU: r = static_cast<float>(0.5 * v * (1.0 + std::erf(v * 0.70710678118654752))); break;
      default: r = static_cast<float>(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * static_cast<double>(v) * v * v)))); break;
    }
    y[i] = r;
  }
}

void unary_f32(int kind, const float* x, float* y, i64 n) {
  elementwise_parallel(n, [&](i64 i0, i64 i1) { unary_f32_range(kind, x + i0, y + i0, i1 - i0); });
}

// softmax over the middle axis of [outer, n, inner]
void softmax_axis(const float* x, float* y, i64 outer, i64 n, i64 inner) {
  for (i64 o = 0; o < outer; o++)
    for (i64 c = 0; c < inner; c++) {
      const float* xs = x + o * n * inner + c;
      float* ys = y + o * n * inner + c;
      float m = -INFINITY;
      for (i64 j = 0; j < n; j++) m = std::max(m, xs[j * inner]);
      double s = 0;
      for (i64 j = 0; j < n; j++) {
        ys[j * inner] = std::exp(xs[j * inner] - m);
        s += ys[j * inner];
      }
      const float inv = static_cast<float>(1.0 / s);
      for (i64 j = 0; j < n; j++) ys[j * inner] *= inv;
    }
}

// Keys or values as up to two segments along the sequence axis, each [nb, h, s, d] (layout 0) or
// [nb, s, h, d] (layout 1, the cache inputs as the engine feeds them: read in place, no transpose
// or concatenation).
// A segment given per row (RowInput, layout 1 only) reads row b's positions from rp[b], those at
// or past rl[b] from `zero`.
struct Seg {
  const float* p = nullptr;
  i64 s = 0, h = 0, d = 0;
  int layout = 0;
  const float* const* rp = nullptr;
  const i64* rl = nullptr;
  const float* zero = nullptr;
  const float* row(i64 b, i64 hh, i64 j) const {
    if (rp != nullptr) return j < rl[b] ? rp[b] + (j * h + hh) * d : zero;
    return layout == 0 ? p + ((b * h + hh) * s + j) * d : p + ((b * s + j) * h + hh) * d;
  }
};

Seg seg_of(Run& p, int v, int layout) {
  const auto& sh = p.shapes[v];
  const size_t r = sh.size();
  Seg g;
  g.p = F(p, v);
  g.layout = layout;
  g.d = sh[r - 1];
  g.h = layout == 0 ? sh[r - 3] : sh[r - 2];
  g.s = layout == 0 ? sh[r - 2] : sh[r - 3];
  const int ri = p.row_of.empty() ? -1 : p.row_of[static_cast<size_t>(v)];
  if (ri >= 0) {
    // Compile admits per-row inputs only here, as position-major caches (Program::row_ok).
    if (layout != 1 || r != 4) fail("CPU_INTERNAL", "a per-row input read in another layout");
    const RowInput& ro = p.rows[static_cast<size_t>(ri)];
    if (p.zeros.size() < static_cast<size_t>(g.d)) p.zeros.assign(static_cast<size_t>(g.d), 0.0f);
    g.rp = ro.p.data();
    g.rl = ro.len.data();
    g.zero = p.zeros.data();
  }
  return g;
}

// Calls f(j, row) for keys 0 … jmax−1 of (batch b, kv head kh) across the segments (only those
// with live[j] != 0 when `live` is given), prefetching the row 12 keys ahead (cache rows are
// scattered).
template <typename F>
void each_row(const Seg* segs, int n, i64 jmax, i64 b, i64 kh, const uint8_t* live, F f) {
  i64 j = 0;
  for (int sg = 0; sg < n && j < jmax; sg++)
    for (i64 jj = 0; jj < segs[sg].s && j < jmax; jj++, j++) {
      if (jj + 12 < segs[sg].s && (live == nullptr || (j + 12 < jmax && live[j + 12] != 0))) {
        const char* pf = reinterpret_cast<const char*>(segs[sg].row(b, kh, jj + 12));
        for (i64 o = 0; o < segs[sg].d * 4; o += 64) __builtin_prefetch(pf + o);
      }
      if (live == nullptr || live[j] != 0) f(j, segs[sg].row(b, kh, jj));
    }
}

#ifdef SML_AVX512
// Prefill attention's block micro-kernels (6 rows of a query block × up to 64 keys or value
// columns, accumulators in registers; rows past `nr` repeat the last row and are not stored).
// s[t][j0 + 16u + l] = q_t · k_(j0+16u+l) over d, with kt the block's keys transposed [d][ldk].
template <int NV>
void att_scores6(const float* const* qrow, int nr, const float* kt, i64 ldk, i64 d, float* out, i64 ldo) {
  __m512 a[6][NV];
  for (int t = 0; t < 6; t++)
    for (int u = 0; u < NV; u++) a[t][u] = _mm512_setzero_ps();
  const float* q0 = qrow[0];
  const float* q1 = qrow[std::min(1, nr - 1)];
  const float* q2 = qrow[std::min(2, nr - 1)];
  const float* q3 = qrow[std::min(3, nr - 1)];
  const float* q4 = qrow[std::min(4, nr - 1)];
  const float* q5 = qrow[std::min(5, nr - 1)];
  for (i64 e = 0; e < d; e++, kt += ldk) {
    __m512 kv[NV];
    for (int u = 0; u < NV; u++) kv[u] = _mm512_loadu_ps(kt + 16 * u);
    const __m512 b0 = _mm512_set1_ps(q0[e]), b1 = _mm512_set1_ps(q1[e]), b2 = _mm512_set1_ps(q2[e]);
    const __m512 b3 = _mm512_set1_ps(q3[e]), b4 = _mm512_set1_ps(q4[e]), b5 = _mm512_set1_ps(q5[e]);
    for (int u = 0; u < NV; u++) {
      a[0][u] = _mm512_fmadd_ps(b0, kv[u], a[0][u]);
      a[1][u] = _mm512_fmadd_ps(b1, kv[u], a[1][u]);
      a[2][u] = _mm512_fmadd_ps(b2, kv[u], a[2][u]);
      a[3][u] = _mm512_fmadd_ps(b3, kv[u], a[3][u]);
      a[4][u] = _mm512_fmadd_ps(b4, kv[u], a[4][u]);
      a[5][u] = _mm512_fmadd_ps(b5, kv[u], a[5][u]);
    }
  }
  for (int t = 0; t < nr; t++)
    for (int u = 0; u < NV; u++) _mm512_storeu_ps(out + t * ldo + 16 * u, a[t][u]);
}

// y_t[c0 + 16u + l] = Σ_j p_t[j] · v_j[c0 + 16u + l] · inv_t over the listed value rows.
template <int NC>
void att_values6(const float* ps, i64 ldp, int nr, const std::pair<i64, const float*>* vrows, size_t nv, i64 c0, float* const* yrow, const float* inv) {
  __m512 a[6][NC];
  for (int t = 0; t < 6; t++)
    for (int u = 0; u < NC; u++) a[t][u] = _mm512_setzero_ps();
  const float* p0 = ps;
  const float* p1 = ps + std::min(1, nr - 1) * ldp;
  const float* p2 = ps + std::min(2, nr - 1) * ldp;
  const float* p3 = ps + std::min(3, nr - 1) * ldp;
  const float* p4 = ps + std::min(4, nr - 1) * ldp;
  const float* p5 = ps + std::min(5, nr - 1) * ldp;
  for (size_t x = 0; x < nv; x++) {
    const i64 j = vrows[x].first;
    const float* vr = vrows[x].second + c0;
    __m512 vv[NC];
    for (int u = 0; u < NC; u++) vv[u] = _mm512_loadu_ps(vr + 16 * u);
    const __m512 b0 = _mm512_set1_ps(p0[j]), b1 = _mm512_set1_ps(p1[j]), b2 = _mm512_set1_ps(p2[j]);
    const __m512 b3 = _mm512_set1_ps(p3[j]), b4 = _mm512_set1_ps(p4[j]), b5 = _mm512_set1_ps(p5[j]);
    for (int u = 0; u < NC; u++) {
      a[0][u] = _mm512_fmadd_ps(b0, vv[u], a[0][u]);
      a[1][u] = _mm512_fmadd_ps(b1, vv[u], a[1][u]);
      a[2][u] = _mm512_fmadd_ps(b2, vv[u], a[2][u]);
      a[3][u] = _mm512_fmadd_ps(b3, vv[u], a[3][u]);
      a[4][u] = _mm512_fmadd_ps(b4, vv[u], a[4][u]);
      a[5][u] = _mm512_fmadd_ps(b5, vv[u], a[5][u]);
    }
  }
  for (int t = 0; t < nr; t++) {
    const __m512 s = _mm512_set1_ps(inv[t]);
    for (int u = 0; u < NC; u++) _mm512_storeu_ps(yrow[t] + c0 + 16 * u, _mm512_mul_ps(a[t][u], s));
  }
}
#endif

// Attention over q [nb…, hq, tq, d] and keys/values in segments (see Seg), with an optional mask
// broadcast to [nb…, hq, tq, tk] (f32 additive or bool), causal aligned to the end; GQA by
// kv head = h / (hq / hkv).
void attention_core(Run& p, const Instr& in, int qv, const Seg* ks, int nk, const Seg* vs, int mask_v, int yv) {
  const auto& qs = p.shapes[qv];
  const size_t r = qs.size();
  const i64 hq = qs[r - 3], tq = qs[r - 2], d = qs[r - 1];
  const i64 hkv = ks[0].h;
  i64 tk = 0;
  for (int g = 0; g < nk; g++) tk += ks[g].s;
  const i64 dv = vs[0].d;
  i64 nb = 1;
  for (size_t i = 0; i + 3 < r; i++) nb *= qs[i];
  const bool causal = in.i[0] != 0;
  const float scale = in.i[1] != 0 ? static_cast<float>(in.f[0]) : 1.0f / std::sqrt(static_cast<float>(d));
  const float* q = F(p, qv);
  float* y = F(p, yv);
  const bool has_mask = mask_v >= 0;
  const void* mask = has_mask ? p.ptr[mask_v] : nullptr;
  const bool mask_bool = has_mask && p.vals[mask_v].dtype != DT_F32;
  std::vector<i64> mst;
  std::vector<i64> mbatch(static_cast<size_t>(nb), 0);
  if (has_mask) {
    std::vector<i64> sc(qs.begin(), qs.end() - 1);
    sc.push_back(tk);
    mst = bstrides(p.shapes[mask_v], sc);
    for (i64 b = 0; b < nb; b++) {
      i64 rem = b, off = 0;
      for (size_t ax = r - 3; ax-- > 0;) {
        off += (rem % sc[ax]) * mst[ax];
        rem /= sc[ax];
      }
      mbatch[b] = off;
    }
  }
  if (hkv <= 0 || hq % hkv != 0) fail("RT_BAD_VALUE", "attention: query heads are not a multiple of kv heads");
  const i64 group = hq / hkv;
  // One item per (batch, kv head, block of qb queries): the group's query heads share each key and
  // value row read (GQA), and rows a few keys ahead are prefetched (the cache rows are scattered).
  // With many queries (prefill), each (batch, kv head)'s keys are transposed once into kt
  // [d][keys] (one parallel pass before the blocks, shared by all of them), so scores are 16 keys
  // per FMA with no horizontal sums — the decode path's per-key dot products made attention a
  // sixth of a Qwen3 (head_dim 128) prefill (bench/native-profile).
#ifdef SML_AVX512
  const i64 qb = tq >= 8 ? 16 : 1;
#else
  const i64 qb = 1;
#endif
  const i64 blocks = (tq + qb - 1) / qb;
  const i64 items = nb * hkv * blocks;
  const i64 ldt = (tk + 15) / 16 * 16;  // kt's row stride
  std::vector<float> ktall;
  // Long contexts (over 8192 keys, or a copy over 64 MB) transpose each block's keys on their own
  // instead, with no second copy of K.
  if (qb > 1 && tk <= 8192 && nb * hkv * d * ldt * 4 <= (i64{64} << 20)) {
    ktall.assign(static_cast<size_t>(nb * hkv * d * ldt), 0.0f);
    const i64 chunks = (tk + 15) / 16;
    pool().parallel(nb * hkv * chunks, [&](i64 c0, i64 c1) {
      for (i64 c = c0; c < c1; c++) {
        const i64 bh = c / chunks, j0 = (c % chunks) * 16;
        const i64 nj = std::min<i64>(16, tk - j0);
        const float* kr[16];
        for (i64 t = 0; t < nj; t++) {
          i64 j = j0 + t;
          int sg = 0;
          while (j >= ks[sg].s) j -= ks[sg++].s;
          kr[t] = ks[sg].row(bh / hkv, bh % hkv, j);
        }
        // 16 keys' element e are adjacent in kt: one line written per e.
        float* dst = ktall.data() + bh * d * ldt + j0;
        for (i64 e = 0; e < d; e++, dst += ldt)
          for (i64 t = 0; t < nj; t++) dst[t] = kr[t][e];
      }
    }, nb * hkv * tk * d < kParallelMin);
  }
  pool().parallel(items, [&](i64 b0, i64 b1) {
    std::vector<float> sc(static_cast<size_t>(tk * group));
    std::vector<float> acc(static_cast<size_t>(dv * group));
    std::vector<float> mx(static_cast<size_t>(group)), tot(static_cast<size_t>(group));
    std::vector<uint8_t> act(has_mask ? static_cast<size_t>(tk) : 0);
    std::vector<std::pair<i64, const float*>> vrows;
    std::vector<float> ps;        // block path: [rows][ldk] scores, then probabilities
    std::vector<float> rowinv;    // block path: 1 / Σ per row (NaN: a row with no key)
    std::vector<uint8_t> anykey;  // block path: whether any row of the block weighs key j
    std::vector<float> ktl;       // a block's own transposed keys (when K is too long to share)
    for (i64 it = b0; it < b1; it++) {
      const i64 blk = it % blocks;
      const i64 kh = (it / blocks) % hkv;
      const i64 b = it / (blocks * hkv);
      const i64 i_end = std::min(tq, (blk + 1) * qb);
      // The keys the block reads (its last query's), rounded up to 16, and their transposed copy
      // (kt[e * ldt + j] = k_j[e], zero past tk).
      const i64 jblock = causal ? std::min(tk, i_end - 1 + tk - tq + 1) : tk;
      const i64 ldk = (std::max<i64>(jblock, 0) + 15) / 16 * 16;
      const float* kt = nullptr;
      i64 ldt_it = ldt;
      if (qb > 1 && !ktall.empty()) kt = ktall.data() + (b * hkv + kh) * d * ldt;
      else if (qb > 1) {
        ktl.assign(static_cast<size_t>(d * ldk), 0.0f);
        float* ktp = ktl.data();
        each_row(ks, nk, jblock, b, kh, nullptr, [ktp, ldk, d](i64 j, const float* kr) {
          for (i64 e = 0; e < d; e++) ktp[e * ldk + j] = kr[e];
        });
        kt = ktp;
        ldt_it = ldk;
      }
#ifdef SML_AVX512
      // (Up to 16 MB of scores a block; longer contexts take the query-at-a-time path below.)
      if (qb > 1 && dv % 16 == 0 && dv <= 256 && qb * group * ldk * 4 <= (i64{16} << 20)) {
        // The block's queries × the group's heads as one set of rows: each K and V vector loaded
        // serves 6 rows in registers (a query at a time read the block's transposed keys and its
        // values once per row: ~64 KB from L2 for ~32 K multiply-adds at head_dim 128).
        const i64 i0 = blk * qb, nq = i_end - i0, rows = nq * group;
        ps.assign(static_cast<size_t>(rows * ldk), 0.0f);
        rowinv.assign(static_cast<size_t>(rows), 0.0f);
        const float* qrow[6];
        // Raw scores of every row for the keys [0, jblock): 6 rows × 64 keys of accumulators.
        for (i64 r0 = 0; r0 < rows; r0 += 6) {
          const int nr = static_cast<int>(std::min<i64>(6, rows - r0));
          for (int t = 0; t < nr; t++) {
            const i64 row = r0 + t, i = i0 + row / group, g = row % group;
            qrow[t] = q + ((b * hq + kh * group + g) * tq + i) * d;
          }
          for (i64 j0 = 0; j0 < ldk; j0 += 64) {
            float* out = ps.data() + r0 * ldk + j0;
            switch (std::min<i64>(4, (ldk - j0) / 16)) {
              case 4: att_scores6<4>(qrow, nr, kt + j0, ldt_it, d, out, ldk); break;
              case 3: att_scores6<3>(qrow, nr, kt + j0, ldt_it, d, out, ldk); break;
              case 2: att_scores6<2>(qrow, nr, kt + j0, ldt_it, d, out, ldk); break;
              default: att_scores6<1>(qrow, nr, kt + j0, ldt_it, d, out, ldk); break;
            }
          }
        }
        // Per row: scale, mask, max, e^(s − max) over its own keys; zero past them.
        for (i64 row = 0; row < rows; row++) {
          const i64 i = i0 + row / group, g = row % group;
          const i64 jmax = causal ? std::min(tk, i + tk - tq + 1) : tk;
          float* srow = ps.data() + row * ldk;
          float m = -INFINITY;
          const float* mf = has_mask && !mask_bool ? static_cast<const float*>(mask) + mbatch[b] + i * mst[r - 2] + (kh * group + g) * mst[r - 3] : nullptr;
          if (!has_mask || (mf != nullptr && mst[r - 1] == 1)) {
            // s·scale (+ the contiguous additive mask), with the running max, 16 keys at a time.
            const __m512 sv = _mm512_set1_ps(scale);
            __m512 mv = _mm512_set1_ps(-INFINITY);
            for (i64 jx = 0; jx < jmax; jx += 16) {
              const __mmask16 mk = tail_mask(jmax - jx);
              __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, srow + jx), sv);
              if (mf != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, mf + jx));
              _mm512_mask_storeu_ps(srow + jx, mk, v);
              mv = _mm512_mask_max_ps(mv, mk, mv, v);
            }
            m = _mm512_reduce_max_ps(mv);
          } else {
            const i64 mo = mbatch[b] + i * mst[r - 2] + (kh * group + g) * mst[r - 3], ms = mst[r - 1];
            if (mask_bool) {
              const uint8_t* mb = static_cast<const uint8_t*>(mask) + mo;
              for (i64 jx = 0; jx < jmax; jx++) {
                const float v = mb[jx * ms] == 0 ? -INFINITY : srow[jx] * scale;
                srow[jx] = v;
                m = std::max(m, v);
              }
            } else {
              const float* mf = static_cast<const float*>(mask) + mo;
              for (i64 jx = 0; jx < jmax; jx++) {
                const float v = srow[jx] * scale + mf[jx * ms];
                srow[jx] = v;
                m = std::max(m, v);
              }
            }
          }
          const i64 live_end = std::max<i64>(jmax, 0);
          std::fill(srow + live_end, srow + ldk, 0.0f);
          if (jmax <= 0 || m == -INFINITY) {
            std::fill(srow, srow + live_end, 0.0f);
            rowinv[static_cast<size_t>(row)] = NAN;
            continue;
          }
          const __m512 mv = _mm512_set1_ps(m);
          __m512 tv = _mm512_setzero_ps();
          for (i64 j = 0; j < jmax; j += 16) {
            const __mmask16 mk = tail_mask(jmax - j);
            const __m512 ev = _mm512_maskz_mov_ps(mk, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, srow + j), mv)));
            _mm512_mask_storeu_ps(srow + j, mk, ev);
            tv = _mm512_add_ps(tv, ev);
          }
          rowinv[static_cast<size_t>(row)] = 1.0f / _mm512_reduce_add_ps(tv);
        }
        // Keys no row weighs (masked for all, past every row's causal end) are not read from V.
        anykey.assign(static_cast<size_t>(jblock > 0 ? jblock : 0), 0);
        for (i64 row = 0; row < rows; row++) {
          const float* srow = ps.data() + row * ldk;
          for (i64 j = 0; j < jblock; j++) anykey[static_cast<size_t>(j)] |= srow[j] != 0.0f ? 1 : 0;
        }
        vrows.clear();
        each_row(vs, nk, jblock, b, kh, anykey.data(), [&](i64 j, const float* vr) { vrows.emplace_back(j, vr); });
        // y rows = P · V: 6 rows × 64 columns of accumulators, each V vector loaded once for them.
        for (i64 r0 = 0; r0 < rows; r0 += 6) {
          const int nr = static_cast<int>(std::min<i64>(6, rows - r0));
          float* yrow[6];
          for (int t = 0; t < nr; t++) {
            const i64 row = r0 + t, i = i0 + row / group, g = row % group;
            yrow[t] = y + ((b * hq + kh * group + g) * tq + i) * dv;
          }
          const float* pr = ps.data() + r0 * ldk;
          const float* inv = rowinv.data() + r0;
          for (i64 c0 = 0; c0 < dv; c0 += 64) {
            switch (std::min<i64>(4, (dv - c0) / 16)) {
              case 4: att_values6<4>(pr, ldk, nr, vrows.data(), vrows.size(), c0, yrow, inv); break;
              case 3: att_values6<3>(pr, ldk, nr, vrows.data(), vrows.size(), c0, yrow, inv); break;
              case 2: att_values6<2>(pr, ldk, nr, vrows.data(), vrows.size(), c0, yrow, inv); break;
              default: att_values6<1>(pr, ldk, nr, vrows.data(), vrows.size(), c0, yrow, inv); break;
            }
          }
        }
        continue;
      }
#endif
      for (i64 i = blk * qb; i < i_end; i++) {
        const i64 jmax = causal ? std::min(tk, i + tk - tq + 1) : tk;
        const float* qi[16];
        const i64 gn = std::min<i64>(group, 16);
        for (i64 g0 = 0; g0 < group; g0 += gn) {
          const i64 gc = std::min(gn, group - g0);
          for (i64 g = 0; g < gc; g++) {
            qi[g] = q + ((b * hq + kh * group + g0 + g) * tq + i) * d;
            mx[g] = -INFINITY;
          }
          // The additive mask at key jx for query head g0 + g (−∞ for a false boolean mask).
          const auto mask_at = [&](i64 g, i64 jx) -> float {
            const i64 mo = mbatch[b] + i * mst[r - 2] + (kh * group + g0 + g) * mst[r - 3] + jx * mst[r - 1];
            if (mask_bool) return static_cast<const uint8_t*>(mask)[mo] == 0 ? -INFINITY : 0.0f;
            return static_cast<const float*>(mask)[mo];
          };
          // Keys masked (at or below −FLT_MAX, what padding gets) for every head of the group have
          // weight exactly 0 as soon as one key is not (e^(score − max) underflows), so they are
          // not read at all: a batch of rows with caches of different lengths reads only each row's
          // own positions. A query whose every key is masked keeps the full computation.
          const uint8_t* live = nullptr;
          if (has_mask) {
            i64 n = 0;
            for (i64 jx = 0; jx < jmax; jx++) {
              uint8_t a = 0;
              for (i64 g = 0; g < gc && a == 0; g++) a = mask_at(g, jx) > -FLT_MAX ? 1 : 0;
              act[static_cast<size_t>(jx)] = a;
              n += a;
            }
            if (n > 0 && n < jmax) live = act.data();
          }
          {
            // Raw q·k for four keys at a time (one batched horizontal reduction), then scale, mask
            // and the running max.
            const float* kp[4];
            i64 kj[4];
            int nq = 0;
            auto flush = [&]() {
              for (i64 g = 0; g < gc; g++) {
                float out[4];
                if (nq == 4) dot4_f32(qi[g], kp[0], kp[1], kp[2], kp[3], d, out);
                else
                  for (int t = 0; t < nq; t++) out[t] = dot_f32(qi[g], kp[t], d);
                for (int t = 0; t < nq; t++) sc[g * tk + kj[t]] = out[t];
              }
              nq = 0;
            };
            if (qb > 1) {
  #ifdef SML_AVX512
              // Masked-out keys get a score here too; it is replaced by −∞ below.
              // 64 keys at a time: four independent FMA chains sharing each broadcast q element.
              for (i64 g = 0; g < gc; g++)
                for (i64 j0 = 0; j0 < jmax; j0 += 64) {
                  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                  const float* kc = kt + j0;
                  const i64 nj = std::min<i64>(64, jmax - j0);
                  for (i64 e = 0; e < d; e++, kc += ldt_it) {
                    const __m512 qe = _mm512_set1_ps(qi[g][e]);
                    a0 = _mm512_fmadd_ps(qe, _mm512_loadu_ps(kc), a0);
                    if (nj > 16) a1 = _mm512_fmadd_ps(qe, _mm512_loadu_ps(kc + 16), a1);
                    if (nj > 32) a2 = _mm512_fmadd_ps(qe, _mm512_loadu_ps(kc + 32), a2);
                    if (nj > 48) a3 = _mm512_fmadd_ps(qe, _mm512_loadu_ps(kc + 48), a3);
                  }
                  float* so = sc.data() + g * tk + j0;
                  _mm512_mask_storeu_ps(so, tail_mask(nj), a0);
                  if (nj > 16) _mm512_mask_storeu_ps(so + 16, tail_mask(nj - 16), a1);
                  if (nj > 32) _mm512_mask_storeu_ps(so + 32, tail_mask(nj - 32), a2);
                  if (nj > 48) _mm512_mask_storeu_ps(so + 48, tail_mask(nj - 48), a3);
                }
  #endif
            } else {
              each_row(ks, nk, jmax, b, kh, live, [&](i64 j, const float* kr) {
                kp[nq] = kr;
                kj[nq++] = j;
                if (nq == 4) flush();
              });
              if (nq > 0) flush();
            }
            for (i64 g = 0; g < gc; g++) {
              float* srow = sc.data() + g * tk;
              float m = -INFINITY;
              if (has_mask) {
                for (i64 jx = 0; jx < jmax; jx++) {
                  if (live != nullptr && live[jx] == 0) {
                    srow[jx] = -INFINITY;
                    continue;
                  }
                  const float v = srow[jx] * scale + mask_at(g, jx);
                  srow[jx] = v;
                  m = std::max(m, v);
                }
              } else {
                for (i64 jx = 0; jx < jmax; jx++) {
                  const float v = srow[jx] * scale;
                  srow[jx] = v;
                  m = std::max(m, v);
                }
              }
              mx[g] = m;
            }
          }
          for (i64 g = 0; g < gc; g++) {
            float* srow = sc.data() + g * tk;
            tot[g] = 0;
            if (jmax <= 0 || mx[g] == -INFINITY) continue;
  #ifdef SML_AVX512
            const __m512 mv = _mm512_set1_ps(mx[g]);
            __m512 tv = _mm512_setzero_ps();
            for (i64 j = 0; j < jmax; j += 16) {
              const __mmask16 mk = tail_mask(jmax - j);
              const __m512 e = _mm512_maskz_mov_ps(mk, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, srow + j), mv)));
              _mm512_mask_storeu_ps(srow + j, mk, e);
              tv = _mm512_add_ps(tv, e);
            }
            tot[g] = _mm512_reduce_add_ps(tv);
  #else
            for (i64 j = 0; j < jmax; j++) {
              srow[j] = std::exp(srow[j] - mx[g]);
              tot[g] += srow[j];
            }
  #endif
          }
          std::fill(acc.begin(), acc.begin() + gc * dv, 0.0f);
#ifdef SML_AVX512
          if (qb > 1 && dv % 16 == 0 && dv <= 256) {
            // Rows of V into register accumulators (up to 16 × 16 floats a head), not through memory.
            vrows.clear();
            each_row(vs, nk, jmax, b, kh, live, [&](i64 j, const float* vr) { vrows.emplace_back(j, vr); });
            for (i64 g = 0; g < gc; g++) {
              const float* srow = sc.data() + g * tk;
              for (i64 c0 = 0; c0 < dv; c0 += 64) {
                const int nc = static_cast<int>(std::min<i64>(4, (dv - c0) / 16));
                __m512 v0 = _mm512_setzero_ps(), v1 = v0, v2 = v0, v3 = v0;
                for (const auto& [j, vr] : vrows) {
                  const float e = srow[j];
                  if (e == 0.0f) continue;
                  const __m512 ev = _mm512_set1_ps(e);
                  const float* vc = vr + c0;
                  v0 = _mm512_fmadd_ps(ev, _mm512_loadu_ps(vc), v0);
                  if (nc > 1) v1 = _mm512_fmadd_ps(ev, _mm512_loadu_ps(vc + 16), v1);
                  if (nc > 2) v2 = _mm512_fmadd_ps(ev, _mm512_loadu_ps(vc + 32), v2);
                  if (nc > 3) v3 = _mm512_fmadd_ps(ev, _mm512_loadu_ps(vc + 48), v3);
                }
                float* ac = acc.data() + g * dv + c0;
                _mm512_storeu_ps(ac, v0);
                if (nc > 1) _mm512_storeu_ps(ac + 16, v1);
                if (nc > 2) _mm512_storeu_ps(ac + 32, v2);
                if (nc > 3) _mm512_storeu_ps(ac + 48, v3);
              }
            }
          } else
#endif
            each_row(vs, nk, jmax, b, kh, live, [&](i64 j, const float* vr) {
              for (i64 g = 0; g < gc; g++) {
                const float e = sc[g * tk + j];
                if (e != 0.0f) axpy_f32(acc.data() + g * dv, vr, e, dv);
              }
            });
          for (i64 g = 0; g < gc; g++) {
            float* yo = y + ((b * hq + kh * group + g0 + g) * tq + i) * dv;
            if (jmax <= 0 || mx[g] == -INFINITY) {
              for (i64 e = 0; e < dv; e++) yo[e] = NAN;
              continue;
            }
            const float inv = 1.0f / tot[g];
            for (i64 e = 0; e < dv; e++) yo[e] = acc[g * dv + e] * inv;
          }
        }
      }
    }
  }, nb * hkv * tq * group * tk * d < kParallelMin, causal && tq > 1 ? (qb > 1 ? 4 : 16) : 2);
}

void attention(Run& p, const Instr& in) {
  const Seg k = seg_of(p, in.a[1], 0), v = seg_of(p, in.a[2], 0);
  attention_core(p, in, in.a[0], &k, 1, &v, in.a.size() > 3 ? in.a[3] : -1, in.r[0]);
}

// a = [q, k₀, k₁, v₀, v₁, mask?], i = [causal, has scale, layout k₀, k₁, v₀, v₁]
void attention_kv(Run& p, const Instr& in) {
  const Seg k[2] = {seg_of(p, in.a[1], static_cast<int>(in.i[2])), seg_of(p, in.a[2], static_cast<int>(in.i[3]))};
  const Seg v[2] = {seg_of(p, in.a[3], static_cast<int>(in.i[4])), seg_of(p, in.a[4], static_cast<int>(in.i[5]))};
  if (k[0].s != v[0].s || k[1].s != v[1].s || k[0].h != k[1].h || v[0].h != v[1].h || k[0].h != v[0].h) fail("RT_BAD_VALUE", "attention: key and value segments disagree");
  attention_core(p, in, in.a[0], k, 2, v, in.a.size() > 5 ? in.a[5] : -1, in.r[0]);
}

void rotary(Run& p, const Instr& in) {
  const auto& xs = p.shapes[in.a[0]];
  const i64 dd = xs.back(), half = dd / 2;
  const bool inter = in.i[0] != 0;
  const std::vector<i64> st[3] = {bstrides(xs, xs), bstrides(p.shapes[in.a[1]], xs), bstrides(p.shapes[in.a[2]], xs)};
  const float* x = F(p, in.a[0]);
  const float* c = F(p, in.a[1]);
  const float* s = F(p, in.a[2]);
  float* y = F(p, in.r[0]);
  const i64 cs = st[1].back(), ss = st[2].back();
  for_rows<3>(xs, st, [&](const i64* o) {
    const float* xr = x + o[0];
    const float* cr = c + o[1];
    const float* sr = s + o[2];
    float* yr = y + o[0];
    for (i64 j = 0; j < dd; j++) {
      float partner;
      if (inter) partner = (j % 2 == 0) ? -xr[j + 1] : xr[j - 1];
      else partner = j < half ? -xr[j + half] : xr[j - half];
      yr[j] = xr[j] * cr[j * cs] + partner * sr[j * ss];
    }
  });
}

// Σ x² of one row in double: 16 inputs a step in two chains of 8 lanes, the lanes added at the
// end. Every row sums in this one order wherever it sits in the batch (a row's norm does not
// depend on its neighbours); the one-row-per-lane gathers it replaced took 5 % of a Qwen3 prefill
// (per-head q/k norms: 2048 rows of 128 a layer).
inline double sum_squares_row(const float* x, i64 n) {
#ifdef SML_AVX512
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  i64 i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  if (i < n) {
    const i64 left = n - i;
    const __mmask8 m0 = static_cast<__mmask8>(left >= 8 ? 0xFF : (1u << left) - 1);
    const __mmask8 m1 = static_cast<__mmask8>(left <= 8 ? 0 : (1u << (left - 8)) - 1);
    const __m512d lo = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m0, x + i)), hi = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m1, x + i + 8));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
#else
  double ss = 0;
  for (i64 i = 0; i < n; i++) ss += static_cast<double>(x[i]) * x[i];
  return ss;
#endif
}

void norm_rows(const float* x, const float* w, const float* bias, float* y, i64 rows, i64 n, float eps, bool centered) {
  pool().parallel(rows, [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; r++) {
      const float* xs = x + r * n;
      float* ys = y + r * n;
      double mu = 0;
      double ss = 0;
      if (centered) {
        for (i64 i = 0; i < n; i++) mu += xs[i];
        mu /= static_cast<double>(n);
        for (i64 i = 0; i < n; i++) {
          const double c = xs[i] - mu;
          ss += c * c;
        }
      } else {
        ss = sum_squares_row(xs, n);
      }
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
      const float muf = static_cast<float>(mu);
      for (i64 i = 0; i < n; i++) {
        float v = (xs[i] - muf) * inv;
        if (w != nullptr) v *= w[i];
        if (bias != nullptr) v += bias[i];
        ys[i] = v;
      }
    }
  }, rows * n < kParallelMin);
}

inline i64 index_at(const Run& p, int v, i64 j) {
  const int dt = p.vals[v].dtype;
  if (dt == DT_I64) return static_cast<i64>(static_cast<const double*>(p.ptr[v])[j]);
  if (dt == DT_I32) return static_cast<const int32_t*>(p.ptr[v])[j];
  return static_cast<const uint8_t*>(p.ptr[v])[j];
}

inline i64 checked_index(i64 v, i64 size, const char* what) {
  if (v < 0 || v >= size) fail("RT_BAD_VALUE", std::string(what) + ": index " + std::to_string(v) + " is out of range [0, " + std::to_string(size) + ")");
  return v;
}

// matmul with broadcast batch dims; operand 1 optionally indirected: a[2] = index value, b the
// table, whose row idx[batch] is batch entry `batch`'s matrix.
void matmul(Run& p, const Instr& in) {
  const auto& as = p.shapes[in.a[0]];
  const auto& ys = p.shapes[in.r[0]];
  const bool ta = in.i[0] != 0, tb = in.i[1] != 0;
  const bool indexed = in.a.size() > 2;
  std::vector<i64> bs = p.shapes[in.a[1]];
  if (indexed) {
    // table [S, K, N] → the gathered operand [B, K, N] over the index's one axis
    const i64 nidx = numel(p.shapes[in.a[2]]);
    bs[0] = nidx;
  }
  const size_t ra = as.size(), rb = bs.size(), ry = ys.size();
  const i64 m = ta ? as[ra - 1] : as[ra - 2];
  const i64 k = ta ? as[ra - 2] : as[ra - 1];
  const i64 n = tb ? bs[rb - 2] : bs[rb - 1];
  std::vector<i64> batch(ys.begin(), ys.end() - 2);
  std::vector<i64> ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const std::vector<i64> sa = bstrides(ab, batch), sb = bstrides(bb, batch);
  const i64 nbatch = numel(batch);
  std::vector<i64> aoff(static_cast<size_t>(nbatch)), boff(static_cast<size_t>(nbatch));
  {
    std::vector<i64> idx(batch.size(), 0);
    for (i64 t = 0; t < nbatch; t++) {
      i64 oa = 0, ob = 0;
      for (size_t d = 0; d < batch.size(); d++) {
        oa += idx[d] * sa[d];
        ob += idx[d] * sb[d];
      }
      aoff[t] = oa * m * k;
      if (indexed) {
        if (bb.size() != 1) fail("RT_BAD_VALUE", "indexed matmul needs one batch axis");
        boff[t] = checked_index(index_at(p, in.a[2], ob), p.shapes[in.a[1]][0], "matmul (gathered operand)") * k * n;
      } else boff[t] = ob * k * n;
      for (size_t d = batch.size(); d-- > 0;) {
        if (++idx[d] < batch[d]) break;
        idx[d] = 0;
      }
    }
  }
  (void)ry;
  const float* A = F(p, in.a[0]);
  const float* B = F(p, in.a[1]);
  float* Y = F(p, in.r[0]);
  std::vector<float> at;
  if (ta) {
    // materialize op(a) per batch matrix: [m, k] from [k, m]
    const i64 na = numel(as) / (m * k);
    at.resize(static_cast<size_t>(numel(as)));
    for (i64 t = 0; t < na; t++)
      for (i64 i = 0; i < m; i++)
        for (i64 j = 0; j < k; j++) at[t * m * k + i * k + j] = A[t * m * k + j * m + i];
    A = at.data();
  }
  // Work items: (batch, column chunk of n). Without transposeB each item streams its rows of b
  // whole (one sequential read), unless there are too few batch entries to keep the pool busy.
  const i64 threads = pool().size();
  // (With transposeB and 17–64 rows, chunks of at least 48 columns: the few-row GEMM packs x per chunk.)
  const i64 chunk = tb ? (few_rows(m) ? std::max<i64>(48, (n + 2 * threads - 1) / (2 * threads)) : 16) : (nbatch >= 2 * threads ? std::max<i64>(n, 1) : std::max<i64>(64, (n + 2 * threads - 1) / (2 * threads)));
  const i64 nchunks = (n + chunk - 1) / chunk;
  pool().parallel(nbatch * nchunks, [&](i64 w0, i64 w1) {
    for (i64 w = w0; w < w1; w++) {
      const i64 t = w / nchunks, c = w % nchunks;
      const i64 n0 = c * chunk, n1 = std::min(n, n0 + chunk);
      const float* a = A + aoff[t];
      const float* b = B + boff[t];
      float* y = Y + t * m * n;
      if (tb) gemm_nt_range(a, k, b, k, y, n, m, k, n0, n1);
      else gemm_nn_range(a, k, b, n, y, n, m, k, n0, n1);
    }
  }, nbatch * m * n * k < kParallelMin);
}

// matmul on integer operands (i64 as double, i32): the reference loop, wrapping like the IR.
template <typename T>
void matmul_int(Run& p, const Instr& in) {
  const auto& as = p.shapes[in.a[0]];
  const auto& bs = p.shapes[in.a[1]];
  const auto& ys = p.shapes[in.r[0]];
  const bool ta = in.i[0] != 0, tb = in.i[1] != 0;
  const size_t ra = as.size(), rb = bs.size();
  const i64 m = ta ? as[ra - 1] : as[ra - 2], k = ta ? as[ra - 2] : as[ra - 1];
  const i64 n = tb ? bs[rb - 2] : bs[rb - 1];
  std::vector<i64> batch(ys.begin(), ys.end() - 2), ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const std::vector<i64> sa = bstrides(ab, batch), sb = bstrides(bb, batch);
  const T* A = static_cast<const T*>(p.ptr[in.a[0]]);
  const T* B = static_cast<const T*>(p.ptr[in.a[1]]);
  T* Y = static_cast<T*>(p.ptr[in.r[0]]);
  std::vector<i64> idx(batch.size(), 0);
  const i64 nb = numel(batch);
  for (i64 t = 0; t < nb; t++) {
    i64 oa = 0, ob = 0;
    for (size_t d = 0; d < batch.size(); d++) {
      oa += idx[d] * sa[d];
      ob += idx[d] * sb[d];
    }
    const T* a = A + oa * m * k;
    const T* b = B + ob * k * n;
    T* y = Y + t * m * n;
    for (i64 i = 0; i < m; i++)
      for (i64 j = 0; j < n; j++) {
        double acc = 0;
        for (i64 q = 0; q < k; q++) acc += static_cast<double>(ta ? a[q * m + i] : a[i * k + q]) * static_cast<double>(tb ? b[j * k + q] : b[q * n + j]);
        y[i * n + j] = sizeof(T) == 4 ? static_cast<T>(static_cast<int32_t>(static_cast<int64_t>(acc))) : static_cast<T>(acc);
      }
    for (size_t d = batch.size(); d-- > 0;) {
      if (++idx[d] < batch[d]) break;
      idx[d] = 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Adapter-bank kernels (the gathered LoRA term): rows grouped by slot, one pass over each
// adapter's factors per group.

// Rows of a batch ordered by slot, cut into parts of one slot each: a slot's rows stay together
// (its factors read once), and a slot with more tokens than an even share of the threads is split
// so one adapter used by every row still runs on every thread.
struct LoraGroups {
  std::vector<i64> order;                     // row indices sorted by slot (stable)
  std::vector<std::pair<i64, i64>> parts;     // [begin, end) into order, one slot each
};

LoraGroups lora_groups(const std::vector<i64>& slot, i64 tokens_per_row, int threads) {
  LoraGroups g;
  const i64 nb = static_cast<i64>(slot.size());
  g.order.resize(slot.size());
  for (i64 b = 0; b < nb; b++) g.order[static_cast<size_t>(b)] = b;
  std::stable_sort(g.order.begin(), g.order.end(), [&](i64 a, i64 b) { return slot[static_cast<size_t>(a)] < slot[static_cast<size_t>(b)]; });
  // At least 4 tokens a part (the shrink's row block), at most an even share of 2 parts a thread.
  const i64 share = std::max<i64>(1, (nb + 2 * threads - 1) / (2 * threads));
  const i64 cap = std::max<i64>(share, (4 + tokens_per_row - 1) / std::max<i64>(tokens_per_row, 1));
  for (i64 i = 0; i < nb;) {
    i64 j = i;
    while (j < nb && slot[static_cast<size_t>(g.order[static_cast<size_t>(j)])] == slot[static_cast<size_t>(g.order[static_cast<size_t>(i)])]) j++;
    for (i64 c = i; c < j; c += cap) g.parts.emplace_back(c, std::min(j, c + cap));
    i = j;
  }
  return g;
}

// The bank's factor rows are f32 (C = float) or int8 codes with an f32 scale per rank row (C =
// int8_t, adapterDtype 'int8': a quarter of the bytes, widened in registers, never in memory).
// A decode step puts one token on each adapter, so the kernels are shaped for few tokens and
// long factor rows: four factor rows are streamed side by side (four memory streams, each
// prefetched one block ahead, so the next block's rows arrive while this one is summed), every
// loaded vector used by all the tokens of the group (up to 4 at once).

#ifdef SML_AVX512
inline __m512 widen16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 widen16(const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))); }
inline __m512 widen16z(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 widen16z(__mmask16 m, const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p))); }
#endif

// t[tok, 0:nr) = x[tok] · F[0:nr)ᵀ for MR tokens (x stride K, t stride R), nr ≤ 4 factor rows of
// length K from f (stride K); `next` (or null): the following block's rows, prefetched meanwhile.
template <int MR, typename C>
void bank_shrink4(const float* x, i64 K, const C* f, int nr, const C* next, int next_rows, float* t, i64 R) {
#ifdef SML_AVX512
  __m512 acc[4][MR];
  for (int r = 0; r < 4; r++)
    for (int m = 0; m < MR; m++) acc[r][m] = _mm512_setzero_ps();
  const C* fr[4];
  for (int r = 0; r < 4; r++) fr[r] = f + (r < nr ? r : 0) * K;
  constexpr i64 kLine = 64 / static_cast<i64>(sizeof(C));
  i64 i = 0;
  for (; i + 16 <= K; i += 16) {
    if (next != nullptr && (i & (kLine - 1)) == 0)
      for (int r = 0; r < next_rows; r++) __builtin_prefetch(reinterpret_cast<const char*>(next + r * K + i));
    __m512 xv[MR];
    for (int m = 0; m < MR; m++) xv[m] = _mm512_loadu_ps(x + m * K + i);
    for (int r = 0; r < 4; r++) {
      const __m512 fv = widen16(fr[r] + i);
      for (int m = 0; m < MR; m++) acc[r][m] = _mm512_fmadd_ps(fv, xv[m], acc[r][m]);
    }
  }
  if (i < K) {
    const __mmask16 msk = tail_mask(K - i);
    if (next != nullptr)
      for (int r = 0; r < next_rows; r++) __builtin_prefetch(reinterpret_cast<const char*>(next + r * K + i));
    __m512 xv[MR];
    for (int m = 0; m < MR; m++) xv[m] = _mm512_maskz_loadu_ps(msk, x + m * K + i);
    for (int r = 0; r < 4; r++) {
      const __m512 fv = widen16z(msk, fr[r] + i);
      for (int m = 0; m < MR; m++) acc[r][m] = _mm512_fmadd_ps(fv, xv[m], acc[r][m]);
    }
  }
  for (int m = 0; m < MR; m++) {
    alignas(16) float s[4];
    _mm_store_ps(s, reduce4_ps(acc[0][m], acc[1][m], acc[2][m], acc[3][m]));
    for (int r = 0; r < nr; r++) t[m * R + r] = s[r];
  }
#else
  (void)next;
  (void)next_rows;
  for (int m = 0; m < MR; m++)
    for (int r = 0; r < nr; r++) {
      float s = 0.0f;
      for (i64 i = 0; i < K; i++) s += x[m * K + i] * static_cast<float>(f[r * K + i]);
      t[m * R + r] = s;
    }
#endif
}

// out[tok][0:N) += Σ_q c[tok][q] · rows[q][0:N) for MR tokens and NR factor rows (each read once
// for all the tokens); `next` (or null): next_rows rows of stride N to prefetch meanwhile.
template <int NR, int MR, typename C>
void bank_expand(const C* const* rows, i64 N, const float (*c)[4], float* const* out, const C* next, int next_rows) {
#ifdef SML_AVX512
  __m512 cv[MR][NR];
  for (int m = 0; m < MR; m++)
    for (int q = 0; q < NR; q++) cv[m][q] = _mm512_set1_ps(c[m][q]);
  constexpr i64 kLine = 64 / static_cast<i64>(sizeof(C));
  for (i64 j = 0; j < N; j += 16) {
    const __mmask16 msk = tail_mask(N - j);
    if (next != nullptr && (j & (kLine - 1)) == 0)
      for (int r = 0; r < next_rows; r++) __builtin_prefetch(reinterpret_cast<const char*>(next + r * N + j));
    __m512 b[NR];
    for (int q = 0; q < NR; q++) b[q] = widen16z(msk, rows[q] + j);
    for (int m = 0; m < MR; m++) {
      __m512 o = _mm512_maskz_loadu_ps(msk, out[m] + j);
      for (int q = 0; q < NR; q++) o = _mm512_fmadd_ps(cv[m][q], b[q], o);
      _mm512_mask_storeu_ps(out[m] + j, msk, o);
    }
  }
#else
  (void)next;
  (void)next_rows;
  for (int m = 0; m < MR; m++)
    for (int q = 0; q < NR; q++)
      for (i64 j = 0; j < N; j++) out[m][j] += c[m][q] * static_cast<float>(rows[q][j]);
#endif
}

template <int NR, typename C>
void bank_expand_tokens(const C* const* rows, i64 N, const float (*c)[4], float* const* out, i64 m, const C* next, int next_rows) {
  for (i64 i = 0; i < m; i += 4) {
    const C* pf = i == 0 ? next : nullptr;
    switch (std::min<i64>(4, m - i)) {
      case 4: bank_expand<NR, 4, C>(rows, N, c + i, out + i, pf, next_rows); break;
      case 3: bank_expand<NR, 3, C>(rows, N, c + i, out + i, pf, next_rows); break;
      case 2: bank_expand<NR, 2, C>(rows, N, c + i, out + i, pf, next_rows); break;
      default: bank_expand<NR, 1, C>(rows, N, c + i, out + i, pf, next_rows); break;
    }
  }
}

// One group of m tokens on one slot: t = x·Âᵀ (Â[r] = A[r] · as[r], as null for f32 factors),
// then out(tok) = Σ_r t[tok, r] · B̂[r] (B̂[r] = B[r] · bs[r]). With `zero_tail` (the op's promise:
// the rows after A's first all-zero row are zero) the shrink stops at the first row whose shrink
// is zero for every token and whose A row is zero — a rank-r adapter costs r rows (+ at most 3
// read ahead in its block), not the slot's R. The expand skips rank rows whose coefficients are
// zero for every token (the padding of a rank-r adapter, when zero_tail is off), so B's padding is
// not read. `t` holds m·R floats; `outs` the m tokens' output rows, which start as `inits` (the
// base projection's rows: the bank's term is added to them in place) or zeros when it is null.
template <typename C>
void bank_group(const float* x, i64 m, i64 K, const C* A, const float* as, i64 R, const C* B, const float* bs, i64 N, bool zero_tail, float* t, std::vector<float>& cbuf, float* const* outs, const float* const* inits) {
  i64 rows = R;
  for (i64 r0 = 0; r0 < R && rows == R; r0 += 4) {
    const int nr = static_cast<int>(std::min<i64>(4, R - r0));
    const C* next = r0 + 4 < R ? A + (r0 + 4) * K : nullptr;
    const int next_rows = static_cast<int>(std::min<i64>(4, R - r0 - 4));
    for (i64 i = 0; i < m; i += 4) {
      const C* pf = i == 0 ? next : nullptr;
      const float* xi = x + i * K;
      const C* f = A + r0 * K;
      float* ti = t + i * R + r0;
      switch (std::min<i64>(4, m - i)) {
        case 4: bank_shrink4<4, C>(xi, K, f, nr, pf, next_rows, ti, R); break;
        case 3: bank_shrink4<3, C>(xi, K, f, nr, pf, next_rows, ti, R); break;
        case 2: bank_shrink4<2, C>(xi, K, f, nr, pf, next_rows, ti, R); break;
        default: bank_shrink4<1, C>(xi, K, f, nr, pf, next_rows, ti, R); break;
      }
    }
    if (as != nullptr)
      for (i64 i = 0; i < m; i++)
        for (i64 r = r0; r < r0 + nr; r++) t[i * R + r] *= as[r];
    if (zero_tail) {
      for (i64 r = r0; r < r0 + nr; r++) {
        bool zero = true;
        for (i64 i = 0; i < m && zero; i++) zero = t[i * R + r] == 0.0f;
        for (i64 q = 0; q < K && zero; q++) zero = A[r * K + q] == 0;
        if (zero) {
          rows = r;
          break;
        }
      }
    }
  }
  for (i64 i = 0; i < m; i++) {
    if (inits != nullptr) std::memcpy(outs[i], inits[i], sizeof(float) * static_cast<size_t>(N));
    else std::memset(outs[i], 0, sizeof(float) * static_cast<size_t>(N));
  }
  cbuf.resize(static_cast<size_t>(m * 4));
  auto* c = reinterpret_cast<float (*)[4]>(cbuf.data());
  for (i64 r0 = 0; r0 < rows; r0 += 4) {
    // The block's rows with a nonzero coefficient for some token, their coefficients scaled.
    const C* live[4];
    int nl = 0;
    for (i64 r = r0; r < std::min(rows, r0 + 4); r++) {
      bool any = false;
      for (i64 i = 0; i < m && !any; i++) any = t[i * R + r] != 0.0f;
      if (!any) continue;
      for (i64 i = 0; i < m; i++) c[i][nl] = t[i * R + r] * (bs != nullptr ? bs[r] : 1.0f);
      live[nl++] = B + r * N;
    }
    const C* next = r0 + 4 < rows ? B + (r0 + 4) * N : nullptr;
    const int next_rows = static_cast<int>(std::min<i64>(4, rows - r0 - 4));
    switch (nl) {
      case 4: bank_expand_tokens<4, C>(live, N, c, outs, m, next, next_rows); break;
      case 3: bank_expand_tokens<3, C>(live, N, c, outs, m, next, next_rows); break;
      case 2: bank_expand_tokens<2, C>(live, N, c, outs, m, next, next_rows); break;
      case 1: bank_expand_tokens<1, C>(live, N, c, outs, m, next, next_rows); break;
      default: break;
    }
  }
}

// y[b, t] = base[b, t] + (x[b, t] · Â[idx[b]]ᵀ) · B̂[idx[b]] over the rows of a batch (no base:
// the term alone), grouped by slot (`lora_groups`): each adapter's factors are streamed once for
// all the tokens that use it.
template <typename C>
void bank_gathered(const float* x, i64 nb, i64 T, i64 K, const C* A, const float* aS, i64 S, i64 R, const C* B, const float* bS, i64 N, const std::vector<i64>& slot, bool zero_tail, const float* base, float* y) {
  const LoraGroups g = lora_groups(slot, T, pool().size());
  pool().parallel(static_cast<i64>(g.parts.size()), [&](i64 g0, i64 g1) {
    std::vector<float> xt, t, cbuf;
    std::vector<float*> outs;
    std::vector<const float*> inits;
    for (i64 gi = g0; gi < g1; gi++) {
      const auto [r0, r1] = g.parts[static_cast<size_t>(gi)];
      const i64 s = slot[static_cast<size_t>(g.order[static_cast<size_t>(r0)])];
      const i64 m = (r1 - r0) * T;  // tokens in this part
      xt.resize(static_cast<size_t>(m * K));
      t.assign(static_cast<size_t>(m * R), 0.0f);
      for (i64 i = r0; i < r1; i++) std::memcpy(xt.data() + (i - r0) * T * K, x + g.order[static_cast<size_t>(i)] * T * K, sizeof(float) * static_cast<size_t>(T * K));
      outs.resize(static_cast<size_t>(m));
      inits.resize(static_cast<size_t>(m));
      for (i64 tok = 0; tok < m; tok++) {
        const i64 at = (g.order[static_cast<size_t>(r0 + tok / T)] * T + tok % T) * N;
        outs[static_cast<size_t>(tok)] = y + at;
        inits[static_cast<size_t>(tok)] = base != nullptr ? base + at : nullptr;
      }
      bank_group<C>(xt.data(), m, K, A + s * R * K, aS != nullptr ? aS + s * R : nullptr, R, B + s * R * N, bS != nullptr ? bS + s * R : nullptr, N, zero_tail, t.data(), cbuf, outs.data(), base != nullptr ? inits.data() : nullptr);
    }
    // NOTE: one group a part (claimed one at a time): groups differ by up to 8× in rank (the
    // slots of a step's adapters, sorted by slot, put the big ranks together), and contiguous
    // chunks of them left one thread idle for a fifth of the instruction.
  }, nb * T * R * (K + N) < kParallelMin, static_cast<int>(std::min<size_t>(g.parts.size(), 0xFFFF)));
}

// The base operand a[at] of a LORA / LORA_Q instruction (the encoder passes it when its shape is
// the result's: the add joins the bank's pass), or null when absent.
const float* bank_base(Run& p, const Instr& in, size_t at, i64 n) {
  if (in.a.size() <= at) return nullptr;
  if (numel(p.shapes[in.a[at]]) != n) fail("RT_BAD_VALUE", "lora: the base projection's shape disagrees with the result");
  return F(p, in.a[at]);
}

// y[b, t] = (x[b, t] · A[idx[b]]ᵀ) · B[idx[b]]: a = [x [B, T, K], A [S, R, K], B [S, R, N], idx [B],
// base?] (the gathered slot form's LoRA term; with a[4], the base projection [B, T, N] it is added
// to, in the same pass), i[0] = 1: the op's zeroTail promise (`bank_group`).
void lora_gathered(Run& p, const Instr& in) {
  const auto& xs = p.shapes[in.a[0]];
  const auto& as = p.shapes[in.a[1]];
  const auto& bs = p.shapes[in.a[2]];
  const i64 nb = xs[0], T = xs[1], K = xs[2];
  const i64 S = as[0], R = as[1], N = bs[2];
  if (as[2] != K || bs[0] != S || bs[1] != R || numel(p.shapes[in.a[3]]) != nb) fail("RT_BAD_VALUE", "lora: slot tables disagree with the activations");
  std::vector<i64> slot(static_cast<size_t>(nb));
  for (i64 b = 0; b < nb; b++) slot[static_cast<size_t>(b)] = checked_index(index_at(p, in.a[3], b), S, "matmul (gathered operand)");
  const float* base = bank_base(p, in, 4, nb * T * N);
  bank_gathered<float>(F(p, in.a[0]), nb, T, K, F(p, in.a[1]), nullptr, S, R, F(p, in.a[2]), nullptr, N, slot, !in.i.empty() && in.i[0] != 0, base, F(p, in.r[0]));
}

// The same over int8 tables: a = [x [B, T, K], A i8 [S, R, K], as [S, R], B i8 [S, R, N], bs [S, R],
// idx [B], base?] — codes read in place and widened in registers, the row scales applied to the shrink's
// R values and the expand's coefficients, not to the factors.
void lora_gathered_q(Run& p, const Instr& in) {
  const auto& xs = p.shapes[in.a[0]];
  const auto& as = p.shapes[in.a[1]];
  const auto& bs = p.shapes[in.a[3]];
  const i64 nb = xs[0], T = xs[1], K = xs[2];
  const i64 S = as[0], R = as[1], N = bs[2];
  if (as[2] != K || bs[0] != S || bs[1] != R || numel(p.shapes[in.a[2]]) != S * R || numel(p.shapes[in.a[4]]) != S * R || numel(p.shapes[in.a[5]]) != nb) fail("RT_BAD_VALUE", "lora (int8): slot tables and scales disagree with the activations");
  if (p.vals[in.a[1]].dtype != DT_I8 || p.vals[in.a[3]].dtype != DT_I8) fail("RT_BAD_VALUE", "lora (int8): the factor tables must be i8");
  std::vector<i64> slot(static_cast<size_t>(nb));
  for (i64 b = 0; b < nb; b++) slot[static_cast<size_t>(b)] = checked_index(index_at(p, in.a[5], b), S, "matmul (gathered operand)");
  const float* base = bank_base(p, in, 6, nb * T * N);
  bank_gathered<int8_t>(F(p, in.a[0]), nb, T, K, static_cast<const int8_t*>(p.ptr[in.a[1]]), F(p, in.a[2]), S, R, static_cast<const int8_t*>(p.ptr[in.a[3]]), F(p, in.a[4]), N, slot, !in.i.empty() && in.i[0] != 0, base, F(p, in.r[0]));
}

void linear(Run& p, const Instr& in) {
  const auto& xs = p.shapes[in.a[0]];
  const auto& ws = p.shapes[in.a[1]];
  const i64 n = ws[0], k = ws[1];
  const i64 m = numel(xs) / std::max<i64>(k, 1);
  const float* x = F(p, in.a[0]);
  const float* w = F(p, in.a[1]);
  float* y = F(p, in.r[0]);
  if (k == 0) {
    std::memset(y, 0, sizeof(float) * static_cast<size_t>(m * n));
  } else if (few_rows(m)) {
    few_gemm(x, k, w, k, y, n, m, k, n, nullptr);
  } else {
    pool().parallel((n + 3) / 4, [&](i64 b, i64 e) { gemm_nt_range(x, k, w, k, y, n, m, k, b * 4, std::min(n, e * 4)); }, m * n * k < kParallelMin);
  }
  if (in.a.size() > 2) {
    const float* bias = F(p, in.a[2]);
    for (i64 r = 0; r < m; r++)
      for (i64 o = 0; o < n; o++) y[r * n + o] += bias[o];
  }
}

// y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ: a = [x [.., K], W [N, K], A [R, K], B [N, R]], f = [s] (the LoRA layer
// as `loraLinear` builds it, one instruction). The shrink t = s·(x·Aᵀ) [M, R] runs first (R·K
// multiply-adds per row: under 1 % of the GEMM's at rank 16, split over the threads by rows of x,
// or of A when there are few); the GEMM then runs as one product over K + R columns, [x | t] · [W | B]ᵀ: the R extra columns
// join the last K chunk of each output tile while its sums are in registers (GemmExtra). No
// [M, N] intermediate, no second pass over y, and one thread barrier (the shrink's) beyond the
// bare linear's.
void lora_linear(Run& p, const Instr& in) {
  const auto& xs = p.shapes[in.a[0]];
  const auto& ws = p.shapes[in.a[1]];
  const auto& as = p.shapes[in.a[2]];
  const auto& bs = p.shapes[in.a[3]];
  const i64 n = ws[0], k = ws[1], R = as[0];
  if (as[1] != k || bs[0] != n || bs[1] != R) fail("RT_BAD_VALUE", "lora linear: factor shapes disagree with the weight");
  const i64 m = numel(xs) / std::max<i64>(k, 1);
  const float* x = F(p, in.a[0]);
  const float* w = F(p, in.a[1]);
  const float* A = F(p, in.a[2]);
  const float* B = F(p, in.a[3]);
  const float s = static_cast<float>(in.f[0]);
  float* y = F(p, in.r[0]);
  if (k == 0) {
    std::memset(y, 0, sizeof(float) * static_cast<size_t>(m * n));
    return;
  }
  std::vector<float> t(static_cast<size_t>(m * R));
  if (R > 0) {
    const bool serial = m * R * k < kParallelMin;
    if (m >= 12) {
      // By blocks of 6 rows of x (each part reads its rows of x once, A from cache).
      pool().parallel((m + 5) / 6, [&](i64 b, i64 e) {
        const i64 i0 = b * 6, i1 = std::min(m, e * 6);
        gemm_nt_range(x + i0 * k, k, A, k, t.data() + i0 * R, R, i1 - i0, k, 0, R);
        for (i64 j = i0 * R; j < i1 * R; j++) t[static_cast<size_t>(j)] *= s;
      }, serial);
    } else {
      // Few rows (decode): by 4 rows of A.
      pool().parallel((R + 3) / 4, [&](i64 b, i64 e) {
        const i64 r0 = b * 4, r1 = std::min(R, e * 4);
        gemm_nt_range(x, k, A, k, t.data(), R, m, k, r0, r1);
        for (i64 i = 0; i < m; i++)
          for (i64 r = r0; r < r1; r++) t[static_cast<size_t>(i * R + r)] *= s;
      }, serial);
    }
  }
  const GemmExtra ex{t.data(), R, B, R, R};
  if (few_rows(m)) {
    few_gemm(x, k, w, k, y, n, m, k, n, R > 0 ? &ex : nullptr);
    return;
  }
  pool().parallel((n + 3) / 4, [&](i64 b, i64 e) { gemm_nt_range(x, k, w, k, y, n, m, k, b * 4, std::min(n, e * 4), R > 0 ? &ex : nullptr); }, m * n * k < kParallelMin);
}

// Sibling linears: y_j = x · W_jᵀ for weights W_j [N_j, K] that read one input x (a layer's q, k
// and v projections, or gate and up), as one instruction. At a few rows (decode) every weight's
// output tiles go to the pool as ONE job: one barrier instead of one per weight, and a small
// projection (k or v: 192 outputs) no longer runs as a job of its own too small to split well.
// More rows run each weight as its own LINEAR (the GEMM path, unchanged).
constexpr i64 kMultiRows = 4;

// Which sibling tile t of the concatenated [0, start.back()) falls in: start[j] ≤ t < start[j + 1].
inline size_t sibling_of(const std::vector<i64>& start, i64 t) {
  size_t j = 0;
  while (j + 2 < start.size() && start[j + 1] <= t) j++;
  return j;
}

void linear_multi(Run& p, const Instr& in) {
  const size_t nw = in.r.size();
  const i64 k = p.shapes[in.a[1]][1];
  const i64 m = numel(p.shapes[in.a[0]]) / std::max<i64>(k, 1);
  if (m > kMultiRows || k == 0 || k > 8192) {
    for (size_t j = 0; j < nw; j++) {
      Instr one;
      one.op = OP_LINEAR;
      one.a = {in.a[0], in.a[1 + j]};
      one.r = {in.r[j]};
      linear(p, one);
    }
    return;
  }
  const float* x = F(p, in.a[0]);
  // Output tiles of 4 rows, numbered across the siblings.
  std::vector<i64> start(nw + 1, 0);
  i64 macs = 0;
  for (size_t j = 0; j < nw; j++) {
    const auto& ws = p.shapes[in.a[1 + j]];
    if (ws[1] != k) fail("RT_BAD_VALUE", "linear (siblings): the weights' input sizes differ");
    start[j + 1] = start[j] + (ws[0] + 3) / 4;
    macs += m * ws[0] * k;
  }
  pool().parallel(start[nw], [&](i64 b, i64 e) {
    for (size_t j = sibling_of(start, b); j < nw && start[j] < e; j++) {
      const i64 n = p.shapes[in.a[1 + j]][0];
      const i64 t0 = std::max(b, start[j]) - start[j], t1 = std::min(e, start[j + 1]) - start[j];
      gemm_nt_range(x, k, F(p, in.a[1 + j]), k, F(p, in.r[j]), n, m, k, t0 * 4, std::min(n, t1 * 4));
    }
  }, macs < kParallelMin);
}

void qlinear_multi(Run& p, const Instr& in) {
  const size_t nw = in.packs.size();
  const QPacked& w0 = *in.packs[0];
  const i64 m = numel(p.shapes[in.a[0]]) / std::max<i64>(w0.k, 1);
  const float* x = F(p, in.a[0]);
  // NOTE: at any rows, unlike the f32 siblings (whose GEMM above 4 rows is a different kernel):
  // QLINEAR's tiles are the same kernel at every row count, so a prefill's q, k and v (gate and
  // up) quantize x once and share one job; run apart, the 1024-output k and v projections of the
  // Qwen3 shape's 128-token prefill ran at 0.6 of the larger ones' rate.
  bool tiled = true;
  for (const auto& w : in.packs) tiled = tiled && w->dense.empty();
#ifdef SML_VNNI
  if (tiled) {
    // One quantization of x for every sibling (they share its blocks, bits and zero-point rule).
    QAct a;
    quantize_act(x, m, w0.k, w0.asym ? 1.0f : w0.zp, a);
    std::vector<i64> start(nw + 1, 0);
    i64 macs = 0;
    for (size_t j = 0; j < nw; j++) {
      start[j + 1] = start[j] + in.packs[j]->groups;
      macs += m * in.packs[j]->n * w0.k;
    }
    pool().parallel(start[nw], [&](i64 b, i64 e) {
      for (size_t j = sibling_of(start, b); j < nw && start[j] < e; j++) {
        const i64 g0 = std::max(b, start[j]) - start[j], g1 = std::min(e, start[j + 1]) - start[j];
        for (i64 g = g0; g < g1; g++) qtile_rows(*in.packs[j], a, 0, m, g, F(p, in.r[j]));
      }
    }, macs < kParallelMin);
    return;
  }
#endif
  (void)tiled;
  for (size_t j = 0; j < nw; j++) qlinear(*in.packs[j], x, m, F(p, in.r[j]));
}

// ---------------------------------------------------------------------------------------------
// MoE routing and reductions: topk, scatterAdd, groupedMatmul, sum/mean/max, argmax, iota. Each
// follows its op's reference semantics in packages/ir/src/ops (accumulating in double where the
// reference does, in the reference's order), on every dtype the program table holds.

// Element i of a value of dtype dt as a double (i64 is stored as double).
inline double load_as(const void* x, int dt, i64 i) {
  switch (dt) {
    case DT_F32: return static_cast<const float*>(x)[i];
    case DT_I64: return static_cast<const double*>(x)[i];
    case DT_I32: return static_cast<const int32_t*>(x)[i];
    case DT_I8: return static_cast<const int8_t*>(x)[i];
    default: return static_cast<const uint8_t*>(x)[i];
  }
}

// Stores v rounded to dtype dt as the IR's `rounderFor` does (f32 round to nearest; integers
// truncate, non-finite to 0, i32 and u8 wrap).
inline void store_as(void* y, int dt, i64 i, double v) {
  switch (dt) {
    case DT_F32: static_cast<float*>(y)[i] = static_cast<float>(v); break;
    case DT_I64: static_cast<double*>(y)[i] = std::isfinite(v) ? std::trunc(v) : 0; break;
    case DT_I32: static_cast<int32_t*>(y)[i] = std::isfinite(v) ? static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(static_cast<int64_t>(std::fmod(std::trunc(v), 4294967296.0))))) : 0; break;
    case DT_BOOL: static_cast<uint8_t*>(y)[i] = v != 0 ? 1 : 0; break;
    case DT_I8: static_cast<int8_t*>(y)[i] = std::isfinite(v) ? static_cast<int8_t>(static_cast<uint8_t>(static_cast<uint64_t>(static_cast<int64_t>(std::fmod(std::trunc(v), 256.0))) & 0xFF)) : 0; break;
    default: static_cast<uint8_t*>(y)[i] = std::isfinite(v) ? static_cast<uint8_t>(static_cast<uint64_t>(static_cast<int64_t>(std::fmod(std::trunc(v), 256.0))) & 0xFF) : 0; break;
  }
}

// An index operand's entry j, which must be an integer in [0, size) (i64 indices are doubles).
inline i64 index_in(const Run& p, int v, i64 j, i64 size, const char* what) {
  if (p.vals[v].dtype == DT_I64) {
    const double d = static_cast<const double*>(p.ptr[v])[j];
    if (!(d >= 0 && d < static_cast<double>(size)) || d != std::trunc(d)) fail("RT_BAD_VALUE", std::string(what) + ": index " + std::to_string(d) + " is out of range [0, " + std::to_string(size) + ")");
    return static_cast<i64>(d);
  }
  return checked_index(index_at(p, v, j), size, what);
}

// (values, indices) = topk(x, k) along axis: a = [x], r = [values, indices], i = [k, axis,
// largest]. Order as the reference sorts: NaN above +∞, ties (and −0 = +0) by lower index first.
void topk(Run& p, const Instr& in) {
  const auto& xs = p.shapes[in.a[0]];
  const i64 k = in.i[0];
  const size_t ax = static_cast<size_t>(in.i[1]);
  const bool largest = in.i[2] != 0;
  const auto [outer, inner] = split_at(xs, ax);
  const i64 size = xs[ax];
  if (k > size) fail("RT_BAD_VALUE", "topk: k=" + std::to_string(k) + " exceeds axis size " + std::to_string(size));
  const int dt = p.vals[in.a[0]].dtype;
  const void* x = p.ptr[in.a[0]];
  void* vals = p.ptr[in.r[0]];
  double* idxs = D(p, in.r[1]);
  // `before(a, b)`: value a ranks strictly ahead of b.
  auto before = [largest](double a, double b) {
    const bool na = std::isnan(a), nb = std::isnan(b);
    if (na != nb) return largest ? na : nb;
    if (na) return false;
    return largest ? a > b : a < b;
  };
  pool().parallel(outer * inner, [&](i64 b, i64 e) {
    std::vector<std::pair<double, i64>> lane(static_cast<size_t>(size));
    for (i64 l = b; l < e; l++) {
      const i64 o = l / std::max<i64>(inner, 1), c = l % std::max<i64>(inner, 1);
      for (i64 j = 0; j < size; j++) lane[static_cast<size_t>(j)] = {load_as(x, dt, (o * size + j) * inner + c), j};
      auto cmp = [&](const std::pair<double, i64>& u, const std::pair<double, i64>& v) {
        if (before(u.first, v.first)) return true;
        if (before(v.first, u.first)) return false;
        return u.second < v.second;
      };
      std::partial_sort(lane.begin(), lane.begin() + k, lane.end(), cmp);
      for (i64 j = 0; j < k; j++) {
        const i64 at = (o * k + j) * inner + c;
        store_as(vals, dt, at, lane[static_cast<size_t>(j)].first);
        idxs[at] = static_cast<double>(lane[static_cast<size_t>(j)].second);
      }
    }
  }, outer * inner * size < kParallelMin);
}

// y = x; y[…, index[j], …] += updates[…, j, …] along axis: a = [x, index, updates], i = [axis].
// Each destination row sums x and its updates in index order in double and rounds once (the
// reference's accumulation), so repeated indices need no atomics: rows run in parallel.
void scatter_add(Run& p, const Instr& in) {
  const auto& xs = p.shapes[in.a[0]];
  const size_t ax = static_cast<size_t>(in.i[0]);
  const auto [outer, inner] = split_at(xs, ax);
  const i64 size = xs[ax];
  const i64 n = numel(p.shapes[in.a[1]]);
  const int dt = p.vals[in.r[0]].dtype;
  const void* x = p.ptr[in.a[0]];
  const void* up = p.ptr[in.a[2]];
  void* y = p.ptr[in.r[0]];
  // Updates of each destination, in index order (a counting sort).
  std::vector<i64> start(static_cast<size_t>(size) + 1, 0), order(static_cast<size_t>(n));
  std::vector<i64> dst(static_cast<size_t>(n));
  for (i64 j = 0; j < n; j++) start[static_cast<size_t>(dst[j] = index_in(p, in.a[1], j, size, "scatterAdd")) + 1]++;
  for (i64 s = 0; s < size; s++) start[s + 1] += start[s];
  {
    std::vector<i64> fill(start.begin(), start.end() - 1);
    for (i64 j = 0; j < n; j++) order[static_cast<size_t>(fill[static_cast<size_t>(dst[j])]++)] = j;
  }
  pool().parallel(outer * size, [&](i64 b, i64 e) {
    std::vector<double> acc(static_cast<size_t>(inner));
    for (i64 row = b; row < e; row++) {
      const i64 o = row / size, s = row % size;
      const i64 base = row * inner;
      for (i64 c = 0; c < inner; c++) acc[c] = load_as(x, dt, base + c);
      for (i64 q = start[s]; q < start[s + 1]; q++) {
        const i64 src = (o * n + order[q]) * inner;
        if (dt == DT_F32) {
          const float* u = static_cast<const float*>(up) + src;
          for (i64 c = 0; c < inner; c++) acc[c] += u[c];
        } else
          for (i64 c = 0; c < inner; c++) acc[c] += load_as(up, dt, src + c);
      }
      if (dt == DT_F32) {
        float* yr = static_cast<float*>(y) + base;
        for (i64 c = 0; c < inner; c++) yr[c] = static_cast<float>(acc[c]);
      } else
        for (i64 c = 0; c < inner; c++) store_as(y, dt, base + c, acc[c]);
    }
  }, outer * (size + n) * inner < kParallelMin);
}

// y[n] = x[n] · w[g_n] (transposeW: x[n] · w[g_n]ᵀ): a = [x [N, K], w [G, d1, d2], groups [N]],
// i = [transposeW]. Rows are sorted by group (stable counting sort) and gathered, each group with
// rows runs as one GEMM over its weight matrix — the f32 tiles `linear` uses, split into column
// blocks across the pool with the other groups' blocks — and the results go back to their rows.
// Groups without rows cost nothing. Integer operands run the reference loop, wrapping.
void grouped_matmul(Run& p, const Instr& in) {
  const auto& xs = p.shapes[in.a[0]];
  const auto& ws = p.shapes[in.a[1]];
  const i64 n = xs[0], k = xs[1], G = ws[0];
  const bool tw = in.i[0] != 0;
  const i64 m = tw ? ws[1] : ws[2];
  if ((tw ? ws[2] : ws[1]) != k) fail("RT_BAD_VALUE", "groupedMatmul: x " + shape_str(xs) + " and w " + shape_str(ws) + " disagree on the contraction dim");
  const int dt = p.vals[in.r[0]].dtype;
  std::vector<i64> start(static_cast<size_t>(G) + 1, 0), order(static_cast<size_t>(n)), grp(static_cast<size_t>(n));
  for (i64 r = 0; r < n; r++) start[static_cast<size_t>(grp[r] = index_in(p, in.a[2], r, G, "groupedMatmul")) + 1]++;
  for (i64 g = 0; g < G; g++) start[g + 1] += start[g];
  {
    std::vector<i64> fill(start.begin(), start.end() - 1);
    for (i64 r = 0; r < n; r++) order[static_cast<size_t>(fill[static_cast<size_t>(grp[r])]++)] = r;
  }
  if (dt != DT_F32) {
    // The reference loop on integers (i64 as double, i32), summed in double and wrapped once.
    const void* x = p.ptr[in.a[0]];
    const void* w = p.ptr[in.a[1]];
    void* y = p.ptr[in.r[0]];
    const i64 sk = tw ? 1 : m, sm = tw ? k : 1;
    for (i64 r = 0; r < n; r++) {
      const i64 base = grp[r] * ws[1] * ws[2];
      for (i64 j = 0; j < m; j++) {
        double acc = 0;
        for (i64 q = 0; q < k; q++) acc += load_as(x, dt, r * k + q) * load_as(w, dt, base + q * sk + j * sm);
        store_as(y, dt, r * m + j, acc);
      }
    }
    return;
  }
  const float* x = F(p, in.a[0]);
  const float* w = F(p, in.a[1]);
  float* y = F(p, in.r[0]);
  if (n == 0 || m == 0) return;
  if (k == 0) {
    std::memset(y, 0, sizeof(float) * static_cast<size_t>(n * m));
    return;
  }
  std::vector<float> xg(static_cast<size_t>(n * k)), yg(static_cast<size_t>(n * m));
  for (i64 q = 0; q < n; q++) std::memcpy(xg.data() + q * k, x + order[q] * k, sizeof(float) * static_cast<size_t>(k));
  // Work items: (group, block of kNb output columns), over the groups with rows.
  constexpr i64 kNb = 64;
  const i64 blocks = (m + kNb - 1) / kNb;
  std::vector<i64> items;
  for (i64 g = 0; g < G; g++)
    if (start[g + 1] > start[g])
      for (i64 c = 0; c < blocks; c++) items.push_back(g * blocks + c);
  // Without transposeW, each used group's [K, M] matrix is transposed once into [M, K], so every
  // group runs the same register-tiled dot products (whose accumulation error `linear` has, rather
  // than a K-long chain of axpys).
  std::vector<i64> used;
  for (i64 g = 0; g < G; g++)
    if (start[g + 1] > start[g]) used.push_back(g);
  std::vector<float> wt(tw ? 0 : static_cast<size_t>(used.size()) * static_cast<size_t>(m * k));
  std::vector<i64> slot(tw ? 0 : static_cast<size_t>(G), -1);
  if (!tw) {
    for (size_t u = 0; u < used.size(); u++) slot[static_cast<size_t>(used[u])] = static_cast<i64>(u);
    pool().parallel(static_cast<i64>(used.size()), [&](i64 b, i64 e) {
      for (i64 u = b; u < e; u++) {
        const float* src = w + used[u] * k * m;
        float* dst = wt.data() + u * m * k;
        for (i64 q = 0; q < k; q++)
          for (i64 j = 0; j < m; j++) dst[j * k + q] = src[q * m + j];
      }
    }, static_cast<i64>(used.size()) * m * k < kParallelMin);
  }
  pool().parallel(static_cast<i64>(items.size()), [&](i64 b, i64 e) {
    for (i64 t = b; t < e; t++) {
      const i64 g = items[t] / blocks, n0 = items[t] % blocks * kNb, n1 = std::min(m, n0 + kNb);
      const i64 r0 = start[g], rows = start[g + 1] - start[g];
      const float* wg = tw ? w + g * ws[1] * ws[2] : wt.data() + slot[static_cast<size_t>(g)] * m * k;
      gemm_nt_range(xg.data() + r0 * k, k, wg, k, yg.data() + r0 * m, m, rows, k, n0, n1);
    }
  }, n * m * k < kParallelMin);
  for (i64 q = 0; q < n; q++) std::memcpy(y + order[q] * m, yg.data() + q * m, sizeof(float) * static_cast<size_t>(m));
}

enum Reduce { R_SUM = 0, R_MEAN, R_MAX };

// y = sum / mean / max of x over the axes: a = [x], i = [kind, axes…] (none: every axis). The
// reference's order: x row-major, accumulated in double; max propagates NaN, empty gives −∞.
void reduce(Run& p, const Instr& in) {
  const auto& xs = p.shapes[in.a[0]];
  const size_t rank = xs.size();
  std::vector<bool> red(rank, in.i.size() == 1);
  for (size_t j = 1; j < in.i.size(); j++) red[static_cast<size_t>(in.i[j])] = true;
  // Output strides over x's axes (0 along reduced ones).
  std::vector<i64> ost(rank, 0);
  i64 nout = 1, count = 1;
  for (size_t d = rank; d-- > 0;) {
    if (red[d]) count *= xs[d];
    else {
      ost[d] = nout;
      nout *= xs[d];
    }
  }
  const int kind = static_cast<int>(in.i[0]);
  const int dt = p.vals[in.a[0]].dtype;
  std::vector<double> acc(static_cast<size_t>(nout), kind == R_MAX ? -INFINITY : 0.0);
  const i64 total = numel(xs);
  std::vector<i64> idx(rank, 0);
  i64 o = 0;
  const void* x = p.ptr[in.a[0]];
  for (i64 e = 0; e < total; e++) {
    const double v = load_as(x, dt, e);
    double& a = acc[static_cast<size_t>(o)];
    if (kind == R_MAX) a = std::isnan(a) || std::isnan(v) ? NAN : (a > v ? a : v);
    else a += v;
    for (size_t d = rank; d-- > 0;) {
      o += ost[d];
      if (++idx[d] < xs[d]) break;
      o -= ost[d] * xs[d];
      idx[d] = 0;
    }
  }
  void* y = p.ptr[in.r[0]];
  for (i64 j = 0; j < nout; j++) store_as(y, dt, j, kind == R_MEAN ? acc[j] / static_cast<double>(count) : acc[j]);
}

// y = index of the first maximum along axis (NaN counts as the maximum): a = [x], i = [axis].
void argmax(Run& p, const Instr& in) {
  const auto& xs = p.shapes[in.a[0]];
  const size_t ax = static_cast<size_t>(in.i[0]);
  const auto [outer, inner] = split_at(xs, ax);
  const i64 size = xs[ax];
  if (size == 0) fail("RT_BAD_VALUE", "argmax: axis has size 0");
  const int dt = p.vals[in.a[0]].dtype;
  const void* x = p.ptr[in.a[0]];
  double* y = D(p, in.r[0]);
  for (i64 o = 0; o < outer; o++)
    for (i64 c = 0; c < inner; c++) {
      i64 best = 0;
      double bv = load_as(x, dt, o * size * inner + c);
      for (i64 j = 1; j < size && !std::isnan(bv); j++) {
        const double v = load_as(x, dt, (o * size + j) * inner + c);
        if (v > bv || std::isnan(v)) {
          best = j;
          bv = v;
        }
      }
      y[o * inner + c] = static_cast<double>(best);
    }
}

// y[i…] = i[axis] in y's dtype: r = [y], i = [axis].
void iota(Run& p, const Instr& in) {
  const auto& ys = p.shapes[in.r[0]];
  const size_t ax = static_cast<size_t>(in.i[0]);
  const auto [outer, inner] = split_at(ys, ax);
  const i64 size = ys[ax];
  const int dt = p.vals[in.r[0]].dtype;
  void* y = p.ptr[in.r[0]];
  for (i64 o = 0; o < outer; o++)
    for (i64 j = 0; j < size; j++)
      for (i64 c = 0; c < inner; c++) store_as(y, dt, (o * size + j) * inner + c, static_cast<double>(j));
}

void cast(Run& p, const Instr& in) {
  const int from = p.vals[in.a[0]].dtype, to = p.vals[in.r[0]].dtype;
  const i64 n = numel(p.shapes[in.r[0]]);
  const void* x = p.ptr[in.a[0]];
  void* y = p.ptr[in.r[0]];
  auto read = [&](i64 i) -> double {
    switch (from) {
      case DT_F32: return static_cast<const float*>(x)[i];
      case DT_I64: return static_cast<const double*>(x)[i];
      case DT_I32: return static_cast<const int32_t*>(x)[i];
      case DT_I8: return static_cast<const int8_t*>(x)[i];
      default: return static_cast<const uint8_t*>(x)[i];
    }
  };
  for (i64 i = 0; i < n; i++) {
    const double v = read(i);
    switch (to) {
      case DT_F32: static_cast<float*>(y)[i] = static_cast<float>(v); break;
      case DT_I64: static_cast<double*>(y)[i] = std::isfinite(v) ? std::trunc(v) : 0; break;
      case DT_I32: static_cast<int32_t*>(y)[i] = std::isfinite(v) ? static_cast<int32_t>(static_cast<int64_t>(std::trunc(v))) : 0; break;
      case DT_BOOL: static_cast<uint8_t*>(y)[i] = v != 0 ? 1 : 0; break;
      case DT_I8: static_cast<int8_t*>(y)[i] = std::isfinite(v) ? static_cast<int8_t>(static_cast<uint8_t>(static_cast<int64_t>(std::trunc(v)) & 0xFF)) : 0; break;
      default: static_cast<uint8_t*>(y)[i] = std::isfinite(v) ? static_cast<uint8_t>(static_cast<int64_t>(std::trunc(v)) & 0xFF) : 0; break;
    }
  }
}

i64 eval_expr(const Run& p, int id) {
  const Expr& e = p.exprs[id];
  i64 v = e.c;
  for (const Term& t : e.terms) {
    i64 m = t.coef;
    for (int s : t.vars) m *= p.dimv[s];
    v += m;
  }
  return v;
}

void exec(Run& p, const Instr& in) {
  const size_t esz = dtype_bytes(p.vals[in.r.empty() ? 0 : in.r[0]].dtype);
  switch (in.op) {
    case OP_COPY: std::memcpy(p.ptr[in.r[0]], p.ptr[in.a[0]], esz * static_cast<size_t>(numel(p.shapes[in.r[0]]))); break;
    case OP_RESHAPE: p.ptr[in.r[0]] = p.ptr[in.a[0]]; break;
    case OP_GATHER_VIEW: {
      const auto& ts = p.shapes[in.a[0]];
      const i64 inner = numel(ts) / std::max<i64>(ts[0], 1);
      const i64 ix = checked_index(index_at(p, in.a[1], 0), ts[0], "gather");
      p.ptr[in.r[0]] = static_cast<uint8_t*>(p.ptr[in.a[0]]) + static_cast<size_t>(ix * inner) * esz;
      break;
    }
    case OP_TRANSPOSE: {
      const auto& xs = p.shapes[in.a[0]];
      const std::vector<i64> xst = row_major(xs);
      std::vector<i64> sst(xs.size());
      for (size_t d = 0; d < xs.size(); d++) sst[d] = xst[static_cast<size_t>(in.i[d])];
      strided_copy(p.ptr[in.a[0]], p.ptr[in.r[0]], esz, p.shapes[in.r[0]], sst);
      break;
    }
    case OP_BROADCAST: strided_copy(p.ptr[in.a[0]], p.ptr[in.r[0]], esz, p.shapes[in.r[0]], bstrides(p.shapes[in.a[0]], p.shapes[in.r[0]])); break;
    case OP_CAST: cast(p, in); break;
    case OP_BINARY: {
      const auto& ys = p.shapes[in.r[0]];
      const auto sa = bstrides(p.shapes[in.a[0]], ys), sb = bstrides(p.shapes[in.a[1]], ys);
      if (p.vals[in.r[0]].dtype == DT_F32) binary_f32(static_cast<int>(in.i[0]), F(p, in.a[0]), F(p, in.a[1]), F(p, in.r[0]), ys, sa, sb);
      else if (p.vals[in.r[0]].dtype == DT_I64) binary_int<double>(static_cast<int>(in.i[0]), D(p, in.a[0]), D(p, in.a[1]), D(p, in.r[0]), ys, sa, sb);
      else if (p.vals[in.r[0]].dtype == DT_I32) binary_int<int32_t>(static_cast<int>(in.i[0]), static_cast<const int32_t*>(p.ptr[in.a[0]]), static_cast<const int32_t*>(p.ptr[in.a[1]]), static_cast<int32_t*>(p.ptr[in.r[0]]), ys, sa, sb);
      else binary_int<uint8_t>(static_cast<int>(in.i[0]), static_cast<const uint8_t*>(p.ptr[in.a[0]]), static_cast<const uint8_t*>(p.ptr[in.a[1]]), static_cast<uint8_t*>(p.ptr[in.r[0]]), ys, sa, sb);
      break;
    }
    case OP_UNARY: {
      const i64 n = numel(p.shapes[in.r[0]]);
      if (p.vals[in.r[0]].dtype == DT_F32) unary_f32(static_cast<int>(in.i[0]), F(p, in.a[0]), F(p, in.r[0]), n);
      else if (p.vals[in.r[0]].dtype == DT_I64) {
        const double* x = D(p, in.a[0]);
        double* y = D(p, in.r[0]);
        for (i64 j = 0; j < n; j++) y[j] = in.i[0] == U_NEG ? -x[j] : std::fabs(x[j]);
      } else {
        const int32_t* x = static_cast<const int32_t*>(p.ptr[in.a[0]]);
        int32_t* y = static_cast<int32_t*>(p.ptr[in.r[0]]);
        for (i64 j = 0; j < n; j++) y[j] = static_cast<int32_t>(in.i[0] == U_NEG ? -static_cast<int64_t>(x[j]) : std::llabs(x[j]));
      }
      break;
    }
    case OP_CONCAT: {
      const auto& ys = p.shapes[in.r[0]];
      const size_t ax = static_cast<size_t>(in.i[0]);
      i64 outer = 1;
      for (size_t d = 0; d < ax; d++) outer *= ys[d];
      i64 yrow = 1;
      for (size_t d = ax; d < ys.size(); d++) yrow *= ys[d];
      uint8_t* y = static_cast<uint8_t*>(p.ptr[in.r[0]]);
      i64 off = 0;
      for (int v : in.a) {
        const auto& xs = p.shapes[v];
        i64 xrow = 1;
        for (size_t d = ax; d < xs.size(); d++) xrow *= xs[d];
        const uint8_t* x = static_cast<const uint8_t*>(p.ptr[v]);
        // Large operands (a cache and its new rows) are copied by the pool's threads together.
        pool().parallel(outer, [&](i64 o0, i64 o1) {
          for (i64 o = o0; o < o1; o++) std::memcpy(y + (o * yrow + off) * esz, x + o * xrow * esz, static_cast<size_t>(xrow) * esz);
        }, outer * xrow * static_cast<i64>(esz) < (1 << 18));
        off += xrow;
      }
      break;
    }
    case OP_GATHER: {
      const auto& ts = p.shapes[in.a[0]];
      const size_t ax = static_cast<size_t>(in.i[0]);
      const auto [outer, inner] = split_at(ts, ax);
      const i64 size = ts[ax];
      const i64 ni = numel(p.shapes[in.a[1]]);
      const uint8_t* t = static_cast<const uint8_t*>(p.ptr[in.a[0]]);
      uint8_t* y = static_cast<uint8_t*>(p.ptr[in.r[0]]);
      for (i64 j = 0; j < ni; j++) checked_index(index_at(p, in.a[1], j), size, "gather");
      for (i64 o = 0; o < outer; o++)
        for (i64 j = 0; j < ni; j++) {
          const i64 row = index_at(p, in.a[1], j);
          std::memcpy(y + ((o * ni + j) * inner) * esz, t + ((o * size + row) * inner) * esz, static_cast<size_t>(inner) * esz);
        }
      break;
    }
    case OP_SLICE: {
      const auto& xs = p.shapes[in.a[0]];
      const size_t ax = static_cast<size_t>(in.i[0]);
      const i64 size = xs[ax];
      i64 start = eval_expr(p, static_cast<int>(in.i[1]));
      i64 end = in.i[2] != 0 ? eval_expr(p, static_cast<int>(in.i[3])) : size;
      const i64 step = in.i[4];
      if (start < 0) start = std::max<i64>(0, start + size);
      if (end < 0) end = std::max<i64>(0, end + size);
      start = std::min(start, size);
      end = std::min(end, size);
      const std::vector<i64> xst = row_major(xs);
      std::vector<i64> sst = xst;
      sst[ax] = xst[ax] * step;
      const uint8_t* src = static_cast<const uint8_t*>(p.ptr[in.a[0]]) + static_cast<size_t>(start * xst[ax]) * esz;
      strided_copy(src, p.ptr[in.r[0]], esz, p.shapes[in.r[0]], sst);
      break;
    }
    case OP_RMSNORM:
    case OP_LAYERNORM: {
      const auto& xs = p.shapes[in.a[0]];
      const i64 n = xs.empty() ? 1 : xs.back();
      const i64 rows = n == 0 ? 0 : numel(xs) / n;
      const float* w = in.i[0] >= 0 ? F(p, static_cast<int>(in.i[0])) : nullptr;
      const float* b = in.i[1] >= 0 ? F(p, static_cast<int>(in.i[1])) : nullptr;
      norm_rows(F(p, in.a[0]), w, b, F(p, in.r[0]), rows, n, static_cast<float>(in.f[0]), in.op == OP_LAYERNORM);
      break;
    }
    case OP_LINEAR: linear(p, in); break;
    case OP_MATMUL:
      if (p.vals[in.r[0]].dtype == DT_F32) matmul(p, in);
      else if (p.vals[in.r[0]].dtype == DT_I64) matmul_int<double>(p, in);
      else matmul_int<int32_t>(p, in);
      break;
    case OP_QLINEAR: {
      const auto& xs = p.shapes[in.a[0]];
      const i64 m = numel(xs) / std::max<i64>(in.pack->k, 1);
      qlinear(*in.pack, F(p, in.a[0]), m, F(p, in.r[0]));
      break;
    }
    case OP_ROTARY: rotary(p, in); break;
    case OP_ATTENTION: attention(p, in); break;
    case OP_ATTENTION_KV: attention_kv(p, in); break;
    case OP_LORA: lora_gathered(p, in); break;
    case OP_LORA_Q: lora_gathered_q(p, in); break;
    case OP_LORA_LINEAR: lora_linear(p, in); break;
    case OP_LINEAR_MULTI: linear_multi(p, in); break;
    case OP_QLINEAR_MULTI: qlinear_multi(p, in); break;
    case OP_GROUPED_MATMUL: grouped_matmul(p, in); break;
    case OP_SCATTER_ADD: scatter_add(p, in); break;
    case OP_TOPK: topk(p, in); break;
    case OP_REDUCE: reduce(p, in); break;
    case OP_ARGMAX: argmax(p, in); break;
    case OP_IOTA: iota(p, in); break;
    case OP_SOFTMAX: {
      const auto& xs = p.shapes[in.a[0]];
      const size_t ax = static_cast<size_t>(in.i[0]);
      const auto [outer, inner] = split_at(xs, ax);
      softmax_axis(F(p, in.a[0]), F(p, in.r[0]), outer, xs.empty() ? 1 : xs[ax], inner);
      break;
    }
    case OP_WHERE: {
      const auto& ys = p.shapes[in.r[0]];
      const auto sc = bstrides(p.shapes[in.a[0]], ys), sa = bstrides(p.shapes[in.a[1]], ys), sb = bstrides(p.shapes[in.a[2]], ys);
      const std::vector<i64> so = row_major(ys);
      const std::vector<i64> st[4] = {sc, sa, sb, so};
      const uint8_t* c = static_cast<const uint8_t*>(p.ptr[in.a[0]]);
      const uint8_t* a = static_cast<const uint8_t*>(p.ptr[in.a[1]]);
      const uint8_t* b = static_cast<const uint8_t*>(p.ptr[in.a[2]]);
      uint8_t* y = static_cast<uint8_t*>(p.ptr[in.r[0]]);
      const i64 inner = ys.empty() ? 1 : ys.back();
      const i64 ic = ys.empty() ? 0 : sc.back(), ia = ys.empty() ? 0 : sa.back(), ib = ys.empty() ? 0 : sb.back();
      for_rows<4>(ys, st, [&](const i64* o) {
        for (i64 j = 0; j < inner; j++) {
          const bool pick = c[o[0] + j * ic] != 0;
          const uint8_t* src = pick ? a + (o[1] + j * ia) * esz : b + (o[2] + j * ib) * esz;
          std::memcpy(y + (o[3] + j) * esz, src, esz);
        }
      });
      break;
    }
    default: fail("CPU_INTERNAL", "unknown instruction " + std::to_string(in.op));
  }
}

// Binds the symbols and evaluates every shape; returns per-output byte sizes.
void bind_shapes(const Program& prog, Run& p, const double* syms) {
  p.dimv.assign(static_cast<size_t>(prog.nsym), 0);
  for (int s = 0; s < prog.nsym; s++) p.dimv[s] = static_cast<i64>(syms[s]);
  const size_t nv = p.vals.size();
  p.shapes.resize(nv);
  std::vector<i64> ev(p.exprs.size());
  for (size_t e = 0; e < p.exprs.size(); e++) ev[e] = eval_expr(p, static_cast<int>(e));
  for (size_t v = 0; v < nv; v++) {
    auto& s = p.shapes[v];
    s.resize(p.vals[v].dims.size());
    for (size_t d = 0; d < s.size(); d++) {
      s[d] = ev[static_cast<size_t>(p.vals[v].dims[d])];
      if (s[d] < 0) fail("RT_BAD_VALUE", "a dimension of value " + std::to_string(v) + " evaluates to " + std::to_string(s[d]) + " under these inputs");
    }
  }
}

// Sizes the slots for this run's shapes and points the slot values into the arena.
void place(Program& p, Run& r) {
  const size_t nv = p.vals.size();
  p.slot_bytes.assign(static_cast<size_t>(p.nslots), 0);
  for (size_t v = 0; v < nv; v++)
    if (p.vals[v].storage == ST_SLOT) {
      const size_t b = dtype_bytes(p.vals[v].dtype) * static_cast<size_t>(numel(r.shapes[v]));
      auto& sb = p.slot_bytes[static_cast<size_t>(p.vals[v].index)];
      sb = std::max(sb, b);
    }
  p.slot_off.assign(static_cast<size_t>(p.nslots), 0);
  size_t total = 0;
  for (int s = 0; s < p.nslots; s++) {
    p.slot_off[s] = total;
    total += (p.slot_bytes[s] + 63) / 64 * 64 + 64;
  }
  if (total > g_arena_bytes) {
    std::free(g_arena);
    g_arena_bytes = 0;
    g_arena = std::aligned_alloc(64, std::max<size_t>(total, 64));
    if (g_arena == nullptr) fail("RT_OUT_OF_MEMORY", "cannot allocate " + std::to_string(total) + " bytes of intermediates");
    g_arena_bytes = total;
  }
  for (size_t v = 0; v < nv; v++)
    if (p.vals[v].storage == ST_SLOT) r.ptr[v] = static_cast<uint8_t*>(g_arena) + p.slot_off[static_cast<size_t>(p.vals[v].index)];
}

// ---------------------------------------------------------------------------------------------
// Node-API glue.

#define NAPI(call)                                                   \
  do {                                                               \
    if ((call) != napi_ok) fail("CPU_INTERNAL", "Node-API: " #call); \
  } while (0)

void throw_js(napi_env env, const Fail& f) { napi_throw_error(env, f.code.c_str(), f.what()); }

void* any_typed_data(napi_env env, napi_value v, size_t* bytes);

// A typed array's data as T elements (`count` of them).
template <typename T>
const T* typed_data(napi_env env, napi_value v, size_t* count) {
  size_t bytes;
  void* data = any_typed_data(env, v, &bytes);
  *count = bytes / sizeof(T);
  return static_cast<const T*>(data);
}

void* any_typed_data(napi_env env, napi_value v, size_t* bytes) {
  bool is;
  NAPI(napi_is_typedarray(env, v, &is));
  if (!is) fail("RT_BAD_VALUE", "expected a typed array");
  napi_typedarray_type t;
  size_t len;
  void* data;
  napi_value ab;
  size_t off;
  NAPI(napi_get_typedarray_info(env, v, &t, &len, &data, &ab, &off));
  size_t el = 1;
  switch (t) {
    case napi_float64_array:
    case napi_bigint64_array:
    case napi_biguint64_array: el = 8; break;
    case napi_float32_array:
    case napi_int32_array:
    case napi_uint32_array: el = 4; break;
    case napi_int16_array:
    case napi_uint16_array: el = 2; break;
    default: el = 1; break;
  }
  *bytes = len * el;
  return data;
}

void finalize_program(napi_env env, void* data, void*) {
  Program* p = static_cast<Program*>(data);
  for (napi_ref r : p->refs) napi_delete_reference(env, r);
  delete p;
}

// compile(ints: Int32Array, floats: Float64Array, params: TypedArray[]) → external
napi_value js_compile(napi_env env, napi_callback_info info) {
  try {
    size_t argc = 3;
    napi_value argv[3];
    NAPI(napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr));
    size_t ni, nf;
    const int32_t* I = typed_data<int32_t>(env, argv[0], &ni);
    const double* Fl = typed_data<double>(env, argv[1], &nf);
    size_t pos = 0;
    auto next = [&]() -> int32_t {
      if (pos >= ni) fail("CPU_INTERNAL", "program truncated");
      return I[pos++];
    };
    auto p = std::make_unique<Program>();
    const int version = next();
    if (version != 1) fail("CPU_INTERNAL", "program version " + std::to_string(version));
    p->nsym = next();
    const int nexpr = next(), nval = next(), ninstr = next();
    p->nslots = next();
    p->ninputs = next();
    p->noutputs = next();
    const int nparams = next();
    p->exprs.resize(static_cast<size_t>(nexpr));
    for (auto& e : p->exprs) {
      e.c = next();
      const int nt = next();
      e.terms.resize(static_cast<size_t>(nt));
      for (auto& t : e.terms) {
        t.coef = next();
        const int nv = next();
        for (int j = 0; j < nv; j++) t.vars.push_back(next());
      }
    }
    p->vals.resize(static_cast<size_t>(nval));
    for (auto& v : p->vals) {
      v.dtype = next();
      const int rank = next();
      for (int d = 0; d < rank; d++) v.dims.push_back(next());
      v.storage = next();
      v.index = next();
    }
    p->output_vals.assign(static_cast<size_t>(p->noutputs), -1);
    for (int v = 0; v < nval; v++)
      if (p->vals[v].storage == ST_OUTPUT) p->output_vals[static_cast<size_t>(p->vals[v].index)] = v;
    // Params: pin the typed arrays.
    uint32_t plen;
    NAPI(napi_get_array_length(env, argv[2], &plen));
    if (static_cast<int>(plen) != nparams) fail("CPU_INTERNAL", "param count");
    p->params.resize(plen);
    p->param_bytes.resize(plen);
    for (uint32_t j = 0; j < plen; j++) {
      napi_value e;
      NAPI(napi_get_element(env, argv[2], j, &e));
      size_t bytes;
      p->params[j] = any_typed_data(env, e, &bytes);
      p->param_bytes[j] = bytes;
      napi_ref r;
      NAPI(napi_create_reference(env, e, 1, &r));
      p->refs.push_back(r);
    }
    p->code.resize(static_cast<size_t>(ninstr));
    for (auto& in : p->code) {
      in.op = next();
      if (in.op < 0 || in.op >= OP_COUNT) fail("RT_UNSUPPORTED", "instruction " + std::to_string(in.op) + " is not in this runner (ABI " + std::to_string(kAbi) + "): the addon is older than the encoder");
      const int na = next();
      for (int j = 0; j < na; j++) in.a.push_back(next());
      const int nr = next();
      for (int j = 0; j < nr; j++) in.r.push_back(next());
      const int nint = next();
      for (int j = 0; j < nint; j++) in.i.push_back(next());
      const int nfl = next();
      for (int j = 0; j < nfl; j++) {
        const int at = next();
        if (at < 0 || static_cast<size_t>(at) >= nf) fail("CPU_INTERNAL", "float index");
        in.f.push_back(Fl[at]);
      }
      if (in.op == OP_QLINEAR) {
        // a = [x, qweight, scales, zeroPoints?] (params); i = [bits, blockSize, inFeatures, out]
        auto param_of = [&](int v) -> const void* {
          if (p->vals[v].storage != ST_PARAM) fail("RT_UNSUPPORTED", "quantizedLinear needs its codes and scales as parameters (prepare-time data)");
          return p->params[static_cast<size_t>(p->vals[v].index)];
        };
        const uint8_t* q = static_cast<const uint8_t*>(param_of(in.a[1]));
        const float* s = static_cast<const float*>(param_of(in.a[2]));
        const uint8_t* z = in.a.size() > 3 ? static_cast<const uint8_t*>(param_of(in.a[3])) : nullptr;
        in.pack = shared_pack(q, s, z, in.i[3], in.i[2], static_cast<int>(in.i[0]), in.i[1]);
        in.a.resize(1);
      }
      if (in.op == OP_QLINEAR_MULTI) {
        // a = [x, then per sibling its codes, scales (and zero points)] (params); i = [bits,
        // blockSize, inFeatures, asymmetric, then per sibling its outputs]; r = one per sibling.
        auto param_of = [&](int v) -> const void* {
          if (p->vals[v].storage != ST_PARAM) fail("RT_UNSUPPORTED", "quantizedLinear needs its codes and scales as parameters (prepare-time data)");
          return p->params[static_cast<size_t>(p->vals[v].index)];
        };
        const size_t nw = in.r.size();
        const size_t per = in.i.size() > 3 && in.i[3] != 0 ? 3 : 2;
        if (nw == 0 || in.i.size() != 4 + nw || in.a.size() != 1 + per * nw) fail("CPU_INTERNAL", "QLINEAR_MULTI operands");
        for (size_t j = 0; j < nw; j++) {
          const int* o = in.a.data() + 1 + per * j;
          const uint8_t* q = static_cast<const uint8_t*>(param_of(o[0]));
          const float* s = static_cast<const float*>(param_of(o[1]));
          const uint8_t* z = per == 3 ? static_cast<const uint8_t*>(param_of(o[2])) : nullptr;
          in.packs.push_back(shared_pack(q, s, z, in.i[4 + j], in.i[2], static_cast<int>(in.i[0]), in.i[1]));
        }
        in.a.resize(1);
      }
    }
    if (pos != ni) fail("CPU_INTERNAL", "program has trailing data");
    // An input may be given per row where every instruction reading it is ATTENTION_KV taking it
    // as a position-major cache segment (a = [q, k₀, k₁, v₀, v₁, mask?], layouts in i[2..5]).
    p->row_ok.assign(static_cast<size_t>(p->ninputs), 0);
    {
      std::vector<int> input_val(static_cast<size_t>(p->ninputs), -1);
      for (int v = 0; v < nval; v++)
        if (p->vals[v].storage == ST_INPUT && p->vals[v].index >= 0 && p->vals[v].index < p->ninputs) input_val[static_cast<size_t>(p->vals[v].index)] = v;
      std::vector<uint8_t> bad(static_cast<size_t>(nval), 0), read(static_cast<size_t>(nval), 0);
      for (const Instr& in : p->code)
        for (size_t j = 0; j < in.a.size(); j++) {
          const int v = in.a[j];
          if (v < 0 || v >= nval) continue;
          read[static_cast<size_t>(v)] = 1;
          const bool cache = in.op == OP_ATTENTION_KV && in.i.size() >= 6 && ((j == 1 && in.i[2] == 1) || (j == 3 && in.i[4] == 1));
          if (!cache) bad[static_cast<size_t>(v)] = 1;
        }
      // Views of an input (reshape, gather view) read it too.
      for (int v = 0; v < nval; v++)
        if (p->vals[v].storage == ST_VIEW && p->vals[v].index >= 0 && p->vals[v].index < nval) bad[static_cast<size_t>(p->vals[v].index)] = 1;
      for (int k = 0; k < p->ninputs; k++) {
        const int v = input_val[static_cast<size_t>(k)];
        p->row_ok[static_cast<size_t>(k)] = v >= 0 && read[static_cast<size_t>(v)] != 0 && bad[static_cast<size_t>(v)] == 0 && p->vals[v].dtype == DT_F32 && p->vals[v].dims.size() == 4 ? 1 : 0;
      }
    }
    napi_value ext;
    Program* raw = p.release();
    NAPI(napi_create_external(env, raw, finalize_program, nullptr, &ext));
    return ext;
  } catch (const Fail& f) {
    throw_js(env, f);
    return nullptr;
  } catch (const std::exception& e) {
    napi_throw_error(env, "CPU_INTERNAL", e.what());
    return nullptr;
  }
}

struct RunWork {
  Program* prog = nullptr;
  std::unique_ptr<Run> owned;
  Run& run;
  static std::unique_ptr<Run> take(Program& p) {
    std::lock_guard<std::mutex> lk(p.spare_m);
    if (p.spare.empty()) return std::make_unique<Run>(p);
    auto r = std::move(p.spare.back());
    p.spare.pop_back();
    return r;
  }
  explicit RunWork(Program& p) : prog(&p), owned(take(p)), run(*owned) {}
  ~RunWork() {
    std::lock_guard<std::mutex> lk(prog->spare_m);
    if (prog->spare.size() < 4) prog->spare.push_back(std::move(owned));
  }
  napi_async_work work = nullptr;
  napi_deferred deferred = nullptr;
  std::vector<napi_ref> pins;
  napi_ref outs_ref = nullptr;
  bool failed = false;
  std::string code, msg;
};


// Instruction profile (`profile(on)`): per instruction kind and, for the GEMMs, per shape
// (rows × inputs → outputs), the runs and nanoseconds since the last call. Off by default: its
// clock reads cost nothing then. Guarded by g_run_mutex (runs are serialized).
bool g_profile = false;
std::map<std::string, std::pair<int64_t, int64_t>> g_profile_stats;

const char* op_name(int op) {
  static const char* names[OP_COUNT] = {"copy", "transpose", "cast", "binary", "unary", "concat", "gather", "slice", "rmsnorm", "linear", "matmul", "qlinear", "rotary",
                                        "attention", "softmax", "reshape", "gather_view", "broadcast", "layernorm", "where", "attention_kv", "lora", "lora_linear",
                                        "grouped_matmul", "scatter_add", "topk", "reduce", "argmax", "iota", "lora_q", "linear_multi", "qlinear_multi"};
  return op >= 0 && op < OP_COUNT ? names[op] : "?";
}

std::string profile_key(const Run& r, const Instr& in) {
  std::string key = op_name(in.op);
  auto dims = [&](int v) { return shape_str(r.shapes[static_cast<size_t>(v)]); };
  if (in.op == OP_LINEAR || in.op == OP_LORA_LINEAR || in.op == OP_MATMUL || in.op == OP_ATTENTION_KV || in.op == OP_ATTENTION || in.op == OP_GROUPED_MATMUL) key += " " + dims(in.a[0]) + " -> " + dims(in.r[0]);
  else if (in.op == OP_QLINEAR) key += " " + dims(in.a[0]) + " -> " + dims(in.r[0]) + " int" + std::to_string(in.pack->bits);
  else if (in.op == OP_BINARY || in.op == OP_UNARY) key += "." + std::to_string(in.i[0]);
  else if (in.op == OP_LINEAR_MULTI || in.op == OP_QLINEAR_MULTI) {
    key += " " + dims(in.a[0]) + " ->";
    for (size_t j = 0; j < in.r.size(); j++) key += (j == 0 ? " " : " + ") + dims(in.r[j]);
    if (in.op == OP_QLINEAR_MULTI) key += " int" + std::to_string(in.packs[0]->bits);
  }
  return key;
}

void run_execute(napi_env, void* data) {
  RunWork* w = static_cast<RunWork*>(data);
  try {
    std::lock_guard<std::mutex> lk(g_run_mutex);
    place(*w->prog, w->run);
    if (g_profile) {
      for (const Instr& in : w->prog->code) {
        const auto t0 = std::chrono::steady_clock::now();
        exec(w->run, in);
        const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
        auto& e = g_profile_stats[profile_key(w->run, in)];
        e.first++;
        e.second += ns;
      }
    } else
      for (const Instr& in : w->prog->code) exec(w->run, in);
  } catch (const Fail& f) {
    w->failed = true;
    w->code = f.code;
    w->msg = f.what();
  } catch (const std::exception& e) {
    w->failed = true;
    w->code = "CPU_INTERNAL";
    w->msg = e.what();
  }
}

void run_complete(napi_env env, napi_status, void* data) {
  RunWork* w = static_cast<RunWork*>(data);
  napi_value outs;
  napi_get_reference_value(env, w->outs_ref, &outs);
  if (w->failed) {
    napi_value code, msg, err;
    napi_create_string_utf8(env, w->code.c_str(), NAPI_AUTO_LENGTH, &code);
    napi_create_string_utf8(env, w->msg.c_str(), NAPI_AUTO_LENGTH, &msg);
    napi_create_error(env, code, msg, &err);
    napi_reject_deferred(env, w->deferred, err);
  } else napi_resolve_deferred(env, w->deferred, outs);
  for (napi_ref r : w->pins) napi_delete_reference(env, r);
  napi_delete_reference(env, w->outs_ref);
  napi_delete_async_work(env, w->work);
  delete w;
}

// run(program, symbols: Float64Array, inputs: TypedArray[], recycle?: ArrayBuffer)
//   → Promise<[ArrayBuffer, Float64Array]>: the outputs in one buffer, and per output its byte
// offset, rank and dims. `recycle`: a buffer the caller gives back (an earlier run's outputs it no
// longer reads): used instead of a new one when it is large enough and no input lies in it.
napi_value js_run(napi_env env, napi_callback_info info) {
  RunWork* w = nullptr;
  try {
    size_t argc = 4;
    napi_value argv[4];
    NAPI(napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr));
    void* raw;
    NAPI(napi_get_value_external(env, argv[0], &raw));
    Program& p = *static_cast<Program*>(raw);
    size_t ns;
    const double* syms = typed_data<double>(env, argv[1], &ns);
    if (static_cast<int>(ns) != p.nsym) fail("CPU_INTERNAL", "symbol count");
    w = new RunWork(p);
    Run& run = w->run;
    bind_shapes(p, run, syms);
    run.ptr.assign(p.vals.size(), nullptr);
    run.row_of.clear();
    run.rows.clear();
    napi_ref pr;
    NAPI(napi_create_reference(env, argv[0], 1, &pr));
    w->pins.push_back(pr);
    uint32_t nin;
    NAPI(napi_get_array_length(env, argv[2], &nin));
    if (static_cast<int>(nin) != p.ninputs) fail("CPU_INTERNAL", "input count");
    std::vector<void*> inptr(nin);
    std::vector<size_t> inbytes(nin);
    // Per input given as an array of per-row Float32Arrays: its rows' data and bytes.
    std::vector<std::vector<std::pair<const float*, size_t>>> inrows(nin);
    std::vector<uint8_t> is_rows(nin, 0);
    for (uint32_t j = 0; j < nin; j++) {
      napi_value e;
      NAPI(napi_get_element(env, argv[2], j, &e));
      bool arr = false;
      NAPI(napi_is_array(env, e, &arr));
      if (!arr) {
        inptr[j] = any_typed_data(env, e, &inbytes[j]);
        continue;
      }
      if (p.row_ok[j] == 0) fail("RT_BAD_VALUE", "input " + std::to_string(j) + " cannot be given per row (only a position-major cache operand of cached attention can)");
      is_rows[j] = 1;
      uint32_t n;
      NAPI(napi_get_array_length(env, e, &n));
      for (uint32_t b = 0; b < n; b++) {
        napi_value rv;
        NAPI(napi_get_element(env, e, b, &rv));
        bool ta = false;
        NAPI(napi_is_typedarray(env, rv, &ta));
        napi_typedarray_type t = napi_int8_array;
        if (ta) {
          size_t len, off;
          void* data;
          napi_value ab;
          NAPI(napi_get_typedarray_info(env, rv, &t, &len, &data, &ab, &off));
          if (t == napi_float32_array) {
            inrows[j].emplace_back(static_cast<const float*>(data), len * 4);
            continue;
          }
        }
        fail("RT_BAD_VALUE", "input " + std::to_string(j) + " row " + std::to_string(b) + " is not a Float32Array");
      }
    }
    // The array pins its typed arrays (and their buffers) until the run completes.
    napi_ref inr;
    NAPI(napi_create_reference(env, argv[2], 1, &inr));
    w->pins.push_back(inr);
    napi_value outs, bufs, shapes;
    NAPI(napi_create_array_with_length(env, 2, &outs));
    std::vector<double> shape_flat;
    for (size_t v = 0; v < p.vals.size(); v++) {
      const Val& val = p.vals[v];
      const size_t bytes = dtype_bytes(val.dtype) * static_cast<size_t>(numel(run.shapes[v]));
      if (val.storage == ST_INPUT && is_rows[static_cast<size_t>(val.index)] != 0) {
        // [B, S, h, d]: B rows, each holding its first ≤ S positions of h·d floats.
        const auto& sh = run.shapes[v];
        const auto& rs = inrows[static_cast<size_t>(val.index)];
        if (static_cast<i64>(rs.size()) != sh[0]) fail("RT_BAD_VALUE", "input " + std::to_string(val.index) + " has " + std::to_string(rs.size()) + " rows, its shape " + shape_str(sh) + " needs " + std::to_string(sh[0]));
        const size_t pos_bytes = 4 * static_cast<size_t>(sh[2] * sh[3]);
        if (run.row_of.size() != p.vals.size()) run.row_of.assign(p.vals.size(), -1);
        run.row_of[v] = static_cast<int>(run.rows.size());
        RowInput ri;
        for (const auto& [ptr, nb] : rs) {
          if (pos_bytes == 0 || nb % pos_bytes != 0 || static_cast<i64>(nb / pos_bytes) > sh[1])
            fail("RT_BAD_VALUE", "input " + std::to_string(val.index) + ": a row of " + std::to_string(nb) + " bytes is not whole positions of " + std::to_string(pos_bytes) + " bytes, at most " + std::to_string(sh[1]) + " (shape " + shape_str(sh) + ")");
          ri.p.push_back(ptr);
          ri.len.push_back(static_cast<i64>(nb / pos_bytes));
        }
        run.rows.push_back(std::move(ri));
        run.ptr[v] = nullptr;
      } else if (val.storage == ST_INPUT) {
        if (inbytes[static_cast<size_t>(val.index)] < bytes)
          fail("RT_BAD_VALUE", "input " + std::to_string(val.index) + " holds " + std::to_string(inbytes[static_cast<size_t>(val.index)]) + " bytes, its shape " + shape_str(run.shapes[v]) + " needs " + std::to_string(bytes));
        run.ptr[v] = inptr[static_cast<size_t>(val.index)];
      } else if (val.storage == ST_PARAM) {
        if (p.param_bytes[static_cast<size_t>(val.index)] < bytes) fail("RT_BAD_VALUE", "a parameter is smaller than its shape " + shape_str(run.shapes[v]));
        run.ptr[v] = p.params[static_cast<size_t>(val.index)];
      }
    }
    // Every output in one buffer (each at a 64-byte aligned offset): one allocation per run for
    // the garbage collector to account, however many outputs (a decode step has 2 per layer).
    std::vector<size_t> at(static_cast<size_t>(p.noutputs));
    size_t total = 0;
    for (int o = 0; o < p.noutputs; o++) {
      const int v = p.output_vals[static_cast<size_t>(o)];
      const size_t bytes = dtype_bytes(p.vals[v].dtype) * static_cast<size_t>(numel(run.shapes[v]));
      at[static_cast<size_t>(o)] = total;
      total += (bytes + 63) & ~static_cast<size_t>(63);
    }
    void* base = nullptr;
    napi_value ab = nullptr;
    bool is_ab = false;
    if (argc > 3) NAPI(napi_is_arraybuffer(env, argv[3], &is_ab));
    if (is_ab) {
      void* rb;
      size_t rn;
      NAPI(napi_get_arraybuffer_info(env, argv[3], &rb, &rn));
      bool clear = rb != nullptr && rn >= std::max<size_t>(total, 1);
      const char* rp = static_cast<const char*>(rb);
      const auto overlaps = [&](const void* ptr, size_t nb) {
        const char* ip = static_cast<const char*>(ptr);
        return ip < rp + rn && rp < ip + nb;
      };
      for (uint32_t j = 0; j < nin && clear; j++) {
        if (overlaps(inptr[j], inbytes[j])) clear = false;
        for (const auto& [ptr, nb] : inrows[j])
          if (overlaps(ptr, nb)) clear = false;
      }
      if (clear) {
        base = rb;
        ab = argv[3];
      }
    }
    if (ab == nullptr) NAPI(napi_create_arraybuffer(env, std::max<size_t>(total, 1), &base, &ab));
    bufs = ab;
    for (int o = 0; o < p.noutputs; o++) {
      const int v = p.output_vals[static_cast<size_t>(o)];
      run.ptr[v] = static_cast<char*>(base) + at[static_cast<size_t>(o)];
      shape_flat.push_back(static_cast<double>(at[static_cast<size_t>(o)]));
      shape_flat.push_back(static_cast<double>(run.shapes[v].size()));
      for (i64 d : run.shapes[v]) shape_flat.push_back(static_cast<double>(d));
    }
    {
      void* sd;
      napi_value sab;
      NAPI(napi_create_arraybuffer(env, shape_flat.size() * 8, &sd, &sab));
      if (!shape_flat.empty()) std::memcpy(sd, shape_flat.data(), shape_flat.size() * 8);
      NAPI(napi_create_typedarray(env, napi_float64_array, shape_flat.size(), sab, 0, &shapes));
    }
    NAPI(napi_set_element(env, outs, 0, bufs));
    NAPI(napi_set_element(env, outs, 1, shapes));
    NAPI(napi_create_reference(env, outs, 1, &w->outs_ref));
    napi_value promise, name;
    NAPI(napi_create_promise(env, &w->deferred, &promise));
    NAPI(napi_create_string_utf8(env, "stageml-cpu-run", NAPI_AUTO_LENGTH, &name));
    NAPI(napi_create_async_work(env, nullptr, name, run_execute, run_complete, w, &w->work));
    NAPI(napi_queue_async_work(env, w->work));
    return promise;
  } catch (const Fail& f) {
    if (w != nullptr) {
      for (napi_ref r : w->pins) napi_delete_reference(env, r);
      if (w->outs_ref != nullptr) napi_delete_reference(env, w->outs_ref);
      delete w;
    }
    throw_js(env, f);
    return nullptr;
  }
}

// rowInputs(program) → Int32Array: the inputs a run may give per row (an array of Float32Arrays,
// one per batch row, instead of one typed array): those read only as ATTENTION_KV caches.
napi_value js_row_inputs(napi_env env, napi_callback_info info) {
  try {
    size_t argc = 1;
    napi_value argv[1];
    NAPI(napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr));
    void* raw;
    NAPI(napi_get_value_external(env, argv[0], &raw));
    const Program& p = *static_cast<Program*>(raw);
    std::vector<int32_t> ok;
    for (size_t k = 0; k < p.row_ok.size(); k++)
      if (p.row_ok[k] != 0) ok.push_back(static_cast<int32_t>(k));
    void* d;
    napi_value ab, out;
    NAPI(napi_create_arraybuffer(env, ok.size() * 4, &d, &ab));
    if (!ok.empty()) std::memcpy(d, ok.data(), ok.size() * 4);
    NAPI(napi_create_typedarray(env, napi_int32_array, ok.size(), ab, 0, &out));
    return out;
  } catch (const Fail& f) {
    throw_js(env, f);
    return nullptr;
  }
}

// threads(n): resizes the pool (between runs only); n ≤ 0 only reports its size.
napi_value js_threads(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr);
  int32_t n = 1;
  napi_get_value_int32(env, argv[0], &n);
  std::lock_guard<std::mutex> lk(g_run_mutex);
  if (n <= 0) {
    napi_value r;
    napi_create_int32(env, pool().size(), &r);
    return r;
  }
  if (!g_pool || g_pool->size() != n) {
    g_pool.reset();
    g_pool = std::make_unique<Pool>(std::max(1, std::min(n, 256)));
  }
  napi_value r;
  napi_create_int32(env, g_pool->size(), &r);
  return r;
}

// isa() → the instruction set the kernels were built for.
napi_value js_isa(napi_env env, napi_callback_info) {
  napi_value isa;
#if defined(SML_VNNI)
  napi_create_string_utf8(env, "avx512-vnni", NAPI_AUTO_LENGTH, &isa);
#elif defined(SML_AVX512)
  napi_create_string_utf8(env, "avx512", NAPI_AUTO_LENGTH, &isa);
#elif defined(__AVX2__) && defined(__FMA__)
  napi_create_string_utf8(env, "avx2", NAPI_AUTO_LENGTH, &isa);
#else
  napi_create_string_utf8(env, "generic", NAPI_AUTO_LENGTH, &isa);
#endif
  return isa;
}

// profile(on: boolean) → JSON {key: [runs, ns]} of the instructions run since the last call
// (see g_profile), and turns profiling on or off for the next runs.
napi_value js_profile(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr);
  bool on = false;
  if (argc > 0) napi_get_value_bool(env, argv[0], &on);
  std::string json = "{";
  {
    std::lock_guard<std::mutex> lk(g_run_mutex);
    for (const auto& [k, v] : g_profile_stats) json += (json.size() > 1 ? ",\"" : "\"") + k + "\":[" + std::to_string(v.first) + "," + std::to_string(v.second) + "]";
    g_profile_stats.clear();
    g_profile = on;
  }
  json += "}";
  napi_value out;
  napi_create_string_utf8(env, json.c_str(), json.size(), &out);
  return out;
}

// Index of the first maximum of x[0, n): the first entry no later entry exceeds (ties the lowest
// index; a NaN never exceeds, and a NaN at x[0] is never exceeded) — the rule of `firstMaxIndex`
// in src/executor.ts, which a greedy pick follows everywhere. Two passes over the row (it is in
// cache, just written by the run): the largest non-NaN value, then its first index.
i64 first_max_index(const float* x, i64 n) {
  if (n <= 1 || std::isnan(x[0])) return 0;
#ifdef SML_AVX512
  // max_ps(v, acc) returns acc where v is NaN: NaNs never enter the maximum.
  __m512 acc = _mm512_set1_ps(x[0]);
  i64 i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(_mm512_loadu_ps(x + i), acc);
  if (i < n) acc = _mm512_mask_max_ps(acc, tail_mask(n - i), _mm512_maskz_loadu_ps(tail_mask(n - i), x + i), acc);
  const float m = _mm512_reduce_max_ps(acc);
  const __m512 mv = _mm512_set1_ps(m);
  for (i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __mmask16 eq = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, x + i), mv, _CMP_EQ_OQ);
    if (eq != 0) return i + __builtin_ctz(eq);
  }
  return 0;
#else
  i64 best = 0;
  float bv = x[0];
  for (i64 i = 1; i < n; i++)
    if (x[i] > bv) {
      best = i;
      bv = x[i];
    }
  return best;
#endif
}

// argmax(x: Float32Array, n) → Float64Array: per row of n entries (x.length / n rows), the index
// of its first maximum (first_max_index). A greedy pick from a step's logits, made here instead of
// in a JavaScript loop over the vocabulary (`RunOptions.argmax`).
napi_value js_argmax(napi_env env, napi_callback_info info) {
  try {
    size_t argc = 2;
    napi_value argv[2];
    NAPI(napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr));
    if (argc < 2) fail("RT_BAD_VALUE", "argmax(x, n) takes a Float32Array and a row length");
    bool is;
    NAPI(napi_is_typedarray(env, argv[0], &is));
    napi_typedarray_type t = napi_int8_array;
    size_t len = 0;
    void* data = nullptr;
    napi_value ab;
    size_t off;
    if (is) NAPI(napi_get_typedarray_info(env, argv[0], &t, &len, &data, &ab, &off));
    if (!is || t != napi_float32_array) fail("RT_BAD_VALUE", "argmax: x must be a Float32Array");
    double nd = 0;
    NAPI(napi_get_value_double(env, argv[1], &nd));
    const i64 n = static_cast<i64>(nd);
    if (!(nd >= 1) || static_cast<double>(n) != nd || len % static_cast<size_t>(n) != 0) fail("RT_BAD_VALUE", "argmax: the row length must be a positive integer dividing the array's length");
    const i64 rows = static_cast<i64>(len) / n;
    const float* x = static_cast<const float*>(data);
    void* od;
    napi_value oab, out;
    NAPI(napi_create_arraybuffer(env, static_cast<size_t>(rows) * 8, &od, &oab));
    double* o = static_cast<double*>(od);
    for (i64 r = 0; r < rows; r++) o[r] = static_cast<double>(first_max_index(x + r * n, n));
    NAPI(napi_create_typedarray(env, napi_float64_array, static_cast<size_t>(rows), oab, 0, &out));
    return out;
  } catch (const Fail& f) {
    throw_js(env, f);
    return nullptr;
  }
}

// abi() → the runner's ABI version (kAbi).
napi_value js_abi(napi_env env, napi_callback_info) {
  napi_value v;
  napi_create_int32(env, kAbi, &v);
  return v;
}

// Best-of-`reps` seconds of one pass of `f(begin, end)` over [0, n) split across the pool.
double best_pass(i64 n, int reps, const std::function<void(i64, i64)>& f) {
  double best = 1e30;
  for (int i = 0; i < reps; i++) {
    const auto t0 = std::chrono::steady_clock::now();
    pool().parallel(n, f, false, 1);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// bandwidth(bytes, reps) → [read GB/s, copy GB/s]: a STREAM-like probe of this machine's memory on
// the engine's pool (its threads, as threads(n) set them). `read` sums a `bytes` f32 array (the
// decode step's access: weights streamed once, nothing written); `copy` copies one `bytes` array
// into another (counted as 2·bytes moved, as STREAM counts it). Best of `reps` passes after one
// warm pass that faults the pages in; `bytes` should be several times the last-level cache.
napi_value js_bandwidth(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr);
  double bytes = 0;
  int32_t reps = 1;
  napi_get_value_double(env, argv[0], &bytes);
  if (argc > 1) napi_get_value_int32(env, argv[1], &reps);
  const i64 n = std::max<i64>(1 << 16, static_cast<i64>(bytes / 4)) & ~static_cast<i64>(15);
  reps = std::max(1, std::min(reps, 1000));
  std::lock_guard<std::mutex> lk(g_run_mutex);
  std::vector<float> a(static_cast<size_t>(n), 1.0f), c(static_cast<size_t>(n), 0.0f);
  const i64 chunks = std::max<i64>(pool().size() * 16, n / (1 << 16));
  std::vector<double> sums(static_cast<size_t>(chunks), 0.0);
  auto read = [&](i64 c0, i64 c1) {
    for (i64 ci = c0; ci < c1; ci++) {
      const i64 b = n * ci / chunks, e = n * (ci + 1) / chunks;
#ifdef SML_AVX512
      __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
      i64 i = b;
      for (; i + 64 <= e; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(a.data() + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(a.data() + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(a.data() + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(a.data() + i + 48));
      }
      float tail = 0;
      for (; i < e; i++) tail += a[static_cast<size_t>(i)];
      sums[static_cast<size_t>(ci)] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3))) + tail;
#else
      float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      i64 i = b;
      for (; i + 8 <= e; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[static_cast<size_t>(i + j)];
      for (; i < e; i++) s[0] += a[static_cast<size_t>(i)];
      sums[static_cast<size_t>(ci)] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
#endif
    }
  };
  auto copy = [&](i64 c0, i64 c1) {
    const i64 b = n * c0 / chunks, e = n * c1 / chunks;
    std::memcpy(c.data() + b, a.data() + b, sizeof(float) * static_cast<size_t>(e - b));
  };
  best_pass(chunks, 1, read);
  best_pass(chunks, 1, copy);
  const double tr = best_pass(chunks, reps, read), tc = best_pass(chunks, reps, copy);
  double check = 0;
  for (double v : sums) check += v;
  napi_value out, v;
  napi_create_array_with_length(env, 3, &out);
  napi_create_double(env, static_cast<double>(n) * 4 / tr / 1e9, &v);
  napi_set_element(env, out, 0, v);
  napi_create_double(env, static_cast<double>(n) * 8 / tc / 1e9, &v);
  napi_set_element(env, out, 1, v);
  napi_create_double(env, check + c[static_cast<size_t>(n - 1)], &v);  // keeps the passes observable
  napi_set_element(env, out, 2, v);
  return out;
}

// fma_peak(reps) → f32 GFLOP/s of the pool's threads (as threads(n) set them) running nothing but
// independent multiply-adds in registers (12 chains of 16 lanes a thread: enough to cover the FMA
// latency on two ports): the compute ceiling a GEMM is held against, measured as the pool runs now
// (a busy machine lowers it). Best of `reps` passes of 2²² steps a thread (about 10 ms).
napi_value js_fma_peak(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  napi_get_cb_info(env, info, &argc, argv, nullptr, nullptr);
  int32_t reps = 5;
  if (argc > 0) napi_get_value_int32(env, argv[0], &reps);
  reps = std::max(1, std::min(reps, 1000));
  std::lock_guard<std::mutex> lk(g_run_mutex);
  constexpr i64 kSteps = i64{1} << 22;
  const i64 parts = pool().size();
  std::vector<float> sink(static_cast<size_t>(parts), 0.0f);
  auto f = [&](i64 p0, i64 p1) {
    for (i64 part = p0; part < p1; part++) {
#ifdef SML_AVX512
      __m512 a[12];
      for (int c = 0; c < 12; c++) a[c] = _mm512_set1_ps(static_cast<float>(c + part) * 1e-3f);
      const __m512 b = _mm512_set1_ps(0.999f), d = _mm512_set1_ps(1e-4f);
      for (i64 s = 0; s < kSteps; s++) {
        for (int c = 0; c < 12; c++) a[c] = _mm512_fmadd_ps(a[c], b, d);
        // NOTE: an empty asm with the chains as operands keeps the compiler from folding steps.
        __asm__ volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]), "+v"(a[5]), "+v"(a[6]), "+v"(a[7]), "+v"(a[8]), "+v"(a[9]), "+v"(a[10]), "+v"(a[11]));
      }
      __m512 s = a[0];
      for (int c = 1; c < 12; c++) s = _mm512_add_ps(s, a[c]);
      sink[static_cast<size_t>(part)] = _mm512_reduce_add_ps(s);
#else
      float a[12][16];
      for (int c = 0; c < 12; c++)
        for (int l = 0; l < 16; l++) a[c][l] = static_cast<float>(c + l + part) * 1e-3f;
      for (i64 s = 0; s < kSteps; s++) {
        for (int c = 0; c < 12; c++)
          for (int l = 0; l < 16; l++) a[c][l] = a[c][l] * 0.999f + 1e-4f;
        __asm__ volatile("" : : "r"(&a[0][0]) : "memory");
      }
      float s = 0.0f;
      for (int c = 0; c < 12; c++)
        for (int l = 0; l < 16; l++) s += a[c][l];
      sink[static_cast<size_t>(part)] = s;
#endif
    }
  };
  const double t = best_pass(parts, reps, f);
  napi_value v;
  napi_create_double(env, static_cast<double>(parts) * static_cast<double>(kSteps) * 12 * 16 * 2 / t / 1e9 + 0.0 * sink[0], &v);
  return v;
}

// NOTE: glibc raises its mmap threshold to the size of every mmapped block freed (up to 32 MiB on
// 64-bit), and from then on blocks up to that size come from the heap, whose free holes stay
// resident. A serving process frees such blocks all the time (adapter files read and parsed, KV
// buffers grown by doubling, step outputs of several MB), so its RSS crept up to ~0.5 GB above
// what it held (bench/serving, issue 38). Fixing the threshold at glibc's initial 128 KiB keeps
// large blocks mmapped, returned to the system when freed. A threshold the user set
// (MALLOC_MMAP_THRESHOLD_, or GLIBC_TUNABLES naming glibc.malloc) is left alone.
void pin_mmap_threshold() {
#if defined(__GLIBC__)
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr) return;
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.mmap_threshold") != nullptr) return;
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
}

napi_value init(napi_env env, napi_value exports) {
  pin_mmap_threshold();
  napi_property_descriptor props[] = {
      {"compile", nullptr, js_compile, nullptr, nullptr, nullptr, napi_default, nullptr},
      {"run", nullptr, js_run, nullptr, nullptr, nullptr, napi_default, nullptr},
      {"rowInputs", nullptr, js_row_inputs, nullptr, nullptr, nullptr, napi_default, nullptr},
      {"threads", nullptr, js_threads, nullptr, nullptr, nullptr, napi_default, nullptr},
      {"isa", nullptr, js_isa, nullptr, nullptr, nullptr, napi_default, nullptr},
      {"abi", nullptr, js_abi, nullptr, nullptr, nullptr, napi_default, nullptr},
      {"profile", nullptr, js_profile, nullptr, nullptr, nullptr, napi_default, nullptr},
      {"bandwidth", nullptr, js_bandwidth, nullptr, nullptr, nullptr, napi_default, nullptr},
      {"fmaPeak", nullptr, js_fma_peak, nullptr, nullptr, nullptr, napi_default, nullptr},
      {"argmax", nullptr, js_argmax, nullptr, nullptr, nullptr, napi_default, nullptr},
  };
  napi_define_properties(env, exports, sizeof(props) / sizeof(props[0]), props);
  return exports;
}

}  // namespace

NAPI_MODULE(stageml_cpu, init)
