// torch_scatter's reductions over groups of rows (segment_reduce_kernel.h). Each segment's rows are
// visited in increasing row order, as torch_scatter's CPU kernels visit them: sums and means add
// in that order (in float32 for the 16-bit types, rounded once), min and max keep the first row of
// a tie (strict comparisons, so NaN never wins) starting from the type's largest finite value.
#include "segment_reduce_kernel.h"

#include <opbridge/segments.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace opbridge::segment {
namespace {

// The largest finite value of T, where torch_scatter's min starts (max starts at its negative).
template <typename T>
compute_t<T> largest() {
  if constexpr (std::is_same_v<T, Float16>) return 65504.0f;
  else if constexpr (std::is_same_v<T, BFloat16>) return 3.38953139e38f;
  else return std::numeric_limits<T>::max();
}

template <typename T>
void reduce_typed(KernelContext& ctx, const TensorView& src, const Groups& g, Reduce op, Untouched untouched,
                  TensorView& out, TensorView* arg) {
  using C = compute_t<T>;
  const int64_t segments = static_cast<int64_t>(g.begin.size()) - 1, f = src.dim(1), n = src.dim(0);
  const T* s = src.data_as<T>();
  T* o = out.data_as<T>();
  int64_t* a = arg ? arg->data_as<int64_t>() : nullptr;
  const bool extremum = op == Reduce::Min || op == Reduce::Max;
  const C start = op == Reduce::Max ? -largest<T>() : largest<T>();
  if (segments == 0 || f == 0) return;  // nothing to write (and n may be huge when f is 0)
  const int64_t work = std::max<int64_t>(1, (n + 1) * f / segments);  // rows·f fits: src is in memory
  // Columns in blocks: the per-task accumulators stay small however wide a row is.
  const int64_t block = std::min<int64_t>(f, 4096);
  ctx.parallel_for(segments, std::max<int64_t>(1, (64 << 10) / work), [&](int64_t lo, int64_t hi) {
    std::vector<C> acc(static_cast<size_t>(block));
    std::vector<int64_t> at(static_cast<size_t>(block));
    for (int64_t seg = lo; seg < hi; ++seg) {
      const int64_t b = g.begin[seg], e = g.begin[seg + 1], count = e - b;
      if (count == 0) {  // an empty segment is 0 for every reduction (all-zero bits in every T)
        std::memset(o + seg * f, 0, static_cast<size_t>(f) * sizeof(T));
        if (a) std::fill(a + seg * f, a + (seg + 1) * f, n);
        continue;
      }
      for (int64_t c0 = 0; c0 < f; c0 += block) {
        const int64_t w = std::min(block, f - c0);
        std::fill(acc.begin(), acc.begin() + w, extremum ? start : C(0));
        std::fill(at.begin(), at.begin() + w, n);
        for (int64_t i = b; i < e; ++i) {
          const int64_t r = g.row(i);
          const T* row = s + r * f + c0;
          if (!extremum) {
            for (int64_t c = 0; c < w; ++c) acc[c] += widen(row[c]);
          } else if (op == Reduce::Max) {
            for (int64_t c = 0; c < w; ++c) {
              const C v = widen(row[c]);
              if (v > acc[c]) acc[c] = v, at[c] = r;
            }
          } else {
            for (int64_t c = 0; c < w; ++c) {
              const C v = widen(row[c]);
              if (v < acc[c]) acc[c] = v, at[c] = r;
            }
          }
        }
        for (int64_t c = 0; c < w; ++c) {
          C v = acc[c];
          if (op == Reduce::Mean) v = v / static_cast<C>(count > 0 ? count : 1);
          // An empty segment is 0; one whose values never beat the start keeps it (segment_csr) or
          // is 0 (scatter), as torch_scatter writes them.
          if (extremum && (count == 0 || (at[c] == n && untouched == Untouched::Zero))) v = C(0);
          o[seg * f + c0 + c] = narrow<T>(v);
          if (a) a[seg * f + c0 + c] = at[c];
        }
      }
    }
  });
}

template <typename T>
void backward_typed(KernelContext& ctx, const TensorView& grad_out, const TensorView& src, const Groups& g, Reduce op,
                    const int64_t* arg, TensorView& grad_src) {
  using C = compute_t<T>;
  const int64_t segments = static_cast<int64_t>(g.begin.size()) - 1, f = src.dim(1), n = src.dim(0);
  const T* go = grad_out.data_as<T>();
  T* gs = grad_src.data_as<T>();
  std::fill(gs, gs + n * f, narrow<T>(C(0)));  // rows of no segment, and rows min/max did not pick
  // No gradient to place; f may be huge when there are no rows, and n when there are no columns.
  if (segments == 0 || f == 0) return;
  if (op == Reduce::Sum || op == Reduce::Mean) {
    ctx.parallel_for(segments, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t seg = lo; seg < hi; ++seg) {  // a row is in one segment: no two tasks write it
        const int64_t b = g.begin[seg], e = g.begin[seg + 1];
        const T* grow = go + seg * f;
        const C count = static_cast<C>(e - b > 0 ? e - b : 1);
        for (int64_t i = b; i < e; ++i) {
          T* row = gs + g.row(i) * f;
          for (int64_t c = 0; c < f; ++c) row[c] = op == Reduce::Sum ? grow[c] : narrow<T>(widen(grow[c]) / count);
        }
      }
    });
    return;
  }
  // Min/max: each value's gradient goes to the row arg names. The forward's picks name a row once,
  // but an arg given to the backward may name one twice: the gradients then add up. Tasks split the
  // columns and walk the segments in order, so the sums do not depend on the threads.
  ctx.parallel_for(f, std::max<int64_t>(1, 4096 / std::max<int64_t>(segments, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t seg = 0; seg < segments; ++seg)
      for (int64_t c = lo; c < hi; ++c) {
        const int64_t r = arg[seg * f + c];
        if (r < n) gs[r * f + c] = narrow<T>(widen(gs[r * f + c]) + widen(go[seg * f + c]));
      }
  });
}

template <typename I>
std::vector<int64_t> values(const TensorView& t) {
  const I* p = t.data_as<I>();
  return std::vector<int64_t>(p, p + t.numel());
}

std::vector<int64_t> read_indices(const TensorView& t) {
  std::vector<int64_t> v;
  visit_dtype<int32_t, int64_t>(t.dtype, [&](auto zero) { v = values<decltype(zero)>(t); });
  return v;
}

}  // namespace

Reduce parse(const std::string& name, bool arg_only) {
  if (!arg_only && (name == "sum" || name == "add")) return Reduce::Sum;
  if (!arg_only && name == "mean") return Reduce::Mean;
  if (name == "min") return Reduce::Min;
  if (name == "max") return Reduce::Max;
  throw Error(detail::concat("reduce must be ", arg_only ? "\"min\" or \"max\"" : "\"sum\", \"mean\", \"min\" or \"max\"",
                             ", got \"", name, "\""));
}

Groups csr_groups(const TensorView& indptr, int64_t src_rows) {
  Groups g;
  g.begin = read_indices(indptr);
  for (size_t i = 0; i < g.begin.size(); ++i) {
    OB_CHECK(g.begin[i] >= 0 && g.begin[i] <= src_rows, "indptr[", i, "] = ", g.begin[i], " is not a row boundary of src (",
             src_rows, " rows)");
    OB_CHECK(i == 0 || g.begin[i] >= g.begin[i - 1], "indptr must be non-decreasing, but indptr[", i - 1, "] = ",
             g.begin[i - 1], " > indptr[", i, "] = ", g.begin[i]);
  }
  return g;
}

Groups scatter_groups(const TensorView& index, int64_t dim_size) {
  const std::vector<int64_t> idx = read_indices(index);
  Groups g;
  g.begin.assign(static_cast<size_t>(dim_size) + 1, 0);
  for (size_t r = 0; r < idx.size(); ++r) {
    OB_CHECK(idx[r] >= 0 && idx[r] < dim_size, "index[", r, "] = ", idx[r], " is outside [0, dim_size = ", dim_size, ")");
    ++g.begin[idx[r] + 1];
  }
  for (int64_t s = 0; s < dim_size; ++s) g.begin[s + 1] += g.begin[s];
  g.rows.resize(idx.size());
  std::vector<int64_t> fill(g.begin.begin(), g.begin.end() - 1);
  for (size_t r = 0; r < idx.size(); ++r) g.rows[fill[idx[r]]++] = static_cast<int64_t>(r);  // stable: rows in order
  return g;
}

Groups coo_groups(const TensorView& index, int64_t dim_size) {
  // A sorted index is a batch vector: checked by the rule every op that takes one shares.
  const std::vector<int64_t> idx = batch_vector(index, "index");
  Groups g;
  g.begin.assign(static_cast<size_t>(dim_size) + 1, 0);
  for (size_t r = 0; r < idx.size(); ++r) {
    OB_CHECK(idx[r] < dim_size, "index[", r, "] = ", idx[r], " is outside [0, dim_size = ", dim_size, ")");
    ++g.begin[idx[r] + 1];
  }
  for (int64_t s = 0; s < dim_size; ++s) g.begin[s + 1] += g.begin[s];  // rows stay the identity
  return g;
}

void reduce(KernelContext& ctx, const TensorView& src, const Groups& groups, Reduce op, Untouched untouched,
            TensorView& out, TensorView* arg) {
  visit_dtype<float, double, Float16, BFloat16>(src.dtype, [&](auto zero) {
    reduce_typed<decltype(zero)>(ctx, src, groups, op, untouched, out, arg);
  });
}

void backward(KernelContext& ctx, const TensorView& grad_out, const TensorView& src, const Groups& groups, Reduce op,
              const TensorView* arg, TensorView& grad_src) {
  const int64_t* picked = arg ? arg->data_as<int64_t>() : nullptr;
  for (int64_t i = 0; picked && i < arg->numel(); ++i)  // n: the sentinel of a value no row gave
    OB_CHECK(picked[i] >= 0 && picked[i] <= src.dim(0), "arg[", i / arg->dim(1), ", ", i % arg->dim(1), "] = ",
             picked[i], " is not a row of src (", src.dim(0), " rows) nor the empty marker ", src.dim(0));
  std::vector<int64_t> recomputed;
  if (!picked && (op == Reduce::Min || op == Reduce::Max)) {  // the forward's picks, again
    const int64_t segments = static_cast<int64_t>(groups.begin.size()) - 1, f = src.dim(1);
    recomputed.resize(static_cast<size_t>(segments * f));
    std::vector<std::byte> values(static_cast<size_t>(segments * f) * dtype_size(src.dtype));
    TensorView out{values.data(), src.dtype, {segments, f}, {f, 1}}, at{recomputed.data(), DType::Int64, {segments, f}, {f, 1}};
    reduce(ctx, src, groups, op, Untouched::KeepStart, out, &at);
    picked = recomputed.data();
  }
  visit_dtype<float, double, Float16, BFloat16>(src.dtype, [&](auto zero) {
    backward_typed<decltype(zero)>(ctx, grad_out, src, groups, op, picked, grad_src);
  });
}

}  // namespace opbridge::segment
