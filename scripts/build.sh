#!/usr/bin/env bash
# Configures (once) and builds tilefuse with Ninja and ccache;
# scripts/setup.sh makes the .venv whose Python the extension builds for.
#   scripts/build.sh           everything, in build/ (TILEFUSE_BUILD_DIR)
#   scripts/build.sh --static  only the self-contained libtilefuse_torch.so
#                              (LLVM and MLIR linked in), in build-static/
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
llvm=/usr/lib/llvm-22
python="$root/.venv/bin/python"

build="${TILEFUSE_BUILD_DIR:-$root/build}"
variant=()
if [ "${1:-}" = "--static" ]; then
  build="$root/build-static"
  variant=(-DTILEFUSE_STATIC_LLVM=ON)
fi
# Paths relative to the source tree, so that both build trees share ccache
# entries (their compile commands are the same).
export CCACHE_BASEDIR="$root"

if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ \
    -DMLIR_DIR="$llvm/lib/cmake/mlir" \
    -DLLVM_EXTERNAL_LIT="$llvm/bin/lit" \
    -DPython_EXECUTABLE="$python" \
    -Dpybind11_DIR="$("$python" -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
    "${variant[@]}"
fi
cmake --build "$build"
