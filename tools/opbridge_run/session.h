// ONNX Runtime's side: the session with the custom-op libraries registered, and the timed runs.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "inputs.h"
#include "libraries.h"

namespace opbridge::run {

// Throws RunError when `model` is missing or not a regular file.
void check_model_file(const std::string& model);

// ONNX Runtime's environment, its warnings passed on to stderr as the tool's.
Ort::Env make_env();

// `threads` 0: ONNX Runtime's default. Throws RunError when a library cannot be registered or the
// model cannot be loaded (with a hint when that may be for want of the default library).
std::unique_ptr<Ort::Session> open_session(Ort::Env& env, const std::string& model, int64_t threads,
                                           const Libraries& libs);

std::vector<std::string> output_names(Ort::Session& session, OrtAllocator* alloc);

struct TimedRuns {
  std::vector<Ort::Value> outputs;  // the last run's
  std::vector<double> times_ms;     // each timed run's, in order
};

// Binds the inputs once, then runs the model `warmup` times untimed and `repeat` times timed.
// Throws RunError when a run fails.
TimedRuns time_runs(Ort::Session& session, std::vector<ModelInput>& ins, const std::vector<std::string>& out_names,
                    int64_t warmup, int64_t repeat);

}  // namespace opbridge::run
