// The command line, parsed by CLI11. CLI11 generates --help and handles the option syntax; the
// messages are the tool's own (validators return them, and the few errors CLI11 words itself
// are reworded in parse_options), so a bad command line is one line naming the option and why.
#include "options.h"

#include <CLI/CLI.hpp>
#include <onnxruntime_cxx_api.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <set>

#include "common.h"
#include "libraries.h"
#include "random_data.h"

namespace opbridge::run {
namespace {

constexpr int64_t kMaxRuns = 100000000;
constexpr const char* kUsage = "opbridge-run MODEL.onnx [options]";

// Why `text` is not a decimal integer in [lo, hi]; "" (and `value` set) when it is one.
std::string integer_problem(const std::string& text, int64_t lo, int64_t hi, int64_t& value) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE) return cat("'", text, "' is not an integer");
  if (x < lo || x > hi) return cat(x, " is out of range [", lo, ", ", hi, "]");
  value = x;
  return "";
}

// Checks the value and rewrites it in plain decimal: CLI11 converts with base 0, which would
// read "010" as 8.
CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) {
        int64_t x = 0;
        std::string problem = integer_problem(text, lo, hi, x);
        if (problem.empty()) text = std::to_string(x);
        return problem;
      },
      "");
}

CLI::Validator name_equals(const std::string& form) {
  return CLI::Validator(
      [form](std::string& text) -> std::string {
        const size_t eq = text.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) return cat("expected ", form, ", got '", text, "'");
        return "";
      },
      "");
}

// CLI11's help, with the usage line the tool's own (CLI11's would be "opbridge-run [OPTIONS]
// [model]") and one blank line between the groups of options rather than two.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return cat("Usage: ", kUsage, "\n\n",
               "Runs an ONNX model with ONNX Runtime and the opbridge custom-op library, without Python, and\n"
               "reports latency (min/median/p90/p99) and throughput.\n\n");
  }
  std::string make_group(std::string group, bool is_positional, std::vector<const CLI::Option*> opts) const override {
    return CLI::Formatter::make_group(group, is_positional, opts).substr(1);  // without its leading "\n"
  }
};

std::string no_default_library_help() {
  return cat("do not register the default ", kDefaultLibrary, "\n(looked up at: ",
             join(default_library_candidates(), ", else "), ")");
}

// The raw values of the repeatable NAME=VALUE options, split once CLI11 is done.
struct Pairs {
  std::vector<std::string> inputs, dims;
};

void add_options(CLI::App& app, Options& o, Pairs& pairs) {
  // One value per occurrence, repeats collected: `--input a=1.npy model.onnx` leaves the model alone.
  auto repeatable = [](CLI::Option* opt) {
    return opt->expected(1)->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  };
  app.add_option("model", o.model)->group("");
  app.option_defaults()->group("Inputs (every model input needs data, from --input or --random)");
  repeatable(app.add_option("--input", pairs.inputs, "feed model input NAME from a .npy file (repeatable)"))
      ->type_name("NAME=FILE.npy")->check(name_equals("NAME=FILE.npy"));
  app.add_flag("--random", o.random,
               cat("generate the inputs not given by --input: floats uniform in [-1, 1),\nintegers uniform in [0, ",
                   kRandomIntRange - 1, "], bools false/true"));
  app.add_option("--seed", o.seed, "seed of --random (default 0)")->type_name("N")
      ->transform(integer_in(0, std::numeric_limits<int64_t>::max()));
  repeatable(app.add_option("--dim", pairs.dims,
                            "size of the symbolic dimension NAME (repeatable); a symbolic dimension\n"
                            "not set by --dim or a .npy input is 1, and so is an unnamed dynamic one"))
      ->type_name("NAME=VALUE")->check(name_equals("NAME=VALUE"));
  app.option_defaults()->group("Running");
  app.add_option("--warmup", o.warmup, "untimed runs before timing (default 1)")->type_name("N")
      ->transform(integer_in(0, kMaxRuns));
  app.add_option("--repeat", o.repeat, "timed runs (default 10)")->type_name("N")->transform(integer_in(1, kMaxRuns));
  app.add_option("--threads", o.threads, "ONNX Runtime intra-op threads (default: ONNX Runtime's, one per core)")
      ->type_name("N")->transform(integer_in(1, 4096));
  app.option_defaults()->group("Output");
  app.add_option("--output-dir", o.output_dir,
                 "write each output of the last run to DIR/<output name>.npy\n"
                 "('/' in a name becomes '_'); DIR is created if missing")->type_name("DIR");
  app.add_option("--times", o.times_file, "write every timed run's latency in milliseconds (float64, in run order)")
      ->type_name("FILE.npy");
  app.option_defaults()->group("Custom-op libraries");
  repeatable(app.add_option("--library", o.libraries, "also register this custom-op library (repeatable)"))
      ->type_name("PATH");
  app.add_flag_callback("--no-default-library", [&o] { o.default_library = false; }, no_default_library_help());
  // Added last so that its group is listed last.
  app.set_help_flag("-h,--help", "print this text")->group("Help");
  // The runtime's version is the loaded libonnxruntime's, which may differ from the headers'.
  app.set_version_flag("--version", [] { return cat("opbridge-run ", OPBRIDGE_VERSION, " (ONNX Runtime ", Ort::GetVersionString(), ")"); },
                       "print the versions of opbridge-run and ONNX Runtime")->group("Help");
}

std::unique_ptr<CLI::App> make_app(Options& o, Pairs& pairs) {
  auto app = std::make_unique<CLI::App>("", "opbridge-run");
  auto help = std::make_shared<HelpFormatter>();
  help->column_width(25);
  app->formatter(help);
  app->footer(
      "Example:\n"
      "  opbridge-run model.onnx --input x=x.npy --random --dim batch=4 --threads 1 --repeat 100 --output-dir out\n\n"
      "Exit status: 0 on success, 2 for a bad command line, 1 for any other error.");
  // Unknown options and a second model are left over rather than thrown, so that the error can
  // name the first of them.
  app->allow_extras();
  // An option given twice: the last one counts. A flag refuses a value, so that --random=false
  // cannot read as "not random" (CLI11 still lets --random=true through: the same as --random).
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->disable_flag_override();
  app->set_help_flag();  // removed here, added again last by add_options
  add_options(*app, o, pairs);
  return app;
}

// CLI11 throws ArgumentMismatch for an option that needs a value ending the command line and for
// a flag given a value; its message words them its own way, so find the argument it means.
std::string mismatch_message(const CLI::App& app, int argc, char** argv, const std::string& fallback) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i], name = arg.substr(0, arg.find('='));
    const CLI::Option* opt = name.rfind("--", 0) == 0 ? app.get_option_no_throw(name) : nullptr;
    if (!opt) continue;
    const bool is_flag = opt->get_items_expected_max() == 0;
    if (is_flag && name != arg) return name + " takes no value";
    if (!is_flag && i + 1 == argc && arg.size() <= name.size() + 1) return name + " needs a value";
  }
  return fallback;
}

// Left-over arguments (in command-line order): an unknown option, or a second model.
void check_left_over(const CLI::App& app, const std::string& model) {
  auto unknown = [](const std::string& arg) {
    return UsageError(cat("unknown option '", arg.substr(0, arg.rfind("--", 0) == 0 ? arg.find('=') : arg.size()),
                          "' (see --help)"));
  };
  // CLI11 takes "-5" for a positional (a negative number); the tool has no such model names.
  if (model.size() > 1 && model[0] == '-') throw unknown(model);
  for (const std::string& arg : app.remaining()) {
    if (arg.size() > 1 && arg[0] == '-') throw unknown(arg);
    throw UsageError(cat("more than one model given ('", model, "' and '", arg, "')"));
  }
}

// NAME=VALUE arguments (their form checked by name_equals), each NAME at most once.
std::vector<std::pair<std::string, std::string>> split_pairs(const std::vector<std::string>& raw, const char* option) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> seen;
  for (const auto& text : raw) {
    const size_t eq = text.find('=');
    out.emplace_back(text.substr(0, eq), text.substr(eq + 1));
    if (!seen.insert(out.back().first).second) throw UsageError(cat(option, " ", out.back().first, " is given twice"));
  }
  return out;
}

// Checked here rather than by a validator, whose message could not name the dimension.
int64_t dim_size(const std::string& name, const std::string& text) {
  int64_t x = 0;
  const std::string problem = integer_problem(text, 0, std::numeric_limits<int32_t>::max(), x);
  if (!problem.empty()) throw UsageError(cat("--dim ", name, ": ", problem));
  return x;
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  Pairs pairs;
  const std::unique_ptr<CLI::App> app = make_app(o, pairs);
  try {
    app->parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app->help();
    o.help = true;
    return o;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    o.help = true;
    return o;
  } catch (const CLI::ArgumentMismatch& e) {
    throw UsageError(mismatch_message(*app, argc, argv, e.what()));
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  check_left_over(*app, o.model);
  if (o.model.empty()) throw UsageError(cat("no model given (usage: ", kUsage, "; see --help)"));
  o.inputs = split_pairs(pairs.inputs, "--input");
  for (const auto& [name, text] : split_pairs(pairs.dims, "--dim")) o.dims.emplace_back(name, dim_size(name, text));
  return o;
}

}  // namespace opbridge::run
