# shellcheck shell=bash disable=SC2034
# bench/lib.sh: shell helpers shared by run.sh, demo.sh, callgrind.sh and
# redis.sh (sourced, not run).
#
# An allocator is a name; alloc_lib NAME gives the .so that LD_PRELOAD loads
# for it (empty for glibc, which is loaded by nothing: it is the default).
# lull's library is build/liblull.so under the repository root, or $LULL_SO.
#
# Variants of lull, not in ALL_ALLOCATORS (run.sh adds them where they
# belong):
#   lull-delay0  lull's library with LULL_CONF=purge_delay_ms=0 (the burst
#                scenario); BENCH_LULL_CONF asks bench_burst to check, on
#                lull's counter page, that the setting took effect
#   lull-hard    liblull.so built by the hardening scenario with
#                LULL_HARDENING=ON (the default build) in build/bench-hard
#   lull-nohard  the same with LULL_HARDENING=OFF in build/bench-nohard
#   lull-thp-never, lull-thp-auto
#                lull's library with LULL_CONF=thp=never or thp=auto (the thp
#                scenario, issue 16; appended to the caller's LULL_CONF); a
#                lull without the key says "unknown key" once and runs as
#                it would without it (bench_thp prints lull's configuration)
#
# And one of glibc, not a peer but a reference for the thp scenario:
#   glibc-hugetlb  glibc with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (its heap
#                advised MADV_HUGEPAGE: what full coverage is worth here);
#                the program's preload check is glibc's (BENCH_ALLOC=glibc)

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$BENCH_DIR/.." && pwd)
BENCH_BUILD=${BENCH_BUILD:-$REPO_ROOT/build/bench-suite}
LULL_DELAY0_CONF=purge_delay_ms=0
LULL_THP_VARIANTS=(lull-thp-never lull-thp-auto)
ALL_ALLOCATORS=(glibc jemalloc mimalloc tcmalloc lull)
PEER_LIBDIR=${PEER_LIBDIR:-/usr/lib/x86_64-linux-gnu}

log() { printf '%s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

lull_so() { printf '%s\n' "${LULL_SO:-$REPO_ROOT/build/liblull.so}"; }

alloc_lib() {
    case $1 in
    glibc | glibc-hugetlb) printf '\n' ;;
    jemalloc) printf '%s\n' "$PEER_LIBDIR/libjemalloc.so.2" ;;
    mimalloc) printf '%s\n' "$PEER_LIBDIR/libmimalloc.so.2" ;;
    tcmalloc) printf '%s\n' "$PEER_LIBDIR/libtcmalloc_minimal.so.4" ;;
    lull | lull-delay0 | lull-thp-never | lull-thp-auto) lull_so ;;
    lull-hard) printf '%s\n' "$REPO_ROOT/build/bench-hard/liblull.so" ;;
    lull-nohard) printf '%s\n' "$REPO_ROOT/build/bench-nohard/liblull.so" ;;
    *) return 1 ;;
    esac
}

# Prints "ok" when the allocator can be loaded, "missing" when its .so is not
# there; returns 1 for an unknown name.
alloc_status() {
    local lib
    lib=$(alloc_lib "$1") || return 1
    if [ -z "$lib" ] || [ -f "$lib" ]; then echo ok; else echo missing; fi
}

# run_alloc NAME CMD...: runs CMD with NAME's library preloaded and
# BENCH_ALLOC=NAME (the bench programs check /proc/self/maps against both).
run_alloc() {
    local name=$1 lib
    shift
    lib=$(alloc_lib "$name") || die "unknown allocator $name"
    if [ "$name" = glibc ]; then
        env -u LD_PRELOAD BENCH_ALLOC=glibc "$@"
    elif [ "$name" = glibc-hugetlb ]; then
        env -u LD_PRELOAD BENCH_ALLOC=glibc \
            GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1" "$@"
    elif [ "$name" = lull-delay0 ]; then
        # appended to the caller's LULL_CONF (the last value of a key wins);
        # LULL_PURGE_DELAY_MS would override LULL_CONF, so it goes
        env -u LULL_PURGE_DELAY_MS BENCH_ALLOC="$name" LD_PRELOAD="$(readlink -f "$lib")" \
            LULL_CONF="${LULL_CONF:+$LULL_CONF,}$LULL_DELAY0_CONF" \
            BENCH_LULL_CONF="$LULL_DELAY0_CONF" "$@"
    elif [[ $name == lull-thp-* ]]; then
        env BENCH_ALLOC="$name" LD_PRELOAD="$(readlink -f "$lib")" \
            LULL_CONF="${LULL_CONF:+$LULL_CONF,}thp=${name#lull-thp-}" "$@"
    else
        env BENCH_ALLOC="$name" LD_PRELOAD="$(readlink -f "$lib")" "$@"
    fi
}

# Configures (once) and builds the bench programs on their own, so that the
# suite builds even when the library does not.
bench_build() {
    if [ ! -f "$BENCH_BUILD/CMakeCache.txt" ]; then
        cmake -S "$BENCH_DIR" -B "$BENCH_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2 ||
            die "cannot configure bench/ in $BENCH_BUILD"
    fi
    cmake --build "$BENCH_BUILD" -j "$(nproc)" >&2 || die "cannot build bench/"
}

# Builds liblull.so in the top-level build/ if it is a CMake build tree (or
# configures one if build/ has none). With $LULL_SO set nothing is built. A
# failed build is reported and left at that: run.sh then reports lull as
# missing (or runs whatever liblull.so is already there).
lull_build() {
    [ -n "${LULL_SO:-}" ] && return 0
    local b=$REPO_ROOT/build
    if [ ! -f "$b/CMakeCache.txt" ]; then
        cmake -S "$REPO_ROOT" -B "$b" >&2 || {
            log "warning: cannot configure $b; lull not built"
            return 0
        }
    fi
    cmake --build "$b" --target lull -j "$(nproc)" >&2 ||
        log "warning: building lull failed; using $(lull_so) if it exists"
}

# lull_source_snapshot DIR: copies what building the library needs (the
# working tree but build*, tests, bench, docs and hidden entries; mtimes
# kept, so rebuilds stay incremental) to DIR, so that variants built from it
# have the same sources even while someone edits the tree.
lull_source_snapshot() {
    local dst=$1 f
    rm -rf "$dst" && mkdir -p "$dst" || return 1
    for f in "$REPO_ROOT"/*; do
        case ${f##*/} in build* | tests | bench | docs) continue ;; esac
        cp -a "$f" "$dst/" || return 1
    done
}

# lull_variant_build NAME HARDENING SRC: configures and builds liblull.so
# from the source tree SRC (a lull_source_snapshot) into build/bench-hard or
# build/bench-nohard (NAME lull-hard or lull-nohard) with -DLULL_HARDENING=ON
# or OFF, everything else equal (Release, no tests), then runs
# lull_variant_check. Returns 1 (after a message) when either fails.
lull_variant_build() {
    local name=$1 hardening=$2 src=$3 b
    b=$(dirname "$(alloc_lib "$name")")
    if ! cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Release -DLULL_HARDENING="$hardening" \
        -DLULL_TESTS=OFF -DLULL_BENCH=OFF >&2 || ! cmake --build "$b" --target lull -j "$(nproc)" >&2; then
        log "warning: building $name (LULL_HARDENING=$hardening) in $b failed"
        return 1
    fi
    lull_variant_check "$name" "$hardening"
}

# lull_variant_check NAME HARDENING: the compile flags of NAME's build tree
# have -DLULL_NO_DOUBLE_FREE_CHECK exactly when HARDENING is OFF.
lull_variant_check() {
    local b want=0 has=0
    b=$(dirname "$(alloc_lib "$1")")
    [ "$2" = OFF ] && want=1
    # (Makefile generator: flags.make; Ninja: build.ninja)
    grep -qs -- -DLULL_NO_DOUBLE_FREE_CHECK "$b/CMakeFiles/lull.dir/flags.make" "$b/build.ninja" && has=1
    if [ $want != $has ]; then
        log "warning: $1 in $b: LULL_HARDENING=$2 did not set -DLULL_NO_DOUBLE_FREE_CHECK"
        log "         as expected (is the option in CMakeLists.txt?)"
        return 1
    fi
}

bench_bin() { printf '%s\n' "$BENCH_BUILD/bench_$1"; }
