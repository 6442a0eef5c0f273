// opbridge-run: runs an ONNX model with ONNX Runtime's C++ API and the opbridge custom-op
// library, without Python, and reports how fast. Inputs come from .npy files or are random;
// outputs can be written as .npy. Every failure is one "opbridge-run: error: ..." line on stderr
// and a non-zero exit (2 for a bad command line, 1 for everything else).
#include <onnxruntime_cxx_api.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "latency.h"
#include "npy.h"

namespace fs = std::filesystem;
using opbridge::npy::DType;

namespace {

constexpr const char* kDefaultLibrary = "libopbridge_ort.so";
constexpr int kRandomIntRange = 10;  // random integers are uniform in [0, kRandomIntRange)

// A bad command line (exit 2) versus a failure while doing the work (exit 1).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct RunError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// ONNX Runtime's messages can span lines; the tool's error is one line.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + "]";
}

// ---- the command line -------------------------------------------------------------------------

struct Options {
  std::string model;
  std::vector<std::pair<std::string, std::string>> inputs;  // name, .npy path
  bool random = false;
  uint64_t seed = 0;
  std::vector<std::pair<std::string, int64_t>> dims;
  int64_t repeat = 10, warmup = 1, threads = 0;
  std::string output_dir, times_file;
  std::vector<std::string> libraries;
  bool default_library = true;
  bool help = false;
};

int64_t parse_int(const std::string& opt, const std::string& v, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE) throw UsageError(cat(opt, ": '", v, "' is not an integer"));
  if (x < lo || x > hi) throw UsageError(cat(opt, ": ", x, " is out of range [", lo, ", ", hi, "]"));
  return x;
}

std::pair<std::string, std::string> split_pair(const std::string& opt, const std::string& v, const char* form) {
  const size_t eq = v.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
    throw UsageError(cat(opt, ": expected ", form, ", got '", v, "'"));
  return {v.substr(0, eq), v.substr(eq + 1)};
}

Options parse_args(int argc, char** argv) {
  Options o;
  const std::set<std::string> with_value = {"--input",   "--dim",     "--seed",       "--repeat",
                                            "--warmup",  "--threads", "--output-dir", "--library",
                                            "--times"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      bool inline_value = false;
      if (eq != std::string::npos) value = arg.substr(eq + 1), arg = arg.substr(0, eq), inline_value = true;
      if (with_value.count(arg)) {
        if (!inline_value) {
          if (i + 1 >= argc) throw UsageError(cat(arg, " needs a value"));
          value = argv[++i];
        }
      } else if (inline_value) {
        throw UsageError(cat(arg, " takes no value"));
      }
      if (arg == "--help") o.help = true;
      else if (arg == "--random") o.random = true;
      else if (arg == "--no-default-library") o.default_library = false;
      else if (arg == "--input") o.inputs.push_back(split_pair(arg, value, "NAME=FILE.npy"));
      else if (arg == "--dim") {
        auto [name, v] = split_pair(arg, value, "NAME=VALUE");
        o.dims.emplace_back(name, parse_int(cat("--dim ", name), v, 0, INT32_MAX));
      } else if (arg == "--seed") o.seed = static_cast<uint64_t>(parse_int(arg, value, 0, INT64_MAX));
      else if (arg == "--repeat") o.repeat = parse_int(arg, value, 1, 100000000);
      else if (arg == "--warmup") o.warmup = parse_int(arg, value, 0, 100000000);
      else if (arg == "--threads") o.threads = parse_int(arg, value, 1, 4096);
      else if (arg == "--output-dir") o.output_dir = value;
      else if (arg == "--times") o.times_file = value;
      else if (arg == "--library") o.libraries.push_back(value);
      else throw UsageError(cat("unknown option '", arg, "' (see --help)"));
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw UsageError(cat("unknown option '", arg, "' (see --help)"));
    } else if (o.model.empty()) {
      o.model = arg;
    } else {
      throw UsageError(cat("more than one model given ('", o.model, "' and '", arg, "')"));
    }
  }
  if (o.help) return o;
  if (o.model.empty()) throw UsageError("no model given (usage: opbridge-run MODEL.onnx [options]; see --help)");
  std::set<std::string> seen;
  for (const auto& [name, file] : o.inputs)
    if (!seen.insert(name).second) throw UsageError(cat("--input ", name, " is given twice"));
  seen.clear();
  for (const auto& [name, v] : o.dims)
    if (!seen.insert(name).second) throw UsageError(cat("--dim ", name, " is given twice"));
  return o;
}

// The custom-op library next to the installed executable ($ORIGIN/../lib), else the build tree's.
std::vector<std::string> default_library_candidates() {
  std::vector<std::string> c;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) c.push_back((exe.parent_path().parent_path() / "lib" / kDefaultLibrary).string());
#ifdef OPBRIDGE_BUILD_TREE_ORT_LIBRARY
  c.push_back(OPBRIDGE_BUILD_TREE_ORT_LIBRARY);
#endif
  return c;
}

void print_usage() {
  std::string where;
  for (const auto& c : default_library_candidates()) where += (where.empty() ? "" : ", else ") + c;
  std::cout <<
      R"(Usage: opbridge-run MODEL.onnx [options]

Runs an ONNX model with ONNX Runtime and the opbridge custom-op library, without Python, and
reports latency (min/median/p90/p99) and throughput.

Inputs (every model input needs data, from --input or --random):
  --input NAME=FILE.npy  feed model input NAME from a .npy file (repeatable)
  --random               generate the inputs not given by --input: floats uniform in [-1, 1),
                         integers uniform in [0, )" << kRandomIntRange - 1 << R"(], bools false/true
  --seed N               seed of --random (default 0)
  --dim NAME=VALUE       size of the symbolic dimension NAME (repeatable); a symbolic dimension
                         not set by --dim or a .npy input is 1, and so is an unnamed dynamic one
Running:
  --warmup N             untimed runs before timing (default 1)
  --repeat N             timed runs (default 10)
  --threads N            ONNX Runtime intra-op threads (default: ONNX Runtime's, one per core)
Output:
  --output-dir DIR       write each output of the last run to DIR/<output name>.npy
                         ('/' in a name becomes '_'); DIR is created if missing
  --times FILE.npy       write every timed run's latency in milliseconds (float64, in run order)
Custom-op libraries:
  --library PATH         also register this custom-op library (repeatable)
  --no-default-library   do not register the default )" << kDefaultLibrary << R"(
                         (looked up at: )" << where << R"()
  --help                 print this text

Example:
  opbridge-run model.onnx --input x=x.npy --random --dim batch=4 --threads 1 --repeat 100 --output-dir out

Exit status: 0 on success, 2 for a bad command line, 1 for any other error.
)";
}

// ---- element types ----------------------------------------------------------------------------

struct TypeMap {
  ONNXTensorElementDataType onnx;
  DType npy;
};
constexpr TypeMap kTypeMap[] = {
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, DType::Bool},       {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, DType::Int8},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, DType::UInt8},     {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16, DType::Int16},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16, DType::UInt16},   {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, DType::Int32},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32, DType::UInt32},   {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, DType::Int64},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64, DType::UInt64},   {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, DType::Float16},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, DType::Float32},   {ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, DType::Float64},
};

const DType* npy_type(ONNXTensorElementDataType t) {
  for (const auto& m : kTypeMap)
    if (m.onnx == t) return &m.npy;
  return nullptr;
}

std::string onnx_type_name(ONNXTensorElementDataType t) {
  if (const DType* d = npy_type(t)) return opbridge::npy::type_name(*d);
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING: return "string";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64: return "complex64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128: return "complex128";
    default: return cat("ONNX element type ", static_cast<int>(t));
  }
}

std::string onnx_kind_name(ONNXType t) {
  switch (t) {
    case ONNX_TYPE_TENSOR: return "tensor";
    case ONNX_TYPE_SEQUENCE: return "sequence";
    case ONNX_TYPE_MAP: return "map";
    case ONNX_TYPE_OPTIONAL: return "optional";
    case ONNX_TYPE_SPARSETENSOR: return "sparse tensor";
    default: return "non-tensor value";
  }
}

// ---- random data ------------------------------------------------------------------------------

// Uniform in [-1, 1) on a grid the type represents exactly (2^-(bits-1) steps), so rounding can
// never produce 1. mt19937_64 is fully specified, so a seed gives the same data everywhere.
double uniform_pm1(std::mt19937_64& g, int bits) {
  return std::ldexp(static_cast<double>(g() >> (64 - bits)), 1 - bits) - 1.0;
}

void fill_random(DType t, unsigned char* p, int64_t n, std::mt19937_64& g) {
  auto ints = [&](auto* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<std::remove_pointer_t<decltype(out)>>(g() % kRandomIntRange);
  };
  switch (t) {
    case DType::Bool:
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(g() >> 63);
      break;
    case DType::Int8: ints(reinterpret_cast<int8_t*>(p)); break;
    case DType::UInt8: ints(reinterpret_cast<uint8_t*>(p)); break;
    case DType::Int16: ints(reinterpret_cast<int16_t*>(p)); break;
    case DType::UInt16: ints(reinterpret_cast<uint16_t*>(p)); break;
    case DType::Int32: ints(reinterpret_cast<int32_t*>(p)); break;
    case DType::UInt32: ints(reinterpret_cast<uint32_t*>(p)); break;
    case DType::Int64: ints(reinterpret_cast<int64_t*>(p)); break;
    case DType::UInt64: ints(reinterpret_cast<uint64_t*>(p)); break;
    case DType::Float16: {
      auto* out = reinterpret_cast<Ort::Float16_t*>(p);
      for (int64_t i = 0; i < n; ++i) out[i] = Ort::Float16_t(static_cast<float>(uniform_pm1(g, 11)));
      break;
    }
    case DType::Float32: {
      auto* out = reinterpret_cast<float*>(p);
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(uniform_pm1(g, 24));
      break;
    }
    case DType::Float64: {
      auto* out = reinterpret_cast<double*>(p);
      for (int64_t i = 0; i < n; ++i) out[i] = uniform_pm1(g, 53);
      break;
    }
  }
}

// ---- the model's inputs -----------------------------------------------------------------------

struct ModelInput {
  std::string name;
  DType dtype = DType::Float32;
  std::vector<int64_t> dims;      // -1: dynamic
  std::vector<std::string> syms;  // the dynamic dims' names ("" when unnamed)
  // What is fed:
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;
  std::string source;
};

std::vector<ModelInput> describe_inputs(Ort::Session& session, Ort::AllocatorWithDefaultOptions& alloc) {
  std::vector<ModelInput> ins(session.GetInputCount());
  for (size_t i = 0; i < ins.size(); ++i) {
    ModelInput& in = ins[i];
    in.name = session.GetInputNameAllocated(i, alloc).get();
    Ort::TypeInfo info = session.GetInputTypeInfo(i);
    if (info.GetONNXType() != ONNX_TYPE_TENSOR)
      throw RunError(cat("model input '", in.name, "' is a ", onnx_kind_name(info.GetONNXType()),
                         "; opbridge-run feeds tensors only"));
    auto t = info.GetTensorTypeAndShapeInfo();
    const DType* d = npy_type(t.GetElementType());
    if (!d)
      throw RunError(cat("model input '", in.name, "' has element type ", onnx_type_name(t.GetElementType()),
                         ", which opbridge-run cannot feed"));
    in.dtype = *d;
    in.dims = t.GetShape();
    for (const char* s : t.GetSymbolicDimensions()) in.syms.emplace_back(s ? s : "");
    in.syms.resize(in.dims.size());
  }
  return ins;
}

std::string model_input_names(const std::vector<ModelInput>& ins) {
  std::string s;
  for (const auto& in : ins) s += (s.empty() ? "" : ", ") + in.name;
  return s.empty() ? "none" : s;
}

// Binds .npy files and random data to the model's inputs, resolving the symbolic dims: a name
// is one size throughout the model (ONNX's meaning of dim_param), so --dim and every .npy must
// agree on it. Returns the lines describing the dims for the summary.
std::vector<std::string> bind_inputs(std::vector<ModelInput>& ins, const Options& o) {
  struct Source {
    int64_t value;
    std::string from;
  };
  std::map<std::string, Source> sym;
  std::set<std::string> sym_names;
  for (const auto& in : ins)
    for (size_t k = 0; k < in.dims.size(); ++k)
      if (in.dims[k] < 0 && !in.syms[k].empty()) sym_names.insert(in.syms[k]);
  for (const auto& [name, v] : o.dims) {
    if (!sym_names.count(name)) {
      std::string have;
      for (const auto& s : sym_names) have += (have.empty() ? "" : ", ") + s;
      throw UsageError(cat("--dim ", name, ": the model has no symbolic dimension '", name, "' (it has: ",
                           have.empty() ? "none" : have, ")"));
    }
    sym[name] = {v, "--dim"};
  }

  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < ins.size(); ++i) by_name[ins[i].name] = i;
  for (const auto& [name, file] : o.inputs) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      throw RunError(cat("--input ", name, ": the model has no input '", name, "' (its inputs: ", model_input_names(ins), ")"));
    ModelInput& in = ins[it->second];
    opbridge::npy::Array a;
    try {
      a = opbridge::npy::load(file);
    } catch (const opbridge::npy::Error& e) {
      throw RunError(cat("--input ", name, ": ", e.what()));
    }
    if (a.dtype != in.dtype)
      throw RunError(cat("--input ", name, ": ", file, " holds ", opbridge::npy::type_name(a.dtype), ", the model input is ",
                         opbridge::npy::type_name(in.dtype)));
    // A model input without any shape information reads as rank 0 here; ONNX Runtime checks those.
    if (!in.dims.empty()) {
      if (a.shape.size() != in.dims.size())
        throw RunError(cat("--input ", name, ": ", file, " has shape ", shape_str(a.shape), " (rank ", a.shape.size(),
                           "), the model input has rank ", in.dims.size()));
      for (size_t k = 0; k < in.dims.size(); ++k) {
        if (in.dims[k] >= 0 && in.dims[k] != a.shape[k])
          throw RunError(cat("--input ", name, ": ", file, " has shape ", shape_str(a.shape), ", the model input needs ",
                             in.dims[k], " in axis ", k));
        if (in.dims[k] < 0 && !in.syms[k].empty()) {
          auto [pos, fresh] = sym.emplace(in.syms[k], Source{a.shape[k], file});
          if (!fresh && pos->second.value != a.shape[k])
            throw RunError(cat("--input ", name, ": ", file, " has ", a.shape[k], " in axis ", k, " ('", in.syms[k],
                               "'), but ", pos->second.from, " gives ", in.syms[k], "=", pos->second.value));
        }
      }
    }
    in.shape = a.shape;
    in.data = std::move(a.data);
    in.source = file;
  }

  std::vector<std::string> notes;
  std::set<std::string> defaulted;
  std::mt19937_64 gen(o.seed);
  for (auto& in : ins) {
    if (!in.source.empty()) continue;
    if (!o.random)
      throw RunError(cat("model input '", in.name, "' has no data: pass --input ", in.name, "=FILE.npy or --random"));
    in.shape = in.dims;
    for (size_t k = 0; k < in.dims.size(); ++k) {
      if (in.dims[k] >= 0) continue;
      if (in.syms[k].empty()) {
        in.shape[k] = 1;
        notes.push_back(cat("axis ", k, " of '", in.name, "' is dynamic and unnamed: 1 (feed a .npy to choose)"));
      } else {
        auto [pos, fresh] = sym.emplace(in.syms[k], Source{1, "default"});
        if (fresh) defaulted.insert(in.syms[k]);
        in.shape[k] = pos->second.value;
      }
    }
    const int64_t n = opbridge::npy::checked_numel(in.shape);
    const size_t item = opbridge::npy::itemsize(in.dtype);
    if (n < 0 || static_cast<uint64_t>(n) > SIZE_MAX / item)
      throw RunError(cat("input '", in.name, "' of shape ", shape_str(in.shape), " is too large"));
    try {
      in.data.resize(static_cast<size_t>(n) * item);
    } catch (const std::bad_alloc&) {
      throw RunError(cat("input '", in.name, "' of shape ", shape_str(in.shape), " needs ", static_cast<uint64_t>(n) * item,
                         " bytes: out of memory"));
    }
    fill_random(in.dtype, in.data.data(), n, gen);
    in.source = cat("random, seed ", o.seed);
  }
  std::vector<std::string> lines;
  for (const auto& [name, s] : sym)
    lines.push_back(defaulted.count(name) ? cat(name, "=1 (default; set it with --dim ", name, "=N)")
                                          : cat(name, "=", s.value, " (from ", s.from, ")"));
  lines.insert(lines.end(), notes.begin(), notes.end());
  return lines;
}

// ---- ONNX Runtime -----------------------------------------------------------------------------

// ONNX Runtime's warnings go to stderr as ours; its errors come back as statuses, which the tool
// reports itself in one line, so they are not logged twice.
void log_to_stderr(void*, OrtLoggingLevel severity, const char*, const char*, const char*, const char* message) {
  if (severity == ORT_LOGGING_LEVEL_WARNING) std::cerr << "opbridge-run: onnxruntime warning: " << one_line(message) << "\n";
}

std::string output_file_name(const std::string& name, size_t index) {
  std::string s = name.empty() ? cat("output", index) : name;
  for (char& c : s)
    if (c == '/') c = '_';
  if (s == "." || s == "..") s = cat("output", index);
  return s + ".npy";
}

int run(const Options& o) {
  std::error_code ec;
  if (!fs::exists(o.model, ec)) throw RunError(cat(o.model, ": no such file"));
  if (!fs::is_regular_file(o.model, ec)) throw RunError(cat(o.model, ": not a regular file"));

  std::vector<std::string> libraries;
  std::string default_missing;
  if (o.default_library) {
    for (const auto& c : default_library_candidates()) {
      if (fs::is_regular_file(c, ec)) {
        libraries.push_back(fs::canonical(c, ec).string());
        break;
      }
      default_missing += (default_missing.empty() ? "" : ", ") + c;
    }
    if (!libraries.empty()) default_missing.clear();
  }
  for (const auto& lib : o.libraries) {
    if (!fs::is_regular_file(lib, ec)) throw RunError(cat("--library ", lib, ": no such file"));
    const std::string path = fs::canonical(lib, ec).string();
    if (std::find(libraries.begin(), libraries.end(), path) == libraries.end()) libraries.push_back(path);
  }

  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "opbridge-run", log_to_stderr, nullptr);
  Ort::SessionOptions options;
  if (o.threads > 0) options.SetIntraOpNumThreads(static_cast<int>(o.threads));
  for (const auto& lib : libraries) {
    try {
      options.RegisterCustomOpsLibrary(lib.c_str());
    } catch (const Ort::Exception& e) {
      throw RunError(cat("cannot register custom-op library ", lib, ": ", one_line(e.what())));
    }
  }
  std::unique_ptr<Ort::Session> session;
  try {
    session = std::make_unique<Ort::Session>(env, o.model.c_str(), options);
  } catch (const Ort::Exception& e) {
    std::string hint;
    if (!default_missing.empty())
      hint = cat(" (", kDefaultLibrary, " was not found at ", default_missing, "; pass it with --library)");
    else if (libraries.empty())
      hint = " (no custom-op library was registered)";
    throw RunError(cat("cannot load model ", o.model, ": ", one_line(e.what()), hint));
  }

  Ort::AllocatorWithDefaultOptions alloc;
  std::vector<ModelInput> ins = describe_inputs(*session, alloc);
  const std::vector<std::string> dim_notes = bind_inputs(ins, o);

  std::vector<std::string> out_names;
  for (size_t i = 0; i < session->GetOutputCount(); ++i) out_names.emplace_back(session->GetOutputNameAllocated(i, alloc).get());
  std::vector<std::string> out_files;
  if (!o.output_dir.empty()) {
    fs::create_directories(o.output_dir, ec);
    if (!fs::is_directory(o.output_dir))
      throw RunError(cat("--output-dir ", o.output_dir, ": cannot create the directory", ec ? ": " + ec.message() : ""));
    std::set<std::string> taken;
    for (size_t i = 0; i < out_names.size(); ++i) {
      out_files.push_back((fs::path(o.output_dir) / output_file_name(out_names[i], i)).string());
      if (!taken.insert(out_files.back()).second)
        throw RunError(cat("outputs '", out_names[i], "' and another output would both be written to ", out_files.back()));
    }
  }

  // The summary so far: what runs, with what.
  size_t w = 4;
  for (const auto& in : ins) w = std::max(w, in.name.size());
  for (const auto& n : out_names) w = std::max(w, n.size());
  auto pad = [](std::string s, size_t n) { return s.size() < n ? s + std::string(n - s.size(), ' ') : s; };
  std::cout << "model       " << o.model << "\n";
  std::cout << "libraries   ";
  for (size_t k = 0; k < libraries.size(); ++k) std::cout << (k ? "\n            " : "") << libraries[k];
  if (libraries.empty()) std::cout << "none";
  if (!default_missing.empty()) std::cout << " (" << kDefaultLibrary << " not found at " << default_missing << ")";
  std::cout << "\nthreads     ";
  if (o.threads > 0) std::cout << o.threads << " intra-op\n";
  else std::cout << "ONNX Runtime's default intra-op threads\n";
  std::cout << "inputs\n";
  for (const auto& in : ins)
    std::cout << "  " << pad(in.name, w) << "  " << pad(opbridge::npy::type_name(in.dtype), 7) << "  "
              << pad(shape_str(in.shape), 14) << "  " << in.source << "\n";
  for (size_t k = 0; k < dim_notes.size(); ++k) std::cout << (k ? "            " : "dims        ") << dim_notes[k] << "\n";

  auto mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<Ort::Value> values;
  std::vector<const char*> in_names, out_ptrs;
  for (auto& in : ins) {
    if (in.data.empty()) in.data.reserve(1);  // a valid pointer for an empty tensor
    values.push_back(Ort::Value::CreateTensor(mem, in.data.data(), in.data.size(), in.shape.data(), in.shape.size(),
                                              [&] {
                                                for (const auto& m : kTypeMap)
                                                  if (m.npy == in.dtype) return m.onnx;
                                                return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
                                              }()));
    in_names.push_back(in.name.c_str());
  }
  for (const auto& n : out_names) out_ptrs.push_back(n.c_str());

  std::vector<Ort::Value> outputs;
  Ort::RunOptions run_options;
  auto run_once = [&] {
    try {
      outputs = session->Run(run_options, in_names.data(), values.data(), values.size(), out_ptrs.data(), out_ptrs.size());
    } catch (const Ort::Exception& e) {
      throw RunError(cat("run failed: ", one_line(e.what())));
    }
  };
  for (int64_t i = 0; i < o.warmup; ++i) run_once();
  std::vector<double> times_ms;
  times_ms.reserve(static_cast<size_t>(o.repeat));
  for (int64_t i = 0; i < o.repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run_once();
    const auto t1 = std::chrono::steady_clock::now();
    times_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }

  std::cout << "outputs\n";
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::cout << "  " << pad(out_names[i], w) << "  ";
    Ort::Value& v = outputs[i];
    if (!v.IsTensor()) {
      std::cout << onnx_kind_name(v.GetTypeInfo().GetONNXType()) << "\n";
      if (!out_files.empty())
        throw RunError(cat("output '", out_names[i], "' is not a tensor; it cannot be written as .npy"));
      continue;
    }
    auto t = v.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = t.GetShape();
    std::cout << pad(onnx_type_name(t.GetElementType()), 7) << "  "
              << (out_files.empty() ? shape_str(shape) : pad(shape_str(shape), 14));
    if (!out_files.empty()) {
      const DType* d = npy_type(t.GetElementType());
      if (!d)
        throw RunError(cat("output '", out_names[i], "' has element type ", onnx_type_name(t.GetElementType()),
                           ", which cannot be written as .npy"));
      opbridge::npy::save(out_files[i], *d, shape, v.GetTensorRawData());
      std::cout << "  -> " << out_files[i];
    }
    std::cout << "\n";
  }

  const opbridge::run::LatencyStats s = opbridge::run::summarize(times_ms);
  char line[256];
  std::snprintf(line, sizeof line, "min %.4f ms, median %.4f ms, p90 %.4f ms, p99 %.4f ms", s.min_ms, s.median_ms,
                s.p90_ms, s.p99_ms);
  std::cout << "latency     " << line << " (" << o.repeat << (o.repeat == 1 ? " timed run" : " timed runs") << " after "
            << o.warmup << " warmup)\n";
  std::snprintf(line, sizeof line, "%.1f runs/s", s.runs_per_s);
  std::cout << "throughput  " << line << "\n";
  if (!o.times_file.empty()) {
    opbridge::npy::save(o.times_file, DType::Float64, {o.repeat}, times_ms.data());
    std::cout << "times       -> " << o.times_file << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse_args(argc, argv);
    if (o.help) {
      print_usage();
      return 0;
    }
    return run(o);
  } catch (const UsageError& e) {
    std::cerr << "opbridge-run: error: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "opbridge-run: error: out of memory\n";
  } catch (const std::exception& e) {
    std::cerr << "opbridge-run: error: " << one_line(e.what()) << "\n";
  } catch (...) {
    std::cerr << "opbridge-run: error: unexpected failure\n";
  }
  return 1;
}
