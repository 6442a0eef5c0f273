#!/usr/bin/env bash
# Builds the ONNX Runtime side of opbridge with AddressSanitizer (with LeakSanitizer) and
# UndefinedBehaviorSanitizer in build-sanitize/ (no PyTorch: -DOPBRIDGE_WITH_TORCH=OFF, and Torch
# cannot be found even if it were on the prefix path; CI's proof that the tree builds and its C++
# tests pass without PyTorch), then runs
#   1. the C++ kernel tests (opbridge_core_tests) and opbridge-run's unit tests,
#   2. a fuzz campaign through ONNX Runtime and libopbridge_ort.so (tests/fuzz, opbridge_fuzz),
#   3. opbridge-run on a few models the campaign saved (random inputs).
# The tests that need the Python side (the demo-model export fixture, ort_consumer_test,
# opbridge-run's CLI tests) are left out.
#
#   scripts/sanitize.sh [--cases N] [--seed S] [--jobs J] [--timeout-ms T] [--build-dir D] [--setup]
#
# --cases: fuzz cases (default 4000); --seed: the campaign seed (default: today's date, so a
# day's runs agree and days differ; every failure prints its own one-line repro); --jobs: fuzz
# worker processes (default: the number of cores); --timeout-ms: per fuzz case (default 20000);
# --build-dir: the build folder (default build-sanitize); --setup: run scripts/setup.sh first (a
# clean clone needs it once: the Debian packages and third_party/onnxruntime; PyTorch and .venv
# are not used here).
# Failures listed in tests/fuzz/known_defects.txt are reported but do not fail the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { echo "[sanitize] $*"; }

cases=4000
seed=$(date +%Y%m%d)
jobs=$(nproc)
timeout_ms=20000
bd=build-sanitize
while [ $# -gt 0 ]; do
  case "$1" in
    --cases) cases=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --timeout-ms) timeout_ms=$2; shift 2 ;;
    --build-dir) bd=$2; shift 2 ;;
    --setup) scripts/setup.sh; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "sanitize.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

ort_root=${ONNXRUNTIME_ROOT:-$root/third_party/onnxruntime}
if [ ! -f "$ort_root/include/onnxruntime_c_api.h" ]; then
  echo "sanitize.sh: no ONNX Runtime SDK at $ort_root; run scripts/setup.sh first" >&2
  exit 1
fi

# Instrumented code in every target; the flags reach the link of executables and shared
# libraries alike. UB is fatal (no recovery), so the fuzzer sees it as a crash of the case.
san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
# GCC's -Wmaybe-uninitialized misfires on instrumented SIMD intrinsics (Eigen's AVX-512 code).
# -O1 -g1 rather than RelWithDebInfo's -O2 -g: the compile is the larger part of this script's
# time and -O1 takes about half of its CPU off (docs/benchmarks.md, "The loop from clone to
# green"); -O1 is what ASan's own documentation advises, and line tables (-g1) are all a report
# needs to name file:line.
say "configuring $bd/ (ASan+UBSan, -O1 -g1, no PyTorch)"
cmake -S . -B "$bd" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DOPBRIDGE_WITH_TORCH=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON -DOPBRIDGE_BUILD_TESTS=ON -DOPBRIDGE_BUILD_FUZZ=ON \
  -DONNXRUNTIME_ROOT="$ort_root" \
  -DCMAKE_CXX_FLAGS="$san -Wno-maybe-uninitialized" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" >/dev/null
start=$(date +%s)
say "building (op library, kernel tests, opbridge-run, fuzzer)"
cmake --build "$bd" -j "${OPBRIDGE_JOBS:-$(nproc)}" \
  --target opbridge_ort opbridge_core_tests opbridge-run opbridge_run_unit_tests opbridge_fuzz
say "build done in $(( $(date +%s) - start ))s"

# libonnxruntime.so is not instrumented; the executables are, so ASan is first in the link order.
# tests/fuzz/lsan.supp says which leaks are ONNX Runtime's own.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1:max_allocation_size_mb=4096${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$root/tests/fuzz/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

say "kernel tests (opbridge_core_tests)"
"$bd"/tests/cpp/opbridge_core_tests --gtest_brief=1
say "opbridge-run unit tests"
"$bd"/tools/opbridge_run_unit_tests --gtest_brief=1

models=$(mktemp -d)
trap 'rm -rf "$models"' EXIT
say "fuzzing: $cases cases, seed $seed, $jobs jobs"
start=$(date +%s)
"$bd"/tests/fuzz/opbridge_fuzz --cases "$cases" --seed "$seed" --jobs "$jobs" \
  --timeout-ms "$timeout_ms" --save-models "$models"
say "fuzzing done in $(( $(date +%s) - start ))s"

# opbridge-run on a few of the models that ran: random inputs may be refused by the op (exit 1,
# an error message), but nothing may crash or trip a sanitizer (ASan aborts: exit 134).
say "opbridge-run on saved fuzz models"
n=0
for m in $(ls "$models" | sort | awk -F- '!seen[$1]++' | head -20); do
  set +e
  out=$(ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" "$bd"/tools/opbridge-run "$models/$m" --random --repeat 2 --threads 2 2>&1)
  rc=$?
  set -e
  if [ $rc -ne 0 ] && [ $rc -ne 1 ]; then
    echo "$out"
    echo "sanitize.sh: opbridge-run failed (exit $rc) on $m" >&2
    exit 1
  fi
  n=$((n + 1))
done
say "opbridge-run: $n models, no sanitizer report"
say "all clean"
