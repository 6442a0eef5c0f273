// What opbridge-run prints and writes: the summary on stdout, the outputs and run times as .npy.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <string>
#include <vector>

#include "inputs.h"
#include "libraries.h"
#include "options.h"

namespace opbridge::run {

// The files the outputs go to, DIR/<output name>.npy, with DIR created; none when `dir` is "".
// Throws RunError when DIR cannot be created or two outputs would share a file.
std::vector<std::string> output_files(const std::string& dir, const std::vector<std::string>& out_names);

// The width of the summary's name column.
size_t name_width(const std::vector<ModelInput>& ins, const std::vector<std::string>& out_names);

// What runs, with what: the model, libraries, threads, inputs and where the dims' sizes came from.
void print_setup(const Options& o, const Libraries& libs, const std::vector<ModelInput>& ins,
                 const std::vector<std::string>& dim_lines, size_t width);

// Each output's type and shape, written to its file when `out_files` is not empty. Throws
// RunError for an output that is to be written but .npy cannot hold.
void print_outputs(const std::vector<Ort::Value>& outputs, const std::vector<std::string>& out_names,
                   const std::vector<std::string>& out_files, size_t width);

// The latency statistics and throughput, and the times file of --times.
void print_latency(const std::vector<double>& times_ms, const Options& o);

}  // namespace opbridge::run
