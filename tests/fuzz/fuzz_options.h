// The fuzz driver's options and the pieces the supervisor and its workers share: how a case's
// seed and op follow from the campaign, the records a worker sends, the per-worker slot in
// shared memory.
#pragma once

#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <opbridge/op_spec.h>

namespace opbridge::fuzz {

struct Options {
  uint64_t seed = 1;
  int64_t cases = 1000;
  int64_t first = 0;             // the campaign's cases are first .. first + cases - 1
  std::vector<std::string> ops;  // empty: every op with a kernel
  int64_t timeout_ms = 10000;
  int jobs = 1;
  int threads = 2;               // ONNX Runtime's intra-op pool, per worker
  int64_t reload_every = 200;    // cases between reloads of the op library in a worker (0: never)
  int64_t leak_every = 100;      // cases between LeakSanitizer checks in a worker (0: never)
  std::string known;             // the known-defects file
  std::string library;           // libopbridge_ort.so
  std::string save_models;       // write the model of every case with a result here
  std::optional<uint64_t> case_seed;
  bool verbose = false, list_ops = false;
  // Internal: a worker started by exec (the leak replay), its cases and its slot.
  std::vector<int64_t> worker_cases;
  int slot_fd = -1, slot_index = -1;
};

inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Case `index` of the campaign: its seed, and from the seed its op (so --op NAME --case-seed X
// is the whole case).
inline uint64_t case_seed(const Options& o, int64_t index) {
  return o.case_seed ? *o.case_seed : mix(mix(o.seed) ^ static_cast<uint64_t>(index));
}
inline const OpSpec& case_op(const std::vector<const OpSpec*>& ops, uint64_t seed) {
  return *ops[(seed >> 32) % ops.size()];
}

inline std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%016" PRIx64, v);
  return b;
}

// Per worker, in shared memory: the case it is running, since when, and whether it is
// reloading the op library.
struct Slot {
  std::atomic<int64_t> current{-1};
  std::atomic<int64_t> started_ms{0};
  std::atomic<int> reloading{0};
};

// Records from a worker: case index, kind, message (a leak record's message lists the cases
// checked, then the new leak reports).
enum : int32_t { kRecResult = 0, kRecExpected = 1, kRecFailure = 2, kRecLeak = 3 };
// How a worker ends besides 0 (all its cases done) and crashes.
constexpr int kExitTimeout = 86, kExitSetup = 88;

int64_t now_ms();

}  // namespace opbridge::fuzz
