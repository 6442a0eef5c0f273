// deform_conv2d's kernel (the op is defined in deform_conv2d.cc): im2col with bilinear sampling,
// then a GEMM per convolution group.
//
// The input is first copied to channels-last with a one-pixel zero border, so that a sample's
// four neighbours are four contiguous runs of channels (one vector loop over channels, no bounds
// checks: neighbours outside the image read the zero border). Work is split over (image, tile of
// output pixels); per tile the bilinear corners and weights are computed once per (offset group,
// kernel position, pixel) and reused for every channel of that offset group — for float32 on
// AVX2/AVX-512, where a convolution group holds whole offset groups of whole vectors, in the same
// pass as the column fill, a vector of pixels at a time, with no tables in between. The hot loops
// (channels-last copy, corners, column fill, GEMM) come in one variant per instruction set, see
// deform_conv2d_variants.h; the GEMM's weight is packed once per call, as the variant reads it.
#include "deform_conv2d_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "deform_conv2d_geometry.h"
#include "deform_conv2d_variants.h"
#include <opbridge/float32_copy.h>

namespace opbridge {
namespace {

using namespace deform_conv2d_impl;  // NOLINT: this op's own internals

// Jobs per parallel loop the batching aims for.
constexpr int64_t kMinJobs = 32;

// Where an image takes several tiles, each cut down to a multiple of 48 pixels: whole micro-tiles
// of the float32 GEMM (6, 8, 12 or 24 pixels) and whole vectors of samples (8 or 16). A tile of
// 158 pixels computed its last micro-tile's pixels twice (2.5% of the GEMM) and sampled a
// part-empty vector. Only where the GEMM's sums do not depend on the tile's width
// (Kernels::gemm_same_for_any_n).
int64_t whole_blocks(int64_t tile, int64_t pixels) {
  constexpr int64_t kBlock = 48;
  return tile < pixels && tile >= 2 * kBlock ? tile - tile % kBlock : tile;
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
  // The weight as the GEMM reads it, packed once per call (not once per tile).
  const T* weight = reorder_weight(ctx, weight_v.data_as<T>(), g);
  const int64_t packed_size = run.weight_size(g.mg, g.kg);
  T* packed = static_cast<T*>(ctx.scratch(static_cast<size_t>(g.groups * packed_size) * sizeof(T)));
  for (int64_t grp = 0; grp < g.groups; ++grp)
    run.pack_weight(weight + grp * g.mg * g.kg, g.mg, g.kg, packed + grp * packed_size);
  const int64_t pixels = g.pixels, budget = tile_pixels<T>(g, mask != nullptr);
  const int64_t tile = run.gemm_same_for_any_n ? whole_blocks(budget, pixels) : budget;  // Eigen's sums depend on it
  const int64_t n_tiles = (pixels + tile - 1) / tile;
  const bool whole_offset_groups = g.cg % g.cog == 0;  // every group's channels: whole offset groups

  const int64_t image = (g.h + 2) * (g.w + 2) * g.c_in;
  // Images per channels-last copy: enough (image, tile) jobs for a large machine's threads, no more,
  // so that the tiles read a copy made moments before (N=4, 64x64x64 on one thread: all four in one
  // copy 1.18x a Conv, two at a time 1.12x).
  const int64_t fit = std::max<int64_t>(1, kImageCopyBytes / std::max<int64_t>(1, image * int64_t(sizeof(T))));
  const int64_t batch = std::min({g.n, (kMinJobs + n_tiles - 1) / n_tiles, fit});
  T* nhwc = static_cast<T*>(ctx.scratch(static_cast<size_t>(batch * image) * sizeof(T)));

  for (int64_t n0 = 0; n0 < g.n; n0 += batch) {
    const int64_t nb = std::min(batch, g.n - n0);
    copy_channels_last(ctx, input, n0, nb, g, nhwc);
    ctx.parallel_for(nb * n_tiles, 1, [&](int64_t b, int64_t e) {
      // The column block 64-byte aligned, so no AVX-512 store of the fill straddles two cache lines
      // (Buffers' blocks come from new[], 16-byte aligned): 0.97-0.98x the forward's time. A block
      // of its own, so the backward's (Buffers' columns) is left exactly as it was.
      Buffers<T> buf(g, tile, mask != nullptr, 0);
      const std::unique_ptr<T[]> column_block(new T[static_cast<size_t>(g.kg * tile) + 64 / sizeof(T)]);
      T* columns = column_block.get() + ((0 - reinterpret_cast<uintptr_t>(column_block.get())) & 63) / sizeof(T);
      for (int64_t job = b; job < e; ++job) {
        const int64_t n = n0 + job / n_tiles, p0 = (job % n_tiles) * tile, len = std::min(tile, pixels - p0);
        if (len <= 0) continue;
        sample_points(g, p0, len, tile, buf);
        bool tables = false;  // the tile's corner tables made
        for (int64_t grp = 0; grp < g.groups; ++grp) {
          const T* at_image = nhwc + (n - n0) * image;
          // A group of whole offset groups: sampled and filled in one pass where the variant can.
          const int64_t og = grp * g.cg / g.cog, rows = (n * g.offset_groups + og) * g.kk;
          const bool fused = whole_offset_groups && run.sample_columns &&
                             run.sample_columns({at_image + grp * g.cg, buf.at.get(), offset + 2 * rows * pixels + p0,
                                                 mask ? mask + rows * pixels + p0 : nullptr, columns, len,
                                                 tile, pixels, g.kk, g.cg / g.cog, g.cog, g.c_in, g.h, g.w, g.w + 2});
          if (!fused) {
            if (!tables) sample_corners(g, offset, mask, n, p0, len, tile, buf), tables = true;
            run.columns(ColumnJob<T>{at_image, buf.corners.get(), buf.mask.get(), columns, len, tile, g.kk,
                                     grp * g.cg, g.cg, g.cog, g.c_in, g.w + 2});
          }
          run.gemm(packed + grp * packed_size, columns, bias ? bias + grp * g.mg : nullptr,
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

void deform_conv2d_kernel(KernelContext& ctx, const TensorView& input, const TensorView& weight,
                          const TensorView& offset, const TensorView* bias, const TensorView* mask,
                          const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                          const std::vector<int64_t>& dilation, int64_t groups, int64_t offset_groups,
                          TensorView& out) {
  const Geometry g = geometry({stride, padding, dilation, groups, offset_groups}, input, weight, mask, out);
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
