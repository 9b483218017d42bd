#!/usr/bin/env bash
# Page placement of glibc, jemalloc, mimalloc, tcmalloc and lull on two NUMA
# nodes: boots a qemu guest (TCG, the machine of tests/numa_guest: two nodes
# of one CPU each) whose /init runs bench/numa_placement.c under each
# allocator (LD_PRELOAD) and prints, per allocator, the share of each
# thread's live pages that are on its own node. Timings under TCG mean
# nothing; only placement is reported.
#
#   bench/numa_placement.sh [options]
#     -o, --out DIR          work directory (default build/numa-placement)
#     --kernel FILE          guest kernel (default: as tests/numa_guest/run.sh)
#     --lull-so FILE         liblull.so (default $LULL_SO, else build/liblull.so)
#     --allocators a,b,...   subset of glibc,jemalloc,mimalloc,tcmalloc,lull,lull-numa-off
#     --rounds N --batch N --keep N   bench parameters (24, 1000, 4000)
#     --balancing            leave the kernel's automatic NUMA balancing on (it
#                            migrates pages towards the threads that touch
#                            them, and so hides where the allocator put them);
#                            default: off (numa_balancing=disable)
#     --timeout SEC          whole boot (default 900)
#     -v, --verbose          print the guest console
#
# Output: a Markdown table, then "csv," lines (header + one per allocator);
# both also in OUT/numa_placement.md and OUT/numa_placement.csv. Exit 0 when
# every allocator ran, 1 when one failed, 77 when qemu or the kernel is
# missing (.ci/numa-guest-deps.sh installs them), 2 on a usage/build error.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
out="$REPO_ROOT/build/numa-placement"
kernel="${LULL_NUMA_GUEST_KERNEL:-}"
lullso=""
allocators="glibc,jemalloc,mimalloc,tcmalloc,lull,lull-numa-off"
bench_args=()
timeout_s=900
balancing=disable
verbose=0
cache="${LULL_NUMA_GUEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lull-numa-guest}"
mem_mib="${LULL_NUMA_GUEST_MEM:-256}"

while [ $# -gt 0 ]; do
    case "$1" in
    -o | --out) out=$2; shift 2 ;;
    --kernel) kernel=$2; shift 2 ;;
    --lull-so) lullso=$2; shift 2 ;;
    --allocators) allocators=$2; shift 2 ;;
    --rounds | --batch | --keep) bench_args+=("$1" "$2"); shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --balancing) balancing=enable; shift ;;
    -v | --verbose) verbose=1; shift ;;
    -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "numa_placement.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -n "$lullso" ] && export LULL_SO=$lullso

# ---- the machine ----
qemu="${QEMU:-$(command -v qemu-system-x86_64 || true)}"
if [ -z "$qemu" ] || [ ! -x "$qemu" ]; then
    echo "numa_placement: SKIP - qemu-system-x86_64 is not installed (.ci/numa-guest-deps.sh)"
    exit 77
fi
if [ -z "$kernel" ]; then
    # shellcheck disable=SC2012 # version-sorted file names
    kernel=$(ls -1 "$cache"/kernel/boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$kernel" ]; then
        elf="$(dirname "$kernel")/vmlinux-$(basename "$kernel" | sed 's/^vmlinuz-//')"
        [ -s "$elf" ] && kernel=$elf
    fi
fi
if [ -z "$kernel" ] || [ ! -r "$kernel" ]; then
    echo "numa_placement: SKIP - no guest kernel in $cache/kernel/boot (.ci/numa-guest-deps.sh)"
    exit 77
fi
command -v cpio >/dev/null || { echo "numa_placement: SKIP - cpio is not installed"; exit 77; }

# ---- build ----
mkdir -p "$out" || exit 2
CC=${CC:-gcc}
cflags=(-std=gnu17 -O2 -g -Wall -Wextra -Werror -pthread -fno-builtin-malloc -fno-builtin-free
    -fno-builtin-calloc -fno-builtin-realloc)
"$CC" "${cflags[@]}" -o "$out/numa_placement" "$here/numa_placement.c" || exit 2
"$CC" "${cflags[@]}" -static -DNUMA_PLACEMENT_LAUNCHER -o "$out/init" "$here/numa_placement.c" ||
    exit 2

# ---- the initramfs: launcher, bench, loader, libraries ----
stage="$out/initramfs.d"
rm -rf "$stage"
mkdir -p "$stage"/{dev,proc,sys,tmp}
cp "$out/init" "$stage/init"
cp "$out/numa_placement" "$stage/numa_placement"
copy_file() { # host path -> same path in the guest, dereferenced
    mkdir -p "$stage$(dirname "$1")"
    cp -L "$1" "$stage$1"
}
copy_deps() { # the shared libraries and loader a binary needs
    ldd "$1" 2>/dev/null | awk '/=> \// { print $3 } /^\t\/[^ ]+ \(/ { print $1 }' |
        while read -r lib; do
            [ -e "$stage$lib" ] || copy_file "$lib"
        done
}
copy_deps "$out/numa_placement"
: >"$stage/allocators"
declare -A status
IFS=, read -r -a names <<<"$allocators"
for name in "${names[@]}"; do
    base=${name%-numa-off}
    lib=$(alloc_lib "$base") || { echo "numa_placement: unknown allocator $name" >&2; exit 2; }
    extra=""
    [ "$name" = lull-numa-off ] && extra="LULL_CONF=numa=off"
    if [ "$base" = glibc ]; then
        echo "glibc|-|" >>"$stage/allocators"
        status[$name]=ok
        continue
    fi
    if [ ! -f "$lib" ]; then
        if [ "$base" = lull ]; then
            lull_build
            lib=$(alloc_lib lull)
        fi
        if [ ! -f "$lib" ]; then
            echo "numa_placement: $name: $lib is missing" >&2
            status[$name]=missing
            continue
        fi
    fi
    guest_lib=$lib
    if [ "$base" = lull ]; then
        guest_lib=/opt/lull/liblull.so
        mkdir -p "$stage/opt/lull"
        cp -L "$lib" "$stage$guest_lib"
    else
        [ -e "$stage$lib" ] || copy_file "$lib"
    fi
    copy_deps "$lib"
    echo "$name|$guest_lib|$extra" >>"$stage/allocators"
    status[$name]=ok
done
echo "${bench_args[*]}" >"$stage/bench.args"
(cd "$stage" && find . -print0 | LC_ALL=C sort -z |
    cpio --null -o -H newc -R 0:0 --quiet >"$out/initramfs.cpio") || exit 2
echo "numa_placement: initramfs $(du -h "$out/initramfs.cpio" | cut -f1), allocators:" \
    "$(cut -d'|' -f1 "$stage/allocators" | paste -sd, -)" >&2

# ---- boot (the machine of tests/numa_guest/run.sh) ----
log="$out/serial.log"
rm -f "$log"
# shellcheck disable=SC2054 # commas belong to qemu option values
qemu_args=(
    -accel tcg,thread=multi -machine q35 -cpu max
    -smp 2 -m "$((2 * mem_mib))M"
    -object "memory-backend-ram,id=m0,size=${mem_mib}M"
    -object "memory-backend-ram,id=m1,size=${mem_mib}M"
    -numa node,nodeid=0,cpus=0,memdev=m0
    -numa node,nodeid=1,cpus=1,memdev=m1
    -numa "dist,src=0,dst=1,val=21"
    -numa "dist,src=1,dst=0,val=31"
    -kernel "$kernel" -initrd "$out/initramfs.cpio"
    -append "console=ttyS0 panic=-1 oops=panic quiet loglevel=4 numa=on mitigations=off numa_balancing=$balancing"
    -display none -nodefaults -no-reboot -monitor none -serial "file:$log"
)
echo "numa_placement: booting $(basename "$kernel") (2 nodes, TCG) ..." >&2
timeout --kill-after=10 "$timeout_s" "$qemu" "${qemu_args[@]}" </dev/null >"$out/qemu.log" 2>&1
qemu_rc=$?
tr -d '\r' <"$log" >"$log.txt" 2>/dev/null || : >"$log.txt"
if [ "$verbose" = 1 ]; then cat "$log.txt" >&2; fi

# ---- the table ----
md="$out/numa_placement.md"
csv="$out/numa_placement.csv"
kver=$(sed -n 's/^NUMA-PLACEMENT: BEGIN kernel=\([^ ]*\).*/\1/p' "$log.txt" | head -n 1)
kbal=$(sed -n 's/^NUMA-PLACEMENT: BEGIN .*numa_balancing=\([^ ]*\).*/\1/p' "$log.txt" | head -n 1)
{
    echo "Share of each thread's live pages on its own node (two threads, one per node, trading"
    echo "objects; qemu TCG guest, kernel ${kver:-?}, automatic NUMA balancing ${kbal:-?}; $(sed -n 's/.* rounds=\([0-9]*\) batch=\([0-9]*\) keep=\([0-9]*\).*/rounds \1, batch \2, keep \3/p' "$log.txt" | head -n 1))"
    echo
    echo "| allocator | node-0 thread: pages on node 0 | node-1 thread: pages on node 1 | pages examined (t0 / t1) |"
    echo "|---|---:|---:|---:|"
} >"$md"
echo "csv,allocator,local0_pct,local1_pct,pages0,pages1,absent0,absent1,rss_mib,status" >"$csv"
failed=0
for name in "${names[@]}"; do
    line=$(grep "^NUMA-PLACEMENT: PLACEMENT alloc=$name " "$log.txt" | head -n 1)
    if [ "${status[$name]:-}" = missing ]; then
        echo "| $name | missing | missing | - |" >>"$md"
        echo "csv,$name,,,,,,,,missing" >>"$csv"
        continue
    fi
    if [ -z "$line" ]; then
        why=$(grep "^NUMA-PLACEMENT: RUN-FAILED $name " "$log.txt" | head -n 1 |
            sed "s/^NUMA-PLACEMENT: RUN-FAILED $name //")
        echo "| $name | failed | failed | ${why:-no result} |" >>"$md"
        echo "csv,$name,,,,,,,,failed" >>"$csv"
        failed=1
        continue
    fi
    get() { printf '%s\n' "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
    printf '| %s | %s %% | %s %% | %s / %s |\n' "$name" "$(get local0)" "$(get local1)" \
        "$(get pages0)" "$(get pages1)" >>"$md"
    echo "csv,$name,$(get local0),$(get local1),$(get pages0),$(get pages1),$(get absent0),$(get absent1),$(get rss_mib),ok" >>"$csv"
done
cat "$md"
echo
cat "$csv"
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
    echo "numa_placement: the guest timed out after $timeout_s s (console: $log.txt)" >&2
    exit 1
fi
if ! grep -q '^NUMA-PLACEMENT: END' "$log.txt"; then
    echo "numa_placement: the guest did not finish (console: $log.txt)" >&2
    tail -n 20 "$log.txt" >&2
    exit 1
fi
exit "$failed"
