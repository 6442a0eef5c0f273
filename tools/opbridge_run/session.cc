#include "session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <set>

#include "common.h"
#include "element_types.h"

namespace fs = std::filesystem;

namespace opbridge::run {
namespace {

// ONNX Runtime's errors come back as statuses, which the tool reports itself in one line, so
// only its warnings are logged, lest an error be told twice.
void log_to_stderr(void*, OrtLoggingLevel severity, const char*, const char*, const char*, const char* message) {
  if (severity == ORT_LOGGING_LEVEL_WARNING) std::cerr << "opbridge-run: onnxruntime warning: " << one_line(message) << "\n";
}

// A read-only walk over protobuf's wire format, enough to list an ONNX model's nodes without the
// protobuf library: each call to next() gives one field, with a view of it if length-delimited.
class Wire {
 public:
  Wire(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool next(uint64_t& field, Wire& value) {
    uint64_t key = 0, n = 0;
    if (p_ == end_ || !varint(key)) return false;
    field = key >> 3;
    switch (key & 7) {
      case 0: return varint(n);
      case 1: return skip(8);
      case 5: return skip(4);
      case 2:
        if (!varint(n) || n > static_cast<uint64_t>(end_ - p_)) return false;
        value = Wire(p_, n);
        return skip(n);
      default: return false;  // groups (never in ONNX) or a malformed file
    }
  }
  std::string str() const { return std::string(reinterpret_cast<const char*>(p_), end_ - p_); }

 private:
  bool varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; p_ != end_ && shift < 64; shift += 7) {
      const uint8_t b = *p_++;
      v |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  bool skip(uint64_t n) {
    if (n > static_cast<uint64_t>(end_ - p_)) return false;
    p_ += n;
    return true;
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

// ONNX's field numbers: ModelProto.graph 7, .functions 25; GraphProto.node 1; FunctionProto.name 1,
// .node 7, .domain 10; NodeProto.op_type 4, .attribute 5, .domain 7; AttributeProto.g 6, .graphs 11.
struct NodeScan {
  std::string domain;
  std::set<std::string> local_functions;  // the model's own functions of `domain`: not missing
  std::vector<std::string> op_types;      // in order of first use

  void nodes(Wire container, uint64_t node_field, int depth) {
    uint64_t f = 0;
    for (Wire v(nullptr, 0); depth < 64 && container.next(f, v);)
      if (f == node_field) node(v, depth);
  }
  void node(Wire n, int depth) {
    std::string op, dom;
    uint64_t f = 0;
    for (Wire v(nullptr, 0); n.next(f, v);) {
      if (f == 4) op = v.str();
      if (f == 7) dom = v.str();
      if (f != 5) continue;
      uint64_t g = 0;
      for (Wire a(nullptr, 0); v.next(g, a);)
        if (g == 6 || g == 11) nodes(a, 1, depth + 1);  // a subgraph's nodes
    }
    if (dom == domain && !local_functions.count(op) &&
        std::find(op_types.begin(), op_types.end(), op) == op_types.end())
      op_types.push_back(op);
  }
};

// The op types of `domain` in the model's nodes, the graph's (subgraphs included) first, then those
// in its function bodies, not the model's own functions; empty when the file cannot be read. The
// file is mapped, not read: its weights are skipped over.
std::vector<std::string> op_types_of(const std::string& model, const std::string& domain) {
  const int fd = ::open(model.c_str(), O_RDONLY);
  if (fd < 0) return {};
  struct stat st {};
  void* data = ::fstat(fd, &st) == 0 && st.st_size > 0 ? ::mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)
                                                         : MAP_FAILED;
  ::close(fd);
  if (data == MAP_FAILED) return {};
  NodeScan scan{domain, {}, {}};
  const Wire file(static_cast<const uint8_t*>(data), static_cast<size_t>(st.st_size));
  uint64_t f = 0, g = 0;
  Wire w = file;
  for (Wire v(nullptr, 0); w.next(f, v);) {
    if (f != 25) continue;
    std::string name, dom;
    for (Wire x(nullptr, 0); v.next(g, x);) {
      if (g == 1) name = x.str();
      if (g == 10) dom = x.str();
    }
    if (dom == domain) scan.local_functions.insert(name);
  }
  w = file;
  for (Wire v(nullptr, 0); w.next(f, v);) {
    if (f == 7) scan.nodes(v, 1, 0);
    if (f == 25) scan.nodes(v, 7, 0);
  }
  ::munmap(data, st.st_size);
  return scan.op_types;
}

// The domains ONNX Runtime implements itself: an op of theirs it lacks is not a missing library.
bool runtime_domain(const std::string& d) {
  static const std::set<std::string> own = {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training",
                                            "com.microsoft", "com.microsoft.nchwc", "com.microsoft.experimental",
                                            "com.ms.internal.nhwc"};
  return own.count(d) > 0;
}

// ONNX Runtime refuses a node whose custom domain no registered library provides (or whose op the
// library lacks) with "Fatal error: <domain>:<op>(<version>) is not a registered function/op".
// This names the domain, the model's op types of it and the option that registers a library;
// "" for any other refusal.
std::string unknown_domain(const std::string& model, const std::string& message, const Libraries& libs) {
  const std::string tail = " is not a registered function/op";
  const auto end = message.find(tail);
  const auto start = message.rfind("Fatal error: ", end);
  if (end == std::string::npos || start == std::string::npos) return "";
  const std::string node = message.substr(start + 13, end - start - 13);  // domain:Op(-1)
  const auto colon = node.find(':'), paren = node.find('(');
  if (colon == std::string::npos || paren == std::string::npos || paren < colon) return "";
  const std::string domain = node.substr(0, colon), op = node.substr(colon + 1, paren - colon - 1);
  if (runtime_domain(domain)) return "";
  std::vector<std::string> ops;
  for (const auto& t : op_types_of(model, domain)) ops.push_back(cat(domain, "::", t));
  if (ops.empty()) ops.push_back(cat(domain, "::", op));
  std::vector<std::string> names;
  for (const auto& p : libs.paths) names.push_back(fs::path(p).filename().string());
  const std::string registered =
      !libs.default_missing.empty() ? cat(" (", kDefaultLibrary, " was not found at ", libs.default_missing, ")")
      : names.empty()               ? " (no custom-op library was registered)"
                                    : cat(" (registered: ", join(names, ", "), ")");
  return cat("the model has ", join(ops, ", "), " nodes, and no registered custom-op library implements ", domain, "::",
             op, registered, ": pass the ONNX Runtime library of ONNX domain '", domain,
             "' with --library path/lib<name>_ort.so");
}

std::string load_failure(const std::string& model, const Libraries& libs, const std::string& message) {
  const std::string ours = unknown_domain(model, message, libs);
  if (!ours.empty()) return cat(ours, "; ONNX Runtime said: ", one_line(message));
  // ONNX Runtime takes each custom domain from one library only: the same library twice (the
  // default one and a copy of it given with --library) is refused with these words.
  if (message.find("Domain already set in registry") != std::string::npos && libs.paths.size() > 1)
    return cat(one_line(message), " (two of the registered libraries provide the same ONNX domain, e.g. two copies "
               "of one library; register each once, --no-default-library drops the default one)");
  if (!libs.default_missing.empty())
    return cat(one_line(message), " (", kDefaultLibrary, " was not found at ", libs.default_missing, "; pass it with --library)");
  if (libs.paths.empty()) return cat(one_line(message), " (no custom-op library was registered)");
  return one_line(message);
}

}  // namespace

void check_model_file(const std::string& model) {
  std::error_code ec;
  if (!fs::exists(model, ec)) throw RunError(cat(model, ": no such file"));
  if (!fs::is_regular_file(model, ec)) throw RunError(cat(model, ": not a regular file"));
}

Ort::Env make_env() { return Ort::Env(ORT_LOGGING_LEVEL_WARNING, "opbridge-run", log_to_stderr, nullptr); }

std::unique_ptr<Ort::Session> open_session(Ort::Env& env, const std::string& model, int64_t threads,
                                           const Libraries& libs) {
  Ort::SessionOptions options;
  if (threads > 0) options.SetIntraOpNumThreads(static_cast<int>(threads));
  for (const auto& lib : libs.paths) {
    try {
      options.RegisterCustomOpsLibrary(lib.c_str());
    } catch (const Ort::Exception& e) {
      throw RunError(cat("cannot register custom-op library ", lib, ": ", one_line(e.what())));
    }
  }
  try {
    return std::make_unique<Ort::Session>(env, model.c_str(), options);
  } catch (const Ort::Exception& e) {
    throw RunError(cat("cannot load model ", model, ": ", load_failure(model, libs, e.what())));
  }
}

std::vector<std::string> output_names(Ort::Session& session, OrtAllocator* alloc) {
  std::vector<std::string> names;
  for (size_t i = 0; i < session.GetOutputCount(); ++i) names.emplace_back(session.GetOutputNameAllocated(i, alloc).get());
  return names;
}

TimedRuns time_runs(Ort::Session& session, std::vector<ModelInput>& ins, const std::vector<std::string>& out_names,
                    int64_t warmup, int64_t repeat) {
  const auto mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<Ort::Value> values;
  std::vector<const char*> in_names, out_ptrs;
  for (auto& in : ins) {
    if (in.data.empty()) in.data.reserve(1);  // a valid pointer for an empty tensor
    values.push_back(Ort::Value::CreateTensor(mem, in.data.data(), in.data.size(), in.shape.data(), in.shape.size(),
                                              onnx_type(in.dtype)));
    in_names.push_back(in.name.c_str());
  }
  for (const auto& n : out_names) out_ptrs.push_back(n.c_str());

  TimedRuns runs;
  const Ort::RunOptions run_options;
  auto run_once = [&] {
    try {
      runs.outputs = session.Run(run_options, in_names.data(), values.data(), values.size(), out_ptrs.data(),
                                 out_ptrs.size());
    } catch (const Ort::Exception& e) {
      throw RunError(cat("run failed: ", one_line(e.what())));
    }
  };
  for (int64_t i = 0; i < warmup; ++i) run_once();
  runs.times_ms.reserve(static_cast<size_t>(repeat));
  for (int64_t i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run_once();
    const auto t1 = std::chrono::steady_clock::now();
    runs.times_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return runs;
}

}  // namespace opbridge::run
