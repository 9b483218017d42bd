#!/usr/bin/env bash
# Installs the dependencies, builds lull three ways and runs every test:
#   build/        release build, lull replaces malloc (warnings are errors)
#   build-asan/   lull_* API under AddressSanitizer + UBSan
#   build-tsan/   lull_* API under ThreadSanitizer (LULL_TSAN=0 skips it)
# Exit status is non-zero if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/install-deps.sh
if [ -x .ci/numa-guest-deps.sh ] || [ -f .ci/numa-guest-deps.sh ]; then bash .ci/numa-guest-deps.sh; fi
jobs=$(nproc)
status=0

run_suite() { # dir, cmake args...
  local dir=$1; shift
  echo "== build $dir ($*)"
  cmake -S . -B "$dir" -DLULL_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
  echo "== test $dir"
  (cd "$dir" && ctest --output-on-failure -j1 --timeout 900) || status=1
}

run_suite build -DCMAKE_BUILD_TYPE=RelWithDebInfo
run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DLULL_OVERRIDE=OFF -DLULL_BENCH=OFF \
  -DLULL_SANITIZE=address,undefined
if [ "${LULL_TSAN:-1}" = 1 ]; then
  run_suite build-tsan -DCMAKE_BUILD_TYPE=Debug -DLULL_OVERRIDE=OFF -DLULL_BENCH=OFF \
    -DLULL_SANITIZE=thread
fi
exit $status
