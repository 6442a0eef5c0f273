#include "fuzz_worker.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "fuzz_case.h"
#include "fuzz_run.h"
#include "sanitizer_hooks.h"

namespace opbridge::fuzz {

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

namespace {

void write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(3);  // the supervisor is gone
    c += w, n -= static_cast<size_t>(w);
  }
}

void send(int fd, int64_t index, int32_t kind, const std::string& msg) {
  const uint32_t len = static_cast<uint32_t>(std::min<size_t>(msg.size(), 1 << 20));
  char head[16];
  std::memcpy(head, &index, 8);
  std::memcpy(head + 8, &kind, 4);
  std::memcpy(head + 12, &len, 4);
  write_all(fd, head, 16);
  write_all(fd, msg.data(), len);
}

std::string read_from(int fd, off_t off) {
  std::string s;
  char b[65536];
  ssize_t n;
  while ((n = pread(fd, b, sizeof b, off)) > 0) s.append(b, static_cast<size_t>(n)), off += n;
  return s;
}

// The leak reports ("Direct leak of ..." / "Indirect leak of ..." up to the next empty line) of
// a LeakSanitizer report. Leaked memory stays leaked, so every later check repeats them: a
// worker reports only the ones it has not seen.
std::vector<std::string> leak_blocks(const std::string& report) {
  std::vector<std::string> out;
  std::stringstream ss(report);
  std::string block;
  bool in = false;
  for (std::string line; std::getline(ss, line);) {
    if (line.find("Direct leak of") != std::string::npos || line.find("Indirect leak of") != std::string::npos) {
      if (in) out.push_back(block);
      block.clear();
      in = true;
    } else if (in && line.empty()) {
      out.push_back(block);
      in = false;
      continue;
    }
    if (in) block += line + "\n";
  }
  if (in) out.push_back(block);
  return out;
}

// The per-case watchdog: past the timeout it interrupts the main thread, whose handler prints
// where it is and ends the worker.
pthread_t g_main_thread;
void on_timeout(int) {
  const char msg[] = "opbridge_fuzz: case timed out; the worker's main thread is at:\n";
  (void)!::write(2, msg, sizeof msg - 1);
  print_stack_trace();
  _exit(kExitTimeout);
}

void start_watchdog(Slot* slot, int64_t timeout_ms) {
  g_main_thread = pthread_self();
  signal(SIGUSR2, on_timeout);
  std::thread([slot, timeout_ms] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const int64_t started = slot->started_ms.load();
      if (started > 0 && now_ms() - started > timeout_ms) {
        pthread_kill(g_main_thread, SIGUSR2);
        std::this_thread::sleep_for(std::chrono::seconds(5));
        _exit(kExitTimeout);  // the handler did not get to run
      }
    }
  }).detach();
}

}  // namespace

void run_worker(const Options& o, const std::vector<const OpSpec*>& ops, const std::vector<int64_t>& cases,
                Slot* slot, int out_fd, int log_fd) {
  dup2(log_fd, 2);
  if (!sanitized_build()) {
    // A kernel that allocates what a hostile size asks for fails here instead of exhausting the
    // machine (with AddressSanitizer, its allocator limits do this: max_allocation_size_mb).
    rlimit lim{8ull << 30, 8ull << 30};
    setrlimit(RLIMIT_AS, &lim);
  }
  start_watchdog(slot, o.timeout_ms);

  std::unique_ptr<Runner> runner;
  try {
    runner = std::make_unique<Runner>(o.library, o.threads);
  } catch (const std::exception& e) {
    std::cerr << "opbridge_fuzz: cannot set up ONNX Runtime with " << o.library << ": " << e.what() << "\n";
    _exit(kExitSetup);
  }
  std::set<std::string> seen_leaks;
  std::vector<int64_t> unchecked;  // cases run since the last leak check
  for (size_t k = 0; k < cases.size(); ++k) {
    const int64_t i = cases[k];
    const uint64_t cs = case_seed(o, i);
    const OpSpec& op = case_op(ops, cs);
    (void)!ftruncate(log_fd, 0);
    slot->current.store(i);
    slot->started_ms.store(now_ms());
    if (o.reload_every > 0 && k > 0 && k % static_cast<size_t>(o.reload_every) == 0) {
      slot->reloading.store(1);
      runner->reload();
      slot->reloading.store(0);
    }
    Outcome out;
    {
      Case c = generate_case(op, cs);
      try {
        out = runner->run(c);
      } catch (const std::exception& e) {
        out = {Outcome::Kind::Failure, std::string("unexpected exception in the driver: ") + e.what()};
      }
      if (!o.save_models.empty() && out.kind == Outcome::Kind::Result) {
        std::ofstream f(o.save_models + "/" + op.name + "-" + hex(cs) + ".onnx", std::ios::binary);
        f << serialize(c.model());
      }
    }
    slot->started_ms.store(0);
    send(out_fd, i, out.kind == Outcome::Kind::Result ? kRecResult
                    : out.kind == Outcome::Kind::ExpectedError ? kRecExpected : kRecFailure,
         out.message);
    unchecked.push_back(i);
    // LeakSanitizer in batches (a check scans the whole heap); new leaks name the batch, and
    // the supervisor replays its cases one by one to find the one that leaks.
    if (o.leak_every > 0 && (unchecked.size() >= static_cast<size_t>(o.leak_every) || k + 1 == cases.size())) {
      slot->started_ms.store(now_ms());  // a check that hangs is caught too
      const off_t off = lseek(log_fd, 0, SEEK_END);
      if (leak_check()) {
        std::string fresh;
        for (const std::string& b : leak_blocks(read_from(log_fd, off)))
          if (seen_leaks.insert(b).second) fresh += b + "\n";
        if (!fresh.empty()) {
          std::string list;
          for (int64_t u : unchecked) list += std::to_string(u) + " ";
          send(out_fd, i, kRecLeak, list + "\n" + fresh);
        }
      }
      slot->started_ms.store(0);
      unchecked.clear();
    }
  }
  slot->current.store(-1);
  _exit(0);
}

}  // namespace opbridge::fuzz
