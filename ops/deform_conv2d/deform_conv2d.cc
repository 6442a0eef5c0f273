// deform_conv2d: deformable convolution v1 (offsets) and v2 (offsets + modulation mask), with
// torchvision::deform_conv2d's semantics and ONNX DeformConv's input order.
//
// Kernel: im2col with bilinear sampling, then a GEMM per convolution group. The input is first
// copied to channels-last with a one-pixel zero border, so that a sample's four neighbours are four
// contiguous runs of channels (one vector loop over channels, no bounds checks: neighbours outside
// the image read the zero border). Work is split over (image, tile of output pixels); per tile the
// bilinear corners and weights are computed once per (offset group, kernel position, pixel) and
// reused for every channel of that offset group.
#include <opbridge/op.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>

#include "deform_conv2d_variant_impl.h"  // the baseline variant is built here
#include "deform_conv2d_variants.h"

namespace opbridge {

namespace deform_conv2d_impl {
Variant baseline_variant() { return this_variant("baseline"); }

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool cpu_has_avx512() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
}
#else
bool cpu_has_avx2() { return false; }
bool cpu_has_avx512() { return false; }
#endif

const Variant& best_variant() {
  static const Variant chosen = [] {
    // The CPU check comes first: the *_variant() functions are themselves compiled for their ISA.
    if (cpu_has_avx512())
      if (Variant v = avx512_variant(); v.isa) return v;
    if (cpu_has_avx2())
      if (Variant v = avx2_variant(); v.isa) return v;
    return baseline_variant();
  }();
  return chosen;
}
}  // namespace deform_conv2d_impl

namespace {

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

std::pair<int64_t, int64_t> pair_attr(const KernelContext& ctx, const char* name, int64_t min) {
  const std::vector<int64_t>& v = ctx.attr_ints(name);
  OB_CHECK(v.size() == 2, "attribute '", name, "' must have 2 values (height, width), got ", v.size());
  OB_CHECK(v[0] >= min && v[1] >= min, "attribute '", name, "' values must be >= ", min, ", got [", v[0], ", ",
           v[1], "]");
  return {v[0], v[1]};
}

// What the spec's dimension checks cannot say: attribute ranges and divisibility, the mask's
// channel count (a check on an optional input), the kernel and output sizes.
Geometry geometry(const KernelContext& ctx, const TensorView& input, const TensorView& weight,
                  const TensorView* mask, const TensorView& out) {
  Geometry g{};
  g.n = input.dim(0), g.c_in = input.dim(1), g.h = input.dim(2), g.w = input.dim(3);
  g.c_out = weight.dim(0), g.kh = weight.dim(2), g.kw = weight.dim(3);
  std::tie(g.stride_h, g.stride_w) = pair_attr(ctx, "stride", 1);
  std::tie(g.pad_h, g.pad_w) = pair_attr(ctx, "padding", 0);
  std::tie(g.dil_h, g.dil_w) = pair_attr(ctx, "dilation", 1);
  g.groups = ctx.attr_int("groups");
  g.offset_groups = ctx.attr_int("offset_groups");
  OB_CHECK(g.groups >= 1, "attribute 'groups' must be >= 1, got ", g.groups);
  OB_CHECK(g.offset_groups >= 1, "attribute 'offset_groups' must be >= 1, got ", g.offset_groups);
  OB_CHECK(g.c_out % g.groups == 0, "output channels (weight.shape[0] = ", g.c_out, ") must be divisible by groups (",
           g.groups, ")");
  OB_CHECK(g.c_in % g.offset_groups == 0, "input channels (", g.c_in, ") must be divisible by offset_groups (",
           g.offset_groups, ")");
  OB_CHECK(g.kh >= 1 && g.kw >= 1, "kernel size (weight.shape[2:]) must be positive, got ", g.kh, "x", g.kw);
  g.kk = g.kh * g.kw;
  if (mask)
    OB_CHECK(mask->dim(1) == g.offset_groups * g.kk, "mask must have offset_groups*kh*kw = ", g.offset_groups * g.kk,
             " channels, got ", mask->dim(1));
  g.h_out = out.dim(2), g.w_out = out.dim(3);
  OB_CHECK(g.h_out > 0 && g.w_out > 0, "output size would be ", g.h_out, "x", g.w_out,
           ": the input (with padding) is smaller than the dilated kernel");
  g.cg = g.c_in / g.groups;
  g.mg = g.c_out / g.groups;
  g.cog = g.c_in / g.offset_groups;
  g.kg = g.cg * g.kk;
  g.pixels = g.h_out * g.w_out;
  return g;
}

using deform_conv2d_impl::ColumnJob;
using deform_conv2d_impl::Corner;

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

template <typename T>
struct Buffers {
  std::unique_ptr<Corner<T>[]> corners;  // [offset group][kernel position][pixel of the tile]
  std::unique_ptr<T[]> mask;             // same layout; empty without a mask
  std::unique_ptr<T[]> columns;          // [pixel of the tile][kernel position][channel of the group]
};

template <typename T>
void deform_conv2d_typed(KernelContext& ctx, const Geometry& g, const TensorView& input_v,
                         const TensorView& weight_v, const TensorView& offset_v, const TensorView* bias_v,
                         const TensorView* mask_v, TensorView& out_v) {
  const auto& variant = deform_conv2d_impl::best_variant();
  const deform_conv2d_impl::Kernels<T>& run = [&]() -> const deform_conv2d_impl::Kernels<T>& {
    if constexpr (std::is_same_v<T, float>)
      return variant.f32;
    else
      return variant.f64;
  }();

  const T* input = input_v.data_as<T>();
  const T* offset = offset_v.data_as<T>();
  const T* bias = bias_v ? bias_v->data_as<T>() : nullptr;
  const T* mask = mask_v ? mask_v->data_as<T>() : nullptr;
  T* out = out_v.data_as<T>();
  const int64_t c_in = g.c_in, kk = g.kk, cg = g.cg, kg = g.kg, pixels = g.pixels;

  // Weight as (C_out, kh·kw, C_in/groups): the row order of the column blocks below.
  const T* weight = weight_v.data_as<T>();
  if (cg > 1 && kk > 1) {
    T* reordered = static_cast<T*>(ctx.scratch(static_cast<size_t>(g.c_out * kg) * sizeof(T)));
    ctx.parallel_for(g.c_out, std::max<int64_t>(1, (32 << 10) / kg), [&](int64_t b, int64_t e) {
      for (int64_t co = b; co < e; ++co)
        for (int64_t c = 0; c < cg; ++c)
          for (int64_t k = 0; k < kk; ++k) reordered[(co * kk + k) * cg + c] = weight[(co * cg + c) * kk + k];
    });
    weight = reordered;
  }

  // Tiles of output pixels whose column block and sampling tables fit kTileBytes.
  const int64_t table_bytes = g.offset_groups * kk * int64_t(sizeof(Corner<T>) + (mask ? sizeof(T) : 0));
  int64_t tile = std::min(pixels, std::max<int64_t>(8, kTileBytes / (kg * int64_t(sizeof(T)) + table_bytes)));
  const int64_t n_tiles = (pixels + tile - 1) / tile;
  tile = (pixels + n_tiles - 1) / n_tiles;  // equal tiles

  const int64_t padded_h = g.h + 2, padded_w = g.w + 2, image = padded_h * padded_w * c_in;
  const int64_t batch =
      std::min(g.n, std::max<int64_t>(1, kImageCopyBytes / std::max<int64_t>(1, image * int64_t(sizeof(T)))));
  T* nhwc = static_cast<T*>(ctx.scratch(static_cast<size_t>(batch * image) * sizeof(T)));

  for (int64_t n0 = 0; n0 < g.n; n0 += batch) {
    const int64_t nb = std::min(batch, g.n - n0);
    // Channels-last copy with a zero border, one padded row per work item.
    const int64_t row = padded_w * c_in;
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

    ctx.parallel_for(nb * n_tiles, 1, [&](int64_t b, int64_t e) {
      Buffers<T> buf;
      buf.corners.reset(new Corner<T>[static_cast<size_t>(g.offset_groups * kk * tile)]);
      if (mask) buf.mask.reset(new T[static_cast<size_t>(g.offset_groups * kk * tile)]);
      buf.columns.reset(new T[static_cast<size_t>(std::max<int64_t>(1, kg * tile))]);
      for (int64_t job = b; job < e; ++job) {
        const int64_t n = n0 + job / n_tiles, p0 = (job % n_tiles) * tile, len = std::min(tile, pixels - p0);
        if (len <= 0) continue;
        const T* image_n = nhwc + (n - n0) * image;

        // Bilinear corners for every offset group and kernel position of this tile.
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

        for (int64_t grp = 0; grp < g.groups; ++grp) {
          run.columns(ColumnJob<T>{image_n, buf.corners.get(), buf.mask.get(), buf.columns.get(), len, tile, kk,
                                   grp * cg, cg, g.cog, c_in, padded_w});
          run.gemm(weight + grp * g.mg * kg, buf.columns.get(), bias ? bias + grp * g.mg : nullptr,
                   out + (n * g.c_out + grp * g.mg) * pixels + p0, g.mg, kg, len, pixels);
        }
      }
    });
  }
}

void deform_conv2d_kernel(KernelContext& ctx) {
  const TensorView& input = ctx.input("input");
  const TensorView& weight = ctx.input("weight");
  const TensorView& offset = ctx.input("offset");
  const TensorView* bias = ctx.optional_input("bias");
  const TensorView* mask = ctx.optional_input("mask");
  TensorView& out = ctx.output(0);
  const Geometry g = geometry(ctx, input, weight, mask, out);
  if (out.numel() == 0) return;
  visit_dtype<float, double>(out.dtype, [&](auto zero) {
    deform_conv2d_typed<decltype(zero)>(ctx, g, input, weight, offset, bias, mask, out);
  });
}

DimExpr out_size(int64_t axis) {
  const DimExpr k = dim("weight", axis + 2);
  return (dim("input", axis + 2) + attr_at("padding", axis) * 2 - (attr_at("dilation", axis) * (k - 1) + 1)) /
             attr_at("stride", axis) +
         1;
}

}  // namespace

OPBRIDGE_OP(deform_conv2d)
    .doc("Deformable 2-D convolution (v1; v2 with a modulation mask), as torchvision.ops.deform_conv2d: "
         "each kernel tap samples the input bilinearly at its regular position plus a learned offset, "
         "optionally scaled by a mask, then the samples are convolved with the weight.")
    .types("T", {DType::Float32, DType::Float64})
    .input("input", "T", "(N, C_in, H, W)", 4)
    .input("weight", "T", "(C_out, C_in/groups, kh, kw)", 4)
    .input("offset", "T",
           "(N, 2*offset_groups*kh*kw, H_out, W_out): channel 2*(g*kh*kw + i*kw + j) is the row (y) offset of "
           "offset group g at kernel position (i, j), the next channel the column (x) offset",
           4)
    .optional_input("bias", "T", "(C_out)", 1)
    .optional_input("mask", "T", "(N, offset_groups*kh*kw, H_out, W_out): modulation (v2); absent: 1 (v1)", 4)
    .ints_attr("stride", {1, 1}, "(stride_h, stride_w)")
    .ints_attr("padding", {0, 0}, "(pad_h, pad_w): zero padding on both sides")
    .ints_attr("dilation", {1, 1}, "(dil_h, dil_w)")
    .int_attr("groups", 1, "convolution groups: input and output channels split into this many blocks")
    .int_attr("offset_groups", 1, "input channels split into this many blocks, each with its own offsets and mask")
    // First: the output size divides by the stride.
    .check(attr_at("stride", 0) >= 1, "attribute 'stride' values must be >= 1")
    .check(attr_at("stride", 1) >= 1, "attribute 'stride' values must be >= 1")
    .check(dim("input", 1) == dim("weight", 1) * attr("groups"),
           "input channels must equal weight.shape[1] * groups")
    .check(dim("offset", 0) == dim("input", 0), "offset must have the batch size of input")
    .check(dim("offset", 1) == attr("offset_groups") * dim("weight", 2) * dim("weight", 3) * 2,
           "offset must have 2*offset_groups*kh*kw channels")
    .check(dim("offset", 2) == out_size(0), "offset height must be the output height")
    .check(dim("offset", 3) == out_size(1), "offset width must be the output width")
    // An absent bias or mask falls back to an input for which the check holds by construction.
    .check(dim_of_first({"bias", "weight"}, 0) == dim("weight", 0), "bias must have weight.shape[0] values")
    .check(dim_of_first({"mask", "offset"}, 0) == dim("input", 0), "mask must have the batch size of input")
    .check(dim_of_first({"mask", "offset"}, 2) == out_size(0), "mask height must be the output height")
    .check(dim_of_first({"mask", "offset"}, 3) == out_size(1), "mask width must be the output width")
    .output("output", "T", shape::dims({dim("input", 0), dim("weight", 0), out_size(0), out_size(1)}),
            "(N, C_out, H_out, W_out), H_out = (H + 2*pad_h - (dil_h*(kh - 1) + 1)) // stride_h + 1, W_out alike")
    .cpu(deform_conv2d_kernel)
    // ai.onnx DeformConv (opset 19) has this op's inputs in this order; its pads list both sides.
    // Below 19, or with custom_nodes=True, the opbridge node runs this kernel instead.
    .export_as(ExportTo("DeformConv", 19)
                   .attr("strides", {"stride"})
                   .attr("pads", {"padding", "padding"})
                   .attr("dilations", {"dilation"})
                   .attr("group", {"groups"})
                   .attr("offset_group", {"offset_groups"}));

}  // namespace opbridge
