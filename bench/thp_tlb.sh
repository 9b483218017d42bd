#!/usr/bin/env bash
# bench/thp_tlb.sh: bench_thp --mode tlb under one allocator, with
# `perf stat -e dTLB-load-misses` counting over its timed loop only, where
# this machine can count that event; else the program alone (time only).
#
#   bench/thp_tlb.sh ALLOCATOR [bench_thp ARGUMENTS...]   (e.g. --quick)
#
# The program enables and disables the counters itself around the loop,
# through perf's control fifos (perf stat -D -1 --control fifo:CTL,ACK; the
# fifo names reach it as BENCH_PERF_CTL and BENCH_PERF_ACK), so that the
# heap's allocation is not counted. It prints the program's lines, then
#   INFO thp tlb_counter perf <events> (the timed loop only)
#   RESULT thp tlb_<event>_per_op <count / tlb_ops> count     (one an event)
# or, when perf cannot count the event here (a VM without a PMU says
# "<not supported>"),
#   INFO thp tlb_counter none (<why>): time alone
# THP_PERF_EVENTS (default dTLB-load-misses) replaces the events counted
# (e.g. page-faults, to try the control path where no PMU is).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ $# -ge 1 ] || die "usage: thp_tlb.sh ALLOCATOR [bench_thp ARGUMENTS...]"
alloc=$1
shift
events=${THP_PERF_EVENTS:-dTLB-load-misses}

# perf_usable: empty when perf stat counts every one of the events here, or
# why not
perf_usable() {
    command -v perf >/dev/null || { echo "perf is not installed"; return; }
    local out
    out=$(perf stat -x, -e "$events" -- true 2>&1) || { echo "perf stat failed: $(tail -1 <<<"$out")"; return; }
    # -x, lines: value,unit,event,... ; a value of <not supported> or
    # <not counted>, or no line for the event, means no count
    local e
    for e in ${events//,/ }; do
        awk -F, -v e="$e" '$3 == e && $1 ~ /^[0-9.]+$/ {ok = 1} END {exit !ok}' <<<"$out" ||
            { echo "perf stat -e $e: $(awk -F, -v e="$e" '$3 == e {print $1}' <<<"$out" | head -1)"; return; }
    done
}

why=$(perf_usable)
if [ -n "$why" ]; then
    echo "INFO thp tlb_counter none ($why): time alone"
    run_alloc "$alloc" "$(bench_bin thp)" --mode tlb "$@"
    exit
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkfifo "$tmp/ctl" "$tmp/ack"
rc=0
run_alloc "$alloc" env BENCH_PERF_CTL="$tmp/ctl" BENCH_PERF_ACK="$tmp/ack" \
    perf stat -x, -o "$tmp/perf.csv" -e "$events" -D -1 --control "fifo:$tmp/ctl,$tmp/ack" \
    -- "$(bench_bin thp)" --mode tlb "$@" >"$tmp/out" || rc=$?
cat "$tmp/out"
[ $rc -eq 0 ] || exit $rc
echo "INFO thp tlb_counter perf $events (the timed loop only)"
ops=$(awk '$1 == "RESULT" && $3 == "tlb_ops" {print $4}' "$tmp/out")
[ -n "$ops" ] || die "bench_thp printed no tlb_ops"
for e in ${events//,/ }; do
    awk -F, -v e="$e" -v ops="$ops" '$3 == e && $1 ~ /^[0-9.]+$/ {
        m = e; gsub(/[^A-Za-z0-9]+/, "_", m)
        printf "RESULT thp tlb_%s_per_op %.6g count\n", tolower(m), $1 / ops; found = 1
    } END {if (!found) print "ERROR thp perf counted no " e}' "$tmp/perf.csv"
done
