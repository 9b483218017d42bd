#!/usr/bin/env bash
# Install what the two-node qemu guest test (tests/numa_guest/run.sh) needs on
# a fresh Debian 12: qemu-system-x86 (TCG is enough), cpio, static glibc and
# zlib, and a Debian kernel image unpacked (not installed) into the guest
# cache dir.
#
#   .ci/numa-guest-deps.sh            # install packages + fetch the kernel
#   LULL_NUMA_GUEST_CACHE=DIR ...     # cache dir (default: see below)
#   LULL_NUMA_GUEST_KPKG=NAME ...     # kernel meta package (linux-image-amd64)
#
# Idempotent: a kernel already unpacked in the cache is kept. Besides
# vmlinuz-VER it leaves vmlinux-VER, the uncompressed ELF kernel, which
# qemu boots through its PVH entry (no decompression under emulation: about
# twice as fast). Prints the path of the vmlinuz on its last line.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

cache="${LULL_NUMA_GUEST_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lull-numa-guest}"
meta="${LULL_NUMA_GUEST_KPKG:-linux-image-amd64}"

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
existing=$(ls -1 "$cache"/kernel/boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1 || true)
unpack_elf() { # vmlinuz: leave vmlinux-VER beside it (best effort)
    local z=$1 x
    x="$(dirname "$z")/vmlinux-$(basename "$z" | sed 's/^vmlinuz-//')"
    [ -s "$x" ] && return 0
    "$repo/tests/numa_guest/extract-vmlinux.sh" "$z" "$x" ||
        echo "numa-guest-deps: no ELF vmlinux (the guest boots the slower vmlinuz)" >&2
}
if [ -n "$existing" ] && [ -z "${LULL_NUMA_GUEST_REFETCH:-}" ]; then
    echo "numa-guest-deps: kernel already cached"
    unpack_elf "$existing"
    echo "$existing"
    exit 0
fi

# The meta package only depends on the real image package
# (linux-image-6.1.0-NN-amd64), which holds /boot/vmlinuz-*.
resolve() {
    apt-cache depends "$meta" 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
kpkg=$(resolve || true)
if [ -z "$kpkg" ]; then
    as_root apt-get update -qq
    kpkg=$(resolve || true)
fi
if [ -z "$kpkg" ]; then
    echo "numa-guest-deps: cannot resolve the image package behind $meta" >&2
    exit 1
fi

work=$(mktemp -d "$cache/fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "numa-guest-deps: downloading $kpkg"
# apt-get download writes into the current directory and, as root, drops to
# the _apt user: the directory must be writable by it.
chmod 0777 "$work"
dl_opts=()
# As root, apt drops to _apt, which cannot enter a 0700 home: stay root.
[ "$(id -u)" -eq 0 ] && dl_opts=(-o APT::Sandbox::User=root)
(cd "$work" && apt-get download -qq "${dl_opts[@]}" "$kpkg")
deb=$(ls -1 "$work"/*.deb | head -n 1)
mkdir -p "$work/x"
dpkg -x "$deb" "$work/x"
mkdir -p "$cache/kernel/boot"
# Keep only what the guest boots: the kernel image and its config (the
# config tells the test which NUMA options the kernel was built with).
cp "$work"/x/boot/vmlinuz-* "$cache/kernel/boot/"
cp "$work"/x/boot/config-* "$cache/kernel/boot/" 2>/dev/null || true
echo "$kpkg" > "$cache/kernel/PACKAGE"
newest=$(ls -1 "$cache"/kernel/boot/vmlinuz-* | sort -V | tail -n 1)
unpack_elf "$newest"
echo "$newest"
