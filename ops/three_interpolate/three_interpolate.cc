// three_interpolate: pointnet2_ops' feature interpolation from three neighbours (the upsampling of
// PointNet++'s feature propagation): out[b, c, j] = Σ_t features[b, c, idx[b, j, t]] · weight[b, j, t],
// summed in order ((f0·w0 + f1·w1) + f2·w2). Differentiable in features and weight (pointnet2_ops
// gives the weights no gradient; in PointNet++ they come from three_nn's distances, which are not
// differentiated, so training sees the same gradients).
#include <opbridge/op.h>

namespace opbridge {
namespace {

// idx as int64 row indices, each checked to be a row of features (the original reads past them).
std::vector<int64_t> checked_indices(const TensorView& idx, int64_t m) {
  std::vector<int64_t> out(static_cast<size_t>(idx.numel()));
  visit_dtype<int32_t, int64_t>(idx.dtype, [&](auto zero) {
    const auto* p = idx.data_as<decltype(zero)>();
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = static_cast<int64_t>(p[i]);
      OB_CHECK(out[i] >= 0 && out[i] < m, "idx[", i / 3 / idx.dim(1), ", ", i / 3 % idx.dim(1), ", ", i % 3, "] = ",
               out[i], " is not an index of features' ", m, " points");
    }
  });
  return out;
}

void three_interpolate_kernel(KernelContext& ctx, const TensorView& features, const TensorView& idx_t,
                              const TensorView& weight, TensorView& out) {
  const int64_t b = features.dim(0), c = features.dim(1), m = features.dim(2), n = idx_t.dim(1);
  const std::vector<int64_t> idx = checked_indices(idx_t, m);
  visit_dtype<float, double, Float16, BFloat16>(features.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* f = features.data_as<T>();
    const T* w = weight.data_as<T>();
    T* o = out.data_as<T>();
    ctx.parallel_for(b * c, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t row = lo; row < hi; ++row) {  // one channel of one batch item
        const int64_t bi = row / c;
        const T* fr = f + row * m;
        const int64_t* ir = idx.data() + bi * n * 3;
        const T* wr = w + bi * n * 3;
        for (int64_t j = 0; j < n; ++j)
          o[row * n + j] = narrow<T>(widen(fr[ir[j * 3]]) * widen(wr[j * 3]) + widen(fr[ir[j * 3 + 1]]) * widen(wr[j * 3 + 1]) +
                                     widen(fr[ir[j * 3 + 2]]) * widen(wr[j * 3 + 2]));
      }
    });
  });
}

// d out[b, c, j] / d features[b, c, idx[b, j, t]] = weight[b, j, t]: each channel's gradient row
// gathers its contributions in order of j (one task per channel of a batch item: no two write one
// value). d out[b, c, j] / d weight[b, j, t] = features[b, c, idx[b, j, t]], summed over c in order.
// Both in the compute type, rounded once.
void three_interpolate_backward_kernel(KernelContext& ctx, const TensorView& grad_out, const TensorView& features,
                                       const TensorView& idx_t, const TensorView& weight, TensorView& grad_features,
                                       TensorView& grad_weight) {
  const int64_t b = features.dim(0), c = features.dim(1), m = features.dim(2), n = idx_t.dim(1);
  const std::vector<int64_t> idx = checked_indices(idx_t, m);
  visit_dtype<float, double, Float16, BFloat16>(features.dtype, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* g = grad_out.data_as<T>();
    const T* f = features.data_as<T>();
    const T* w = weight.data_as<T>();
    T* gf = grad_features.data_as<T>();
    T* gw = grad_weight.data_as<T>();
    ctx.parallel_for(b * c, 1, [&](int64_t lo, int64_t hi) {
      std::vector<C> acc(static_cast<size_t>(m));
      for (int64_t row = lo; row < hi; ++row) {
        const int64_t bi = row / c;
        std::fill(acc.begin(), acc.end(), C(0));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t t = 0; t < 3; ++t)
            acc[idx[(bi * n + j) * 3 + t]] += widen(g[row * n + j]) * widen(w[(bi * n + j) * 3 + t]);
        for (int64_t i = 0; i < m; ++i) gf[row * m + i] = narrow<T>(acc[i]);
      }
    });
    ctx.parallel_for(b * n, 256, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {  // one point of one batch item
        const int64_t bi = r / n, j = r % n;
        for (int64_t t = 0; t < 3; ++t) {
          C sum = C(0);
          for (int64_t ch = 0; ch < c; ++ch)
            sum += widen(g[(bi * c + ch) * n + j]) * widen(f[(bi * c + ch) * m + idx[r * 3 + t]]);
          gw[r * 3 + t] = narrow<T>(sum);
        }
      }
    });
  });
}

// What the op and its backward check alike.
void shapes(OpBuilder& op) {
  op.check(dim("idx", 0) == dim("features", 0), "idx must have the batch size of features")
      .check(dim("idx", 2) == 3, "idx must be (B, n, 3)")
      .check(dim("weight", 0) == dim("idx", 0), "weight must have idx's shape")
      .check(dim("weight", 1) == dim("idx", 1), "weight must have idx's shape")
      .check(dim("weight", 2) == 3, "weight must have idx's shape");
}

}  // namespace

OPBRIDGE_OP(three_interpolate_backward)
    .doc("The gradients of three_interpolate with respect to features and weight (idx gets none).")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .types("I", {DType::Int32, DType::Int64})
    .input("grad_out", "T", "(B, c, n) gradient of out", 3)
    .input("features", "T", "the forward's features (their shape is read)", 3)
    .input("idx", "I", "the forward's indices", 3)
    .input("weight", "T", "the forward's weights", 3)
    .with(shapes)
    .check(dim("grad_out", 0) == dim("features", 0), "grad_out must have the batch size of features")
    .check(dim("grad_out", 1) == dim("features", 1), "grad_out must have the channels of features")
    .check(dim("grad_out", 2) == dim("idx", 1), "grad_out must have a column per row of idx")
    .output("grad_features", "T", shape::same({"features"}), "(B, c, m)")
    .output("grad_weight", "T", shape::same({"weight"}), "(B, n, 3)")
    .cpu(three_interpolate_backward_kernel);

OPBRIDGE_OP(three_interpolate)
    .doc("Interpolates features at n points from three known points each (pointnet2_ops' three_interpolate): "
         "out[b, c, j] = sum over t of features[b, c, idx[b, j, t]] * weight[b, j, t].")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .types("I", {DType::Int32, DType::Int64})
    .input("features", "T", "(B, c, m) features of the known points", 3)
    .input("idx", "I", "(B, n, 3) the three known points of each point (three_nn)", 3)
    .input("weight", "T", "(B, n, 3) their weights", 3)
    .with(shapes)
    .output("out", "T", shape::dims({dim("features", 0), dim("features", 1), dim("idx", 1)}), "(B, c, n)")
    .cpu(three_interpolate_kernel)
    .backward("three_interpolate_backward")
    // ThreeInterpolate.forward(ctx, features, idx, weight)
    .replaces("pointnet2_ops.pointnet2_utils.ThreeInterpolate", {"features", "idx", "weight"})
    .replaces("openpoints.models.layers.upsampling.ThreeInterpolate", {"features", "idx", "weight"})
    .replaces("mmcv.ops.three_interpolate.ThreeInterpolate", {"features", "idx", "weight"});

}  // namespace opbridge
