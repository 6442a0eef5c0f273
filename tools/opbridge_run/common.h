// What every part of opbridge-run shares: its two kinds of failure and a few string helpers.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace opbridge::run {

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

// Any container of strings, joined with `sep`.
template <typename Strings>
std::string join(const Strings& items, const std::string& sep) {
  std::string s;
  for (const auto& item : items) s += (s.empty() ? "" : sep) + item;
  return s;
}

// ONNX Runtime's messages can span lines; the tool's error is one line.
inline std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + "]";
}

}  // namespace opbridge::run
