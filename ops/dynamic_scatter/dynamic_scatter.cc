// dynamic_scatter: mmcv's DynamicScatter (dynamic_point_to_voxel_forward / _backward), the
// point-to-voxel pooling of dynamic voxelization's encoders (DynamicVFE, dynamic PointPillars):
// each point's features reduced (sum, mean or max) into the voxel its coordinates name. The
// voxels are the distinct coordinate rows in ascending lexicographic order (mmcv's torch.unique),
// rows with a negative coordinate dropped: their number depends on the values.
//
// The distinct rows are found by one pass over the points with a hash table of rows (memory in
// the number of points), then only those rows are sorted; each voxel's points are reduced in input
// order, voxels in parallel.
#include <opbridge/op.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "voxelization/voxel_table.h"  // the hash table the voxelization ops use

namespace opbridge {
namespace {

enum class Reduce { Sum, Mean, Max };

Reduce parse(const std::string& reduce) {
  if (reduce == "sum") return Reduce::Sum;
  if (reduce == "mean") return Reduce::Mean;
  OB_CHECK(reduce == "max", "reduce must be \"sum\", \"mean\" or \"max\", got \"", reduce, "\"");
  return Reduce::Max;
}

// Each voxel's points in input order: CSR over point2voxel (entries -1 left out).
struct Members {
  std::vector<int64_t> start;  // m + 1
  std::vector<int32_t> rows;
};

Members members(const int32_t* p2v, int64_t n, int64_t m) {
  Members g;
  g.start.assign(static_cast<size_t>(m) + 1, 0);
  for (int64_t i = 0; i < n; ++i)
    if (p2v[i] >= 0) ++g.start[p2v[i] + 1];
  for (int64_t v = 0; v < m; ++v) g.start[v + 1] += g.start[v];
  g.rows.resize(static_cast<size_t>(g.start[m]));
  std::vector<int64_t> fill(g.start.begin(), g.start.end() - 1);
  for (int64_t i = 0; i < n; ++i)
    if (p2v[i] >= 0) g.rows[fill[p2v[i]]++] = static_cast<int32_t>(i);
  return g;
}

template <typename T>
void reduce_voxels(KernelContext& ctx, const T* feats, int64_t c, const Members& g, Reduce how, T* out) {
  const int64_t m = static_cast<int64_t>(g.start.size()) - 1;
  ctx.parallel_for(m, 256, [&](int64_t b, int64_t e) {
    for (int64_t v = b; v < e; ++v) {
      T* o = out + v * c;
      std::fill(o, o + c, how == Reduce::Max ? -std::numeric_limits<T>::infinity() : T(0));
      for (int64_t k = g.start[v]; k < g.start[v + 1]; ++k) {
        const T* f = feats + static_cast<int64_t>(g.rows[k]) * c;
        if (how == Reduce::Max) {
          for (int64_t j = 0; j < c; ++j)  // NaN propagates: a voxel holding one is NaN
            if (!std::isnan(o[j]) && (f[j] > o[j] || std::isnan(f[j]))) o[j] = f[j];
        } else {
          for (int64_t j = 0; j < c; ++j) o[j] += f[j];
        }
      }
      if (how == Reduce::Mean) {
        const T count = static_cast<T>(g.start[v + 1] - g.start[v]);
        for (int64_t j = 0; j < c; ++j) o[j] /= count;
      }
    }
  });
}

template <typename I>
void forward(KernelContext& ctx, const TensorView& feats_t, const TensorView& coors_t, Reduce how,
             TensorView& voxel_feats, TensorView& voxel_coors, TensorView& point2voxel, TensorView& counts_t) {
  const int64_t n = feats_t.dim(0), c = feats_t.dim(1), d = coors_t.dim(1);
  OB_CHECK(n < std::numeric_limits<int32_t>::max(), "feats has ", n, " rows; at most 2^31 - 2 are supported");
  const I* co = coors_t.data_as<I>();
  // Per row: kept (no negative coordinate) and its hash.
  std::vector<uint64_t> hash(static_cast<size_t>(n));
  std::vector<uint8_t> kept(static_cast<size_t>(n));
  ctx.parallel_for(n, 1 << 12, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      uint64_t h = static_cast<uint64_t>(d);
      bool ok = true;
      for (int64_t j = 0; j < d; ++j) {
        const I v = co[i * d + j];
        ok = ok && v >= 0;
        h = mix64(h ^ static_cast<uint64_t>(static_cast<int64_t>(v)));
      }
      kept[i] = ok, hash[i] = h;
    }
  });
  const size_t row_bytes = sizeof(I) * static_cast<size_t>(d);
  // Distinct rows in order of first appearance.
  std::vector<int32_t> first_id(static_cast<size_t>(n)), first_row;
  {
    IdTable table(n);
    bool inserted = false;
    for (int64_t i = 0; i < n; ++i) {
      if (!kept[i]) {
        first_id[i] = -1;
        continue;
      }
      const I* row = co + i * d;
      const int32_t id = table.find_or_insert(
          hash[i], static_cast<int32_t>(i), static_cast<int32_t>(first_row.size()),
          [&](int32_t r) { return std::memcmp(co + static_cast<int64_t>(r) * d, row, row_bytes) == 0; }, &inserted);
      if (inserted) first_row.push_back(static_cast<int32_t>(i));
      first_id[i] = id;
    }
  }
  const int64_t m = static_cast<int64_t>(first_row.size());
  // Ascending lexicographic order of the rows (mmcv's torch.unique(dim=0, sorted=True)).
  std::vector<int32_t> order(static_cast<size_t>(m)), rank(static_cast<size_t>(m));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const I* ra = co + static_cast<int64_t>(first_row[a]) * d;
    const I* rb = co + static_cast<int64_t>(first_row[b]) * d;
    return std::lexicographical_compare(ra, ra + d, rb, rb + d);
  });
  for (int64_t r = 0; r < m; ++r) rank[order[r]] = static_cast<int32_t>(r);

  int32_t* p2v = point2voxel.data_as<int32_t>();
  for (int64_t i = 0; i < n; ++i) p2v[i] = first_id[i] < 0 ? -1 : rank[first_id[i]];
  const Members g = members(p2v, n, m);
  I* out_coors = ctx.allocate_output(voxel_coors, {m, d}).template data_as<I>();
  int32_t* counts = ctx.allocate_output(counts_t, {m}).data_as<int32_t>();
  for (int64_t r = 0; r < m; ++r) {
    std::memcpy(out_coors + r * d, co + static_cast<int64_t>(first_row[order[r]]) * d, row_bytes);
    counts[r] = static_cast<int32_t>(g.start[r + 1] - g.start[r]);
  }
  ctx.allocate_output(voxel_feats, {m, c});
  visit_dtype<float, double>(feats_t.dtype, [&](auto zero) {
    using T = decltype(zero);
    reduce_voxels<T>(ctx, feats_t.data_as<T>(), c, g, how, voxel_feats.data_as<T>());
  });
}

void dynamic_scatter_kernel(KernelContext& ctx, const TensorView& feats, const TensorView& coors,
                            const std::string& reduce, TensorView& voxel_feats, TensorView& voxel_coors,
                            TensorView& point2voxel, TensorView& voxel_points_count) {
  const Reduce how = parse(reduce);
  visit_dtype<int32_t, int64_t>(coors.dtype, [&](auto zero) {
    forward<decltype(zero)>(ctx, feats, coors, how, voxel_feats, voxel_coors, point2voxel, voxel_points_count);
  });
}

template <typename T>
void backward(KernelContext& ctx, const T* grad, const T* feats, const T* voxel_feats, const int32_t* p2v,
              const int32_t* counts, int64_t n, int64_t m, int64_t c, Reduce how, T* out) {
  if (how != Reduce::Max) {
    ctx.parallel_for(n, 1 << 10, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        T* o = out + i * c;
        const int32_t v = p2v[i];
        if (v < 0) {
          std::fill(o, o + c, T(0));
          continue;
        }
        const T count = how == Reduce::Mean ? static_cast<T>(counts[v]) : T(1);
        for (int64_t j = 0; j < c; ++j) o[j] = how == Reduce::Mean ? grad[v * c + j] / count : grad[v * c + j];
      }
    });
    return;
  }
  // max: each value's gradient to the first point (by index) holding the voxel's maximum (a NaN
  // maximum: the first NaN), as mmcv's kernel picks the lowest index among the equal ones.
  std::fill(out, out + n * c, T(0));
  const Members g = members(p2v, n, m);
  ctx.parallel_for(m, 256, [&](int64_t b, int64_t e) {
    for (int64_t v = b; v < e; ++v)
      for (int64_t j = 0; j < c; ++j) {
        const T want = voxel_feats[v * c + j];
        for (int64_t k = g.start[v]; k < g.start[v + 1]; ++k) {
          const T f = feats[static_cast<int64_t>(g.rows[k]) * c + j];
          if (f == want || (std::isnan(f) && std::isnan(want))) {
            out[static_cast<int64_t>(g.rows[k]) * c + j] = grad[v * c + j];
            break;
          }
        }
      }
  });
}

void dynamic_scatter_backward_kernel(KernelContext& ctx, const TensorView& grad_voxel_feats, const TensorView& feats,
                                     const TensorView& voxel_feats, const TensorView& point2voxel,
                                     const TensorView& voxel_points_count, const std::string& reduce,
                                     TensorView& grad_feats) {
  const Reduce how = parse(reduce);
  const int64_t n = feats.dim(0), m = voxel_feats.dim(0), c = feats.dim(1);
  const int32_t* p2v = point2voxel.data_as<int32_t>();
  const int32_t* counts = voxel_points_count.data_as<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    OB_CHECK(p2v[i] >= -1 && p2v[i] < m, "point2voxel[", i, "] = ", p2v[i], " is not a voxel (there are ", m, ")");
  for (int64_t v = 0; v < m && how == Reduce::Mean; ++v)
    OB_CHECK(counts[v] >= 1, "voxel_points_count[", v, "] = ", counts[v], ": a voxel holds at least one point");
  visit_dtype<float, double>(feats.dtype, [&](auto zero) {
    using T = decltype(zero);
    backward<T>(ctx, grad_voxel_feats.data_as<T>(), feats.data_as<T>(), voxel_feats.data_as<T>(), p2v, counts, n, m,
                c, how, grad_feats.data_as<T>());
  });
}

}  // namespace

OPBRIDGE_OP(dynamic_scatter_backward)
    .doc("The gradient of dynamic_scatter with respect to feats: sum gives each kept point its voxel's gradient, "
         "mean that over the voxel's count, max each value's gradient to the first point holding the maximum.")
    .types("T", {DType::Float32, DType::Float64})
    .types("P", {DType::Int32})
    .input("grad_voxel_feats", "T", "(M, C) gradient of voxel_feats", 2)
    .input("feats", "T", "(N, C) the forward's features", 2)
    .input("voxel_feats", "T", "(M, C) the forward's result", 2)
    .input("point2voxel", "P", "(N,) the forward's voxel of each point, -1 for a dropped one", 1)
    .input("voxel_points_count", "P", "(M,) the forward's points per voxel", 1)
    .string_attr("reduce", "max", "the forward's reduction")
    .check(dim("grad_voxel_feats", 0) == dim("voxel_feats", 0), "grad_voxel_feats must have voxel_feats' shape")
    .check(dim("grad_voxel_feats", 1) == dim("voxel_feats", 1), "grad_voxel_feats must have voxel_feats' shape")
    .check(dim("voxel_feats", 1) == dim("feats", 1), "voxel_feats must have feats' columns")
    .check(dim("point2voxel", 0) == dim("feats", 0), "point2voxel must have one entry per row of feats")
    .check(dim("voxel_points_count", 0) == dim("voxel_feats", 0), "voxel_points_count must have one entry per voxel")
    .output("grad_feats", "T", shape::same({"feats"}), "(N, C) zero for dropped points")
    .cpu(dynamic_scatter_backward_kernel);

OPBRIDGE_OP(dynamic_scatter)
    .doc("mmcv's dynamic_scatter: the rows of feats reduced (\"sum\", \"mean\" or \"max\") into the voxels their "
         "coordinate rows name; voxels are the distinct rows of coors without a negative coordinate, in ascending "
         "lexicographic order. Rows with a negative coordinate are dropped. A NaN feature makes its voxel's max NaN.")
    .types("T", {DType::Float32, DType::Float64})
    .types("I", {DType::Int32, DType::Int64})
    .input("feats", "T", "(N, C) point features", 2)
    .input("coors", "I", "(N, D) each point's voxel coordinates (e.g. (z, y, x) or (batch, z, y, x))", 2)
    .string_attr("reduce", "max", "\"sum\", \"mean\" or \"max\"")
    .check(dim("coors", 0) == dim("feats", 0), "coors must have one row per row of feats")
    .check(dim("coors", 1) >= 1, "coors must be (N, D) with D >= 1 coordinates")
    .output("voxel_feats", "T", shape::dims({data_dependent("voxels"), dim("feats", 1)}), "(M, C) reduced features")
    .output("voxel_coors", "I", shape::dims({data_dependent("voxels"), dim("coors", 1)}), "(M, D) each voxel's row")
    .output("point2voxel", DType::Int32, shape::dims({dim("feats", 0)}), "(N,) each point's voxel, -1 if dropped")
    .output("voxel_points_count", DType::Int32, shape::dims({data_dependent("voxels")}), "(M,) points per voxel")
    .cpu(dynamic_scatter_kernel)
    .backward("dynamic_scatter_backward");

}  // namespace opbridge
