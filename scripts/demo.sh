#!/usr/bin/env bash
# The main job: set up and build, then `tilefuse demo` (a small Llama-style
# model trained eager and patched by tilefuse.transformers; JSON and PNG in
# build/demo), `tilefuse ops` (the built-in fused ops and two DSL fusions
# compiled on first use and run against PyTorch on the CPU target), then
# every reference fusion compiled to PTX for sm_90 with what ptxas makes of
# it and the cold compile time of each stage.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh" >/dev/null
"$root/scripts/build.sh" >/dev/null
bin="${TILEFUSE_BUILD_DIR:-$root/build}/bin"
ptxas="${CUDA_PATH:-/usr/local/cuda}/bin/ptxas"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$root/.venv/bin/tilefuse" demo --out "${TILEFUSE_BUILD_DIR:-$root/build}/demo"
echo
"$root/.venv/bin/tilefuse" ops
echo

printf "%-18s %-52s %5s %6s %s\n" fusion "PTX for sm_90, bf16, n=4096: tile (threads/row x rows/block)" regs spills "ptx lines"
for fusion in "$root"/test/lit/fusions/*.mlir; do
  name="$(basename "$fusion" .mlir)"
  tile="$("$bin/tilefuse-compile" "$fusion" --dtype=bf16 --n=4096 --target=sm_90 --emit=tiled |
    grep -o 'fuse.tile = {[^}]*}' |
    sed -E 's/.*chunks = ([0-9]+).*row_on_chip = ([a-z]+).*rows_per_block = ([0-9]+).*threads_per_row = ([0-9]+).*vector_width = ([0-9]+).*/\4 x \3, v\5, \1 chunks, on chip: \2/')"
  "$bin/tilefuse-compile" "$fusion" --dtype=bf16 --n=4096 --target=sm_90 -o "$work/$name.ptx"
  report="$("$ptxas" -arch=sm_90 -v "$work/$name.ptx" -o /dev/null 2>&1)"
  regs="$(grep -oE 'Used [0-9]+ registers' <<<"$report" | grep -oE '[0-9]+' | sort -n | tail -1)"
  spills="$(grep -oE '[0-9]+ bytes spill stores' <<<"$report" | awk '{s += $1} END {print s}')"
  printf '%-18s %-52s %5s %6s %s\n' "$name" "$tile" "$regs" "$spills" "$(wc -l <"$work/$name.ptx")"
done
echo
"$bin/tilefuse-bench-compile" --runs=5
