// carafe's kernels. Output pixel (oy, ox) reads the k×k window of input pixels centred on
// (oy / s, ox / s). Along the width, input column ox / s + kx - r is column ox + (kx - r) * s of
// the features repeated s times along the width (`wide` below, built once per call): so every
// window column kx is a contiguous run over ox, multiplied by a contiguous row of its mask, and
// the inner loops are plain multiply-adds over a row that the compiler vectorises (the forward's
// row loop in a variant per instruction set, carafe_variants.h). Each window column's run is cut
// to the output columns whose input column lies inside the image, so positions outside
// contribute nothing at all (a NaN mask there stays out, as in mmcv).
#include "carafe_kernel.h"

#include <opbridge/float32_copy.h>

#include <algorithm>

#include "carafe_variant_impl.h"
#include "carafe_variants.h"

namespace opbridge {
namespace {

using carafe_impl::Geometry;
using carafe_impl::multiply_add;

constexpr int64_t kWorkPerChunk = 1 << 15;  // multiply-adds a parallel chunk should hold at least

int64_t grain(int64_t work_per_row) { return std::max<int64_t>(1, kWorkPerChunk / std::max<int64_t>(1, work_per_row)); }
int64_t lo(const Geometry& g, int64_t kx) { return carafe_impl::columns_from(g, kx); }
int64_t hi(const Geometry& g, int64_t kx) { return carafe_impl::columns_to(g, kx); }

// features (N, C, H, W) -> (N, C, H, W * s), each value repeated s times.
template <typename T>
const T* repeat_columns(KernelContext& ctx, const Geometry& g, const T* features) {
  T* wide = static_cast<T*>(ctx.scratch(static_cast<size_t>(g.n * g.c * g.h * g.wo) * sizeof(T)));
  ctx.parallel_for(g.n * g.c * g.h, grain(g.wo), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const T* in = features + row * g.w;
      T* out = wide + row * g.wo;
      for (int64_t x = 0; x < g.w; ++x)
        for (int64_t q = 0; q < g.s; ++q) out[x * g.s + q] = in[x];
    }
  });
  return wide;
}

// window_row: the float32 variant the CPU runs best, or the float64 loop.
template <typename T>
void forward(KernelContext& ctx, const Geometry& g, const T* features, const T* masks,
             carafe_impl::WindowRow<T> window_row, T* output) {
  const T* wide = repeat_columns(ctx, g, features);
  const int64_t plane = g.ho * g.wo;
  ctx.parallel_for(g.n * g.ho, grain(g.c * g.k * g.k * g.wo), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t ni = row / g.ho, oy = row % g.ho, iy0 = oy / g.s;
      for (int64_t c = 0; c < g.c; ++c) {
        T* out = output + ((ni * g.c + c) * g.ho + oy) * g.wo;
        std::fill(out, out + g.wo, T(0));
        const int64_t group = c / g.group_channels;
        for (int64_t ky = 0; ky < g.k; ++ky) {
          const int64_t iy = iy0 + ky - g.r;
          if (iy < 0 || iy >= g.h) continue;
          const T* in = wide + ((ni * g.c + c) * g.h + iy) * g.wo;
          window_row(g, out, in, masks + ((ni * g.mask_channels + (group * g.k + ky) * g.k) * g.ho + oy) * g.wo, plane);
        }
      }
    }
  });
}

// grad_masks[n, (group, ky, kx), oy, ox] = sum over the group's channels of
// grad_output[n, c, oy, ox] * features at the window position; per output row, as the forward.
template <typename T>
void masks_gradient(KernelContext& ctx, const Geometry& g, const T* grad_output, const T* wide, T* grad_masks) {
  ctx.parallel_for(g.n * g.ho, grain(g.c * g.k * g.k * g.wo), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t ni = row / g.ho, oy = row % g.ho, iy0 = oy / g.s;
      auto mask_row = [&](int64_t mc) { return grad_masks + ((ni * g.mask_channels + mc) * g.ho + oy) * g.wo; };
      for (int64_t mc = 0; mc < g.mask_channels; ++mc) std::fill(mask_row(mc), mask_row(mc) + g.wo, T(0));
      for (int64_t c = 0; c < g.c; ++c) {
        const T* grad = grad_output + ((ni * g.c + c) * g.ho + oy) * g.wo;
        const int64_t group = c / g.group_channels;
        for (int64_t ky = 0; ky < g.k; ++ky) {
          const int64_t iy = iy0 + ky - g.r;
          if (iy < 0 || iy >= g.h) continue;
          const T* in = wide + ((ni * g.c + c) * g.h + iy) * g.wo;
          for (int64_t kx = 0; kx < g.k; ++kx)
            multiply_add(mask_row((group * g.k + ky) * g.k + kx), 0, in, (kx - g.r) * g.s, grad, lo(g, kx), hi(g, kx));
        }
      }
    }
  });
}

// grad_features[n, c, iy, ix]: per input row, so no two chunks write one value. Input row iy is
// window row ky of the s output rows of input row iy - ky + r; their grad_output * mask products
// land in a row `acc` indexed as the repeated columns, whose s columns per input column are then
// summed.
template <typename T>
void features_gradient(KernelContext& ctx, const Geometry& g, const T* grad_output, const T* masks, T* grad_features) {
  ctx.parallel_for(g.n * g.h, grain(g.c * g.k * g.k * g.s * g.wo), [&](int64_t b, int64_t e) {
    T* acc = static_cast<T*>(ctx.scratch(static_cast<size_t>(g.wo) * sizeof(T)));
    for (int64_t row = b; row < e; ++row) {
      const int64_t ni = row / g.h, iy = row % g.h;
      for (int64_t c = 0; c < g.c; ++c) {
        std::fill(acc, acc + g.wo, T(0));
        const int64_t group = c / g.group_channels;
        for (int64_t ky = 0; ky < g.k; ++ky) {
          const int64_t centre = iy - ky + g.r;
          if (centre < 0 || centre >= g.h) continue;
          for (int64_t oy = centre * g.s; oy < (centre + 1) * g.s; ++oy) {
            const T* grad = grad_output + ((ni * g.c + c) * g.ho + oy) * g.wo;
            for (int64_t kx = 0; kx < g.k; ++kx) {
              const T* mask = masks + ((ni * g.mask_channels + (group * g.k + ky) * g.k + kx) * g.ho + oy) * g.wo;
              // acc[ox + (kx - r) * s] += grad[ox] * mask[ox] over the valid ox.
              multiply_add(acc, (kx - g.r) * g.s, grad, 0, mask, lo(g, kx), hi(g, kx));
            }
          }
        }
        T* out = grad_features + ((ni * g.c + c) * g.h + iy) * g.w;
        for (int64_t x = 0; x < g.w; ++x) {
          T sum = 0;
          for (int64_t q = 0; q < g.s; ++q) sum += acc[x * g.s + q];
          out[x] = sum;
        }
      }
    }
  });
}

template <typename T>
void backward(KernelContext& ctx, const Geometry& g, const T* grad_output, const T* features, const T* masks,
              T* grad_features, T* grad_masks) {
  masks_gradient(ctx, g, grad_output, repeat_columns(ctx, g, features), grad_masks);
  features_gradient(ctx, g, grad_output, masks, grad_features);
}

}  // namespace

void carafe_kernel(KernelContext& ctx, const TensorView& features, const TensorView& masks, int64_t kernel_size,
                   int64_t group_size, int64_t scale_factor, TensorView& output) {
  const Geometry g = carafe_impl::geometry(features.dim(0), features.dim(1), features.dim(2), features.dim(3),
                                           kernel_size, group_size, scale_factor);
  if (output.numel() == 0) return;
  if (is_16bit_float(features.dtype)) {  // computed in float32, rounded once
    TensorView f = float32_copy(ctx, features), m = float32_copy(ctx, masks), out = float32_scratch(ctx, output);
    forward(ctx, g, f.data_as<float>(), m.data_as<float>(), carafe_impl::best_variant().window_row,
            out.data_as<float>());
    narrow_into(ctx, out, output);
    return;
  }
  if (features.dtype == DType::Float64)
    forward(ctx, g, features.data_as<double>(), masks.data_as<double>(), carafe_impl::window_row,
            output.data_as<double>());
  else
    forward(ctx, g, features.data_as<float>(), masks.data_as<float>(), carafe_impl::best_variant().window_row,
            output.data_as<float>());
}

void carafe_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& features,
                            const TensorView& masks, int64_t kernel_size, int64_t group_size, int64_t scale_factor,
                            TensorView& grad_features, TensorView& grad_masks) {
  const Geometry g = carafe_impl::geometry(features.dim(0), features.dim(1), features.dim(2), features.dim(3),
                                           kernel_size, group_size, scale_factor);
  if (is_16bit_float(features.dtype)) {
    TensorView go = float32_copy(ctx, grad_output), f = float32_copy(ctx, features), m = float32_copy(ctx, masks);
    TensorView gf = float32_scratch(ctx, grad_features), gm = float32_scratch(ctx, grad_masks);
    backward(ctx, g, go.data_as<float>(), f.data_as<float>(), m.data_as<float>(), gf.data_as<float>(),
             gm.data_as<float>());
    narrow_into(ctx, gf, grad_features);
    narrow_into(ctx, gm, grad_masks);
    return;
  }
  visit_dtype<float, double>(features.dtype, [&](auto zero) {
    using T = decltype(zero);
    backward(ctx, g, grad_output.data_as<T>(), features.data_as<T>(), masks.data_as<T>(), grad_features.data_as<T>(),
             grad_masks.data_as<T>());
  });
}

}  // namespace opbridge
