#!/usr/bin/env bash
# ptxas-check.sh PTXAS CHIP FILE.ptx [MAX_REGISTERS]: assemble FILE for CHIP
# with ptxas -v; fail if ptxas rejects it, reports any spill, or gives a
# function more than MAX_REGISTERS registers.
set -euo pipefail
ptxas="$1" chip="$2" file="$3" max_registers="${4:-255}"
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
most="$(grep -oE "Used [0-9]+ registers" <<<"$report" | grep -oE "[0-9]+" | sort -n | tail -1)"
if (( ${most:-0} > max_registers )); then
  echo "$report" >&2
  echo "ptxas uses $most registers in $file for $chip (at most $max_registers allowed)" >&2
  exit 1
fi
