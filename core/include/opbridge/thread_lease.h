// Storage a runtime adapter keeps per thread and lends to one kernel call at a time, so that a
// warm call allocates nothing of its own. A call that finds the thread's storage in use (a call
// inside another on one thread: never expected of the runtimes) gets fresh storage instead.
#pragma once

#include <optional>

namespace opbridge {

template <typename T>  // T: default-constructible storage with a `bool in_use` member
class ThreadLease {
 public:
  explicit ThreadLease(T& kept) : used_(kept.in_use ? own_.emplace() : kept) { used_.in_use = true; }
  ~ThreadLease() { used_.in_use = false; }
  ThreadLease(const ThreadLease&) = delete;
  ThreadLease& operator=(const ThreadLease&) = delete;
  T& get() { return used_; }

 private:
  std::optional<T> own_;  // built only when the kept storage is in use: a warm call builds nothing
  T& used_;
};

}  // namespace opbridge
