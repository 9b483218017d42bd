#!/usr/bin/env bash
# Installs the dependencies, builds lull three ways and runs every test:
#   build/        release build, lull replaces malloc (warnings are errors)
#   build-asan/   lull_* API under AddressSanitizer + UBSan
#   build-tsan/   lull_* API under ThreadSanitizer: the Criterion suite (less
#                 the tests tests/tsan/tsan.cmake lists) and the programs of
#                 tests/tsan/ (LULL_TSAN=0 skips it)
#   build-race/   the race harness: scheduling points in every cross-thread
#                 protocol (-DLULL_RACE=ON, base/race.h) and `ctest -R race`
#   build-fuzz/   clang + libFuzzer: tests/fuzz/regress/ inputs, then a fuzz run
#                 of LULL_FUZZ_SECONDS (60) from tests/fuzz/corpus/ (LULL_FUZZ=0
#                 skips it)
# Exit status is non-zero if any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/install-deps.sh
if [ -x .ci/numa-guest-deps.sh ] || [ -f .ci/numa-guest-deps.sh ]; then bash .ci/numa-guest-deps.sh; fi
jobs=$(nproc)
status=0

run_suite() { # dir, [-R regex], cmake args...
  local dir=$1; shift
  local select=()
  if [ "${1:-}" = -R ]; then select=(-R "$2"); shift 2; fi
  echo "== build $dir ($*)"
  cmake -S . -B "$dir" -DLULL_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
  echo "== test $dir ${select[*]}"
  (cd "$dir" && ctest --output-on-failure -j1 --timeout 900 "${select[@]}") || status=1
}

run_suite build -DCMAKE_BUILD_TYPE=RelWithDebInfo
run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DLULL_OVERRIDE=OFF -DLULL_BENCH=OFF \
  -DLULL_SANITIZE=address,undefined
run_suite build-race -R race -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLULL_OVERRIDE=OFF \
  -DLULL_BENCH=OFF -DLULL_RACE=ON
if [ "${LULL_TSAN:-1}" = 1 ]; then
  run_suite build-tsan -DCMAKE_BUILD_TYPE=Debug -DLULL_OVERRIDE=OFF -DLULL_BENCH=OFF \
    -DLULL_SANITIZE=thread
fi

if [ "${LULL_FUZZ:-1}" = 1 ]; then
  secs=${LULL_FUZZ_SECONDS:-60}
  echo "== build build-fuzz (clang, libFuzzer)"
  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLULL_WERROR=ON -DLULL_OVERRIDE=OFF -DLULL_BENCH=OFF -DLULL_FUZZ=ON \
    -DLULL_FUZZ_SECONDS="$secs" >/dev/null
  cmake --build build-fuzz -j"$jobs" --target fuzz_alloc >/dev/null
  echo "== fuzz: regression inputs (tests/fuzz/regress/)"
  if ! build-fuzz/tests/fuzz/fuzz_alloc tests/fuzz/regress/* >build-fuzz/regress.log 2>&1; then
    grep -E "^(lull|fuzz_alloc):|Running:|SUMMARY" build-fuzz/regress.log || tail -20 build-fuzz/regress.log
    status=1
  fi
  echo "== fuzz: ${secs} s from tests/fuzz/corpus/"
  if cmake --build build-fuzz --target fuzz_smoke >build-fuzz/fuzz.log 2>&1; then
    grep -E "^(stat::|Done)" build-fuzz/fuzz.log || true
  else
    grep -E "^(lull|fuzz_alloc):|SUMMARY|Test unit written|^stat::" build-fuzz/fuzz.log ||
      tail -30 build-fuzz/fuzz.log
    status=1
  fi
fi
exit $status
