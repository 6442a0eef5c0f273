// Where roi_align, ps_roi_align and roi_pool sample: a RoI's bins, the bilinear taps of a sample
// position (the Caffe2 / Detectron rule mmcv and torchvision share), and the per-bin row and
// column weights that make average pooling separable.
#pragma once

#include <opbridge/error.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace opbridge::roi {

// Beyond this many samples along one axis of a bin, adaptive sampling (ceil(bin size)) is refused:
// such a RoI is millions of pixels wide, and its loops would run for hours.
inline constexpr double kMaxGrid = double(1 << 20);

inline void pooled_size(const std::vector<int64_t>& size, int64_t& oh, int64_t& ow) {
  OB_CHECK(size.size() == 2, "output_size must be (height, width), got ", size.size(), " values");
  oh = size[0];
  ow = size[1];
}

// The batch index of RoI k (truncated, as mmcv and torchvision read it), after checking the row.
template <typename T>
int64_t batch_of(const T* roi, int64_t k, int64_t n) {
  OB_CHECK(roi[0] >= T(0) && roi[0] < static_cast<T>(n), "rois[", k, ", 0] (the batch index) is ",
           static_cast<double>(roi[0]), ", outside [0, ", n, ") for an input of batch size ", n);
  for (int j = 1; j < 5; ++j)
    OB_CHECK(std::isfinite(static_cast<double>(roi[j])), "rois[", k, ", ", j, "] is ", static_cast<double>(roi[j]),
             ": RoI coordinates must be finite");
  return static_cast<int64_t>(roi[0]);
}

// One RoI of the bilinear family: bin (ph, pw)'s samples iy, ix sit at
// start + p·bin + (i + .5)·bin / grid, in the input's type as mmcv and torchvision compute them.
template <typename T>
struct Bins {
  int64_t batch = 0;
  T start_h = 0, start_w = 0, bin_h = 0, bin_w = 0;
  int64_t grid_h = 0, grid_w = 0;
  T count = 1;  // what a bin's sum is divided by

  int64_t samples_per_bin() const { return grid_h > 0 && grid_w > 0 ? grid_h * grid_w : 0; }

  T y(int64_t ph, int64_t iy) const {
    return start_h + static_cast<T>(ph) * bin_h + static_cast<T>(iy + .5f) * bin_h / static_cast<T>(grid_h);
  }
  T x(int64_t pw, int64_t ix) const {
    return start_w + static_cast<T>(pw) * bin_w + static_cast<T>(ix + .5f) * bin_w / static_cast<T>(grid_w);
  }
};

// aligned: corners shifted by -0.5 (pixel centres); otherwise a RoI is at least 1x1 (the legacy
// rule). count_floor_one: an empty grid divides by 1 (roi_align) rather than 0 (ps_roi_align,
// whose empty bins are NaN as torchvision's).
template <typename T>
Bins<T> bins(const T* roi, int64_t k, int64_t n, T scale, int64_t oh, int64_t ow, int64_t sampling_ratio,
             bool aligned, bool legacy_min_size, bool count_floor_one) {
  Bins<T> b;
  b.batch = batch_of(roi, k, n);
  const T offset = aligned ? T(0.5) : T(0);
  b.start_w = roi[1] * scale - offset;
  b.start_h = roi[2] * scale - offset;
  T width = (roi[3] * scale - offset) - b.start_w;
  T height = (roi[4] * scale - offset) - b.start_h;
  if (legacy_min_size) {
    width = std::max(width, T(1));
    height = std::max(height, T(1));
  }
  b.bin_h = height / static_cast<T>(oh);
  b.bin_w = width / static_cast<T>(ow);
  auto grid = [&](T bin, const char* axis) -> int64_t {
    if (sampling_ratio > 0) return sampling_ratio;
    const double g = std::ceil(static_cast<double>(bin));
    OB_CHECK(g <= kMaxGrid, "RoI ", k, " needs ", g, " samples per bin along its ", axis,
             " (sampling_ratio 0 samples ceil(bin size)); at most ", kMaxGrid, " are allowed");
    // A negative bin (an inverted RoI) samples nothing, however large: held at -kMaxGrid, the
    // count keeps its sign (what the empty sum is divided by) and grid_h * grid_w cannot overflow.
    return static_cast<int64_t>(std::max(g, -kMaxGrid));
  };
  b.grid_h = grid(b.bin_h, "height");
  b.grid_w = grid(b.bin_w, "width");
  const int64_t c = b.grid_h * b.grid_w;
  b.count = static_cast<T>(count_floor_one ? std::max<int64_t>(c, 1) : c);
  return b;
}

// The two neighbours of position v along an axis of `size` pixels and their weights; a position
// below -1 or above size (or an empty axis) samples nothing.
template <typename T>
struct Tap {
  int64_t lo = 0, hi = 0;
  T wlo = 0, whi = 0;
  bool inside = false;
};

template <typename T>
Tap<T> tap(T v, int64_t size) {
  Tap<T> t;
  if (size == 0 || v < T(-1) || v > static_cast<T>(size)) return t;
  if (v <= T(0)) v = T(0);
  t.lo = static_cast<int64_t>(v);
  if (t.lo >= size - 1) {
    t.hi = t.lo = size - 1;
    v = static_cast<T>(t.lo);
  } else {
    t.hi = t.lo + 1;
  }
  const T l = v - static_cast<T>(t.lo);
  t.wlo = T(1) - l;
  t.whi = l;
  t.inside = true;
  return t;
}

// Per bin along one axis, the weight of each row (or column) summed over the bin's samples: a
// bilinear sample's weight is the product of its row and column weights, and a sample outside
// the image along either axis is 0, so a bin's sum is Σ_rows Σ_cols wr·wc·input.
template <typename T>
struct AxisWeights {
  std::vector<int64_t> first, len, offset;  // per bin: its first row, how many, where in w
  std::vector<T> w;

  // `pos(p, i)` is sample i of bin p; `dense` is scratch of `size` zeros, left zeroed.
  template <typename Pos>
  void build(int64_t pooled, int64_t grid, int64_t size, Pos pos, std::vector<T>& dense) {
    first.assign(pooled, 0);
    len.assign(pooled, 0);
    offset.assign(pooled, 0);
    w.clear();
    for (int64_t p = 0; p < pooled; ++p) {
      int64_t lo = std::numeric_limits<int64_t>::max(), hi = -1;
      for (int64_t i = 0; i < grid; ++i) {
        const Tap<T> t = tap(pos(p, i), size);
        if (!t.inside) continue;
        dense[t.lo] += t.wlo;
        dense[t.hi] += t.whi;
        lo = std::min(lo, t.lo);
        hi = std::max(hi, t.hi);
      }
      offset[p] = static_cast<int64_t>(w.size());
      if (hi < 0) continue;
      first[p] = lo;
      len[p] = hi - lo + 1;
      for (int64_t r = lo; r <= hi; ++r) {
        w.push_back(dense[r]);
        dense[r] = T(0);
      }
    }
  }
};

}  // namespace opbridge::roi
