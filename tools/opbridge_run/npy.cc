#include "npy.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>

namespace opbridge::npy {
namespace {

struct TypeRow {
  DType dtype;
  char kind;  // NumPy's type character: b, i, u, f
  size_t size;
  const char* name;
};

constexpr TypeRow kTypes[] = {
    {DType::Bool, 'b', 1, "bool"},       {DType::Int8, 'i', 1, "int8"},       {DType::UInt8, 'u', 1, "uint8"},
    {DType::Int16, 'i', 2, "int16"},     {DType::UInt16, 'u', 2, "uint16"},   {DType::Int32, 'i', 4, "int32"},
    {DType::UInt32, 'u', 4, "uint32"},   {DType::Int64, 'i', 8, "int64"},     {DType::UInt64, 'u', 8, "uint64"},
    {DType::Float16, 'f', 2, "float16"}, {DType::Float32, 'f', 4, "float32"}, {DType::Float64, 'f', 8, "float64"},
};

const TypeRow& row(DType t) {
  for (const auto& r : kTypes)
    if (r.dtype == t) return r;
  throw Error("npy: invalid dtype value");
}

// Bytes from a malformed file (a key, a dtype) as printable ASCII: others as \xNN, so a message
// never carries raw bytes a terminal would misread.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

[[noreturn]] void fail(const std::string& path, const std::string& reason) { throw Error(path + ": " + printable(reason)); }

// ---- the header: the repr of a Python dict, {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
struct Header {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  Header parse() {
    Header h;
    expect('{');
    while (!peek('}')) {
      std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        if (h.descr) bad("the key 'descr' appears twice");
        if (!peek('\'') && !peek('"')) bad("'descr' is not a string (structured dtypes are not supported)");
        h.descr = string_literal();
      } else if (key == "fortran_order") {
        if (h.fortran_order) bad("the key 'fortran_order' appears twice");
        h.fortran_order = boolean();
      } else if (key == "shape") {
        if (h.shape) bad("the key 'shape' appears twice");
        h.shape = tuple();
      } else {
        bad("unexpected key '" + key + "'");
      }
      if (!peek('}')) expect(',');
    }
    expect('}');
    skip_space();
    if (i_ != s_.size()) bad("unexpected text after the dict");
    if (!h.descr) bad("no 'descr'");
    if (!h.fortran_order) bad("no 'fortran_order'");
    if (!h.shape) bad("no 'shape'");
    return h;
  }

 private:
  [[noreturn]] void bad(const std::string& what) { fail(path_, "malformed header: " + what); }

  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool peek(char c) {
    skip_space();
    return i_ < s_.size() && s_[i_] == c;
  }
  void expect(char c) {
    if (!peek(c)) bad(std::string("expected '") + c + "' at offset " + std::to_string(i_));
    ++i_;
  }
  std::string string_literal() {
    skip_space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) bad("expected a quoted string at offset " + std::to_string(i_));
    const char q = s_[i_++];
    const size_t end = s_.find(q, i_);
    if (end == std::string_view::npos) bad("unterminated string");
    std::string v(s_.substr(i_, end - i_));
    i_ = end + 1;
    return v;
  }
  bool word(std::string_view w) {
    skip_space();
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool boolean() {
    if (word("True")) return true;
    if (word("False")) return false;
    bad("'fortran_order' is not True or False");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    while (!peek(')')) {
      skip_space();
      if (peek('-')) bad("negative dimension in 'shape'");
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) bad("'shape' is not a tuple of integers");
      int64_t v = 0;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
        const int d = s_[i_++] - '0';
        if (v > (std::numeric_limits<int64_t>::max() - d) / 10) bad("dimension in 'shape' too large");
        v = v * 10 + d;
      }
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 wrote long integers as 3L
      dims.push_back(v);
      if (!peek(')')) expect(',');
    }
    expect(')');
    return dims;
  }

  std::string_view s_;
  const std::string& path_;
  size_t i_ = 0;
};

DType parse_descr(const std::string& d, const std::string& path) {
  if (d.size() < 3) fail(path, "unsupported dtype '" + d + "'");
  const char order = d[0], kind = d[1];
  size_t size = 0;
  try {
    size_t used = 0;
    size = std::stoul(d.substr(2), &used);
    if (used != d.size() - 2) size = 0;
  } catch (const std::exception&) {
    size = 0;
  }
  for (const auto& r : kTypes) {
    if (r.kind != kind || r.size != size) continue;
    if (order == '>' && size > 1) fail(path, "big-endian dtype '" + d + "' is not supported (save it little-endian: a.astype(a.dtype.newbyteorder('<')))");
    // NumPy writes '|' for one-byte types and '<' otherwise; '<' and '=' on one byte mean the same.
    if (order == '<' || (size == 1 && (order == '|' || order == '=' || order == '>'))) return r.dtype;
    fail(path, "unsupported byte order in dtype '" + d + "'");
  }
  fail(path, "unsupported dtype '" + d + "' (supported: bool, int8/16/32/64, uint8/16/32/64, float16/32/64)");
}

uint64_t read_le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

std::string shape_repr(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

size_t itemsize(DType t) { return row(t).size; }
const char* type_name(DType t) { return row(t).name; }
const char* descr(DType t) {
  switch (t) {
    case DType::Bool: return "|b1";
    case DType::Int8: return "|i1";
    case DType::UInt8: return "|u1";
    case DType::Int16: return "<i2";
    case DType::UInt16: return "<u2";
    case DType::Int32: return "<i4";
    case DType::UInt32: return "<u4";
    case DType::Int64: return "<i8";
    case DType::UInt64: return "<u8";
    case DType::Float16: return "<f2";
    case DType::Float32: return "<f4";
    case DType::Float64: return "<f8";
  }
  throw Error("npy: invalid dtype value");
}

int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

int64_t Array::numel() const { return checked_numel(shape); }

Array load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail(path, "not a regular file");
  f.seekg(0, std::ios::end);
  const std::streamoff file_size = f.tellg();
  f.seekg(0);
  if (file_size < 0) fail(path, "cannot read");

  unsigned char prefix[12] = {};
  const std::streamoff magic_len = 8;
  if (file_size < magic_len) fail(path, "not a .npy file (too short for the magic string)");
  f.read(reinterpret_cast<char*>(prefix), magic_len);
  if (std::memcmp(prefix, "\x93NUMPY", 6) != 0) fail(path, "not a .npy file (bad magic string)");
  const int major = prefix[6], minor = prefix[7];
  if (!((major == 1 || major == 2 || major == 3) && minor == 0))
    fail(path, "unsupported .npy version " + std::to_string(major) + "." + std::to_string(minor) + " (supported: 1.0, 2.0, 3.0)");
  const int len_bytes = major == 1 ? 2 : 4;
  if (file_size < magic_len + len_bytes) fail(path, "truncated header (no header length)");
  f.read(reinterpret_cast<char*>(prefix + magic_len), len_bytes);
  const uint64_t header_len = read_le(prefix + magic_len, len_bytes);
  const std::streamoff data_offset = magic_len + len_bytes + static_cast<std::streamoff>(header_len);
  if (data_offset > file_size)
    fail(path, "truncated header (" + std::to_string(header_len) + " bytes announced, " +
                   std::to_string(file_size - magic_len - len_bytes) + " in the file)");
  std::string text(header_len, '\0');
  f.read(text.data(), static_cast<std::streamsize>(header_len));
  if (!f) fail(path, "cannot read the header");

  Header h = HeaderParser(text, path).parse();
  Array a;
  a.dtype = parse_descr(*h.descr, path);
  if (*h.fortran_order)
    fail(path, "fortran_order is True; only C-order arrays are supported (save np.ascontiguousarray(a))");
  a.shape = *h.shape;
  const int64_t numel = checked_numel(a.shape);
  const int64_t item = static_cast<int64_t>(itemsize(a.dtype));
  if (numel < 0 || numel > std::numeric_limits<int64_t>::max() / item)
    fail(path, "bad shape " + shape_repr(a.shape) + ": the element count overflows");
  const int64_t want = numel * item, have = file_size - data_offset;
  if (have < want)
    fail(path, "truncated data: shape " + shape_repr(a.shape) + " of " + type_name(a.dtype) + " needs " +
                   std::to_string(want) + " bytes, the file has " + std::to_string(have));
  if (have > want) fail(path, std::to_string(have - want) + " unexpected bytes after the array data");
  a.data.resize(static_cast<size_t>(want));
  if (want > 0) f.read(reinterpret_cast<char*>(a.data.data()), want);
  if (!f) fail(path, "cannot read the array data");
  return a;
}

void save(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data) {
  const int64_t numel = checked_numel(shape);
  if (numel < 0 || static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / itemsize(dtype))
    fail(path, "cannot save: bad shape " + shape_repr(shape));
  std::string header = std::string("{'descr': '") + descr(dtype) + "', 'fortran_order': False, 'shape': " +
                       shape_repr(shape) + ", }";
  // Pad with spaces and end with '\n' so the data starts at a multiple of 64 bytes, as NumPy does.
  // Version 1.0 has a 2-byte header length; 2.0 (4 bytes) only when the header needs it.
  auto padded = [&](size_t prefix) { return header.size() + 1 + (64 - (prefix + header.size() + 1) % 64) % 64; };
  const int major = padded(10) <= 65535 ? 1 : 2;
  const size_t prefix = major == 1 ? 10 : 12;
  header.resize(padded(prefix) - 1, ' ');
  header += '\n';

  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail(path, std::string("cannot open for writing: ") + std::strerror(errno));
  unsigned char pre[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0};
  for (size_t k = 8; k < prefix; ++k) pre[k] = static_cast<unsigned char>((header.size() >> (8 * (k - 8))) & 0xff);
  f.write(reinterpret_cast<const char*>(pre), static_cast<std::streamsize>(prefix));
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(numel * itemsize(dtype)));
  f.close();
  if (!f) fail(path, "write failed");
}

}  // namespace opbridge::npy
