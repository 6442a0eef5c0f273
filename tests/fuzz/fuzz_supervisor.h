// The campaign: hands the cases to worker processes, restarts a worker after a crash, hang or
// failed setup, replays the cases of a leak one by one to name the case that leaks, matches
// failures against the known-defects list and prints the failures and the summary.
#pragma once

#include <string>
#include <vector>

#include "fuzz_options.h"

namespace opbridge::fuzz {

// The process exit status: 0 when no failure outside the known defects, 1 otherwise.
int run_campaign(const Options& o, const std::vector<const OpSpec*>& ops, const std::string& argv0);

}  // namespace opbridge::fuzz
