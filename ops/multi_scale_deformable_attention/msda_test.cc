// multi_scale_deformable_attention's kernels against naive loops in double: every variant of the
// float32 loops this CPU runs (baseline, AVX2, AVX-512), every channel count with a loop of its own
// (16, 32, 64) and another, samples inside, across and outside the levels' borders, sample counts
// around the fixed-channel loops' table, query ranges; the op through the kernel harness on one
// thread and many.
#include <cmath>
#include <random>

#include <gtest/gtest.h>
#include <opbridge/cpu.h>
#include <opbridge/testing/kernel_harness.h>

#include "msda_variants.h"

namespace opbridge::testing {
namespace {

using msda_impl::Geometry;

struct Problem {
  int64_t b, h, d, q, p;
  std::vector<int64_t> level_h, level_w, level_start;
  int64_t s = 0;
  std::vector<float> value, loc, weight, grad_out;

  Problem(int64_t b_, int64_t h_, int64_t d_, int64_t q_, int64_t p_, std::vector<std::pair<int64_t, int64_t>> levels,
          uint32_t seed)
      : b(b_), h(h_), d(d_), q(q_), p(p_) {
    for (auto [hh, ww] : levels) level_h.push_back(hh), level_w.push_back(ww), level_start.push_back(s), s += hh * ww;
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> any(-2.f, 2.f), where(-0.3f, 1.3f), unit(0.f, 1.f);
    const int64_t l = levels_count();
    value.resize(b * s * h * d), loc.resize(b * q * h * l * p * 2), weight.resize(b * q * h * l * p);
    grad_out.resize(b * q * h * d);
    for (float& v : value) v = any(gen);
    for (float& v : loc) v = where(gen);
    for (float& v : weight) v = unit(gen);
    for (float& v : grad_out) v = any(gen);
  }
  int64_t levels_count() const { return static_cast<int64_t>(level_h.size()); }
  Geometry geometry() const { return {b, s, h, d, q, levels_count(), p, level_h.data(), level_w.data(), level_start.data()}; }
};

// The bilinear sample's corners and weights at normalised (x, y), written out plainly.
struct Corner {
  int64_t position;
  double weight, dwx, dwy;  // weight, and its derivatives in pixel x and y
};
std::vector<Corner> corners(double xn, double yn, int64_t hh, int64_t ww, int64_t start) {
  const double x = xn * ww - 0.5, y = yn * hh - 0.5;
  std::vector<Corner> out;
  if (!(x > -1 && y > -1 && x < ww && y < hh)) return out;
  const double x0 = std::floor(x), y0 = std::floor(y), lx = x - x0, ly = y - y0;
  for (int k = 0; k < 4; ++k) {
    const int64_t yy = static_cast<int64_t>(y0) + k / 2, xx = static_cast<int64_t>(x0) + k % 2;
    if (yy < 0 || yy >= hh || xx < 0 || xx >= ww) continue;
    const double wy = k / 2 ? ly : 1 - ly, wx = k % 2 ? lx : 1 - lx;
    out.push_back({start + yy * ww + xx, wy * wx, wy * (k % 2 ? 1 : -1), wx * (k / 2 ? 1 : -1)});
  }
  return out;
}

struct Naive {
  std::vector<double> out, grad_value, grad_loc, grad_weight;
};
Naive naive(const Problem& pr) {
  const int64_t l = pr.levels_count();
  Naive n{std::vector<double>(pr.b * pr.q * pr.h * pr.d), std::vector<double>(pr.value.size()),
          std::vector<double>(pr.loc.size()), std::vector<double>(pr.weight.size())};
  for (int64_t b = 0; b < pr.b; ++b)
    for (int64_t q = 0; q < pr.q; ++q)
      for (int64_t h = 0; h < pr.h; ++h)
        for (int64_t lv = 0; lv < l; ++lv)
          for (int64_t p = 0; p < pr.p; ++p) {
            const int64_t k = (((b * pr.q + q) * pr.h + h) * l + lv) * pr.p + p, o = ((b * pr.q + q) * pr.h + h) * pr.d;
            const double w = pr.weight[k];
            for (const Corner& c : corners(pr.loc[2 * k], pr.loc[2 * k + 1], pr.level_h[lv], pr.level_w[lv],
                                           pr.level_start[lv]))
              for (int64_t i = 0; i < pr.d; ++i) {
                const int64_t vi = ((b * pr.s + c.position) * pr.h + h) * pr.d + i;
                const double g = pr.grad_out[o + i];
                n.out[o + i] += w * c.weight * pr.value[vi];
                n.grad_value[vi] += w * c.weight * g;
                n.grad_weight[k] += c.weight * pr.value[vi] * g;
                n.grad_loc[2 * k] += w * c.dwx * pr.level_w[lv] * pr.value[vi] * g;
                n.grad_loc[2 * k + 1] += w * c.dwy * pr.level_h[lv] * pr.value[vi] * g;
              }
          }
  return n;
}

void expect_near(const std::vector<float>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
}

std::vector<msda_impl::Variant> variants() {
  std::vector<msda_impl::Variant> out{msda_impl::baseline_variant()};
  if (cpu_has_avx2() && msda_impl::avx2_variant().isa) out.push_back(msda_impl::avx2_variant());
  if (cpu_has_avx512() && msda_impl::avx512_variant().isa) out.push_back(msda_impl::avx512_variant());
  return out;
}

void check_variants(const Problem& pr) {
  const Naive want = naive(pr);
  const Geometry g = pr.geometry();
  for (const msda_impl::Variant& v : variants()) {
    const std::string what = std::string(v.isa) + " d=" + std::to_string(pr.d);
    std::vector<float> out(want.out.size(), NAN);
    // Batch item 0 in two ranges of queries, item 1 whole.
    v.forward(g, pr.value.data(), pr.loc.data(), pr.weight.data(), 0, 0, pr.q / 2, out.data());
    v.forward(g, pr.value.data(), pr.loc.data(), pr.weight.data(), 0, pr.q / 2, pr.q, out.data());
    if (pr.b > 1) v.forward(g, pr.value.data(), pr.loc.data(), pr.weight.data(), 1, 0, pr.q, out.data());
    expect_near(out, want.out, 1e-5, what + " forward");
    std::vector<float> gv(want.grad_value.size(), 0.f), gl(want.grad_loc.size(), NAN), gw(want.grad_weight.size(), NAN);
    for (int64_t b = 0; b < pr.b; ++b)  // batch item 0's heads one at a time, item 1's at once
      for (int64_t h = 0; h < pr.h; h += b == 0 ? 1 : pr.h)
        v.backward(g, pr.grad_out.data(), pr.value.data(), pr.loc.data(), pr.weight.data(), b, h,
                   b == 0 ? h + 1 : pr.h, gv.data(), gl.data(), gw.data());
    expect_near(gv, want.grad_value, 1e-5, what + " grad_value");
    expect_near(gl, want.grad_loc, 1e-4, what + " grad_sampling_locations");
    expect_near(gw, want.grad_weight, 1e-5, what + " grad_attention_weights");
  }
}

TEST(MultiScaleDeformableAttentionKernel, EveryVariantAndChannelLoopAgainstNaive) {
  for (int64_t d : {16, 32, 64, 5})
    check_variants(Problem(2, 2, d, 9, 4, {{7, 9}, {4, 5}, {2, 2}, {1, 1}}, static_cast<uint32_t>(d)));
}

// The fixed-channel loops compute up to 64 samples per (b, q, h) in a table, a vector of samples
// at a time: 4 levels x 16 points fill it, 5 x 13 = 65 take the sample-by-sample loop, 3 x 3 and
// 2 x 7 fill part of a vector; an odd head count.
TEST(MultiScaleDeformableAttentionKernel, SampleCountsAroundTheTable) {
  check_variants(Problem(2, 3, 32, 7, 16, {{7, 9}, {4, 5}, {2, 2}, {1, 1}}, 11));
  check_variants(Problem(2, 3, 32, 7, 13, {{7, 9}, {4, 5}, {3, 3}, {2, 2}, {1, 1}}, 12));
  check_variants(Problem(2, 3, 16, 7, 3, {{7, 9}, {4, 5}, {2, 2}}, 13));
  check_variants(Problem(1, 3, 64, 7, 7, {{5, 6}, {1, 3}}, 14));
}

TEST(MultiScaleDeformableAttentionKernel, OpThroughHarnessOnOneThreadAndMany) {
  const Problem pr(2, 3, 32, 50, 4, {{6, 8}, {3, 4}}, 7);
  const Naive want = naive(pr);
  const int64_t l = pr.levels_count();
  std::vector<int64_t> shapes;
  for (int64_t i = 0; i < l; ++i) shapes.push_back(pr.level_h[i]), shapes.push_back(pr.level_w[i]);
  for (bool threaded : {false, true}) {
    auto out = run("multi_scale_deformable_attention",
                   {Tensor::of<float>({pr.b, pr.s, pr.h, pr.d}, pr.value), Tensor::of<int64_t>({l, 2}, shapes),
                    Tensor::of<int64_t>({l}, pr.level_start), Tensor::of<float>({pr.b, pr.q, pr.h, l, pr.p, 2}, pr.loc),
                    Tensor::of<float>({pr.b, pr.q, pr.h, l, pr.p}, pr.weight)},
                   {}, threaded);
    ASSERT_EQ(out[0].view.shape, (Shape{pr.b, pr.q, pr.h * pr.d}));
    expect_near(out[0].values<float>(), want.out, 1e-5, threaded ? "threaded" : "one thread");
  }
}

}  // namespace
}  // namespace opbridge::testing
