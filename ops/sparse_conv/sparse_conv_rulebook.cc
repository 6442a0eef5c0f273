// sparse_indice_pairs: the rulebook of a sparse convolution (mmcv's get_indice_pairs, its CPU
// kernel's order). Sites are keyed by their linear index b * prod(shape) + row-major position in
// int64 and found by radix-sorting keys, so no grid of prod(spatial_shape) entries is allocated.
#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "sparse_conv_kernel.h"

namespace opbridge {
namespace {

constexpr int kMaxDims = 4;
constexpr int64_t kMaxKernelVolume = 4096;  // mmcv's bound

struct Geometry {
  int dims = 0;
  int64_t in[kMaxDims], out[kMaxDims], k[kMaxDims], s[kMaxDims], p[kMaxDims], d[kMaxDims];
  int64_t axis_step[kMaxDims];  // row-major step of each output axis in a site's key
  int64_t in_step[kMaxDims];    // the same for the input grid (duplicate detection)
  int64_t out_volume = 1, in_volume = 1, kernel_volume = 1;
  bool subm = false, transposed = false;
};

// An empty list means `fill` on every axis; otherwise one value per axis.
std::vector<int64_t> per_axis(const std::vector<int64_t>& v, int dims, int64_t fill, const char* name) {
  if (v.empty()) return std::vector<int64_t>(static_cast<size_t>(dims), fill);
  OB_CHECK(static_cast<int>(v.size()) == dims, name, " must have one value per spatial axis (", dims,
           ", from indices.shape[1] - 1), got ", v.size());
  return v;
}

int64_t checked_product(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  OB_CHECK(!__builtin_mul_overflow(a, b, &r), what, " does not fit in int64");
  return r;
}

Geometry make_geometry(int dims, const std::vector<int64_t>& spatial_shape, const std::vector<int64_t>& kernel_size,
                       const std::vector<int64_t>& stride_attr, const std::vector<int64_t>& padding_attr,
                       const std::vector<int64_t>& dilation_attr, const std::vector<int64_t>& output_padding_attr,
                       bool subm, bool transposed) {
  OB_CHECK(dims >= 1 && dims <= kMaxDims, "indices must be (N, D + 1) with 1 <= D <= ", kMaxDims, ", got D = ", dims);
  OB_CHECK(!(subm && transposed), "subm and transposed cannot both be true");
  const std::vector<int64_t> shape = per_axis(spatial_shape, dims, -1, "spatial_shape");
  OB_CHECK(!spatial_shape.empty(), "spatial_shape is required");
  const std::vector<int64_t> ks = per_axis(kernel_size, dims, -1, "kernel_size");
  OB_CHECK(!kernel_size.empty(), "kernel_size is required");
  const std::vector<int64_t> stride = per_axis(stride_attr, dims, 1, "stride");
  const std::vector<int64_t> padding = per_axis(padding_attr, dims, 0, "padding");
  const std::vector<int64_t> dilation = per_axis(dilation_attr, dims, 1, "dilation");
  const std::vector<int64_t> output_padding = per_axis(output_padding_attr, dims, 0, "output_padding");
  Geometry g;
  g.dims = dims;
  g.subm = subm;
  g.transposed = transposed;
  for (int a = 0; a < dims; ++a) {
    OB_CHECK(shape[a] >= 1, "spatial_shape[", a, "] must be >= 1, got ", shape[a]);
    OB_CHECK(ks[a] >= 1, "kernel_size[", a, "] must be >= 1, got ", ks[a]);
    OB_CHECK(stride[a] >= 1, "stride[", a, "] must be >= 1, got ", stride[a]);
    OB_CHECK(dilation[a] >= 1, "dilation[", a, "] must be >= 1, got ", dilation[a]);
    OB_CHECK(padding[a] >= 0, "padding[", a, "] must be >= 0, got ", padding[a]);
    OB_CHECK(output_padding[a] >= 0, "output_padding[", a, "] must be >= 0, got ", output_padding[a]);
    OB_CHECK(shape[a] <= INT32_MAX && ks[a] <= kMaxKernelVolume && stride[a] <= INT32_MAX &&
                 dilation[a] <= INT32_MAX && padding[a] <= INT32_MAX && output_padding[a] <= INT32_MAX,
             "spatial_shape, kernel_size, stride, padding, dilation and output_padding must fit in int32 (axis ", a,
             ")");
    OB_CHECK(subm || stride[a] == 1 || dilation[a] == 1, "stride and dilation cannot both be > 1 on axis ", a,
             " (as in mmcv), got ", stride[a], " and ", dilation[a]);
    g.in[a] = shape[a];
    g.k[a] = ks[a];
    g.d[a] = dilation[a];
    // A submanifold convolution keeps its sites: stride 1, padding kernel_size // 2 (as mmcv's kernel
    // sets them, whatever the module says).
    g.s[a] = subm ? 1 : stride[a];
    g.p[a] = subm ? ks[a] / 2 : padding[a];
    if (subm) {
      g.out[a] = shape[a];
    } else if (transposed) {  // mmcv's deconv size: dilation does not enter it
      g.out[a] = (shape[a] - 1) * stride[a] - 2 * padding[a] + ks[a] + output_padding[a];
    } else {  // floor division, as Python's //
      const int64_t num = shape[a] + 2 * padding[a] - dilation[a] * (ks[a] - 1) - 1;
      g.out[a] = (num >= 0 ? num / stride[a] : -((-num + stride[a] - 1) / stride[a])) + 1;
    }
    OB_CHECK(g.out[a] >= 1, "the output spatial shape would be empty on axis ", a, " (size ", g.out[a],
             " from spatial_shape ", shape[a], ", kernel_size ", ks[a], ", stride ", stride[a], ", padding ",
             padding[a], ", dilation ", dilation[a], ")");
    g.kernel_volume = checked_product(g.kernel_volume, ks[a], "the kernel volume");
    OB_CHECK(g.kernel_volume <= kMaxKernelVolume, "the kernel volume (prod(kernel_size)) must be at most ",
             kMaxKernelVolume, ", got ", g.kernel_volume, " or more");
  }
  for (int a = dims - 1; a >= 0; --a) {
    g.axis_step[a] = g.out_volume;
    g.in_step[a] = g.in_volume;
    g.in_volume = checked_product(g.in_volume, g.in[a], "the input grid's size (prod(spatial_shape))");
    g.out_volume = checked_product(g.out_volume, g.out[a], "the output grid's size (prod of its spatial shape)");
  }
  return g;
}

// A stable LSD radix sort of `items` by key_of(item), a value in [0, max_key]: a few linear passes
// over memory where a comparison sort's random access and branches cost more.
template <typename Item, typename KeyOf>
void radix_sort(std::vector<Item>& items, int64_t max_key, KeyOf key_of) {
  constexpr int kBits = 11;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  std::vector<Item> sorted(items.size());
  for (int shift = 0; shift < 64 && (static_cast<uint64_t>(max_key) >> shift) != 0; shift += kBits) {
    std::vector<size_t> start((size_t{1} << kBits) + 1, 0);
    for (const Item& it : items) ++start[((static_cast<uint64_t>(key_of(it)) >> shift) & kMask) + 1];
    for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
    for (const Item& it : items) sorted[start[(static_cast<uint64_t>(key_of(it)) >> shift) & kMask]++] = it;
    items.swap(sorted);
  }
}

// The output sites one input site reaches, by ascending kernel offset (row-major over the kernel's
// axes): offsets[i] and keys[i], i < the count returned. Buffers hold kernel_volume entries.
int64_t reached_sites(const Geometry& g, const int32_t* site, int64_t base, int32_t* offsets, int64_t* keys) {
  int64_t n = 1;
  offsets[0] = 0;
  keys[0] = base;
  for (int a = 0; a < g.dims; ++a) {
    int64_t contrib[kMaxKernelVolume];
    const int64_t pos = site[a];
    for (int64_t t = 0; t < g.k[a]; ++t) {
      int64_t val = -1;
      if (g.transposed) {
        val = pos * g.s[a] - g.p[a] + t * g.d[a];
      } else {
        const int64_t num = pos + g.p[a] - t * g.d[a];
        val = num >= 0 && num % g.s[a] == 0 ? num / g.s[a] : -1;
      }
      contrib[t] = val >= 0 && val < g.out[a] ? val * g.axis_step[a] : -1;
    }
    // Expand in place from the back so that row-major order is kept.
    int64_t m = 0;
    for (int64_t t = 0; t < g.k[a]; ++t) m += contrib[t] >= 0;
    const int64_t total = n * m;
    for (int64_t e = n - 1; e >= 0; --e) {
      const int32_t off = offsets[e];
      const int64_t key = keys[e];
      int64_t at = e * m + m;
      for (int64_t t = g.k[a] - 1; t >= 0; --t) {
        if (contrib[t] < 0) continue;
        --at;
        offsets[at] = static_cast<int32_t>(off * g.k[a] + t);
        keys[at] = key + contrib[t];
      }
    }
    n = total;
    if (n == 0) return 0;
  }
  return n;
}

// Checks every input site and returns the batch bound (batch_size, or the largest index + 1).
int64_t check_sites(const int32_t* idx, int64_t n, const Geometry& g, int64_t batch_size) {
  const int64_t w = g.dims + 1;
  int64_t bound = batch_size > 0 ? batch_size : 1;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t* row = idx + j * w;
    OB_CHECK(row[0] >= 0, "indices[", j, ", 0] = ", row[0], ": a batch index must be >= 0");
    OB_CHECK(batch_size <= 0 || row[0] < batch_size, "indices[", j, ", 0] = ", row[0], " is outside batch_size ",
             batch_size);
    bound = std::max<int64_t>(bound, int64_t{row[0]} + 1);
    for (int a = 0; a < g.dims; ++a)
      OB_CHECK(row[a + 1] >= 0 && row[a + 1] < g.in[a], "indices[", j, ", ", a + 1, "] = ", row[a + 1],
               " is outside spatial_shape[", a, "] = ", g.in[a]);
  }
  return bound;
}

int64_t input_key(const Geometry& g, const int32_t* row) {
  int64_t key = int64_t{row[0]} * g.in_volume;
  for (int a = 0; a < g.dims; ++a) key += int64_t{row[a + 1]} * g.in_step[a];
  return key;
}

// The input sites as (key, row) by ascending key, then a sentinel; two rows at one site are an error
// naming them.
std::vector<std::pair<int64_t, int32_t>> sorted_sites(const int32_t* idx, int64_t n, const Geometry& g,
                                                      int64_t check_batches) {
  std::vector<std::pair<int64_t, int32_t>> sites(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) sites[j] = {input_key(g, idx + j * (g.dims + 1)), static_cast<int32_t>(j)};
  radix_sort(sites, g.in_volume * check_batches, [](const std::pair<int64_t, int32_t>& p) { return p.first; });
  for (int64_t i = 1; i < n; ++i)
    OB_CHECK(sites[i].first != sites[i - 1].first, "indices rows ", sites[i - 1].second, " and ", sites[i].second,
             " are the same site (duplicate indices)");
  sites.push_back({INT64_MAX, -1});  // a sentinel past every key (keys are below INT64_MAX: checked_product)
  return sites;
}

// A submanifold rulebook: at offset t, input row j pairs with the site at its position + padding -
// t * dilation, when that is in the grid and active. A fixed offset shifts every key by one amount,
// so each offset is one merge of the sorted keys with themselves shifted. Row 1 of each offset
// first holds, per input row, the row it reaches there (or -1); each offset's list is then
// compacted in input order, as mmcv lists it.
void submanifold_pairs(KernelContext& ctx, const Geometry& g, const int32_t* idx, int64_t n,
                       const std::vector<std::pair<int64_t, int32_t>>& sites, int32_t* pairs, int32_t* num) {
  const int64_t w = g.dims + 1;
  ctx.parallel_for(g.kernel_volume, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t shift[kMaxDims], delta = 0, rest = t;
      for (int a = g.dims - 1; a >= 0; --a) {
        shift[a] = g.p[a] - (rest % g.k[a]) * g.d[a];
        rest /= g.k[a];
        delta += shift[a] * g.axis_step[a];
      }
      int32_t* in = pairs + t * 2 * n;
      int32_t* out = in + n;
      int64_t q = 0;
      // Branch-free where the data decides: which sites stay inside and which targets are active
      // follow no pattern. The sorted keys end in a sentinel above every target.
      for (int64_t i = 0; i < n; ++i) {
        const int32_t j = sites[i].second;
        const int32_t* site = idx + int64_t{j} * w + 1;
        bool inside = true;
        for (int a = 0; a < g.dims; ++a) {
          const int64_t v = site[a] + shift[a];
          inside &= (v >= 0) & (v < g.in[a]);
        }
        const int64_t target = sites[i].first + delta;  // ascending with i: q only moves forward
        while (sites[q].first < target) ++q;
        out[j] = inside && sites[q].first == target ? sites[q].second : -1;
      }
      // Compact in input order: row c takes row j's pair when it has one (c <= j, read first).
      int32_t c = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int32_t o = out[j];
        in[c] = static_cast<int32_t>(j);
        out[c] = o;
        c += o >= 0;
      }
      std::fill(in + c, in + n, -1);
      std::fill(out + c, out + n, -1);
      num[t] = c;
    }
  });
}

}  // namespace

void sparse_indice_pairs_kernel(KernelContext& ctx, const TensorView& indices, const std::vector<int64_t>& spatial_shape,
                                const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride,
                                const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
                                const std::vector<int64_t>& output_padding, int64_t batch_size, bool subm,
                                bool transposed, TensorView& out_indices, TensorView& indice_pairs,
                                TensorView& indice_pair_num) {
  const int dims = static_cast<int>(indices.dim(1)) - 1;
  const Geometry g =
      make_geometry(dims, spatial_shape, kernel_size, stride, padding, dilation, output_padding, subm, transposed);
  const int64_t n = indices.dim(0), w = dims + 1, kv = g.kernel_volume;
  OB_CHECK(n <= INT32_MAX, "at most 2^31 - 1 sites (rows of indices), got ", n);
  OB_CHECK(batch_size == -1 || batch_size >= 1, "batch_size must be >= 1 (or -1: any), got ", batch_size);
  const int32_t* idx = indices.data_as<int32_t>();
  const int64_t batches = check_sites(idx, n, g, batch_size);
  // Keys, and keys shifted by a kernel offset, stay below (batches + 2) grids.
  checked_product(batches + 2, std::max(g.out_volume, g.in_volume), "the batch times the grid's size");

  int32_t* pairs = ctx.allocate_output(indice_pairs, {kv, 2, n}).data_as<int32_t>();
  int32_t* num = ctx.allocate_output(indice_pair_num, {kv}).data_as<int32_t>();
  std::fill(num, num + kv, 0);
  const std::vector<std::pair<int64_t, int32_t>> sites = sorted_sites(idx, n, g, batches);

  if (subm) {
    submanifold_pairs(ctx, g, idx, n, sites, pairs, num);
    int32_t* oi = ctx.allocate_output(out_indices, {n, w}).data_as<int32_t>();
    if (n) std::memcpy(oi, idx, sizeof(int32_t) * static_cast<size_t>(n * w));
    return;
  }

  ctx.parallel_for(kv * 2 * n, 1 << 16, [&](int64_t b, int64_t e) { std::fill(pairs + b, pairs + e, -1); });
  // Output rows are numbered in order of first appearance: input rows in order, and for each the
  // sites it reaches from the highest position down (mmcv's CPU order): by ascending kernel offset
  // for a convolution, descending for a transposed one. The reached sites are listed in that order,
  // sorted by key (stably: each key's first entry is its first appearance), and the keys then
  // numbered by their first appearance.
  struct Reach {
    int64_t key;
    int32_t row, offset;
  };
  std::vector<Reach> reach;
  reach.reserve(static_cast<size_t>(n) * 8);
  {
    std::vector<int32_t> offsets(static_cast<size_t>(kv));
    std::vector<int64_t> keys(static_cast<size_t>(kv));
    for (int64_t j = 0; j < n; ++j) {
      const int32_t* row = idx + j * w;
      const int64_t m = reached_sites(g, row + 1, int64_t{row[0]} * g.out_volume, offsets.data(), keys.data());
      for (int64_t q = 0; q < m; ++q) {
        const int64_t i = transposed ? m - 1 - q : q;
        reach.push_back({keys[i], static_cast<int32_t>(j), offsets[i]});
      }
    }
  }
  const int64_t total = static_cast<int64_t>(reach.size());
  OB_CHECK(total < INT32_MAX, "more than 2^31 - 1 pairs");
  std::vector<std::pair<int64_t, int32_t>> by_key(static_cast<size_t>(total));  // (key, entry)
  for (int64_t e = 0; e < total; ++e) by_key[e] = {reach[e].key, static_cast<int32_t>(e)};
  radix_sort(by_key, g.out_volume * batches, [](const std::pair<int64_t, int32_t>& p) { return p.first; });
  std::vector<std::pair<int32_t, int32_t>> firsts;  // (first entry, start in by_key) per site
  for (int64_t e = 0; e < total; ++e)
    if (e == 0 || by_key[e].first != by_key[e - 1].first) firsts.push_back({by_key[e].second, static_cast<int32_t>(e)});
  radix_sort(firsts, total, [](const std::pair<int32_t, int32_t>& p) { return p.first; });
  std::vector<int32_t> id_of(static_cast<size_t>(total));
  std::vector<int64_t> out_keys(firsts.size());
  for (size_t id = 0; id < firsts.size(); ++id) {
    const int64_t key = by_key[firsts[id].second].first;
    out_keys[id] = key;
    for (int64_t e = firsts[id].second; e < total && by_key[e].first == key; ++e)
      id_of[by_key[e].second] = static_cast<int32_t>(id);
  }
  for (int64_t e = 0; e < total; ++e) {
    const int64_t k = reach[e].offset;
    pairs[k * 2 * n + num[k]] = reach[e].row;
    pairs[(k * 2 + 1) * n + num[k]++] = id_of[e];
  }
  const int64_t m = static_cast<int64_t>(out_keys.size());
  int32_t* oi = ctx.allocate_output(out_indices, {m, w}).data_as<int32_t>();
  ctx.parallel_for(m, 1024, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t key = out_keys[r];
      int32_t* row = oi + r * w;
      row[0] = static_cast<int32_t>(key / g.out_volume);
      key %= g.out_volume;
      for (int a = 0; a < dims; ++a) {
        row[a + 1] = static_cast<int32_t>(key / g.axis_step[a]);
        key %= g.axis_step[a];
      }
    }
  });
}

}  // namespace opbridge
