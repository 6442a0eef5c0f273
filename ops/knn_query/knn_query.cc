// knn_query: the k nearest points of the same batch segment for every query point, as in
// point-transformer style networks (KNNQuery). Results equal a brute-force loop bit for bit;
// the kernel (one k-d tree per segment) is in knn_query_kernel.cc. Its family, on the same tree:
// three_nn (pointnet2_ops' three nearest known points of each unknown point, batched) and
// knn_points (pytorch3d's batched kNN with squared distances and ragged lengths).
#include <algorithm>
#include <cmath>
#include <vector>

#include <opbridge/float32_copy.h>
#include <opbridge/op.h>

#include "knn_query_kernel.h"

namespace opbridge {
namespace {

// dist = |q - p|: d dist / dq = (q - p) / dist, d dist / dp = -(q - p) / dist; 0 where the
// distance is 0 (the norm's subgradient PyTorch uses too) or the slot is padding (idx -1).
// Without new_xyz the queries are the points themselves: both terms go to grad_xyz, and
// grad_new_xyz (which then has no input to belong to) stays 0. Serial over the query rows of a
// point's gradient, which several queries may share.
void knn_query_backward_kernel(KernelContext& ctx, const TensorView& grad_dist, const TensorView& xyz_in,
                               const TensorView& idx, const TensorView& dist_in, const TensorView* new_xyz_in,
                               TensorView& grad_xyz, TensorView& grad_new_xyz) {
  // 16-bit types: float32 copies in, float32 sums, rounded once into the outputs.
  const TensorView g = float32_copy(ctx, grad_dist);
  const TensorView xyz = float32_copy(ctx, xyz_in);
  const TensorView dist = float32_copy(ctx, dist_in);
  const TensorView q32 = new_xyz_in ? float32_copy(ctx, *new_xyz_in) : TensorView{};
  const TensorView* new_xyz = new_xyz_in ? &q32 : nullptr;
  const bool narrowed = is_16bit_float(grad_xyz.dtype);
  TensorView gp = narrowed ? float32_scratch(ctx, grad_xyz) : grad_xyz;
  TensorView gq = narrowed ? float32_scratch(ctx, grad_new_xyz) : grad_new_xyz;
  visit_dtype<float, double>(xyz.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* p = xyz.data_as<T>();
    const T* q = new_xyz ? new_xyz->data_as<T>() : p;
    const T* pg = g.data_as<T>();
    const T* pd = dist.data_as<T>();
    const int32_t* pi = idx.data_as<int32_t>();
    T* out_p = gp.data_as<T>();
    T* out_q = gq.data_as<T>();
    T* to_q = new_xyz ? out_q : out_p;
    std::fill(out_p, out_p + gp.numel(), T(0));
    std::fill(out_q, out_q + gq.numel(), T(0));
    const int64_t m = g.dim(0), k = g.dim(1), n = xyz.dim(0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = pi[i * k + j];
        const T d = pd[i * k + j];
        if (r < 0 || !(d > 0) || std::isinf(d)) continue;
        OB_CHECK(r < n, "idx[", i, ", ", j, "] = ", r, " is not a row of xyz (", n, " rows)");
        const T s = pg[i * k + j] / d;
        for (int a = 0; a < 3; ++a) {
          const T v = s * (q[i * 3 + a] - p[r * 3 + a]);
          to_q[i * 3 + a] += v;
          out_p[r * 3 + a] -= v;
        }
      }
  });
  if (narrowed) {
    narrow_into(ctx, gp, grad_xyz);
    narrow_into(ctx, gq, grad_new_xyz);
  }
}

// three_nn is knn_query with k = 3 on the batch items as segments, then pointnet2_ops' spelling of
// the result: indices local to the batch item, and a missing neighbour (fewer than 3 known points)
// as index 0 at distance +inf.
void three_nn_kernel(KernelContext& ctx, const TensorView& unknown, const TensorView& known, TensorView& dist,
                     TensorView& idx) {
  const int64_t b = unknown.dim(0), n = unknown.dim(1), m = known.dim(1);
  auto* ends = static_cast<int64_t*>(ctx.scratch(static_cast<size_t>(2 * b + 1) * sizeof(int64_t)));
  for (int64_t i = 0; i < b; ++i) ends[i] = (i + 1) * m, ends[b + i] = (i + 1) * n;
  const TensorView points{known.data, known.dtype, {b * m, 3}, {3, 1}}, queries{unknown.data, unknown.dtype, {b * n, 3}, {3, 1}};
  const TensorView offset{ends, DType::Int64, {b}, {1}}, new_offset{ends + b, DType::Int64, {b}, {1}};
  TensorView idx_rows{idx.data, DType::Int32, {b * n, 3}, {3, 1}}, dist_rows{dist.data, dist.dtype, {b * n, 3}, {3, 1}};
  knn_query_kernel(ctx, points, offset, &queries, &new_offset, 3, idx_rows, dist_rows, false);
  int32_t* p = idx.data_as<int32_t>();
  ctx.parallel_for(b * n, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t s = 0; s < 3; ++s) p[r * 3 + s] = p[r * 3 + s] < 0 ? 0 : static_cast<int32_t>(p[r * 3 + s] - (r / n) * m);
  });
}

// The valid rows of batch item b: lengths[b], checked to lie in [0, rows], or all rows.
std::vector<int64_t> batch_lengths(const TensorView* lengths, int64_t batch, int64_t rows, const char* name,
                                   const char* points) {
  std::vector<int64_t> out(static_cast<size_t>(batch), rows);
  if (!lengths) return out;
  for (int64_t b = 0; b < batch; ++b) {
    out[b] = lengths->dtype == DType::Int32 ? lengths->data_as<int32_t>()[b] : lengths->data_as<int64_t>()[b];
    OB_CHECK(out[b] >= 0 && out[b] <= rows, name, "[", b, "] = ", out[b], " is not a length of ", points, " (", rows,
             " points per batch item)");
  }
  return out;
}

// knn_points is knn_query on three segments per batch item b, without copying a point: its valid
// queries against its valid points, its padded points alone (no queries: no tree is built), its
// padded queries alone (no points: all padding). The segments' ends are cumulative, and so are
// these rows. Indices come back global, and become local with pytorch3d's padding (index 0,
// distance 0) for a missing neighbour or a padded query.
void knn_points_kernel(KernelContext& ctx, const TensorView& p1, const TensorView& p2, const TensorView* lengths1,
                       const TensorView* lengths2, int64_t k, TensorView& dists, TensorView& idx) {
  const int64_t b = p1.dim(0), m = p1.dim(1), n = p2.dim(1);
  if (b == 0 || m == 0 || k == 0) return;  // an empty result: nothing is sized by the batch (it may be 2^40)
  const std::vector<int64_t> len1 = batch_lengths(lengths1, b, m, "lengths1", "p1");
  const std::vector<int64_t> len2 = batch_lengths(lengths2, b, n, "lengths2", "p2");
  auto* ends = static_cast<int64_t*>(ctx.scratch(static_cast<size_t>(6 * b) * sizeof(int64_t)));
  int64_t* point_ends = ends;
  int64_t* query_ends = ends + 3 * b;
  for (int64_t i = 0; i < b; ++i) {
    point_ends[3 * i] = i * n + len2[i], point_ends[3 * i + 1] = point_ends[3 * i + 2] = (i + 1) * n;
    query_ends[3 * i] = query_ends[3 * i + 1] = i * m + len1[i], query_ends[3 * i + 2] = (i + 1) * m;
  }
  const TensorView points{p2.data, p2.dtype, {b * n, 3}, {3, 1}}, queries{p1.data, p1.dtype, {b * m, 3}, {3, 1}};
  const TensorView offset{point_ends, DType::Int64, {3 * b}, {1}}, new_offset{query_ends, DType::Int64, {3 * b}, {1}};
  auto* rows = static_cast<int32_t*>(ctx.scratch(static_cast<size_t>(b * m * k) * sizeof(int32_t)));
  TensorView idx_rows{rows, DType::Int32, {b * m, k}, {k, 1}}, dist_rows{dists.data, dists.dtype, {b * m, k}, {k, 1}};
  knn_query_kernel(ctx, points, offset, &queries, &new_offset, k, idx_rows, dist_rows, true);
  int64_t* out = idx.data_as<int64_t>();
  visit_dtype<float, double, Float16, BFloat16>(dists.dtype, [&](auto zero) {
    using T = decltype(zero);
    T* d = dists.data_as<T>();
    ctx.parallel_for(b * m, 1 << 12, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r)
        for (int64_t s = r * k; s < (r + 1) * k; ++s) {
          const bool missing = rows[s] < 0;
          out[s] = missing ? 0 : rows[s] - (r / m) * n;
          if (missing) d[s] = narrow<T>(compute_t<T>(0));
        }
    });
  });
}

// d |p1 - p2|^2 = 2 (p1 - p2) . (dp1 - dp2), over the slots that hold a neighbour: those below
// min(K, lengths2[b]) of the queries below lengths1[b] (the rest is padding, a constant).
// p1's rows are written by one task each; p2's gather from many queries of their batch item, so
// its tasks are batch items, each summing in query order.
void knn_points_backward_kernel(KernelContext& ctx, const TensorView& p1_in, const TensorView& p2_in,
                                const TensorView& idx, const TensorView& grad_in, const TensorView* lengths1,
                                const TensorView* lengths2, TensorView& grad_p1, TensorView& grad_p2) {
  const int64_t b = p1_in.dim(0), m = p1_in.dim(1), n = p2_in.dim(1), k = idx.dim(2);
  const std::vector<int64_t> len1 = batch_lengths(lengths1, b, m, "lengths1", "p1");
  const std::vector<int64_t> len2 = batch_lengths(lengths2, b, n, "lengths2", "p2");
  const int64_t* id = idx.data_as<int64_t>();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t r = i * m; r < i * m + len1[i]; ++r)
      for (int64_t s = 0; s < std::min(k, len2[i]); ++s)
        OB_CHECK(id[r * k + s] >= 0 && id[r * k + s] < len2[i], "idx[", i, ", ", r - i * m, ", ", s, "] = ",
                 id[r * k + s], " is not a point of p2's batch item ", i, " (", len2[i], " points)");
  const TensorView p1 = float32_copy(ctx, p1_in), p2 = float32_copy(ctx, p2_in), grad = float32_copy(ctx, grad_in);
  const bool narrowed = is_16bit_float(grad_p1.dtype);
  TensorView g1 = narrowed ? float32_scratch(ctx, grad_p1) : grad_p1;
  TensorView g2 = narrowed ? float32_scratch(ctx, grad_p2) : grad_p2;
  visit_dtype<float, double>(p1.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T *q = p1.data_as<T>(), *p = p2.data_as<T>(), *g = grad.data_as<T>();
    T *o1 = g1.data_as<T>(), *o2 = g2.data_as<T>();
    std::fill(o1, o1 + g1.numel(), T(0));
    std::fill(o2, o2 + g2.numel(), T(0));
    auto each_slot = [&](int64_t r, auto&& f) {  // query row r's neighbours: (slot, p2 row, 2 g (q - p))
      const int64_t i = r / m;
      if (r - i * m >= len1[i]) return;
      for (int64_t s = 0; s < std::min(k, len2[i]); ++s) {
        const int64_t j = i * n + id[r * k + s];
        const T c = T(2) * g[r * k + s];
        f(j, c * (q[r * 3] - p[j * 3]), c * (q[r * 3 + 1] - p[j * 3 + 1]), c * (q[r * 3 + 2] - p[j * 3 + 2]));
      }
    };
    ctx.parallel_for(b * m, 1 << 10, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r)
        each_slot(r, [&](int64_t, T x, T y, T z) { o1[r * 3] += x, o1[r * 3 + 1] += y, o1[r * 3 + 2] += z; });
    });
    ctx.parallel_for(b, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo * m; r < hi * m; ++r)
        each_slot(r, [&](int64_t j, T x, T y, T z) { o2[j * 3] -= x, o2[j * 3 + 1] -= y, o2[j * 3 + 2] -= z; });
    });
  });
  if (narrowed) {
    narrow_into(ctx, g1, grad_p1);
    narrow_into(ctx, g2, grad_p2);
  }
}

void point_clouds(OpBuilder& op) {
  op.types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
      .input("p1", "T", "(N, P1, 3) query points", 3)
      .input("p2", "T", "(N, P2, 3) points searched", 3)
      .check(dim("p1", 2) == 3, "p1 must be (N, P1, 3): only 3-D points are supported")
      .check(dim("p2", 2) == 3, "p2 must be (N, P2, 3): only 3-D points are supported")
      .check(dim("p2", 0) == dim("p1", 0), "p2 must have the batch size of p1");
}

// Optional inputs come last: after the ops' required inputs.
void cloud_lengths(OpBuilder& op) {
  op.types("L", {DType::Int32, DType::Int64})
      .optional_input("lengths1", "L", "(N,) the valid points of each p1[i]; default P1", 1)
      .optional_input("lengths2", "L", "(N,) the valid points of each p2[i]; default P2", 1)
      .check(dim_of_first({"lengths1", "p1"}, 0) == dim("p1", 0), "lengths1 must have one entry per batch item")
      .check(dim_of_first({"lengths2", "p1"}, 0) == dim("p1", 0), "lengths2 must have one entry per batch item");
}

ShapeRule per_query() { return shape::dims({dim("p1", 0), dim("p1", 1), attr("K")}); }

}  // namespace

OPBRIDGE_OP(knn_points_backward)
    .doc("The gradient of knn_points' squared distances with respect to p1 and p2 (idx is not differentiable).")
    .with(point_clouds)
    .types("I", {DType::Int64})
    .input("idx", "I", "(N, P1, K) the forward's indices", 3)
    .input("grad_dists", "T", "(N, P1, K) gradient of dists", 3)
    .with(cloud_lengths)
    .check(dim("idx", 0) == dim("p1", 0), "idx must be (N, P1, K)")
    .check(dim("idx", 1) == dim("p1", 1), "idx must be (N, P1, K)")
    .check(dim("grad_dists", 0) == dim("p1", 0), "grad_dists must have idx's shape")
    .check(dim("grad_dists", 1) == dim("p1", 1), "grad_dists must have idx's shape")
    .check(dim("grad_dists", 2) == dim("idx", 2), "grad_dists must have idx's shape")
    .output("grad_p1", "T", shape::same({"p1"}), "(N, P1, 3)")
    .output("grad_p2", "T", shape::same({"p2"}), "(N, P2, 3)")
    .cpu(knn_points_backward_kernel);

OPBRIDGE_OP(knn_points)
    .doc("The K nearest points of p2[i] to each point of p1[i] (pytorch3d's knn_points): squared Euclidean "
         "distances, nearest first, ties to the lower index; a missing neighbour (fewer than K points) and a "
         "padded query (beyond lengths1) are index 0 at distance 0.")
    .with(point_clouds)
    .with(cloud_lengths)
    .int_attr("K", 1, "neighbours per query, >= 1")
    .check(attr("K") >= 1, "K must be >= 1")
    .output("dists", "T", per_query(), "(N, P1, K) squared distances, nearest first")
    .output("idx", DType::Int64, per_query(), "(N, P1, K) indices into p2[i]")
    .cpu(knn_points_kernel)
    .backward("knn_points_backward");

OPBRIDGE_OP(three_nn)
    .doc("The three nearest known points of each unknown point of the same batch item (pointnet2_ops' three_nn): "
         "Euclidean distances, nearest first, ties to the lower index; a missing one (fewer than 3 known points) "
         "is index 0 at distance +inf.")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .input("unknown", "T", "(B, n, 3) points to interpolate at", 3)
    .input("known", "T", "(B, m, 3) points with features", 3)
    .check(dim("unknown", 2) == 3, "unknown must be (B, n, 3)")
    .check(dim("known", 2) == 3, "known must be (B, m, 3)")
    .check(dim("known", 0) == dim("unknown", 0), "known must have the batch size of unknown")
    .output("dist", "T", shape::dims({dim("unknown", 0), dim("unknown", 1), 3}),
            "(B, n, 3) Euclidean distances, nearest first")
    .output("idx", DType::Int32, shape::dims({dim("unknown", 0), dim("unknown", 1), 3}),
            "(B, n, 3) indices into each batch item's known points")
    .cpu(three_nn_kernel)
    // ThreeNN.forward(ctx, unknown, known) -> (sqrt of the squared distances, int32 indices)
    .replaces("pointnet2_ops.pointnet2_utils.ThreeNN", {"unknown", "known"})
    .replaces("openpoints.models.layers.upsampling.ThreeNN", {"unknown", "known"})
    .replaces("mmcv.ops.three_nn.ThreeNN", {"unknown", "known"});  // forward(ctx, target, source)

OPBRIDGE_OP(knn_query_backward)
    .doc("The gradient of knn_query's distances with respect to xyz and new_xyz (idx is not differentiable).")
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .types("I", {DType::Int32})
    .input("grad_dist", "T", "(m, k) gradient of dist", 2)
    .input("xyz", "T", "(n, 3) the forward's points", 2)
    .input("idx", "I", "(m, k) the forward's indices", 2)
    .input("dist", "T", "(m, k) the forward's distances", 2)
    .optional_input("new_xyz", "T", "(m, 3) the forward's query points; absent: xyz", 2)
    .check(dim("idx", 0) == dim("grad_dist", 0), "idx must have grad_dist's shape")
    .check(dim("idx", 1) == dim("grad_dist", 1), "idx must have grad_dist's shape")
    .check(dim("dist", 0) == dim("grad_dist", 0), "dist must have grad_dist's shape")
    .check(dim("dist", 1) == dim("grad_dist", 1), "dist must have grad_dist's shape")
    .check(dim("xyz", 1) == 3, "xyz must be (n, 3)")
    .check(dim_of_first({"new_xyz", "xyz"}, 1) == 3, "new_xyz must be (m, 3)")
    // Without new_xyz the queries are xyz's rows: either way one row per row of grad_dist.
    .check(dim_of_first({"new_xyz", "xyz"}, 0) == dim("grad_dist", 0), "the queries must have a row per row of grad_dist")
    .output("grad_xyz", "T", shape::same({"xyz"}), "(n, 3)")
    .output("grad_new_xyz", "T", shape::dims({dim("grad_dist", 0), constant(3)}), "(m, 3); 0 without new_xyz")
    .cpu(knn_query_backward_kernel);

OPBRIDGE_OP(knn_query)
    .doc("k nearest neighbours of each query point among the points of its batch segment (point-transformer "
         "KNNQuery). Segments are given by cumulative end offsets. Returns global row indices into xyz, nearest "
         "first, ties broken by the smaller index, and Euclidean distances; slots beyond a segment's size are "
         "index -1, distance +inf.")
    // float16 / bfloat16 coordinates: distances computed in float32, rounded to the input type.
    .types("T", {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16})
    .types("I", {DType::Int32, DType::Int64})
    .input("xyz", "T", "(n, 3) points", 2)
    .input("offset", "I", "(b,) cumulative end row of each segment of xyz", 1)
    .optional_input("new_xyz", "T", "(m, 3) query points; default xyz", 2)
    .optional_input("new_offset", "I", "(b,) cumulative end row of each segment of new_xyz; default offset", 1)
    .int_attr("k", "neighbours per query, >= 1")
    .output("idx", DType::Int32, shape::dims({dim_of_first({"new_xyz", "xyz"}, 0), attr("k")}),
            "(m, k) row indices into xyz, nearest first; -1 where the segment has fewer than k points")
    .output("dist", "T", shape::dims({dim_of_first({"new_xyz", "xyz"}, 0), attr("k")}),
            "(m, k) Euclidean distances; +inf where idx is -1")
    .check(attr("k") >= 1, "k must be >= 1")
    .check(dim("xyz", 1) == 3, "xyz must be (n, 3)")
    .check(dim_of_first({"new_xyz", "xyz"}, 1) == 3, "new_xyz must be (m, 3)")
    .check(dim_of_first({"new_offset", "offset"}, 0) == dim("offset", 0),
           "new_offset must have one entry per segment of offset")
    .cpu(+[](KernelContext& ctx, const TensorView& xyz, const TensorView& offset, const TensorView* new_xyz,
             const TensorView* new_offset, int64_t k, TensorView& idx, TensorView& dist) {
      knn_query_kernel(ctx, xyz, offset, new_xyz, new_offset, k, idx, dist, false);
    })
    .backward("knn_query_backward");

}  // namespace opbridge
