// What deform_conv2d's forward kernel (deform_conv2d_kernel.cc) and its backward kernel
// (deform_conv2d_backward.cc) share: the geometry read from the inputs and attributes, the
// channels-last bordered copy of the input, and the bilinear sampling tables of a tile of output
// pixels. Internal to the op's folder.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <opbridge/kernel_context.h>

#include "deform_conv2d_variants.h"

namespace opbridge::deform_conv2d_impl {

// A tile's column block (and sampling tables) of about this size stays in a core's L2 cache between
// the fill and the GEMM, and is wide enough that Eigen's repacking of the weight per tile costs
// little (measured: 512 KiB beat 128-256 KiB by 10-15% and matched 1-2 MiB; with the float32
// GEMM that packs the weight once per call, 256 KiB and 512 KiB time the same).
constexpr int64_t kTileBytes = 512 << 10;
// Channels-last copies of at most this many bytes at a time (at least one image).
constexpr int64_t kImageCopyBytes = 64 << 20;

struct Geometry {
  int64_t n, c_in, h, w, c_out, kh, kw, h_out, w_out;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, offset_groups;
  int64_t kk;      // kh·kw
  int64_t cg;      // input channels per convolution group
  int64_t mg;      // output channels per convolution group
  int64_t cog;     // input channels per offset group
  int64_t kg;      // GEMM depth: cg·kk
  int64_t pixels;  // h_out·w_out
};

// The attributes the forward and backward ops share (attributes_and_checks in deform_conv2d.cc).
struct Attributes {
  const std::vector<int64_t>& stride;
  const std::vector<int64_t>& padding;
  const std::vector<int64_t>& dilation;
  int64_t groups, offset_groups;
};

// (height, width) of a pair attribute. The shape rules read two values of each, so fewer have
// already failed; more would be ignored without a word.
inline std::pair<int64_t, int64_t> pair_attr(const std::vector<int64_t>& v, const char* name) {
  OB_CHECK(v.size() == 2, "attribute '", name, "' must have 2 values (height, width), got ", v.size());
  return {v[0], v[1]};
}

inline void check_at_least(const char* name, std::pair<int64_t, int64_t> v, int64_t min) {
  OB_CHECK(v.first >= min && v.second >= min, "attribute '", name, "' values must be >= ", min, ", got [", v.first,
           ", ", v.second, "]");
}

// Products of sizes of tensors that may be empty (a huge kernel or output of zero channels) do not
// fit in int64; they are only used when the tensors they describe have data, and then they fit.
inline int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

// What the spec's dimension checks cannot say: the ranges of padding, dilation and the groups,
// divisibility by the groups, the mask's channel count (an absent mask falls back to no input
// with that many channels), the kernel and output sizes.
inline Geometry geometry(const Attributes& a, const TensorView& input, const TensorView& weight,
                         const TensorView* mask, const TensorView& out) {
  Geometry g{};
  g.n = input.dim(0), g.c_in = input.dim(1), g.h = input.dim(2), g.w = input.dim(3);
  g.c_out = weight.dim(0), g.kh = weight.dim(2), g.kw = weight.dim(3);
  std::tie(g.stride_h, g.stride_w) = pair_attr(a.stride, "stride");  // >= 1: a spec check
  std::tie(g.pad_h, g.pad_w) = pair_attr(a.padding, "padding");
  check_at_least("padding", {g.pad_h, g.pad_w}, 0);
  std::tie(g.dil_h, g.dil_w) = pair_attr(a.dilation, "dilation");
  check_at_least("dilation", {g.dil_h, g.dil_w}, 1);
  g.groups = a.groups;
  g.offset_groups = a.offset_groups;
  OB_CHECK(g.groups >= 1, "attribute 'groups' must be >= 1, got ", g.groups);
  OB_CHECK(g.offset_groups >= 1, "attribute 'offset_groups' must be >= 1, got ", g.offset_groups);
  OB_CHECK(g.c_out % g.groups == 0, "output channels (weight.shape[0] = ", g.c_out, ") must be divisible by groups (",
           g.groups, ")");
  OB_CHECK(g.c_in % g.offset_groups == 0, "input channels (", g.c_in, ") must be divisible by offset_groups (",
           g.offset_groups, ")");
  OB_CHECK(g.kh >= 1 && g.kw >= 1, "kernel size (weight.shape[2:]) must be positive, got ", g.kh, "x", g.kw);
  g.kk = saturating_mul(g.kh, g.kw);
  if (mask)
    OB_CHECK(mask->dim(1) == saturating_mul(g.offset_groups, g.kk), "mask must have offset_groups*kh*kw = ",
             saturating_mul(g.offset_groups, g.kk), " channels, got ", mask->dim(1));
  g.h_out = out.dim(2), g.w_out = out.dim(3);
  OB_CHECK(g.h_out > 0 && g.w_out > 0, "output size would be ", g.h_out, "x", g.w_out,
           ": the input (with padding) is smaller than the dilated kernel");
  g.cg = g.c_in / g.groups;
  g.mg = g.c_out / g.groups;
  g.cog = g.c_in / g.offset_groups;
  g.kg = saturating_mul(g.cg, g.kk);
  g.pixels = saturating_mul(g.h_out, g.w_out);
  return g;
}

// The hot loops of the best variant this CPU runs, for T.
template <typename T>
inline const deform_conv2d_impl::Kernels<T>& hot_loops() {
  const deform_conv2d_impl::Variant& variant = deform_conv2d_impl::best_variant();
  if constexpr (std::is_same_v<T, float>)
    return variant.f32;
  else
    return variant.f64;
}

// The weight as (C_out, kh·kw, C_in/groups), the row order of the column blocks; the weight
// itself where that is already its order (at most one channel or kernel position per group).
template <typename T>
inline const T* reorder_weight(KernelContext& ctx, const T* weight, const Geometry& g) {
  const int64_t cg = g.cg, kk = g.kk;
  if (cg <= 1 || kk <= 1) return weight;
  T* reordered = static_cast<T*>(ctx.scratch(static_cast<size_t>(g.c_out * g.kg) * sizeof(T)));
  ctx.parallel_for(g.c_out, std::max<int64_t>(1, (32 << 10) / g.kg), [&](int64_t b, int64_t e) {
    for (int64_t co = b; co < e; ++co)
      for (int64_t c = 0; c < cg; ++c)
        for (int64_t k = 0; k < kk; ++k) reordered[(co * kk + k) * cg + c] = weight[(co * cg + c) * kk + k];
  });
  return reordered;
}

// Output pixels per tile: equal tiles whose column blocks and sampling tables (plus
// `extra_table_bytes` per offset group, kernel position and pixel) fit kTileBytes.
template <typename T>
inline int64_t tile_pixels(const Geometry& g, bool masked, int64_t column_blocks = 1, int64_t extra_table_bytes = 0) {
  const int64_t table_bytes =
      g.offset_groups * g.kk * (int64_t(sizeof(Corner<T>) + (masked ? sizeof(T) : 0)) + extra_table_bytes);
  const int64_t tile = std::min(
      g.pixels, std::max<int64_t>(8, kTileBytes / (column_blocks * g.kg * int64_t(sizeof(T)) + table_bytes)));
  const int64_t n_tiles = (g.pixels + tile - 1) / tile;
  return (g.pixels + n_tiles - 1) / n_tiles;
}

// Per-thread tables of one tile of output pixels.
template <typename T>
struct Buffers {
  Buffers(const Geometry& g, int64_t tile, bool masked, int64_t column_blocks = 1)
      : at(new T[static_cast<size_t>(2 * g.kk * tile)]),
        corners(new Corner<T>[static_cast<size_t>(g.offset_groups * g.kk * tile)]),
        mask(masked ? new T[static_cast<size_t>(g.offset_groups * g.kk * tile)] : nullptr),
        columns(new T[static_cast<size_t>(std::max<int64_t>(1, column_blocks * g.kg * tile))]) {}
  std::unique_ptr<T[]> at;               // [kernel position][y, x][pixel of the tile]: points before the offsets
  std::unique_ptr<Corner<T>[]> corners;  // [offset group][kernel position][pixel of the tile]
  std::unique_ptr<T[]> mask;             // same layout; empty without a mask
  std::unique_ptr<T[]> columns;          // column_blocks × [pixel of the tile][kernel position][channel of the group]
};

// Images [n0, n0 + nb) of input, channels-last with a zero border, one padded row per work item.
template <typename T>
inline void copy_channels_last(KernelContext& ctx, const T* input, int64_t n0, int64_t nb, const Geometry& g, T* nhwc) {
  const int64_t c_in = g.c_in, padded_h = g.h + 2, padded_w = g.w + 2, row = padded_w * c_in;
  const Kernels<T>& run = hot_loops<T>();
  ctx.parallel_for(nb * padded_h, std::max<int64_t>(1, (16 << 10) / std::max<int64_t>(1, row)),
                   [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t yp = r % padded_h;
      T* dst = nhwc + r * row;
      if (yp == 0 || yp == padded_h - 1) {
        std::fill(dst, dst + row, T(0));
        continue;
      }
      std::fill(dst, dst + c_in, T(0));
      std::fill(dst + row - c_in, dst + row, T(0));
      run.channels_last(input + ((n0 + r / padded_h) * c_in * g.h + (yp - 1)) * g.w, g.h * g.w, c_in, g.w, dst + c_in);
    }
  });
}

// The sampling points before the offsets of output pixels [p0, p0 + len), per kernel position
// (buf.at): the same for every offset group, computed once per tile.
// Row by row of output pixels: a loop the compiler vectorises (pixel by pixel, with the wrap to the
// next row, it took 1.5-2% of the forward's time). The points are integers, exact in T.
template <typename T>
inline void sample_points(const Geometry& g, int64_t p0, int64_t len, int64_t tile, Buffers<T>& buf) {
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) {
      T* at_y = buf.at.get() + 2 * (i * g.kw + j) * tile;
      T* at_x = at_y + tile;
      for (int64_t q = 0, ho = p0 / g.w_out, wo = p0 % g.w_out; q < len; q += g.w_out - wo, wo = 0, ++ho) {
        const int64_t run = std::min(len - q, g.w_out - wo);
        const T y = static_cast<T>(ho * g.stride_h - g.pad_h + i * g.dil_h);
        const int64_t x0 = wo * g.stride_w - g.pad_w + j * g.dil_w, sw = g.stride_w;
        T* __restrict ys = at_y + q;
        T* __restrict xs = at_x + q;
        for (int64_t r = 0; r < run; ++r) ys[r] = y, xs[r] = static_cast<T>(x0 + r * sw);
      }
    }
}

// Bilinear corners (and mask values) for every offset group and kernel position of output
// pixels [p0, p0 + len) of image n, from the points sample_points() left in buf.
template <typename T>
inline void sample_corners(const Geometry& g, const T* offset, const T* mask, int64_t n, int64_t p0, int64_t len,
                           int64_t tile, Buffers<T>& buf) {
  const int64_t kk = g.kk, pixels = g.pixels, padded_w = g.w + 2;
  const Kernels<T>& run = hot_loops<T>();
  for (int64_t og = 0; og < g.offset_groups; ++og)
    for (int64_t k = 0; k < kk; ++k) {
      const int64_t slot = (og * kk + k) * tile;
      const T* dy = offset + ((n * g.offset_groups + og) * kk + k) * 2 * pixels + p0;
      const T* at_y = buf.at.get() + 2 * k * tile;
      run.corners({at_y, at_y + tile, dy, dy + pixels, len, g.h, g.w, padded_w, buf.corners.get() + slot});
      if (mask) {
        const T* m = mask + ((n * g.offset_groups + og) * kk + k) * pixels + p0;
        std::copy(m, m + len, buf.mask.get() + slot);
      }
    }
}

// Both: the points, then the corners.
template <typename T>
inline void sample_tile(const Geometry& g, const T* offset, const T* mask, int64_t n, int64_t p0, int64_t len,
                        int64_t tile, Buffers<T>& buf) {
  sample_points(g, p0, len, tile, buf);
  sample_corners(g, offset, mask, n, p0, len, tile, buf);
}

}  // namespace opbridge::deform_conv2d_impl
