#!/usr/bin/env bash
# The full test command: set up, build, and run every test (lit + FileCheck
# through CTest), then the sanitizer stage (scripts/sanitize.sh: the C++
# suites and lit under ASan+UBSan, a one-minute fuzz run). CI runs exactly
# this (.ci/run).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
ctest --test-dir "${TILEFUSE_BUILD_DIR:-$root/build}" --no-tests=error --output-on-failure -V
"$root/scripts/sanitize.sh"
