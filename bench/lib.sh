# shellcheck shell=bash disable=SC2034
# bench/lib.sh: shell helpers shared by run.sh, demo.sh, callgrind.sh and
# redis.sh (sourced, not run).
#
# An allocator is a name; alloc_lib NAME gives the .so that LD_PRELOAD loads
# for it (empty for glibc, which is loaded by nothing: it is the default).
# lull's library is build/liblull.so under the repository root, or $LULL_SO.

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$BENCH_DIR/.." && pwd)
BENCH_BUILD=${BENCH_BUILD:-$REPO_ROOT/build/bench-suite}
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
    glibc) printf '\n' ;;
    jemalloc) printf '%s\n' "$PEER_LIBDIR/libjemalloc.so.2" ;;
    mimalloc) printf '%s\n' "$PEER_LIBDIR/libmimalloc.so.2" ;;
    tcmalloc) printf '%s\n' "$PEER_LIBDIR/libtcmalloc_minimal.so.4" ;;
    lull) lull_so ;;
    *) return 1 ;;
    esac
}

# Prints "ok" when the allocator can be loaded, "missing" when its .so is not
# there; returns 1 for an unknown name.
alloc_status() {
    local lib
    lib=$(alloc_lib "$1") || return 1
    if [ "$1" = glibc ] || [ -f "$lib" ]; then echo ok; else echo missing; fi
}

# run_alloc NAME CMD...: runs CMD with NAME's library preloaded and
# BENCH_ALLOC=NAME (the bench programs check /proc/self/maps against both).
run_alloc() {
    local name=$1 lib
    shift
    lib=$(alloc_lib "$name") || die "unknown allocator $name"
    if [ "$name" = glibc ]; then
        env -u LD_PRELOAD BENCH_ALLOC=glibc "$@"
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

bench_bin() { printf '%s\n' "$BENCH_BUILD/bench_$1"; }
