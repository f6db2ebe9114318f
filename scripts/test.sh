#!/usr/bin/env bash
# The full test command: set up, build, and run every test (lit + FileCheck
# through CTest), then build the self-contained library (build-static/; its
# compiles come from ccache, so it costs the link) and run its tests, then
# the sanitizer stage (scripts/sanitize.sh: the C++ suites and lit under
# ASan+UBSan, a one-minute fuzz run). CI runs exactly this (.ci/run).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
"$root/scripts/build.sh" --static
ctest --test-dir "${TILEFUSE_BUILD_DIR:-$root/build}" --no-tests=error --output-on-failure -V
ctest --test-dir "$root/build-static" --no-tests=error --output-on-failure -V
"$root/scripts/sanitize.sh"
