#include "report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

#include "common.h"
#include "element_types.h"
#include "latency.h"
#include "npy.h"

namespace fs = std::filesystem;

namespace opbridge::run {
namespace {

constexpr const char* kIndent = "            ";  // the summary's values start in column 12

std::string pad(std::string s, size_t n) { return s.size() < n ? s + std::string(n - s.size(), ' ') : s; }

// A file name from an output name: '/' cannot be in one, and "." and ".." are directories.
std::string output_file_name(const std::string& name, size_t index) {
  std::string s = name.empty() ? cat("output", index) : name;
  std::replace(s.begin(), s.end(), '/', '_');
  if (s == "." || s == "..") s = cat("output", index);
  return s + ".npy";
}

// An output's type and shape, or its kind when it is not a tensor; `padded` to line up the files.
std::string describe_output(const Ort::Value& v, bool padded) {
  if (!v.IsTensor()) return onnx_kind_name(v.GetTypeInfo().GetONNXType());
  const auto t = v.GetTensorTypeAndShapeInfo();
  const std::string shape = shape_str(t.GetShape());
  return pad(onnx_type_name(t.GetElementType()), 7) + "  " + (padded ? pad(shape, 14) : shape);
}

void write_output(const Ort::Value& v, const std::string& name, const std::string& file) {
  if (!v.IsTensor()) throw RunError(cat("output '", name, "' is not a tensor; it cannot be written as .npy"));
  const auto t = v.GetTensorTypeAndShapeInfo();
  const npy::DType* d = npy_type(t.GetElementType());
  if (!d)
    throw RunError(cat("output '", name, "' has element type ", onnx_type_name(t.GetElementType()),
                       ", which cannot be written as .npy"));
  npy::save(file, *d, t.GetShape(), v.GetTensorRawData());
}

}  // namespace

std::vector<std::string> output_files(const std::string& dir, const std::vector<std::string>& out_names) {
  std::vector<std::string> files;
  if (dir.empty()) return files;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    throw RunError(cat("--output-dir ", dir, ": cannot create the directory", ec ? ": " + ec.message() : ""));
  std::set<std::string> taken;
  for (size_t i = 0; i < out_names.size(); ++i) {
    files.push_back((fs::path(dir) / output_file_name(out_names[i], i)).string());
    if (!taken.insert(files.back()).second)
      throw RunError(cat("outputs '", out_names[i], "' and another output would both be written to ", files.back()));
  }
  return files;
}

size_t name_width(const std::vector<ModelInput>& ins, const std::vector<std::string>& out_names) {
  size_t w = 4;
  for (const auto& in : ins) w = std::max(w, in.name.size());
  for (const auto& n : out_names) w = std::max(w, n.size());
  return w;
}

void print_setup(const Options& o, const Libraries& libs, const std::vector<ModelInput>& ins,
                 const std::vector<std::string>& dim_lines, size_t width) {
  std::cout << "model       " << o.model << "\n";
  std::cout << "libraries   " << (libs.paths.empty() ? "none" : join(libs.paths, std::string("\n") + kIndent));
  if (!libs.default_missing.empty()) std::cout << " (" << kDefaultLibrary << " not found at " << libs.default_missing << ")";
  std::cout << "\nthreads     ";
  if (o.threads > 0) std::cout << o.threads << " intra-op\n";
  else std::cout << "ONNX Runtime's default intra-op threads\n";
  std::cout << "inputs\n";
  for (const auto& in : ins)
    std::cout << "  " << pad(in.name, width) << "  " << pad(npy::type_name(in.dtype), 7) << "  "
              << pad(shape_str(in.shape), 14) << "  " << in.source << "\n";
  for (size_t k = 0; k < dim_lines.size(); ++k) std::cout << (k ? kIndent : "dims        ") << dim_lines[k] << "\n";
}

void print_outputs(const std::vector<Ort::Value>& outputs, const std::vector<std::string>& out_names,
                   const std::vector<std::string>& out_files, size_t width) {
  std::cout << "outputs\n";
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::cout << "  " << pad(out_names[i], width) << "  " << describe_output(outputs[i], !out_files.empty());
    if (!out_files.empty()) {
      write_output(outputs[i], out_names[i], out_files[i]);
      std::cout << "  -> " << out_files[i];
    }
    std::cout << "\n";
  }
}

void print_latency(const std::vector<double>& times_ms, const Options& o) {
  const LatencyStats s = summarize(times_ms);
  char line[256];
  std::snprintf(line, sizeof line, "min %.4f ms, median %.4f ms, p90 %.4f ms, p99 %.4f ms", s.min_ms, s.median_ms,
                s.p90_ms, s.p99_ms);
  std::cout << "latency     " << line << " (" << o.repeat << (o.repeat == 1 ? " timed run" : " timed runs") << " after "
            << o.warmup << " warmup)\n";
  std::snprintf(line, sizeof line, "%.1f runs/s", s.runs_per_s);
  std::cout << "throughput  " << line << "\n";
  if (!o.times_file.empty()) {
    npy::save(o.times_file, npy::DType::Float64, {o.repeat}, times_ms.data());
    std::cout << "times       -> " << o.times_file << "\n";
  }
}

}  // namespace opbridge::run
