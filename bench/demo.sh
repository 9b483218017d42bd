#!/usr/bin/env bash
# bench/demo.sh: the headline demo. Runs the stall scenario (bench/stall.c)
# under glibc and lull, side by side.
#
#   bench/demo.sh [--all] [--runs N] [--no-build-lull]
#
#   --all             also jemalloc, mimalloc and tcmalloc
#   --runs N          N runs per allocator, interleaved, median shown (1)
#   --no-build-lull   do not try to build liblull.so
#
# lull is build/liblull.so under the repository root, or $LULL_SO. The demo
# builds what it needs and stops with a message if liblull.so is missing.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

all=0
runs=1
build_lull=1
while [ $# -gt 0 ]; do
    case $1 in
    --all) all=1 ;;
    --runs) runs=$2; shift ;;
    --runs=*) runs=${1#*=} ;;
    --no-build-lull) build_lull=0 ;;
    -h | --help)
        sed -n '2,13p' "$0"
        exit 0
        ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || die "--runs must be a positive number"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(bench_build) >"$tmp/build.log" 2>&1 || {
    cat "$tmp/build.log" >&2
    die "building bench/ failed"
}
if [ ! -f "$(lull_so)" ] && [ $build_lull = 1 ] && [ -z "${LULL_SO:-}" ]; then
    log "liblull.so not built yet: building it"
    lull_build
fi
if [ ! -f "$(lull_so)" ]; then
    log "error: liblull.so not found at $(lull_so)"
    if [ -n "${LULL_SO:-}" ]; then
        log "       (LULL_SO points there: set it to an existing liblull.so)"
    else
        log "       build it first:  cmake -S $REPO_ROOT -B $REPO_ROOT/build && cmake --build $REPO_ROOT/build --target lull"
        log "       or point LULL_SO at one:  LULL_SO=/path/to/liblull.so $0"
    fi
    exit 1
fi

allocs=(glibc lull)
[ $all = 1 ] && allocs=(glibc jemalloc mimalloc tcmalloc lull)

n=${#allocs[@]}
for ((r = 1; r <= runs; r++)); do
    for ((i = 0; i < n; i++)); do
        a=${allocs[$(((i + r - 1) % n))]}
        log "running stall under $a (run $r of $runs)..."
        if ! run_alloc "$a" timeout -k 10 300 "$(bench_bin stall)" >"$tmp/$a.$r" 2>&1; then
            log "error: stall failed under $a:"
            tail -5 "$tmp/$a.$r" >&2
            exit 1
        fi
        grep -h '^RESULT' "$tmp/$a.$r" >>"$tmp/$a.all"
    done
done

# median of one metric for one allocator
med() {
    awk -v m="$2" '$3 == m {print $4}' "$tmp/$1.all" | sort -g |
        awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
fmt_us() { awk -v v="$1" 'BEGIN {if (v == "nan") print "-"; else if (v >= 1000) printf "%.1f ms", v / 1000; else printf "%.1f us", v}'; }
fmt_mib() { awk -v v="$1" 'BEGIN {if (v == "nan") print "-"; else printf "%.0f MiB", v}'; }

size=$(grep -hom1 'size_mib=[0-9]*' "$tmp/glibc.1" | cut -d= -f2)
rows=(
    "free($size MiB)|free_large_us|us|<= 50 us"
    "slowest free in bulk free|bulk_free_max_us|us|<= 20 us"
    "slowest malloc in later churn|churn_malloc_max_us|us|<= 200 us"
    "RSS after 1.2 s|rss_settled_bulk_mib|mib|<= live*1.05+8"
)
{
    printf '%-32s' ""
    for a in "${allocs[@]}"; do printf '%14s' "$a"; done
    printf '%18s\n' "lull goal"
    for row in "${rows[@]}"; do
        IFS='|' read -r label metric kind goal <<<"$row"
        printf '%-32s' "$label"
        for a in "${allocs[@]}"; do
            v=$(med "$a" "$metric")
            if [ "$kind" = us ]; then printf '%14s' "$(fmt_us "$v")"; else printf '%14s' "$(fmt_mib "$v")"; fi
        done
        printf '%18s\n' "$goal"
    done
} >"$tmp/table"
echo
cat "$tmp/table"
echo
live=$(med lull rss_live_mib)
echo "live data when RSS is read: $(fmt_mib "$live") (lull); median of $runs run(s) each."
echo "Blocks of ${size} MiB touched then freed: once as one block, once as 64 KiB blocks;"
echo "the churn is 200k malloc/free of 16-512 B after the bulk free. Details: bench/README.md"
