#include "output_cache.h"

#include <opbridge/block_cache.h>

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <new>

namespace opbridge {
namespace {

// Op outputs as c10 storage on blocks of a BlockCache: a freed output's block goes back to it.
class OutputCache final : public c10::Allocator {
 public:
  explicit OutputCache(size_t cap) : blocks_(cap) {}

  c10::DataPtr allocate(size_t n) override {
    Held* h = new Held{nullptr, 0, this};
    try {
      h->block = blocks_.take(n, h->size);
    } catch (const std::bad_alloc&) {
      delete h;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "cannot allocate ", n, " bytes: out of memory");
    }
    return {h->block, h, &release, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

 private:
  struct Held {
    void* block;
    size_t size;
    OutputCache* owner;
  };
  static void release(void* ctx) {
    Held* h = static_cast<Held*>(ctx);
    h->owner->blocks_.give(h->block, h->size);
    delete h;
  }
  BlockCache blocks_;
};

}  // namespace

c10::Allocator* output_allocator(size_t nbytes) {
  // Never destroyed: tensors holding its blocks may outlive every static object.
  static OutputCache* const cache = [] {
    const size_t cap = BlockCache::cap_from_env("OPBRIDGE_OUTPUT_CACHE_MB", 1024);
    return cap ? new OutputCache(cap) : nullptr;
  }();
  return cache && nbytes >= BlockCache::kMinCached ? cache : c10::GetCPUAllocator();
}

}  // namespace opbridge
