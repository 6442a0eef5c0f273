// opbridge-run: runs an ONNX model with ONNX Runtime's C++ API and the opbridge custom-op
// library, without Python, and reports how fast. Inputs come from .npy files or are random;
// outputs can be written as .npy. Every failure is one "opbridge-run: error: ..." line on stderr
// and a non-zero exit (2 for a bad command line, 1 for everything else).
//
// The parts: options (the command line), libraries (which custom-op libraries), session (ONNX
// Runtime: the session, the timed runs), inputs (what the model takes and the data fed to it),
// report (the summary, the files written).
#include <iostream>
#include <memory>
#include <new>

#include "common.h"
#include "inputs.h"
#include "libraries.h"
#include "options.h"
#include "report.h"
#include "session.h"

namespace {

using namespace opbridge::run;

void run(const Options& o) {
  check_model_file(o.model);
  const Libraries libs = resolve_libraries(o.default_library, o.libraries);
  Ort::Env env = make_env();
  const std::unique_ptr<Ort::Session> session = open_session(env, o.model, o.threads, libs);

  Ort::AllocatorWithDefaultOptions alloc;
  std::vector<ModelInput> ins = describe_inputs(*session, alloc);
  const std::vector<std::string> dim_lines = bind_inputs(ins, o);
  const std::vector<std::string> out_names = output_names(*session, alloc);
  const std::vector<std::string> out_files = output_files(o.output_dir, out_names);
  const size_t width = name_width(ins, out_names);
  // The setup is printed before the runs, so that it is there when a run fails.
  print_setup(o, libs, ins, dim_lines, width);

  const TimedRuns runs = time_runs(*session, ins, out_names, o.warmup, o.repeat);
  print_outputs(runs.outputs, out_names, out_files, width);
  print_latency(runs.times_ms, o);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse_options(argc, argv);
    if (!o.help) run(o);
    return 0;
  } catch (const UsageError& e) {
    std::cerr << "opbridge-run: error: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "opbridge-run: error: out of memory\n";
  } catch (const std::exception& e) {
    std::cerr << "opbridge-run: error: " << one_line(e.what()) << "\n";
  } catch (...) {
    std::cerr << "opbridge-run: error: unexpected failure\n";
  }
  return 1;
}
