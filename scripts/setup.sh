#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks for tilefuse: the LLVM/MLIR 22
# toolchain, clang-22 with its sanitizer and libFuzzer runtimes and build
# tools from apt, and a .venv with the pinned Python packages of
# requirements-dev.txt. Idempotent: a second run checks and exits.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

apt_packages=(
  cmake ninja-build ccache g++ git libgtest-dev
  llvm-22-dev llvm-22-tools libmlir-22-dev mlir-22-tools
  libzstd-dev  # LLVM's static archives (scripts/build.sh --static)
  clang-22 libclang-rt-22-dev  # the sanitizer and fuzzing stage (scripts/sanitize.sh)
)
missing=()
for package in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" ||
    missing+=("$package")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# The venv is rebuilt only when the pinned requirements change.
venv="$root/.venv"
stamp="$venv/.requirements.sha256"
wanted="$(sha256sum "$root/requirements-dev.txt" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "setup: installing Python packages into $venv (torch is large: minutes)"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$root/requirements-dev.txt"
  echo "$wanted" >"$stamp"
fi

# The tilefuse package itself, editable, built by scikit-build-core into
# build/ (the same tree scripts/build.sh uses); reinstalled only when its
# packaging changes: later C++ rebuilds refresh the installed extension.
package_stamp="$venv/.tilefuse-package.sha256"
package_wanted="$(cat "$root/pyproject.toml" "$stamp" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$package_stamp" ] || [ "$(cat "$package_stamp")" != "$package_wanted" ] ||
   ! "$venv/bin/python" -c 'import tilefuse._C' 2>/dev/null; then
  echo "setup: building and installing tilefuse (editable) into $venv"
  (cd "$root" && "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps -e .)
  echo "$package_wanted" >"$package_stamp"
fi
echo "setup: ok"
