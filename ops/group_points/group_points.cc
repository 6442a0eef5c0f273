// PointNet++'s gathering and grouping of features by point index (pointnet2_ops'
// gather_operation and grouping_operation), channels first:
//   gather_points   features (B, C, N), idx (B, M)     -> (B, C, M)     out[b, c, j] = features[b, c, idx[b, j]]
//   group_points    features (B, C, N), idx (B, M, K)  -> (B, C, M, K)  the same over idx's M·K entries
// with their gradients (a sum per source point, in index order: no atomics). The standard export
// of the same indexing (Expand + GatherElements) runs about as fast in ONNX Runtime; the ops exist
// so that model code calling the originals' Functions is substituted by one definition each.
#include <opbridge/op.h>

namespace opbridge {
namespace {

// idx as int64 point indices, each checked to be a point of features (the originals read past).
std::vector<int64_t> checked_indices(const TensorView& idx, int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(idx.numel()));
  const int64_t per_item = idx.dim(0) > 0 ? idx.numel() / idx.dim(0) : 0;
  visit_dtype<int32_t, int64_t>(idx.dtype, [&](auto zero) {
    const auto* p = idx.data_as<decltype(zero)>();
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = static_cast<int64_t>(p[i]);
      if (out[i] < 0 || out[i] >= n) {
        const int64_t b = static_cast<int64_t>(i) / per_item, at = static_cast<int64_t>(i) % per_item;
        OB_CHECK(false, "idx[", b, "] entry ", at, " (row-major) = ", out[i], " is not an index of features' ", n,
                 " points");
      }
    }
  });
  return out;
}

// out[b, c, j] = features[b, c, idx[b, j]] for the idx's per_item entries of each batch item.
void gather_kernel(KernelContext& ctx, const TensorView& features, const TensorView& idx_t, TensorView& out) {
  const int64_t b = features.dim(0), c = features.dim(1), n = features.dim(2);
  if (out.numel() == 0) return;  // nothing to write (idx may be read past n; b·c rows of nothing may be 2^40)
  const std::vector<int64_t> idx = checked_indices(idx_t, n);
  const int64_t per_item = static_cast<int64_t>(idx.size()) / b;
  visit_dtype<float, double, Float16, BFloat16>(features.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* f = features.data_as<T>();
    T* o = out.data_as<T>();
    ctx.parallel_for(b * c, std::max<int64_t>(1, 16384 / std::max<int64_t>(per_item, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row) {  // one channel of one batch item: a row of features
        const T* src = f + row * n;
        const int64_t* ir = idx.data() + row / c * per_item;
        T* dst = o + row * per_item;
        for (int64_t j = 0; j < per_item; ++j) dst[j] = src[ir[j]];
      }
    });
  });
}

// grad_features[b, c, i] = Σ over j with idx[b, j] = i of grad[b, c, j], in order of j, in the
// compute type and rounded once; one task per row, so no two write one value.
void gather_backward_kernel(KernelContext& ctx, const TensorView& grad, const TensorView& features,
                            const TensorView& idx_t, TensorView& grad_features) {
  const int64_t b = features.dim(0), c = features.dim(1), n = features.dim(2);
  if (b == 0 || c == 0 || n == 0) return;
  const std::vector<int64_t> idx = checked_indices(idx_t, n);
  const int64_t per_item = static_cast<int64_t>(idx.size()) / b;
  visit_dtype<float, double, Float16, BFloat16>(features.dtype, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* g = grad.data_as<T>();
    T* gf = grad_features.data_as<T>();
    ctx.parallel_for(b * c, 1, [&](int64_t lo, int64_t hi) {
      std::vector<C> acc(static_cast<size_t>(n));
      for (int64_t row = lo; row < hi; ++row) {
        std::fill(acc.begin(), acc.end(), C(0));
        const int64_t* ir = idx.data() + row / c * per_item;
        const T* gr = g + row * per_item;
        for (int64_t j = 0; j < per_item; ++j) acc[ir[j]] += widen(gr[j]);
        for (int64_t i = 0; i < n; ++i) gf[row * n + i] = narrow<T>(acc[i]);
      }
    });
  });
}

void group_points_kernel(KernelContext& ctx, const TensorView& features, const TensorView& idx, TensorView& out) {
  gather_kernel(ctx, features, idx, out);
}
void group_points_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& features,
                                  const TensorView& idx, TensorView& grad_features) {
  gather_backward_kernel(ctx, grad_output, features, idx, grad_features);
}

// The types, inputs and checks of an op and its backward; `idx_rank` 2 gathers, 3 groups.
auto inputs(int idx_rank) {
  return [idx_rank](OpBuilder& op) {
    op.types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
        .types("I", {DType::Int32, DType::Int64})
        .input("features", "T", "(B, C, N) features of each point, channels first", 3)
        .input("idx", "I", idx_rank == 2 ? "(B, M) point indices" : "(B, M, K) point indices", idx_rank)
        .check(dim("idx", 0) == dim("features", 0), "idx must have the batch size of features");
  };
}

// The backward's incoming gradient has the forward output's shape.
auto grad_of(int idx_rank) {
  return [idx_rank](OpBuilder& op) {
    op.check(dim("grad_output", 0) == dim("features", 0), "grad_output must be the forward output's shape")
        .check(dim("grad_output", 1) == dim("features", 1), "grad_output must be the forward output's shape")
        .check(dim("grad_output", 2) == dim("idx", 1), "grad_output must be the forward output's shape");
    if (idx_rank == 3)
      op.check(dim("grad_output", 3) == dim("idx", 2), "grad_output must be the forward output's shape");
  };
}

}  // namespace

OPBRIDGE_OP(gather_points_backward)
    .doc("The gradient of gather_points with respect to features (idx gets none).")
    .input("grad_output", "T", "(B, C, M) gradient of output", 3)
    .with(inputs(2))
    .with(grad_of(2))
    .output("grad_features", "T", shape::same({"features"}), "(B, C, N)")
    .cpu(group_points_backward_kernel);

OPBRIDGE_OP(gather_points)
    .doc("The features of the points idx names, per batch item (pointnet2_ops' gather_operation): "
         "output[b, c, j] = features[b, c, idx[b, j]].")
    .with(inputs(2))
    .output("output", "T", shape::dims({dim("features", 0), dim("features", 1), dim("idx", 1)}), "(B, C, M)")
    .cpu(group_points_kernel)
    .backward("gather_points_backward")
    // GatherOperation.forward(ctx, features, idx), in pointnet2_ops and openpoints' two copies.
    .replaces("pointnet2_ops.pointnet2_utils.GatherOperation", {"features", "idx"})
    .replaces("openpoints.models.layers.subsample.GatherOperation", {"features", "idx"})
    .replaces("openpoints.models.layers.group.GatherOperation", {"features", "idx"})
    .replaces("mmcv.ops.gather_points.GatherPoints", {"features", "idx"});

OPBRIDGE_OP(group_points_backward)
    .doc("The gradient of group_points with respect to features (idx gets none).")
    .input("grad_output", "T", "(B, C, M, K) gradient of output", 4)
    .with(inputs(3))
    .with(grad_of(3))
    .output("grad_features", "T", shape::same({"features"}), "(B, C, N)")
    .cpu(group_points_backward_kernel);

OPBRIDGE_OP(group_points)
    .doc("The features of each group of points idx names, per batch item (pointnet2_ops' grouping_operation): "
         "output[b, c, j, k] = features[b, c, idx[b, j, k]].")
    .with(inputs(3))
    .output("output", "T", shape::dims({dim("features", 0), dim("features", 1), dim("idx", 1), dim("idx", 2)}),
            "(B, C, M, K)")
    .cpu(group_points_kernel)
    .backward("group_points_backward")
    // GroupingOperation.forward(ctx, features, idx)
    .replaces("pointnet2_ops.pointnet2_utils.GroupingOperation", {"features", "idx"})
    .replaces("openpoints.models.layers.group.GroupingOperation", {"features", "idx"});

}  // namespace opbridge
