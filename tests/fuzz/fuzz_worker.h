// A worker process: runs its cases one after another in one ONNX Runtime environment and sends
// a record per case; a watchdog ends it when a case runs past the timeout.
#pragma once

#include <vector>

#include "fuzz_options.h"

namespace opbridge::fuzz {

// Runs `cases` (campaign indices), writing records to out_fd and everything the process prints
// on stderr (sanitizer reports) to log_fd, which is emptied at the start of each case. Ends the
// process.
[[noreturn]] void run_worker(const Options& o, const std::vector<const OpSpec*>& ops, const std::vector<int64_t>& cases,
                             Slot* slot, int out_fd, int log_fd);

}  // namespace opbridge::fuzz
