// ball_query's kernel: per batch item, a grid of cubic cells at least radius·(1 + 1e-5) wide, so
// a point outside a centre's 27 neighbouring cells is provably (and, with float rounding, still)
// outside the ball; within them every point is tested with the original's arithmetic
// (dx² + dy² + dz² < radius², in the compute type) and the first nsample hits by index are kept.
// The result equals a scan over every point, bit for bit.
#include "ball_query_kernel.h"

#include <opbridge/float32_copy.h>
#include <opbridge/half.h>
#include <opbridge/segments.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

namespace opbridge {
namespace {

// Cells at most twice the points (plus a few): a small radius on a wide cloud gets wider cells.
constexpr double kCellsPerPoint = 2.0;
// Cells wider than the radius by this much keep float rounding of distances and cell indices
// from ever letting a point two cells away into a ball.
constexpr double kCellMargin = 1e-5;

// The grid works on halved coordinates (exact, bar the last bit of a subnormal, far below any
// cell's margin): float64 points near the largest value of both signs are further apart than any
// double, but their halves' differences are finite, so every point lies in the grid.
template <typename C>
struct Grid {
  double half_origin[3] = {0, 0, 0};  // half the smallest coordinate of each axis
  double half_cell = 0.5;             // half the cell width
  int64_t cells[3] = {1, 1, 1};
  std::vector<int64_t> start;  // per cell: its first position in `order` (cells + 1 entries)
  std::vector<int32_t> order;  // point indices, by cell, then index
  std::vector<C> xs;           // their coordinates in that order: a cell's points are read in sequence
  int64_t n = 0;

  int64_t cell_of(double v, int a) const {  // unclamped, within [-2, cells + 1]
    const double c = std::floor((v * 0.5 - half_origin[a]) / half_cell);
    return static_cast<int64_t>(std::clamp(c, -2.0, static_cast<double>(cells[a] + 1)));
  }
  // The cell a point falls in (its cell_of clamped into the grid), as one index.
  int64_t cell_index(const C* v) const {
    int64_t c = 0;
    for (int a = 2; a >= 0; --a)
      c = c * cells[a] + std::clamp<int64_t>(cell_of(static_cast<double>(v[a]), a), 0, cells[a] - 1);
    return c;
  }
};

template <typename C>
Grid<C> build(const C* p, int64_t n, double radius) {
  Grid<C> g;
  g.n = n;
  double lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};
  for (int a = 0; a < 3; ++a) {
    lo[a] = std::numeric_limits<double>::infinity(), hi[a] = -lo[a];
    for (int64_t k = 0; k < n; ++k) {
      lo[a] = std::min(lo[a], static_cast<double>(p[k * 3 + a]));
      hi[a] = std::max(hi[a], static_cast<double>(p[k * 3 + a]));
    }
    if (n == 0) lo[a] = hi[a] = 0;
    g.half_origin[a] = lo[a] * 0.5;
  }
  double half_extent[3];
  for (int a = 0; a < 3; ++a) half_extent[a] = hi[a] * 0.5 - lo[a] * 0.5;
  g.half_cell = std::max(radius * (1 + kCellMargin), std::numeric_limits<double>::min()) * 0.5;
  const double limit = kCellsPerPoint * static_cast<double>(n) + 8;
  for (;;) {  // widen cells until the grid is small enough (wider cells stay correct, just slower)
    double total = 1;
    for (int a = 0; a < 3; ++a) total *= std::floor(half_extent[a] / g.half_cell) + 1;
    if (total <= limit) break;
    // Finite, however wide: at the largest half width every axis has at most 2 cells, which fit.
    g.half_cell = std::min(g.half_cell * std::max(1.25, std::cbrt(total / limit)), std::numeric_limits<double>::max());
  }
  for (int a = 0; a < 3; ++a) g.cells[a] = static_cast<int64_t>(std::floor(half_extent[a] / g.half_cell)) + 1;
  const int64_t total = g.cells[0] * g.cells[1] * g.cells[2];
  std::vector<int64_t> cell_of(static_cast<size_t>(n));
  g.start.assign(static_cast<size_t>(total) + 1, 0);
  for (int64_t k = 0; k < n; ++k) {
    cell_of[k] = g.cell_index(p + k * 3);
    ++g.start[cell_of[k] + 1];
  }
  for (int64_t c = 0; c < total; ++c) g.start[c + 1] += g.start[c];
  g.order.resize(static_cast<size_t>(n));
  g.xs.resize(static_cast<size_t>(n) * 3);
  std::vector<int64_t> fill(g.start.begin(), g.start.end() - 1);
  for (int64_t k = 0; k < n; ++k) {  // by index within a cell
    const int64_t i = fill[cell_of[k]]++;
    g.order[i] = static_cast<int32_t>(k);
    for (int a = 0; a < 3; ++a) g.xs[i * 3 + a] = p[k * 3 + a];
  }
  return g;
}

// Calls f(k, d2) for every point k of the 27 cells around centre q: a superset of every ball of
// radius up to the cell width. d2 is the original's arithmetic, (dx² + dy²) + dz².
template <typename C, typename F>
void for_each_near(const Grid<C>& g, const C* q, F&& f) {
  int64_t lo[3], hi[3];
  for (int a = 0; a < 3; ++a) {
    const int64_t c = g.cell_of(static_cast<double>(q[a]), a);
    lo[a] = std::max<int64_t>(c - 1, 0), hi[a] = std::min<int64_t>(c + 1, g.cells[a] - 1);
  }
  // The cells of a row (along x) are consecutive: one run of points per row, nine in all.
  for (int64_t cz = lo[2]; cz <= hi[2]; ++cz)
    for (int64_t cy = lo[1]; cy <= hi[1]; ++cy) {
      const int64_t row = (cz * g.cells[1] + cy) * g.cells[0];
      for (int64_t i = g.start[row + lo[0]], end = g.start[row + hi[0] + 1]; i < end; ++i) {
        const C* p = g.xs.data() + i * 3;
        const C dx = q[0] - p[0], dy = q[1] - p[1], dz = q[2] - p[2];
        f(g.order[i], dx * dx + dy * dy + dz * dz);
      }
    }
}

// The first nsample hits of centre q (by index) into out, padded as pointnet2_ops pads. A shell
// (min2 > 0, mmcv's ball query) keeps the points at min2 <= d2 < r2 and those at d2 == 0.
template <typename C>
void query(const Grid<C>& g, const C* q, C r2, C min2, int64_t nsample, std::vector<int32_t>& hits, int32_t* out) {
  hits.clear();
  if (min2 > C(0)) {
    for_each_near(g, q, [&](int32_t k, C d2) {
      if (d2 == C(0) || (d2 >= min2 && d2 < r2)) hits.push_back(k);
    });
  } else {
    for_each_near(g, q, [&](int32_t k, C d2) {
      if (d2 < r2) hits.push_back(k);
    });
  }
  const int64_t found = std::min<int64_t>(nsample, static_cast<int64_t>(hits.size()));
  if (static_cast<int64_t>(hits.size()) > nsample) std::nth_element(hits.begin(), hits.begin() + nsample, hits.end());
  std::sort(hits.begin(), hits.begin() + found);
  for (int64_t s = 0; s < nsample; ++s) out[s] = found == 0 ? 0 : hits[static_cast<size_t>(s < found ? s : 0)];
}

template <typename C>
std::vector<C> widened(const TensorView& t, const char* name) {
  std::vector<C> v(static_cast<size_t>(t.numel()));
  const size_t cols = static_cast<size_t>(std::max<int64_t>(t.dim(t.rank() - 1), 1));
  visit_dtype<float, double, Float16, BFloat16>(t.dtype, [&](auto zero) {
    using S = decltype(zero);
    const S* p = t.data_as<S>();
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<C>(widen(p[i]));
      OB_CHECK(std::isfinite(static_cast<double>(v[i])), name, " has a coordinate that is not finite (",
               static_cast<double>(v[i]), " at row ", i / cols, ")");
    }
  });
  return v;
}

// The centres of each batch item (m per item, item after item) ordered by the grid cell they fall
// in, stable: a permutation of 0 .. b*m - 1.
template <typename C>
std::vector<int64_t> in_cell_order(KernelContext& ctx, const std::vector<Grid<C>>& grids, const C* centres, int64_t m) {
  const int64_t b = static_cast<int64_t>(grids.size());
  std::vector<int64_t> visit(static_cast<size_t>(b * m));
  ctx.parallel_for(b, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const Grid<C>& g = grids[i];
      std::vector<int64_t> count(g.start.size(), 0), cell(static_cast<size_t>(m));
      for (int64_t t = 0; t < m; ++t) ++count[(cell[t] = g.cell_index(centres + (i * m + t) * 3)) + 1];
      for (size_t c = 1; c < count.size(); ++c) count[c] += count[c - 1];
      for (int64_t t = 0; t < m; ++t) visit[i * m + count[cell[t]]++] = i * m + t;
    }
  });
  return visit;
}

template <typename C>
void run(KernelContext& ctx, const TensorView& xyz_t, const TensorView& new_xyz_t, double radius, int64_t nsample,
         double min_radius, TensorView& idx) {
  const int64_t b = xyz_t.dim(0), n = xyz_t.dim(1), m = new_xyz_t.dim(1);
  const std::vector<C> xyz = widened<C>(xyz_t, "xyz"), centres = widened<C>(new_xyz_t, "new_xyz");
  const C r = static_cast<C>(radius), r2 = r * r;  // as the original: radius² in the compute type
  const C min_r = static_cast<C>(min_radius), min2 = min_r * min_r;
  int32_t* out = idx.data_as<int32_t>();
  // No ball holds a point (a radius that is 0, negative or NaN, or no points): every slot is 0.
  if (!(r2 > C(0)) || n == 0) return std::fill(out, out + idx.numel(), 0);
  std::vector<Grid<C>> grids(static_cast<size_t>(b));
  const double cell_radius = std::isfinite(static_cast<double>(r)) ? static_cast<double>(r) : 1e300;
  ctx.parallel_for(b, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) grids[i] = build<C>(xyz.data() + i * n * 3, n, cell_radius);
  });
  // Centres in the order of their cells, so neighbouring tasks read the same cells from cache.
  const std::vector<int64_t> visit = in_cell_order(ctx, grids, centres.data(), m);
  ctx.parallel_for(b * m, 64, [&](int64_t lo, int64_t hi) {
    std::vector<int32_t> hits;
    for (int64_t v = lo; v < hi; ++v) {
      const int64_t t = visit[v];
      query<C>(grids[t / m], centres.data() + t * 3, r2, min2, nsample, hits, out + t * nsample);
    }
  });
}

// ---- pointops' ball query, offset layout -------------------------------------------------------

// pointops sorts its candidates with the second phase of heap sort alone (no heap is built
// first), so their order is a fixed shuffle of the index-ordered candidates, not one by distance.
// It is reproduced step for step: the subsampling below picks from this order.
template <typename C>
void pointops_order(C* d, int32_t* id, int64_t count) {
  for (int64_t last = count - 1; last > 0; --last) {
    std::swap(d[0], d[last]), std::swap(id[0], id[last]);
    int64_t root = 0;
    for (int64_t child = 1; child < last; child = 2 * root + 1) {
      if (child + 1 < last && d[child + 1] > d[child]) ++child;
      if (d[root] > d[child]) break;
      std::swap(d[root], d[child]), std::swap(id[root], id[child]);
      root = child;
    }
  }
}

// pointops keeps a point at squared distance <= 1e-5 whatever min_radius says (the centre itself).
constexpr double kPointopsSelf2 = 1e-5;
// Its padding: index -1 at squared distance 1e10 (distance 1e5 after its square root).
constexpr double kPointopsFar2 = 1e10;

struct Hit {
  double d2;
  int32_t idx;
};

template <typename C>
void offset_query(const Grid<C>& g, int32_t first_row, const C* q, C min2, C max2, int64_t nsample,
                  std::vector<Hit>& hits, std::vector<C>& d, std::vector<int32_t>& id, int32_t* out_idx,
                  C* out_dist) {
  hits.clear();
  for_each_near(g, q, [&](int32_t k, C d2) {
    if (static_cast<double>(d2) <= kPointopsSelf2 || (d2 >= min2 && d2 < max2))
      hits.push_back({static_cast<double>(d2), first_row + k});
  });
  std::sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) { return a.idx < b.idx; });
  const int64_t count = static_cast<int64_t>(hits.size());
  d.resize(hits.size()), id.resize(hits.size());
  for (int64_t i = 0; i < count; ++i) d[i] = static_cast<C>(hits[i].d2), id[i] = hits[i].idx;
  pointops_order(d.data(), id.data(), count);
  if (count <= nsample) {
    for (int64_t s = 0; s < nsample; ++s) {
      out_idx[s] = s < count ? id[s] : -1;
      out_dist[s] = std::sqrt(s < count ? d[s] : static_cast<C>(kPointopsFar2));
    }
    return;
  }
  // More candidates than slots: every sep-th of them, with sep and its multiples in float32.
  const float sep = static_cast<float>(count) / static_cast<float>(nsample);
  for (int64_t s = 0; s < nsample; ++s) {
    const auto at = static_cast<int64_t>(sep * static_cast<float>(s));
    out_idx[s] = id[at], out_dist[s] = std::sqrt(d[at]);
  }
}

template <typename C>
void run_offset(KernelContext& ctx, const TensorView& xyz_t, const std::vector<int64_t>& pb, const TensorView& q_t,
                const std::vector<int64_t>& qb, int64_t nsample, double max_radius, double min_radius, TensorView& idx,
                C* dist) {
  const std::vector<C> xyz = widened<C>(xyz_t, "xyz"), centres = widened<C>(q_t, "new_xyz");
  const C max_r = static_cast<C>(max_radius), min_r = static_cast<C>(min_radius);
  const C max2 = max_r * max_r, min2 = min_r * min_r;  // in the compute type, as pointops
  const size_t b = pb.size() - 1;
  const int64_t m = q_t.dim(0);
  // Cells wide enough for the ball and for the always-kept neighbourhood of the centre.
  double reach = std::max(std::sqrt(kPointopsSelf2), std::isfinite(max_radius) ? std::max(max_radius, 0.0) : 1e300);
  std::vector<Grid<C>> grids(b);
  ctx.parallel_for(static_cast<int64_t>(b), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s)
      if (qb[s + 1] > qb[s]) grids[s] = build<C>(xyz.data() + pb[s] * 3, pb[s + 1] - pb[s], reach);
  });
  int32_t* out = idx.data_as<int32_t>();
  ctx.parallel_for(m, 64, [&](int64_t lo, int64_t hi) {
    std::vector<Hit> hits;
    std::vector<C> d;
    std::vector<int32_t> id;
    size_t s = static_cast<size_t>(std::upper_bound(qb.begin(), qb.end(), lo) - qb.begin()) - 1;
    for (int64_t t = lo; t < hi; ++t) {
      while (qb[s + 1] <= t) ++s;
      offset_query<C>(grids[s], static_cast<int32_t>(pb[s]), centres.data() + t * 3, min2, max2, nsample, hits, d, id,
                      out + t * nsample, dist + t * nsample);
    }
  });
}

// ---- torch_cluster's radius -------------------------------------------------------------------

// The rows of one batch item: [begin, end) of a sorted batch vector holding `value` there.
struct Run {
  int64_t value, begin, end;
};

// A batch vector (torch_cluster's batch_x / batch_y) as its runs of equal values, checked by the
// batch-vector rule every op shares (segments.h); absent, every row is item 0. Runs, not a table
// indexed by item: the largest item number costs nothing, however large.
std::vector<Run> batch_runs(const TensorView* batch, int64_t rows, const char* name) {
  std::vector<Run> runs;
  if (!batch) {
    if (rows > 0) runs.push_back({0, 0, rows});
    return runs;
  }
  const std::vector<int64_t> v = batch_vector(*batch, name);
  for (int64_t i = 0; i < rows; ++i) {
    if (i == 0 || v[i] != v[i - 1]) runs.push_back({v[i], i, i});
    runs.back().end = i + 1;
  }
  return runs;
}

// Rows of `t` (rows, d) as (rows, 3) in the compute type: the first three coordinates, zeros past d
// (which add nothing to a squared distance, to the bit).
template <typename C>
std::vector<C> first_three(const std::vector<C>& v, int64_t rows, int64_t d) {
  std::vector<C> out(static_cast<size_t>(rows * 3), C(0));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t a = 0; a < std::min<int64_t>(d, 3); ++a) out[i * 3 + a] = v[i * d + a];
  return out;
}

template <typename C>
void run_radius(KernelContext& ctx, const TensorView& x_t, const TensorView& y_t, const TensorView* batch_x,
                const TensorView* batch_y, double r, int64_t max_neighbours, TensorView& edge_index) {
  const int64_t n = x_t.dim(0), m = y_t.dim(0), d = x_t.dim(1);
  const std::vector<Run> xr = batch_runs(batch_x, n, "batch_x"), yr = batch_runs(batch_y, m, "batch_y");
  const std::vector<C> x = widened<C>(x_t, "x"), y = widened<C>(y_t, "y");
  const std::vector<C> x3 = first_three(x, n, d), y3 = first_three(y, m, d);
  // torch_cluster squares r in double, then its search compares in the points' type.
  const C r2 = static_cast<C>(r * r);
  const double cell = r > 0 && std::isfinite(r) ? r : 1e300;
  // Per run of y: the run of x of the same batch item (both sorted: one merge), or none.
  std::vector<const Run*> partner(yr.size(), nullptr);
  for (size_t q = 0, p = 0; q < yr.size(); ++q) {
    while (p < xr.size() && xr[p].value < yr[q].value) ++p;
    if (p < xr.size() && xr[p].value == yr[q].value) partner[q] = &xr[p];
  }
  std::vector<Grid<C>> grids(yr.size());
  ctx.parallel_for(static_cast<int64_t>(yr.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t q = lo; q < hi; ++q)
      if (const Run* p = partner[q]) grids[q] = build<C>(x3.data() + p->begin * 3, p->end - p->begin, cell);
  });
  // Queries in fixed chunks, each collecting its pairs in order; the chunks are then joined in
  // order, so the output does not depend on the number of threads.
  const int64_t chunk = 256, chunks = (m + chunk - 1) / chunk;
  std::vector<std::vector<int64_t>> found(static_cast<size_t>(chunks));  // (y row, x row) pairs
  if (r2 > C(0))
    ctx.parallel_for(chunks, 1, [&](int64_t lo, int64_t hi) {
      std::vector<int64_t> hits;
      for (int64_t c = lo; c < hi; ++c) {
        size_t q = static_cast<size_t>(std::upper_bound(yr.begin(), yr.end(), c * chunk,
                                                        [](int64_t j, const Run& u) { return j < u.begin; }) -
                                       yr.begin()) - 1;
        for (int64_t j = c * chunk; j < std::min(m, (c + 1) * chunk); ++j) {
          while (yr[q].end <= j) ++q;
          const Run* p = partner[q];
          if (!p) continue;
          hits.clear();
          for_each_near(grids[q], y3.data() + j * 3, [&](int32_t k, C d2) {
            const int64_t i = p->begin + k;
            for (int64_t a = 3; a < d; ++a) {  // past three coordinates: the sum goes on in order
              const C diff = y[j * d + a] - x[i * d + a];
              d2 += diff * diff;
            }
            if (d2 < r2) hits.push_back(i);
          });
          const size_t keep = static_cast<size_t>(std::min<int64_t>(max_neighbours, static_cast<int64_t>(hits.size())));
          if (hits.size() > keep) std::nth_element(hits.begin(), hits.begin() + static_cast<int64_t>(keep), hits.end());
          std::sort(hits.begin(), hits.begin() + static_cast<int64_t>(keep));
          for (size_t h = 0; h < keep; ++h) found[c].push_back(j), found[c].push_back(hits[h]);
        }
      }
    });
  int64_t pairs = 0;
  for (const auto& f : found) pairs += static_cast<int64_t>(f.size()) / 2;
  int64_t* out = ctx.allocate_output(edge_index, {2, pairs}).data_as<int64_t>();
  int64_t e = 0;
  for (const auto& f : found)
    for (size_t h = 0; h < f.size(); h += 2, ++e) out[e] = f[h], out[pairs + e] = f[h + 1];
}

}  // namespace

void radius_kernel(KernelContext& ctx, const TensorView& x, const TensorView& y, const TensorView* batch_x,
                   const TensorView* batch_y, double r, int64_t max_num_neighbors, TensorView& edge_index) {
  OB_CHECK(x.dim(0) < std::numeric_limits<int32_t>::max(), "x has ", x.dim(0), " rows; at most 2^31 - 2 are supported");
  try {
    if (x.dtype == DType::Float64)
      return run_radius<double>(ctx, x, y, batch_x, batch_y, r, max_num_neighbors, edge_index);
    run_radius<float>(ctx, x, y, batch_x, batch_y, r, max_num_neighbors, edge_index);
  } catch (const std::bad_alloc&) {
    // The pairs are held until all are found: say how many the radius and the cap allow.
    int64_t most = 0;
    if (__builtin_mul_overflow(std::min(max_num_neighbors, x.dim(0)), y.dim(0), &most))
      most = std::numeric_limits<int64_t>::max();
    throw Error(detail::concat("out of memory finding the pairs closer than r = ", r, ": up to ", most,
                               " pairs of 16 bytes (max_num_neighbors = ", max_num_neighbors, " per row of y, ",
                               y.dim(0), " rows): lower r or max_num_neighbors"));
  }
}

void ball_query_offset_kernel(KernelContext& ctx, const TensorView& xyz, const TensorView& offset,
                              const TensorView* new_xyz, const TensorView* new_offset, int64_t nsample,
                              double max_radius, double min_radius, TensorView& idx, TensorView& dist) {
  OB_CHECK((new_xyz == nullptr) == (new_offset == nullptr), "new_xyz and new_offset must be given together");
  OB_CHECK(min_radius < max_radius, "min_radius (", min_radius, ") must be below max_radius (", max_radius, ")");
  const TensorView& q = new_xyz ? *new_xyz : xyz;
  const int64_t n = xyz.dim(0);
  // idx is int32, and -1 is padding.
  OB_CHECK(n <= std::numeric_limits<int32_t>::max(), "xyz has ", n, " rows; idx is int32");
  const std::vector<int64_t> pb = segment_bounds(offset, "offset", n, "xyz");
  const std::vector<int64_t> qb = new_xyz ? segment_bounds(*new_offset, "new_offset", q.dim(0), "new_xyz") : pb;
  if (xyz.dtype == DType::Float64)
    return run_offset<double>(ctx, xyz, pb, q, qb, nsample, max_radius, min_radius, idx, dist.data_as<double>());
  if (xyz.dtype == DType::Float32)
    return run_offset<float>(ctx, xyz, pb, q, qb, nsample, max_radius, min_radius, idx, dist.data_as<float>());
  TensorView dist32 = float32_scratch(ctx, dist);  // 16-bit points: float32 distances, rounded once
  run_offset<float>(ctx, xyz, pb, q, qb, nsample, max_radius, min_radius, idx, dist32.data_as<float>());
  narrow_into(ctx, dist32, dist);
}

void ball_query_kernel(KernelContext& ctx, const TensorView& xyz, const TensorView& new_xyz, double radius,
                       int64_t nsample, double min_radius, TensorView& idx) {
  // NaN fails both: a shell needs min_radius < radius (mmcv asserts it), a ball takes min_radius 0.
  OB_CHECK(min_radius >= 0, "min_radius must be >= 0, got ", min_radius);
  OB_CHECK(min_radius == 0 || min_radius < radius, "min_radius (", min_radius, ") must be below radius (", radius,
           ")");
  if (xyz.dtype == DType::Float64) return run<double>(ctx, xyz, new_xyz, radius, nsample, min_radius, idx);
  run<float>(ctx, xyz, new_xyz, radius, nsample, min_radius, idx);
}

void batch_pointers_kernel(KernelContext&, const TensorView& batch, const TensorView& bounds, const std::string& name,
                           const std::string& caller, TensorView& ptr) {
  std::vector<int64_t> v;
  try {
    v = batch_vector(batch, name.c_str());
  } catch (const Error& e) {
    if (caller.empty()) throw;
    throw Error(detail::concat(caller, ": ", e.what()));
  }
  const int64_t* b = bounds.data_as<int64_t>();
  int64_t* out = ptr.data_as<int64_t>();
  for (int64_t i = 0; i < bounds.numel(); ++i)
    out[i] = static_cast<int64_t>(std::lower_bound(v.begin(), v.end(), b[i]) - v.begin());
}

}  // namespace opbridge
