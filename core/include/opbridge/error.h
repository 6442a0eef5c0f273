// One exception type for everything an op rejects. Kernels and validation throw it; each
// adapter catches it at its boundary and turns it into its own error (a RuntimeError in
// PyTorch, an OrtStatus in ONNX Runtime), prefixed with the op's name.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace opbridge {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace opbridge

// OB_CHECK(cond, "message parts", value, ...): throws opbridge::Error with the parts joined.
#define OB_CHECK(cond, ...)                                                  \
  do {                                                                       \
    if (!(cond)) throw ::opbridge::Error(::opbridge::detail::concat(__VA_ARGS__)); \
  } while (0)
