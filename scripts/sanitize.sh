#!/usr/bin/env bash
# Build the whole project with AddressSanitizer and UndefinedBehaviorSanitizer (clang 14) in
# build-sanitize/ and run the test suite there; any report fails the test it happens in.
#   scripts/sanitize.sh [SANITIZERS] [-- CTEST-ARGS...]    (default address,undefined)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
sanitizers="address,undefined"
if [[ $# -gt 0 && "$1" != "--" ]]; then
  sanitizers="$1"
  shift
fi
[[ "${1:-}" == "--" ]] && shift
build="$root/build-sanitize"
CXX=clang++-14 CC=clang-14 cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DPARC_SANITIZE=$sanitizers" >/dev/null
cmake --build "$build"
# A report is an error (exit status 1 after the report), leaks included; OpenMPI's lifetime
# allocations are suppressed (test/sanitizer/lsan.supp). lit forwards these variables.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
# OpenMPI unloads its components (mca_*.so) before LeakSanitizer looks, which leaves their
# allocations in "<unknown module>" where no suppression can name them: keep them loaded.
export OMPI_MCA_mca_base_component_disable_dlclose=1
# LeakSanitizer records each allocation's stack with the fast (frame-pointer) unwinder, except
# in the processes mpirun starts: system libraries have no frame pointers, so there the fast
# unwinder stops inside OpenMPI and lsan.supp would never see the frames it names. mpirun sets
# the slow unwinder for its ranks only (OpenMPI's mca_base_env_list); everywhere else it made
# parc ten times slower (a 1 MiB line of statements: 102 s instead of 9.6 s).
lsan="suppressions=$root/test/sanitizer/lsan.supp:print_suppressions=0"
export LSAN_OPTIONS="$lsan"
export OMPI_MCA_mca_base_env_list="LSAN_OPTIONS=$lsan:fast_unwind_on_malloc=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Instrumented code runs several times slower: the time limits of the hostile-input tests
# (test/lit/torture) stretch by this factor, so they still catch a hang but not the slowdown.
export PARC_TEST_TIME_SCALE="${PARC_TEST_TIME_SCALE:-10}"
cd "$build"
ctest --output-on-failure -j2 "$@"
