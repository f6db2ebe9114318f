#!/usr/bin/env bash
# The sanitizer stage of the test command: builds tilefuse's C++ libraries,
# tools, tests and fuzz target with clang-22 and -fsanitize=address,undefined
# in build-sanitize/ (LLVM's libraries stay uninstrumented; no Python
# extension), then runs its C++ suites, the lit suite through the
# instrumented tilefuse-opt/tilefuse-compile, and a time-bounded fuzz run.
# scripts/setup.sh installs clang-22 and libclang-rt-22-dev.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${TILEFUSE_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
llvm=/usr/lib/llvm-22

sanitizers=address,undefined,fuzzer-no-link  # fuzzer-no-link: coverage for the fuzzer
start=$SECONDS
if ! grep -qx "TILEFUSE_SANITIZE:STRING=$sanitizers" "$build/CMakeCache.txt" 2>/dev/null; then
  cmake -G Ninja -S "$root" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DTILEFUSE_SANITIZE=$sanitizers \
    -DTILEFUSE_BUILD_PYTHON=OFF \
    -DMLIR_DIR="$llvm/lib/cmake/mlir" \
    -DLLVM_EXTERNAL_LIT="$llvm/bin/lit"
fi
cmake --build "$build"
echo "sanitize: built in $((SECONDS - start)) s"
ctest --test-dir "$build" --no-tests=error --output-on-failure
grep -h "^stat::\(number_of_executed_units\|new_units_added\|peak_rss_mb\)" \
  "$build/Testing/Temporary/LastTest.log" | sed 's/^/sanitize: fuzz /'
echo "sanitize: built and tested in $((SECONDS - start)) s"
