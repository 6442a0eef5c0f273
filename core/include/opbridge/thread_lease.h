// Storage a runtime adapter keeps per thread and lends to one kernel call at a time, so that a
// warm call allocates nothing of its own. A call that finds the thread's storage in use (a call
// inside another on one thread: never expected of the runtimes) gets fresh storage instead.
#pragma once

namespace opbridge {

template <typename T>  // T: default-constructible storage with a `bool in_use` member
class ThreadLease {
 public:
  explicit ThreadLease(T& kept) : kept_(kept), fresh_(kept.in_use) { get().in_use = true; }
  ~ThreadLease() { get().in_use = false; }
  ThreadLease(const ThreadLease&) = delete;
  ThreadLease& operator=(const ThreadLease&) = delete;
  T& get() { return fresh_ ? own_ : kept_; }

 private:
  T& kept_;
  bool fresh_;
  T own_{};
};

}  // namespace opbridge
