// The reductions of ops/segment_reduce (defined in segment_reduce.cc): torch_scatter's segment_csr
// and scatter over the rows of a (n, f) tensor, with their gradients.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <opbridge/kernel_context.h>

namespace opbridge::segment {

enum class Reduce { Sum, Mean, Min, Max };
// "sum" (or "add"), "mean", "min", "max"; with `arg_only`, min and max only.
Reduce parse(const std::string& name, bool arg_only);

// Rows of src grouped into segments: segment s holds src rows rows[begin[s] .. begin[s + 1]), in
// that order (increasing row numbers).
struct Groups {
  std::vector<int64_t> begin;  // segments + 1 entries
  std::vector<int64_t> rows;   // empty: the identity (segment_csr's contiguous rows)
  int64_t row(int64_t i) const { return rows.empty() ? i : rows[static_cast<size_t>(i)]; }
};

// segment_csr's segments: [indptr[s], indptr[s + 1]), checked against src's rows.
Groups csr_groups(const TensorView& indptr, int64_t src_rows);
// scatter's: the rows with index s, in order; every index checked to be in [0, dim_size).
Groups scatter_groups(const TensorView& index, int64_t dim_size);
// segment_coo's: the same groups from a sorted index, as runs of contiguous rows (checked sorted).
Groups coo_groups(const TensorView& index, int64_t dim_size);

// How torch_scatter writes a min/max segment: segment_csr keeps the start value (the type's
// largest finite value, lowest for max) for a segment whose values never beat it (all NaN, say),
// scatter writes 0 there as for an empty one.
enum class Untouched { KeepStart, Zero };

// out (segments, f) and, for min/max, arg (segments, f) int64: the source row of each value, or
// src's row count for an empty segment (torch_scatter's sentinel). arg may be null.
void reduce(KernelContext& ctx, const TensorView& src, const Groups& groups, Reduce op, Untouched untouched,
            TensorView& out, TensorView* arg);

// The gradient of src: sum and mean give each row its segment's gradient (divided by the
// segment's size for mean); min and max give it to the row `arg` names (recomputed from src when
// arg is null), 0 to every other row.
void backward(KernelContext& ctx, const TensorView& grad_out, const TensorView& src, const Groups& groups, Reduce op,
              const TensorView* arg, TensorView& grad_src);

}  // namespace opbridge::segment
