// Convolution and max pooling over a rulebook (mmcv's indice_conv_forward / backward and
// indice_maxpool_forward / backward): per kernel offset, gather the rows its pairs read, multiply by
// that offset's (Cin, Cout) filter, scatter-add into the rows they write. Within one offset each
// row appears at most once on either side (checked), so a scatter is split across threads there.
#include <algorithm>
#include <cstring>
#include <vector>

#include "sparse_conv_kernel.h"
#include "sparse_conv_variants.h"

namespace opbridge {
namespace {

constexpr int64_t kBlock = 256;  // pairs per task

// The rulebook as read by the kernels: pairs (K, 2, L), counts (K,).
struct Rulebook {
  const int32_t* pairs = nullptr;
  const int32_t* num = nullptr;
  int64_t kernel_volume = 0, width = 0;
  const int32_t* side(int64_t k, int64_t s) const { return pairs + (k * 2 + s) * width; }
};

// Checks the counts and every pair (rows within range, no row twice on one side of an offset), so
// a malformed rulebook is an error rather than a read out of bounds or a race.
Rulebook read_rulebook(const TensorView& indice_pairs, const TensorView& indice_pair_num, int64_t rows0,
                       int64_t rows1, const char* what0, const char* what1) {
  Rulebook r;
  r.kernel_volume = indice_pairs.dim(0);
  r.width = indice_pairs.dim(2);
  r.pairs = indice_pairs.data_as<int32_t>();
  r.num = indice_pair_num.data_as<int32_t>();
  std::vector<int32_t> seen0(static_cast<size_t>(rows0), -1), seen1(static_cast<size_t>(rows1), -1);
  for (int64_t k = 0; k < r.kernel_volume; ++k) {
    OB_CHECK(r.num[k] >= 0 && r.num[k] <= r.width, "indice_pair_num[", k, "] = ", r.num[k], " is outside [0, ",
             r.width, "] (indice_pairs.shape[2])");
    const int32_t* a = r.side(k, 0);
    const int32_t* b = r.side(k, 1);
    for (int64_t i = 0; i < r.num[k]; ++i) {
      OB_CHECK(a[i] >= 0 && a[i] < rows0, "indice_pairs[", k, ", 0, ", i, "] = ", a[i], " is outside the ", rows0,
               " rows of ", what0);
      OB_CHECK(b[i] >= 0 && b[i] < rows1, "indice_pairs[", k, ", 1, ", i, "] = ", b[i], " is outside the ", rows1,
               " rows of ", what1);
      OB_CHECK(seen0[a[i]] != k && seen1[b[i]] != k, "indice_pairs[", k, "] names row ",
               seen0[a[i]] == k ? a[i] : b[i], " twice on one side: not a rulebook");
      seen0[a[i]] = static_cast<int32_t>(k);
      seen1[b[i]] = static_cast<int32_t>(k);
    }
  }
  return r;
}

// An offset whose pairs are (i, i) for every row (a submanifold convolution's centre): no gather.
bool is_identity(const Rulebook& r, int64_t k, int64_t rows_in, int64_t rows_out) {
  if (r.num[k] != rows_in || rows_in != rows_out) return false;
  const int32_t* a = r.side(k, 0);
  const int32_t* b = r.side(k, 1);
  for (int64_t i = 0; i < rows_in; ++i)
    if (a[i] != i || b[i] != i) return false;
  return true;
}

// out[to[i]] += x[from[i]] @ w for the pairs of one offset (w: (cin, cout) row-major), split
// across threads (each row of `to` appears once within an offset).
template <typename T>
void offset_product(KernelContext& ctx, const T* x, const T* w, T* out, const int32_t* from, const int32_t* to,
                    int64_t n, int64_t cin, int64_t cout, bool identity) {
  const auto& kernels = sparse_conv_impl::kernels<T>(sparse_conv_impl::best_variant());
  ctx.parallel_for(n, kBlock, [&](int64_t b, int64_t e) {
    kernels.gather_gemm_scatter(identity ? x + b * cin : x, identity ? nullptr : from + b, w,
                                identity ? out + b * cout : out, identity ? nullptr : to + b, e - b, cin, cout);
  });
}

template <typename T>
void conv_forward(KernelContext& ctx, const TensorView& features, const TensorView& filters, const Rulebook& r,
                  int from_side, TensorView& output) {
  const int64_t cin = features.dim(1), cout = output.dim(1), rows_out = output.dim(0);
  const T* x = features.data_as<T>();
  const T* w = filters.data_as<T>();
  T* out = output.data_as<T>();
  ctx.parallel_for(rows_out * cout, 1 << 16, [&](int64_t b, int64_t e) { std::fill(out + b, out + e, T(0)); });
  for (int64_t k = 0; k < r.kernel_volume; ++k) {
    if (r.num[k] == 0) continue;
    offset_product(ctx, x, w + k * cin * cout, out, r.side(k, from_side), r.side(k, 1 - from_side), r.num[k], cin,
                   cout, is_identity(r, k, features.dim(0), rows_out));
  }
}

template <typename T>
void conv_backward(KernelContext& ctx, const TensorView& grad_output, const TensorView& features,
                   const TensorView& filters, const Rulebook& r, int from_side, TensorView& grad_features,
                   TensorView& grad_filters) {
  const int64_t cin = features.dim(1), cout = grad_output.dim(1), rows_in = features.dim(0);
  const T* x = features.data_as<T>();
  const T* w = filters.data_as<T>();
  const T* go = grad_output.data_as<T>();
  T* gx = grad_features.data_as<T>();
  T* gw = grad_filters.data_as<T>();
  ctx.parallel_for(rows_in * cin, 1 << 16, [&](int64_t b, int64_t e) { std::fill(gx + b, gx + e, T(0)); });
  // grad_features: the forward's product with each offset's filter transposed, pairs reversed.
  std::vector<T> wt(static_cast<size_t>(cin * cout));
  for (int64_t k = 0; k < r.kernel_volume; ++k) {
    if (r.num[k] == 0) continue;
    const T* wk = w + k * cin * cout;
    for (int64_t i = 0; i < cin; ++i)
      for (int64_t j = 0; j < cout; ++j) wt[j * cin + i] = wk[i * cout + j];
    offset_product(ctx, go, wt.data(), gx, r.side(k, 1 - from_side), r.side(k, from_side), r.num[k], cout, cin,
                   is_identity(r, k, rows_in, grad_output.dim(0)));
  }
  // grad_filters[k] = x[from]^T @ grad_output[to]: the offsets are independent.
  const auto& kernels = sparse_conv_impl::kernels<T>(sparse_conv_impl::best_variant());
  ctx.parallel_for(r.kernel_volume, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      T* gwk = gw + k * cin * cout;
      std::fill(gwk, gwk + cin * cout, T(0));
      kernels.weight_grad(x, r.side(k, from_side), go, r.side(k, 1 - from_side), gwk, r.num[k], cin, cout);
    }
  });
}

int64_t kernel_volume_of(const TensorView& filters) {
  OB_CHECK(filters.rank() >= 3, "filters must be (*kernel_size, Cin, Cout), got rank ", filters.rank());
  int64_t kv = 1;
  for (int64_t a = 0; a + 2 < filters.rank(); ++a) kv *= filters.dim(a);
  return kv;
}

}  // namespace

void sparse_indice_conv_kernel(KernelContext& ctx, const TensorView& features, const TensorView& filters,
                               const TensorView& indice_pairs, const TensorView& indice_pair_num,
                               const TensorView& out_indices, bool inverse, TensorView& output) {
  (void)out_indices;  // its row count is the output's (the shape rule)
  const int64_t kv = kernel_volume_of(filters);
  OB_CHECK(indice_pairs.dim(0) == kv, "indice_pairs has ", indice_pairs.dim(0), " kernel offsets, filters ", kv,
           " (prod(filters.shape[:-2]))");
  // Side 0 of a pair is the convolution's input row, side 1 its output row; an inverse
  // convolution runs its couple's rulebook backwards.
  const int from = inverse ? 1 : 0;
  const Rulebook r = read_rulebook(indice_pairs, indice_pair_num, inverse ? output.dim(0) : features.dim(0),
                                   inverse ? features.dim(0) : output.dim(0), inverse ? "the output" : "features",
                                   inverse ? "features" : "the output");
  visit_dtype<float, double>(features.dtype, [&](auto zero) {
    conv_forward<decltype(zero)>(ctx, features, filters, r, from, output);
  });
}

void sparse_indice_conv_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& features,
                                        const TensorView& filters, const TensorView& indice_pairs,
                                        const TensorView& indice_pair_num, bool inverse, TensorView& grad_features,
                                        TensorView& grad_filters) {
  const int64_t kv = kernel_volume_of(filters);
  OB_CHECK(indice_pairs.dim(0) == kv, "indice_pairs has ", indice_pairs.dim(0), " kernel offsets, filters ", kv,
           " (prod(filters.shape[:-2]))");
  const int from = inverse ? 1 : 0;
  const Rulebook r = read_rulebook(indice_pairs, indice_pair_num, inverse ? grad_output.dim(0) : features.dim(0),
                                   inverse ? features.dim(0) : grad_output.dim(0),
                                   inverse ? "grad_output" : "features", inverse ? "features" : "grad_output");
  visit_dtype<float, double>(features.dtype, [&](auto zero) {
    conv_backward<decltype(zero)>(ctx, grad_output, features, filters, r, from, grad_features, grad_filters);
  });
}

namespace {
// Zeroes `out` (n values), then calls pair(input row, output row) for every pair, offset after
// offset, each offset's pairs split across threads (no row twice on one side of an offset).
template <typename T, typename Pair>
void zero_then_each_pair(KernelContext& ctx, const Rulebook& r, T* out, int64_t n, Pair pair) {
  ctx.parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) { std::fill(out + b, out + e, T(0)); });
  for (int64_t k = 0; k < r.kernel_volume; ++k) {
    const int32_t* from = r.side(k, 0);
    const int32_t* to = r.side(k, 1);
    ctx.parallel_for(r.num[k], 256, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) pair(from[i], to[i]);
    });
  }
}
}  // namespace

void sparse_indice_maxpool_kernel(KernelContext& ctx, const TensorView& features, const TensorView& indice_pairs,
                                  const TensorView& indice_pair_num, const TensorView& out_indices,
                                  TensorView& output) {
  (void)out_indices;
  const Rulebook r = read_rulebook(indice_pairs, indice_pair_num, features.dim(0), output.dim(0), "features",
                                   "the output");
  const int64_t c = features.dim(1);
  visit_dtype<float, double>(features.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* x = features.data_as<T>();
    T* out = output.data_as<T>();
    // mmcv starts every output at 0: the result is max(0, the inputs it covers); NaN never wins.
    zero_then_each_pair(ctx, r, out, output.numel(), [&](int32_t from, int32_t to) {
      const T* s = x + from * c;
      T* d = out + to * c;
      for (int64_t j = 0; j < c; ++j) d[j] = d[j] < s[j] ? s[j] : d[j];
    });
  });
}

void sparse_indice_maxpool_backward_kernel(KernelContext& ctx, const TensorView& grad_output,
                                           const TensorView& features, const TensorView& output,
                                           const TensorView& indice_pairs, const TensorView& indice_pair_num,
                                           TensorView& grad_features) {
  const Rulebook r = read_rulebook(indice_pairs, indice_pair_num, features.dim(0), output.dim(0), "features",
                                   "output");
  const int64_t c = features.dim(1);
  visit_dtype<float, double>(features.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* x = features.data_as<T>();
    const T* y = output.data_as<T>();
    const T* go = grad_output.data_as<T>();
    T* gx = grad_features.data_as<T>();
    // Every input equal to its output's maximum takes that output's gradient (mmcv's rule: ties share).
    zero_then_each_pair(ctx, r, gx, grad_features.numel(), [&](int32_t from, int32_t to) {
      const T* s = x + from * c;
      const T* m = y + to * c;
      const T* g = go + to * c;
      T* d = gx + from * c;
      for (int64_t j = 0; j < c; ++j)
        if (m[j] == s[j]) d[j] += g[j];
    });
  });
}

}  // namespace opbridge
