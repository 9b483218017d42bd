#!/usr/bin/env bash
# Installs what lull needs to build, test and benchmark on Debian 12 (as
# root). Safe to run again: apt-get skips what is already there.
set -euo pipefail
# clang and libclang-rt-14-dev: the libFuzzer target (tests/fuzz/); gdb:
# the backtraces of a hung child in a test's log (tests/support/hang_report.h);
# zlib1g-dev: the heap profile is gzip-compressed (src/pprof_write.c);
# golang-go: the heap-profile tests read the profiles with `go tool pprof`
# (tests/test_pprof_write.c fails without it)
pkgs=(build-essential cmake pkg-config clang-format liburing-dev libnuma-dev libcriterion-dev
      zlib1g-dev clang libclang-rt-14-dev golang-go
      valgrind gnuplot-nox python3 git sqlite3 g++ procps gdb
      libjemalloc2 libmimalloc2.0 libtcmalloc-minimal4 redis-server redis-tools)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# redis-server's package starts a service; lull's benchmarks start their own.
if command -v systemctl >/dev/null 2>&1; then systemctl stop redis-server >/dev/null 2>&1 || true; fi
