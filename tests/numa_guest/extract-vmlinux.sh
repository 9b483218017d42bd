#!/usr/bin/env bash
# Unpack the ELF vmlinux from a bzImage (vmlinuz), like the kernel's
# scripts/extract-vmlinux. qemu boots an ELF vmlinux through its PVH entry
# point (CONFIG_PVH, set in Debian's kernels) without running the kernel's
# own decompressor, which under TCG emulation is the slowest part of the
# boot (about 9 of 20 s on a loaded 2-core machine).
#
#   extract-vmlinux.sh VMLINUZ OUT_VMLINUX
# Exit 0 when OUT_VMLINUX is an ELF file with a PVH (Xen) note.
set -euo pipefail
in=${1:?usage: extract-vmlinux.sh VMLINUZ OUT_VMLINUX}
out=${2:?usage: extract-vmlinux.sh VMLINUZ OUT_VMLINUX}
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT

try() { # magic-regex decompress-command...
    local magic=$1
    shift
    command -v "$1" >/dev/null 2>&1 || return 1
    local off
    for off in $(LC_ALL=C grep -obUaP "$magic" "$in" 2>/dev/null | cut -d: -f1 | head -n 4); do
        tail -c +$((off + 1)) "$in" | "$@" >"$tmp" 2>/dev/null || true
        if [ "$(head -c 4 "$tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
            return 0
        fi
    done
    return 1
}

try '\xFD7zXZ\x00' xz -dc --single-stream ||
    try '\x1F\x8B\x08' gzip -dc ||
    try '\x28\xB5\x2F\xFD' zstd -dcq ||
    try '\x02\x21\x4C\x18' lz4 -dc ||
    { echo "extract-vmlinux.sh: no ELF kernel found in $in" >&2; exit 1; }
# qemu needs the PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY) to boot it.
if command -v readelf >/dev/null 2>&1 && ! readelf -n "$tmp" 2>/dev/null | grep -q 'Xen'; then
    echo "extract-vmlinux.sh: $in has no PVH entry point" >&2
    exit 1
fi
mv "$tmp" "$out"
