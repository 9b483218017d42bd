#!/usr/bin/env bash
# bench/run.sh: the benchmark suite, one command.
#
#   bench/run.sh [--quick] [--runs N] [--only SCENARIO[,SCENARIO...]]
#                [--allocators NAME[,NAME...]] [--out DIR] [--no-build-lull]
#
# Scenarios: stall throughput callgrind latency burst redis hardening
# forkexec hugeoverload buffercycle footprint defrag (default: all of these) and thp (only
# when named in --only: ~3 min a run at full size). Allocators: glibc jemalloc
# mimalloc tcmalloc lull (default: all). lull is build/liblull.so under the
# repository root, or $LULL_SO; when it is not there its rows say "missing"
# and the run goes on. With lull, burst
# also runs lull-delay0 (the same library, LULL_CONF=purge_delay_ms=0), and
# hardening builds lull with LULL_HARDENING=ON and OFF (from one copy of the
# working tree, whatever $LULL_SO is) into build/bench-hard and
# build/bench-nohard and compares the two; with --no-build-lull it uses them
# as they are. thp (issue 16) runs lull as lull-thp-never and lull-thp-auto
# (LULL_CONF=thp=never / thp=auto) instead of lull: bench_thp's coverage
# mode, and its tlb mode through bench/thp_tlb.sh (under perf stat -e
# dTLB-load-misses where that counts here, else time alone), with glibc
# also as glibc-hugetlb (glibc.malloc.hugetlb=1: its heap advised
# MADV_HUGEPAGE, a reference for what coverage is worth). Build lull in
# Release for it (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release first: run.sh
# builds an existing build/ as it is configured).
#
# Builds the bench programs (and tries to build liblull.so, unless
# --no-build-lull or $LULL_SO), then runs every scenario --runs times (5;
# --quick: 1 run with small sizes). Within a repetition every allocator runs
# once, in an order rotated from one repetition to the next. callgrind runs
# once (its counts are exact); redis runs --redis-runs times (default 3,
# --quick 1); the syscall-counting pass of stall runs once. footprint runs
# each of bench_footprint's scenarios in a process of its own (~45 s per
# allocator and run, most of it idle: the RSS after 1.2 s and after 10 s).
#
# Writes bench/results/<date>/ (or --out): <scenario>.csv with every run,
# summary.csv (medians), results.md (tables with ratios to glibc and to the
# best peer, the goals, the preload checks), PNG plots, and raw/ (logs and
# the CSVs behind the plots). Every program run is bounded by `timeout`;
# a failing run is logged in errors.txt and the suite goes on.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SCENARIOS=(stall throughput callgrind latency burst redis hardening forkexec hugeoverload
    buffercycle footprint defrag thp)
OPT_IN=(thp) # not in the default selection: only with --only
runs=
redis_runs=
quick=0
only=
allocs_arg=
out=
build_lull=1
while [ $# -gt 0 ]; do
    case $1 in
    --quick) quick=1 ;;
    --runs) runs=$2; shift ;;
    --runs=*) runs=${1#*=} ;;
    --redis-runs) redis_runs=$2; shift ;;
    --redis-runs=*) redis_runs=${1#*=} ;;
    --only) only=$2; shift ;;
    --only=*) only=${1#*=} ;;
    --allocators) allocs_arg=$2; shift ;;
    --allocators=*) allocs_arg=${1#*=} ;;
    --out) out=$2; shift ;;
    --out=*) out=${1#*=} ;;
    --no-build-lull) build_lull=0 ;;
    -h | --help)
        sed -n '2,39p' "$0"
        exit 0
        ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
if [ -z "$runs" ]; then runs=$([ $quick = 1 ] && echo 1 || echo 5); fi
if [ -z "$redis_runs" ]; then redis_runs=$([ $quick = 1 ] && echo 1 || echo $((runs < 3 ? runs : 3))); fi
[[ $runs =~ ^[1-9][0-9]*$ ]] || die "--runs must be a positive number"
[[ $redis_runs =~ ^[1-9][0-9]*$ ]] || die "--redis-runs must be a positive number"

selected=()
for s in "${SCENARIOS[@]}"; do
    [[ " ${OPT_IN[*]} " == *" $s "* ]] || selected+=("$s")
done
if [ -n "$only" ]; then
    IFS=, read -r -a selected <<<"$only"
    for s in "${selected[@]}"; do
        [[ " ${SCENARIOS[*]} " == *" $s "* ]] || die "unknown scenario $s (one of: ${SCENARIOS[*]})"
    done
fi
allocs=("${ALL_ALLOCATORS[@]}")
if [ -n "$allocs_arg" ]; then
    IFS=, read -r -a allocs <<<"$allocs_arg"
    for a in "${allocs[@]}"; do alloc_lib "$a" >/dev/null || die "unknown allocator $a"; done
fi

out=${out:-$BENCH_DIR/results/$(date +%Y-%m-%d_%H%M%S)}
mkdir -p "$out/raw"
out=$(cd "$out" && pwd)
q=()
[ $quick = 1 ] && q=(--quick)

log "== building"
bench_build
[ $build_lull = 1 ] && lull_build

# Which allocators can run.
avail=()
: >"$out/allocators.txt"
for a in "${allocs[@]}"; do
    st=$(alloc_status "$a")
    lib=$(alloc_lib "$a")
    [ -n "$lib" ] && [ -e "$lib" ] && lib=$(readlink -f "$lib")
    echo "$a $st ${lib:-}" >>"$out/allocators.txt"
    if [ "$st" = ok ]; then avail+=("$a"); else log "note: $a is missing ($lib): its rows will say missing"; fi
done
[ ${#avail[@]} -gt 0 ] || die "no allocator to run"
# burst: lull's library again with purge_delay_ms=0, next to lull (auto)
burst_allocs=("${avail[@]}")
if [[ " ${avail[*]} " == *" lull "* && " ${avail[*]} " != *" lull-delay0 "* &&
    " ${selected[*]} " == *" burst "* ]]; then
    burst_allocs+=(lull-delay0)
    echo "lull-delay0 ok $(readlink -f "$(lull_so)") LULL_CONF=$LULL_DELAY0_CONF (burst only)" >>"$out/allocators.txt"
fi
# thp: lull as its two THP variants (the same library, LULL_CONF=thp=...),
# and glibc-hugetlb next to glibc (a reference: glibc's heap advised
# MADV_HUGEPAGE)
thp_allocs=()
for a in "${avail[@]}"; do
    if [ "$a" = glibc ] && [[ " ${selected[*]} " == *" thp "* && " ${avail[*]} " != *" glibc-hugetlb "* ]]; then
        thp_allocs+=(glibc glibc-hugetlb)
        echo "glibc-hugetlb ok (none: default) GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (thp only, a reference)" >>"$out/allocators.txt"
    elif [ "$a" = lull ] && [[ " ${selected[*]} " == *" thp "* ]]; then
        for v in "${LULL_THP_VARIANTS[@]}"; do
            [[ " ${avail[*]} " == *" $v "* ]] && continue
            thp_allocs+=("$v")
            echo "$v ok $(readlink -f "$(lull_so)") LULL_CONF=thp=${v#lull-thp-} (thp only)" >>"$out/allocators.txt"
        done
    else
        thp_allocs+=("$a")
    fi
done

{
    echo "date:       $(date -Is)"
    echo "host:       $(uname -srm), $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
    echo "cpu:        $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
    echo "thp:        $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo n/a)"
    echo "load:       $(cut -d' ' -f1-3 /proc/loadavg) (at start)"
    echo "mode:       $([ $quick = 1 ] && echo quick || echo full), runs=$runs, redis runs=$redis_runs"
    echo "peers:      $(dpkg-query -W -f '${Package} ${Version}; ' libjemalloc2 libmimalloc2.0 libtcmalloc-minimal4 2>/dev/null || true)"
    echo "glibc:      $(ldd --version | head -1)"
    if git -C "$REPO_ROOT" rev-parse --short HEAD >/dev/null 2>&1; then
        echo "commit:     $(git -C "$REPO_ROOT" rev-parse --short HEAD)"
    fi
} >"$out/machine.txt"

# rotated R [ALLOC...]: the allocator order of repetition R (default: avail)
rotated() {
    local r=$1 i
    shift
    local list=("$@")
    [ ${#list[@]} -gt 0 ] || list=("${avail[@]}")
    local n=${#list[@]}
    for ((i = 0; i < n; i++)); do echo "${list[$(((i + r - 1) % n))]}"; done
}

# run_one SCENARIO ALLOC RUN LABEL TIMEOUT MODE CMD...
#   MODE preload: CMD runs with ALLOC preloaded; MODE self: CMD handles it.
# Appends RESULT lines to SCENARIO.csv and the preload lines of each
# scenario/allocator's first run to preload.txt.
run_one() {
    local sc=$1 a=$2 run=$3 label=$4 tmo=$5 mode=$6 rc=0
    shift 6
    local logf="$out/raw/${label}_${a}_r${run}.log"
    local t0=$SECONDS
    if [ "$mode" = preload ]; then
        run_alloc "$a" timeout -k 10 "$tmo" "$@" >"$logf" 2>&1 || rc=$?
    else
        timeout -k 10 "$tmo" "$@" >"$logf" 2>&1 || rc=$?
    fi
    [ -f "$out/$sc.csv" ] || echo "allocator,run,metric,value,unit" >"$out/$sc.csv"
    awk -v a="$a" -v r="$run" '$1 == "RESULT" {print a "," r "," $3 "," $4 "," $5}' "$logf" >>"$out/$sc.csv"
    if ! grep -q "^$label $a:" "$out/preload.txt" 2>/dev/null; then
        grep -E '^(INFO [a-z]+ preload_ok|ERROR)' "$logf" | grep -v vgpreload | sort -u |
            sed -E "s/^INFO [a-z]+ /$label $a: /; s/^ERROR/$label $a: ERROR/" >>"$out/preload.txt" || true
    fi
    if [ $rc -ne 0 ] || grep -q '^ERROR' "$logf"; then
        echo "$label $a run $run: exit $rc$([ $rc = 124 ] && echo ' (timeout)'): $(grep -m1 -E '^ERROR|rror' "$logf" || tail -1 "$logf")" >>"$out/errors.txt"
        log "   $label $a r$run: FAILED (exit $rc), see raw/$(basename "$logf")"
    else
        log "   $label $a r$run: $((SECONDS - t0)) s"
    fi
}

# run_interleaved SCENARIO LABEL TIMEOUT CMD...: CMD with each allocator
# preloaded, --runs times, in the rotated order of each repetition
run_interleaved() {
    local sc=$1 label=$2 tmo=$3 r a
    shift 3
    for ((r = 1; r <= runs; r++)); do
        for a in $(rotated $r); do
            run_one "$sc" "$a" $r "$label" "$tmo" preload "$@"
        done
    done
}

started=$SECONDS
for sc in "${selected[@]}"; do
    log "== $sc"
    t_sc=$SECONDS
    case $sc in
    stall)
        run_interleaved stall stall 300 "$(bench_bin stall)" "${q[@]}"
        for a in "${avail[@]}"; do
            run_one stall "$a" sys stall-syscalls 300 preload "$(bench_bin stall)" --count-syscalls "${q[@]}"
        done
        ;;
    throughput)
        # LABEL:ARGUMENTS of each bench_throughput run (the label names its log)
        # (st-300k, mt-300k: a heap of 300,000 blocks, 55 MiB a thread, larger than the caches;
        # st-300k-touch: each block read before its free, as a destructor would)
        truns=("st:--mode st" "mt:--mode mt" "st-300k:--mode st --live 300000"
            "mt-300k:--mode mt --live 300000" "st-300k-touch:--mode st --live 300000 --touch"
            "prodcons:--mode prodcons" "larson:--mode larson"
            "larson-live:--mode larson-live" "larson-10-100:--mode larson --sizes 10-100")
        for ((r = 1; r <= runs; r++)); do
            for a in $(rotated $r); do
                for spec in "${truns[@]}"; do
                    read -r -a targs <<<"${spec#*:}"
                    run_one throughput "$a" $r "throughput-${spec%%:*}" 300 preload \
                        "$(bench_bin throughput)" "${targs[@]}" "${q[@]}"
                done
            done
        done
        ;;
    forkexec)
        run_interleaved forkexec forkexec 300 "$(bench_bin fork_exec)" "${q[@]}"
        ;;
    hugeoverload)
        # issue 13 item 9: 3 threads, 0.5 % of operations on 20 MiB blocks,
        # for a fixed time (60 s is the issue's goal: HUGE_OVERLOAD_SECONDS)
        hs=${HUGE_OVERLOAD_SECONDS:-$([ $quick = 1 ] && echo 3 || echo 20)}
        run_interleaved hugeoverload huge_overload $((hs + 120)) "$(bench_bin huge_overload)" \
            --seconds "$hs"
        ;;
    buffercycle)
        # a 32 MiB buffer a request, 100 ms apart, beside a span churn (~6 s
        # a run under the allocators that fault it back in each time)
        run_interleaved buffercycle buffer_cycle 120 "$(bench_bin buffer_cycle)" "${q[@]}"
        ;;
    footprint)
        # one process per footprint scenario (the program lists them), so
        # that neither the heap nor the peak RSS of one carries into the next
        mapfile -t fscs < <("$(bench_bin footprint)" --list)
        [ ${#fscs[@]} -gt 0 ] || die "bench_footprint --list gave no scenario"
        for ((r = 1; r <= runs; r++)); do
            for a in $(rotated $r); do
                for f in "${fscs[@]}"; do
                    run_one footprint "$a" $r "footprint-$f" 120 preload \
                        "$(bench_bin footprint)" --scenario "$f" "${q[@]}"
                done
            done
        done
        ;;
    defrag)
        # issue 15: only the allocators with a defrag interface (lull's
        # lull_defrag_*, jemalloc's batch_query); ~40 s a run at 1 GiB
        dallocs=()
        for a in lull jemalloc; do [[ " ${avail[*]} " == *" $a "* ]] && dallocs+=("$a"); done
        if [ ${#dallocs[@]} -eq 0 ]; then
            log "   neither lull nor jemalloc selected: skipped"
            continue
        fi
        for ((r = 1; r <= runs; r++)); do
            for a in $(rotated $r "${dallocs[@]}"); do
                run_one defrag "$a" $r defrag 600 preload "$(bench_bin defrag)" "${q[@]}" \
                    --csv "$out/raw/defrag_ts_${a}_r$r.csv"
            done
        done
        ;;
    thp)
        # issue 16: hugepage coverage of a 512 MiB small-object heap through
        # 10 churn rounds (~15 s), and a TLB-bound workload over 2 GiB
        # (~5-10 s); lull as its two variants, glibc also as glibc-hugetlb
        for ((r = 1; r <= runs; r++)); do
            for a in $(rotated $r "${thp_allocs[@]}"); do
                run_one thp "$a" $r thp-coverage 300 preload "$(bench_bin thp)" --mode coverage "${q[@]}"
                run_one thp "$a" $r thp-tlb 900 self "$BENCH_DIR/thp_tlb.sh" "$a" "${q[@]}"
            done
        done
        ;;
    callgrind)
        for a in "${avail[@]}"; do
            run_one callgrind "$a" 1 callgrind 900 self "$BENCH_DIR/callgrind.sh" "${q[@]}" "$a"
        done
        ;;
    latency)
        for ((r = 1; r <= runs; r++)); do
            for a in $(rotated $r); do
                run_one latency "$a" $r latency 300 preload "$(bench_bin latency)" "${q[@]}" \
                    --cdf-csv "$out/raw/latency_cdf_${a}_r$r.csv" \
                    --rss-csv "$out/raw/latency_rss_${a}_r$r.csv"
            done
        done
        ;;
    burst)
        for ((r = 1; r <= runs; r++)); do
            for a in $(rotated $r "${burst_allocs[@]}"); do
                run_one burst "$a" $r burst 600 preload "$(bench_bin burst)" "${q[@]}" \
                    --bursts-csv "$out/raw/burst_bursts_${a}_r$r.csv" \
                    --rss-csv "$out/raw/burst_rss_${a}_r$r.csv"
            done
        done
        ;;
    redis)
        if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
            log "   redis-server or redis-benchmark not installed: skipped"
            echo "redis: skipped, redis-server/redis-benchmark not installed" >>"$out/errors.txt"
            continue
        fi
        for ((r = 1; r <= redis_runs; r++)); do
            for a in $(rotated $r); do
                run_one redis "$a" $r redis 900 self "$BENCH_DIR/redis.sh" "${q[@]}" "$a"
            done
        done
        ;;
    hardening)
        # lull with and without its double-free check (LULL_HARDENING),
        # both built here from the working tree with the same flags; only
        # when lull is among the allocators
        if [[ " ${allocs[*]} " != *" lull "* ]]; then
            log "   lull not selected: skipped"
            continue
        fi
        variants=()
        # both from one copy of the tree: edits meanwhile cannot split them
        src=$REPO_ROOT/build/bench-hardening-src
        if [ $build_lull = 1 ] && ! lull_source_snapshot "$src"; then
            log "   cannot copy the source tree to $src: skipped"
            echo "hardening: cannot copy the source tree to $src" >>"$out/errors.txt"
            continue
        fi
        for v in lull-hard lull-nohard; do
            h=ON
            [ $v = lull-nohard ] && h=OFF
            st=missing
            if [ $build_lull = 1 ] && ! lull_variant_build $v $h "$src"; then
                echo "hardening $v: build with LULL_HARDENING=$h failed" >>"$out/errors.txt"
            elif [ "$(alloc_status $v)" != ok ]; then
                log "   $v: $(alloc_lib $v) is missing"
            elif [ $build_lull = 0 ] && ! lull_variant_check $v $h; then
                echo "hardening $v: not built with LULL_HARDENING=$h" >>"$out/errors.txt"
            else
                st=ok
                variants+=("$v")
            fi
            lib=$(alloc_lib $v)
            [ -e "$lib" ] && lib=$(readlink -f "$lib")
            echo "$v $st $lib LULL_HARDENING=$h (hardening only)" >>"$out/allocators.txt"
        done
        if [ ${#variants[@]} -eq 0 ]; then
            log "   no lull variant built: skipped"
            continue
        fi
        # instructions per pair: exact, so once
        for v in "${variants[@]}"; do
            run_one hardening "$v" 1 hardening-callgrind 900 self "$BENCH_DIR/callgrind.sh" "${q[@]}" "$v"
        done
        # throughput: 5x the throughput scenario's 10 M ops (1-2 s a run),
        # as the difference sought is a few per cent
        hops=(--ops 50000000)
        [ $quick = 1 ] && hops=(--quick)
        for ((r = 1; r <= runs; r++)); do
            for v in $(rotated $r "${variants[@]}"); do
                for m in st mt; do
                    run_one hardening "$v" $r "hardening-$m" 300 preload \
                        "$(bench_bin throughput)" --mode $m "${hops[@]}"
                done
            done
        done
        ;;
    esac
    echo "$sc: $((SECONDS - t_sc)) s" >>"$out/raw/timings.txt"
done
echo "load:       $(cut -d' ' -f1-3 /proc/loadavg) (at end); suite took $((SECONDS - started)) s" >>"$out/machine.txt"

python3 "$BENCH_DIR/report.py" "$out" || log "warning: report.py failed"
log ""
log "results: $out"
log "   summary: $out/results.md"
[ -s "$out/errors.txt" ] && log "   errors:  $out/errors.txt ($(wc -l <"$out/errors.txt") lines)"
exit 0
