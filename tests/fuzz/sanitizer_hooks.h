// What the fuzz driver needs from the sanitizers when it is built with them (scripts/sanitize.sh),
// and stand-ins when it is not.
#pragma once

namespace opbridge::fuzz {

// Built with AddressSanitizer (and so LeakSanitizer).
bool sanitized_build();
// Prints the calling thread's stack to stderr; async-signal-tolerant enough for a dying worker.
void print_stack_trace();
// LeakSanitizer's check now: true (and the report on stderr) when memory was leaked. Always
// false without LeakSanitizer.
bool leak_check();

}  // namespace opbridge::fuzz
