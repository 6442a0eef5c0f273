// points_in_boxes_part / _all: every box is prepared once (its z centre, the sine and cosine of its
// heading, half sides and the radius of its bounding circle), then each point, in parallel, tests
// the boxes of its batch item: the z interval first, then the circle (a conservative bound: a point
// outside it by more than rounding cannot pass the exact test), and only then mmcv's test in the
// box's frame, with mmcv's operations in the points' type.
#include <opbridge/error.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "boxes3d_kernel.h"

namespace opbridge {
namespace {

template <typename T>
struct Box {
  T cx, cy, cz;   // cz: the z centre, bottom + dz / 2 (rounded to T, as mmcv's `cz += z_size / 2.0`)
  T cosa, sina;   // cos(-heading) and sin(-heading), in double rounded to T
  double hx, hy, hz;  // half sides, exact in double (mmcv compares against x_size / 2.0, a double)
  double reach2;  // the bounding circle's squared radius, widened for rounding; NaN/inf: no shortcut
};

template <typename T>
std::vector<Box<T>> prepare(const T* b, int64_t m) {
  std::vector<Box<T>> out(static_cast<size_t>(m));
  for (int64_t k = 0; k < m; ++k, b += 7) {
    Box<T>& o = out[static_cast<size_t>(k)];
    o.cx = b[0], o.cy = b[1];
    o.cz = static_cast<T>(static_cast<double>(b[2]) + static_cast<double>(b[5]) / 2.0);
    const double a = -static_cast<double>(b[6]);
    o.cosa = static_cast<T>(std::cos(a)), o.sina = static_cast<T>(std::sin(a));
    o.hx = static_cast<double>(b[3]) / 2.0, o.hy = static_cast<double>(b[4]) / 2.0;
    o.hz = static_cast<double>(b[5]) / 2.0;
    // The local coordinates are a rotation of (x - cx, y - cy) computed in T: their norm is that
    // one's to within a few units in the last place, far inside this margin.
    const double r2 = o.hx * o.hx + o.hy * o.hy;
    o.reach2 = r2 * (1 + 1e-4) + 1e-300;
  }
  return out;
}

// mmcv's check_pt_in_box3d: |z - cz| <= dz / 2, then strictly inside the box's footprint in its
// frame. A NaN coordinate fails every comparison it reaches: such a point is in no box.
template <typename T>
inline bool inside(const Box<T>& o, T x, T y, T z) {
  if (std::fabs(static_cast<double>(static_cast<T>(z - o.cz))) > o.hz) return false;
  const T sx = x - o.cx, sy = y - o.cy;
  const double d2 = static_cast<double>(sx) * sx + static_cast<double>(sy) * sy;
  if (d2 > o.reach2) return false;
  const T lx = sx * o.cosa + sy * (-o.sina);
  const T ly = sx * o.sina + sy * o.cosa;
  const double dlx = lx, dly = ly;
  return dlx > -o.hx && dlx < o.hx && dly > -o.hy && dly < o.hy;
}

template <typename T>
void dims(const TensorView& points, const TensorView& boxes, int64_t& b, int64_t& n, int64_t& m) {
  b = points.dim(0), n = points.dim(1), m = boxes.dim(1);
}

template <typename T, typename Emit>
void each_point(KernelContext& ctx, const TensorView& points, const TensorView& boxes, Emit emit) {
  int64_t nb, n, m;
  dims<T>(points, boxes, nb, n, m);
  // No point, nothing to answer: the boxes' preparation below is per batch item, which with no
  // points to bound it could be a huge number of empty items.
  if (nb == 0 || n == 0) return;
  const T* pb = boxes.data_as<T>();
  std::vector<std::vector<Box<T>>> prepared(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) prepared[static_cast<size_t>(b)] = prepare(pb + b * m * 7, m);
  const T* pp = points.data_as<T>();
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(m, 1));
  ctx.parallel_for(nb * n, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) emit(i, prepared[static_cast<size_t>(i / n)], pp + i * 3);
  });
}

template <typename T>
void part(KernelContext& ctx, const TensorView& points, const TensorView& boxes, TensorView& box_idx) {
  int32_t* out = box_idx.data_as<int32_t>();
  each_point<T>(ctx, points, boxes, [&](int64_t i, const std::vector<Box<T>>& bx, const T* p) {
    int32_t found = -1;
    for (size_t k = 0; k < bx.size(); ++k)
      if (inside(bx[k], p[0], p[1], p[2])) {
        found = static_cast<int32_t>(k);
        break;
      }
    out[i] = found;
  });
}

template <typename T>
void all(KernelContext& ctx, const TensorView& points, const TensorView& boxes, TensorView& box_mask) {
  int32_t* out = box_mask.data_as<int32_t>();
  const int64_t m = boxes.dim(1);
  each_point<T>(ctx, points, boxes, [&](int64_t i, const std::vector<Box<T>>& bx, const T* p) {
    int32_t* row = out + i * m;
    for (int64_t k = 0; k < m; ++k) row[k] = inside(bx[static_cast<size_t>(k)], p[0], p[1], p[2]) ? 1 : 0;
  });
}

void check_box_count(const TensorView& boxes) {
  // The part output indexes boxes with int32, as mmcv's does.
  OB_CHECK(boxes.dim(1) <= INT32_MAX, "boxes has ", boxes.dim(1), " boxes per batch item; at most 2^31 - 1 fit the "
           "int32 indices");
}

}  // namespace

void points_in_boxes_part_kernel(KernelContext& ctx, const TensorView& points, const TensorView& boxes,
                                 TensorView& box_idx) {
  check_box_count(boxes);
  if (points.dtype == DType::Float64) return part<double>(ctx, points, boxes, box_idx);
  part<float>(ctx, points, boxes, box_idx);
}

void points_in_boxes_all_kernel(KernelContext& ctx, const TensorView& points, const TensorView& boxes,
                                TensorView& box_mask) {
  if (points.dtype == DType::Float64) return all<double>(ctx, points, boxes, box_mask);
  all<float>(ctx, points, boxes, box_mask);
}

}  // namespace opbridge
