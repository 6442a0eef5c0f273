// roi_align and its gradient. Average pooling is separable (roi_geometry.h): per RoI the summed
// row weights of each output row and column weights of each output column are computed once, then
// each channel costs one pass over the RoI's rows and one over its bins, instead of four loads per
// sample. Max pooling visits the samples in mmcv's order (first strict maximum from -10000 wins),
// with their taps precomputed per RoI and shared by its channels. Forward work is split over
// RoIs x channels; the gradients over channels, so no two threads add into one input plane.
#include "roi_align_kernel.h"

#include "roi_geometry.h"

#include <algorithm>
#include <vector>

namespace opbridge {
namespace {

using roi::AxisWeights;
using roi::Bins;

// mmcv's starting maximum: a bin whose samples are all below it (or that has none) pools to it.
constexpr double kMaxStart = -10000.0;
constexpr int64_t kMaxSamples = int64_t(1) << 22;

struct Params {
  int64_t n, c, h, w, k, oh, ow, sampling_ratio;
  bool max_pool, aligned;
};

Params params(const TensorView& input, const TensorView& rois, const std::vector<int64_t>& output_size,
              int64_t sampling_ratio, const std::string& pool_mode, bool aligned) {
  OB_CHECK(pool_mode == "avg" || pool_mode == "max", "pool_mode must be 'avg' or 'max', got '", pool_mode, "'");
  Params p{input.dim(0), input.dim(1), input.dim(2), input.dim(3), rois.dim(0), 0, 0, sampling_ratio,
           pool_mode == "max", aligned};
  roi::pooled_size(output_size, p.oh, p.ow);
  return p;
}

// Every RoI's bins, checked (batch index, finite corners, sample counts) before any parallel work.
template <typename T>
std::vector<Bins<T>> all_bins(const Params& p, const T* rois, double spatial_scale) {
  std::vector<Bins<T>> out(static_cast<size_t>(p.k));
  const T scale = static_cast<T>(static_cast<float>(spatial_scale));
  for (int64_t k = 0; k < p.k; ++k) {
    out[k] = roi::bins(rois + 5 * k, k, p.n, scale, p.oh, p.ow, p.sampling_ratio, p.aligned, !p.aligned, true);
    // Max pooling keeps every sample of a RoI's bins at once (shared by its channels).
    OB_CHECK(!p.max_pool || out[k].samples_per_bin() * p.oh * p.ow <= kMaxSamples, "RoI ", k, " has ",
             out[k].samples_per_bin() * p.oh * p.ow, " samples; max pooling takes at most ", kMaxSamples,
             " per RoI (lower sampling_ratio)");
  }
  return out;
}

template <typename T>
struct Separable {
  AxisWeights<T> rows, cols;
  int64_t xlo = 0, xhi = -1;  // the columns any bin reads
};

template <typename T>
std::vector<Separable<T>> all_weights(KernelContext& ctx, const Params& p, const std::vector<Bins<T>>& bins) {
  std::vector<Separable<T>> out(bins.size());
  // An empty input is read nowhere (every sample falls outside it), and its other axes, which may
  // be huge beside a zero one, must not size the scratch.
  const bool empty = p.n == 0 || p.c == 0 || p.h == 0 || p.w == 0;
  const int64_t h = empty ? 0 : p.h, w = empty ? 0 : p.w;
  ctx.parallel_for(p.k, 16, [&](int64_t b, int64_t e) {
    std::vector<T> dense(static_cast<size_t>(std::max(h, w)), T(0));
    for (int64_t k = b; k < e; ++k) {
      const Bins<T>& g = bins[k];
      Separable<T>& s = out[k];
      s.rows.build(p.oh, g.grid_h, h, [&](int64_t ph, int64_t iy) { return g.y(ph, iy); }, dense);
      s.cols.build(p.ow, g.grid_w, w, [&](int64_t pw, int64_t ix) { return g.x(pw, ix); }, dense);
      s.xlo = p.w;
      s.xhi = -1;
      for (int64_t pw = 0; pw < p.ow; ++pw) {
        if (!s.cols.len[pw]) continue;
        s.xlo = std::min(s.xlo, s.cols.first[pw]);
        s.xhi = std::max(s.xhi, s.cols.first[pw] + s.cols.len[pw] - 1);
      }
    }
  });
  return out;
}

// One sample of a max-pooled bin: its four neighbours (flat indices) and weights, and where it is.
template <typename T>
struct Sample {
  int64_t p1, p2, p3, p4;
  T w1, w2, w3, w4;
  bool inside;
};

template <typename T>
void max_samples(const Params& p, const Bins<T>& g, std::vector<Sample<T>>& out) {
  out.clear();
  for (int64_t ph = 0; ph < p.oh; ++ph)
    for (int64_t pw = 0; pw < p.ow; ++pw)
      for (int64_t iy = 0; iy < g.grid_h; ++iy) {
        const roi::Tap<T> ty = roi::tap(g.y(ph, iy), p.h);
        for (int64_t ix = 0; ix < g.grid_w; ++ix) {
          const roi::Tap<T> tx = roi::tap(g.x(pw, ix), p.w);
          if (!ty.inside || !tx.inside) {
            out.push_back({0, 0, 0, 0, T(0), T(0), T(0), T(0), false});
            continue;
          }
          out.push_back({ty.lo * p.w + tx.lo, ty.lo * p.w + tx.hi, ty.hi * p.w + tx.lo, ty.hi * p.w + tx.hi,
                         ty.wlo * tx.wlo, ty.wlo * tx.whi, ty.whi * tx.wlo, ty.whi * tx.whi, true});
        }
      }
}

template <typename T>
T sample_value(const Sample<T>& s, const T* plane) {
  if (!s.inside) return T(0);
  return s.w1 * plane[s.p1] + s.w2 * plane[s.p2] + s.w3 * plane[s.p3] + s.w4 * plane[s.p4];
}

// The index of bin `bin`'s first strict maximum among its `n` samples, -1 when none beats kMaxStart.
template <typename T>
int64_t bin_argmax(const Sample<T>* s, int64_t n, const T* plane, T& best) {
  best = static_cast<T>(kMaxStart);
  int64_t at = -1;
  for (int64_t i = 0; i < n; ++i) {
    const T v = sample_value(s[i], plane);
    if (v > best) {
      best = v;
      at = i;
    }
  }
  return at;
}

template <typename T>
void avg_forward(KernelContext& ctx, const Params& p, const T* in, const std::vector<Bins<T>>& bins, T* out) {
  const std::vector<Separable<T>> sep = all_weights(ctx, p, bins);
  const int64_t plane = p.h * p.w, bin_count = p.oh * p.ow;
  ctx.parallel_for(p.k * p.c, 8, [&](int64_t b, int64_t e) {
    std::vector<T> tmp(static_cast<size_t>(p.w));
    for (int64_t item = b; item < e; ++item) {
      const int64_t k = item / p.c, c = item % p.c;
      const Bins<T>& g = bins[k];
      const Separable<T>& s = sep[k];
      const T* src = in + (g.batch * p.c + c) * plane;
      T* dst = out + item * bin_count;
      const int64_t span = s.xhi - s.xlo + 1;
      for (int64_t ph = 0; ph < p.oh; ++ph) {
        // tmp[x] = Σ_r wr[r]·src[r][x] over the RoI's columns
        std::fill(tmp.begin(), tmp.begin() + std::max<int64_t>(span, 0), T(0));
        const T* wr = s.rows.w.data() + s.rows.offset[ph];
        for (int64_t i = 0; i < s.rows.len[ph] && span > 0; ++i) {
          const T wgt = wr[i];
          const T* row = src + (s.rows.first[ph] + i) * p.w + s.xlo;
          for (int64_t x = 0; x < span; ++x) tmp[x] += wgt * row[x];
        }
        for (int64_t pw = 0; pw < p.ow; ++pw) {
          const T* wc = s.cols.w.data() + s.cols.offset[pw];
          const T* t = tmp.data() + (s.cols.first[pw] - s.xlo);
          T acc = T(0);
          if (s.rows.len[ph])
            for (int64_t i = 0; i < s.cols.len[pw]; ++i) acc += wc[i] * t[i];
          dst[ph * p.ow + pw] = acc / g.count;
        }
      }
    }
  });
}

template <typename T>
void max_forward(KernelContext& ctx, const Params& p, const T* in, const std::vector<Bins<T>>& bins, T* out) {
  const int64_t plane = p.h * p.w, bin_count = p.oh * p.ow;
  ctx.parallel_for(p.k * p.c, 8, [&](int64_t b, int64_t e) {
    std::vector<Sample<T>> samples;
    int64_t have = -1;  // the RoI `samples` holds
    for (int64_t item = b; item < e; ++item) {
      const int64_t k = item / p.c, c = item % p.c;
      const Bins<T>& g = bins[k];
      if (k != have) max_samples(p, g, samples), have = k;
      const int64_t per_bin = g.samples_per_bin();
      const T* src = in + (g.batch * p.c + c) * plane;
      for (int64_t bin = 0; bin < bin_count; ++bin) {
        T best;
        bin_argmax(samples.data() + bin * per_bin, per_bin, src, best);
        out[item * bin_count + bin] = best;
      }
    }
  });
}

template <typename T>
void avg_backward(KernelContext& ctx, const Params& p, const T* grad, const std::vector<Bins<T>>& bins, T* gin) {
  const std::vector<Separable<T>> sep = all_weights(ctx, p, bins);
  const int64_t plane = p.h * p.w, bin_count = p.oh * p.ow;
  ctx.parallel_for(p.c, 1, [&](int64_t b, int64_t e) {
    std::vector<T> tmp(static_cast<size_t>(p.w));
    for (int64_t c = b; c < e; ++c)
      for (int64_t k = 0; k < p.k; ++k) {
        const Bins<T>& g = bins[k];
        const Separable<T>& s = sep[k];
        const int64_t span = s.xhi - s.xlo + 1;
        if (span <= 0) continue;
        const T* go = grad + (k * p.c + c) * bin_count;
        T* dst = gin + (g.batch * p.c + c) * plane;
        for (int64_t ph = 0; ph < p.oh; ++ph) {
          if (!s.rows.len[ph]) continue;
          // tmp[x] = Σ_pw g[ph, pw]·wc[pw][x] / count, then spread over the bin rows' weights
          std::fill(tmp.begin(), tmp.begin() + span, T(0));
          for (int64_t pw = 0; pw < p.ow; ++pw) {
            const T gv = go[ph * p.ow + pw] / g.count;
            const T* wc = s.cols.w.data() + s.cols.offset[pw];
            T* t = tmp.data() + (s.cols.first[pw] - s.xlo);
            for (int64_t i = 0; i < s.cols.len[pw]; ++i) t[i] += gv * wc[i];
          }
          const T* wr = s.rows.w.data() + s.rows.offset[ph];
          for (int64_t i = 0; i < s.rows.len[ph]; ++i) {
            const T wgt = wr[i];
            T* row = dst + (s.rows.first[ph] + i) * p.w + s.xlo;
            for (int64_t x = 0; x < span; ++x) row[x] += wgt * tmp[x];
          }
        }
      }
  });
}

template <typename T>
void max_backward(KernelContext& ctx, const Params& p, const T* in, const T* grad, const std::vector<Bins<T>>& bins,
                  T* gin) {
  const int64_t plane = p.h * p.w, bin_count = p.oh * p.ow;
  ctx.parallel_for(p.c, 1, [&](int64_t b, int64_t e) {
    std::vector<Sample<T>> samples;
    for (int64_t c = b; c < e; ++c)
      for (int64_t k = 0; k < p.k; ++k) {
        const Bins<T>& g = bins[k];
        max_samples(p, g, samples);
        const int64_t per_bin = g.samples_per_bin();
        const T* src = in + (g.batch * p.c + c) * plane;
        T* dst = gin + (g.batch * p.c + c) * plane;
        for (int64_t bin = 0; bin < bin_count; ++bin) {
          const Sample<T>* s = samples.data() + bin * per_bin;
          T best;
          const int64_t at = bin_argmax(s, per_bin, src, best);
          if (at < 0 || !s[at].inside) continue;  // the maximum is a sample outside: no gradient
          const T gv = grad[(k * p.c + c) * bin_count + bin];
          dst[s[at].p1] += gv * s[at].w1;
          dst[s[at].p2] += gv * s[at].w2;
          dst[s[at].p3] += gv * s[at].w3;
          dst[s[at].p4] += gv * s[at].w4;
        }
      }
  });
}

}  // namespace

void roi_align_kernel(KernelContext& ctx, const TensorView& input, const TensorView& rois,
                      const std::vector<int64_t>& output_size, double spatial_scale, int64_t sampling_ratio,
                      const std::string& pool_mode, bool aligned, TensorView& output) {
  const Params p = params(input, rois, output_size, sampling_ratio, pool_mode, aligned);
  visit_dtype<float, double>(input.dtype, [&](auto zero) {
    using T = decltype(zero);
    const std::vector<Bins<T>> bins = all_bins(p, rois.data_as<T>(), spatial_scale);
    if (p.max_pool)
      max_forward(ctx, p, input.data_as<T>(), bins, output.data_as<T>());
    else
      avg_forward(ctx, p, input.data_as<T>(), bins, output.data_as<T>());
  });
}

void roi_align_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& input,
                               const TensorView& rois, const std::vector<int64_t>& output_size, double spatial_scale,
                               int64_t sampling_ratio, const std::string& pool_mode, bool aligned,
                               TensorView& grad_input) {
  const Params p = params(input, rois, output_size, sampling_ratio, pool_mode, aligned);
  visit_dtype<float, double>(input.dtype, [&](auto zero) {
    using T = decltype(zero);
    const std::vector<Bins<T>> bins = all_bins(p, rois.data_as<T>(), spatial_scale);
    T* gin = grad_input.data_as<T>();
    std::fill(gin, gin + grad_input.numel(), T(0));
    if (p.max_pool)
      max_backward(ctx, p, input.data_as<T>(), grad_output.data_as<T>(), bins, gin);
    else
      avg_backward(ctx, p, grad_output.data_as<T>(), bins, gin);
  });
}

}  // namespace opbridge
