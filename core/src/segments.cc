#include "opbridge/segments.h"

#include "opbridge/error.h"

namespace opbridge {
namespace {

std::vector<int64_t> read(const TensorView& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  visit_dtype<int32_t, int64_t>(t.dtype, [&](auto zero) {
    const auto* p = t.data_as<decltype(zero)>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(p[i]);
  });
  return v;
}

}  // namespace

std::vector<int64_t> segment_bounds(const TensorView& offset, const char* offset_name, int64_t rows,
                                    const char* rows_name) {
  const std::vector<int64_t> ends = read(offset);
  std::vector<int64_t> bounds(ends.size() + 1, 0);
  for (size_t i = 0; i < ends.size(); ++i) {
    OB_CHECK(ends[i] >= 0, offset_name, "[", i, "] = ", ends[i], " is negative; offsets are cumulative segment ends");
    OB_CHECK(ends[i] >= bounds[i], offset_name, " must be non-decreasing, but ", offset_name, "[", i - 1, "] = ",
             bounds[i], " > ", offset_name, "[", i, "] = ", ends[i]);
    bounds[i + 1] = ends[i];
  }
  if (rows_name)
    OB_CHECK(bounds.back() == rows, "the last entry of ", offset_name, " (", bounds.back(),
             ends.empty() ? ", none given" : "", ") must equal the number of rows of ", rows_name, " (", rows, ")");
  return bounds;
}

std::vector<int64_t> segment_pointers(const TensorView& ptr, const char* ptr_name, int64_t rows, const char* rows_name) {
  const std::vector<int64_t> p = read(ptr);
  OB_CHECK(!p.empty(), ptr_name, " is empty; it holds each segment's first row, then the row count");
  OB_CHECK(p.front() == 0, ptr_name, "[0] = ", p.front(), "; the first segment starts at row 0");
  for (size_t i = 1; i < p.size(); ++i)
    OB_CHECK(p[i] >= p[i - 1], ptr_name, " must be non-decreasing, but ", ptr_name, "[", i - 1, "] = ", p[i - 1],
             " > ", ptr_name, "[", i, "] = ", p[i]);
  OB_CHECK(p.back() == rows, "the last entry of ", ptr_name, " (", p.back(), ") must equal the number of rows of ",
           rows_name, " (", rows, ")");
  return p;
}

std::vector<int64_t> batch_vector(const TensorView& batch, const char* name) {
  const std::vector<int64_t> v = read(batch);
  for (size_t i = 0; i < v.size(); ++i) {
    OB_CHECK(v[i] >= 0, name, "[", i, "] = ", v[i], " is negative; a batch vector numbers the examples from 0");
    // Rows of one example must be one run: a segment op given an unsorted vector would mix examples.
    OB_CHECK(i == 0 || v[i] >= v[i - 1], name, " must be sorted, but ", name, "[", i - 1, "] = ", v[i - 1], " > ", name,
             "[", i, "] = ", v[i], " (each example's rows together, examples in increasing order)");
  }
  return v;
}

}  // namespace opbridge
