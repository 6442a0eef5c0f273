// The pick of fps_variants.h written once over a vector type V (fps_kernel.cc: scalars;
// fps_avx2.cc, fps_avx512.cc: registers). Everything here has internal linkage, so an ISA source's
// copy is never handed to baseline code by the linker.
//
// Pruning without changing a value: a block whose bounding box is at squared distance lb from the
// pick, computed as the points' distances are (per coordinate the gap to the box, 0 inside it;
// squares summed in the same order), keeps every minimum when lb >= its largest minimum. Rounding
// is monotone, so each point's computed distance is >= lb, hence >= its minimum: min() returns the
// minimum unchanged, and so does the block's best. Only blocks with lb < top are updated.
//
// V provides: T (float or double), R (a register of W lanes), load, store, set1, zero, sub, mul,
// add, min, max, lt and eq (lane masks as bits), and hmax (the largest lane). Its mul must round
// the product (no FMA contraction with the following add), as the original loop does.
#pragma once

#include <cstdint>
#include <limits>

#include "fps_variants.h"

namespace opbridge::fps {
namespace {

inline int lowest_bit(uint32_t m) {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_ctz(m);
#else
  int i = 0;
  while (!((m >> i) & 1u)) ++i;
  return i;
#endif
}

// The x86 register types as V: PRE is _mm256 or _mm512, SUF ps or pd, and the ISA source defines
// compare_mask<predicate>(a, b) for REG (lane bits). The empty asm keeps each product a rounded
// value: without it the compiler may fuse it with the following add into an FMA, which rounds
// once. The largest lane is read back (once per updated block: not worth a shuffle sequence).
#define OB_FPS_LANES(NAME, TYPE, REG, WIDTH, PRE, SUF)                      \
  struct NAME {                                                             \
    using T = TYPE;                                                         \
    using R = REG;                                                          \
    static constexpr int W = WIDTH;                                         \
    static R load(const T* p) { return PRE##_loadu_##SUF(p); }              \
    static void store(T* p, R v) { PRE##_storeu_##SUF(p, v); }              \
    static R set1(T v) { return PRE##_set1_##SUF(v); }                      \
    static R zero() { return PRE##_setzero_##SUF(); }                       \
    static R sub(R a, R b) { return PRE##_sub_##SUF(a, b); }                \
    static R mul(R a, R b) {                                                \
      R r = PRE##_mul_##SUF(a, b);                                          \
      asm("" : "+v"(r));                                                    \
      return r;                                                             \
    }                                                                       \
    static R add(R a, R b) { return PRE##_add_##SUF(a, b); }                \
    static R min(R a, R b) { return PRE##_min_##SUF(a, b); }                \
    static R max(R a, R b) { return PRE##_max_##SUF(a, b); }                \
    static uint32_t lt(R a, R b) { return compare_mask<_CMP_LT_OQ>(a, b); } \
    static uint32_t eq(R a, R b) { return compare_mask<_CMP_EQ_OQ>(a, b); } \
    static T hmax(R v) {                                                    \
      T lane[WIDTH];                                                        \
      store(lane, v);                                                       \
      T m = lane[0];                                                        \
      for (int i = 1; i < WIDTH; ++i) m = m < lane[i] ? lane[i] : m;        \
      return m;                                                             \
    }                                                                       \
  };

// Scalars as one-lane vectors: the baseline variant.
template <typename C>
struct Scalar {
  using T = C;
  using R = C;
  static constexpr int W = 1;
  static R load(const T* p) { return *p; }
  static void store(T* p, R v) { *p = v; }
  static R set1(T v) { return v; }
  static R zero() { return T(0); }
  static R sub(R a, R b) { return a - b; }
  static R mul(R a, R b) { return a * b; }
  static R add(R a, R b) { return a + b; }
  static R min(R a, R b) { return b < a ? b : a; }
  static R max(R a, R b) { return a < b ? b : a; }
  static uint32_t lt(R a, R b) { return a < b ? 1u : 0u; }
  static uint32_t eq(R a, R b) { return a == b ? 1u : 0u; }
  static T hmax(R v) { return v; }
};

// The pick's coordinates in registers: D of them held, or (any number, D = 0) broadcast on use.
template <class V, int D>
struct Pick {
  const typename V::T* p;
  typename V::R held[D ? D : 1];
  explicit Pick(const typename V::T* coords) : p(coords) {
    for (int c = 0; c < D; ++c) held[c] = V::set1(p[c]);
  }
  typename V::R operator[](int64_t c) const { return D ? held[c] : V::set1(p[c]); }
};

// Squared distance of the W points at position i to the pick: ((v0² + v1²) + v2²) + ...
template <class V, int D>
typename V::R squared(const Blocks<typename V::T>& s, const Pick<V, D>& pick, int64_t i) {
  const int64_t dims = D ? D : s.dims;
  typename V::R v = V::sub(V::load(s.coord + i), pick[0]);
  typename V::R d = V::mul(v, v);
  for (int64_t c = 1; c < dims; ++c) {
    v = V::sub(V::load(s.coord + c * s.stride + i), pick[c]);
    d = V::add(d, V::mul(v, v));
  }
  return d;
}

// The same sum for W blocks' bounding boxes from b: per coordinate the gap max(lo - p, p - hi, 0).
template <class V, int D>
typename V::R box_squared(const Blocks<typename V::T>& s, const Pick<V, D>& pick, int64_t b) {
  const int64_t dims = D ? D : s.dims;
  typename V::R d = V::zero();
  for (int64_t c = 0; c < dims; ++c) {
    const typename V::R g = V::max(V::max(V::sub(V::load(s.lo + c * s.blocks + b), pick[c]),
                                          V::sub(pick[c], V::load(s.hi + c * s.blocks + b))),
                                   V::zero());
    d = c == 0 ? V::mul(g, g) : V::add(d, V::mul(g, g));
  }
  return d;
}

// Block b: every point's minimum lowered by its distance to the pick; its top and best refreshed.
template <class V, int D>
void update_block(const Blocks<typename V::T>& s, const Pick<V, D>& pick, int64_t b) {
  using T = typename V::T;
  constexpr T kInf = std::numeric_limits<T>::infinity();  // a constant: no library call in ISA code
  typename V::R top = V::set1(-kInf);
  const int64_t begin = s.begin[b], end = s.begin[b + 1];
  for (int64_t i = begin; i < end; i += V::W) {
    const typename V::R m = V::min(squared<V, D>(s, pick, i), V::load(s.dist + i));
    V::store(s.dist + i, m);
    top = V::max(top, m);
  }
  const T t = V::hmax(top);
  const typename V::R want = V::set1(t);
  uint64_t key = ~uint64_t{0};
  int64_t pos = -1;
  for (int64_t i = begin; i < end; i += V::W)
    for (uint32_t m = V::eq(V::load(s.dist + i), want); m; m &= m - 1) {
      const int64_t k = i + lowest_bit(m);
      if (s.key[k] < key) key = s.key[k], pos = k;
    }
  s.top[b] = t;
  s.best[b] = pos;
}

// The pick of fps_variants.h (Step): blocks W at a time; the largest top, ties by key.
template <class V, int D>
Found<typename V::T> step(const Blocks<typename V::T>& s, const typename V::T* p) {
  using T = typename V::T;
  using R = typename V::R;
  constexpr T kInf = std::numeric_limits<T>::infinity();
  const Pick<V, D> pick(p);
  R top = V::set1(-kInf);
  for (int64_t b = 0; b < s.blocks; b += V::W) {
    for (uint32_t m = V::lt(box_squared<V, D>(s, pick, b), V::load(s.top + b)); m; m &= m - 1)
      update_block<V, D>(s, pick, b + lowest_bit(m));
    top = V::max(top, V::load(s.top + b));
  }
  const T t = V::hmax(top);
  const R want = V::set1(t);
  uint64_t key = ~uint64_t{0};
  int64_t pos = -1;
  for (int64_t b = 0; b < s.blocks; b += V::W)
    for (uint32_t m = V::eq(V::load(s.top + b), want); m; m &= m - 1) {
      const int64_t k = s.best[b + lowest_bit(m)];
      if (s.key[k] < key) key = s.key[k], pos = k;
    }
  return {t, pos};
}

}  // namespace
}  // namespace opbridge::fps
