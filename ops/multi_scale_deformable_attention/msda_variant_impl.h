// The bodies of multi_scale_deformable_attention's loops, compiled once per instruction set:
// included by exactly one source file per variant (msda_variants.cc for the baseline and float64,
// msda_avx2.cc, msda_avx512.cc), each built with its own flags. Everything here has internal
// linkage, so the linker never merges a wide-ISA copy of a function with the baseline one; no
// std:: template is instantiated for the same reason (at -O0 those are emitted out of line).
//
// A sample at (x, y) in [0, 1]^2 of a level of h x w positions is bilinear at pixel coordinates
// (x * w - 0.5, y * h - 0.5) (grid_sample with align_corners=False), with zero outside the level:
// a corner outside it contributes nothing and gets no gradient.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "msda_variants.h"

namespace opbridge::msda_impl {
namespace {

template <typename T>
struct Sample {
  int64_t x0, y0;       // the top-left corner, in pixels of the level
  int64_t position;     // its position along S (the other corners: + 1, + w, + w + 1)
  T lx, ly, hx, hy;
  T weight[4];          // bilinear weights of (y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)
  bool interior;        // all four corners inside the level (the common case)
};

// The sample at pixel coordinates (x, y) in a level of h x w positions starting at `start`; false
// when it lies wholly outside (x <= -1 or >= w, alike for y, or NaN): nothing is sampled.
template <typename T>
inline bool sample_at_pixel(T x, T y, int64_t h, int64_t w, int64_t start, Sample<T>& s) {
  if (!(x > T(-1) && y > T(-1) && x < static_cast<T>(w) && y < static_cast<T>(h))) return false;
  // floor() by truncation (x, y > -1 here): a libm call on the baseline ISA otherwise.
  s.x0 = static_cast<int64_t>(x), s.y0 = static_cast<int64_t>(y);
  s.x0 -= static_cast<T>(s.x0) > x;
  s.y0 -= static_cast<T>(s.y0) > y;
  s.lx = x - static_cast<T>(s.x0), s.ly = y - static_cast<T>(s.y0);
  s.hx = T(1) - s.lx, s.hy = T(1) - s.ly;
  s.weight[0] = s.hy * s.hx, s.weight[1] = s.hy * s.lx, s.weight[2] = s.ly * s.hx, s.weight[3] = s.ly * s.lx;
  s.position = start + s.y0 * w + s.x0;
  // 0 <= x0 < w - 1 and 0 <= y0 < h - 1, as unsigned comparisons (w, h >= 1 here).
  s.interior = static_cast<uint64_t>(s.x0) < static_cast<uint64_t>(w - 1) &&
               static_cast<uint64_t>(s.y0) < static_cast<uint64_t>(h - 1);
  return true;
}

// The sample at normalised (x, y): pixel coordinates x * w - 0.5 and y * h - 0.5 (the forward's).
template <typename T>
inline bool sample_at(T x_norm, T y_norm, int64_t h, int64_t w, int64_t start, Sample<T>& s) {
  return sample_at_pixel(x_norm * static_cast<T>(w) - T(0.5), y_norm * static_cast<T>(h) - T(0.5), h, w, start, s);
}

// A normalised coordinate in pixels of an axis of `size` positions as grid_sample (align_corners=
// False) computes it from the grid 2 * norm - 1: fma(grid + 1, size / 2, -0.5), rounded once. The
// value is x * w - 0.5 either way, but its rounding decides floor() where it falls within an ulp of
// a whole pixel (a pixel centre such as 1.5 / 5), and with it the side the location gradient is
// taken from: the backward follows grid_sample's, the forward (continuous there) keeps its own.
// float: the double product of two floats is exact, and so is the subtraction where the result is
// near a whole number, so one rounding to float gives the fused result on every instruction set.
inline float grid_pixel(float norm, int64_t size) {
  const float g1 = (2.0f * norm - 1.0f) + 1.0f, half = static_cast<float>(size) / 2;
  return static_cast<float>(static_cast<double>(g1) * static_cast<double>(half) - 0.5);
}
inline double grid_pixel(double norm, int64_t size) {
  const double g1 = (2.0 * norm - 1.0) + 1.0, half = static_cast<double>(size) / 2;
  return std::fma(g1, half, -0.5);
}

// Corner c (0..3, as Sample::weight) of a sample: whether it lies inside the level, and its position.
template <typename T>
inline bool corner_inside(const Sample<T>& s, int c, int64_t h, int64_t w) {
  const int64_t yy = s.y0 + (c >> 1), xx = s.x0 + (c & 1);
  return yy >= 0 && yy < h && xx >= 0 && xx < w;
}
template <typename T>
inline int64_t corner_position(const Sample<T>& s, int c, int64_t w) {
  return s.position + (c >> 1) * w + (c & 1);
}

// Calls f(corner, its bilinear weight, its position along S) for each corner of the sample inside
// its level.
template <typename T, typename F>
inline void each_corner(const Sample<T>& s, int64_t h, int64_t w, F&& f) {
  if (s.interior) {
    f(0, s.weight[0], s.position), f(1, s.weight[1], s.position + 1), f(2, s.weight[2], s.position + w),
        f(3, s.weight[3], s.position + w + 1);
    return;
  }
  for (int c = 0; c < 4; ++c)
    if (corner_inside(s, c, h, w)) f(c, s.weight[c], corner_position(s, c, w));
}

// acc[0, d) += c * v[0, d), for the run-time channel count d.
template <typename T>
inline void axpy(T* acc, T c, const T* v, int64_t d) {
  for (int64_t i = 0; i < d; ++i) acc[i] += c * v[i];
}

template <typename T>
inline T dot(const T* a, const T* b, int64_t d) {
  T sum = T(0);
  for (int64_t i = 0; i < d; ++i) sum += a[i] * b[i];
  return sum;
}

// A row of kD channels held in vector registers (GCC/Clang vector extensions, as wide as the ISA
// this file is built for), so a query's accumulator stays in registers across its samples
// instead of going through memory at every corner.
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX2__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif

template <typename T, int kD>
struct Row {
  typedef T Vec __attribute__((vector_size(kVectorBytes)));
  static constexpr int kLanes = kVectorBytes / sizeof(T), kVecs = kD / kLanes;
  static_assert(kD % kLanes == 0, "a fixed channel count fills whole vectors");
  Vec v[kVecs];

  static Vec load(const T* p) {
    Vec x;
    __builtin_memcpy(&x, p, sizeof(x));  // an unaligned load
    return x;
  }
  void zero() {
    for (int j = 0; j < kVecs; ++j) v[j] = Vec{} ;
  }
  void add(T c, const T* p) {
    for (int j = 0; j < kVecs; ++j) v[j] += c * load(p + j * kLanes);
  }
  void store(T* p) const { __builtin_memcpy(p, v, sizeof(v)); }
  void load_from(const T* p) { __builtin_memcpy(v, p, sizeof(v)); }
  // This row times `other`, its vectors summed: the sum over channels is 0 + t[0] + t[1] + ... in
  // lane order (row_sums).
  Vec lane_products(const Row& other) const {
    Vec t = v[0] * other.v[0];
    for (int j = 1; j < kVecs; ++j) t += v[j] * other.v[j];
    return t;
  }
};

// The integer vector of T's width and lane count, for __builtin_shuffle's masks.
template <typename T> struct LaneIndex;
template <> struct LaneIndex<float> { typedef int32_t Vec __attribute__((vector_size(kVectorBytes))); };
template <> struct LaneIndex<double> { typedef int64_t Vec __attribute__((vector_size(kVectorBytes))); };

// row_sums' shuffle masks for N lanes, a pair per block side half = N/2, N/4, .., 1 (stage 0, 1, ..):
// lane `lane` of lo takes (lane & half) ? lane - half of the second vector : lane of the first, of hi
// (lane & half) ? lane of the second : lane + half of the first; and the masks that interleave two
// vectors (backward_samples' (x, y) gradients). Constants: built in row_sums' loop, the compiler
// made them lane by lane on every call (~12 instructions per sample at 16 lanes).
template <typename I, int N>
struct ShuffleMasks {
  static constexpr int kStages = N == 16 ? 4 : N == 8 ? 3 : N == 4 ? 2 : 1;
  static_assert(N >> kStages == 1, "N is a power of two up to 16");
  I lo[kStages][N], hi[kStages][N];
  I interleave[2][N];  // (a[0], b[0], a[1], b[1], ..) of the first half of a and b, then of the second

  static constexpr ShuffleMasks make() {
    ShuffleMasks m{};
    for (int lane = 0; lane < N; ++lane)
      for (int part = 0; part < 2; ++part)
        m.interleave[part][lane] = static_cast<I>((lane & 1) * N + part * N / 2 + lane / 2);
    for (int stage = 0, half = N / 2; stage < kStages; ++stage, half /= 2)
      for (int lane = 0; lane < N; ++lane) {
        m.lo[stage][lane] = static_cast<I>((lane & half) ? N + lane - half : lane);
        m.hi[stage][lane] = static_cast<I>((lane & half) ? N + lane : lane + half);
      }
    return m;
  }
};
template <typename I, int N>
alignas(64) constexpr ShuffleMasks<I, N> kShuffleMasks = ShuffleMasks<I, N>::make();

// s[i] = 0 + m[i][0] + m[i][1] + ... + m[i][N - 1], in that order, for the N rows of m: a
// sample's sum over lanes, the same sums as one lane after another, done for N samples at once on
// the transposed rows (a row's horizontal sum is a chain of N dependent additions).
template <typename T, typename Vec, int N>
inline Vec row_sums(Vec (&m)[N]) {
  typedef typename LaneIndex<T>::Vec Mask;
  typedef typename std::remove_reference<decltype(Mask{}[0])>::type I;
  // Transposed by swapping the off-diagonal blocks of side `half`, halving it down to 1.
#pragma GCC unroll 8
  for (int stage = 0, half = N / 2; half >= 1; ++stage, half /= 2) {
    Mask lo, hi;  // lanes of (m[i], m[i + half]): 0 .. N-1 the first, N .. 2N-1 the second
    __builtin_memcpy(&lo, kShuffleMasks<I, N>.lo[stage], sizeof(Mask));
    __builtin_memcpy(&hi, kShuffleMasks<I, N>.hi[stage], sizeof(Mask));
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i)
      if (!(i & half)) {
        const Vec a = m[i], b = m[i + half];
        m[i] = __builtin_shuffle(a, b, lo), m[i + half] = __builtin_shuffle(a, b, hi);
      }
  }
  Vec s = Vec{};
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) s += m[i];
  return s;
}

// Keeps a loaded vector in a register: read by three multiplications, it was otherwise loaded again
// by each (the compiler folds a load into each one's operand; one load is 1.07x faster in the
// AVX-512 backward).
template <typename V>
inline void in_register(V& x) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+v"(x));
#else
  (void)x;
#endif
}

template <int kD>
struct Channels {
  static constexpr int value = kD;
};

// Every level's sizes by sample (k = l * points + p), for SampleTable: kMax samples at most.
template <typename T>
struct LevelBySample {
  typedef typename LaneIndex<T>::Vec IVec;
  typedef typename std::remove_reference<decltype(IVec{}[0])>::type I;
  static constexpr int kMax = 64;
  alignas(64) T w[kMax], h[kMax];
  alignas(64) I wi[kMax], hi[kMax], start[kMax];

  // False where the table does not apply: more samples than kMax, or positions past I's range.
  bool set(const Geometry& g) {
    if (g.levels * g.points > kMax || g.spatial > (sizeof(I) == 4 ? int64_t{INT32_MAX} : INT64_MAX)) return false;
    for (int k = 0; k < kMax; ++k) {
      const int64_t l = k < g.levels * g.points ? k / g.points : 0;
      w[k] = static_cast<T>(g.level_w[l]), h[k] = static_cast<T>(g.level_h[l]);
      wi[k] = static_cast<I>(g.level_w[l]), hi[k] = static_cast<I>(g.level_h[l]), start[k] = static_cast<I>(g.level_start[l]);
    }
    return true;
  }
};

// One (b, q, h)'s samples as sample_at (kGrid: sample_at_pixel at grid_pixel's coordinates, the
// backward's) computes them, the same operations a vector of samples at a time: each one's state (0:
// nothing sampled, 1: some corners inside, 2: all four), top-left corner, position along S and its
// four corners' factors (attention weight times bilinear weight); kGrid: the bilinear weights and
// their derivatives too.
template <typename T, bool kGrid = false>
struct SampleTable {
  typedef T Vec __attribute__((vector_size(kVectorBytes)));
  typedef typename LevelBySample<T>::IVec IVec;
  typedef typename LevelBySample<T>::I I;
  static constexpr int N = kVectorBytes / sizeof(T), kMax = LevelBySample<T>::kMax;
  alignas(64) T factor[4][kMax];
  alignas(64) I x0[kMax], y0[kMax], position[kMax], state[kMax];
  // kGrid only: the bilinear weights and their derivatives in pixel x (-hy, hy, -ly, ly) and y (-hx, -lx, hx,
  // lx), corner by corner, read by the backward straight from here (a broadcast from memory).
  alignas(64) T bilinear[4][kMax], dx[4][kMax], dy[4][kMax];

  template <typename V>
  static V load(const void* p) {
    V x;
    __builtin_memcpy(&x, p, sizeof(x));
    return x;
  }

  // Asks the caches for the rows of `rows` (value's at a head's first channel) that
  // the samples with four corners inside will read, `bytes` of each: the rows of a level lie
  // anywhere in it, too scattered for the hardware's prefetchers.
  void prefetch(const LevelBySample<T>& lv, const T* rows, int64_t row_stride, int64_t lp, int bytes) const {
    for (int64_t k = 0; k < lp; ++k) {
      if (state[k] != 2) continue;
      const char* r = reinterpret_cast<const char*>(rows + static_cast<int64_t>(position[k]) * row_stride);
      const int64_t step = static_cast<int64_t>(row_stride * sizeof(T)), down = lv.wi[k] * step;
      for (int i = 0; i < bytes; i += 64) {
        __builtin_prefetch(r + i), __builtin_prefetch(r + step + i);
        __builtin_prefetch(r + down + i), __builtin_prefetch(r + down + step + i);
      }
    }
  }

  // grid_pixel of a vector of coordinates. float: the double product of two floats is exact, so
  // the vector of doubles gives the fused result; double: grid_pixel's fma, lane by lane.
  static Vec grid_pixels(Vec norm, Vec size) {
    if constexpr (sizeof(T) == 4) {
      typedef double Wide __attribute__((vector_size(kVectorBytes * 2)));
      const Vec g1 = (T(2) * norm - T(1)) + T(1), half = size / T(2);
      return __builtin_convertvector(__builtin_convertvector(g1, Wide) * __builtin_convertvector(half, Wide) - 0.5, Vec);
    } else {
      Vec x;
      for (int i = 0; i < N; ++i) x[i] = std::fma((T(2) * norm[i] - T(1)) + T(1), size[i] / T(2), T(-0.5));
      return x;
    }
  }

  void set(const LevelBySample<T>& lv, const T* loc, const T* wt, int64_t lp) {
    IVec even, odd;
    for (int i = 0; i < N; ++i) even[i] = 2 * i, odd[i] = 2 * i + 1;
    for (int64_t j = 0; j < lp; j += N) {
      Vec a, b, w;
      if (j + N <= lp) {
        a = load<Vec>(loc + 2 * j), b = load<Vec>(loc + 2 * j + N), w = load<Vec>(wt + j);
      } else {  // the last samples: the lanes past them are computed and never read
        alignas(64) T xy[2 * N] = {}, ww[N] = {};
        for (int64_t i = 0; i < lp - j; ++i) xy[2 * i] = loc[2 * (j + i)], xy[2 * i + 1] = loc[2 * (j + i) + 1], ww[i] = wt[j + i];
        a = load<Vec>(xy), b = load<Vec>(xy + N), w = load<Vec>(ww);
      }
      const Vec lw = load<Vec>(lv.w + j), lh = load<Vec>(lv.h + j);
      Vec x, y;
      if constexpr (kGrid) {
        x = grid_pixels(__builtin_shuffle(a, b, even), lw), y = grid_pixels(__builtin_shuffle(a, b, odd), lh);
      } else {
        x = __builtin_shuffle(a, b, even) * lw - T(0.5), y = __builtin_shuffle(a, b, odd) * lh - T(0.5);
      }
      const IVec inside = (x > T(-1)) & (y > T(-1)) & (x < lw) & (y < lh);
      x = inside ? x : Vec{}, y = inside ? y : Vec{};  // NaN and far coordinates: not converted
      IVec xi = __builtin_convertvector(x, IVec), yi = __builtin_convertvector(y, IVec);
      xi += __builtin_convertvector(xi, Vec) > x, yi += __builtin_convertvector(yi, Vec) > y;  // floor: -1 where true
      const Vec lx = x - __builtin_convertvector(xi, Vec), ly = y - __builtin_convertvector(yi, Vec);
      const Vec hx = T(1) - lx, hy = T(1) - ly;
      const IVec wi = load<IVec>(lv.wi + j), hi = load<IVec>(lv.hi + j);
      const IVec interior = (xi >= 0) & (xi < wi - 1) & (yi >= 0) & (yi < hi - 1);
      const Vec b0 = hy * hx, b1 = hy * lx, b2 = ly * hx, b3 = ly * lx;
      const Vec f0 = w * b0, f1 = w * b1, f2 = w * b2, f3 = w * b3;
      if constexpr (kGrid) {
        __builtin_memcpy(bilinear[0] + j, &b0, sizeof(Vec)), __builtin_memcpy(bilinear[1] + j, &b1, sizeof(Vec));
        __builtin_memcpy(bilinear[2] + j, &b2, sizeof(Vec)), __builtin_memcpy(bilinear[3] + j, &b3, sizeof(Vec));
        const Vec dx0 = -hy, dx2 = -ly, dy0 = -hx, dy1 = -lx;
        __builtin_memcpy(dx[0] + j, &dx0, sizeof(Vec)), __builtin_memcpy(dx[1] + j, &hy, sizeof(Vec));
        __builtin_memcpy(dx[2] + j, &dx2, sizeof(Vec)), __builtin_memcpy(dx[3] + j, &ly, sizeof(Vec));
        __builtin_memcpy(dy[0] + j, &dy0, sizeof(Vec)), __builtin_memcpy(dy[1] + j, &dy1, sizeof(Vec));
        __builtin_memcpy(dy[2] + j, &hx, sizeof(Vec)), __builtin_memcpy(dy[3] + j, &lx, sizeof(Vec));
      }
      const IVec pos = load<IVec>(lv.start + j) + yi * wi + xi, st = inside & (interior ? IVec{} + 2 : IVec{} + 1);
      __builtin_memcpy(factor[0] + j, &f0, sizeof(Vec)), __builtin_memcpy(factor[1] + j, &f1, sizeof(Vec));
      __builtin_memcpy(factor[2] + j, &f2, sizeof(Vec)), __builtin_memcpy(factor[3] + j, &f3, sizeof(Vec));
      __builtin_memcpy(x0 + j, &xi, sizeof(IVec)), __builtin_memcpy(y0 + j, &yi, sizeof(IVec));
      __builtin_memcpy(position + j, &pos, sizeof(IVec)), __builtin_memcpy(state + j, &st, sizeof(IVec));
    }
  }
};

// Adds sample k of table t (value at a head's first channel) to acc: its corners inside the
// level in the fixed order.
template <typename R, typename T>
inline void add_sample(const LevelBySample<T>& lv, const SampleTable<T>& t, int64_t k, const T* value_bh,
                       int64_t row_stride, R& acc) {
  if (t.state[k] == 0) return;
  const T* v = value_bh + static_cast<int64_t>(t.position[k]) * row_stride;
  const int64_t down = static_cast<int64_t>(lv.wi[k]) * row_stride;
  if (t.state[k] == 2) {
    acc.add(t.factor[0][k], v), acc.add(t.factor[1][k], v + row_stride);
    acc.add(t.factor[2][k], v + down), acc.add(t.factor[3][k], v + down + row_stride);
    return;
  }
  for (int c = 0; c < 4; ++c) {
    const int64_t yy = t.y0[k] + (c >> 1), xx = t.x0[k] + (c & 1);
    if (yy >= 0 && yy < lv.hi[k] && xx >= 0 && xx < lv.wi[k])
      acc.add(t.factor[c][k], v + (c >> 1) * down + (c & 1) * row_stride);
  }
}

// Fixed channel counts with a SampleTable per (b, q, h): the samples' coordinates and weights
// computed a vector at a time, then their corners added in the fixed order (levels, points,
// corners) into an accumulator held in registers. Two (b, q, h)s at a time, sample by sample: each
// accumulator is a chain of dependent additions, and two independent chains overlap their
// latencies (each output's sums are the same, in the same order).
template <int kD, typename T>
void forward_rows_fixed(const Geometry& g, const LevelBySample<T>& lv, const T* value, const T* locations,
                        const T* weights, int64_t b, int64_t q_begin, int64_t q_end, T* output) {
  using R = Row<T, kD>;
  const int64_t row_stride = g.heads * kD, lp = g.levels * g.points;
  const T* value_b = value + b * g.spatial * row_stride;
  // The (b, q, h)s of these queries, one after another: slot = (b * Q + q) * H + h.
  const int64_t first = (b * g.queries + q_begin) * g.heads, last = (b * g.queries + q_end) * g.heads;
  auto head_of = [&](int64_t slot) { return value_b + (slot % g.heads) * kD; };
  SampleTable<T> tables[4];
  int turn = 0;
  for (int64_t slot = first; slot < last; slot += 2) {
    // The next two (b, q, h)s' tables made now and their rows asked for: they arrive while these sum.
    SampleTable<T>* t = tables + turn;
    SampleTable<T>* next = tables + (turn ^= 2);
    const bool two = slot + 1 < last;
    if (slot == first) {
      t[0].set(lv, locations + slot * lp * 2, weights + slot * lp, lp);
      if (two) t[1].set(lv, locations + (slot + 1) * lp * 2, weights + (slot + 1) * lp, lp);
    }
    for (int64_t i = 0; i < 2 && slot + 2 + i < last; ++i) {
      const int64_t s = slot + 2 + i;
      next[i].set(lv, locations + s * lp * 2, weights + s * lp, lp);
      next[i].prefetch(lv, head_of(s), row_stride, lp, kD * sizeof(T));
    }
    const T* v0 = head_of(slot);
    R acc0;
    acc0.zero();
    if (two) {
      const T* v1 = head_of(slot + 1);
      R acc1;
      acc1.zero();
      for (int64_t k = 0; k < lp; ++k)
        add_sample(lv, t[0], k, v0, row_stride, acc0), add_sample(lv, t[1], k, v1, row_stride, acc1);
      acc1.store(output + (slot + 1) * kD);
    } else {
      for (int64_t k = 0; k < lp; ++k) add_sample(lv, t[0], k, v0, row_stride, acc0);
    }
    acc0.store(output + slot * kD);
  }
}

template <int kD, typename T>
void forward_rows_d(const Geometry& g, const T* value, const T* locations, const T* weights, int64_t b,
                    int64_t q_begin, int64_t q_end, T* output) {
  LevelBySample<T> lv;
  if constexpr (kD > 0) {
    if (lv.set(g)) return forward_rows_fixed<kD>(g, lv, value, locations, weights, b, q_begin, q_end, output);
  }
  {
    const int64_t d = g.channels, row_stride = g.heads * d, lp = g.levels * g.points;
    const T* value_b = value + b * g.spatial * row_stride;
    for (int64_t q = q_begin; q < q_end; ++q) {
      for (int64_t h = 0; h < g.heads; ++h) {
        const int64_t slot = (b * g.queries + q) * g.heads + h;  // (b, q, h)
        T* out = output + slot * d;
        const T* loc = locations + slot * lp * 2;
        const T* wt = weights + slot * lp;
        const T* value_bh = value_b + h * d;
        for (int64_t i = 0; i < d; ++i) out[i] = T(0);
        for (int64_t l = 0; l < g.levels; ++l)
          for (int64_t p = 0; p < g.points; ++p) {
            const int64_t k = l * g.points + p, lh = g.level_h[l], lw = g.level_w[l];
            Sample<T> s;
            if (!sample_at(loc[2 * k], loc[2 * k + 1], lh, lw, g.level_start[l], s)) continue;
            each_corner(s, lh, lw, [&](int, T c, int64_t pos) { axpy(out, wt[k] * c, value_bh + pos * row_stride, d); });
          }
      }
    }
  }
}

// The backward of one (b, q, h) over its samples [k_begin, k_end) at fixed channel counts, at most
// a vector's lanes of them, from its SampleTable: grad_value's rows added to, in sample and corner
// order, and each sample's three sums over channels (grad_output . the sample, its derivatives in
// pixel x and y) taken for all the samples at once (row_sums).
template <int kD, typename T>
inline void backward_samples(const Geometry& g, const LevelBySample<T>& lv, const SampleTable<T, true>& t,
                             const T* go, const T* wt, const T* value_bh, T* grad_value_bh, int64_t k_begin,
                             int64_t k_end, T* gl, T* gw) {
  using R = Row<T, kD>;
  using Vec = typename R::Vec;
  constexpr int N = R::kLanes;
  const int64_t row_stride = g.heads * kD;
  R go_row;
  go_row.load_from(go);
  Vec tw[N], tx[N], ty[N];
  T scale[4 * N];  // the corners sampled, in order: grad_value's rows and their factors
  int64_t at[4 * N];
  int corners = 0;
  for (int i = 0; i < N; ++i) tw[i] = tx[i] = ty[i] = Vec{};
  for (int64_t k = k_begin; k < k_end; ++k) {
    if (t.state[k] == 0) continue;
    const int i = static_cast<int>(k - k_begin);
    const int64_t row = static_cast<int64_t>(t.position[k]) * row_stride, down = static_cast<int64_t>(lv.wi[k]) * row_stride;
    R sum_w, sum_x, sum_y;
    sum_w.zero(), sum_x.zero(), sum_y.zero();
    auto corner = [&](int c) {
      const int64_t pos = row + (c >> 1) * down + (c & 1) * row_stride;
      const T* v = value_bh + pos;
      const T cw = t.bilinear[c][k], cx = t.dx[c][k], cy = t.dy[c][k];
      for (int j = 0; j < R::kVecs; ++j) {
        auto x = R::load(v + j * N);
        in_register(x);
        sum_w.v[j] += cw * x, sum_x.v[j] += cx * x, sum_y.v[j] += cy * x;
      }
      // grad_value's row asked for, to be written, as value's is read: the additions below then
      // find it in L1 (asked for a (query, head) earlier, it was often gone by then).
      for (int j = 0; j < static_cast<int>(kD * sizeof(T)); j += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(grad_value_bh + pos) + j, 1);
      scale[corners] = t.factor[c][k], at[corners++] = pos;
    };
    if (t.state[k] == 2) {
      corner(0), corner(1), corner(2), corner(3);
    } else {
      for (int c = 0; c < 4; ++c) {
        const int64_t yy = t.y0[k] + (c >> 1), xx = t.x0[k] + (c & 1);
        if (yy >= 0 && yy < lv.hi[k] && xx >= 0 && xx < lv.wi[k]) corner(c);
      }
    }
    tw[i] = sum_w.lane_products(go_row), tx[i] = sum_x.lane_products(go_row), ty[i] = sum_y.lane_products(go_row);
  }
  // grad_value's rows added to after every read of value: a store to grad_value followed by a load
  // of value at the same offset modulo 4 KiB (rows of 1 KiB at D = 32, 8 heads) would wait on it.
  for (int c = 0; c < corners; ++c) {
    T* dst = grad_value_bh + at[c];
    for (int j = 0; j < R::kVecs; ++j) {
      Vec x = R::load(dst + j * N);
      x += scale[c] * go_row.v[j];
      __builtin_memcpy(dst + j * N, &x, sizeof(x));
    }
  }
  const Vec dot_w = row_sums<T>(tw), dot_x = row_sums<T>(tx), dot_y = row_sums<T>(ty);
  if (k_end - k_begin == N) {  // a whole vector of samples: the loop below, lane by lane
    typedef typename LaneIndex<T>::Vec Mask;
    typedef typename std::remove_reference<decltype(Mask{}[0])>::type I;
    Mask state, first, second;
    Vec w, lw, lh;
    __builtin_memcpy(&state, t.state + k_begin, sizeof(Mask)), __builtin_memcpy(&w, wt + k_begin, sizeof(Vec));
    __builtin_memcpy(&lw, lv.w + k_begin, sizeof(Vec)), __builtin_memcpy(&lh, lv.h + k_begin, sizeof(Vec));
    const Mask some = state != 0;
    const Vec gx = some ? w * lw * dot_x : Vec{}, gy = some ? w * lh * dot_y : Vec{}, gwv = some ? dot_w : Vec{};
    __builtin_memcpy(&first, kShuffleMasks<I, N>.interleave[0], sizeof(Mask));
    __builtin_memcpy(&second, kShuffleMasks<I, N>.interleave[1], sizeof(Mask));
    const Vec xy0 = __builtin_shuffle(gx, gy, first), xy1 = __builtin_shuffle(gx, gy, second);
    __builtin_memcpy(gw + k_begin, &gwv, sizeof(Vec));
    __builtin_memcpy(gl + 2 * k_begin, &xy0, sizeof(Vec)), __builtin_memcpy(gl + 2 * k_begin + N, &xy1, sizeof(Vec));
    return;
  }
  for (int64_t k = k_begin; k < k_end; ++k) {
    const int i = static_cast<int>(k - k_begin);
    gl[2 * k] = gl[2 * k + 1] = gw[k] = T(0);
    if (t.state[k] == 0) continue;
    gw[k] = dot_w[i];
    gl[2 * k] = wt[k] * lv.w[k] * dot_x[i];  // x = x_norm * w - 0.5
    gl[2 * k + 1] = wt[k] * lv.h[k] * dot_y[i];
  }
}

template <int kD, typename T>
void backward_heads_d(const Geometry& g, const T* grad_output, const T* value, const T* locations,
                      const T* weights, int64_t b, int64_t h_begin, int64_t h_end, T* grad_value, T* grad_locations,
                      T* grad_weights) {
  const int64_t d = kD > 0 ? kD : g.channels, row_stride = g.heads * d, lp = g.levels * g.points;
  LevelBySample<T> lv;
  const bool tabled = kD > 0 && lv.set(g);
  SampleTable<T, true> tables[2];
  int turn = 0;
  // Query by query, as the forward; each head's slice of grad_value gathers its sums in query order
  // whichever heads share the task. Every head of a query before the next query: sweeping the
  // queries once per head (or per 2 or 4 heads), the same sums, measured 3-20% slower at 800x1200.
  for (int64_t q = 0; q < g.queries; ++q) {
    for (int64_t h = h_begin; h < h_end; ++h) {
      const T* value_bh = value + b * g.spatial * row_stride + h * d;
      T* grad_value_bh = grad_value + b * g.spatial * row_stride + h * d;
      const int64_t slot = (b * g.queries + q) * g.heads + h;
      const T* go = grad_output + slot * d;
      const T* loc = locations + slot * lp * 2;
      const T* wt = weights + slot * lp;
      T* gl = grad_locations + slot * lp * 2;
      T* gw = grad_weights + slot * lp;
      if constexpr (kD > 0) {
        if (tabled) {
          // The table of the next (q, h) in this loop order made now, and its rows asked for, so
          // that they arrive while this one computes.
          SampleTable<T, true>& now = tables[turn];
          SampleTable<T, true>& next = tables[turn ^= 1];
          if (q == 0 && h == h_begin) now.set(lv, loc, wt, lp);
          const int64_t next_q = h + 1 < h_end ? q : q + 1, next_h = h + 1 < h_end ? h + 1 : h_begin;
          if (next_q < g.queries) {
            const int64_t next_slot = (b * g.queries + next_q) * g.heads + next_h;
            next.set(lv, locations + next_slot * lp * 2, weights + next_slot * lp, lp);
            const int64_t at = b * g.spatial * row_stride + next_h * d;
            next.prefetch(lv, value + at, row_stride, lp, kD * sizeof(T));
          }
          constexpr int64_t kLanes = Row<T, kD>::kLanes;
          for (int64_t k = 0; k < lp; k += kLanes)
            backward_samples<kD>(g, lv, now, go, wt, value_bh, grad_value_bh, k,
                                 k + (lp - k < kLanes ? lp - k : kLanes), gl, gw);
          continue;
        }
      }
      for (int64_t l = 0; l < g.levels; ++l)
        for (int64_t p = 0; p < g.points; ++p) {
          const int64_t k = l * g.points + p, lh = g.level_h[l], lw = g.level_w[l];
          gl[2 * k] = gl[2 * k + 1] = gw[k] = T(0);
          Sample<T> s;
          if (!sample_at_pixel(grid_pixel(loc[2 * k], lw), grid_pixel(loc[2 * k + 1], lh), lh, lw, g.level_start[l], s))
            continue;
          // grad_output . (the sample, its derivatives in pixel x and y), as backward_samples.
          const T dx_of[4] = {-s.hy, s.hy, -s.ly, s.ly}, dy_of[4] = {-s.hx, -s.lx, s.hx, s.lx};
          T dot_w = T(0), dot_x = T(0), dot_y = T(0);
          each_corner(s, lh, lw, [&](int c, T cw, int64_t pos) {
            const T gv = dot(go, value_bh + pos * row_stride, d);
            dot_w += cw * gv, dot_x += dx_of[c] * gv, dot_y += dy_of[c] * gv;
            axpy(grad_value_bh + pos * row_stride, wt[k] * cw, go, d);
          });
          gw[k] = dot_w;
          gl[2 * k] = wt[k] * static_cast<T>(lw) * dot_x;  // x = x_norm * w - 0.5
          gl[2 * k + 1] = wt[k] * static_cast<T>(lh) * dot_y;
        }
    }
  }
}

// The channel counts of the models in use get loops of fixed length (Deformable DETR, DINO and
// Mask2Former: 256 channels over 8 heads, 32 each).
template <typename T>
void forward_rows_any(const Geometry& g, const T* value, const T* locations, const T* weights, int64_t b,
                      int64_t q_begin, int64_t q_end, T* output) {
  switch (g.channels) {
    case 16: return forward_rows_d<16>(g, value, locations, weights, b, q_begin, q_end, output);
    case 32: return forward_rows_d<32>(g, value, locations, weights, b, q_begin, q_end, output);
    case 64: return forward_rows_d<64>(g, value, locations, weights, b, q_begin, q_end, output);
    default: return forward_rows_d<0>(g, value, locations, weights, b, q_begin, q_end, output);
  }
}

template <typename T>
void backward_heads_any(const Geometry& g, const T* grad_output, const T* value, const T* locations, const T* weights,
                        int64_t b, int64_t h_begin, int64_t h_end, T* grad_value, T* grad_locations, T* grad_weights) {
  auto run = [&](auto d) {
    backward_heads_d<decltype(d)::value>(g, grad_output, value, locations, weights, b, h_begin, h_end, grad_value,
                                         grad_locations, grad_weights);
  };
  switch (g.channels) {
    case 16: return run(Channels<16>{});
    case 32: return run(Channels<32>{});
    case 64: return run(Channels<64>{});
    default: return run(Channels<0>{});
  }
}

Variant this_variant(const char* isa) { return Variant{forward_rows_any<float>, backward_heads_any<float>, isa}; }

}  // namespace
}  // namespace opbridge::msda_impl
