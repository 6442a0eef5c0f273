#include "session.h"

#include <chrono>
#include <filesystem>
#include <iostream>

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

// ONNX Runtime's words for a node whose custom domain no registered library provides:
// "Fatal error: <domain>:<op>(<version>) is not a registered function/op".
std::string unknown_domain_hint(const std::string& message) {
  const std::string tail = " is not a registered function/op";
  const auto end = message.find(tail);
  const auto start = message.rfind("Fatal error: ", end);
  if (end == std::string::npos || start == std::string::npos) return "";
  const std::string node = message.substr(start + 13, end - start - 13);  // domain:Op(-1)
  const auto colon = node.find(':');
  if (colon == std::string::npos || colon == 0) return "";
  return cat(" (no registered custom-op library provides ONNX domain '", node.substr(0, colon),
             "': pass its ONNX Runtime library with --library path/lib<name>_ort.so)");
}

// A library that fails to register because it is an op library's PyTorch side (lib<x>_torch.so,
// which needs libtorch): name the ONNX Runtime sibling instead.
std::string library_hint(const std::string& lib, const std::string& message) {
  const fs::path path(lib);
  const std::string name = path.filename().string(), suffix = "_torch.so";
  const bool torch_name = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (!torch_name && message.find("libtorch") == std::string::npos && message.find("libc10") == std::string::npos)
    return "";
  std::string sibling = "lib<name>_ort.so";
  if (torch_name) {
    const fs::path ort = path.parent_path() / (name.substr(0, name.size() - suffix.size()) + "_ort.so");
    std::error_code ec;
    sibling = ort.string() + (fs::exists(ort, ec) ? "" : ", which is not there");
  }
  return cat(" (", name, " is the PyTorch side of an op library; ONNX Runtime takes its sibling ", sibling, ")");
}

std::string load_failure_hint(const Libraries& libs, const std::string& message) {
  if (!libs.default_missing.empty())
    return cat(" (", kDefaultLibrary, " was not found at ", libs.default_missing, "; pass it with --library)");
  if (libs.paths.empty()) return " (no custom-op library was registered)";
  return unknown_domain_hint(message);
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
      throw RunError(cat("cannot register custom-op library ", lib, ": ", one_line(e.what()), library_hint(lib, e.what())));
    }
  }
  try {
    return std::make_unique<Ort::Session>(env, model.c_str(), options);
  } catch (const Ort::Exception& e) {
    throw RunError(cat("cannot load model ", model, ": ", one_line(e.what()), load_failure_hint(libs, e.what())));
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
