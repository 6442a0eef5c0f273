// opbridge_fuzz: generates valid and invalid calls of every op with a kernel (from the op specs
// in this library's registry; no op is named here), runs each as a one-node ONNX model in ONNX
// Runtime with the real libopbridge_ort.so, and checks the outcome: a result that agrees with
// the spec and, bit for bit, with the kernel run in-process, or an error naming the op (or ONNX
// Runtime's own type/arity refusal at session creation). Crashes, sanitizer reports, leaks,
// hangs and anything else are failures.
//
// Cases run in forked worker processes (a crash ends one case, not the campaign); each case has
// its own seed derived from --seed, and a failure prints a one-line command that repeats it.
// Files: fuzz_case (the generator), onnx_model (the model writer), fuzz_run (ONNX Runtime and
// the checks), fuzz_worker and fuzz_supervisor (processes, leaks, reporting).
#include <sys/mman.h>

#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <opbridge/registry.h>

#include "fuzz_options.h"
#include "fuzz_supervisor.h"
#include "fuzz_worker.h"

namespace opbridge::fuzz {
namespace {

[[noreturn]] void usage(const char* argv0, const std::string& error) {
  if (!error.empty()) std::cerr << "opbridge_fuzz: " << error << "\n";
  std::cerr
      << "usage: " << argv0 << " [options]\n"
      << "  --seed S          campaign seed; case i runs with a seed derived from S and i (default 1)\n"
         "  --cases N         number of cases (default 1000)\n"
         "  --first I         index of the first case (default 0): cases I .. I+N-1 of the seed's sequence\n"
         "  --op NAMES        only these ops, comma-separated (default: every op with a kernel)\n"
         "  --timeout-ms T    a case running longer is a failure (default 10000)\n"
         "  --jobs J          worker processes (default 1)\n"
         "  --threads K       ONNX Runtime intra-op threads per worker (default 2)\n"
         "  --reload-every R  unload and load the op library every R cases of a worker (default 200; 0: never)\n"
         "  --leak-every L    LeakSanitizer check every L cases of a worker, when built with it (default 100)\n"
         "  --known FILE      known defects: matching failures are listed but do not fail the run\n"
         "                    (default " OPBRIDGE_FUZZ_KNOWN "; '' for none)\n"
         "  --library PATH    the ONNX Runtime op library (default " OPBRIDGE_ORT_LIBRARY ")\n"
         "  --case-seed X     run the one case with this seed (a failure's repro line gives it), verbosely\n"
         "  --save-models DIR write the model of every case that gave a result to DIR\n"
         "  --verbose         print every case and its outcome\n"
         "  --list-ops        print the ops it would run, and exit\n"
         "Exit status: 0 when every failure is a known defect, 1 otherwise, 2 for a bad command line.\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  o.known = OPBRIDGE_FUZZ_KNOWN;
  o.library = OPBRIDGE_ORT_LIBRARY;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], a + " needs a value");
      return argv[++i];
    };
    auto number = [&](const std::string& v) -> uint64_t {
      try {
        size_t end = 0;
        const uint64_t n = std::stoull(v, &end, 0);
        if (end != v.size()) throw std::invalid_argument(v);
        return n;
      } catch (const std::exception&) {
        usage(argv[0], a + ": not a number: " + v);
      }
    };
    auto list = [&](const std::string& v) {
      std::vector<std::string> out;
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
      return out;
    };
    if (a == "--seed") o.seed = number(value());
    else if (a == "--cases") o.cases = static_cast<int64_t>(number(value()));
    else if (a == "--first") o.first = static_cast<int64_t>(number(value()));
    else if (a == "--op") o.ops = list(value());
    else if (a == "--timeout-ms") o.timeout_ms = static_cast<int64_t>(number(value()));
    else if (a == "--jobs") o.jobs = static_cast<int>(std::max<uint64_t>(1, number(value())));
    else if (a == "--threads") o.threads = static_cast<int>(std::max<uint64_t>(1, number(value())));
    else if (a == "--reload-every") o.reload_every = static_cast<int64_t>(number(value()));
    else if (a == "--leak-every") o.leak_every = static_cast<int64_t>(number(value()));
    else if (a == "--known") o.known = value();
    else if (a == "--library") o.library = value();
    else if (a == "--case-seed") o.case_seed = number(value());
    else if (a == "--save-models") o.save_models = value();
    else if (a == "--verbose" || a == "-v") o.verbose = true;
    else if (a == "--list-ops") o.list_ops = true;
    else if (a == "--worker-cases") {  // internal: a worker started by exec (the leak replay)
      for (const std::string& n : list(value())) o.worker_cases.push_back(static_cast<int64_t>(number(n)));
    } else if (a == "--slot-fd") o.slot_fd = static_cast<int>(number(value()));
    else if (a == "--slot-index") o.slot_index = static_cast<int>(number(value()));
    else if (a == "--help" || a == "-h") usage(argv[0], "");
    else usage(argv[0], "unknown argument " + a);
  }
  return o;
}

}  // namespace
}  // namespace opbridge::fuzz

int main(int argc, char** argv) {
  using namespace opbridge;
  using namespace opbridge::fuzz;
  Options o = parse(argc, argv);
  if (!registry().errors().empty()) {
    std::cerr << "opbridge_fuzz: invalid op definitions: " << registry().errors().front() << "\n";
    return 2;
  }
  for (const std::string& name : o.ops)
    if (!registry().find(name) || !registry().find(name)->cpu_kernel) usage(argv[0], "no op with a kernel named " + name);
  std::vector<const OpSpec*> ops;
  for (const OpSpec& op : registry().ops())
    if (op.cpu_kernel && (o.ops.empty() || std::count(o.ops.begin(), o.ops.end(), op.name))) ops.push_back(&op);
  if (o.list_ops) {
    for (const OpSpec* op : ops) std::cout << op->name << "\n";
    return 0;
  }
  if (ops.empty()) usage(argv[0], "no op has a kernel");

  if (!o.worker_cases.empty()) {  // a worker started by exec: records on stdout, reports on stderr
    void* mem = mmap(nullptr, sizeof(Slot) * static_cast<size_t>(o.slot_index + 1), PROT_READ | PROT_WRITE, MAP_SHARED,
                     o.slot_fd, 0);
    if (mem == MAP_FAILED) return 2;
    run_worker(o, ops, o.worker_cases, static_cast<Slot*>(mem) + o.slot_index, 1, 2);
  }
  if (o.case_seed) o.cases = 1, o.jobs = 1, o.verbose = true, o.leak_every = 1;
  return run_campaign(o, ops, argv[0]);
}
