#!/bin/bash
# slow_free_trace.sh: is a slow free() in a bulk free the allocator's work,
# the guest kernel's, or time the guest never saw?
#
#   bench/slow_free_trace.sh [ALLOCATOR] [-- program options]
#
# ALLOCATOR is lull (default), glibc, jemalloc, mimalloc or tcmalloc, loaded
# as in run.sh. As root: traces one CPU (interrupts, IPIs, TLB flushes, page
# faults, context switches, timers) while bench_slow_free_trace frees 512 MiB
# of 64 KiB blocks on it and then churns small blocks, and prints each slow
# call with the guest events inside its window. A slow call with none was
# spent outside the guest (the hypervisor had the vCPU), or in the
# allocator's own code. LULL_CONF=purge_delay_ms=never in the environment
# shows lull without purges.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

alloc=${1:-lull}
[[ $# -gt 0 ]] && shift
[[ ${1:-} == -- ]] && shift
cpu=0
T=/sys/kernel/tracing
[[ -d $T/events ]] || mount -t tracefs nodev $T
[[ -w $T/trace_marker ]] || {
    echo "slow_free_trace: needs root and tracefs at $T" >&2
    exit 1
}

bench_build
lull_build
bin=$(bench_bin slow_free_trace)
events=(irq_vectors irq ipi tlb exceptions/page_fault_user sched/sched_switch
    sched/sched_wakeup timer/hrtimer_expire_entry)
restore() {
    echo 0 >$T/tracing_on
    for e in "${events[@]}"; do [[ -e $T/events/$e/enable ]] && echo 0 >"$T/events/$e/enable"; done
    echo "$old_mask" >$T/tracing_cpumask
    echo "$old_clock" >$T/trace_clock
}
old_mask=$(cat $T/tracing_cpumask)
old_clock=$(sed -n 's/.*\[\(.*\)\].*/\1/p' $T/trace_clock)
trap restore EXIT
echo 0 >$T/tracing_on
echo >$T/trace
echo mono >$T/trace_clock
printf '%x\n' $((1 << cpu)) >$T/tracing_cpumask
echo 8192 >$T/buffer_size_kb
for e in "${events[@]}"; do [[ -e $T/events/$e/enable ]] && echo 1 >"$T/events/$e/enable"; done
echo 1 >$T/tracing_on
run_alloc "$alloc" "$bin" --cpu $cpu "$@"
echo 0 >$T/tracing_on

python3 - "$T/trace" <<'EOF'
import re, sys
lines = open(sys.argv[1], errors="replace").read().splitlines()
ts = re.compile(r"\s(\d+\.\d+):\s+(\S+):?\s*(.*)")
events, slows = [], []
for line in lines:
    m = ts.search(line)
    if not m:
        continue
    t, name, rest = float(m.group(1)), m.group(2).rstrip(":"), m.group(3)
    s = re.search(r"SLOW rep=\d+ \S+ us=([\d.]+) from=([\d.]+) to=([\d.]+)", line)
    if s:
        slows.append((float(s.group(2)), float(s.group(3)), s.group(0), float(s.group(1))))
    else:
        events.append((t, name, rest))
quiet = 0
for a, b, what, us in slows:
    inside = [e for e in events if a - 1e-6 <= e[0] <= b + 1e-6]
    print(what)
    for t, name, rest in inside:
        print(f"    {t:.6f} {name} {rest[:100]}")
    if not inside:
        print("    (no guest event inside)")
        quiet += 1
over = sum(1 for s in slows if s[3] > 100)
print(f"{len(slows)} slow calls, {quiet} with no guest event inside, {over} over 100 us")
EOF
