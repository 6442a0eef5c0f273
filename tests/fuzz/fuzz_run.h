// Runs one case through ONNX Runtime with the real op library and judges the outcome against
// the op's own spec (prepare_call) and its kernel run in-process (the kernel test harness).
#pragma once

#include <memory>
#include <string>

#include "fuzz_case.h"

namespace opbridge::fuzz {

struct Outcome {
  enum class Kind { Result, ExpectedError, Failure } kind = Kind::Result;
  std::string message;  // the error (expected) or what went wrong (failure)
};

class Runner {
 public:
  // Creates the ONNX Runtime environment (a global intra-op pool of `threads`) and the session
  // options with `library` registered once; every case's session shares them.
  Runner(const std::string& library, int threads);
  ~Runner();
  Outcome run(const Case& c);
  // New session options, registering the library again: the old options are released first, so
  // the library is unloaded and loaded again (its load/unload path under LeakSanitizer).
  void reload();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace opbridge::fuzz
