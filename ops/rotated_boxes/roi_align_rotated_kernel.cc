// roi_align_rotated's kernels, with mmcv 2.x's CPU arithmetic in the input's dtype: each output
// bin averages grid_h x grid_w bilinear samples taken at the centres of a regular grid over the
// bin, in the RoI's own frame, turned by its angle about its centre. The forward runs (RoI,
// channel) pairs in parallel (each writes its own outputs, one channel's plane in cache for all
// of a RoI's bins); the backward runs channels in parallel, so every
// gradient pixel is summed by one thread in a fixed order (deterministic, no atomics).
#include <opbridge/error.h>
#include <opbridge/op.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "rotated_boxes_kernel.h"

namespace opbridge {
namespace {

// One RoI's frame, as mmcv computes it.
template <typename T>
struct Roi {
  int64_t batch = 0;
  T center_h = 0, center_w = 0, start_h = 0, start_w = 0, bin_h = 0, bin_w = 0, cos_t = 0, sin_t = 0;
  int64_t grid_h = 0, grid_w = 0;
  T count = 1;
};

// A bilinear sample: four pixel offsets in the image plane and their weights; pos[0] = -1 for a
// sample outside the image, which adds nothing (not even a NaN of pixel 0).
template <typename T>
struct Sample {
  int64_t pos[4];
  T w[4];
};

// Per RoI, the most samples one channel may take: an adaptive grid (sampling_ratio 0) grows with
// the RoI, and a RoI of absurd size would otherwise run for hours.
constexpr double kMaxSamplesPerRoi = double(1 << 26);

struct Geometry {
  int64_t n, channels, height, width, pooled_h, pooled_w;
};

template <typename T>
Roi<T> roi_frame(const T* r, int64_t k, const Geometry& g, T scale, int64_t sampling_ratio, bool aligned,
                 bool clockwise) {
  for (int c = 0; c < 6; ++c) OB_CHECK(std::isfinite(r[c]), "rois[", k, ", ", c, "] = ", r[c], " is not finite");
  Roi<T> f;
  f.batch = static_cast<int64_t>(r[0]);  // truncated, as mmcv does
  OB_CHECK(f.batch >= 0 && f.batch < g.n, "rois[", k, ", 0] = ", r[0], " is not a batch index of input (batch size ",
           g.n, ")");
  const T offset = aligned ? T(0.5) : T(0);
  f.center_w = r[1] * scale - offset;
  f.center_h = r[2] * scale - offset;
  T roi_w = r[3] * scale, roi_h = r[4] * scale;
  const T theta = clockwise ? -r[5] : r[5];
  f.cos_t = std::cos(theta);
  f.sin_t = std::sin(theta);
  if (aligned) {
    OB_CHECK(roi_w >= 0 && roi_h >= 0, "roi ", k, " has a negative size (w = ", roi_w, ", h = ", roi_h,
             " after spatial_scale); aligned=True takes sizes >= 0");
  } else {  // the legacy mode enlarges RoIs to at least one pixel
    roi_w = std::max(roi_w, T(1));
    roi_h = std::max(roi_h, T(1));
  }
  f.bin_h = roi_h / static_cast<T>(g.pooled_h);
  f.bin_w = roi_w / static_cast<T>(g.pooled_w);
  // mmcv rounds the adaptive grid with ceilf, in float whatever the dtype.
  f.grid_h = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(static_cast<float>(roi_h / g.pooled_h)));
  f.grid_w = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(static_cast<float>(roi_w / g.pooled_w)));
  OB_CHECK(double(f.grid_h) * double(f.grid_w) * double(g.pooled_h * g.pooled_w) <= kMaxSamplesPerRoi, "roi ", k,
           " (w = ", roi_w, ", h = ", roi_h, ") needs a ", f.grid_h, " x ", f.grid_w,
           " sampling grid per bin: more than 2^26 samples; give sampling_ratio > 0");
  f.count = static_cast<T>(std::max<int64_t>(f.grid_h * f.grid_w, 1));
  f.start_h = static_cast<T>(-roi_h / 2.0);
  f.start_w = static_cast<T>(-roi_w / 2.0);
  return f;
}

// The samples of bin (ph, pw) of RoI f, in mmcv's order (rows of the grid, then columns).
template <typename T>
void bin_samples(const Roi<T>& f, const Geometry& g, int64_t ph, int64_t pw, std::vector<Sample<T>>& out) {
  out.clear();
  const T height = static_cast<T>(g.height), width = static_cast<T>(g.width);
  for (int64_t iy = 0; iy < f.grid_h; ++iy) {
    const T yy = f.start_h + static_cast<T>(ph) * f.bin_h +
                 static_cast<T>(static_cast<float>(iy) + .5f) * f.bin_h / static_cast<T>(f.grid_h);
    for (int64_t ix = 0; ix < f.grid_w; ++ix) {
      const T xx = f.start_w + static_cast<T>(pw) * f.bin_w +
                   static_cast<T>(static_cast<float>(ix) + .5f) * f.bin_w / static_cast<T>(f.grid_w);
      T y = yy * f.cos_t - xx * f.sin_t + f.center_h;
      T x = yy * f.sin_t + xx * f.cos_t + f.center_w;
      Sample<T> s{{-1, 0, 0, 0}, {0, 0, 0, 0}};
      if (!(y < -1 || y > height || x < -1 || x > width)) {
        y = std::max(y, T(0));
        x = std::max(x, T(0));
        int64_t y_lo = static_cast<int64_t>(y), x_lo = static_cast<int64_t>(x), y_hi, x_hi;
        if (y_lo >= g.height - 1) {
          y_hi = y_lo = g.height - 1;
          y = static_cast<T>(y_lo);
        } else {
          y_hi = y_lo + 1;
        }
        if (x_lo >= g.width - 1) {
          x_hi = x_lo = g.width - 1;
          x = static_cast<T>(x_lo);
        } else {
          x_hi = x_lo + 1;
        }
        const T ly = y - static_cast<T>(y_lo), lx = x - static_cast<T>(x_lo);
        const T hy = T(1) - ly, hx = T(1) - lx;
        s = {{y_lo * g.width + x_lo, y_lo * g.width + x_hi, y_hi * g.width + x_lo, y_hi * g.width + x_hi},
             {hy * hx, hy * lx, ly * hx, ly * lx}};
      }
      out.push_back(s);
    }
  }
}

Geometry geometry(const TensorView& image, const std::vector<int64_t>& output_size) {
  OB_CHECK(output_size.size() == 2, "output_size must be (pooled_height, pooled_width), got ", output_size.size(),
           " values");
  return {image.dim(0), image.dim(1), image.dim(2), image.dim(3), output_size[0], output_size[1]};
}

template <typename T>
std::vector<Roi<T>> frames(const TensorView& rois, const Geometry& g, double spatial_scale, int64_t sampling_ratio,
                           bool aligned, bool clockwise) {
  const int64_t k = rois.dim(0);
  OB_CHECK(k == 0 || g.channels == 0 || (g.height > 0 && g.width > 0), "input has an empty image (", g.height, " x ",
           g.width, ") to pool RoIs from");
  std::vector<Roi<T>> out(static_cast<size_t>(k));
  const T* r = rois.data_as<T>();
  for (int64_t i = 0; i < k; ++i)
    out[i] = roi_frame<T>(r + i * 6, i, g, static_cast<T>(spatial_scale), sampling_ratio, aligned, clockwise);
  return out;
}

// The samples of every bin of RoI f, bin by bin (bin b's are [begin[b], begin[b + 1])).
template <typename T>
void roi_samples(const Roi<T>& f, const Geometry& g, std::vector<Sample<T>>& out, std::vector<size_t>& begin) {
  std::vector<Sample<T>> bin;
  out.clear();
  begin.assign(1, 0);
  for (int64_t ph = 0; ph < g.pooled_h; ++ph)
    for (int64_t pw = 0; pw < g.pooled_w; ++pw) {
      bin_samples(f, g, ph, pw, bin);
      out.insert(out.end(), bin.begin(), bin.end());
      begin.push_back(out.size());
    }
}

template <typename T>
void forward(KernelContext& ctx, const TensorView& input, const TensorView& rois, const std::vector<int64_t>& size,
             double spatial_scale, int64_t sampling_ratio, bool aligned, bool clockwise, TensorView& output) {
  const Geometry g = geometry(input, size);
  const std::vector<Roi<T>> roi = frames<T>(rois, g, spatial_scale, sampling_ratio, aligned, clockwise);
  const T* x = input.data_as<T>();
  T* y = output.data_as<T>();
  const int64_t bins = g.pooled_h * g.pooled_w, plane = g.height * g.width;
  // Units of (RoI, channel): a RoI's samples are found once per chunk, then each channel's plane
  // stays in cache while all of its bins are pooled.
  ctx.parallel_for(rois.dim(0) * g.channels, std::max<int64_t>(1, 4096 / std::max<int64_t>(bins, 1)),
                   [&](int64_t lo, int64_t hi) {
                     std::vector<Sample<T>> samples;
                     std::vector<size_t> begin;
                     int64_t have = -1;
                     for (int64_t i = lo; i < hi; ++i) {
                       const int64_t k = i / g.channels, c = i % g.channels;
                       const Roi<T>& f = roi[k];
                       if (k != have) roi_samples(f, g, samples, begin), have = k;
                       const T* img = x + (f.batch * g.channels + c) * plane;
                       T* out = y + i * bins;
                       for (int64_t b = 0; b < bins; ++b) {
                         T acc = 0;
                         for (size_t j = begin[b]; j < begin[b + 1]; ++j) {
                           const Sample<T>& s = samples[j];
                           if (s.pos[0] >= 0)
                             acc += s.w[0] * img[s.pos[0]] + s.w[1] * img[s.pos[1]] + s.w[2] * img[s.pos[2]] +
                                    s.w[3] * img[s.pos[3]];
                         }
                         out[b] = acc / f.count;
                       }
                     }
                   });
}

template <typename T>
void backward(KernelContext& ctx, const TensorView& grad_output, const TensorView& input, const TensorView& rois,
              const std::vector<int64_t>& size, double spatial_scale, int64_t sampling_ratio, bool aligned,
              bool clockwise, TensorView& grad_input) {
  const Geometry g = geometry(input, size);
  const std::vector<Roi<T>> roi = frames<T>(rois, g, spatial_scale, sampling_ratio, aligned, clockwise);
  const T* go = grad_output.data_as<T>();
  T* gi = grad_input.data_as<T>();
  std::fill(gi, gi + grad_input.numel(), T(0));
  const int64_t bins = g.pooled_h * g.pooled_w, plane = g.height * g.width;
  ctx.parallel_for(g.channels, 1, [&](int64_t lo, int64_t hi) {
    std::vector<Sample<T>> samples;
    std::vector<size_t> begin;
    for (int64_t k = 0; k < rois.dim(0); ++k) {
      const Roi<T>& f = roi[k];
      roi_samples(f, g, samples, begin);
      for (int64_t c = lo; c < hi; ++c) {
        const T* grad = go + (k * g.channels + c) * bins;
        T* img = gi + (f.batch * g.channels + c) * plane;
        for (int64_t b = 0; b < bins; ++b)
          for (size_t j = begin[b]; j < begin[b + 1]; ++j) {
            const Sample<T>& s = samples[j];
            if (s.pos[0] >= 0)
              for (int q = 0; q < 4; ++q) img[s.pos[q]] += grad[b] * s.w[q] / f.count;
          }
      }
    }
  });
}

}  // namespace

void roi_align_rotated_kernel(KernelContext& ctx, const TensorView& input, const TensorView& rois,
                              const std::vector<int64_t>& output_size, double spatial_scale, int64_t sampling_ratio,
                              bool aligned, bool clockwise, TensorView& output) {
  if (input.dtype == DType::Float64)
    return forward<double>(ctx, input, rois, output_size, spatial_scale, sampling_ratio, aligned, clockwise, output);
  forward<float>(ctx, input, rois, output_size, spatial_scale, sampling_ratio, aligned, clockwise, output);
}

void roi_align_rotated_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& input,
                                       const TensorView& rois, const std::vector<int64_t>& output_size,
                                       double spatial_scale, int64_t sampling_ratio, bool aligned, bool clockwise,
                                       TensorView& grad_input) {
  if (input.dtype == DType::Float64)
    return backward<double>(ctx, grad_output, input, rois, output_size, spatial_scale, sampling_ratio, aligned,
                            clockwise, grad_input);
  backward<float>(ctx, grad_output, input, rois, output_size, spatial_scale, sampling_ratio, aligned, clockwise,
                  grad_input);
}

}  // namespace opbridge
