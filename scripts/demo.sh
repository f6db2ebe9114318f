#!/usr/bin/env bash
# The main job, for now: run the compiler front end over the reference
# fusions (parse, verify, canonicalize, hoist broadcasts) and print each
# kernel's interface and how much of its work runs per element, per row or
# per column. The lowering to PTX/CPU and the torch-facing demo come next
# (see README.md, "Status").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh" >/dev/null
"$root/scripts/build.sh" >/dev/null
opt="${TILEFUSE_BUILD_DIR:-$root/build}/bin/tilefuse-opt"

printf '%-20s %6s %6s %6s %6s %6s  %s\n' fusion ops full row col scalar "outputs"
for fusion in "$root"/test/lit/fusions/*.mlir; do
  ir="$("$opt" "$fusion" -canonicalize -fuse-hoist-broadcasts -cse)"
  name="$(basename "$fusion" .mlir)"
  # Each op line ends with the kind of its result type.
  ops="$(grep -cE '^ +%[0-9]+ = fuse\.' <<<"$ir" || true)"
  count() { grep -E '^ +%[0-9]+ = fuse\.' <<<"$ir" | grep -cE "(: |to |-> )!fuse\.$1<[a-z0-9]+>$" || true; }
  outputs="$(grep -oE -- '-> \(.*\)' <<<"$ir" | head -1 | sed -E 's/!fuse\.//g')"
  printf '%-20s %6s %6s %6s %6s %6s  %s\n' "$name" "$ops" "$(count full)" \
    "$(count row)" "$(count col)" "$(count scalar)" "$outputs"
done
