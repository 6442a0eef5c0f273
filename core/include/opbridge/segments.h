// Batch segments as point-cloud ops take them: cumulative segment ends (Pointcept's
// `offset`), segment starts with the total (PyG's `ptr`), or a batch vector (torch_cluster's
// `batch`, torch_scatter's sorted `index`). Kernels read them through these, checked, so every op
// says the same about a bad one.
#pragma once

#include <cstdint>
#include <vector>

#include "opbridge/tensor_view.h"

namespace opbridge {

// {0, offset[0], ..., offset[b-1]} from cumulative segment ends (int32 or int64), each checked
// non-negative and non-decreasing; with `rows_name`, the last must equal `rows`, the row count of
// that input.
std::vector<int64_t> segment_bounds(const TensorView& offset, const char* offset_name, int64_t rows = -1,
                                    const char* rows_name = nullptr);

// {ptr[0], ..., ptr[b]} from segment starts and the total (int32 or int64), checked to start at 0,
// not decrease and end at `rows`, the row count of input `rows_name`.
std::vector<int64_t> segment_pointers(const TensorView& ptr, const char* ptr_name, int64_t rows, const char* rows_name);

// The entries of a batch vector (int32 or int64): the example of each row, numbered from 0, each
// example's rows one run, in increasing example order. Every op that takes a batch vector reads it
// here, so one rule holds everywhere: a negative or an unsorted one is an error naming `name`.
std::vector<int64_t> batch_vector(const TensorView& batch, const char* name);

}  // namespace opbridge
