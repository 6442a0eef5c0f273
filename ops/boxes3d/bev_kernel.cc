// boxes_overlap_bev, nms3d and nms3d_normal: each box's bird's-eye footprint is prepared once; a
// pair then costs a circle test and, where the footprints may meet, one clipping of a rectangle by
// the other's edges (ops/rotated_boxes/rotated_box_geometry.h, the same corner convention as mmcv's
// iou3d kernels: the dx side along (cos h, sin h), the dy side along (-sin h, cos h)).
//
// NMS is greedy over the boxes by descending score: a box is kept unless a box kept before it has
// an IoU above the threshold with it (mmcv's mask pass, same decisions). It runs in chunks of
// candidates: each chunk is checked (in parallel when that pays) against the boxes kept before it,
// then in order against those kept within it; a check stops at the first box that suppresses.
#include <opbridge/error.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "rotated_boxes/rotated_box_geometry.h"
#include "boxes3d_kernel.h"

namespace opbridge {
namespace {

using rotated::PreparedBox;

// mmcv's EPS under the IoU's union (a float 1e-8).
constexpr float kEps = 1e-8f;

template <typename T>
bool finite_footprint(const T* b) {
  return std::isfinite(b[0]) && std::isfinite(b[1]) && std::isfinite(b[3]) && std::isfinite(b[4]) &&
         std::isfinite(b[6]);
}

// The footprint (x, y, dx, dy, heading) of a (x, y, z, dx, dy, dz, heading) row.
template <typename T>
PreparedBox<T> footprint(const T* b) {
  const T f[5] = {b[0], b[1], b[3], b[4], b[6]};
  return rotated::prepare<T>(f, 1.0);
}

// The area common to two footprints: NaN where either is not finite, 0 where either has a side
// that is not positive (such a box covers nothing).
template <typename T>
T common_area(const PreparedBox<T>& a, const T* ra, const PreparedBox<T>& b, const T* rb) {
  if (!a.finite || !b.finite) return std::numeric_limits<T>::quiet_NaN();
  if (!(ra[3] > 0 && ra[4] > 0 && rb[3] > 0 && rb[4] > 0)) return T(0);
  return rotated::intersection(a, b);
}

template <typename T>
void overlap(KernelContext& ctx, const TensorView& boxes_a, const TensorView& boxes_b, TensorView& y) {
  const T* pa = boxes_a.data_as<T>();
  const T* pb = boxes_b.data_as<T>();
  const int64_t n = boxes_a.dim(0), m = boxes_b.dim(0);
  std::vector<PreparedBox<T>> a(static_cast<size_t>(n)), b(static_cast<size_t>(m));
  for (int64_t i = 0; i < n; ++i) a[i] = footprint(pa + i * 7);
  for (int64_t j = 0; j < m; ++j) b[j] = footprint(pb + j * 7);
  T* out = y.data_as<T>();
  ctx.parallel_for(n, std::max<int64_t>(1, 4096 / std::max<int64_t>(m, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      for (int64_t j = 0; j < m; ++j) out[i * m + j] = common_area(a[i], pa + i * 7, b[j], pb + j * 7);
  });
}

// Each policy below holds the candidates in the order taken (position c) and the kept ones as
// columns (position k in keep order), and answers whether any kept box in [from, to) suppresses
// candidate c: an IoU above thr. The scans run in branch-free blocks of 16, which the compiler
// vectorises; the first block with a hit ends a scan.
constexpr size_t kBlock = 16;

// The rotated footprints' IoU, mmcv's iou_bev: overlap / max(area_a + area_b - overlap, EPS). A
// kept box whose circumscribed circle misses the candidate's (the same test as the clipping's own
// first step) has IoU 0, which suppresses only under a negative threshold.
template <typename T>
struct RotatedIou {
  std::vector<PreparedBox<T>> box;
  std::vector<T> area;
  std::vector<char> positive;
  std::vector<size_t> kept;
  std::vector<double> kx, ky, kr;
  RotatedIou(const T* d, const std::vector<int64_t>& order) {
    for (int64_t i : order) {
      const T* r = d + i * 7;
      box.push_back(footprint(r));
      area.push_back(r[3] * r[4]);
      positive.push_back(r[3] > 0 && r[4] > 0);
    }
  }
  void keep(size_t c) {
    kept.push_back(c), kx.push_back(box[c].cx), ky.push_back(box[c].cy), kr.push_back(box[c].radius);
  }
  size_t kept_count() const { return kept.size(); }
  // a is taken first (kept), b the candidate.
  T iou(size_t a, size_t b) const {
    const T inter = positive[a] && positive[b] ? rotated::intersection(box[a], box[b]) : T(0);
    return inter / std::max(area[a] + area[b] - inter, T(kEps));
  }
  bool suppressed(size_t c, size_t from, size_t to, T thr) const {
    if (from < to && T(0) > thr) return true;  // every IoU is >= 0
    const double cx = box[c].cx, cy = box[c].cy, cr = box[c].radius;
    for (size_t j = from; j < to; j += kBlock) {
      const size_t e = std::min(to, j + kBlock);
      unsigned near = 0;
      for (size_t u = j; u < e; ++u) {
        const double dx = cx - kx[u], dy = cy - ky[u], reach = (kr[u] + cr) * (1 + 1e-6);
        near |= static_cast<unsigned>(!(dx * dx + dy * dy > reach * reach)) << (u - j);
      }
      for (; near != 0; near &= near - 1)
        if (iou(kept[j + static_cast<size_t>(__builtin_ctz(near))], c) > thr) return true;
    }
    return false;
  }
};

// The footprints' IoU with the headings ignored, mmcv's iou_normal, operand for operand.
template <typename T>
struct AxisAlignedIou {
  std::vector<T> x1, y1, x2, y2, area;   // the candidates
  std::vector<T> kx1, ky1, kx2, ky2, ka;  // the kept
  AxisAlignedIou(const T* d, const std::vector<int64_t>& order) {
    for (int64_t i : order) {
      const T* r = d + i * 7;
      x1.push_back(r[0] - r[3] / 2), x2.push_back(r[0] + r[3] / 2);
      y1.push_back(r[1] - r[4] / 2), y2.push_back(r[1] + r[4] / 2);
      area.push_back(r[3] * r[4]);
    }
  }
  void keep(size_t c) {
    kx1.push_back(x1[c]), ky1.push_back(y1[c]), kx2.push_back(x2[c]), ky2.push_back(y2[c]), ka.push_back(area[c]);
  }
  size_t kept_count() const { return ka.size(); }
  bool suppressed(size_t c, size_t from, size_t to, T thr) const {
    const T bx1 = x1[c], by1 = y1[c], bx2 = x2[c], by2 = y2[c], ba = area[c];
    for (size_t j = from; j < to; j += kBlock) {
      const size_t e = std::min(to, j + kBlock);
      int hit = 0;
      for (size_t u = j; u < e; ++u) {
        const T left = std::max(kx1[u], bx1), right = std::min(kx2[u], bx2);
        const T top = std::max(ky1[u], by1), bottom = std::min(ky2[u], by2);
        const T inter = std::max(right - left, T(0)) * std::max(bottom - top, T(0));
        hit |= static_cast<int>(inter / std::max(ka[u] + ba - inter, T(kEps)) > thr);
      }
      if (hit) return true;
    }
    return false;
  }
};

// The candidates' order: by descending score, ties lowest index first; no scores: as given.
template <typename T>
std::vector<int64_t> candidates(const TensorView& boxes, const TensorView* scores) {
  const int64_t n = boxes.dim(0);
  const T* d = boxes.data_as<T>();
  for (int64_t i = 0; i < n; ++i)
    OB_CHECK(finite_footprint(d + i * 7), "boxes[", i, "] has a value that is not finite in x, y, dx, dy or heading");
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (scores == nullptr) return order;
  const T* s = scores->data_as<T>();
  for (int64_t i = 0; i < n; ++i) OB_CHECK(!std::isnan(s[i]), "scores[", i, "] is NaN: the order of the boxes is undefined");
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
  return order;
}

constexpr int64_t kChunk = 256;
// Pairs to check before a chunk's first pass is worth the threads' start.
constexpr int64_t kParallelPairs = int64_t{1} << 20;

template <typename T, typename Iou>
void greedy(KernelContext& ctx, const TensorView& boxes, const TensorView* scores, double iou_threshold,
            TensorView& keep) {
  const std::vector<int64_t> order = candidates<T>(boxes, scores);
  Iou iou(boxes.data_as<T>(), order);
  const T thr = static_cast<T>(static_cast<float>(iou_threshold));  // a float32 attribute, as mmcv's
  const int64_t n = static_cast<int64_t>(order.size());
  std::vector<char> gone(static_cast<size_t>(kChunk));
  std::vector<size_t> kept;  // positions in `order`
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    const size_t before = iou.kept_count();
    auto first_pass = [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c)
        gone[static_cast<size_t>(c)] = iou.suppressed(static_cast<size_t>(start + c), 0, before, thr);
    };
    if (static_cast<int64_t>(before) * (end - start) >= kParallelPairs)
      ctx.parallel_for(end - start, 16, first_pass);
    else
      first_pass(0, end - start);
    for (int64_t c = start; c < end; ++c)
      if (!gone[static_cast<size_t>(c - start)] && !iou.suppressed(static_cast<size_t>(c), before, iou.kept_count(), thr)) {
        iou.keep(static_cast<size_t>(c));
        kept.push_back(static_cast<size_t>(c));
      }
  }
  int64_t* out = ctx.allocate_output(keep, {static_cast<int64_t>(kept.size())}).data_as<int64_t>();
  for (size_t k = 0; k < kept.size(); ++k) out[k] = order[kept[k]];
}

}  // namespace

void boxes_overlap_bev_kernel(KernelContext& ctx, const TensorView& boxes_a, const TensorView& boxes_b,
                              TensorView& y) {
  if (boxes_a.dtype == DType::Float64) return overlap<double>(ctx, boxes_a, boxes_b, y);
  overlap<float>(ctx, boxes_a, boxes_b, y);
}

void nms3d_kernel(KernelContext& ctx, const TensorView& boxes, const TensorView* scores, double iou_threshold,
                  TensorView& keep) {
  if (boxes.dtype == DType::Float64) return greedy<double, RotatedIou<double>>(ctx, boxes, scores, iou_threshold, keep);
  greedy<float, RotatedIou<float>>(ctx, boxes, scores, iou_threshold, keep);
}

void nms3d_normal_kernel(KernelContext& ctx, const TensorView& boxes, const TensorView* scores,
                         double iou_threshold, TensorView& keep) {
  if (boxes.dtype == DType::Float64)
    return greedy<double, AxisAlignedIou<double>>(ctx, boxes, scores, iou_threshold, keep);
  greedy<float, AxisAlignedIou<float>>(ctx, boxes, scores, iou_threshold, keep);
}

}  // namespace opbridge
