// A small reader/writer for NumPy's .npy format (versions 1.0, 2.0 and 3.0): little-endian
// numeric and bool arrays in C order, any rank (0-d and empty included). Everything else is
// rejected with an npy::Error whose message names the file and the reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace opbridge::npy {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType : uint8_t { Bool, Int8, UInt8, Int16, UInt16, Int32, UInt32, Int64, UInt64, Float16, Float32, Float64 };

size_t itemsize(DType t);
const char* descr(DType t);      // the .npy spelling: "<f4", "|b1", ...
const char* type_name(DType t);  // NumPy's name: "float32", "bool", ...

struct Array {
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;       // empty: a 0-d array (one element)
  std::vector<unsigned char> data;  // numel() * itemsize(dtype) bytes, C order, little-endian

  int64_t numel() const;
};

// Reads a whole .npy file. Throws npy::Error("<path>: <reason>") on anything malformed or
// unsupported: bad magic, unknown version, truncated header or data, trailing bytes, a header
// that is not the dict NumPy writes, an unsupported or big-endian dtype, fortran_order True, a
// negative or overflowing shape.
Array load(const std::string& path);

// Writes `data` (numel(shape) * itemsize(dtype) bytes) as a .npy file: version 1.0, or 2.0 when
// the header needs it, the header padded to 64 bytes as NumPy does. Throws npy::Error naming the
// file when it cannot be written.
void save(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data);
inline void save(const std::string& path, const Array& a) { save(path, a.dtype, a.shape, a.data.data()); }

// The element count of `shape`, or -1 when a dim is negative or the count overflows int64.
int64_t checked_numel(const std::vector<int64_t>& shape);

}  // namespace opbridge::npy
