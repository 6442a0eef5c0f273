#include <opbridge/block_cache.h>

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <new>

namespace opbridge {
namespace {

// fork() copies a lock that another thread holds as held, and the child has no thread to release
// it: a child forked while another thread was inside take or give (a DataLoader worker forked
// while a thread runs ops) would wait forever for its first large block. So, as glibc does for
// malloc's locks, fork takes the lock of every cache first and each side releases them after.
struct ForkLocks {
  std::mutex mutex;  // guards `caches`; taken before their locks
  std::vector<std::mutex*> caches;
};

ForkLocks& fork_locks();

void lock_all() {
  ForkLocks& f = fork_locks();
  f.mutex.lock();
  for (std::mutex* m : f.caches) m->lock();
}

void unlock_all() {
  ForkLocks& f = fork_locks();
  for (auto m = f.caches.rbegin(); m != f.caches.rend(); ++m) (*m)->unlock();
  f.mutex.unlock();
}

ForkLocks& fork_locks() {
  // Never destroyed: a cache may be destroyed, or the process fork, while statics are torn down.
  static ForkLocks* const locks = [] {
    auto* f = new ForkLocks;
    pthread_atfork(lock_all, unlock_all, unlock_all);
    return f;
  }();
  return *locks;
}

}  // namespace

BlockCache::BlockCache(size_t cap) : cap_(cap) {
  ForkLocks& f = fork_locks();
  std::lock_guard<std::mutex> lock(f.mutex);
  f.caches.push_back(&mutex_);
}

void* BlockCache::take(size_t n, size_t& size) {
  if (n >= kMinCached && cap_ > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t best = kept_.size();
    for (size_t i = 0; i < kept_.size(); ++i)
      if (kept_[i].size >= n && kept_[i].size / 2 <= n && (best == kept_.size() || kept_[i].size < kept_[best].size))
        best = i;
    if (best < kept_.size()) {
      const Kept k = kept_[best];
      kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(best));
      held_ -= k.size;
      size = k.size;
      return k.block;
    }
  }
  void* p = nullptr;
  if (posix_memalign(&p, 64, n ? n : 1) != 0) throw std::bad_alloc();
  size = n;
  return p;
}

void BlockCache::give(void* block, size_t size) {
  if (size < kMinCached || size > cap_) return std::free(block);
  std::vector<void*> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_.push_back({block, size});
    held_ += size;
    while (held_ > cap_) {
      dropped.push_back(kept_.front().block);
      held_ -= kept_.front().size;
      kept_.erase(kept_.begin());
    }
  }
  for (void* d : dropped) std::free(d);
}

BlockCache::~BlockCache() {
  {
    ForkLocks& f = fork_locks();
    std::lock_guard<std::mutex> lock(f.mutex);
    f.caches.erase(std::find(f.caches.begin(), f.caches.end(), &mutex_));
  }
  for (const Kept& k : kept_) std::free(k.block);
}

size_t BlockCache::cap_from_env(const char* variable, size_t default_mb) {
  const char* v = std::getenv(variable);
  if (v && *v) {
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(v, &end, 10);
    if (*end == '\0') return static_cast<size_t>(mb) << 20;
  }
  return default_mb << 20;
}

BlockCache& scratch_cache() {
  // Never destroyed: a kernel may still run on another thread while statics are torn down.
  static BlockCache* const cache = new BlockCache(BlockCache::cap_from_env("OPBRIDGE_SCRATCH_CACHE_MB", 512));
  return *cache;
}

}  // namespace opbridge
