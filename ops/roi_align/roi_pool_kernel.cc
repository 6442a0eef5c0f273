// roi_pool and its gradient: max pooling over whole-pixel bins. The bins of a RoI are computed
// once and shared by its channels; the forward splits RoIs x channels, the gradient channels (each
// thread owns its input planes).
#include "roi_align_kernel.h"

#include "roi_geometry.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace opbridge {
namespace {

// Half-open pixel ranges [h0, h1) x [w0, w1) per bin, clamped to the image.
struct PoolBins {
  int64_t batch = 0;
  std::vector<int64_t> h0, h1, w0, w1;
};

// Clamped before the cast to an integer: corners far outside the image stay far outside.
template <typename T>
int64_t pixel(T v) {
  constexpr double kFar = 1e15;
  return static_cast<int64_t>(std::clamp(static_cast<double>(v), -kFar, kFar));
}

template <typename T>
PoolBins pool_bins(const T* roi, int64_t k, int64_t n, int64_t h, int64_t w, int64_t oh, int64_t ow, T scale,
                   bool round_rois) {
  PoolBins b;
  b.batch = roi::batch_of(roi, k, n);
  b.h0.assign(oh, 0), b.h1.assign(oh, 0), b.w0.assign(ow, 0), b.w1.assign(ow, 0);
  auto clamp = [](int64_t v, int64_t size) { return std::min(std::max<int64_t>(v, 0), size); };
  if (round_rois) {
    // Corners scaled and rounded to whole pixels, both inclusive; a RoI is at least 1x1.
    const int64_t x1 = pixel(std::round(roi[1] * scale)), y1 = pixel(std::round(roi[2] * scale));
    const int64_t x2 = pixel(std::round(roi[3] * scale)), y2 = pixel(std::round(roi[4] * scale));
    const T bin_h = static_cast<T>(std::max<int64_t>(y2 - y1 + 1, 1)) / static_cast<T>(oh);
    const T bin_w = static_cast<T>(std::max<int64_t>(x2 - x1 + 1, 1)) / static_cast<T>(ow);
    for (int64_t ph = 0; ph < oh; ++ph) {
      b.h0[ph] = clamp(pixel(std::floor(static_cast<T>(ph) * bin_h)) + y1, h);
      b.h1[ph] = clamp(pixel(std::ceil(static_cast<T>(ph + 1) * bin_h)) + y1, h);
    }
    for (int64_t pw = 0; pw < ow; ++pw) {
      b.w0[pw] = clamp(pixel(std::floor(static_cast<T>(pw) * bin_w)) + x1, w);
      b.w1[pw] = clamp(pixel(std::ceil(static_cast<T>(pw + 1) * bin_w)) + x1, w);
    }
    return b;
  }
  // Bins cut from the scaled corners (x1·s, y1·s) .. ((x2 + 1)·s, (y2 + 1)·s); an empty RoI pools
  // nothing (all its bins stay empty).
  const T x1 = roi[1] * scale, y1 = roi[2] * scale;
  const T rw = (roi[3] + T(1)) * scale - x1, rh = (roi[4] + T(1)) * scale - y1;
  if (rw <= T(0) || rh <= T(0)) return b;
  const T bin_h = rh / static_cast<T>(oh), bin_w = rw / static_cast<T>(ow);
  for (int64_t ph = 0; ph < oh; ++ph) {
    b.h0[ph] = clamp(pixel(std::floor(static_cast<T>(ph) * bin_h + y1)), h);
    b.h1[ph] = clamp(pixel(std::ceil(static_cast<T>(ph + 1) * bin_h + y1)), h);
  }
  for (int64_t pw = 0; pw < ow; ++pw) {
    b.w0[pw] = clamp(pixel(std::floor(static_cast<T>(pw) * bin_w + x1)), w);
    b.w1[pw] = clamp(pixel(std::ceil(static_cast<T>(pw + 1) * bin_w + x1)), w);
  }
  return b;
}

template <typename T>
std::vector<PoolBins> all_pool_bins(const TensorView& input, const TensorView& rois, int64_t oh, int64_t ow,
                                    double spatial_scale, bool round_rois) {
  const T* r = rois.data_as<T>();
  const T scale = static_cast<T>(static_cast<float>(spatial_scale));
  std::vector<PoolBins> out(static_cast<size_t>(rois.dim(0)));
  for (int64_t k = 0; k < rois.dim(0); ++k)
    out[k] = pool_bins(r + 5 * k, k, input.dim(0), input.dim(2), input.dim(3), oh, ow, scale, round_rois);
  return out;
}

}  // namespace

void roi_pool_kernel(KernelContext& ctx, const TensorView& input, const TensorView& rois,
                     const std::vector<int64_t>& output_size, double spatial_scale, bool round_rois,
                     TensorView& output, TensorView& argmax) {
  int64_t oh, ow;
  roi::pooled_size(output_size, oh, ow);
  const int64_t c = input.dim(1), h = input.dim(2), w = input.dim(3);
  OB_CHECK(h * w <= std::numeric_limits<int32_t>::max(), "argmax is int32: an input plane of ", h, "x", w,
           " pixels has more positions than it holds");
  visit_dtype<float, double>(input.dtype, [&](auto zero) {
    using T = decltype(zero);
    const std::vector<PoolBins> bins = all_pool_bins<T>(input, rois, oh, ow, spatial_scale, round_rois);
    const T* in = input.data_as<T>();
    T* out = output.data_as<T>();
    int32_t* arg = argmax.data_as<int32_t>();
    ctx.parallel_for(rois.dim(0) * c, 8, [&](int64_t b, int64_t e) {
      for (int64_t item = b; item < e; ++item) {
        const PoolBins& g = bins[item / c];
        const T* src = in + (g.batch * c + item % c) * h * w;
        for (int64_t ph = 0; ph < oh; ++ph)
          for (int64_t pw = 0; pw < ow; ++pw) {
            const bool empty = g.h1[ph] <= g.h0[ph] || g.w1[pw] <= g.w0[pw];
            // An empty bin pools 0; otherwise the first strict maximum from -FLT_MAX (a bin of
            // NaNs keeps it, with argmax -1).
            T best = empty ? T(0) : -static_cast<T>(std::numeric_limits<float>::max());
            int64_t at = -1;
            for (int64_t y = g.h0[ph]; y < g.h1[ph]; ++y)
              for (int64_t x = g.w0[pw]; x < g.w1[pw]; ++x)
                if (src[y * w + x] > best) best = src[y * w + x], at = y * w + x;
            const int64_t o = (item * oh + ph) * ow + pw;
            out[o] = best;
            arg[o] = static_cast<int32_t>(at);
          }
      }
    });
  });
}

void roi_pool_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& input,
                              const TensorView& rois, const TensorView& argmax, const std::vector<int64_t>& output_size,
                              double spatial_scale, bool round_rois, TensorView& grad_input) {
  int64_t oh, ow;
  roi::pooled_size(output_size, oh, ow);
  const int64_t n = input.dim(0), c = input.dim(1), plane = input.dim(2) * input.dim(3), k_count = rois.dim(0);
  const int32_t* arg = argmax.data_as<int32_t>();
  for (int64_t i = 0; i < argmax.numel(); ++i)
    OB_CHECK(arg[i] >= -1 && arg[i] < plane, "argmax[", i, "] is ", arg[i], ", outside [-1, ", plane,
             ") (an index into an input plane, -1 for an empty bin)");
  visit_dtype<float, double>(input.dtype, [&](auto zero) {
    using T = decltype(zero);
    (void)spatial_scale, (void)round_rois;  // the bins are in argmax already
    const T* r = rois.data_as<T>();
    std::vector<int64_t> batch(static_cast<size_t>(k_count));
    for (int64_t k = 0; k < k_count; ++k) batch[k] = roi::batch_of(r + 5 * k, k, n);
    const T* go = grad_output.data_as<T>();
    T* gin = grad_input.data_as<T>();
    std::fill(gin, gin + grad_input.numel(), T(0));
    ctx.parallel_for(c, 1, [&](int64_t b, int64_t e) {
      for (int64_t ch = b; ch < e; ++ch)
        for (int64_t k = 0; k < k_count; ++k) {
          T* dst = gin + (batch[k] * c + ch) * plane;
          const int64_t base = (k * c + ch) * oh * ow;
          for (int64_t i = 0; i < oh * ow; ++i)
            if (arg[base + i] >= 0) dst[arg[base + i]] += go[base + i];
        }
    });
  });
}

}  // namespace opbridge
