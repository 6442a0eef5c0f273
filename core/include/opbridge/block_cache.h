// Large blocks of memory kept for reuse once their user is done with them.
//
// A fresh multi-megabyte block from malloc is new address space (glibc maps it anew and unmaps it
// when freed), which the OS faults in and zeroes page by page on first write: for a memory-speed
// kernel, several times the kernel's own time on every call. ONNX Runtime's arena avoids that for
// its tensors; a BlockCache does the same for what opbridge allocates itself: kernel scratch
// (KernelContext::scratch) and, in PyTorch eager, op outputs (adapters/torch/output_cache.cc).
// Blocks below kMinCached bytes are plain malloc (which reuses small blocks itself).
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

namespace opbridge {

class BlockCache {
 public:
  static constexpr size_t kMinCached = size_t{1} << 20;

  // `cap`: the most bytes of unused blocks it keeps (0: keeps nothing). fork() takes the lock of
  // every cache while it copies the process, so a forked child's caches are never locked for good
  // (block_cache.cc).
  explicit BlockCache(size_t cap);
  ~BlockCache();  // frees the kept blocks (blocks still taken are their users')
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A 64-byte aligned block of at least n bytes: the smallest kept block that fits without being
  // more than twice n, else a new one. `size` receives the block's real size, for give().
  // Throws std::bad_alloc when memory is exhausted.
  void* take(size_t n, size_t& size);
  // Hands back a block from take(): kept, dropping the oldest kept blocks beyond the cap.
  void give(void* block, size_t size);

  // A cap in MiB from an environment variable, else `default_mb`.
  static size_t cap_from_env(const char* variable, size_t default_mb);

 private:
  struct Kept {
    void* block;
    size_t size;
  };
  const size_t cap_;
  std::mutex mutex_;
  std::vector<Kept> kept_;  // oldest first
  size_t held_ = 0;
};

// The process's cache for kernel scratch: OPBRIDGE_SCRATCH_CACHE_MB (default 512; 0 turns it off).
BlockCache& scratch_cache();

}  // namespace opbridge
