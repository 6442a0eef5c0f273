// box_iou_rotated's and nms_rotated's kernels: every box is prepared once (its sine, cosine and
// half sides), then each pair costs a circle test and, for pairs that may meet, one clipping
// (rotated_box_geometry.h).
#include <opbridge/error.h>
#include <opbridge/op.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "rotated_box_geometry.h"
#include "rotated_boxes_kernel.h"

namespace opbridge {
namespace {

using rotated::PreparedBox;

bool over_first(const std::string& mode) {
  OB_CHECK(mode == "iou" || mode == "iof", "mode must be 'iou' or 'iof', got '", mode, "'");
  return mode == "iof";
}

template <typename T>
std::vector<PreparedBox<T>> prepare_all(const TensorView& boxes, bool clockwise) {
  const T* p = boxes.data_as<T>();
  std::vector<PreparedBox<T>> out(static_cast<size_t>(boxes.dim(0)));
  const double sign = clockwise ? 1.0 : -1.0;  // counter-clockwise angles are mirrored
  for (size_t i = 0; i < out.size(); ++i) out[i] = rotated::prepare<T>(p + i * 5, sign);
  return out;
}

template <typename T>
void pairwise(KernelContext& ctx, const TensorView& b1, const TensorView& b2, bool iof, bool clockwise, TensorView& y) {
  const auto a = prepare_all<T>(b1, clockwise), b = prepare_all<T>(b2, clockwise);
  const int64_t m = b2.dim(0);
  T* out = y.data_as<T>();
  ctx.parallel_for(b1.dim(0), std::max<int64_t>(1, 4096 / std::max<int64_t>(m, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      for (int64_t j = 0; j < m; ++j) out[i * m + j] = rotated::overlap(a[i], b[j], iof);
  });
}

template <typename T>
void aligned(KernelContext& ctx, const TensorView& b1, const TensorView& b2, bool iof, bool clockwise, TensorView& y) {
  const T* p1 = b1.data_as<T>();
  const T* p2 = b2.data_as<T>();
  T* out = y.data_as<T>();
  const double sign = clockwise ? 1.0 : -1.0;
  ctx.parallel_for(b1.dim(0), 1024, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      out[i] = rotated::overlap(rotated::prepare<T>(p1 + i * 5, sign), rotated::prepare<T>(p2 + i * 5, sign), iof);
  });
}

// Greedy suppression in the order of descending score (ties: the lower index first): a box is
// kept unless a kept box of its label overlaps it with IoU >= iou_threshold (mmcv's CPU rule).
template <typename T>
std::vector<int64_t> suppress(const TensorView& dets, const TensorView& scores, const TensorView* labels,
                              float iou_threshold, bool clockwise) {
  const int64_t n = dets.dim(0);
  const T* s = scores.data_as<T>();
  const T* d = dets.data_as<T>();
  for (int64_t i = 0; i < n; ++i) {
    OB_CHECK(!std::isnan(s[i]), "scores[", i, "] is NaN: the order of the boxes is undefined");
    for (int c = 0; c < 5; ++c)
      OB_CHECK(std::isfinite(d[i * 5 + c]), "dets[", i, ", ", c, "] = ", d[i * 5 + c], " is not finite");
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
  // Labels as int64 in the sorted order (none: all one label).
  std::vector<int64_t> label(static_cast<size_t>(n), 0);
  if (labels != nullptr) {
    for (int64_t k = 0; k < n; ++k)
      label[k] = labels->dtype == DType::Int32 ? labels->data_as<int32_t>()[order[k]] : labels->data_as<int64_t>()[order[k]];
  }
  std::vector<PreparedBox<T>> box(static_cast<size_t>(n));
  const double sign = clockwise ? 1.0 : -1.0;
  for (int64_t k = 0; k < n; ++k) box[k] = rotated::prepare<T>(d + order[k] * 5, sign);
  const T threshold = static_cast<T>(iou_threshold);
  std::vector<char> gone(static_cast<size_t>(n), 0);
  std::vector<int64_t> keep;
  for (int64_t k = 0; k < n; ++k) {
    if (gone[k]) continue;
    keep.push_back(order[k]);
    for (int64_t j = k + 1; j < n; ++j)
      if (!gone[j] && label[j] == label[k] && rotated::overlap(box[k], box[j], false) >= threshold) gone[j] = 1;
  }
  return keep;
}

template <typename T>
void nms(KernelContext& ctx, const TensorView& dets, const TensorView& scores, const TensorView* labels,
         double iou_threshold, bool clockwise, TensorView& kept_dets, TensorView& keep) {
  // The threshold is a float32 attribute, compared in the boxes' dtype as mmcv does.
  const std::vector<int64_t> kept = suppress<T>(dets, scores, labels, static_cast<float>(iou_threshold), clockwise);
  const int64_t k = static_cast<int64_t>(kept.size());
  T* out = ctx.allocate_output(kept_dets, {k, 6}).data_as<T>();
  int64_t* idx = ctx.allocate_output(keep, {k}).data_as<int64_t>();
  const T* d = dets.data_as<T>();
  const T* s = scores.data_as<T>();
  for (int64_t r = 0; r < k; ++r) {
    idx[r] = kept[r];
    std::copy(d + kept[r] * 5, d + kept[r] * 5 + 5, out + r * 6);
    out[r * 6 + 5] = s[kept[r]];
  }
}

}  // namespace

void box_iou_rotated_kernel(KernelContext& ctx, const TensorView& boxes1, const TensorView& boxes2,
                            const std::string& mode, bool clockwise, TensorView& ious) {
  const bool iof = over_first(mode);
  if (boxes1.dtype == DType::Float64) return pairwise<double>(ctx, boxes1, boxes2, iof, clockwise, ious);
  pairwise<float>(ctx, boxes1, boxes2, iof, clockwise, ious);
}

void box_iou_rotated_aligned_kernel(KernelContext& ctx, const TensorView& boxes1, const TensorView& boxes2,
                                    const std::string& mode, bool clockwise, TensorView& ious) {
  const bool iof = over_first(mode);
  if (boxes1.dtype == DType::Float64) return aligned<double>(ctx, boxes1, boxes2, iof, clockwise, ious);
  aligned<float>(ctx, boxes1, boxes2, iof, clockwise, ious);
}

void nms_rotated_kernel(KernelContext& ctx, const TensorView& dets, const TensorView& scores, const TensorView* labels,
                        double iou_threshold, bool clockwise, TensorView& kept_dets, TensorView& keep) {
  if (dets.dtype == DType::Float64) return nms<double>(ctx, dets, scores, labels, iou_threshold, clockwise, kept_dets, keep);
  nms<float>(ctx, dets, scores, labels, iou_threshold, clockwise, kept_dets, keep);
}

}  // namespace opbridge
