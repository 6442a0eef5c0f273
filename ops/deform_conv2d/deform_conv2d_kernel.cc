// deform_conv2d's kernel (the op is defined in deform_conv2d.cc): im2col with bilinear sampling,
// then a GEMM per convolution group.
//
// The input is first copied to channels-last with a one-pixel zero border, so that a sample's
// four neighbours are four contiguous runs of channels (one vector loop over channels, no bounds
// checks: neighbours outside the image read the zero border). Work is split over (image, tile of
// output pixels); per tile the bilinear corners and weights are computed once per (offset group,
// kernel position, pixel) and reused for every channel of that offset group. The two hot loops
// (column fill, GEMM) come in one variant per instruction set, see deform_conv2d_variants.h.
#include "deform_conv2d_kernel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "deform_conv2d_variants.h"
#include <opbridge/float32_copy.h>

namespace opbridge {
namespace {

using deform_conv2d_impl::ColumnJob;
using deform_conv2d_impl::Corner;

// A tile's column block (and sampling tables) of about this size stays in a core's L2 cache between
// the fill and the GEMM, and is wide enough that Eigen's repacking of the weight per tile costs
// little (measured: 512 KiB beat 128-256 KiB by 10-15% and matched 1-2 MiB).
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

// (height, width) of a pair attribute. The shape rules read two values of each, so fewer have
// already failed; more would be ignored without a word.
std::pair<int64_t, int64_t> pair_attr(const KernelContext& ctx, const char* name) {
  const std::vector<int64_t>& v = ctx.attr_ints(name);
  OB_CHECK(v.size() == 2, "attribute '", name, "' must have 2 values (height, width), got ", v.size());
  return {v[0], v[1]};
}

void check_at_least(const char* name, std::pair<int64_t, int64_t> v, int64_t min) {
  OB_CHECK(v.first >= min && v.second >= min, "attribute '", name, "' values must be >= ", min, ", got [", v.first,
           ", ", v.second, "]");
}

// Products of sizes of tensors that may be empty (a huge kernel or output of zero channels) do not
// fit in int64; they are only used when the tensors they describe have data, and then they fit.
int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

// What the spec's dimension checks cannot say: the ranges of padding, dilation and the groups,
// divisibility by the groups, the mask's channel count (an absent mask falls back to no input
// with that many channels), the kernel and output sizes.
Geometry geometry(const KernelContext& ctx, const TensorView& input, const TensorView& weight,
                  const TensorView* mask, const TensorView& out) {
  Geometry g{};
  g.n = input.dim(0), g.c_in = input.dim(1), g.h = input.dim(2), g.w = input.dim(3);
  g.c_out = weight.dim(0), g.kh = weight.dim(2), g.kw = weight.dim(3);
  std::tie(g.stride_h, g.stride_w) = pair_attr(ctx, "stride");  // >= 1: a spec check
  std::tie(g.pad_h, g.pad_w) = pair_attr(ctx, "padding");
  check_at_least("padding", {g.pad_h, g.pad_w}, 0);
  std::tie(g.dil_h, g.dil_w) = pair_attr(ctx, "dilation");
  check_at_least("dilation", {g.dil_h, g.dil_w}, 1);
  g.groups = ctx.attr_int("groups");
  g.offset_groups = ctx.attr_int("offset_groups");
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

template <typename T>
Corner<T> corner(T y, T x, int64_t h, int64_t w, int64_t padded_w) {
  if (y > -1 && y < static_cast<T>(h) && x > -1 && x < static_cast<T>(w)) {
    // floor() by truncation (y, x > -1 here): a libm call on the baseline ISA otherwise.
    int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x);
    y0 -= static_cast<T>(y0) > y;
    x0 -= static_cast<T>(x0) > x;
    const T ly = y - static_cast<T>(y0), lx = x - static_cast<T>(x0), hy = 1 - ly, hx = 1 - lx;
    const int64_t pixel = (y0 + 1) * padded_w + x0 + 1;
    return {pixel, {hy * hx, hy * lx, ly * hx, ly * lx}};
  }
  // Outside the image the sample is 0: zero weights on the zero border. A NaN position gives NaN
  // weights, so a NaN offset shows in the output instead of being read as "outside".
  const T z = (std::isnan(y) || std::isnan(x)) ? std::numeric_limits<T>::quiet_NaN() : T(0);
  return {0, {z, z, z, z}};
}

// Per-thread tables of one tile of output pixels.
template <typename T>
struct Buffers {
  Buffers(const Geometry& g, int64_t tile, bool masked)
      : corners(new Corner<T>[static_cast<size_t>(g.offset_groups * g.kk * tile)]),
        mask(masked ? new T[static_cast<size_t>(g.offset_groups * g.kk * tile)] : nullptr),
        columns(new T[static_cast<size_t>(std::max<int64_t>(1, g.kg * tile))]) {}
  std::unique_ptr<Corner<T>[]> corners;  // [offset group][kernel position][pixel of the tile]
  std::unique_ptr<T[]> mask;             // same layout; empty without a mask
  std::unique_ptr<T[]> columns;          // [pixel of the tile][kernel position][channel of the group]
};

// The hot loops of the best variant this CPU runs, for T.
template <typename T>
const deform_conv2d_impl::Kernels<T>& hot_loops() {
  const deform_conv2d_impl::Variant& variant = deform_conv2d_impl::best_variant();
  if constexpr (std::is_same_v<T, float>)
    return variant.f32;
  else
    return variant.f64;
}

// The weight as (C_out, kh·kw, C_in/groups), the row order of the column blocks; the weight
// itself where that is already its order (at most one channel or kernel position per group).
template <typename T>
const T* reorder_weight(KernelContext& ctx, const T* weight, const Geometry& g) {
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

// Output pixels per tile: equal tiles whose column block and sampling tables fit kTileBytes.
template <typename T>
int64_t tile_pixels(const Geometry& g, bool masked) {
  const int64_t table_bytes = g.offset_groups * g.kk * int64_t(sizeof(Corner<T>) + (masked ? sizeof(T) : 0));
  const int64_t tile =
      std::min(g.pixels, std::max<int64_t>(8, kTileBytes / (g.kg * int64_t(sizeof(T)) + table_bytes)));
  const int64_t n_tiles = (g.pixels + tile - 1) / tile;
  return (g.pixels + n_tiles - 1) / n_tiles;
}

// Images [n0, n0 + nb) of input, channels-last with a zero border, one padded row per work item.
template <typename T>
void copy_channels_last(KernelContext& ctx, const T* input, int64_t n0, int64_t nb, const Geometry& g, T* nhwc) {
  const int64_t c_in = g.c_in, padded_h = g.h + 2, padded_w = g.w + 2, row = padded_w * c_in;
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
      const T* src = input + ((n0 + r / padded_h) * c_in * g.h + (yp - 1)) * g.w;
      for (int64_t c = 0; c < c_in; ++c) {
        const T* s = src + c * g.h * g.w;
        T* d = dst + c_in + c;
        for (int64_t x = 0; x < g.w; ++x) d[x * c_in] = s[x];
      }
    }
  });
}

// Bilinear corners (and mask values) for every offset group and kernel position of output
// pixels [p0, p0 + len) of image n.
template <typename T>
void sample_tile(const Geometry& g, const T* offset, const T* mask, int64_t n, int64_t p0, int64_t len, int64_t tile,
                 Buffers<T>& buf) {
  const int64_t kk = g.kk, pixels = g.pixels, padded_w = g.w + 2;
  for (int64_t og = 0; og < g.offset_groups; ++og)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t k = i * g.kw + j, slot = (og * kk + k) * tile;
        const T* dy = offset + ((n * g.offset_groups + og) * kk + k) * 2 * pixels + p0;
        const T* dx = dy + pixels;
        int64_t ho = p0 / g.w_out, wo = p0 % g.w_out;
        for (int64_t q = 0; q < len; ++q) {
          const T y = static_cast<T>(ho * g.stride_h - g.pad_h + i * g.dil_h) + dy[q];
          const T x = static_cast<T>(wo * g.stride_w - g.pad_w + j * g.dil_w) + dx[q];
          buf.corners[slot + q] = corner(y, x, g.h, g.w, padded_w);
          if (++wo == g.w_out) wo = 0, ++ho;
        }
        if (mask) {
          const T* m = mask + ((n * g.offset_groups + og) * kk + k) * pixels + p0;
          std::copy(m, m + len, buf.mask.get() + slot);
        }
      }
}

template <typename T>
void deform_conv2d_typed(KernelContext& ctx, const Geometry& g, const TensorView& input_v,
                         const TensorView& weight_v, const TensorView& offset_v, const TensorView* bias_v,
                         const TensorView* mask_v, TensorView& out_v) {
  const deform_conv2d_impl::Kernels<T>& run = hot_loops<T>();
  const T* input = input_v.data_as<T>();
  const T* offset = offset_v.data_as<T>();
  const T* bias = bias_v ? bias_v->data_as<T>() : nullptr;
  const T* mask = mask_v ? mask_v->data_as<T>() : nullptr;
  T* out = out_v.data_as<T>();
  const T* weight = reorder_weight(ctx, weight_v.data_as<T>(), g);
  const int64_t pixels = g.pixels, tile = tile_pixels<T>(g, mask != nullptr);
  const int64_t n_tiles = (pixels + tile - 1) / tile;

  const int64_t image = (g.h + 2) * (g.w + 2) * g.c_in;
  const int64_t batch =
      std::min(g.n, std::max<int64_t>(1, kImageCopyBytes / std::max<int64_t>(1, image * int64_t(sizeof(T)))));
  T* nhwc = static_cast<T*>(ctx.scratch(static_cast<size_t>(batch * image) * sizeof(T)));

  for (int64_t n0 = 0; n0 < g.n; n0 += batch) {
    const int64_t nb = std::min(batch, g.n - n0);
    copy_channels_last(ctx, input, n0, nb, g, nhwc);
    ctx.parallel_for(nb * n_tiles, 1, [&](int64_t b, int64_t e) {
      Buffers<T> buf(g, tile, mask != nullptr);
      for (int64_t job = b; job < e; ++job) {
        const int64_t n = n0 + job / n_tiles, p0 = (job % n_tiles) * tile, len = std::min(tile, pixels - p0);
        if (len <= 0) continue;
        sample_tile(g, offset, mask, n, p0, len, tile, buf);
        for (int64_t grp = 0; grp < g.groups; ++grp) {
          run.columns(ColumnJob<T>{nhwc + (n - n0) * image, buf.corners.get(), buf.mask.get(), buf.columns.get(), len,
                                   tile, g.kk, grp * g.cg, g.cg, g.cog, g.c_in, g.w + 2});
          run.gemm(weight + grp * g.mg * g.kg, buf.columns.get(), bias ? bias + grp * g.mg : nullptr,
                   out + (n * g.c_out + grp * g.mg) * pixels + p0, g.mg, g.kg, len, pixels);
        }
      }
    });
  }
}

// An empty input (no channels, or an image with no rows or columns): every sample reads the zero
// border, so every output pixel is its channel's bias (or 0), with no sampling and no padded copy
// of the image, however large its other dimension is.
template <typename T>
void fill_bias(KernelContext& ctx, const Geometry& g, const TensorView* bias_v, TensorView& out_v) {
  const T* bias = bias_v ? bias_v->data_as<T>() : nullptr;
  T* out = out_v.data_as<T>();
  ctx.parallel_for(g.n * g.c_out, std::max<int64_t>(1, (64 << 10) / g.pixels), [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane)
      std::fill(out + plane * g.pixels, out + (plane + 1) * g.pixels, bias ? bias[plane % g.c_out] : T(0));
  });
}

}  // namespace

void deform_conv2d_kernel(KernelContext& ctx) {
  const TensorView& input = ctx.input("input");
  const TensorView& weight = ctx.input("weight");
  const TensorView& offset = ctx.input("offset");
  const TensorView* bias = ctx.optional_input("bias");
  const TensorView* mask = ctx.optional_input("mask");
  TensorView& out = ctx.output(0);
  const Geometry g = geometry(ctx, input, weight, mask, out);
  if (out.numel() == 0) return;
  if (is_16bit_float(out.dtype)) {
    // float16 / bfloat16: the float32 kernel on float32 copies, rounded once at the end.
    const TensorView in32 = float32_copy(ctx, input), w32 = float32_copy(ctx, weight), off32 = float32_copy(ctx, offset);
    const TensorView b32 = bias ? float32_copy(ctx, *bias) : TensorView{}, m32 = mask ? float32_copy(ctx, *mask) : TensorView{};
    TensorView out32 = float32_scratch(ctx, out);
    if (input.numel() == 0) fill_bias<float>(ctx, g, bias ? &b32 : nullptr, out32);
    else deform_conv2d_typed<float>(ctx, g, in32, w32, off32, bias ? &b32 : nullptr, mask ? &m32 : nullptr, out32);
    return narrow_into(ctx, out32, out);
  }
  visit_dtype<float, double>(out.dtype, [&](auto zero) {
    using T = decltype(zero);
    if (input.numel() == 0) return fill_bias<T>(ctx, g, bias, out);
    deform_conv2d_typed<T>(ctx, g, input, weight, offset, bias, mask, out);
  });
}

}  // namespace opbridge
