#!/usr/bin/env bash
# Install what the qemu guest tests (tests/numa_guest/run.sh: the NUMA
# checks and the kernel checks) need on a fresh Debian 12: qemu-system-x86
# (TCG is enough), cpio, static glibc and zlib, and two Debian kernel
# images unpacked (not installed) into the guest cache dir: the generic
# 6.1 kernel (linux-image-amd64) into CACHE/kernel/boot and its PREEMPT_RT
# flavour (linux-image-rt-amd64) into CACHE/kernel-rt/boot.
#
#   .ci/numa-guest-deps.sh            # install packages + fetch both kernels
#   LULL_NUMA_GUEST_CACHE=DIR ...     # cache dir (default: see below)
#   LULL_NUMA_GUEST_KPKG=NAME ...     # generic kernel meta package (linux-image-amd64)
#   LULL_NUMA_GUEST_RT_KPKG=NAME ...  # RT kernel meta package (linux-image-rt-amd64);
#                                     # "none" fetches no RT kernel
#
# Idempotent: a kernel already unpacked in the cache is kept
# (LULL_NUMA_GUEST_REFETCH=1 fetches again). Besides vmlinuz-VER it leaves
# vmlinux-VER, the uncompressed ELF kernel, which qemu boots through its PVH
# entry (no decompression under emulation: about twice as fast). Prints the
# path of the generic vmlinuz on its last line.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

cache="${LULL_NUMA_GUEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lull-numa-guest}"
meta="${LULL_NUMA_GUEST_KPKG:-linux-image-amd64}"
rt_meta="${LULL_NUMA_GUEST_RT_KPKG:-linux-image-rt-amd64}"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

need_pkgs=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_pkgs+=(qemu-system-x86)
command -v cpio >/dev/null 2>&1 || need_pkgs+=(cpio)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need_pkgs+=(libc6-dev)
[ -e /usr/lib/x86_64-linux-gnu/libz.a ] || need_pkgs+=(zlib1g-dev) # the guest links liblull.a
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc)
command -v xz >/dev/null 2>&1 || need_pkgs+=(xz-utils)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "numa-guest-deps: installing ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    # --no-install-recommends: the recommends of qemu-system-x86 pull in a
    # desktop's worth of packages that a -nographic TCG guest never uses.
    as_root apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

mkdir -p "$cache"
unpack_elf() { # vmlinuz: leave vmlinux-VER beside it (best effort)
    local z=$1 x
    x="$(dirname "$z")/vmlinux-$(basename "$z" | sed 's/^vmlinuz-//')"
    [ -s "$x" ] && return 0
    "$repo/tests/numa_guest/extract-vmlinux.sh" "$z" "$x" ||
        echo "numa-guest-deps: no ELF vmlinux (the guest boots the slower vmlinuz)" >&2
}

# The meta package only depends on the real image package
# (linux-image-6.1.0-NN-amd64, linux-image-6.1.0-NN-rt-amd64), which holds
# /boot/vmlinuz-*.
resolve() { # meta
    apt-cache depends "$1" 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
updated=0

# fetch META DIR: unpack the image package behind META into DIR/boot
# (unless a kernel is there already); prints the vmlinuz path.
fetch() {
    local meta=$1 dir=$2 existing kpkg work deb newest
    existing=$(ls -1 "$dir"/boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$existing" ] && [ -z "${LULL_NUMA_GUEST_REFETCH:-}" ]; then
        echo "numa-guest-deps: $meta: kernel already cached" >&2
        unpack_elf "$existing" >&2
        echo "$existing"
        return 0
    fi
    kpkg=$(resolve "$meta" || true)
    if [ -z "$kpkg" ] && [ "$updated" = 0 ]; then
        as_root apt-get update -qq >&2
        updated=1
        kpkg=$(resolve "$meta" || true)
    fi
    if [ -z "$kpkg" ]; then
        echo "numa-guest-deps: cannot resolve the image package behind $meta" >&2
        return 1
    fi
    work=$(mktemp -d "$cache/fetch.XXXXXX")
    echo "numa-guest-deps: downloading $kpkg" >&2
    # apt-get download writes into the current directory and, as root, drops to
    # the _apt user: the directory must be writable by it.
    chmod 0777 "$work"
    local dl_opts=()
    # As root, apt drops to _apt, which cannot enter a 0700 home: stay root.
    [ "$(id -u)" -eq 0 ] && dl_opts=(-o APT::Sandbox::User=root)
    if ! (cd "$work" && apt-get download -qq "${dl_opts[@]}" "$kpkg" >&2); then
        rm -rf "$work"
        return 1
    fi
    deb=$(ls -1 "$work"/*.deb | head -n 1)
    mkdir -p "$work/x"
    dpkg -x "$deb" "$work/x"
    mkdir -p "$dir/boot"
    # Keep only what the guest boots: the kernel image and its config (the
    # config tells the tests what the kernel was built with).
    cp "$work"/x/boot/vmlinuz-* "$dir/boot/"
    cp "$work"/x/boot/config-* "$dir/boot/" 2>/dev/null || true
    echo "$kpkg" >"$dir/PACKAGE"
    rm -rf "$work"
    newest=$(ls -1 "$dir"/boot/vmlinuz-* | sort -V | tail -n 1)
    unpack_elf "$newest" >&2
    echo "$newest"
}

# The RT kernel first: the last line printed is the generic kernel's path.
# It is kept apart (CACHE/kernel-rt) because run.sh and
# bench/numa_placement.sh boot the newest vmlinuz-* of CACHE/kernel/boot
# and the -rt- name would sort last there.
if [ "$rt_meta" != none ]; then
    fetch "$rt_meta" "$cache/kernel-rt" >/dev/null
fi
fetch "$meta" "$cache/kernel"
