#include "sanitizer_hooks.h"

#include <execinfo.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OPBRIDGE_FUZZ_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define OPBRIDGE_FUZZ_ASAN 1
#endif

#ifdef OPBRIDGE_FUZZ_ASAN
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>

// Defaults for the fuzzer's own process (ASAN_OPTIONS adds to and overrides them):
// - allocator_may_return_null=1, max_allocation_size_mb=4096: a hostile size that reaches malloc
//   (ONNX Runtime's allocator, the kernel harness) fails like it would without ASan, as an error;
//   `operator new` still reports it, so a kernel that allocates what an input asks for is found.
// - detect_leaks=1: the driver runs LeakSanitizer after every case (leak_check()).
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1:max_allocation_size_mb=4096:detect_leaks=1";
}
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }

// ONNX Runtime allocates tensors with the throwing `operator new`, which AddressSanitizer turns
// into a fatal out-of-memory report when it fails, where an uninstrumented process would throw
// std::bad_alloc and ONNX Runtime would return an error status. An output of a hostile size
// (say 2^32 rows from an empty input) is refused that way in production; so when the caller is
// ONNX Runtime itself, a failed allocation throws as it would there. Any other caller (opbridge
// code: a kernel's own buffers) still gets AddressSanitizer's report.
#include <dlfcn.h>

#include <cstring>
#include <new>

namespace {
bool called_from_onnxruntime(void* return_address) {
  Dl_info info;
  return dladdr(return_address, &info) && info.dli_fname && std::strstr(info.dli_fname, "libonnxruntime");
}
template <typename F>
F next_definition(const char* mangled) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, mangled));
}
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = ::operator new(n, std::nothrow)) return p;
  if (called_from_onnxruntime(__builtin_return_address(0))) throw std::bad_alloc();
  static auto asan_new = next_definition<void* (*)(std::size_t)>("_Znwm");
  return asan_new(n);  // reports
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = ::operator new(n, a, std::nothrow)) return p;
  if (called_from_onnxruntime(__builtin_return_address(0))) throw std::bad_alloc();
  static auto asan_new = next_definition<void* (*)(std::size_t, std::align_val_t)>("_ZnwmSt11align_val_t");
  return asan_new(n, a);  // reports
}
#endif

namespace opbridge::fuzz {

#ifdef OPBRIDGE_FUZZ_ASAN
bool sanitized_build() { return true; }
void print_stack_trace() { __sanitizer_print_stack_trace(); }
bool leak_check() { return __lsan_do_recoverable_leak_check() != 0; }
#else
bool sanitized_build() { return false; }
void print_stack_trace() {
  void* frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
}
bool leak_check() { return false; }
#endif

}  // namespace opbridge::fuzz
