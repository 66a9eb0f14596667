// StageML custom ops for PyTorch, backed by kernels generated with `stageml gen cuda`.
//
// Every generated translation unit exports its kernels (stageml_abi.h: StagemlKernel) through one
// entry function, and native/build.py links a list of those functions; the ops below validate their tensors, look
// up the generated kernel for the operands' dtype and static dims, and launch it on the current
// stream. A launcher returns the first failing CUDA call or the launch's cudaGetLastError, which
// becomes a Python RuntimeError here. An op with no generated kernel for its shapes fails with a
// message naming the registered kernels: it never falls back to another implementation. The
// registry itself is readable through the C function stageml_kernels_json (native/build.py).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "stageml_abi.h"

namespace {

// Defined in the registry unit native/build.py writes: the entry functions of every generated unit.
extern "C" int32_t stageml_generated_units(const StagemlKernelsFn** units);

// Every generated kernel, collected once on first use by calling each unit's entry function.
const std::vector<const StagemlKernel*>& registry() {
  static const std::vector<const StagemlKernel*> kernels = [] {
    std::vector<const StagemlKernel*> all;
    const StagemlKernelsFn* units = nullptr;
    const int32_t n = stageml_generated_units(&units);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t count = units[i](nullptr, 0);
      const size_t base = all.size();
      all.resize(base + static_cast<size_t>(count));
      units[i](all.data() + base, count);
    }
    return all;
  }();
  return kernels;
}

const char* kind_name(int32_t kind) {
  switch (kind) {
    case STAGEML_LINEAR: return "linear";
    case STAGEML_SHRINK: return "shrink";
    case STAGEML_EXPAND: return "expand";
    case STAGEML_MOE: return "moe";
    default: return "?";
  }
}

std::string list_kernels() {
  std::ostringstream s;
  s << "[";
  bool first = true;
  for (const StagemlKernel* k : registry()) {
    s << (first ? "" : ", ") << "{\"name\": \"" << k->name << "\", \"kind\": \"" << kind_name(k->kind) << "\", \"dtype\": \""
      << (k->dtype == STAGEML_BF16 ? "bf16" : "f16") << "\", \"k\": " << k->k << ", \"n\": " << k->n << ", \"rank\": " << k->rank
      << ", \"rank_pad\": " << k->rank_pad << ", \"experts\": " << k->experts << ", \"block_m\": " << k->block_m << "}";
    first = false;
  }
  s << "]";
  return s.str();
}

int32_t dtype_code(const at::Tensor& t) {
  if (t.scalar_type() == at::kBFloat16) return STAGEML_BF16;
  TORCH_CHECK(t.scalar_type() == at::kHalf, "stageml: tensors must be float16 or bfloat16, got ", t.scalar_type());
  return STAGEML_F16;
}

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, c10::IntArrayRef shape) {
  TORCH_CHECK(t.is_cuda(), "stageml: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), "stageml: ", name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == dtype, "stageml: ", name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.sizes() == shape, "stageml: ", name, " must have shape ", shape, ", got ", t.sizes());
}

template <typename Pred>
const StagemlKernel* find(int32_t kind, int32_t dtype, Pred pred, const std::string& what) {
  const StagemlKernel* best = nullptr;
  for (const StagemlKernel* k : registry()) {
    if (k->kind == kind && k->dtype == dtype && pred(*k) && (best == nullptr || k->rank_pad < best->rank_pad)) best = k;
  }
  TORCH_CHECK(best != nullptr, "stageml: no generated ", kind_name(kind), " kernel for ", what,
              "; generate one with `stageml gen cuda` for a bundle with these shapes. Registered: ", list_kernels());
  return best;
}

void launch(const StagemlKernel* k, const void* args, const at::Tensor& on) {
  const c10::cuda::CUDAGuard guard(on.device());
  const cudaError_t err = k->launch(args, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "stageml: kernel ", k->name, " failed: ", cudaGetErrorString(err));
}

StagemlRows rows_of(const at::Tensor& order, const at::Tensor& group, const at::Tensor& row0, const at::Tensor& nrows, int64_t block_m) {
  const int64_t blocks = nrows.numel();
  check_tensor(group, "group", at::kInt, {blocks});
  check_tensor(row0, "row0", at::kInt, {blocks});
  check_tensor(nrows, "nrows", at::kInt, {blocks});
  check_tensor(order, "order", at::kInt, {order.numel()});
  return StagemlRows{order.data_ptr<int32_t>(), group.data_ptr<int32_t>(), row0.data_ptr<int32_t>(), nrows.data_ptr<int32_t>(),
                     static_cast<int32_t>(blocks), static_cast<int32_t>(block_m)};
}

at::Tensor rows2d(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1, "stageml: x must have at least one dim");
  return x.reshape({-1, x.size(-1)}).contiguous();
}

at::Tensor out_like(const at::Tensor& x, const at::Tensor& x2, int64_t n) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  return at::empty({x2.size(0), n}, x2.options()).view(shape);
}

// The [M, N] view of a caller's output tensor (the .out overloads), checked.
at::Tensor out_rows(const at::Tensor& out, const at::Tensor& x2, int64_t n) {
  TORCH_CHECK(out.is_contiguous() && out.numel() == x2.size(0) * n && out.size(-1) == n && out.scalar_type() == x2.scalar_type(),
              "stageml: out must be a contiguous ", x2.scalar_type(), " tensor of ", x2.size(0), " rows of ", n);
  return out.view({x2.size(0), n});
}

// y = x·Wᵀ (+ bias) (+ scale·(x·Aᵀ)·Bᵀ); mode 0: by rows (pair from 1024 rows on), 1: fused, 2: pair.
at::Tensor linear_impl(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& a, const c10::optional<at::Tensor>& b,
                       double scale, const c10::optional<at::Tensor>& bias, int64_t mode, const c10::optional<at::Tensor>& out) {
  const at::Tensor x2 = rows2d(x);
  const auto dt = x2.scalar_type();
  const int32_t code = dtype_code(x2);
  const int64_t m = x2.size(0), k = x2.size(1), n = w.size(0);
  check_tensor(x2, "x", dt, {m, k});
  check_tensor(w, "w", dt, {n, k});
  if (bias.has_value()) check_tensor(*bias, "bias", dt, {n});
  const bool lora = a.has_value();
  int64_t r = 0;
  if (lora) {
    TORCH_CHECK(b.has_value(), "stageml: a and b go together");
    r = a->size(0);
    check_tensor(*a, "a", dt, {r, k});
    check_tensor(*b, "b", dt, {n, r});
  }
  TORCH_CHECK(mode >= 0 && mode <= 2, "stageml: mode must be 0 (auto), 1 (fused) or 2 (pair)");
  const StagemlKernel* kern = find(
      STAGEML_LINEAR, code, [&](const StagemlKernel& e) { return e.k == k && e.n == n && (!lora || e.rank == r); },
      "K=" + std::to_string(k) + ", N=" + std::to_string(n) + (lora ? ", r=" + std::to_string(r) : ""));
  at::Tensor y = out.has_value() ? out_rows(*out, x2, n) : out_like(x, x2, n);
  const int32_t run_mode = !lora ? 0 : mode == 0 ? (m >= 1024 ? 2 : 1) : static_cast<int32_t>(mode);
  at::Tensor t;
  int32_t split = 1;
  if (run_mode == 2) {
    const int64_t blocks = (m + 15) / 16;
    split = static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(8, 264 / std::max<int64_t>(1, blocks))));
    t = at::empty({split, m, kern->rank_pad}, x2.options().dtype(at::kFloat));
  }
  const StagemlLinearArgs args{x2.data_ptr(), w.data_ptr(), lora ? a->data_ptr() : nullptr, lora ? b->data_ptr() : nullptr,
                               bias.has_value() ? bias->data_ptr() : nullptr, y.data_ptr(), run_mode == 2 ? t.data_ptr<float>() : nullptr,
                               m, run_mode, split, static_cast<float>(scale)};
  launch(kern, &args, x2);
  return y;
}

at::Tensor linear_op(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  return linear_impl(x, w, c10::nullopt, c10::nullopt, 1.0, bias, 0, c10::nullopt);
}

at::Tensor& linear_out_op(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, at::Tensor& out) {
  linear_impl(x, w, c10::nullopt, c10::nullopt, 1.0, bias, 0, out);
  return out;
}

at::Tensor lora_linear_op(const at::Tensor& x, const at::Tensor& w, const at::Tensor& a, const at::Tensor& b, double scale,
                          const c10::optional<at::Tensor>& bias, int64_t mode) {
  return linear_impl(x, w, a, b, scale, bias, mode, c10::nullopt);
}

at::Tensor& lora_linear_out_op(const at::Tensor& x, const at::Tensor& w, const at::Tensor& a, const at::Tensor& b, double scale,
                               const c10::optional<at::Tensor>& bias, int64_t mode, at::Tensor& out) {
  linear_impl(x, w, a, b, scale, bias, mode, out);
  return out;
}

at::Tensor lora_shrink_op(const at::Tensor& x, const at::Tensor& a, const at::Tensor& offset, const at::Tensor& rank, const at::Tensor& order,
                          const at::Tensor& group, const at::Tensor& row0, const at::Tensor& nrows, int64_t block_m, int64_t max_rank,
                          int64_t split) {
  const at::Tensor x2 = rows2d(x);
  const int32_t code = dtype_code(x2);
  const int64_t m = x2.size(0), k = x2.size(1);
  check_tensor(a, "a", x2.scalar_type(), {a.size(0), k});
  check_tensor(offset, "offset", at::kLong, {offset.numel()});
  check_tensor(rank, "rank", at::kInt, {offset.numel()});
  TORCH_CHECK(split >= 1, "stageml: split must be positive");
  const StagemlRows rows = rows_of(order, group, row0, nrows, block_m);
  const StagemlKernel* kern = find(
      STAGEML_SHRINK, code, [&](const StagemlKernel& e) { return e.k == k && e.rank_pad >= max_rank && e.block_m == block_m; },
      "K=" + std::to_string(k) + ", rank<=" + std::to_string(max_rank) + ", block_m=" + std::to_string(block_m));
  at::Tensor t = at::empty({split, m, kern->rank_pad}, x2.options().dtype(at::kFloat));
  const StagemlShrinkArgs args{x2.data_ptr(), a.data_ptr(), offset.data_ptr<int64_t>(), rank.data_ptr<int32_t>(), rows, t.data_ptr<float>(), m,
                               static_cast<int32_t>(split)};
  launch(kern, &args, x2);
  return t;
}

void lora_expand_op(const at::Tensor& y, const at::Tensor& t, const at::Tensor& b, const at::Tensor& offset, const at::Tensor& rank,
                    const at::Tensor& scale, const at::Tensor& order, const at::Tensor& group, const at::Tensor& row0, const at::Tensor& nrows,
                    int64_t block_m, int64_t max_rank) {
  const int32_t code = dtype_code(y);
  TORCH_CHECK(y.dim() == 2, "stageml: y must be [M, N]");
  const int64_t m = y.size(0), n = y.size(1);
  check_tensor(y, "y", y.scalar_type(), {m, n});
  check_tensor(b, "b", y.scalar_type(), {b.numel()});
  check_tensor(offset, "offset", at::kLong, {offset.numel()});
  check_tensor(rank, "rank", at::kInt, {offset.numel()});
  check_tensor(scale, "scale", at::kFloat, {offset.numel()});
  TORCH_CHECK(t.dim() == 3 && t.size(1) == m, "stageml: t must be [split, M, rank_pad]");
  const StagemlRows rows = rows_of(order, group, row0, nrows, block_m);
  const StagemlKernel* kern = find(
      STAGEML_EXPAND, code, [&](const StagemlKernel& e) { return e.n == n && e.rank_pad == t.size(2) && e.rank_pad >= max_rank && e.block_m == block_m; },
      "N=" + std::to_string(n) + ", rank_pad=" + std::to_string(t.size(2)) + ", block_m=" + std::to_string(block_m));
  check_tensor(t, "t", at::kFloat, {t.size(0), m, kern->rank_pad});
  const StagemlExpandArgs args{t.data_ptr<float>(), b.data_ptr(), offset.data_ptr<int64_t>(), rank.data_ptr<int32_t>(), scale.data_ptr<float>(),
                               rows, y.data_ptr(), m, static_cast<int32_t>(t.size(0))};
  launch(kern, &args, y);
}

at::Tensor moe_impl(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& a, const c10::optional<at::Tensor>& b,
                    double scale, const at::Tensor& order, const at::Tensor& group, const at::Tensor& row0, const at::Tensor& nrows,
                    int64_t block_m, const c10::optional<at::Tensor>& out) {
  const at::Tensor x2 = rows2d(x);
  const auto dt = x2.scalar_type();
  const int32_t code = dtype_code(x2);
  const int64_t m = x2.size(0), k = x2.size(1), e = w.size(0), n = w.size(1);
  check_tensor(w, "w", dt, {e, n, k});
  int64_t r = 0;
  if (a.has_value()) {
    TORCH_CHECK(b.has_value(), "stageml: a and b go together");
    r = a->size(1);
    check_tensor(*a, "a", dt, {e, r, k});
    check_tensor(*b, "b", dt, {e, n, r});
  }
  const StagemlRows rows = rows_of(order, group, row0, nrows, block_m);
  const StagemlKernel* kern = find(
      STAGEML_MOE, code, [&](const StagemlKernel& ke) { return ke.k == k && ke.n == n && ke.experts == e && ke.rank == r && ke.block_m == block_m; },
      "K=" + std::to_string(k) + ", N=" + std::to_string(n) + ", E=" + std::to_string(e) + ", r=" + std::to_string(r) + ", block_m=" + std::to_string(block_m));
  at::Tensor y = out.has_value() ? out_rows(*out, x2, n) : at::empty({m, n}, x2.options());
  const StagemlMoeArgs args{x2.data_ptr(), w.data_ptr(), r > 0 ? a->data_ptr() : nullptr, r > 0 ? b->data_ptr() : nullptr, rows, y.data_ptr(), m,
                            static_cast<float>(scale)};
  launch(kern, &args, x2);
  return y;
}

at::Tensor residual_moe_op(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& a, const c10::optional<at::Tensor>& b,
                           double scale, const at::Tensor& order, const at::Tensor& group, const at::Tensor& row0, const at::Tensor& nrows,
                           int64_t block_m) {
  return moe_impl(x, w, a, b, scale, order, group, row0, nrows, block_m, c10::nullopt);
}

at::Tensor& residual_moe_out_op(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& a, const c10::optional<at::Tensor>& b,
                                double scale, const at::Tensor& order, const at::Tensor& group, const at::Tensor& row0, const at::Tensor& nrows,
                                int64_t block_m, at::Tensor& out) {
  moe_impl(x, w, a, b, scale, order, group, row0, nrows, block_m, out);
  return out;
}

}  // namespace

// The registered kernels as JSON, for tools (ctypes): writes at most `size` bytes including the
// terminating NUL and returns the full length, so a caller can retry with a larger buffer.
extern "C" size_t stageml_kernels_json(char* buffer, size_t size) {
  const std::string s = list_kernels();
  if (buffer != nullptr && size > 0) {
    const size_t n = std::min(size - 1, s.size());
    std::copy(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n), buffer);
    buffer[n] = '\0';
  }
  return s.size() + 1;
}

TORCH_LIBRARY(stageml, m) {
  m.def("linear(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.def("linear.out(Tensor x, Tensor w, Tensor? bias=None, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("lora_linear(Tensor x, Tensor w, Tensor a, Tensor b, float scale, Tensor? bias=None, int mode=0) -> Tensor");
  m.def("lora_linear.out(Tensor x, Tensor w, Tensor a, Tensor b, float scale, Tensor? bias=None, int mode=0, *, Tensor(a!) out) -> Tensor(a!)");
  m.def(
      "lora_shrink(Tensor x, Tensor a, Tensor offset, Tensor rank, Tensor order, Tensor group, Tensor row0, Tensor nrows, int block_m, "
      "int max_rank, int split) -> Tensor");
  m.def(
      "lora_expand(Tensor(a!) y, Tensor t, Tensor b, Tensor offset, Tensor rank, Tensor scale, Tensor order, Tensor group, Tensor row0, "
      "Tensor nrows, int block_m, int max_rank) -> ()");
  m.def(
      "residual_moe(Tensor x, Tensor w, Tensor? a, Tensor? b, float scale, Tensor order, Tensor group, Tensor row0, Tensor nrows, "
      "int block_m) -> Tensor");
  m.def(
      "residual_moe.out(Tensor x, Tensor w, Tensor? a, Tensor? b, float scale, Tensor order, Tensor group, Tensor row0, Tensor nrows, "
      "int block_m, *, Tensor(a!) out) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(stageml, CUDA, m) {
  m.impl("linear", &linear_op);
  m.impl("linear.out", &linear_out_op);
  m.impl("lora_linear", &lora_linear_op);
  m.impl("lora_linear.out", &lora_linear_out_op);
  m.impl("lora_shrink", &lora_shrink_op);
  m.impl("lora_expand", &lora_expand_op);
  m.impl("residual_moe", &residual_moe_op);
  m.impl("residual_moe.out", &residual_moe_out_op);
}
