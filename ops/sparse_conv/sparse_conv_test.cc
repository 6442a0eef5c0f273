// The sparse convolution family's kernels against naive loops: the rulebook against the
// convolution's definition (output site o takes input q at offset t when q = o * stride - padding +
// t * dilation), the convolution and max pooling against sums over every pair, on one thread and many.
#include <gtest/gtest.h>
#include <opbridge/testing/kernel_harness.h>

#include <opbridge/cpu.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "sparse_conv_variants.h"

namespace opbridge::testing {
namespace {

using Site = std::vector<int32_t>;

// n distinct sites (batch, z, y, x) in random order.
Tensor sites(int64_t n, const std::vector<int32_t>& shape, int32_t batch, uint32_t seed) {
  std::mt19937 gen(seed);
  std::set<Site> seen;
  std::vector<int32_t> flat;
  while (static_cast<int64_t>(seen.size()) < n) {
    Site s{static_cast<int32_t>(gen() % batch)};
    for (int32_t d : shape) s.push_back(static_cast<int32_t>(gen() % d));
    if (seen.insert(s).second) flat.insert(flat.end(), s.begin(), s.end());
  }
  return Tensor::of<int32_t>({n, static_cast<int64_t>(shape.size()) + 1}, flat);
}

struct Naive {
  std::vector<Site> outs;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> pairs;  // per offset, (input, output)
};

// A strided convolution's rulebook from its definition: offsets in row-major order, each input row
// in order, output sites numbered by first appearance (ascending offset = descending position).
Naive naive_rulebook(const std::vector<int32_t>& idx, int64_t n, const std::vector<int32_t>& shape,
                     const std::vector<int32_t>& k, const std::vector<int32_t>& s, const std::vector<int32_t>& p) {
  const int dims = static_cast<int>(shape.size());
  int kv = 1;
  for (int32_t v : k) kv *= v;
  Naive r;
  r.pairs.resize(kv);
  std::map<Site, int32_t> ids;
  for (int64_t j = 0; j < n; ++j) {
    for (int t = 0; t < kv; ++t) {
      Site o{idx[j * (dims + 1)]};
      int rest = t, step = kv;
      bool ok = true;
      for (int a = 0; a < dims; ++a) {
        step /= k[a];
        const int ta = rest / step;
        rest %= step;
        const int num = idx[j * (dims + 1) + a + 1] + p[a] - ta;  // dilation 1
        const int out = (shape[a] + 2 * p[a] - k[a]) / s[a] + 1;
        ok = ok && num >= 0 && num % s[a] == 0 && num / s[a] < out;
        o.push_back(num >= 0 ? num / s[a] : -1);
      }
      if (!ok) continue;
      auto it = ids.emplace(o, static_cast<int32_t>(r.outs.size())).first;
      if (it->second == static_cast<int32_t>(r.outs.size())) r.outs.push_back(o);
      r.pairs[t].emplace_back(static_cast<int32_t>(j), it->second);
    }
  }
  return r;
}

TEST(SparseIndicePairsKernel, StridedRulebookMatchesTheDefinition) {
  const std::vector<int32_t> shape{13, 11, 9}, k{3, 2, 3}, s{2, 2, 1}, p{1, 0, 1};
  Tensor idx = sites(400, shape, 3, 1);
  const Naive want = naive_rulebook(idx.values<int32_t>(), 400, shape, k, s, p);
  for (bool threaded : {false, true}) {
    auto out = run("sparse_indice_pairs", {idx},
                   {{"spatial_shape", std::vector<int64_t>{13, 11, 9}}, {"kernel_size", std::vector<int64_t>{3, 2, 3}},
                    {"stride", std::vector<int64_t>{2, 2, 1}}, {"padding", std::vector<int64_t>{1, 0, 1}}},
                   threaded);
    const std::vector<int32_t> oi = out[0].values<int32_t>(), pairs = out[1].values<int32_t>(),
                               num = out[2].values<int32_t>();
    ASSERT_EQ(oi.size(), want.outs.size() * 4);
    for (size_t r = 0; r < want.outs.size(); ++r) EXPECT_EQ(Site(oi.begin() + r * 4, oi.begin() + r * 4 + 4), want.outs[r]);
    ASSERT_EQ(num.size(), want.pairs.size());
    for (size_t t = 0; t < want.pairs.size(); ++t) {
      ASSERT_EQ(num[t], static_cast<int32_t>(want.pairs[t].size()));
      for (size_t i = 0; i < want.pairs[t].size(); ++i) {
        EXPECT_EQ(pairs[(t * 2) * 400 + i], want.pairs[t][i].first);
        EXPECT_EQ(pairs[(t * 2 + 1) * 400 + i], want.pairs[t][i].second);
      }
      for (size_t i = want.pairs[t].size(); i < 400; ++i) EXPECT_EQ(pairs[(t * 2) * 400 + i], -1);
    }
  }
}

TEST(SparseIndicePairsKernel, DuplicateSitesAreAnError) {
  Tensor idx = Tensor::of<int32_t>({3, 3}, {0, 1, 2, 0, 3, 3, 0, 1, 2});
  EXPECT_THROW(run("sparse_indice_pairs", {idx},
                   {{"spatial_shape", std::vector<int64_t>{5, 5}}, {"kernel_size", std::vector<int64_t>{3, 3}},
                    {"subm", true}}),
               Error);
}

// The convolution and its gradients over a submanifold rulebook, against sums over every pair.
TEST(SparseIndiceConvKernel, ForwardAndBackwardMatchSumsOverThePairs) {
  const int64_t n = 700, cin = 5, cout = 7;
  Tensor idx = sites(n, {12, 12, 12}, 2, 2);
  auto book = run("sparse_indice_pairs", {idx},
                  {{"spatial_shape", std::vector<int64_t>{12, 12, 12}}, {"kernel_size", std::vector<int64_t>{3, 3, 3}},
                   {"subm", true}});
  Tensor x = Tensor::random<float>({n, cin}, 3), w = Tensor::random<float>({3, 3, 3, cin, cout}, 4);
  Tensor g = Tensor::random<float>({n, cout}, 5);
  const std::vector<int32_t> pairs = book[1].values<int32_t>(), num = book[2].values<int32_t>();
  const std::vector<float> xv = x.values<float>(), wv = w.values<float>(), gv = g.values<float>();
  std::vector<double> y(n * cout, 0), gx(n * cin, 0), gw(27 * cin * cout, 0);
  for (int t = 0; t < 27; ++t)
    for (int i = 0; i < num[t]; ++i) {
      const int a = pairs[t * 2 * n + i], b = pairs[(t * 2 + 1) * n + i];
      for (int c = 0; c < cin; ++c)
        for (int o = 0; o < cout; ++o) {
          const double wt = wv[(t * cin + c) * cout + o];
          y[b * cout + o] += xv[a * cin + c] * wt;
          gx[a * cin + c] += gv[b * cout + o] * wt;
          gw[(t * cin + c) * cout + o] += double{xv[a * cin + c]} * gv[b * cout + o];
        }
    }
  for (bool threaded : {false, true}) {
    const std::vector<float> got = run("sparse_indice_conv", {x, w, book[1], book[2], book[0]}, {}, threaded)[0].values<float>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], y[i], 1e-4) << i;
    auto grads = run("sparse_indice_conv_backward", {g, x, w, book[1], book[2]}, {}, threaded);
    const std::vector<float> gxv = grads[0].values<float>(), gwv = grads[1].values<float>();
    for (size_t i = 0; i < gxv.size(); ++i) EXPECT_NEAR(gxv[i], gx[i], 1e-4) << i;
    for (size_t i = 0; i < gwv.size(); ++i) EXPECT_NEAR(gwv[i], gw[i], 1e-3) << i;
  }
}

TEST(SparseIndiceMaxpoolKernel, TakesTheMaximumOfZeroAndTheInputs) {
  const int64_t n = 500, c = 3;
  Tensor idx = sites(n, {10, 10, 10}, 1, 6);
  auto book = run("sparse_indice_pairs", {idx},
                  {{"spatial_shape", std::vector<int64_t>{10, 10, 10}}, {"kernel_size", std::vector<int64_t>{2, 2, 2}},
                   {"stride", std::vector<int64_t>{2, 2, 2}}});
  Tensor x = Tensor::random<float>({n, c}, 7);
  const int64_t m = book[0].view.dim(0);
  const std::vector<int32_t> pairs = book[1].values<int32_t>(), num = book[2].values<int32_t>();
  const std::vector<float> xv = x.values<float>();
  std::vector<float> want(m * c, 0.0f);
  for (int t = 0; t < 8; ++t)
    for (int i = 0; i < num[t]; ++i)
      for (int j = 0; j < c; ++j) {
        float& d = want[pairs[(t * 2 + 1) * n + i] * c + j];
        d = std::max(d, xv[pairs[t * 2 * n + i] * c + j]);
      }
  for (bool threaded : {false, true})
    EXPECT_EQ(run("sparse_indice_maxpool", {x, book[1], book[2], book[0]}, {}, threaded)[0].values<float>(), want);
}

// Every variant this CPU runs (the vectorised loops take whole vectors of output channels, 4 or 3
// pairs at a time) against a plain loop: channel counts on and off the vector width, pair counts
// off the block, gathered and in-place rows.
TEST(SparseIndiceConvKernel, EveryVariantMatchesAPlainLoop) {
  namespace impl = opbridge::sparse_conv_impl;
  std::vector<impl::Variant> variants{impl::baseline_variant()};
  if (cpu_has_avx2()) variants.push_back(impl::avx2_variant());
  if (cpu_has_avx512()) variants.push_back(impl::avx512_variant());
  std::mt19937 gen(9);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const impl::Variant& v : variants) {
    if (!v.isa) continue;
    for (int64_t cin : {3, 16}) {
      for (int64_t cout : {7, 8, 16, 24, 48, 64, 80}) {
        for (int64_t n : {0, 1, 5, 131}) {
          for (bool gathered : {false, true}) {
            const int64_t rows = n + 3;
            std::vector<float> x(rows * cin), w(cin * cout), out(rows * cout), want;
            for (float& f : x) f = u(gen);
            for (float& f : w) f = u(gen);
            for (float& f : out) f = u(gen);
            std::vector<int32_t> from(n), to(n);
            for (int64_t i = 0; i < n; ++i) from[i] = static_cast<int32_t>(gen() % rows), to[i] = static_cast<int32_t>(rows - 1 - i);
            want = out;
            for (int64_t i = 0; i < n; ++i)
              for (int64_t o = 0; o < cout; ++o) {
                double acc = 0;
                for (int64_t c = 0; c < cin; ++c) acc += double{x[(gathered ? from[i] : i) * cin + c]} * w[c * cout + o];
                want[(gathered ? to[i] : i) * cout + o] += static_cast<float>(acc);
              }
            v.f32.gather_gemm_scatter(x.data(), gathered ? from.data() : nullptr, w.data(), out.data(),
                                      gathered ? to.data() : nullptr, n, cin, cout);
            for (size_t i = 0; i < out.size(); ++i)
              ASSERT_NEAR(out[i], want[i], 1e-4) << v.isa << " cin " << cin << " cout " << cout << " n " << n;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace opbridge::testing
