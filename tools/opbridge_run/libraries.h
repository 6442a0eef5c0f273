// The custom-op libraries opbridge-run registers: the default one (found next to the executable
// or in the build tree) and those given with --library.
#pragma once

#include <string>
#include <vector>

namespace opbridge::run {

constexpr const char* kDefaultLibrary = "libopbridge_ort.so";

// Where the default library is looked for, in order: ../lib/ next to the executable (the install
// tree), then the build tree the executable was built in.
std::vector<std::string> default_library_candidates();

struct Libraries {
  std::vector<std::string> paths;  // canonical, each once, the default one first
  std::string default_missing;     // the places the default library was looked for in vain, else ""
};

// The default library when `use_default` and it exists, then `extra`. Throws RunError for an
// extra library that does not exist or is not an ONNX Runtime custom-op library.
Libraries resolve_libraries(bool use_default, const std::vector<std::string>& extra);

}  // namespace opbridge::run
