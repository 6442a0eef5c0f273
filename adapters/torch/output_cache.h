// Memory for large op outputs in PyTorch eager, kept for reuse when their tensors die.
//
// A fresh multi-megabyte CPU tensor is new address space that the OS faults in and zeroes page by
// page on the kernel's first write (an 80 MB output: ~30 ms, several times a memory-speed
// kernel's own time), on every call. ONNX Runtime reuses its arena between runs; this does the
// same for eager with a BlockCache (<opbridge/block_cache.h>): a block freed by its tensor is kept
// and handed to the next output it fits. Small outputs (below 1 MiB) go to PyTorch's allocator,
// whose malloc reuses them anyway. OPBRIDGE_OUTPUT_CACHE_MB (default 1024; 0 turns the cache off)
// caps the bytes held by blocks no tensor uses, per op library.
#pragma once

#include <c10/core/Allocator.h>

namespace opbridge {

// The allocator for op outputs: c10's CPU allocator for small sizes or with the cache off.
c10::Allocator* output_allocator(size_t nbytes);

}  // namespace opbridge
