// opbridge-run driven as a subprocess: runs on the demo model checked against a naive loop,
// random inputs of every element type, and every kind of bad input answered by exactly one
// "opbridge-run: error:" line on stderr and a non-zero exit (never a signal).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "npy.h"

namespace fs = std::filesystem;
using opbridge::npy::Array;
using opbridge::npy::DType;

namespace {

constexpr int64_t kFeatures = 8;
constexpr float kAlpha = 0.5f;  // the demo model's dual_residual alpha

const std::string kDemo = std::string(OPBRIDGE_DEMO_MODELS) + "/demo_dynamo.onnx";
const std::string kModels = OPBRIDGE_RUN_TEST_MODELS;

// One folder per test process: CTest runs the tests of this file in parallel.
std::string tmp(const std::string& name) {
  const fs::path dir = fs::path(OPBRIDGE_TEST_TMP) / ("pid" + std::to_string(getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct Result {
  int exit_code = -1;
  int signal = 0;
  std::string out, err;
};

Result run_tool(const std::vector<std::string>& args) {
  const std::string out_file = tmp("stdout.txt"), err_file = tmp("stderr.txt");
  std::vector<std::string> argv_s = {OPBRIDGE_RUN};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* o = std::freopen(out_file.c_str(), "w", stdout);
    FILE* e = std::freopen(err_file.c_str(), "w", stderr);
    if (!o || !e) _exit(127);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  Result r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = slurp(out_file);
  r.err = slurp(err_file);
  return r;
}

std::string describe(const Result& r) {
  return "exit " + std::to_string(r.exit_code) + ", signal " + std::to_string(r.signal) + "\nstdout:\n" + r.out +
         "\nstderr:\n" + r.err;
}

// Exactly one line on stderr, "opbridge-run: error: ...", containing `reason`.
void expect_error(const std::vector<std::string>& args, const std::string& reason, int exit_code = 1) {
  std::string joined;
  for (const auto& a : args) joined += " " + a;
  SCOPED_TRACE("opbridge-run" + joined);
  const Result r = run_tool(args);
  EXPECT_EQ(r.signal, 0) << describe(r);
  EXPECT_EQ(r.exit_code, exit_code) << describe(r);
  EXPECT_EQ(r.err.rfind("opbridge-run: error: ", 0), 0u) << describe(r);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << describe(r);
  EXPECT_EQ(r.err.back(), '\n') << describe(r);
  EXPECT_NE(r.err.find(reason), std::string::npos) << "expected '" << reason << "'\n" << describe(r);
}

void save_floats(const std::string& path, const std::vector<int64_t>& shape, const std::vector<float>& v) {
  opbridge::npy::save(path, DType::Float32, shape, v.data());
}

std::vector<float> floats(const Array& a) {
  std::vector<float> v(static_cast<size_t>(a.numel()));
  std::memcpy(v.data(), a.data.data(), a.data.size());
  return v;
}

// ---- runs ---------------------------------------------------------------------------------

TEST(OpbridgeRun, HelpHasUsageAndExample) {
  const Result r = run_tool({"--help"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("Usage: opbridge-run MODEL.onnx"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Example:\n  opbridge-run model.onnx --input x=x.npy"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(OpbridgeRun, ShortHelpIsTheSameAndListsEveryOption) {
  const Result r = run_tool({"-h"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, run_tool({"--help"}).out);
  for (const char* option : {"--input NAME=FILE.npy", "--random", "--seed N", "--dim NAME=VALUE", "--warmup N",
                             "--repeat N", "--threads N", "--output-dir DIR", "--times FILE.npy", "--library PATH",
                             "--no-default-library", "-h,--help"})
    EXPECT_NE(r.out.find(std::string("\n  ") + option + " "), std::string::npos) << option << "\n" << r.out;
}

// The help's library places, which depend on where the tool is, as "...".
std::string without_library_places(std::string help) {
  const std::string from = "(looked up at: ";
  const size_t start = help.find(from);
  const size_t end = start == std::string::npos ? start : help.find(")\n", start);
  if (end == std::string::npos) return help;
  return help.replace(start + from.size(), end - start - from.size(), "...");
}

TEST(OpbridgeRun, HelpIsTheDocumentedUsage) {
  const std::string doc = slurp(OPBRIDGE_RUN_DOC), fence = "```\n";
  const size_t start = doc.find(fence + "Usage: opbridge-run");
  ASSERT_NE(start, std::string::npos) << "no usage block in " << OPBRIDGE_RUN_DOC;
  const size_t end = doc.find(fence, start + fence.size());
  ASSERT_NE(end, std::string::npos);
  const std::string documented = doc.substr(start + fence.size(), end - start - fence.size());
  EXPECT_EQ(without_library_places(documented), without_library_places(run_tool({"--help"}).out));
}

TEST(OpbridgeRun, IntegersAreDecimalAndARepeatedOptionsLastValueCounts) {
  const Result r = run_tool({kDemo, "--random", "--repeat", "3", "--repeat=010", "--warmup", "0"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("(10 timed runs after 0 warmup)"), std::string::npos) << r.out;
}

TEST(OpbridgeRun, DemoModelFromNpyMatchesNaiveLoop) {
  for (const char* exporter : {"dynamo", "torchscript"}) {
    SCOPED_TRACE(exporter);
    const int64_t batch = 3;
    std::vector<float> x(batch * kFeatures), y(batch * kFeatures);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = std::sin(0.37f * i);
      y[i] = std::cos(0.11f * i) - 0.25f;
    }
    save_floats(tmp("x.npy"), {batch, kFeatures}, x);
    save_floats(tmp("y.npy"), {batch, kFeatures}, y);
    const std::string out_dir = tmp(std::string("out_") + exporter);
    fs::remove_all(out_dir);
    const Result r = run_tool({std::string(OPBRIDGE_DEMO_MODELS) + "/demo_" + exporter + ".onnx", "--input",
                               "x=" + tmp("x.npy"), "--input=y=" + tmp("y.npy"), "--threads", "1", "--repeat", "5",
                               "--output-dir", out_dir});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_TRUE(r.err.empty()) << r.err;
    EXPECT_NE(r.out.find("batch=3 (from " + tmp("x.npy") + ")"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("threads     1 intra-op"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("libopbridge_ort.so"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(5 timed runs after 1 warmup)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("runs/s"), std::string::npos) << r.out;

    const Array o0 = opbridge::npy::load(out_dir + "/out0.npy"), o1 = opbridge::npy::load(out_dir + "/out1.npy");
    ASSERT_EQ(o0.dtype, DType::Float32);
    ASSERT_EQ(o1.dtype, DType::Float32);
    ASSERT_EQ(o0.shape, (std::vector<int64_t>{batch, kFeatures}));
    ASSERT_EQ(o1.shape, (std::vector<int64_t>{batch, kFeatures}));
    const auto v0 = floats(o0), v1 = floats(o1);
    for (size_t i = 0; i < x.size(); ++i) {
      const float s = 2.0f * x[i] + y[i];
      EXPECT_NEAR(v0[i], std::asinh(s * kAlpha - y[i]), 1e-6f) << i;
      EXPECT_EQ(v1[i], y[i] * kAlpha - s) << i;
    }
  }
}

TEST(OpbridgeRun, RandomInputsDefaultTheBatchToOneAndSayItOnce) {
  const std::string out_dir = tmp("out_random_default");
  const Result r = run_tool({kDemo, "--random", "--warmup", "0", "--repeat", "1", "--output-dir", out_dir});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("batch=1 (default; set it with --dim batch=N)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("batch=1", r.out.find("batch=1") + 1), std::string::npos) << r.out;
  EXPECT_EQ(opbridge::npy::load(out_dir + "/out0.npy").shape, (std::vector<int64_t>{1, kFeatures}));
}

TEST(OpbridgeRun, RandomIsSeeded) {
  auto out1 = [&](const std::string& seed, const std::string& dir) {
    const Result r = run_tool({kDemo, "--random", "--dim", "batch=4", "--seed", seed, "--output-dir", tmp(dir)});
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    return opbridge::npy::load(tmp(dir) + "/out1.npy").data;
  };
  const auto a = out1("7", "seed_a"), b = out1("7", "seed_b"), c = out1("8", "seed_c");
  EXPECT_EQ(a.size(), 4 * kFeatures * sizeof(float));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(OpbridgeRun, RandomInputsOfEveryElementType) {
  const std::string out_dir = tmp("out_all_types");
  fs::remove_all(out_dir);
  const Result r = run_tool({kModels + "/all_types.onnx", "--random", "--dim", "n=5", "--output-dir", out_dir});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("n=5 (from --dim)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("axis 0 of 'unnamed' is dynamic and unnamed: 1"), std::string::npos) << r.out;
  const std::pair<const char*, DType> types[] = {
      {"bool", DType::Bool},     {"int8", DType::Int8},       {"uint8", DType::UInt8},     {"int16", DType::Int16},
      {"uint16", DType::UInt16}, {"int32", DType::Int32},     {"uint32", DType::UInt32},   {"int64", DType::Int64},
      {"uint64", DType::UInt64}, {"float16", DType::Float16}, {"float32", DType::Float32}, {"float64", DType::Float64}};
  for (const auto& [name, dtype] : types) {
    SCOPED_TRACE(name);
    // The output "out/float32" is written as out_float32.npy: '/' cannot be in a file name.
    const Array a = opbridge::npy::load(out_dir + "/out_" + name + ".npy");
    ASSERT_EQ(a.dtype, dtype);
    ASSERT_EQ(a.shape, (std::vector<int64_t>{5, 3}));
    for (int64_t i = 0; i < a.numel(); ++i) {
      const unsigned char* p = a.data.data() + i * opbridge::npy::itemsize(dtype);
      double v = 0;
      switch (dtype) {
        case DType::Bool: v = *p; EXPECT_LE(*p, 1); break;
        case DType::Int8: v = *reinterpret_cast<const int8_t*>(p); break;
        case DType::UInt8: v = *p; break;
        case DType::Int16: v = *reinterpret_cast<const int16_t*>(p); break;
        case DType::UInt16: v = *reinterpret_cast<const uint16_t*>(p); break;
        case DType::Int32: v = *reinterpret_cast<const int32_t*>(p); break;
        case DType::UInt32: v = *reinterpret_cast<const uint32_t*>(p); break;
        case DType::Int64: v = static_cast<double>(*reinterpret_cast<const int64_t*>(p)); break;
        case DType::UInt64: v = static_cast<double>(*reinterpret_cast<const uint64_t*>(p)); break;
        case DType::Float16: {
          // IEEE half: sign, 5-bit exponent, 10-bit mantissa; |v| < 1 here, so no inf/nan.
          const uint16_t h = static_cast<uint16_t>(p[0] | (p[1] << 8));
          const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
          v = (e ? std::ldexp(1024 + m, e - 25) : std::ldexp(m, -24)) * ((h & 0x8000) ? -1 : 1);
          break;
        }
        case DType::Float32: v = *reinterpret_cast<const float*>(p); break;
        case DType::Float64: v = *reinterpret_cast<const double*>(p); break;
      }
      const bool is_float = dtype == DType::Float16 || dtype == DType::Float32 || dtype == DType::Float64;
      if (is_float) {
        EXPECT_GE(v, -1.0);
        EXPECT_LT(v, 1.0);
      } else {
        EXPECT_GE(v, 0.0);
        EXPECT_LE(v, 9.0);
        EXPECT_EQ(v, std::floor(v));
      }
    }
  }
  const Array scalar = opbridge::npy::load(out_dir + "/out_scalar.npy");
  EXPECT_EQ(scalar.dtype, DType::Float64);
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(opbridge::npy::load(out_dir + "/out_unnamed.npy").shape, (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(fs::exists(out_dir + "/out"));
}

TEST(OpbridgeRun, TimesFileHoldsEveryTimedRun) {
  const std::string times = tmp("times.npy");
  const Result r = run_tool({kDemo, "--random", "--repeat", "7", "--times", times});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const Array a = opbridge::npy::load(times);
  ASSERT_EQ(a.dtype, DType::Float64);
  ASSERT_EQ(a.shape, (std::vector<int64_t>{7}));
  std::vector<double> t(7);
  std::memcpy(t.data(), a.data.data(), a.data.size());
  for (double v : t) EXPECT_GT(v, 0);
  // The printed minimum is the file's.
  char min[64];
  std::snprintf(min, sizeof min, "min %.4f ms", *std::min_element(t.begin(), t.end()));
  EXPECT_NE(r.out.find(min), std::string::npos) << min << "\n" << r.out;
}

TEST(OpbridgeRun, LibraryOverridesOrRepeatsTheDefault) {
  // --no-default-library + --library: the given library alone; the default given again: once.
  Result r = run_tool({kDemo, "--random", "--no-default-library", "--library", OPBRIDGE_ORT_LIBRARY});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("libraries   " + fs::canonical(OPBRIDGE_ORT_LIBRARY).string() + "\n"), std::string::npos) << r.out;
  r = run_tool({kDemo, "--random", "--library", OPBRIDGE_ORT_LIBRARY});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("libraries   " + fs::canonical(OPBRIDGE_ORT_LIBRARY).string() + "\nthreads"), std::string::npos)
      << r.out;
}

TEST(OpbridgeRun, EmptyInputsRun) {
  const std::string out_dir = tmp("out_empty");
  const Result r = run_tool({kDemo, "--random", "--dim", "batch=0", "--output-dir", out_dir});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(opbridge::npy::load(out_dir + "/out0.npy").shape, (std::vector<int64_t>{0, kFeatures}));
}

// ---- errors -------------------------------------------------------------------------------

TEST(OpbridgeRunErrors, BadCommandLines) {
  expect_error({}, "no model given", 2);
  expect_error({kDemo, "--bogus"}, "unknown option '--bogus'", 2);
  expect_error({kDemo, "-x"}, "unknown option '-x'", 2);
  expect_error({kDemo, "--repeat"}, "--repeat needs a value", 2);
  expect_error({kDemo, "--repeat", "0"}, "--repeat: 0 is out of range", 2);
  expect_error({kDemo, "--repeat", "ten"}, "--repeat: 'ten' is not an integer", 2);
  expect_error({kDemo, "--warmup", "-1"}, "--warmup: -1 is out of range", 2);
  expect_error({kDemo, "--threads", "0"}, "--threads: 0 is out of range", 2);
  expect_error({kDemo, "--threads", "2x"}, "--threads: '2x' is not an integer", 2);
  expect_error({kDemo, "--seed", "99999999999999999999999"}, "--seed: '99999999999999999999999' is not an integer", 2);
  expect_error({kDemo, "--input", "x.npy"}, "--input: expected NAME=FILE.npy, got 'x.npy'", 2);
  expect_error({kDemo, "--input", "x="}, "expected NAME=FILE.npy", 2);
  expect_error({kDemo, "--dim", "batch"}, "--dim: expected NAME=VALUE", 2);
  expect_error({kDemo, "--dim", "batch=-2"}, "--dim batch: -2 is out of range", 2);
  expect_error({kDemo, "--random=yes"}, "--random takes no value", 2);
  expect_error({kDemo, kDemo}, "more than one model given", 2);
  expect_error({kDemo, "--input", "x=a.npy", "--input", "x=b.npy"}, "--input x is given twice", 2);
  expect_error({kDemo, "--random", "--dim", "batch=2", "--dim", "batch=3"}, "--dim batch is given twice", 2);
  expect_error({kDemo, "--random", "--dim", "size=2"}, "--dim size: the model has no symbolic dimension 'size' (it has: batch)", 2);
}

TEST(OpbridgeRunErrors, MoreBadCommandLines) {
  expect_error({kDemo, "--bogus=3"}, "unknown option '--bogus' (see --help)", 2);
  expect_error({"-5", kDemo}, "unknown option '-5'", 2);
  expect_error({kDemo, "--repeat="}, "--repeat needs a value", 2);
  expect_error({kDemo, "--repeat", "0x10"}, "--repeat: '0x10' is not an integer", 2);
  expect_error({kDemo, "--no-default-library=no"}, "--no-default-library takes no value", 2);
  expect_error({kDemo, "--help=1"}, "--help takes no value", 2);
  expect_error({kDemo, "--random=yes", "--repeat"}, "--random takes no value", 2);
  expect_error({kDemo, "--dim=batch"}, "--dim: expected NAME=VALUE, got 'batch'", 2);
  // An option takes one value: a second one is a second model.
  expect_error({kDemo, "--input", "x=a.npy", "b.onnx"}, "more than one model given", 2);
}

TEST(OpbridgeRunErrors, BadModels) {
  expect_error({tmp("no_such_model.onnx"), "--random"}, "no_such_model.onnx: no such file");
  expect_error({OPBRIDGE_TEST_TMP, "--random"}, "not a regular file");
  std::ofstream(tmp("garbage.onnx")) << "this is not a protobuf";
  expect_error({tmp("garbage.onnx"), "--random"}, "cannot load model " + tmp("garbage.onnx") + ": ");
  expect_error({kModels + "/unknown_op.onnx", "--random"}, "NoSuchOp");
  expect_error({kModels + "/string_input.onnx", "--random"}, "model input 's' has element type string, which opbridge-run cannot feed");
}

TEST(OpbridgeRunErrors, CustomOpLibraries) {
  // Without the op library the demo model's custom ops have no implementation.
  expect_error({kDemo, "--random", "--no-default-library"},
               "cannot load model " + kDemo + ": the model has opbridge::");
  expect_error({kDemo, "--random", "--no-default-library"},
               "(no custom-op library was registered): pass the ONNX Runtime library of ONNX domain 'opbridge' with "
               "--library path/lib<name>_ort.so; ONNX Runtime said: ");
  expect_error({kDemo, "--random", "--library", tmp("libnothing.so")}, "--library " + tmp("libnothing.so") + ": no such file");
  // Told by what the file exports, before ONNX Runtime tries to load it.
  expect_error({kDemo, "--random", "--library", kDemo},
               "--library " + kDemo + ": not an ONNX Runtime custom-op library: it is not an ELF shared library");
  expect_error({kDemo, "--random", "--library", OPBRIDGE_RUN},
               std::string("--library ") + OPBRIDGE_RUN +
                   ": not an ONNX Runtime custom-op library (it does not export RegisterCustomOps)");
}

TEST(OpbridgeRunErrors, ThePyTorchLibraryNamesItsOnnxRuntimeSibling) {
  const std::string ort = OPBRIDGE_ORT_LIBRARY;
  const std::string torch = ort.substr(0, ort.size() - 7) + "_torch.so";  // lib<x>_ort.so -> lib<x>_torch.so
  if (!fs::exists(torch)) GTEST_SKIP() << torch << " is not built (OPBRIDGE_WITH_TORCH=OFF)";
  expect_error({kDemo, "--random", "--library", torch},
               "--library " + torch + ": " + fs::path(torch).filename().string() +
                   " is the PyTorch library of an op library (it exports opbridge_manifest_json, not "
                   "RegisterCustomOps): pass its ONNX Runtime library, " + ort);
  // Under another name it is still told by its symbols; the sibling is then named by pattern.
  const std::string renamed = tmp("renamed.so");
  fs::copy_file(torch, renamed, fs::copy_options::overwrite_existing);
  expect_error({kDemo, "--random", "--library", renamed},
               "renamed.so is the PyTorch library of an op library (it exports opbridge_manifest_json, not "
               "RegisterCustomOps): pass its ONNX Runtime library, lib<name>_ort.so, built beside it");
}

TEST(OpbridgeRunErrors, AForeignDomainIsNamedWithItsOps) {
  expect_error({kModels + "/foreign_domain.onnx", "--random"},
               "the model has com.acme::Mystery, com.acme::Deep nodes, and no registered custom-op library implements "
               "com.acme::");
  expect_error({kModels + "/foreign_domain.onnx", "--random"},
               ": pass the ONNX Runtime library of ONNX domain 'com.acme' with --library path/lib<name>_ort.so; ONNX "
               "Runtime said: ");
  expect_error({kModels + "/foreign_domain.onnx", "--random"}, "is not a registered function/op");
}

TEST(OpbridgeRunErrors, InputsThatDoNotFitTheModel) {
  const int64_t b = 2;
  save_floats(tmp("x2.npy"), {b, kFeatures}, std::vector<float>(b * kFeatures, 1.f));
  save_floats(tmp("y3.npy"), {3, kFeatures}, std::vector<float>(3 * kFeatures, 1.f));
  save_floats(tmp("rank1.npy"), {kFeatures}, std::vector<float>(kFeatures, 1.f));
  save_floats(tmp("width7.npy"), {b, 7}, std::vector<float>(b * 7, 1.f));
  const std::vector<double> d(b * kFeatures, 1.0);
  opbridge::npy::save(tmp("f8.npy"), DType::Float64, {b, kFeatures}, d.data());
  std::ofstream(tmp("not_npy.npy")) << "x,y\n1,2\n";

  const std::string x2 = "x=" + tmp("x2.npy");
  expect_error({kDemo, "--input", x2}, "model input 'y' has no data: pass --input y=FILE.npy or --random");
  expect_error({kDemo, "--input", "z=" + tmp("x2.npy")}, "--input z: the model has no input 'z' (its inputs: x, y)");
  expect_error({kDemo, "--input", "x=" + tmp("missing.npy"), "--random"}, "--input x: " + tmp("missing.npy") + ": cannot open");
  expect_error({kDemo, "--input", "x=" + tmp("not_npy.npy"), "--random"}, "--input x: " + tmp("not_npy.npy") + ": not a .npy file");
  expect_error({kDemo, "--input", "x=" + tmp("f8.npy"), "--random"}, "holds float64, the model input is float32");
  expect_error({kDemo, "--input", "x=" + tmp("rank1.npy"), "--random"}, "has shape [8] (rank 1), the model input has rank 2");
  expect_error({kDemo, "--input", "x=" + tmp("width7.npy"), "--random"}, "has shape [2, 7], the model input needs 8 in axis 1");
  expect_error({kDemo, "--input", x2, "--input", "y=" + tmp("y3.npy")}, "has 3 in axis 0 ('batch'), but " + tmp("x2.npy") + " gives batch=2");
  expect_error({kDemo, "--input", x2, "--random", "--dim", "batch=5"}, "but --dim gives batch=5");
}

TEST(OpbridgeRunErrors, KernelErrorAtRunTime) {
  expect_error({kModels + "/my_add_two_dims.onnx", "--random", "--dim", "a=2", "--dim", "b=3"}, "run failed: ");
  expect_error({kModels + "/my_add_two_dims.onnx", "--random", "--dim", "a=2", "--dim", "b=3"}, "cannot be broadcast");
}

TEST(OpbridgeRunErrors, OutputDirectoryThatCannotBeCreated) {
  std::ofstream(tmp("a_file")) << "x";
  expect_error({kDemo, "--random", "--output-dir", tmp("a_file") + "/sub"}, "--output-dir " + tmp("a_file") + "/sub: cannot create");
}

}  // namespace
