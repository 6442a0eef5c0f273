// deform_conv2d's hot loops — the channels-last copy of the input, the bilinear corners, filling a
// column block with bilinear samples and the GEMM, and in the backward the two GEMMs and the
// samples' gradients — in one variant per instruction set. The rest of the build targets the
// baseline ISA (x86-64: SSE2), where a GEMM runs at a fraction of its AVX2/AVX-512 speed, so
// deform_conv2d_avx2.cc and deform_conv2d_avx512.cc build the same code for those (their ISA flags
// come from opbridge_add_op_library in cmake/OpBridgeFunctions.cmake; there float32 takes
// hand-vectorised loops and GEMM, see deform_conv2d_variant_impl.h) and best_variant() picks one
// at run time. deform_conv2d_variants.cc builds the baseline variant and makes the choice. This
// header only declares (no Eigen), so the tests can call every variant.
#pragma once

#include <cstdint>

namespace opbridge::deform_conv2d_impl {

// One bilinear sample: the top-left neighbour's pixel in the zero-bordered channels-last image and
// the weights of the four neighbours (top-left, top-right, bottom-left, bottom-right).
template <typename T>
struct Corner {
  int64_t pixel;
  T w[4];
};

// The bilinear corners of one row of a tile's sampling table (one offset group and kernel
// position): sample q at (at_y[q] + dy[q], at_x[q] + dx[q]) in an h × w image whose zero-bordered
// copy is padded_w wide.
template <typename T>
struct CornerRow {
  const T *at_y, *at_x, *dy, *dx;
  int64_t len, h, w, padded_w;
  Corner<T>* out;
};

// Fill the column block of one tile of output pixels and one convolution group.
template <typename T>
struct ColumnJob {
  const T* image;            // (H+2, W+2, C_in): channels-last with a zero border
  const Corner<T>* corners;  // [offset group][kernel position][pixel of the tile], `tile` per row
  const T* mask;             // same layout as corners; null without a mask
  T* columns;                // out: [pixel of the tile][kernel position][channel of the group]
  int64_t len, tile;         // pixels in this tile; pixels per corners row
  int64_t kk, c_begin, cg;   // kernel positions; the group's first channel and channel count
  int64_t cog, c_in, padded_w;
};

// The samples and the column block of one tile and one convolution group in one pass, with no
// corner tables in between: a vector of pixels' corners at a time (as `corners` computes them),
// the mask folded into their weights and each pixel's run of channels filled (as `columns` fills
// it). The same bits as `corners` then `columns`, for a group of whole offset groups.
template <typename T>
struct SampleColumnsJob {
  const T* image;   // (H+2, W+2, C_in) channels-last with a zero border, from the group's first channel
  const T* at;      // [kernel position][y, x][pixel of the tile], `tile` per row: points before the offsets
  const T* offset;  // the group's first offset group's rows at the tile's first pixel: [offset group][kernel
                    // position][dy, dx], `pixels` apart
  const T* mask;    // [offset group][kernel position] rows likewise; null without a mask
  T* columns;       // out: [pixel of the tile][kernel position][channel of the group]
  int64_t len, tile, pixels;  // pixels in this tile; per row of `at`; per row of offset and mask
  int64_t kk, runs, cog;      // kernel positions; offset groups in the group and channels in each
  int64_t c_in, h, w, padded_w;
};

// The backward of one ColumnJob: for every sample of the tile, with `grad_columns` the gradient of
// its (masked) column block, accumulate the gradient of the image (same layout as `image`), and the
// per-sample sums the offset and mask gradients need.
template <typename T>
struct SampleGradJob {
  ColumnJob<T> at;             // the samples (its `columns` unused)
  const T* grad_columns;       // [pixel of the tile][kernel position][channel of the group]
  T* grad_image;               // += into (H+2, W+2, C_in), like `image`
  T* grad_y;                   // += per sample, layout of `corners`: d loss / d row position
  T* grad_x;                   // += likewise, column position
  T* grad_mask;                // += likewise: d loss / d mask (the unmasked sample times its gradient)
};

template <typename T>
struct Kernels {
  // One row of an image to channels-last: dst[x·c_in + c] = src[c·plane + x] for x < w.
  void (*channels_last)(const T* src, int64_t plane, int64_t c_in, int64_t w, T* dst) = nullptr;
  void (*corners)(const CornerRow<T>& row) = nullptr;
  void (*columns)(const ColumnJob<T>& job) = nullptr;
  // The forward GEMM's weight a (m × k, row-major) as `gemm` reads it: weight_size(m, k) values
  // that pack_weight writes, once per call.
  int64_t (*weight_size)(int64_t m, int64_t k) = nullptr;
  void (*pack_weight)(const T* a, int64_t m, int64_t k, T* packed) = nullptr;
  // out (m × n, rows `ldo` apart) = a · b (+ bias[row]); a as pack_weight left it, b (k × n)
  // column-major (column j starts at b + j·k); bias may be null.
  void (*gemm)(const T* packed_a, const T* b, const T* bias, T* out, int64_t m, int64_t k, int64_t n,
               int64_t ldo) = nullptr;
  // The backward's two GEMMs, with g (m × n, rows `ldg` apart) a block of the output's gradient:
  // acc (m × k, row-major) += g · columns (n × k, row-major): the weight's gradient;
  // out (n × k, row-major) = gᵀ · w (m × k, row-major): the columns' gradient.
  void (*gemm_acc_g_cols)(const T* g, int64_t ldg, const T* columns, T* acc, int64_t m, int64_t n, int64_t k) = nullptr;
  void (*gemm_gt_w)(const T* g, int64_t ldg, const T* w, T* out, int64_t m, int64_t n, int64_t k) = nullptr;
  void (*sample_grads)(const SampleGradJob<T>& job) = nullptr;
  // `corners` and `columns` of one group in one pass, where the variant has such a loop for the
  // job's shape (null, or it returns false: call those two).
  bool (*sample_columns)(const SampleColumnsJob<T>& job) = nullptr;
  // True where `gemm` sums each output the same way whatever n is (the project's float32 GEMM);
  // Eigen's blocking, and so its order of summation, depends on n.
  bool gemm_same_for_any_n = false;
};

struct Variant {
  Kernels<float> f32;
  Kernels<double> f64;
  const char* isa = nullptr;  // null: not in this build
};

Variant baseline_variant();
// Each compiled for its own instruction set: call only on a CPU that has it (cpu_has_avx2() /
// cpu_has_avx512() of <opbridge/cpu.h>). An empty Variant when this build has none (not x86-64,
// or not GCC/Clang).
Variant avx2_variant();
Variant avx512_variant();
// The fastest variant this build and this CPU can run.
const Variant& best_variant();

}  // namespace opbridge::deform_conv2d_impl
