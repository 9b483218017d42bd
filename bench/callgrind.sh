#!/usr/bin/env bash
# bench/callgrind.sh: instructions per malloc+free pair, counted by
# valgrind --tool=callgrind (an exact count: repeatable on a noisy machine).
#
#   bench/callgrind.sh [--quick] [ALLOCATOR...]     (default: all five)
#   (--quick: smaller N, and the fixed loop only)
#
# For each allocator and each loop of bench_pairs (fixed: malloc(32)+free;
# mixed: random replacement of 16-1024 B blocks in a working set of 1000),
# it counts the instructions executed inside the loop function only
# (--toggle-collect) for N1 and N2 iterations and prints
#   RESULT callgrind <loop>_instr_per_pair (I2 - I1) / (N2 - N1) instr
# so that first-call and start-up costs cancel. callgrind, unlike memcheck,
# does not replace malloc: the LD_PRELOAD library is the one counted, and
# bench_pairs checks /proc/self/maps to prove it (its INFO lines are passed
# through).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

quick=0
allocs=()
for a in "$@"; do
    case $a in
    --quick) quick=1 ;;
    -h | --help)
        sed -n '2,16p' "$0"
        exit 0
        ;;
    *) allocs+=("$a") ;;
    esac
done
[ ${#allocs[@]} -eq 0 ] && allocs=("${ALL_ALLOCATORS[@]}")
command -v valgrind >/dev/null || die "valgrind is not installed"
[ -x "$(bench_bin pairs)" ] || bench_build

if [ $quick = 1 ]; then
    n1=10000 n2=110000 modes=(fixed)
else
    n1=100000 n2=1100000 modes=(fixed mixed)
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

count() { # ALLOC MODE N -> total instructions in the loop function
    local out=$tmp/cg.$1.$2.$3
    run_alloc "$1" valgrind --tool=callgrind --toggle-collect="bench_pair_loop_$2" \
        --callgrind-out-file="$out" "$(bench_bin pairs)" --mode "$2" --n "$3" \
        >"$out.stdout" 2>"$out.stderr" || {
        log "callgrind failed for $1 ($2, n=$3):"
        grep -vE '^==[0-9]+== *$' "$out.stderr" | tail -15 >&2
        # to stderr: this function's stdout is captured by the caller
        grep -E '^ERROR' "$out.stdout" >&2 || echo "ERROR callgrind $1 $2 n=$3: valgrind or the program failed" >&2
        return 1
    }
    # the program's preload check, once per allocator and loop
    [ "$3" = "$n1" ] && grep -E '^(INFO|ERROR)' "$out.stdout" | sed "s/^INFO pairs/INFO callgrind/"
    awk '/^totals:/ {print $2; found=1} END {if (!found) exit 1}' "$out"
}

failed=0
for a in "${allocs[@]}"; do
    if [ "$(alloc_status "$a")" != ok ]; then
        echo "INFO callgrind allocator $a missing ($(alloc_lib "$a"))"
        continue
    fi
    for mode in "${modes[@]}"; do
        r1=$(count "$a" "$mode" $n1) || { failed=1; continue; }
        r2=$(count "$a" "$mode" $n2) || { failed=1; continue; }
        i1=$(printf '%s\n' "$r1" | tail -1)
        i2=$(printf '%s\n' "$r2" | tail -1)
        printf '%s\n' "$r1" | grep -E '^(INFO|ERROR)' || true
        metric=$([ "$mode" = fixed ] && echo fixed32_instr_per_pair || echo mixed_instr_per_pair)
        awk -v a="$i1" -v b="$i2" -v n1=$n1 -v n2=$n2 -v m="$metric" -v al="$a" \
            'BEGIN {printf "RESULT callgrind %s %.2f instr\n", m, (b - a) / (n2 - n1);
                    printf "INFO callgrind %s %s: %.0f instructions for n=%d, %.0f for n=%d\n", al, m, a, n1, b, n2}'
    done
done
exit $failed
