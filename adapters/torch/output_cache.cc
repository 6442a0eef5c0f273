#include "output_cache.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace opbridge {
namespace {

constexpr size_t kMinCached = size_t{1} << 20;  // below: malloc reuses freed memory itself
constexpr size_t kAlignment = 64;

size_t cap_from_env() {
  const char* v = std::getenv("OPBRIDGE_OUTPUT_CACHE_MB");
  if (!v || !*v) return size_t{1024} << 20;
  char* end = nullptr;
  const unsigned long long mb = std::strtoull(v, &end, 10);
  return *end == '\0' ? static_cast<size_t>(mb) << 20 : size_t{1024} << 20;
}

class OutputCache final : public c10::Allocator {
 public:
  explicit OutputCache(size_t cap) : cap_(cap) {}

  c10::DataPtr allocate(size_t n) override {
    Block* b = take(n);
    if (!b) {
      void* p = nullptr;
      if (posix_memalign(&p, kAlignment, n) != 0)
        TORCH_CHECK_WITH(OutOfMemoryError, false, "cannot allocate ", n, " bytes: out of memory");
      b = new Block{p, n, this};
    }
    return {b->ptr, b, &release, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

 private:
  struct Block {
    void* ptr;
    size_t size;
    OutputCache* owner;
  };

  // The smallest free block that holds n bytes without wasting more than half of itself.
  Block* take(size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i]->size >= n && free_[i]->size / 2 <= n && (best == free_.size() || free_[i]->size < free_[best]->size))
        best = i;
    if (best == free_.size()) return nullptr;
    Block* b = free_[best];
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    held_ -= b->size;
    return b;
  }

  static void release(void* ctx) {
    Block* b = static_cast<Block*>(ctx);
    b->owner->keep(b);
  }

  // Keeps b, dropping the oldest free blocks beyond the cap (b itself when it alone exceeds it).
  void keep(Block* b) {
    std::vector<Block*> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.push_back(b);
      held_ += b->size;
      while (held_ > cap_) {
        dropped.push_back(free_.front());
        held_ -= free_.front()->size;
        free_.erase(free_.begin());
      }
    }
    for (Block* d : dropped) {
      std::free(d->ptr);
      delete d;
    }
  }

  const size_t cap_;
  std::mutex mutex_;
  std::vector<Block*> free_;  // oldest first
  size_t held_ = 0;
};

}  // namespace

c10::Allocator* output_allocator(size_t nbytes) {
  // Never destroyed: tensors holding its blocks may outlive every static object.
  static OutputCache* const cache = [] {
    const size_t cap = cap_from_env();
    return cap ? new OutputCache(cap) : nullptr;
  }();
  return cache && nbytes >= kMinCached ? cache : c10::GetCPUAllocator();
}

}  // namespace opbridge
