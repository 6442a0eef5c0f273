// opbridge-run's command line.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace opbridge::run {

struct Options {
  std::string model;
  std::vector<std::pair<std::string, std::string>> inputs;  // model input name, .npy path
  bool random = false;
  uint64_t seed = 0;
  std::vector<std::pair<std::string, int64_t>> dims;  // symbolic dimension name, size
  int64_t repeat = 10, warmup = 1;
  int64_t threads = 0;  // 0: ONNX Runtime's default
  std::string output_dir, times_file;
  std::vector<std::string> libraries;
  bool default_library = true;
  bool help = false;  // the usage (or the version) was printed; nothing else to do
};

// Throws UsageError, with the message the tool prints, for a bad command line. On -h/--help it
// prints the usage to stdout and returns with `help` set; on --version, the versions.
Options parse_options(int argc, char** argv);

}  // namespace opbridge::run
