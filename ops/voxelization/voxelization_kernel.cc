// The voxelization kernels. A point's voxel is mmcv's: per axis floor((p - min) / size) in the
// points' type promoted with float32 (float32 for float32 points, float64 for float64 ones), kept
// when it lies in [0, grid), grid = round((max - min) / size) in float32. NaN and infinite
// coordinates fall outside every voxel, as out-of-range points do.
//
// Hard voxelization runs in three passes: every point's voxel key (parallel); the voxel ids and
// each point's slot, in input order (one pass: the order is the result); the copy of the points
// into their slots and the zeroing of the slots left (parallel). The ids come from a dense table
// of the grid's cells when the grid is small next to the cloud, from a hash table otherwise, so
// memory follows the number of points, never the grid's volume.
#include "voxelization_kernel.h"

#include <opbridge/dtype.h>
#include <opbridge/error.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "voxel_table.h"

namespace opbridge {
namespace {

// A dense table of the cells is used up to this many cells per point (plus a floor).
constexpr int64_t kDenseCellsPerPoint = 4;
constexpr int64_t kDenseCellsFloor = int64_t{1} << 16;
// The voxels output stops at this many bytes: max_points sizes it, and a wrong attribute must
// fail clearly, not ask for a huge block.
constexpr int64_t kMaxVoxelBytes = int64_t{1} << 34;

struct Grid {
  float lo[3], size[3];  // x, y, z
  int64_t cells[3];      // x, y, z
};

Grid make_grid(const std::vector<double>& voxel_size, const std::vector<double>& range) {
  OB_CHECK(voxel_size.size() == 3, "voxel_size must hold 3 values (x, y, z), got ", voxel_size.size());
  OB_CHECK(range.size() == 6, "point_cloud_range must hold 6 values (x_min, y_min, z_min, x_max, y_max, z_max), got ",
           range.size());
  static const char* axis[3] = {"x", "y", "z"};
  Grid g{};
  for (int a = 0; a < 3; ++a) {
    const float size = static_cast<float>(voxel_size[a]);
    const float lo = static_cast<float>(range[a]), hi = static_cast<float>(range[a + 3]);
    OB_CHECK(std::isfinite(size) && size > 0, "voxel_size must be positive and finite, got ", voxel_size[a], " along ",
             axis[a]);
    OB_CHECK(std::isfinite(lo) && std::isfinite(hi), "point_cloud_range must be finite, got ", range[a], " .. ",
             range[a + 3], " along ", axis[a]);
    const float cells = std::round((hi - lo) / size);  // float32, as mmcv
    OB_CHECK(cells >= 1, "point_cloud_range ", range[a], " .. ", range[a + 3], " with voxel_size ", voxel_size[a],
             " has no voxel along ", axis[a], " (round((max - min) / size) = ", cells, ")");
    OB_CHECK(cells <= static_cast<float>(std::numeric_limits<int32_t>::max() / 2), "point_cloud_range ", range[a],
             " .. ", range[a + 3], " with voxel_size ", voxel_size[a], " has ", cells, " voxels along ", axis[a],
             ": at most 2^30 are supported");
    g.lo[a] = lo, g.size[a] = size, g.cells[a] = static_cast<int64_t>(cells);
  }
  return g;
}

// The point's (x, y, z) voxel, or false outside the grid (NaN included). floor(q) lies in
// [0, cells) exactly when q does (cells is an integer), and for q >= 0 truncation is floor: the
// test and the index need no call to floor.
template <typename C, typename T>
inline bool voxel_of(const T* p, const Grid& g, int64_t* xyz) {
  C q[3];
  bool in = true;
  for (int a = 0; a < 3; ++a) {
    q[a] = (static_cast<C>(p[a]) - static_cast<C>(g.lo[a])) / static_cast<C>(g.size[a]);
    in &= q[a] >= 0 && static_cast<double>(q[a]) < static_cast<double>(g.cells[a]);
  }
  if (!in) return false;
  for (int a = 0; a < 3; ++a) xyz[a] = static_cast<int64_t>(q[a]);
  return true;
}

template <typename T>
using Compute = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Points per block of voxels_of.
constexpr int64_t kBlock = 256;

// The (x, y, z) voxels of points [b, e) (at most kBlock) into cell, x = -1 for a point outside the
// grid. Float32 points on a grid of fewer than 2^24 voxels per axis (exact in float32) go four at
// a time: the same float32 subtraction and division, and comparisons with no branch to mispredict.
template <typename T>
void voxels_of(const T* p, int64_t c, int64_t b, int64_t e, const Grid& g, int32_t* cell) {
  int64_t i = b;
#if defined(__SSE2__)
  constexpr int64_t kExact = int64_t{1} << 24;
  if constexpr (std::is_same_v<T, float>) {
    if (g.cells[0] < kExact && g.cells[1] < kExact && g.cells[2] < kExact) {
      __m128 lo[3], size[3], cells[3];
      for (int a = 0; a < 3; ++a)
        lo[a] = _mm_set1_ps(g.lo[a]), size[a] = _mm_set1_ps(g.size[a]),
        cells[a] = _mm_set1_ps(static_cast<float>(g.cells[a]));
      const __m128 zero = _mm_setzero_ps();
      alignas(16) int32_t idx[3][4];
      for (; i + 4 <= e; i += 4) {
        __m128 in = _mm_castsi128_ps(_mm_set1_epi32(-1));
        for (int a = 0; a < 3; ++a) {
          const float* q = p + i * c + a;
          const __m128 x = _mm_setr_ps(q[0], q[c], q[2 * c], q[3 * c]);
          const __m128 v = _mm_div_ps(_mm_sub_ps(x, lo[a]), size[a]);
          in = _mm_and_ps(in, _mm_and_ps(_mm_cmpge_ps(v, zero), _mm_cmplt_ps(v, cells[a])));
          _mm_store_si128(reinterpret_cast<__m128i*>(idx[a]), _mm_cvttps_epi32(v));
        }
        const int mask = _mm_movemask_ps(in);
        for (int j = 0; j < 4; ++j) {
          int32_t* out = cell + (i - b + j) * 3;
          const bool kept = (mask >> j) & 1;
          out[0] = kept ? idx[0][j] : -1, out[1] = idx[1][j], out[2] = idx[2][j];
        }
      }
    }
  }
#endif
  int64_t v[3];
  for (; i < e; ++i) {
    int32_t* out = cell + (i - b) * 3;
    const bool kept = voxel_of<Compute<T>>(p + i * c, g, v);
    out[0] = kept ? static_cast<int32_t>(v[0]) : -1, out[1] = static_cast<int32_t>(v[1]),
    out[2] = static_cast<int32_t>(v[2]);
  }
}

// Calls f(i, xyz) for every point, in parallel blocks: xyz its (x, y, z) voxel, x = -1 outside.
template <typename T, typename F>
void for_each_voxel(KernelContext& ctx, const T* p, int64_t c, int64_t n, const Grid& g, F&& f) {
  ctx.parallel_for(n, 1 << 12, [&](int64_t b, int64_t e) {
    int32_t cell[kBlock * 3];
    for (int64_t s = b; s < e; s += kBlock) {
      const int64_t t = std::min(e, s + kBlock);
      voxels_of(p, c, s, t, g, cell);
      for (int64_t i = s; i < t; ++i) f(i, cell + (i - s) * 3);
    }
  });
}

// Rows of up to this many values are streamed (voxelization_kernel.cc's copy).
constexpr int64_t kStreamedRow = 1024;

// Copies `bytes` to dst with non-temporal stores where dst is 16-byte aligned (the voxels output
// is many times the cache: storing through it would read every line first), plainly elsewhere.
inline void stream(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Orders the streamed stores before the kernel returns (a no-op without them).
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

template <typename T>
void hard(KernelContext& ctx, const TensorView& points, const Grid& g, int64_t max_points, int64_t max_voxels,
          TensorView& voxels_t, TensorView& coors_t, TensorView& num_t) {
  const int64_t n = points.dim(0), c = points.dim(1);
  OB_CHECK(n < std::numeric_limits<int32_t>::max(), "points has ", n, " rows; at most 2^31 - 2 are supported");
  const T* p = points.data_as<T>();
  const int64_t gx = g.cells[0], gy = g.cells[1], gz = g.cells[2];
  // A key is the voxel's index in the grid: each axis has at most 2^30 cells, their product must fit.
  int64_t total = 0;
  const bool product_fits = !__builtin_mul_overflow(gx, gy, &total) && !__builtin_mul_overflow(total, gz, &total);
  OB_CHECK(product_fits && total <= (int64_t{1} << 62), "the grid of ", gx, " x ", gy, " x ", gz,
           " voxels is larger than 2^62 voxels");
  // Scratch blocks are reused across calls: no page faults for a cloud of the size seen before.
  // A key's hash (the hash table's) is made here too, in parallel, not in the pass in input order.
  const bool dense = total <= kDenseCellsPerPoint * n + kDenseCellsFloor;
  int64_t* key = static_cast<int64_t*>(ctx.scratch(sizeof(int64_t) * static_cast<size_t>(n)));
  uint64_t* hash = dense ? nullptr : static_cast<uint64_t*>(ctx.scratch(sizeof(uint64_t) * static_cast<size_t>(n)));
  for_each_voxel(ctx, p, c, n, g, [&](int64_t i, const int32_t* v) {
    key[i] = v[0] < 0 ? -1 : (int64_t{v[2]} * gy + v[1]) * gx + v[0];
    if (hash) hash[i] = mix64(static_cast<uint64_t>(key[i]));
  });
  // The points in the grid, in input order, listed without a branch: the passes below then take
  // no mispredicted branch on a point outside (a third of a cloud, at random in a shuffled one).
  int32_t* kept = static_cast<int32_t*>(ctx.scratch(sizeof(int32_t) * static_cast<size_t>(n)));
  int64_t valid = 0;
  for (int64_t i = 0; i < n; ++i) {
    kept[valid] = static_cast<int32_t>(i);
    valid += key[i] >= 0;
  }

  // Voxels in order of first point, each with its kept points as a chain through `next` (input
  // order), so that the copy writes each voxel's slots in sequence.
  struct Voxel {
    int32_t head, tail, count;
  };
  std::vector<Voxel> vox;
  std::vector<int64_t> vox_key;
  int32_t* next = static_cast<int32_t*>(ctx.scratch(sizeof(int32_t) * static_cast<size_t>(n)));
  const int64_t limit = std::min(max_voxels, n);
  vox.reserve(static_cast<size_t>(std::min<int64_t>(limit, 1 << 20)));
  vox_key.reserve(vox.capacity());
  int32_t m = 0;
  // The id of a key seen for the first time: the next one, or -2 once max_voxels are taken (the
  // dense table remembers the key as refused, so its later points are dropped too).
  auto add = [&](int64_t k) -> int32_t {
    if (m >= limit) return -2;
    vox.push_back(Voxel{-1, -1, 0}), vox_key.push_back(k);
    return m++;
  };
  auto put = [&](int64_t i, int32_t id) {
    if (id < 0) return;
    Voxel& v = vox[id];
    if (v.count >= max_points) return;
    (v.count++ == 0 ? v.head : next[v.tail]) = static_cast<int32_t>(i);
    v.tail = static_cast<int32_t>(i);
  };
  constexpr int64_t ahead = 16;  // prefetch distance, in points
  if (dense) {
    int32_t* cell = static_cast<int32_t*>(ctx.scratch(sizeof(int32_t) * static_cast<size_t>(total)));
    std::fill(cell, cell + total, -1);
    for (int64_t j = 0; j < valid; ++j) {
      if (j + ahead < valid) __builtin_prefetch(cell + key[kept[j + ahead]]);
      const int64_t i = kept[j];
      int32_t& id = cell[key[i]];
      if (id == -1) id = add(key[i]);
      put(i, id);
    }
  } else {
    // Only the voxels taken are stored: once max_voxels are, a key not in the table is refused
    // without being added, so the table holds at most `limit` keys and stays in cache; sized for
    // twice as many, it is at most a third full and a key it lacks is found missing at once.
    IdTable table(2 * std::min<int64_t>(valid, limit));
    bool inserted = false;
    const auto same = [](int32_t) { return true; };  // mix64 is one to one: equal hashes are equal keys
    for (int64_t j = 0; j < valid; ++j) {
      if (j + ahead < valid) table.prefetch(hash[kept[j + ahead]]);
      const int64_t i = kept[j];
      int32_t id;
      if (m < limit) {
        id = table.find_or_insert(hash[i], static_cast<int32_t>(i), m, same, &inserted);
        if (inserted) add(key[i]);
      } else {
        id = table.find(hash[i], -2, same);
      }
      put(i, id);
    }
  }

  int64_t bytes = 0;
  OB_CHECK(!__builtin_mul_overflow(int64_t{m} * max_points, c * static_cast<int64_t>(sizeof(T)), &bytes) &&
               bytes <= kMaxVoxelBytes,
           "voxels would be (", m, ", ", max_points, ", ", c, "): more than 2^34 bytes; max_points is too large");
  T* voxels = ctx.allocate_output(voxels_t, {m, max_points, c}).template data_as<T>();
  int32_t* coors = ctx.allocate_output(coors_t, {m, 3}).data_as<int32_t>();
  int32_t* num = ctx.allocate_output(num_t, {m}).data_as<int32_t>();
  const int64_t row = max_points * c;  // values per voxel
  ctx.parallel_for(m, 1 << 8, [&](int64_t b, int64_t e) {
    // A voxel's row is made in a small buffer and streamed out whole, so the output's lines are
    // written once and never read; a row too large for the buffer is filled in place.
    std::vector<T> buffer(static_cast<size_t>(row <= kStreamedRow ? row : 0));
    for (int64_t v = b; v < e; ++v) {
      // The points are read in voxel order, which is random in memory: fetch a few voxels ahead
      // their first point and the link to their second, then the second.
      if (v + 8 < e) {
        const int32_t h = vox[v + 8].head;
        __builtin_prefetch(p + int64_t{h} * c), __builtin_prefetch(next + h);
      }
      if (v + 4 < e && vox[v + 4].count > 1) __builtin_prefetch(p + int64_t{next[vox[v + 4].head]} * c);
      const Voxel& x = vox[v];
      const int64_t k = vox_key[v];
      coors[v * 3 + 0] = static_cast<int32_t>(k / (gx * gy));
      coors[v * 3 + 1] = static_cast<int32_t>(k / gx % gy);
      coors[v * 3 + 2] = static_cast<int32_t>(k % gx);
      num[v] = x.count;
      T* dst = voxels + v * row;
      T* out = row <= kStreamedRow ? buffer.data() : dst;
      T* at = out;
      for (int32_t s = 0, i = x.head; s < x.count; ++s, i = next[i], at += c)
        for (int64_t j = 0; j < c; ++j) at[j] = p[i * c + j];
      std::fill(at, out + row, T(0));
      if (out != dst) stream(dst, out, static_cast<size_t>(row) * sizeof(T));
    }
    stream_fence();
  });
}

template <typename T>
void dynamic(KernelContext& ctx, const TensorView& points, const Grid& g, TensorView& coors_t) {
  const int64_t n = points.dim(0), c = points.dim(1);
  const T* p = points.data_as<T>();
  int32_t* out = coors_t.data_as<int32_t>();
  for_each_voxel(ctx, p, c, n, g, [&](int64_t i, const int32_t* v) {
    for (int a = 0; a < 3; ++a) out[i * 3 + a] = v[0] < 0 ? -1 : v[2 - a];
  });
}

}  // namespace

void hard_voxelize_kernel(KernelContext& ctx, const TensorView& points, const std::vector<double>& voxel_size,
                          const std::vector<double>& point_cloud_range, int64_t max_points, int64_t max_voxels,
                          TensorView& voxels, TensorView& coors, TensorView& num_points_per_voxel) {
  const Grid g = make_grid(voxel_size, point_cloud_range);
  visit_dtype<float, double>(points.dtype, [&](auto zero) {
    hard<decltype(zero)>(ctx, points, g, max_points, max_voxels, voxels, coors, num_points_per_voxel);
  });
}

void dynamic_voxelize_kernel(KernelContext& ctx, const TensorView& points, const std::vector<double>& voxel_size,
                             const std::vector<double>& point_cloud_range, TensorView& coors) {
  const Grid g = make_grid(voxel_size, point_cloud_range);
  visit_dtype<float, double>(points.dtype, [&](auto zero) { dynamic<decltype(zero)>(ctx, points, g, coors); });
}

}  // namespace opbridge
