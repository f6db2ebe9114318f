#!/usr/bin/env bash
# Configures (once) and builds tilefuse in build/ with Ninja and ccache;
# scripts/setup.sh makes the .venv whose Python the extension builds for.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${TILEFUSE_BUILD_DIR:-$root/build}"
llvm=/usr/lib/llvm-22

python="$root/.venv/bin/python"

if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR="$llvm/lib/cmake/mlir" \
    -DLLVM_EXTERNAL_LIT="$llvm/bin/lit" \
    -DPython_EXECUTABLE="$python" \
    -Dpybind11_DIR="$("$python" -c 'import pybind11; print(pybind11.get_cmake_dir())')"
fi
cmake --build "$build"
