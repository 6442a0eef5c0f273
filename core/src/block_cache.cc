#include <opbridge/block_cache.h>

#include <cstdlib>
#include <new>

namespace opbridge {

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
