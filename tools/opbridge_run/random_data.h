// The data of --random.
#pragma once

#include <cstdint>
#include <random>

#include "npy.h"

namespace opbridge::run {

constexpr int kRandomIntRange = 10;  // random integers are uniform in [0, kRandomIntRange)

// Fills `n` elements of type `t` at `p`: floats uniform in [-1, 1), integers uniform in
// [0, kRandomIntRange), bools false/true with equal probability.
void fill_random(npy::DType t, unsigned char* p, int64_t n, std::mt19937_64& g);

}  // namespace opbridge::run
