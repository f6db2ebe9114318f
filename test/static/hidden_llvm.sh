#!/usr/bin/env bash
# Runs scripts/gpu_check.py on the self-contained libtilefuse_torch.so in a
# process that cannot see LLVM nor a CUDA toolkit (so libdevice comes from
# beside the library): a private mount namespace with empty tmpfs mounts
# over /usr/lib/llvm-22 and /usr/local/cuda. That needs root; without it
# the test is skipped (exit 77), or with --optional run with them visible.
# Usage: hidden_llvm.sh [--optional] PYTHON LIBRARY GPU_CHECK_ARGS...
set -euo pipefail
optional=false
if [ "$1" = "--optional" ]; then optional=true; shift; fi
python=$1 library=$2
shift 2
check=("$python" "$(cd "$(dirname "$0")/../.." && pwd)/scripts/gpu_check.py"
       --library "$library" "$@")

if readelf -d "$library" | grep -E 'NEEDED.*lib(LLVM|MLIR)'; then
  echo "FAIL: $library needs a shared LLVM or MLIR library"
  exit 1
fi
if [ "$(id -u)" != 0 ] || ! unshare --mount true 2>/dev/null; then
  reason="hiding /usr/lib/llvm-22 needs root (a private mount namespace)"
  if ! $optional; then echo "skipped: $reason"; exit 77; fi
  echo "note: $reason; running with it visible"
  exec "${check[@]}"
fi
echo "TILEFUSE_TARGET=${TILEFUSE_TARGET:-}, /usr/lib/llvm-22 and /usr/local/cuda hidden"
exec unshare --mount --propagation private bash -c '
  set -euo pipefail
  for hidden in /usr/lib/llvm-22 /usr/local/cuda; do
    [ -d $hidden ] || continue
    mount -t tmpfs -o ro,size=1m tilefuse-hides-it $hidden
    if [ -n "$(ls -A $hidden)" ]; then echo "FAIL: $hidden still visible"; exit 1; fi
  done
  exec "$@"' hidden "${check[@]}"
