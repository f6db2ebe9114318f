#!/usr/bin/env bash
# ptxas-check.sh PTXAS CHIP FILE.ptx: assemble FILE for CHIP with ptxas -v;
# fail if ptxas rejects it or reports any spill.
set -euo pipefail
ptxas="$1" chip="$2" file="$3"
report="$("$ptxas" -arch="$chip" -v "$file" -o /dev/null 2>&1)" || {
  echo "$report" >&2
  echo "ptxas rejected $file for $chip" >&2
  exit 1
}
if grep -E "spill (stores|loads)" <<<"$report" | grep -vq " 0 bytes spill stores, 0 bytes spill loads"; then
  echo "$report" >&2
  echo "ptxas reports spills in $file for $chip" >&2
  exit 1
fi
