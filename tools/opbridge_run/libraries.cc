#include "libraries.h"

#include <algorithm>
#include <filesystem>

#include "common.h"

namespace fs = std::filesystem;

namespace opbridge::run {

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

Libraries resolve_libraries(bool use_default, const std::vector<std::string>& extra) {
  Libraries libs;
  std::error_code ec;
  if (use_default) {
    const std::vector<std::string> candidates = default_library_candidates();
    auto found = std::find_if(candidates.begin(), candidates.end(),
                              [&](const std::string& c) { return fs::is_regular_file(c, ec); });
    if (found != candidates.end()) libs.paths.push_back(fs::canonical(*found, ec).string());
    else libs.default_missing = join(candidates, ", ");
  }
  for (const auto& lib : extra) {
    if (!fs::is_regular_file(lib, ec)) throw RunError(cat("--library ", lib, ": no such file"));
    const std::string path = fs::canonical(lib, ec).string();
    // Each library once, so that naming the default one again with --library changes nothing.
    if (std::find(libs.paths.begin(), libs.paths.end(), path) == libs.paths.end()) libs.paths.push_back(path);
  }
  return libs;
}

}  // namespace opbridge::run
