// The .npy reader/writer: files as NumPy writes them, round trips for every dtype and rank, and
// a table of malformed files, each rejected with a message naming the file and the reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "npy.h"

namespace fs = std::filesystem;
using opbridge::npy::Array;
using opbridge::npy::DType;

namespace {

// One folder per test process: CTest runs the tests of this file in parallel.
std::string tmp_path(const std::string& name) {
  const fs::path dir = fs::path(OPBRIDGE_TEST_TMP) / ("pid" + std::to_string(getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The error loading `path` gives; a test failure (and "") when it loads.
std::string load_error(const std::string& path) {
  try {
    opbridge::npy::load(path);
  } catch (const opbridge::npy::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << path << " loaded";
  return "";
}

std::string from_hex(const std::string& hex) {
  std::string s;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) s += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return s;
}

// A file laid out as NumPy 2.x writes it: magic, version, header length (2 bytes for 1.0, 4
// otherwise), the dict padded with spaces and a '\n' to `header_end` bytes, then the data.
std::string npy_file(int major, const std::string& dict, const std::string& data, size_t header_end = 128) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  header.resize(header_end - prefix - 1, ' ');
  header += '\n';
  std::string s = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  for (size_t k = 0; k < prefix - 8; ++k) s += static_cast<char>((header.size() >> (8 * k)) & 0xff);
  return s + header + data;
}

struct NumpyCase {
  const char* name;
  int major;
  const char* dict;
  const char* data_hex;
  DType dtype;
  std::vector<int64_t> shape;
};

// The dicts and data are what numpy 2.4 wrote for the arrays in the comments.
const NumpyCase kNumpyCases[] = {
    // np.arange(6, dtype='<f4').reshape(2, 3), version 1.0
    {"f4_v1", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
     "000000000000803f0000004000004040000080400000a040", DType::Float32, {2, 3}},
    // np.array(-7, dtype='<i8'), version 2.0
    {"i8_0d_v2", 2, "{'descr': '<i8', 'fortran_order': False, 'shape': (), }", "f9ffffffffffffff", DType::Int64, {}},
    // np.zeros((0, 3), dtype=bool), version 3.0
    {"b1_empty_v3", 3, "{'descr': '|b1', 'fortran_order': False, 'shape': (0, 3), }", "", DType::Bool, {0, 3}},
    // np.array([True, False, False, True])
    {"b1", 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }", "01000001", DType::Bool, {4}},
    // np.array([1.5, -2], dtype='<f2')
    {"f2", 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", "003e00c0", DType::Float16, {2}},
    // np.array([-1, 2, 300], dtype='<i2')
    {"i2", 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (3,), }", "ffff02002c01", DType::Int16, {3}},
    // np.array([[0, 1], [254, 255]], dtype=np.uint8)
    {"u1", 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2), }", "0001feff", DType::UInt8, {2, 2}},
    // np.array([np.pi]).reshape(1, 1, 1, 1)
    {"f8", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 1, 1), }", "182d4454fb210940", DType::Float64,
     {1, 1, 1, 1}},
    // np.array([-7, 2**31 - 1], dtype='<i4')
    {"i4", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", "f9ffffffffffff7f", DType::Int32, {2}},
};

TEST(NpyLoad, FilesAsNumpyWritesThem) {
  for (const auto& c : kNumpyCases) {
    SCOPED_TRACE(c.name);
    const std::string path = tmp_path(std::string(c.name) + ".npy");
    write_bytes(path, npy_file(c.major, c.dict, from_hex(c.data_hex)));
    Array a = opbridge::npy::load(path);
    EXPECT_EQ(a.dtype, c.dtype);
    EXPECT_EQ(a.shape, c.shape);
    EXPECT_EQ(std::string(a.data.begin(), a.data.end()), from_hex(c.data_hex));
  }
}

TEST(NpyLoad, DecodedValues) {
  // The bytes above mean what NumPy meant: spot-check a few through the C++ types.
  const std::string f4 = tmp_path("values_f4.npy"), f8 = tmp_path("values_f8.npy"), i8 = tmp_path("values_i8.npy");
  write_bytes(f4, npy_file(1, kNumpyCases[0].dict, from_hex(kNumpyCases[0].data_hex)));
  write_bytes(f8, npy_file(1, kNumpyCases[7].dict, from_hex(kNumpyCases[7].data_hex)));
  write_bytes(i8, npy_file(2, kNumpyCases[1].dict, from_hex(kNumpyCases[1].data_hex)));
  Array a = opbridge::npy::load(f4), b = opbridge::npy::load(f8), c = opbridge::npy::load(i8);
  float fv[6];
  std::memcpy(fv, a.data.data(), sizeof fv);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(fv[i], static_cast<float>(i));
  double dv;
  std::memcpy(&dv, b.data.data(), sizeof dv);
  EXPECT_EQ(dv, 3.141592653589793);
  int64_t iv;
  std::memcpy(&iv, c.data.data(), sizeof iv);
  EXPECT_EQ(iv, -7);
}

TEST(NpySave, WritesTheLayoutNumpyReads) {
  const float v[6] = {0, 1, 2, 3, 4, 5};
  const std::string path = tmp_path("saved_f4.npy");
  opbridge::npy::save(path, DType::Float32, {2, 3}, v);
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  ASSERT_EQ(bytes.size(), 10 + header_len + sizeof v);
  EXPECT_EQ((10 + header_len) % 64, 0u);  // the data starts aligned, as NumPy arranges it
  const std::string header = bytes.substr(10, header_len);
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_EQ(header.substr(0, dict.size()), dict);
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(header.find_first_not_of(' ', dict.size()), header.size() - 1);
  EXPECT_EQ(bytes.substr(10 + header_len), from_hex(kNumpyCases[0].data_hex));
}

TEST(NpySave, ShapeSpellingForZeroAndOneDims) {
  const double x = 2.5;
  opbridge::npy::save(tmp_path("scalar.npy"), DType::Float64, {}, &x);
  opbridge::npy::save(tmp_path("vector.npy"), DType::Float64, {1}, &x);
  EXPECT_NE(read_bytes(tmp_path("scalar.npy")).find("'shape': (), }"), std::string::npos);
  EXPECT_NE(read_bytes(tmp_path("vector.npy")).find("'shape': (1,), }"), std::string::npos);
}

TEST(NpyRoundTrip, EveryDTypeAndRank) {
  const DType types[] = {DType::Bool,   DType::Int8,   DType::UInt8,  DType::Int16,   DType::UInt16,  DType::Int32,
                         DType::UInt32, DType::Int64,  DType::UInt64, DType::Float16, DType::Float32, DType::Float64};
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {7}, {2, 0, 3}, {3, 4}, {2, 3, 1, 2, 2}};
  std::mt19937 gen(42);
  for (DType t : types) {
    for (const auto& shape : shapes) {
      SCOPED_TRACE(std::string(opbridge::npy::type_name(t)) + " rank " + std::to_string(shape.size()));
      Array a;
      a.dtype = t;
      a.shape = shape;
      a.data.resize(static_cast<size_t>(a.numel()) * opbridge::npy::itemsize(t));
      for (auto& b : a.data) b = static_cast<unsigned char>(t == DType::Bool ? gen() % 2 : gen() % 256);
      const std::string path = tmp_path("roundtrip.npy");
      opbridge::npy::save(path, a);
      const std::string bytes = read_bytes(path);
      EXPECT_NE(bytes.find(std::string("'descr': '") + opbridge::npy::descr(t) + "'"), std::string::npos);
      Array b = opbridge::npy::load(path);
      EXPECT_EQ(b.dtype, a.dtype);
      EXPECT_EQ(b.shape, a.shape);
      EXPECT_EQ(b.data, a.data);
    }
  }
}

TEST(NpyRoundTrip, HeaderBeyond64KiBUsesVersion2) {
  const std::vector<int64_t> shape(30000, 1);  // "(1, 1, ...)": about 90 kB of header
  const int32_t v = 12345;
  const std::string path = tmp_path("long_header.npy");
  opbridge::npy::save(path, DType::Int32, shape, &v);
  EXPECT_EQ(read_bytes(path)[6], 2);
  Array a = opbridge::npy::load(path);
  EXPECT_EQ(a.shape, shape);
  int32_t got;
  std::memcpy(&got, a.data.data(), sizeof got);
  EXPECT_EQ(got, v);
}

TEST(NpyLoad, LegacyLongIntegersInShape) {
  // NumPy under Python 2 wrote shapes as (2L, 3L).
  const std::string path = tmp_path("long_ints.npy");
  write_bytes(path, npy_file(1, "{'descr': '<i2', 'fortran_order': False, 'shape': (2L, 1L), }", from_hex("01000200")));
  EXPECT_EQ(opbridge::npy::load(path).shape, (std::vector<int64_t>{2, 1}));
}

struct Malformed {
  const char* name;
  std::string bytes;
  const char* reason;
};

std::string dict_with(const std::string& descr, const std::string& fortran, const std::string& shape) {
  return "{'descr': " + descr + ", 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

TEST(NpyLoad, MalformedFilesAreRejectedNamingFileAndReason) {
  const std::string f4x2 = from_hex("0000803f00000040");
  const std::string good = npy_file(1, dict_with("'<f4'", "False", "(2,)"), f4x2);
  const std::vector<Malformed> cases = {
      {"empty", "", "too short"},
      {"bad_magic", "\x93NUMPX" + good.substr(6), "bad magic"},
      {"text_file", "hello, world, not an array", "bad magic"},
      {"version_4", good.substr(0, 6) + "\x04" + good.substr(7), "unsupported .npy version 4.0"},
      {"version_1_1", good.substr(0, 7) + "\x01" + good.substr(8), "unsupported .npy version 1.1"},
      {"no_header_length", good.substr(0, 9), "truncated header"},
      {"header_cut", good.substr(0, 40), "truncated header"},
      {"not_a_dict", npy_file(1, "[1, 2, 3]", f4x2), "malformed header"},
      {"no_shape", npy_file(1, "{'descr': '<f4', 'fortran_order': False, }", f4x2), "no 'shape'"},
      {"no_descr", npy_file(1, "{'fortran_order': False, 'shape': (2,), }", f4x2), "no 'descr'"},
      {"extra_key", npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1, }", f4x2),
       "unexpected key 'x'"},
      {"duplicate_key", npy_file(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f4x2),
       "appears twice"},
      {"text_after_dict", npy_file(1, dict_with("'<f4'", "False", "(2,)") + " x", f4x2), "unexpected text after"},
      {"fortran_order", npy_file(1, dict_with("'<f4'", "True", "(2,)"), f4x2), "fortran_order is True"},
      {"fortran_not_bool", npy_file(1, dict_with("'<f4'", "0", "(2,)"), f4x2), "not True or False"},
      {"big_endian", npy_file(1, dict_with("'>f4'", "False", "(2,)"), f4x2), "big-endian dtype '>f4'"},
      {"complex", npy_file(1, dict_with("'<c8'", "False", "(1,)"), f4x2), "unsupported dtype '<c8'"},
      {"unicode", npy_file(1, dict_with("'<U2'", "False", "(1,)"), f4x2), "unsupported dtype '<U2'"},
      {"object", npy_file(1, dict_with("'|O'", "False", "(1,)"), f4x2), "unsupported dtype '|O'"},
      {"odd_size", npy_file(1, dict_with("'<f3'", "False", "(1,)"), f4x2), "unsupported dtype '<f3'"},
      {"native_order", npy_file(1, dict_with("'=f4'", "False", "(2,)"), f4x2), "byte order"},
      {"structured", npy_file(1, dict_with("[('a', '<f4')]", "False", "(2,)"), f4x2), "structured"},
      {"negative_dim", npy_file(1, dict_with("'<f4'", "False", "(-2,)"), f4x2), "negative dimension"},
      {"float_dim", npy_file(1, dict_with("'<f4'", "False", "(2.0,)"), f4x2), "expected ','"},
      {"word_dim", npy_file(1, dict_with("'<f4'", "False", "('a',)"), f4x2), "not a tuple of integers"},
      {"shape_list", npy_file(1, dict_with("'<f4'", "False", "[2]"), f4x2), "expected '('"},
      {"huge_dim", npy_file(1, dict_with("'<f4'", "False", "(99999999999999999999,)"), f4x2), "too large"},
      {"overflow", npy_file(1, dict_with("'<f4'", "False", "(4611686018427387904, 4)"), f4x2), "overflows"},
      {"truncated_data", npy_file(1, dict_with("'<f4'", "False", "(3,)"), f4x2), "truncated data"},
      {"trailing_bytes", npy_file(1, dict_with("'<f4'", "False", "(1,)"), f4x2), "4 unexpected bytes"},
      {"unterminated", npy_file(1, "{'descr: False", f4x2), "unterminated string"},
      // Bytes that are not printable ASCII are quoted as \xNN, never echoed raw.
      {"non_utf8_key", npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), '\xff\xfe\x1b': 1, }", f4x2),
       "unexpected key '\\xff\\xfe\\x1b'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = tmp_path(std::string("bad_") + c.name + ".npy");
    write_bytes(path, c.bytes);
    const std::string msg = load_error(path);
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.reason), std::string::npos) << msg;
  }
}

TEST(NpyLoad, MissingFile) {
  const std::string path = tmp_path("does_not_exist.npy");
  EXPECT_EQ(load_error(path), path + ": cannot open: No such file or directory");
}

TEST(NpyLoad, Directory) {
  const std::string path = tmp_path("a_directory.npy");
  fs::create_directories(path);
  EXPECT_EQ(load_error(path), path + ": not a regular file");
}

TEST(NpySave, UnwritablePathNamesTheFile) {
  const std::string path = tmp_path("no_such_dir/x.npy");
  const float v = 1;
  try {
    opbridge::npy::save(path, DType::Float32, {1}, &v);
    FAIL() << "saved";
  } catch (const opbridge::npy::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ": cannot open for writing", 0), 0u) << e.what();
  }
}

}  // namespace
