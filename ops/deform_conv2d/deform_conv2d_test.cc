// deform_conv2d's kernel against a direct loop over output elements (torchvision's sampling rule
// written out with explicit bounds checks), and every ISA variant of its hot loops against naive loops.
#include <cmath>
#include <iostream>
#include <limits>
#include <random>
#include <string>

#include "deform_conv2d_variants.h"
#include <gtest/gtest.h>
#include <opbridge/cpu.h>
#include <opbridge/testing/kernel_harness.h>

namespace opbridge::testing {
namespace {

struct Config {
  int64_t n = 2, c_in = 4, h = 7, w = 6, c_out = 6, kh = 3, kw = 3;
  std::vector<int64_t> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1, offset_groups = 1;
  bool bias = true, mask = true;
  double offset_scale = 1.5;  // offsets uniform in ±2·scale: some samples land outside

  int64_t h_out() const { return (h + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) / stride[0] + 1; }
  int64_t w_out() const { return (w + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) / stride[1] + 1; }
  std::map<std::string, AttrValue> attrs() const {
    return {{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups},
            {"offset_groups", offset_groups}};
  }
};

template <typename T>
T bilinear(const T* plane, int64_t h, int64_t w, T y, T x) {
  if (y <= -1 || y >= h || x <= -1 || x >= w) return 0;
  const int64_t y0 = static_cast<int64_t>(std::floor(y)), x0 = static_cast<int64_t>(std::floor(x));
  const T ly = y - y0, lx = x - x0;
  auto at = [&](int64_t yy, int64_t xx) { return (yy >= 0 && yy < h && xx >= 0 && xx < w) ? plane[yy * w + xx] : T(0); };
  return (1 - ly) * (1 - lx) * at(y0, x0) + (1 - ly) * lx * at(y0, x0 + 1) + ly * (1 - lx) * at(y0 + 1, x0) +
         ly * lx * at(y0 + 1, x0 + 1);
}

// The direct definition, accumulated in double.
template <typename T>
std::vector<double> naive(const Config& cf, const std::vector<T>& in, const std::vector<T>& wt,
                          const std::vector<T>& off, const std::vector<T>* bias, const std::vector<T>* mask) {
  const int64_t ho_n = cf.h_out(), wo_n = cf.w_out(), kk = cf.kh * cf.kw;
  const int64_t cg = cf.c_in / cf.groups, mg = cf.c_out / cf.groups, cog = cf.c_in / cf.offset_groups;
  std::vector<double> out(static_cast<size_t>(cf.n * cf.c_out * ho_n * wo_n));
  for (int64_t n = 0; n < cf.n; ++n)
    for (int64_t co = 0; co < cf.c_out; ++co)
      for (int64_t ho = 0; ho < ho_n; ++ho)
        for (int64_t wo = 0; wo < wo_n; ++wo) {
          double acc = bias ? double((*bias)[co]) : 0.0;
          const int64_t grp = co / mg;
          for (int64_t cl = 0; cl < cg; ++cl) {
            const int64_t c = grp * cg + cl, og = c / cog;
            for (int64_t i = 0; i < cf.kh; ++i)
              for (int64_t j = 0; j < cf.kw; ++j) {
                const int64_t k = i * cf.kw + j;
                auto at4 = [&](const std::vector<T>& t, int64_t ch, int64_t chans) {
                  return t[static_cast<size_t>(((n * chans + ch) * ho_n + ho) * wo_n + wo)];
                };
                const int64_t oc = 2 * cf.offset_groups * kk;
                const T y = T(ho * cf.stride[0] - cf.padding[0] + i * cf.dilation[0]) + at4(off, 2 * (og * kk + k), oc);
                const T x = T(wo * cf.stride[1] - cf.padding[1] + j * cf.dilation[1]) + at4(off, 2 * (og * kk + k) + 1, oc);
                T v = bilinear(&in[static_cast<size_t>((n * cf.c_in + c) * cf.h * cf.w)], cf.h, cf.w, y, x);
                if (mask) v *= at4(*mask, og * kk + k, cf.offset_groups * kk);
                acc += double(wt[static_cast<size_t>(((co * cg + cl) * cf.kh + i) * cf.kw + j)]) * double(v);
              }
          }
          out[static_cast<size_t>(((n * cf.c_out + co) * ho_n + ho) * wo_n + wo)] = acc;
        }
  return out;
}

struct Inputs {
  Tensor input, weight, offset;
  std::optional<Tensor> bias, mask;
};

template <typename T>
Inputs make_inputs(const Config& cf, uint32_t seed) {
  const int64_t kk = cf.kh * cf.kw;
  Inputs in{Tensor::random<T>({cf.n, cf.c_in, cf.h, cf.w}, seed),
            Tensor::random<T>({cf.c_out, cf.c_in / cf.groups, cf.kh, cf.kw}, seed + 1),
            Tensor::random<T>({cf.n, 2 * cf.offset_groups * kk, cf.h_out(), cf.w_out()}, seed + 2),
            {}, {}};
  T* o = in.offset.view.data_as<T>();
  for (int64_t i = 0; i < in.offset.view.numel(); ++i) o[i] = static_cast<T>(o[i] * cf.offset_scale);
  if (cf.bias) in.bias = Tensor::random<T>({cf.c_out}, seed + 3);
  if (cf.mask) in.mask = Tensor::random<T>({cf.n, cf.offset_groups * kk, cf.h_out(), cf.w_out()}, seed + 4);
  return in;
}

std::vector<Tensor> run_op(const Config& cf, const Inputs& in, bool threaded = true) {
  return run("deform_conv2d", {in.input, in.weight, in.offset, in.bias, in.mask}, cf.attrs(), threaded);
}

template <typename T>
void check(const Config& cf, uint32_t seed = 1) {
  Inputs in = make_inputs<T>(cf, seed);
  auto out = run_op(cf, in);
  ASSERT_EQ(out[0].view.shape, (Shape{cf.n, cf.c_out, cf.h_out(), cf.w_out()}));
  std::vector<T> bias = in.bias ? in.bias->values<T>() : std::vector<T>{};
  std::vector<T> mask = in.mask ? in.mask->values<T>() : std::vector<T>{};
  auto want = naive<T>(cf, in.input.values<T>(), in.weight.values<T>(), in.offset.values<T>(),
                       in.bias ? &bias : nullptr, in.mask ? &mask : nullptr);
  auto got = out[0].values<T>();
  ASSERT_EQ(got.size(), want.size());
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  const double scale = double(cf.c_in / cf.groups * cf.kh * cf.kw) * 4.0;  // bound on |terms| summed
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol * scale) << "element " << i;
  // The work split does not change a single bit.
  auto serial = run_op(cf, in, /*threaded=*/false);
  EXPECT_EQ(serial[0].values<T>(), got);
}

TEST(DeformConv2dKernel, MaskAndBias) { check<float>(Config{}); }
TEST(DeformConv2dKernel, NoMaskNoBias) {
  Config cf;
  cf.mask = cf.bias = false;
  check<float>(cf);
}
TEST(DeformConv2dKernel, MaskWithoutBias) {
  Config cf;
  cf.bias = false;
  check<float>(cf);
}
TEST(DeformConv2dKernel, Float64StrideTwoPadding) {
  Config cf;
  cf.stride = {2, 2};
  cf.padding = {1, 2};
  check<double>(cf);
}
TEST(DeformConv2dKernel, DilationNonSquare) {
  Config cf;
  cf.h = 9, cf.w = 11, cf.kh = 2, cf.kw = 3;
  cf.dilation = {2, 3};
  cf.padding = {1, 0};
  check<double>(cf);
}
TEST(DeformConv2dKernel, GroupsAndOffsetGroups) {
  Config cf;
  cf.c_in = 12, cf.c_out = 9, cf.groups = 3, cf.offset_groups = 2;  // groups straddle offset groups
  check<float>(cf);
  cf.groups = 2, cf.c_out = 4, cf.offset_groups = 4;
  check<double>(cf);
  cf.mask = false;
  check<double>(cf);
}
TEST(DeformConv2dKernel, FarOffsetsAllOutside) {
  Config cf;
  cf.offset_scale = 100.0;
  check<double>(cf);
}
TEST(DeformConv2dKernel, ManyTilesAndWideGemm) {
  // Enough output pixels and depth for several tiles per image and a real blocked GEMM.
  Config cf;
  cf.n = 2, cf.c_in = 48, cf.c_out = 40, cf.h = 30, cf.w = 29;
  cf.padding = {1, 1};
  check<float>(cf);
  cf.groups = 4, cf.offset_groups = 3, cf.stride = {2, 1};
  check<double>(cf);
}
TEST(DeformConv2dKernel, TilesStartMidRowWithAColumnStride) {
  // Tiles of 240 output pixels (cut to whole 48-pixel blocks where the GEMM allows) over rows of 19:
  // each tile's sampling points start mid-row and wrap, stepping 2 input columns per pixel.
  Config cf;
  cf.n = 1, cf.c_in = 32, cf.c_out = 16, cf.h = 40, cf.w = 37, cf.offset_groups = 2;
  cf.padding = {1, 1}, cf.stride = {1, 2};
  check<float>(cf);
  check<double>(cf);
}
TEST(DeformConv2dKernel, OnePixelOutput) {
  Config cf;
  cf.h = 3, cf.w = 3;
  check<float>(cf);
}

TEST(DeformConv2dKernel, IntegerOffsetsSampleExactly) {
  // 1x1 kernel, offset (+1, -1): output(y, x) = w·input(y + 1, x - 1), 0 where that is outside.
  Config cf;
  cf.n = 1, cf.c_in = 1, cf.c_out = 1, cf.kh = cf.kw = 1, cf.h = 4, cf.w = 5;
  cf.bias = cf.mask = false;
  Inputs in = make_inputs<double>(cf, 7);
  std::vector<double> off(2 * 4 * 5);
  for (int p = 0; p < 20; ++p) off[p] = 1.0, off[20 + p] = -1.0;
  in.offset = Tensor::of<double>({1, 2, 4, 5}, off);
  auto got = run_op(cf, in)[0].values<double>();
  auto x = in.input.values<double>();
  const double w = in.weight.values<double>()[0];
  for (int y = 0; y < 4; ++y)
    for (int xx = 0; xx < 5; ++xx) {
      const bool inside = y + 1 < 4 && xx - 1 >= 0;
      EXPECT_EQ(got[y * 5 + xx], inside ? w * x[(y + 1) * 5 + xx - 1] : 0.0) << y << "," << xx;
    }
}

TEST(DeformConv2dKernel, ZeroOffsetsIsPlainConvolution) {
  Config cf;
  cf.padding = {1, 1};
  cf.mask = false;
  Inputs in = make_inputs<double>(cf, 11);
  std::fill_n(in.offset.view.data_as<double>(), in.offset.view.numel(), 0.0);
  auto got = run_op(cf, in)[0].values<double>();
  auto x = in.input.values<double>(), wt = in.weight.values<double>(), b = in.bias->values<double>();
  for (int64_t n = 0; n < cf.n; ++n)
    for (int64_t co = 0; co < cf.c_out; ++co)
      for (int64_t y = 0; y < cf.h_out(); ++y)
        for (int64_t xx = 0; xx < cf.w_out(); ++xx) {
          double acc = b[co];
          for (int64_t c = 0; c < cf.c_in; ++c)
            for (int64_t i = 0; i < 3; ++i)
              for (int64_t j = 0; j < 3; ++j) {
                const int64_t yy = y - 1 + i, xi = xx - 1 + j;
                if (yy >= 0 && yy < cf.h && xi >= 0 && xi < cf.w)
                  acc += wt[((co * cf.c_in + c) * 3 + i) * 3 + j] * x[((n * cf.c_in + c) * cf.h + yy) * cf.w + xi];
              }
          EXPECT_NEAR(got[((n * cf.c_out + co) * cf.h_out() + y) * cf.w_out() + xx], acc, 1e-12);
        }
}

TEST(DeformConv2dKernel, NanOffsetReachesOnlyItsPixel) {
  Config cf;
  cf.n = 1;
  Inputs in = make_inputs<float>(cf, 5);
  in.offset.view.data_as<float>()[3] = std::numeric_limits<float>::quiet_NaN();  // y offset of tap 0 at pixel 3
  auto got = run_op(cf, in)[0].values<float>();
  const int64_t pixels = cf.h_out() * cf.w_out();
  for (int64_t co = 0; co < cf.c_out; ++co)
    for (int64_t p = 0; p < pixels; ++p) EXPECT_EQ(std::isnan(got[co * pixels + p]), p == 3) << co << "," << p;
}

TEST(DeformConv2dKernel, EmptyBatchAndNoChannels) {
  Config cf;
  cf.n = 0;
  Inputs in = make_inputs<float>(cf, 1);
  EXPECT_EQ(run_op(cf, in)[0].view.shape, (Shape{0, 6, 5, 4}));
  // No input channels: an empty sum, the output is the bias.
  Config c0;
  c0.c_in = 0;
  Inputs i0 = make_inputs<float>(c0, 2);
  auto got = run_op(c0, i0)[0].values<float>();
  auto b = i0.bias->values<float>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], b[(i / 20) % 6]);
}

TEST(DeformConv2dKernel, NoInputChannelsReturnAtOnceWhateverTheImageSize) {
  // An empty input image of 2^40 rows (strided to one output row): no work grows with its size.
  Tensor input = Tensor::of<float>({1, 0, int64_t{1} << 40, 1}, {});
  Tensor weight = Tensor::of<float>({2, 0, 1, 1}, {});
  Tensor offset = Tensor::of<float>({1, 2, 1, 1}, {0.5f, 0.5f});
  Tensor bias = Tensor::of<float>({2}, {1.5f, -2.0f});
  std::map<std::string, AttrValue> attrs{{"stride", std::vector<int64_t>{int64_t{1} << 40, 1}}};
  Tensor y = run("deform_conv2d", {input, weight, offset, bias}, attrs)[0];
  EXPECT_EQ(y.view.shape, (Shape{1, 2, 1, 1}));
  EXPECT_EQ(y.values<float>(), (std::vector<float>{1.5f, -2.0f}));
}

TEST(DeformConv2dKernel, EmptyImageIsAllZeroBorderWhateverItsWidth) {
  // Channels but no rows, 2^40 columns strided to two output columns: every sample is outside
  // the image, so the output is the bias, with no padded copy of the (empty) image.
  const int64_t wide = int64_t{1} << 40;
  Tensor input = Tensor::of<float>({1, 1, 0, wide}, {});
  Tensor weight = Tensor::of<float>({2, 1, 1, 7}, std::vector<float>(14, 1.0f));
  Tensor offset = Tensor::of<float>({1, 14, 4, 2}, std::vector<float>(112, 0.25f));
  Tensor bias = Tensor::of<float>({2}, {0.5f, -1.0f});
  std::map<std::string, AttrValue> attrs{{"stride", std::vector<int64_t>{1, wide}}, {"padding", std::vector<int64_t>{2, 4}}};
  Tensor y = run("deform_conv2d", {input, weight, offset, bias}, attrs)[0];
  ASSERT_EQ(y.view.shape, (Shape{1, 2, 4, 2}));
  auto got = y.values<float>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], i < 8 ? 0.5f : -1.0f);
}

TEST(DeformConv2dKernel, EmptyBatchWithSizesWhoseProductsOverflow) {
  // No images; the output's rows times columns, and the dilated kernel, exceed int64.
  const int64_t huge = std::numeric_limits<int64_t>::max();
  Tensor input = Tensor::of<double>({0, 3, 2, huge}, {});
  Tensor weight = Tensor::of<double>({1, 3, 1, 4}, std::vector<double>(12, 1.0));
  Tensor offset = Tensor::of<double>({0, 8, 2, huge - 3}, {});
  std::map<std::string, AttrValue> attrs{{"dilation", std::vector<int64_t>{huge, 1}}};
  Tensor y = run("deform_conv2d", {input, weight, offset}, attrs)[0];
  EXPECT_EQ(y.view.shape, (Shape{0, 1, 2, huge - 3}));
}

void expect_error(const Config& cf, const std::string& what, const std::function<void(Inputs&)>& edit = {}) {
  Inputs in = make_inputs<float>(cf, 3);
  if (edit) edit(in);
  try {
    run_op(cf, in);
    ADD_FAILURE() << "no error, expected: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(DeformConv2dKernel, RejectsBadAttributes) {
  Config cf;
  cf.stride = {1, 1, 1};
  expect_error(cf, "attribute 'stride' must have 2 values");
  cf = Config{}, cf.padding = {-1, 0};
  cf.h = 9;  // keeps the output size positive, so only the kernel can object
  expect_error(cf, "attribute 'padding' values must be >= 0, got [-1, 0]");
  cf = Config{}, cf.dilation = {1, 0};
  expect_error(cf, "attribute 'dilation' values must be >= 1");
  cf = Config{}, cf.c_out = 6, cf.c_in = 4, cf.groups = 4;
  expect_error(cf, "output channels (weight.shape[0] = 6) must be divisible by groups (4)");
  cf = Config{}, cf.c_in = 4, cf.offset_groups = 3;
  expect_error(cf, "input channels (4) must be divisible by offset_groups (3)");
}

TEST(DeformConv2dKernel, RejectsBadShapes) {
  Config cf;
  expect_error(cf, "mask must have offset_groups*kh*kw = 9 channels, got 8", [](Inputs& in) {
    in.mask = Tensor::random<float>({2, 8, 5, 4}, 1);
  });
  expect_error(cf, "input channels must equal weight.shape[1] * groups", [](Inputs& in) {
    in.weight = Tensor::random<float>({6, 3, 3, 3}, 1);
  });
  expect_error(cf, "offset must have 2*offset_groups*kh*kw channels", [](Inputs& in) {
    in.offset = Tensor::random<float>({2, 9, 5, 4}, 1);
  });
  expect_error(cf, "offset height must be the output height", [](Inputs& in) {
    in.offset = Tensor::random<float>({2, 18, 4, 4}, 1);
  });
  expect_error(cf, "mask width must be the output width", [](Inputs& in) {
    in.mask = Tensor::random<float>({2, 9, 5, 5}, 1);
  });
  expect_error(cf, "bias must have weight.shape[0] values", [](Inputs& in) {
    in.bias = Tensor::random<float>({5}, 1);
  });
  cf.h = 2;  // output height 0
  expect_error(cf, "output size would be 0x4");
}

// Every variant of the hot loops that this build has and this CPU runs, against naive loops.
std::vector<deform_conv2d_impl::Variant> runnable_variants() {
  using namespace deform_conv2d_impl;
  std::vector<Variant> v{baseline_variant()};
  if (cpu_has_avx2() && avx2_variant().isa) v.push_back(avx2_variant());
  if (cpu_has_avx512() && avx512_variant().isa) v.push_back(avx512_variant());
  return v;
}

template <typename T>
void check_gemm(const deform_conv2d_impl::Kernels<T>& kernels, const char* isa) {
  // Shapes that take every panel width and micro-tile tail of the wide variants: output channels
  // in one partial vector, several vectors, more than one panel; fewer pixels than a micro-tile,
  // a multiple of it, one past it.
  for (auto [m, k, n] : {std::array<int64_t, 3>{1, 1, 1}, {7, 13, 5}, {64, 576, 113}, {33, 0, 9}, {40, 9, 30},
                         {100, 17, 7}, {17, 5, 25}, {128, 3, 24}, {9, 2, 13}}) {
    Tensor a = Tensor::random<T>({m, k}, 1), b = Tensor::random<T>({n, k}, 2), bias = Tensor::random<T>({m}, 3);
    const int64_t ldo = n + 3;
    std::vector<T> packed(static_cast<size_t>(kernels.weight_size(m, k)));
    kernels.pack_weight(a.view.data_as<T>(), m, k, packed.data());
    for (bool with_bias : {false, true}) {
      std::vector<T> out(static_cast<size_t>(m * ldo), T(-7));
      kernels.gemm(packed.data(), b.view.data_as<T>(), with_bias ? bias.view.data_as<T>() : nullptr, out.data(), m, k,
                   n, ldo);
      auto av = a.values<T>(), bv = b.values<T>(), biv = bias.values<T>();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldo; ++j) {
          if (j >= n) {
            EXPECT_EQ(out[i * ldo + j], T(-7)) << isa << ": wrote past the row";
            continue;
          }
          double acc = with_bias ? biv[i] : 0.0;
          for (int64_t q = 0; q < k; ++q) acc += double(av[i * k + q]) * double(bv[j * k + q]);
          const double tol = (std::is_same_v<T, float> ? 1e-5 : 1e-13) * double(k + 1);
          EXPECT_NEAR(out[i * ldo + j], acc, tol) << isa << " m=" << m << " k=" << k << " n=" << n;
        }
    }
  }
}

// The channels-last copy of one image row: channel counts below, at and past a vector's width
// (and two), rows shorter and longer than one.
template <typename T>
void check_channels_last(const deform_conv2d_impl::Kernels<T>& kernels, const char* isa) {
  for (auto [c_in, w] : {std::array<int64_t, 2>{1, 1}, {3, 40}, {16, 16}, {37, 35}, {64, 9}}) {
    const int64_t plane = w + 5;  // the planes of a taller image: rows in between
    Tensor src = Tensor::random<T>({c_in, plane}, 1);
    std::vector<T> dst(static_cast<size_t>(c_in * w + 2), T(-7));
    kernels.channels_last(src.view.data_as<T>(), plane, c_in, w, dst.data() + 1);
    auto sv = src.values<T>();
    for (int64_t x = 0; x < w; ++x)
      for (int64_t c = 0; c < c_in; ++c)
        EXPECT_EQ(dst[1 + x * c_in + c], sv[c * plane + x]) << isa << " c_in=" << c_in << " w=" << w;
    EXPECT_EQ(dst.front(), T(-7)) << isa;
    EXPECT_EQ(dst.back(), T(-7)) << isa << ": wrote past the row";
  }
}

// The bilinear corners of a row of samples: inside, on and past the image's edges, at integers,
// far away, infinite and NaN; rows longer and shorter than a vector. The reference is floor() and
// the bilinear weights in double, from the same sampling point.
template <typename T>
void check_corners(const deform_conv2d_impl::Kernels<T>& kernels, const char* isa) {
  const int64_t h = 5, w = 7, padded_w = w + 2;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> special = {-1, T(-0.999), 0, 4, T(4.001), T(3.5), 5, 6, T(6.999), 7, -inf, inf, nan, T(1e30), T(-3)};
  std::mt19937 gen(5);
  std::uniform_real_distribution<double> pos(-2, 8);
  for (int64_t len : {int64_t{1}, int64_t{16}, int64_t{53}}) {
    std::vector<T> at_y(len), at_x(len), dy(len), dx(len);
    for (int64_t q = 0; q < len; ++q) {
      at_y[q] = T(q % 4), at_x[q] = T(q % 6);
      dy[q] = T(pos(gen)) - at_y[q], dx[q] = T(pos(gen)) - at_x[q];
      if (q % 3 == 0) dy[q] = special[q % special.size()];
      if (q % 5 == 1) dx[q] = special[(q / 5) % special.size()];
    }
    std::vector<deform_conv2d_impl::Corner<T>> out(len + 1, {-9, {T(-9), T(-9), T(-9), T(-9)}});
    kernels.corners({at_y.data(), at_x.data(), dy.data(), dx.data(), len, h, w, padded_w, out.data()});
    for (int64_t q = 0; q < len; ++q) {
      const double y = at_y[q] + dy[q], x = at_x[q] + dx[q];  // the sum in T, as the kernel adds
      const auto& c = out[q];
      if (std::isnan(y) || std::isnan(x)) {
        EXPECT_EQ(c.pixel, 0) << isa;
        for (T wt : c.w) EXPECT_TRUE(std::isnan(wt)) << isa << " q=" << q;
      } else if (y <= -1 || y >= h || x <= -1 || x >= w) {
        EXPECT_EQ(c.pixel, 0) << isa << " q=" << q << " y=" << y << " x=" << x;
        for (T wt : c.w) EXPECT_EQ(wt, T(0)) << isa << " q=" << q;
      } else {
        const double y0 = std::floor(y), x0 = std::floor(x), ly = y - y0, lx = x - x0;
        EXPECT_EQ(c.pixel, int64_t(y0 + 1) * padded_w + int64_t(x0 + 1)) << isa << " q=" << q << " y=" << y << " x=" << x;
        const double want[4] = {(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx};
        for (int i = 0; i < 4; ++i) EXPECT_NEAR(c.w[i], want[i], 1e-6) << isa << " q=" << q;
      }
    }
    EXPECT_EQ(out[len].pixel, -9) << isa << ": wrote past the row";
  }
}

// A variant's float corners bit for bit the baseline's (corner() itself), NaN for NaN: the
// vector loops claim the same arithmetic step for step.
void check_corners_match_baseline(const deform_conv2d_impl::Kernels<float>& kernels, const char* isa) {
  const int64_t h = 5, w = 7, padded_w = w + 2, len = 45;  // whole vectors and a tail of each width
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> pos(-3, 9);
  std::vector<float> at_y(len), at_x(len), dy(len), dx(len);
  for (int64_t q = 0; q < len; ++q) {
    at_y[q] = float(q % 5), at_x[q] = float(q % 7), dy[q] = pos(gen), dx[q] = pos(gen);
    if (q % 11 == 3) dy[q] = nan;
    if (q % 13 == 4) dx[q] = -1.0f - at_x[q];  // exactly on the edge: outside
  }
  using Row = std::vector<deform_conv2d_impl::Corner<float>>;
  Row got(len), want(len);
  kernels.corners({at_y.data(), at_x.data(), dy.data(), dx.data(), len, h, w, padded_w, got.data()});
  deform_conv2d_impl::baseline_variant().f32.corners(
      {at_y.data(), at_x.data(), dy.data(), dx.data(), len, h, w, padded_w, want.data()});
  for (int64_t q = 0; q < len; ++q) {
    EXPECT_EQ(got[q].pixel, want[q].pixel) << isa << " q=" << q;
    for (int i = 0; i < 4; ++i) {
      if (std::isnan(want[q].w[i]))
        EXPECT_TRUE(std::isnan(got[q].w[i])) << isa << " q=" << q;
      else
        EXPECT_EQ(got[q].w[i], want[q].w[i]) << isa << " q=" << q << " i=" << i;
    }
  }
}

// One tile's samples for the hot-loop checks: 3 offset groups of kCog channels, the convolution
// group [kBegin, kBegin + 2·kCog) (from 5: straddling all three); every sample's four neighbours
// inside the 4x5 image; bilinear weights from random fractions (ly, lx). kCog 7 gives runs of
// channels shorter than a vector, 37 runs of whole vectors and a remainder; kBegin = kCog with
// kCog 16, 32 or 64 a group of whole offset groups, runs of one to eight vectors and nothing else.
template <typename T, int64_t kCog = 7, int64_t kBegin = 5>
struct TileSamples {
  static constexpr int64_t cog = kCog, c_in = 3 * cog, c_begin = kBegin, cg = 2 * cog, kk = 2, tile = 6, len = 5,
                           ph = 4, pw = 5;
  Tensor image = Tensor::random<T>({ph, pw, c_in}, 1), mask = Tensor::random<T>({3, kk, tile}, 2);
  std::vector<deform_conv2d_impl::Corner<T>> corners = std::vector<deform_conv2d_impl::Corner<T>>(3 * kk * tile);
  std::vector<std::array<double, 2>> frac = std::vector<std::array<double, 2>>(corners.size());  // (ly, lx)

  TileSamples() {
    std::mt19937 gen(3);
    std::uniform_real_distribution<double> unit(0, 1);
    for (size_t i = 0; i < corners.size(); ++i) {
      corners[i].pixel = std::uniform_int_distribution<int64_t>(0, (ph - 1) * pw - 2)(gen);
      const double ly = unit(gen), lx = unit(gen);
      frac[i] = {ly, lx};
      const T w[4] = {T((1 - ly) * (1 - lx)), T((1 - ly) * lx), T(ly * (1 - lx)), T(ly * lx)};
      std::copy(w, w + 4, corners[i].w);
    }
  }
  deform_conv2d_impl::ColumnJob<T> job(bool masked, T* columns) {
    return {image.view.data_as<T>(), corners.data(), masked ? mask.view.data_as<T>() : nullptr, columns, len, tile,
            kk, c_begin, cg, cog, c_in, pw};
  }
  // The sample of channel `ch` at pixel q and kernel position k: its slot in the tables, and
  // its four neighbours' values.
  int64_t slot(int64_t q, int64_t k, int64_t ch) const { return ((ch / cog) * kk + k) * tile + q; }
  std::array<double, 4> neighbours(int64_t slot, int64_t ch) {
    auto im = image.values<T>();
    const int64_t p = corners[slot].pixel;
    return {double(im[p * c_in + ch]), double(im[(p + 1) * c_in + ch]), double(im[(p + pw) * c_in + ch]),
            double(im[(p + pw + 1) * c_in + ch])};
  }
};

template <typename T, int64_t kCog, int64_t kBegin = 5>
void check_columns(const deform_conv2d_impl::Kernels<T>& kernels, const char* isa) {
  TileSamples<T, kCog, kBegin> t;
  using S = TileSamples<T, kCog, kBegin>;
  auto mk = t.mask.template values<T>();
  for (bool masked : {false, true}) {
    std::vector<T> cols(static_cast<size_t>(S::len * S::kk * S::cg), T(-7));
    kernels.columns(t.job(masked, cols.data()));
    for (int64_t q = 0; q < S::len; ++q)
      for (int64_t k = 0; k < S::kk; ++k)
        for (int64_t c = 0; c < S::cg; ++c) {
          const int64_t ch = S::c_begin + c, slot = t.slot(q, k, ch);
          const std::array<double, 4> v = t.neighbours(slot, ch);
          double want = 0;
          for (int i = 0; i < 4; ++i) want += double(t.corners[slot].w[i]) * v[i];
          if (masked) want *= double(mk[slot]);
          const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-14;
          EXPECT_NEAR(cols[(q * S::kk + k) * S::cg + c], want, tol) << isa;
        }
  }
}

// The fused sample-and-fill (sample_columns) against the same variant's corners then columns, bit
// for bit (NaN where NaN), and against the bilinear samples in double: runs of one to eight
// vectors and of a width known only at run time, one and three offset groups in the group (the
// group starting at the image's second offset group), tiles of whole vectors of pixels and with a
// tail, samples inside, on the edges, outside, at NaN; with and without a mask. A run that is not
// whole vectors is refused (false) without a write.
void check_sample_columns(const deform_conv2d_impl::Kernels<float>& kernels, const char* isa) {
  using namespace deform_conv2d_impl;
  if (!kernels.sample_columns) return;
  const int64_t h = 5, w = 7, padded_w = w + 2, kk = 2;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  int fused = 0;
  for (int64_t cog : {8, 16, 24, 32, 48, 64, 128})
    for (int64_t runs : {1, 3})
      for (int64_t len : {16, 37}) {
        const int64_t tile = len + 3, pixels = len + 5, groups = runs + 1, c_in = groups * cog, cg = runs * cog;
        std::mt19937 gen(static_cast<uint32_t>(cog * 100 + runs * 10 + len));
        std::uniform_real_distribution<float> pos(-3, 9), value(-2, 2);
        // The zero-bordered channels-last image.
        std::vector<float> image(static_cast<size_t>((h + 2) * padded_w * c_in), 0.0f);
        for (int64_t y = 1; y <= h; ++y)
          for (int64_t x = 1; x <= w; ++x)
            for (int64_t c = 0; c < c_in; ++c) image[(y * padded_w + x) * c_in + c] = value(gen);
        std::vector<float> at(2 * kk * tile), offset(2 * groups * kk * pixels), mask(groups * kk * pixels);
        for (int64_t k = 0; k < kk; ++k)
          for (int64_t q = 0; q < tile; ++q) at[2 * k * tile + q] = float(q % 5), at[(2 * k + 1) * tile + q] = float(q % 7);
        for (size_t i = 0; i < offset.size(); ++i) offset[i] = pos(gen) - float(i % 5);
        for (size_t i = 0; i < offset.size(); i += 17) offset[i] = nan;
        for (size_t i = 3; i < offset.size(); i += 13) {  // exactly on the edge at -1: outside
          const int64_t q = int64_t(i) % pixels, row = int64_t(i) / pixels;
          offset[i] = -1.0f - float(row % 2 ? q % 7 : q % 5);
        }
        for (float& m : mask) m = value(gen);
        for (bool masked : {false, true}) {
          // Corner tables of every offset group, then the group of offset groups [1, 1 + runs).
          std::vector<Corner<float>> corners(static_cast<size_t>(groups * kk * tile));
          std::vector<float> mask_table(corners.size());
          for (int64_t og = 0; og < groups; ++og)
            for (int64_t k = 0; k < kk; ++k) {
              const float* dy = offset.data() + 2 * (og * kk + k) * pixels;
              kernels.corners({&at[2 * k * tile], &at[(2 * k + 1) * tile], dy, dy + pixels, len, h, w, padded_w,
                               corners.data() + (og * kk + k) * tile});
              std::copy(mask.begin() + (og * kk + k) * pixels, mask.begin() + (og * kk + k) * pixels + len,
                        mask_table.begin() + (og * kk + k) * tile);
            }
          // Past the block: a guard that must stay as it is.
          std::vector<float> want(static_cast<size_t>(len * kk * cg + 64), -7.0f), got(want.size(), -7.0f);
          kernels.columns({image.data(), corners.data(), masked ? mask_table.data() : nullptr, want.data(), len, tile, kk,
                           cog, cg, cog, c_in, padded_w});
          const bool ran = kernels.sample_columns({image.data() + cog, at.data(), offset.data() + 2 * kk * pixels,
                                                   masked ? mask.data() + kk * pixels : nullptr, got.data(), len, tile,
                                                   pixels, kk, runs, cog, c_in, h, w, padded_w});
          if (!ran) {
            for (float v : got) ASSERT_EQ(v, -7.0f) << isa << " cog=" << cog << ": refused, but wrote";
            continue;
          }
          ++fused;
          for (int64_t q = 0; q < len; ++q)
            for (int64_t k = 0; k < kk; ++k)
              for (int64_t c = 0; c < cg; ++c) {
                const int64_t i = (q * kk + k) * cg + c, og = 1 + c / cog, slot = (og * kk + k) * tile + q;
                const std::string where = std::string(isa) + " cog=" + std::to_string(cog) + " runs=" +
                                          std::to_string(runs) + " len=" + std::to_string(len) + " q=" +
                                          std::to_string(q) + " k=" + std::to_string(k) + " c=" + std::to_string(c) +
                                          (masked ? " masked" : "");
                if (std::isnan(want[i])) {
                  ASSERT_TRUE(std::isnan(got[i])) << where;
                  continue;
                }
                ASSERT_EQ(got[i], want[i]) << where;
                // The sample itself, in double from the sampling point.
                const double y = double(at[2 * k * tile + q] + offset[2 * (og * kk + k) * pixels + q]);
                const double x = double(at[(2 * k + 1) * tile + q] + offset[(2 * (og * kk + k) + 1) * pixels + q]);
                double v = 0;
                if (y > -1 && y < h && x > -1 && x < w) {
                  const double y0 = std::floor(y), x0 = std::floor(x), ly = y - y0, lx = x - x0;
                  const auto px = [&](double yy, double xx) {
                    return double(image[((int64_t(yy) + 1) * padded_w + int64_t(xx) + 1) * c_in + cog + c]);
                  };
                  v = (1 - ly) * (1 - lx) * px(y0, x0) + (1 - ly) * lx * px(y0, x0 + 1) + ly * (1 - lx) * px(y0 + 1, x0) +
                      ly * lx * px(y0 + 1, x0 + 1);
                }
                if (masked) v *= double(mask_table[slot]);
                ASSERT_NEAR(got[i], v, 1e-5) << where;
              }
          for (size_t i = size_t(len * kk * cg); i < got.size(); ++i) ASSERT_EQ(got[i], -7.0f) << isa << ": wrote past";
        }
      }
  EXPECT_GT(fused, 0) << isa << ": no shape took the fused loop";
}

// The backward's GEMMs: acc += g · columns and out = gᵀ · w, g with a row stride.
template <typename T>
void check_backward_gemms(const deform_conv2d_impl::Kernels<T>& kernels, const char* isa) {
  for (auto [m, n, k] : {std::array<int64_t, 3>{1, 1, 1}, {7, 13, 5}, {64, 113, 576}, {0, 9, 4}}) {
    const int64_t ldg = n + 3;
    Tensor g = Tensor::random<T>({std::max<int64_t>(m, 1), ldg}, 1), cols = Tensor::random<T>({n, k}, 2),
           w = Tensor::random<T>({std::max<int64_t>(m, 1), k}, 3), acc0 = Tensor::random<T>({std::max<int64_t>(m, 1), k}, 4);
    auto gv = g.values<T>(), cv = cols.values<T>(), wv = w.values<T>(), a0 = acc0.values<T>();
    std::vector<T> acc(a0.begin(), a0.end()), out(static_cast<size_t>(n * k), T(-7));
    kernels.gemm_acc_g_cols(g.view.data_as<T>(), ldg, cols.view.data_as<T>(), acc.data(), m, n, k);
    kernels.gemm_gt_w(g.view.data_as<T>(), ldg, w.view.data_as<T>(), out.data(), m, n, k);
    const double tol = (std::is_same_v<T, float> ? 1e-5 : 1e-13) * double(std::max(m, n) + 1);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) {
        double want = a0[i * k + j];
        for (int64_t q = 0; q < n; ++q) want += double(gv[i * ldg + q]) * double(cv[q * k + j]);
        EXPECT_NEAR(acc[i * k + j], want, tol) << isa << " acc m=" << m << " n=" << n << " k=" << k;
      }
    for (int64_t q = 0; q < n; ++q)
      for (int64_t j = 0; j < k; ++j) {
        double want = 0;  // no output channels (m = 0): zero
        for (int64_t i = 0; i < m; ++i) want += double(gv[i * ldg + q]) * double(wv[i * k + j]);
        EXPECT_NEAR(out[q * k + j], want, tol) << isa << " gt_w m=" << m << " n=" << n << " k=" << k;
      }
  }
}

// The samples' gradients, the derivatives written independently of the kernel's form:
// d/dy = -hx·a - lx·b + hx·c + lx·d and d/dx = -hy·a + hy·b - ly·c + ly·d.
template <typename T, int64_t kCog>
void check_sample_grads(const deform_conv2d_impl::Kernels<T>& kernels, const char* isa) {
  TileSamples<T, kCog> t;
  using S = TileSamples<T, kCog>;
  Tensor grad_columns = Tensor::random<T>({S::len, S::kk, S::cg}, 3);
  auto mk = t.mask.template values<T>();
  auto gc = grad_columns.values<T>();
  for (bool masked : {false, true}) {
    const size_t n = t.corners.size();
    std::vector<T> grad_image(static_cast<size_t>(S::ph * S::pw * S::c_in), T(0.5));
    std::vector<T> gy(n, T(1)), gx(n, T(2)), gm(n, T(3));
    kernels.sample_grads({t.job(masked, nullptr), grad_columns.view.data_as<T>(), grad_image.data(), gy.data(),
                          gx.data(), gm.data()});
    std::vector<double> want_image(grad_image.size(), 0.5), want_y(n, 1), want_x(n, 2), want_m(n, 3);
    for (int64_t q = 0; q < S::len; ++q)
      for (int64_t k = 0; k < S::kk; ++k)
        for (int64_t c = 0; c < S::cg; ++c) {
          const int64_t ch = S::c_begin + c, slot = t.slot(q, k, ch), p = t.corners[slot].pixel;
          const auto [ly, lx] = t.frac[slot];
          const double hy = 1 - ly, hx = 1 - lx;
          const double m = masked ? double(mk[slot]) : 1.0, g = double(gc[(q * S::kk + k) * S::cg + c]);
          const std::array<double, 4> v = t.neighbours(slot, ch);
          const int64_t at[4] = {p, p + 1, p + S::pw, p + S::pw + 1};
          double sample = 0;
          for (int i = 0; i < 4; ++i) {
            sample += double(t.corners[slot].w[i]) * v[i];
            want_image[at[i] * S::c_in + ch] += g * m * double(t.corners[slot].w[i]);
          }
          want_m[slot] += g * sample;
          want_y[slot] += g * m * (-hx * v[0] - lx * v[1] + hx * v[2] + lx * v[3]);
          want_x[slot] += g * m * (-hy * v[0] + hy * v[1] - ly * v[2] + ly * v[3]);
        }
    const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-13;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(gy[i], want_y[i], tol) << isa << " grad_y " << i;
      EXPECT_NEAR(gx[i], want_x[i], tol) << isa << " grad_x " << i;
      EXPECT_NEAR(gm[i], want_m[i], tol) << isa << " grad_mask " << i;
    }
    for (size_t i = 0; i < grad_image.size(); ++i)
      EXPECT_NEAR(grad_image[i], want_image[i], tol) << isa << " grad_image " << i;
  }
}

TEST(DeformConv2dVariants, EveryRunnableVariant) {
  std::string names;
  for (const auto& v : runnable_variants()) {
    check_corners<float>(v.f32, v.isa);
    check_corners<double>(v.f64, v.isa);
    check_corners_match_baseline(v.f32, v.isa);
    check_channels_last<float>(v.f32, v.isa);
    check_channels_last<double>(v.f64, v.isa);
    check_gemm<float>(v.f32, v.isa);
    check_gemm<double>(v.f64, v.isa);
    check_columns<float, 7>(v.f32, v.isa);
    check_columns<float, 37>(v.f32, v.isa);
    check_columns<float, 16, 16>(v.f32, v.isa);
    check_columns<float, 32, 32>(v.f32, v.isa);
    check_columns<float, 64, 64>(v.f32, v.isa);
    check_columns<double, 7>(v.f64, v.isa);
    check_columns<double, 37>(v.f64, v.isa);
    check_sample_columns(v.f32, v.isa);
    check_backward_gemms<float>(v.f32, v.isa);
    check_backward_gemms<double>(v.f64, v.isa);
    check_sample_grads<float, 7>(v.f32, v.isa);
    check_sample_grads<float, 37>(v.f32, v.isa);
    check_sample_grads<double, 7>(v.f64, v.isa);
    check_sample_grads<double, 37>(v.f64, v.isa);
    names += std::string(" ") + v.isa;
  }
  std::cout << "variants checked:" << names << "; the kernel runs " << deform_conv2d_impl::best_variant().isa << "\n";
  EXPECT_EQ(runnable_variants().back().isa, deform_conv2d_impl::best_variant().isa);
}

}  // namespace
}  // namespace opbridge::testing
