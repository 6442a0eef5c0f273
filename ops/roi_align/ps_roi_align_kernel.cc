// ps_roi_align and its gradient: bin (ph, pw) of output channel c reads input channel
// (c·oh + ph)·ow + pw, averaging its bilinear samples as roi_align does (half-pixel corners, no
// minimum size, an empty grid divides by 0 as torchvision's). Each bin is separable: Σ over its
// rows and columns of wr·wc·input. The forward splits RoIs x output channels; the gradient input
// channels, each of which exactly one (output channel, bin) reads.
#include "roi_align_kernel.h"

#include "roi_geometry.h"

#include <algorithm>
#include <vector>

namespace opbridge {
namespace {

template <typename T>
struct PsRoi {
  roi::Bins<T> bins;
  roi::AxisWeights<T> rows, cols;
};

template <typename T>
std::vector<PsRoi<T>> ps_rois(KernelContext& ctx, const TensorView& input, const TensorView& rois, int64_t oh,
                              int64_t ow, double spatial_scale, int64_t sampling_ratio) {
  // An empty input is read nowhere (every sample falls outside it), and its other axes, which may
  // be huge beside a zero one, must not size the scratch.
  const int64_t n = input.dim(0), k_count = rois.dim(0);
  const bool empty = input.numel() == 0;
  const int64_t h = empty ? 0 : input.dim(2), w = empty ? 0 : input.dim(3);
  const T* r = rois.data_as<T>();
  const T scale = static_cast<T>(static_cast<float>(spatial_scale));
  std::vector<PsRoi<T>> out(static_cast<size_t>(k_count));
  for (int64_t k = 0; k < k_count; ++k)
    out[k].bins = roi::bins(r + 5 * k, k, n, scale, oh, ow, sampling_ratio, true, false, false);
  ctx.parallel_for(k_count, 16, [&](int64_t b, int64_t e) {
    std::vector<T> dense(static_cast<size_t>(std::max(h, w)), T(0));
    for (int64_t k = b; k < e; ++k) {
      const roi::Bins<T>& g = out[k].bins;
      out[k].rows.build(oh, g.grid_h, h, [&](int64_t ph, int64_t iy) { return g.y(ph, iy); }, dense);
      out[k].cols.build(ow, g.grid_w, w, [&](int64_t pw, int64_t ix) { return g.x(pw, ix); }, dense);
    }
  });
  return out;
}

}  // namespace

void ps_roi_align_kernel(KernelContext& ctx, const TensorView& input, const TensorView& rois,
                         const std::vector<int64_t>& output_size, double spatial_scale, int64_t sampling_ratio,
                         TensorView& output, TensorView& channel_mapping) {
  int64_t oh, ow;
  roi::pooled_size(output_size, oh, ow);
  const int64_t c_in = input.dim(1), c_out = output.dim(1), plane = input.dim(2) * input.dim(3), w = input.dim(3);
  visit_dtype<float, double>(input.dtype, [&](auto zero) {
    using T = decltype(zero);
    const std::vector<PsRoi<T>> geo = ps_rois<T>(ctx, input, rois, oh, ow, spatial_scale, sampling_ratio);
    const T* in = input.data_as<T>();
    T* out = output.data_as<T>();
    int32_t* map = channel_mapping.data_as<int32_t>();
    ctx.parallel_for(rois.dim(0) * c_out, 4, [&](int64_t b, int64_t e) {
      for (int64_t item = b; item < e; ++item) {
        const PsRoi<T>& g = geo[item / c_out];
        const int64_t co = item % c_out;
        for (int64_t ph = 0; ph < oh; ++ph)
          for (int64_t pw = 0; pw < ow; ++pw) {
            const int64_t ci = (co * oh + ph) * ow + pw;
            const T* src = in + (g.bins.batch * c_in + ci) * plane;
            const T* wr = g.rows.w.data() + g.rows.offset[ph];
            const T* wc = g.cols.w.data() + g.cols.offset[pw];
            T acc = T(0);
            for (int64_t i = 0; i < g.rows.len[ph]; ++i) {
              const T* row = src + (g.rows.first[ph] + i) * w + g.cols.first[pw];
              T s = T(0);
              for (int64_t j = 0; j < g.cols.len[pw]; ++j) s += wc[j] * row[j];
              acc += wr[i] * s;
            }
            const int64_t o = (item * oh + ph) * ow + pw;
            out[o] = acc / g.bins.count;
            map[o] = static_cast<int32_t>(ci);
          }
      }
    });
  });
}

void ps_roi_align_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& input,
                                  const TensorView& rois, const std::vector<int64_t>& output_size,
                                  double spatial_scale, int64_t sampling_ratio, TensorView& grad_input) {
  int64_t oh, ow;
  roi::pooled_size(output_size, oh, ow);
  const int64_t c_in = input.dim(1), c_out = grad_output.dim(1), plane = input.dim(2) * input.dim(3);
  const int64_t w = input.dim(3), bin_count = oh * ow;
  visit_dtype<float, double>(input.dtype, [&](auto zero) {
    using T = decltype(zero);
    const std::vector<PsRoi<T>> geo = ps_rois<T>(ctx, input, rois, oh, ow, spatial_scale, sampling_ratio);
    const T* go = grad_output.data_as<T>();
    T* gin = grad_input.data_as<T>();
    std::fill(gin, gin + grad_input.numel(), T(0));
    ctx.parallel_for(c_out * bin_count, 1, [&](int64_t b, int64_t e) {
      for (int64_t ci = b; ci < e; ++ci) {  // input channel ci = (co·oh + ph)·ow + pw
        const int64_t co = ci / bin_count, ph = (ci % bin_count) / ow, pw = ci % ow;
        for (size_t k = 0; k < geo.size(); ++k) {
          const PsRoi<T>& g = geo[k];
          const T gv = go[((static_cast<int64_t>(k) * c_out + co) * oh + ph) * ow + pw] / g.bins.count;
          T* dst = gin + (g.bins.batch * c_in + ci) * plane;
          const T* wr = g.rows.w.data() + g.rows.offset[ph];
          const T* wc = g.cols.w.data() + g.cols.offset[pw];
          for (int64_t i = 0; i < g.rows.len[ph]; ++i) {
            T* row = dst + (g.rows.first[ph] + i) * w + g.cols.first[pw];
            const T gr = gv * wr[i];
            for (int64_t j = 0; j < g.cols.len[pw]; ++j) row[j] += gr * wc[j];
          }
        }
      }
    });
  });
}

}  // namespace opbridge
