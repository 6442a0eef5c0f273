// multi_scale_deformable_attention's kernels: the levels read and checked, then the loops of the
// widest variant the CPU runs (msda_variants.h). The forward splits queries (an encoder's in tiles
// of their levels) over the runtime's pool, each writing its own output rows; the backward splits
// (batch item, head) pairs, each task the only writer of its heads' slices of grad_value, which
// gather their sums in query order: the result does not depend on the thread count.
// float16 and bfloat16 run the float32 loops on float32 copies and round each output once.
#include "msda_kernel.h"

#include <opbridge/float32_copy.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "msda_variants.h"

namespace opbridge {
namespace {

using msda_impl::Geometry;

struct Levels {
  std::vector<int64_t> h, w, start;
};

// The levels' sizes (H_l, W_l) and first rows, checked: positive-or-zero sizes that tile value's
// S axis in order, each starting where level_start_index says.
Levels read_levels(const TensorView& shapes, const TensorView& starts, int64_t spatial) {
  const int64_t n = shapes.dim(0);
  Levels lv{std::vector<int64_t>(n), std::vector<int64_t>(n), std::vector<int64_t>(n)};
  visit_dtype<int32_t, int64_t>(shapes.dtype, [&](auto zero) {
    const auto* s = shapes.data_as<decltype(zero)>();
    for (int64_t l = 0; l < n; ++l) lv.h[l] = s[2 * l], lv.w[l] = s[2 * l + 1];
  });
  visit_dtype<int32_t, int64_t>(starts.dtype, [&](auto zero) {
    const auto* s = starts.data_as<decltype(zero)>();
    for (int64_t l = 0; l < n; ++l) lv.start[l] = s[l];
  });
  int64_t row = 0;
  for (int64_t l = 0; l < n; ++l) {
    OB_CHECK(lv.h[l] >= 0 && lv.w[l] >= 0, "spatial_shapes[", l, "] = (", lv.h[l], ", ", lv.w[l],
             ") is not a size of a level");
    OB_CHECK(lv.start[l] == row, "level_start_index[", l, "] = ", lv.start[l], ", but the levels before it hold ", row,
             " positions (level l starts after levels 0 .. l-1 of spatial_shapes)");
    OB_CHECK(lv.w[l] == 0 || lv.h[l] <= (spatial - row) / lv.w[l], "the levels of spatial_shapes hold more positions "
             "than value's ", spatial, " (from level ", l, " on)");  // divided: a product could overflow
    row += lv.h[l] * lv.w[l];
  }
  OB_CHECK(row == spatial, "the levels of spatial_shapes hold ", row, " positions; value has ", spatial);
  return lv;
}

Geometry geometry(const TensorView& value, const TensorView& locations, const Levels& lv) {
  return Geometry{value.dim(0),     value.dim(1),     value.dim(2),    value.dim(3), locations.dim(1),
                  locations.dim(3), locations.dim(4), lv.h.data(),    lv.w.data(),  lv.start.data()};
}

// Queries that are the levels' positions (an encoder's: Q == S) in tiles of kTileW x kTileH
// positions of their level, as row segments {first query, count}: the samples of neighbouring
// queries read the same rows of value (around the same place in every level), and a tile's rows
// stay in L2 from one segment to the next, where index order sweeps bands of whole level rows
// (the forward 1.10x at 800x1200). Each output row is computed alone: the order changes no result.
constexpr int64_t kTileW = 32, kTileH = 8;
std::vector<std::pair<int64_t, int64_t>> tiled_segments(const Geometry& g) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t l = 0; l < g.levels; ++l)
    for (int64_t y0 = 0; y0 < g.level_h[l]; y0 += kTileH)
      for (int64_t x0 = 0; x0 < g.level_w[l]; x0 += kTileW)
        for (int64_t y = y0; y < std::min(y0 + kTileH, g.level_h[l]); ++y)
          out.emplace_back(g.level_start[l] + y * g.level_w[l] + x0, std::min(kTileW, g.level_w[l] - x0));
  return out;
}

template <typename T, typename Rows>
void forward(KernelContext& ctx, const Geometry& g, Rows rows, const T* value, const T* locations, const T* weights,
             T* output) {
  // Tasks of about 64 K sampled channel values each.
  const int64_t per_query = std::max<int64_t>(1, g.heads * g.levels * g.points * g.channels);
  if (g.queries == g.spatial) {
    const std::vector<std::pair<int64_t, int64_t>> segments = tiled_segments(g);
    const int64_t n = static_cast<int64_t>(segments.size());
    ctx.parallel_for(g.batch * n, std::max<int64_t>(1, (int64_t{1} << 16) / (per_query * kTileW)),
                     [&](int64_t lo, int64_t hi) {
                       for (int64_t i = lo; i < hi; ++i) {
                         const auto [q, count] = segments[i % n];
                         rows(g, value, locations, weights, i / n, q, q + count, output);
                       }
                     });
    return;
  }
  ctx.parallel_for(g.batch * g.queries, std::max<int64_t>(1, (int64_t{1} << 16) / per_query), [&](int64_t lo, int64_t hi) {
    while (lo < hi) {  // a range may span batch items
      const int64_t b = lo / g.queries, q = lo % g.queries, end = std::min(hi - lo, g.queries - q);
      rows(g, value, locations, weights, b, q, q + end, output);
      lo += end;
    }
  });
}

template <typename T, typename Heads>
void backward(KernelContext& ctx, const Geometry& g, Heads heads, const T* grad_output, const T* value,
              const T* locations, const T* weights, T* grad_value, T* grad_locations, T* grad_weights) {
  std::fill(grad_value, grad_value + g.batch * g.spatial * g.heads * g.channels, T(0));
  ctx.parallel_for(g.batch * g.heads, 1, [&](int64_t lo, int64_t hi) {
    while (lo < hi) {  // the heads of a range, one batch item at a time
      const int64_t b = lo / g.heads, h = lo % g.heads, end = std::min(hi - lo, g.heads - h);
      heads(g, grad_output, value, locations, weights, b, h, h + end, grad_value, grad_locations, grad_weights);
      lo += end;
    }
  });
}

}  // namespace

void msda_kernel(KernelContext& ctx, const TensorView& value, const TensorView& spatial_shapes,
                 const TensorView& level_start_index, const TensorView& sampling_locations,
                 const TensorView& attention_weights, TensorView& output) {
  const Levels lv = read_levels(spatial_shapes, level_start_index, value.dim(1));
  const Geometry g = geometry(value, sampling_locations, lv);
  if (output.numel() == 0) return;
  if (value.dtype == DType::Float64)
    return forward<double>(ctx, g, msda_impl::forward_rows, value.data_as<double>(),
                           sampling_locations.data_as<double>(), attention_weights.data_as<double>(),
                           output.data_as<double>());
  const TensorView v = float32_copy(ctx, value), loc = float32_copy(ctx, sampling_locations),
                   w = float32_copy(ctx, attention_weights);
  const bool narrowed = is_16bit_float(output.dtype);
  TensorView out = narrowed ? float32_scratch(ctx, output) : output;
  forward<float>(ctx, g, msda_impl::best_variant().forward, v.data_as<float>(), loc.data_as<float>(),
                 w.data_as<float>(), out.data_as<float>());
  if (narrowed) narrow_into(ctx, out, output);
}

void msda_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& value,
                          const TensorView& spatial_shapes, const TensorView& level_start_index,
                          const TensorView& sampling_locations, const TensorView& attention_weights,
                          TensorView& grad_value, TensorView& grad_sampling_locations,
                          TensorView& grad_attention_weights) {
  const Levels lv = read_levels(spatial_shapes, level_start_index, value.dim(1));
  const Geometry g = geometry(value, sampling_locations, lv);
  if (value.dtype == DType::Float64)
    return backward<double>(ctx, g, msda_impl::backward_heads, grad_output.data_as<double>(), value.data_as<double>(),
                            sampling_locations.data_as<double>(), attention_weights.data_as<double>(),
                            grad_value.data_as<double>(), grad_sampling_locations.data_as<double>(),
                            grad_attention_weights.data_as<double>());
  const TensorView go = float32_copy(ctx, grad_output), v = float32_copy(ctx, value),
                   loc = float32_copy(ctx, sampling_locations), w = float32_copy(ctx, attention_weights);
  const bool narrowed = is_16bit_float(value.dtype);
  TensorView gv = narrowed ? float32_scratch(ctx, grad_value) : grad_value;
  TensorView gl = narrowed ? float32_scratch(ctx, grad_sampling_locations) : grad_sampling_locations;
  TensorView gw = narrowed ? float32_scratch(ctx, grad_attention_weights) : grad_attention_weights;
  backward<float>(ctx, g, msda_impl::best_variant().backward, go.data_as<float>(), v.data_as<float>(),
                  loc.data_as<float>(), w.data_as<float>(), gv.data_as<float>(), gl.data_as<float>(),
                  gw.data_as<float>());
  if (narrowed) {
    narrow_into(ctx, gv, grad_value);
    narrow_into(ctx, gl, grad_sampling_locations);
    narrow_into(ctx, gw, grad_attention_weights);
  }
}

}  // namespace opbridge
