#!/usr/bin/env bash
# Build the guest's /init (a static program) and its initramfs.
#
#   tests/numa_guest/build.sh OUT_DIR [--lib LIBLULL_A]
#
# Writes OUT_DIR/init and OUT_DIR/initramfs.cpio (newc, uncompressed: the
# kernel unpacks it as is). The program is every guest_*.c (the harness)
# and every check_*.c (the checks) of this folder. Without --lib it is linked with lull's NUMA
# sources (numa/topology.c, home_node.c, bind.c, base/fault.c,
# base/message.c, base/text_file.c) and compiled with -DLULL_GUEST_NO_LIB=1, so a check file
# that needs the whole allocator can compile itself out (#ifndef
# LULL_GUEST_NO_LIB). With --lib, liblull.a (built with the same compiler)
# is linked statically instead (whole archive, so its malloc replaces
# glibc's), with liburing.a, libdl and libz: the checks then run on lull.
# Environment: CC (default gcc), EXTRA_CFLAGS, EXTRA_LIBS.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
out=${1:?usage: build.sh OUT_DIR [--lib LIBLULL_A]}
shift
lib=""
while [ $# -gt 0 ]; do
    case "$1" in
    --lib) lib=${2:?--lib needs a path}; shift 2 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

CC=${CC:-gcc}
mkdir -p "$out"
cflags=(-std=gnu17 -O2 -g -Wall -Wextra -Werror -pthread
    -I"$src" -I"$src/include" -I"$here")
sources=()
for f in "$here"/guest_*.c "$here"/check_*.c; do sources+=("$f"); done
libs=()
if [ -z "$lib" ]; then
    cflags+=(-DLULL_GUEST_NO_LIB=1)
    sources+=("$src/numa/topology.c" "$src/numa/home_node.c" "$src/numa/bind.c"
        "$src/base/fault.c" "$src/base/message.c" "$src/base/text_file.c")
else
    uring=/usr/lib/x86_64-linux-gnu/liburing.a
    # --whole-archive: the program itself calls no malloc, so without it the
    # linker would take glibc's malloc.o and leave lull's out.
    # shellcheck disable=SC2054 # linker options
    libs=(-Wl,--whole-archive "$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")"
        -Wl,--no-whole-archive)
    [ -e "$uring" ] && libs+=("$uring")
    libs+=(-ldl)
fi
# shellcheck disable=SC2086
read -r -a extra_cflags <<<"${EXTRA_CFLAGS:-}"
read -r -a extra_libs <<<"${EXTRA_LIBS:-}"

# glibc warns that a static program's dlopen needs the shared libraries at
# run time; in the guest there is no libnuma.so.1 on purpose (the topology
# comes from sysfs), so that warning is expected and filtered out.
log="$out/build.log"
if ! "$CC" "${cflags[@]}" "${extra_cflags[@]}" -static -o "$out/init.tmp" "${sources[@]}" \
    "${libs[@]}" "${extra_libs[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    echo "build.sh: compiling the guest program failed" >&2
    exit 1
fi
grep -v -e "statically linked applications requires at runtime" -e "in function .numa_topology_init" \
    -e "in function .detect_libnuma" "$log" >&2 || true
mv "$out/init.tmp" "$out/init"

stage="$out/initramfs.d"
rm -rf "$stage"
mkdir -p "$stage/dev" "$stage/proc" "$stage/sys" "$stage/tmp"
cp "$out/init" "$stage/init"
chmod 0755 "$stage/init"
(cd "$stage" && find . -print0 | LC_ALL=C sort -z |
    cpio --null -o -H newc -R 0:0 --quiet >"$out/initramfs.cpio.tmp")
mv "$out/initramfs.cpio.tmp" "$out/initramfs.cpio"
rm -rf "$stage"
