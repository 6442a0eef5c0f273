#include "fuzz_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "fuzz_case.h"
#include "fuzz_worker.h"
#include "sanitizer_hooks.h"

namespace opbridge::fuzz {
namespace {

// ---- known defects --------------------------------------------------------------------------
// Lines "<id> <kind> <regex>": a failure of that kind (crash, timeout, leak, check or any) whose
// text — the case description, the message and the report — matches the regex is known.
struct Known {
  std::string id, kind;
  std::regex re;
};

std::vector<Known> load_known(const std::string& path) {
  std::vector<Known> out;
  if (path.empty()) return out;
  std::ifstream f(path);
  if (!f) {
    std::cerr << "opbridge_fuzz: cannot read the known-defects file " << path << "\n";
    std::exit(2);
  }
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    Known k;
    std::string re;
    ss >> k.id >> k.kind >> std::ws;
    std::getline(ss, re);
    if (k.id.empty() || re.empty()) continue;
    k.re = std::regex(re, std::regex::ECMAScript);
    out.push_back(std::move(k));
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}

std::string read_all(int fd) {
  std::string s;
  char b[65536];
  ssize_t n;
  off_t off = 0;
  while ((n = pread(fd, b, sizeof b, off)) > 0) s.append(b, static_cast<size_t>(n)), off += n;
  return s;
}

struct Failure {
  int64_t index;
  uint64_t seed;
  std::string kind, message, report, known;
};

// A leak seen in a batch of cases is replayed with whole stacks: first the batch in one process
// with one check at its end (whole stacks make the suppressions apply), then, if it still leaks,
// case by case to name the case.
enum class Replay { No, Batch, PerCase };

// A leak report without its addresses (they differ between processes) and sizes, to recognise
// it again.
std::string leak_key(const std::string& block) {
  static const std::regex address("0x[0-9a-f]+ "), size("[0-9]+ byte\\(s\\) in [0-9]+ object\\(s\\)");
  return std::regex_replace(std::regex_replace(block, address, ""), size, "");
}

class Campaign {
 public:
  Campaign(const Options& o, const std::vector<const OpSpec*>& ops, std::string argv0)
      : o_(o), ops_(ops), known_(load_known(o.known)), argv0_(std::move(argv0)) {}

  int run() {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t jobs = static_cast<size_t>(std::max<int64_t>(1, std::min<int64_t>(o_.jobs, o_.cases)));
    map_slots(jobs);
    workers_.resize(jobs);
    for (size_t w = 0; w < jobs; ++w) {
      std::vector<int64_t> plan;
      for (int64_t i = static_cast<int64_t>(w); i < o_.cases; i += static_cast<int64_t>(jobs)) plan.push_back(o_.first + i);
      spawn(w, std::move(plan), Replay::No);
    }
    wait_all();
    replay_leaks();
    print_summary(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (const Failure& f : failures_)
      if (f.known.empty()) return 1;
    return 0;
  }

 private:
  struct Worker {
    pid_t pid = -1;
    int fd = -1, log_fd = -1;
    std::vector<int64_t> plan;  // its cases, in order
    Replay replay = Replay::No;
    bool leaked = false;        // a leak replay found leaks
    std::string buf;
  };

  // ---- processes ----
  void map_slots(size_t jobs) {
    char path[] = "/tmp/opbridge_fuzz_slots.XXXXXX";
    slot_fd_ = mkstemp(path);
    unlink(path);
    if (slot_fd_ < 0 || ftruncate(slot_fd_, static_cast<off_t>(sizeof(Slot) * jobs)) != 0)
      throw std::runtime_error("cannot create the workers' shared memory");
    void* mem = mmap(nullptr, sizeof(Slot) * jobs, PROT_READ | PROT_WRITE, MAP_SHARED, slot_fd_, 0);
    if (mem == MAP_FAILED) throw std::runtime_error("mmap failed");
    slots_ = new (mem) Slot[jobs];
    for (size_t w = 0; w < jobs; ++w) {
      char log[] = "/tmp/opbridge_fuzz_log.XXXXXX";
      log_fds_.push_back(mkstemp(log));
      unlink(log);
      fcntl(log_fds_.back(), F_SETFL, O_APPEND);
    }
  }

  void spawn(size_t w, std::vector<int64_t> plan, Replay replay) {
    Worker& wk = workers_[w];
    wk = Worker{};
    if (plan.empty()) return;
    int p[2];
    if (pipe(p) != 0) throw std::runtime_error("pipe failed");
    slots_[w].current.store(-1);
    slots_[w].started_ms.store(0);
    slots_[w].reloading.store(0);
    (void)!ftruncate(log_fds_[w], 0);
    std::cout.flush();
    pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      close(p[0]);
      if (replay == Replay::No) run_worker(o_, ops_, plan, &slots_[w], p[1], log_fds_[w]);
      exec_replay(w, plan, replay, p[1]);
    }
    close(p[1]);
    wk.pid = pid, wk.fd = p[0], wk.log_fd = log_fds_[w], wk.plan = std::move(plan), wk.replay = replay;
  }

  // A leak replay runs in a new process (exec), so that AddressSanitizer records whole stacks
  // (fast_unwind_on_malloc=0: ONNX Runtime has no frame pointers, and the suppressions in
  // tests/fuzz/lsan.supp match frames beyond it). It reloads the op library before every case,
  // so a leak per library load shows too.
  [[noreturn]] void exec_replay(size_t w, const std::vector<int64_t>& plan, Replay replay, int out_fd) {
    dup2(out_fd, 1);
    dup2(log_fds_[w], 2);
    std::string cases;
    for (int64_t i : plan) cases += (cases.empty() ? "" : ",") + std::to_string(i);
    std::vector<std::string> args = {argv0_, "--seed", std::to_string(o_.seed), "--timeout-ms", std::to_string(o_.timeout_ms),
                                     "--threads", std::to_string(o_.threads), "--library", o_.library,
                                     "--reload-every", "1", "--leak-every", replay == Replay::PerCase ? "1" : "1000000000",
                                     "--worker-cases", cases,
                                     "--slot-fd", std::to_string(slot_fd_), "--slot-index", std::to_string(w)};
    if (!o_.ops.empty()) {
      std::string names;
      for (const std::string& n : o_.ops) names += (names.empty() ? "" : ",") + n;
      args.insert(args.end(), {"--op", names});
    }
    const char* env = getenv("ASAN_OPTIONS");
    std::string asan = std::string(env ? env : "") + (env && *env ? ":" : "") + "fast_unwind_on_malloc=0:malloc_context_size=40";
    setenv("ASAN_OPTIONS", asan.c_str(), 1);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    std::cerr << "opbridge_fuzz: cannot exec the leak replay: " << std::strerror(errno) << "\n";
    _exit(kExitSetup);
  }

  void wait_all() {
    while (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.pid > 0; })) step();
  }

  void step() {
    progress();
    std::vector<pollfd> fds;
    for (const Worker& w : workers_)
      if (w.pid > 0) fds.push_back({w.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
    for (size_t w = 0; w < workers_.size(); ++w) {
      Worker& wk = workers_[w];
      if (wk.pid <= 0) continue;
      drain(wk, false);
      int status = 0;
      if (waitpid(wk.pid, &status, WNOHANG) == wk.pid) {
        drain(wk, true);
        ended(w, status);
        continue;
      }
      // The worker's own watchdog failed to end a case in time: the supervisor does.
      const int64_t started = slots_[w].started_ms.load();
      if (started > 0 && now_ms() - started > o_.timeout_ms + 30000) kill(wk.pid, SIGKILL);
    }
  }

  void drain(Worker& wk, bool until_eof) {
    char b[65536];
    for (;;) {
      pollfd p{wk.fd, POLLIN, 0};
      if (!until_eof && poll(&p, 1, 0) <= 0) break;
      ssize_t n = read(wk.fd, b, sizeof b);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      wk.buf.append(b, static_cast<size_t>(n));
    }
    while (wk.buf.size() >= 16) {
      int64_t index;
      int32_t kind;
      uint32_t len;
      std::memcpy(&index, wk.buf.data(), 8);
      std::memcpy(&kind, wk.buf.data() + 8, 4);
      std::memcpy(&len, wk.buf.data() + 12, 4);
      if (wk.buf.size() < 16 + len) break;
      record(wk, index, kind, wk.buf.substr(16, len));
      wk.buf.erase(0, 16 + len);
    }
  }

  void record(Worker& wk, int64_t index, int32_t kind, const std::string& msg) {
    const uint64_t seed = case_seed(o_, index);
    if (kind == kRecLeak) {
      const size_t nl = msg.find('\n');
      std::istringstream list(msg.substr(0, nl));
      std::vector<int64_t> batch;
      for (int64_t i; list >> i;) batch.push_back(i);
      wk.leaked = true;
      if (wk.replay == Replay::PerCase) fail(index, "leak", "memory leaked (LeakSanitizer)", msg.substr(nl + 1));
      if (wk.replay == Replay::No) leak_batches_.push_back({batch, msg.substr(nl + 1)});
      return;
    }
    if (wk.replay != Replay::No) return;  // counted in the campaign already
    done(index);
    if (o_.verbose) {
      std::cout << "case " << index << " " << hex(seed) << " " << generate_case(case_op(ops_, seed), seed).describe()
                << "\n   -> " << (kind == kRecResult ? "result" : kind == kRecExpected ? "error: " + msg : "FAILURE: " + msg)
                << "\n";
    }
    if (kind == kRecExpected) ++errors_, ++per_op_[case_op(ops_, seed).name].errors;
    if (kind == kRecFailure) fail(index, "check", msg, "");
  }

  // A line a minute on long campaigns.
  void progress() {
    const int64_t now = now_ms();
    if (last_progress_ms_ == 0) last_progress_ms_ = start_ms_ = now;
    if (now - last_progress_ms_ < 60000) return;
    last_progress_ms_ = now;
    std::cout << "progress: " << done_ << " of " << o_.cases << " cases, " << failures_.size() << " failures (known included), "
              << done_ * 1000 / std::max<int64_t>(1, now - start_ms_) << " cases/s" << std::endl;
  }

  void done(int64_t index) {
    ++done_;
    ++per_op_[case_op(ops_, case_seed(o_, index)).name].cases;
  }

  // A worker ended: after its last case, or the case it was running crashed or hung; a new
  // worker goes on with the cases after that one.
  void ended(size_t w, int status) {
    Worker& wk = workers_[w];
    close(wk.fd);
    wk.pid = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    const std::string report = read_all(wk.log_fd);
    if (WIFEXITED(status) && WEXITSTATUS(status) == kExitSetup) {
      std::cerr << report;
      std::exit(2);
    }
    const int64_t index = slots_[w].current.load();
    auto at = std::find(wk.plan.begin(), wk.plan.end(), index);
    if (index < 0 || at == wk.plan.end()) {
      fail(index, "crash", "the worker died outside a case", report);
      return;
    }
    const std::string during = std::string(slots_[w].reloading.load() ? " while reloading the op library (before this case)" : "") +
                               (wk.replay != Replay::No ? " (in the leak replay)" : "");
    if (wk.replay == Replay::No) done(index);
    if (WIFEXITED(status) && WEXITSTATUS(status) == kExitTimeout) {
      fail(index, "timeout", "no result after " + std::to_string(o_.timeout_ms) + " ms" + during, report);
    } else {
      const std::string how = WIFSIGNALED(status) ? std::string("was killed by signal ") + strsignal(WTERMSIG(status))
                                                  : "exited with status " + std::to_string(WEXITSTATUS(status));
      fail(index, "crash", "the worker " + how + during, report);
    }
    const bool leaked = wk.leaked;
    spawn(w, std::vector<int64_t>(at + 1, wk.plan.end()), wk.replay);
    workers_[w].leaked |= leaked;
  }

  // New leaks seen in batches of cases: each batch again with whole stacks, unless its leaks are
  // ones a replay already found to be suppressed (ONNX Runtime's own: every worker process has
  // them once).
  void replay_leaks() {
    std::set<std::string> cleared;
    for (const LeakBatch& b : leak_batches_) {
      std::vector<std::string> keys;
      for (const std::string& block : split_blocks(b.report)) keys.push_back(leak_key(block));
      if (std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return cleared.count(k); })) continue;
      std::cout << "leak check: new leaks after cases " << b.cases.front() << ".." << b.cases.back()
                << "; replaying them with whole stacks\n";
      const bool ours = b.report.find(" in opbridge::") != std::string::npos || b.report.find("libopbridge") != std::string::npos;
      if (!replay(b.cases, Replay::Batch) && !ours) {
        cleared.insert(keys.begin(), keys.end());
        std::cout << "leak check: gone with whole stacks: suppressed as ONNX Runtime's own (tests/fuzz/lsan.supp), "
                     "or not repeatable; no opbridge frame in:\n";
        for (const std::string& line : lines_of(b.report)) std::cout << "  | " << line << "\n";
        continue;
      }
      if (!replay(b.cases, Replay::PerCase))
        fail(b.cases.back(), "leak", "memory leaked in cases " + std::to_string(b.cases.front()) + ".." +
             std::to_string(b.cases.back()) + ", but in no case on its own", b.report);
    }
  }
  bool replay(const std::vector<int64_t>& cases, Replay how) {  // true: it leaked
    spawn(0, cases, how);
    bool leaked = false;
    while (workers_[0].pid > 0) {
      step();
      leaked |= workers_[0].leaked;
    }
    return leaked;
  }
  static std::vector<std::string> split_blocks(const std::string& report) {
    std::vector<std::string> out;
    for (const std::string& line : lines_of(report)) {
      if (line.find("leak of") != std::string::npos) out.emplace_back();
      if (!out.empty()) out.back() += line + "\n";
    }
    return out;
  }

  // ---- reporting ----
  std::string repro(uint64_t seed) const {
    std::string cmd = argv0_ + " --op " + case_op(ops_, seed).name + " --case-seed " + hex(seed) + " --timeout-ms " +
                      std::to_string(o_.timeout_ms);
    if (o_.library != OPBRIDGE_ORT_LIBRARY) cmd += " --library " + o_.library;
    return cmd;
  }

  // A short, stable signature: failures with the same one are counted, and printed once.
  std::string signature(const Failure& f) const {
    std::string key = f.message;
    bool summary = false;
    for (const std::string& line : lines_of(f.report)) {
      if (line.find("SUMMARY:") != std::string::npos) key = line, summary = true;
      if (!summary && line.find("runtime error:") != std::string::npos) key = line.substr(line.rfind('/') + 1), summary = true;
    }
    if (f.kind == "leak" || f.kind == "timeout") key = f.kind == "leak" ? first_frame(f.report) : "";
    std::string s = case_op(ops_, f.seed).name + " " + f.kind + " ";
    for (char ch : key.substr(0, 160))
      if (!std::isdigit(static_cast<unsigned char>(ch))) s += ch;
      else if (s.back() != '#') s += '#';
    return s;
  }
  static std::string first_frame(const std::string& report) {  // the first frame in opbridge code
    for (const std::string& l : lines_of(report))
      if (l.find(" in opbridge::") != std::string::npos) return l.substr(l.find(" in ") + 4);
    return "";
  }

  std::string known_id(int64_t index, uint64_t seed, const std::string& kind, const std::string& text) const {
    const std::string all = generate_case(case_op(ops_, seed), seed).describe() + "\n" + text;
    for (const Known& k : known_)
      if ((k.kind == "any" || k.kind == kind) && std::regex_search(all, k.re)) return k.id;
    return "";
  }

  void fail(int64_t index, const std::string& kind, const std::string& message, const std::string& report) {
    const uint64_t seed = case_seed(o_, std::max<int64_t>(index, 0));
    Failure f{index, seed, kind, message, report, known_id(index, seed, kind, message + "\n" + report)};
    const std::string sig = signature(f);
    Sig& s = sigs_[sig];
    if (s.count++ == 0) {
      s.first_seed = seed, s.known = f.known, s.order = sigs_.size();
      const OpSpec& op = case_op(ops_, seed);
      std::cout << (f.known.empty() ? "FAILURE" : "known defect '" + f.known + "'") << " [" << kind << "] "
                << op.qualified_name() << ": " << message << "\n"
                << "  case " << index << ": " << generate_case(op, seed).describe() << "\n"
                << "  case seed " << hex(seed) << "; repro: " << repro(seed) << "\n";
      if (!report.empty() && (f.known.empty() || o_.verbose)) {
        const std::string r = report.size() > 8000 ? report.substr(0, 8000) + "\n[... report cut]" : report;
        for (const std::string& line : lines_of(r)) std::cout << "  | " << line << "\n";
      }
      std::cout.flush();
    }
    failures_.push_back(std::move(f));
  }

  void print_summary(double seconds) {
    int64_t unknown = 0, known = 0;
    for (const Failure& f : failures_) (f.known.empty() ? unknown : known)++;
    if (!sigs_.empty()) {
      std::vector<std::pair<std::string, const Sig*>> v;
      for (const auto& [k, s] : sigs_) v.push_back({k, &s});
      std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second->order < b.second->order; });
      std::cout << "distinct failures:\n";
      for (const auto& [k, s] : v)
        std::cout << "  " << s->count << " x " << (s->known.empty() ? "" : "[known " + s->known + "] ") << k
                  << "\n      first: " << repro(s->first_seed) << "\n";
    }
    if (o_.verbose || ops_.size() > 1) {
      std::cout << "per op:";
      for (const auto& [name, s] : per_op_) std::cout << " " << name << " " << s.cases << " (" << s.errors << " errors)";
      std::cout << "\n";
    }
    char t[32];
    std::snprintf(t, sizeof t, "%.1f", seconds);
    std::cout << done_ << " cases, " << ops_.size() << " ops, " << errors_ << " errors (expected), " << unknown
              << " failures, " << t << " s";
    if (known) std::cout << " (" << known << " more are known defects, listed in " << o_.known << ")";
    std::cout << "\n";
  }

  struct Sig {
    int64_t count = 0;
    uint64_t first_seed = 0;
    std::string known;
    size_t order = 0;
  };
  struct PerOp {
    int64_t cases = 0, errors = 0;
  };
  struct LeakBatch {
    std::vector<int64_t> cases;
    std::string report;
  };

  const Options& o_;
  const std::vector<const OpSpec*>& ops_;
  std::vector<Known> known_;
  std::string argv0_;
  int slot_fd_ = -1;
  Slot* slots_ = nullptr;
  std::vector<int> log_fds_;
  std::vector<Worker> workers_;
  int64_t done_ = 0, errors_ = 0, start_ms_ = 0, last_progress_ms_ = 0;
  std::vector<Failure> failures_;
  std::vector<LeakBatch> leak_batches_;
  std::map<std::string, Sig> sigs_;
  std::map<std::string, PerOp> per_op_;
};

}  // namespace

int run_campaign(const Options& o, const std::vector<const OpSpec*>& ops, const std::string& argv0) {
  return Campaign(o, ops, argv0).run();
}

}  // namespace opbridge::fuzz
