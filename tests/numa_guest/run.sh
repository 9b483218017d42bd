#!/usr/bin/env bash
# Boot a two-node NUMA guest in qemu (TCG: no KVM needed) whose /init is the
# static test program of this folder, and report its checks.
#
#   tests/numa_guest/run.sh [options]
#     -o, --out DIR      build and log directory (default: build/numa-guest
#                        under the source tree)
#     --kernel FILE      kernel image (default: $LULL_NUMA_GUEST_KERNEL, else
#                        the newest vmlinuz-* of the flavour in the cache
#                        that .ci/numa-guest-deps.sh fills)
#     --flavour F        generic (default: CACHE/kernel, Debian's
#                        linux-image-amd64) or rt (CACHE/kernel-rt,
#                        linux-image-rt-amd64, PREEMPT_RT); a --flavour
#                        given wins over $LULL_NUMA_GUEST_KERNEL
#     --lib LIBLULL_A    link the guest program with liblull.a (see build.sh)
#     --group G,H        run the checks of these groups (default numa: the
#                        NUMA checks; kernel: check_kernel_*.c; all)
#     --only a,b         run only these checks (of any group)
#     --mem MIB          memory per node (default $LULL_NUMA_GUEST_MEM, else
#                        256; the kernel turns THP off below 512 MiB in all)
#     --timeout SEC      whole boot (default 300; TCG is slow under load)
#     --append "..."     more kernel command line
#     -v, --verbose      print the whole serial console
#
# Exit status: 0 every check passed; 1 a check failed, the guest crashed or
# timed out; 77 skipped: qemu-system-x86_64 or the kernel image is not
# installed (run .ci/numa-guest-deps.sh); 2 usage or build error.
# Output ends with one line "numa-guest: PASS|FAIL|SKIP ..." and one line
# "numa-guest-summary: {json}" (also written to OUT/result.json).
#
# Environment: LULL_NUMA_GUEST_CACHE (kernel cache, default
# ${XDG_CACHE_HOME:-~/.cache}/lull-numa-guest), LULL_NUMA_GUEST_KERNEL,
# QEMU (qemu binary), LULL_NUMA_GUEST_MEM (MiB per node, default 256).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
out="$src/build/numa-guest"
kernel=""
lib=""
flavour=""
group="numa"
only=""
timeout_s=300
append=""
verbose=0
cache="${LULL_NUMA_GUEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lull-numa-guest}"
mem_mib="${LULL_NUMA_GUEST_MEM:-256}"

while [ $# -gt 0 ]; do
    case "$1" in
    -o | --out) out=$2; shift 2 ;;
    --kernel) kernel=$2; shift 2 ;;
    --flavour) flavour=$2; shift 2 ;;
    --lib) lib=$2; shift 2 ;;
    --group) group=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --mem) mem_mib=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --append) append=$2; shift 2 ;;
    -v | --verbose) verbose=1; shift ;;
    -h | --help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

json_escape() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr -d '\000-\037'; }

finish() { # status exit_code message [checks_json] [boot_s] [kernel]
    local status=$1 code=$2 msg=$3 checks=${4:-[]} boot=${5:-null} kver=${6:-}
    mkdir -p "$out" 2>/dev/null
    local json
    json=$(printf '{"result":"%s","passed":%d,"failed":%d,"skipped":%d,"boot_seconds":%s,"kernel":"%s","message":"%s","checks":%s}' \
        "$status" "${n_pass:-0}" "${n_fail:-0}" "${n_skip:-0}" "$boot" "$(json_escape "$kver")" \
        "$(json_escape "$msg")" "$checks")
    printf '%s\n' "$json" >"$out/result.json" 2>/dev/null
    echo "numa-guest: $status - $msg"
    echo "numa-guest-summary: $json"
    exit "$code"
}

# ---- what the guest needs ----
qemu="${QEMU:-$(command -v qemu-system-x86_64 || true)}"
if [ -z "$qemu" ] || [ ! -x "$qemu" ]; then
    finish SKIP 77 "qemu-system-x86_64 is not installed (run .ci/numa-guest-deps.sh)"
fi
case "$flavour" in
"" | generic) kdir="$cache/kernel/boot" ;;
rt) kdir="$cache/kernel-rt/boot" ;;
*) echo "run.sh: unknown flavour $flavour (generic, rt)" >&2; exit 2 ;;
esac
# An explicit flavour names its cache directory, whatever the environment.
[ -z "$kernel" ] && [ -z "$flavour" ] && kernel="${LULL_NUMA_GUEST_KERNEL:-}"
if [ -z "$kernel" ]; then
    kernel=$(ls -1 "$kdir"/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)
    # Prefer the uncompressed ELF beside it (PVH boot, no decompression
    # under emulation); make it if it is missing and the cache is writable.
    if [ -n "$kernel" ]; then
        elf="$(dirname "$kernel")/vmlinux-$(basename "$kernel" | sed 's/^vmlinuz-//')"
        if [ ! -s "$elf" ] && [ -w "$(dirname "$kernel")" ]; then
            "$here/extract-vmlinux.sh" "$kernel" "$elf" 2>/dev/null || true
        fi
        [ -s "$elf" ] && kernel=$elf
    fi
fi
if [ -z "$kernel" ] || [ ! -r "$kernel" ]; then
    finish SKIP 77 "no guest kernel image in $kdir (run .ci/numa-guest-deps.sh)"
fi
kver=$(basename "$kernel" | sed 's/^vmlinu[xz]-//')
if ! command -v cpio >/dev/null 2>&1; then
    finish SKIP 77 "cpio is not installed (run .ci/numa-guest-deps.sh)"
fi

# ---- build the guest program and initramfs ----
mkdir -p "$out" || finish FAIL 2 "cannot create $out"
build_args=("$out")
[ -n "$lib" ] && build_args+=(--lib "$lib")
if ! "$here/build.sh" "${build_args[@]}"; then
    finish FAIL 2 "building the guest program failed"
fi

# ---- boot ----
# Two nodes of one CPU each; asymmetric distances (0->1 21, 1->0 31) so that
# a reader that swaps rows and columns is caught.
d01=21
d10=31
cmdline="console=ttyS0 panic=-1 oops=panic quiet loglevel=4 numa=on mitigations=off"
cmdline+=" lull_guest.nodes=2 lull_guest.cpu_node=0,1 lull_guest.dist=10,$d01,$d10,10"
[ -n "$only" ] && cmdline+=" lull_guest.only=$only"
[ -z "$only" ] && [ -n "$group" ] && cmdline+=" lull_guest.group=$group"
[ -n "$append" ] && cmdline+=" $append"
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
    -numa "dist,src=0,dst=1,val=$d01"
    -numa "dist,src=1,dst=0,val=$d10"
    -kernel "$kernel" -initrd "$out/initramfs.cpio" -append "$cmdline"
    -display none -nodefaults -no-reboot -monitor none -serial "file:$log"
)
echo "numa-guest: booting $kernel (2 nodes, TCG) ..."
start=$(date +%s.%N)
timeout --kill-after=10 "$timeout_s" "$qemu" "${qemu_args[@]}" </dev/null >"$out/qemu.log" 2>&1
qemu_rc=$?
end=$(date +%s.%N)
boot_s=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')

# ---- results ----
tr -d '\r' <"$log" 2>/dev/null >"$log.txt" || : >"$log.txt"
if [ "$verbose" = 1 ]; then
    cat "$log.txt"
else
    grep '^LULL-GUEST: ' "$log.txt" | sed 's/^LULL-GUEST: /  /'
fi

guest_kernel=$(sed -n 's/^LULL-GUEST: BEGIN kernel=\([^ ]*\).*/\1/p' "$log.txt" | head -n 1)
[ -n "$guest_kernel" ] && kver=$guest_kernel

n_pass=0 n_fail=0 n_skip=0
checks="["
sep=""
while read -r _ _ name status ms detail; do
    case "$status" in
    PASS) n_pass=$((n_pass + 1)) ;;
    SKIP) n_skip=$((n_skip + 1)) ;;
    *) n_fail=$((n_fail + 1)) ;;
    esac
    checks+=$(printf '%s{"name":"%s","status":"%s","ms":%d,"detail":"%s"}' "$sep" \
        "$(json_escape "$name")" "$(json_escape "$status")" "${ms%ms}" "$(json_escape "$detail")")
    sep=","
done < <(grep '^LULL-GUEST: CHECK ' "$log.txt")
checks+="]"

counts="$n_pass passed, $n_fail failed, $n_skip skipped; boot ${boot_s} s; kernel $kver"
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
    tail -n 40 "$log.txt" | sed 's/^/  | /'
    finish FAIL 1 "timed out after $timeout_s s ($counts)" "$checks" "$boot_s" "$kver"
fi
if ! grep -q '^LULL-GUEST: END' "$log.txt"; then
    echo "  qemu exit status $qemu_rc; last lines of the console:"
    tail -n 40 "$log.txt" | sed 's/^/  | /'
    sed 's/^/  qemu: /' "$out/qemu.log" | tail -n 10
    finish FAIL 1 "the guest did not finish ($counts)" "$checks" "$boot_s" "$kver"
fi
if [ "$n_fail" -eq 0 ] && [ "$n_pass" -eq 0 ]; then
    finish FAIL 1 "no check passed ($counts)" "$checks" "$boot_s" "$kver"
fi
if [ "$n_fail" -gt 0 ]; then
    finish FAIL 1 "$counts" "$checks" "$boot_s" "$kver"
fi
finish PASS 0 "$counts" "$checks" "$boot_s" "$kver"
