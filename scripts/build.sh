#!/usr/bin/env bash
# Configures (once) and builds tilefuse in build/ with Ninja and ccache.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${TILEFUSE_BUILD_DIR:-$root/build}"
llvm=/usr/lib/llvm-22

if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR="$llvm/lib/cmake/mlir" \
    -DLLVM_EXTERNAL_LIT="$llvm/bin/lit"
fi
cmake --build "$build"
