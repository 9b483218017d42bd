#!/usr/bin/env bash
# lull installed into a temporary prefix and used from there (ctest:
# install_prefix): `cmake --install BUILD --prefix P`, then
#   - lull.pc (found through PKG_CONFIG_PATH) gives flags that point into P,
#     and a C program (app.c) built with them runs on P's liblull.so; the
#     same program linked with P's liblull.a and `pkg-config --static`'s
#     libraries (zlib among them) needs no libstdc++; a C++
#     program (app.cc) gets lull's new and delete from either library;
#   - a C project using find_package(lull) with CMAKE_PREFIX_PATH=P
#     (consumer/) finds P's package and runs on lull::lull and on
#     lull::lull_static.
#
#   tests/install/run.sh BUILD_DIR
#
# Environment (tests/CMakeLists.txt sets it): CC, CXX, CMAKE, PKG_CONFIG;
# LULL_OVERRIDE=1 when lull replaces malloc and the C++ operators (then
# checked too); SANITIZE_FLAGS, what a program needs to link an
# instrumented lull; RUN, a launcher for the programs (setarch for TSan).
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/lull-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
tmp=$(realpath "$tmp")
prefix=$tmp/prefix
read -r -a san <<<"${SANITIZE_FLAGS:-}"
read -r -a run <<<"${RUN:-}"
override=()
if [ "${LULL_OVERRIDE:-0}" = 1 ]; then override=(override); fi

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
inside() { # path: is it under the prefix (after resolving ..)?
    [[ $(realpath -m "$1") == "$prefix"/* ]]
}
# program, expected source of lull's code, args...: runs it, checks its line
runs_on() {
    local prog=$1 from=$2 out
    shift 2
    out=$("${run[@]}" "$prog" "$@") || fail "$prog $*: exit $? ($out)"
    [[ $out == "lull "*" from $from"*": ok" ]] || fail "$prog: '$out', expected lull from $from"
    echo "$(basename "$prog"): $out"
}
no_cxx_runtime() {
    if [ ${#san[@]} -eq 0 ] && readelf -d "$1" | grep -q 'NEEDED.*\(libstdc++\|liblull\)'; then
        fail "$1 needs $(readelf -d "$1" | grep NEEDED)"
    fi
}

"$CMAKE" --install "$build" --prefix "$prefix" >"$tmp/install.log"

# ---- pkg-config ----------------------------------------------------------------
pc=$(find "$prefix" -name lull.pc)
[ -n "$pc" ] && [ "$(printf '%s\n' "$pc" | wc -l)" = 1 ] || fail "lull.pc under $prefix: '$pc'"
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(realpath -m "$("$PKG_CONFIG" --variable=libdir lull)")
includedir=$(realpath -m "$("$PKG_CONFIG" --variable=includedir lull)")
inside "$libdir" && [ -e "$libdir/liblull.so" ] || fail "libdir $libdir"
inside "$includedir" && [ -e "$includedir/lull.h" ] || fail "includedir $includedir"
read -r -a cflags <<<"$("$PKG_CONFIG" --cflags lull)"
read -r -a libs <<<"$("$PKG_CONFIG" --libs lull)"
for flag in "${cflags[@]}" "${libs[@]}"; do
    case $flag in
    -I* | -L*) inside "${flag:2}" || fail "pkg-config gives $flag, outside $prefix" ;;
    esac
done
echo "pkg-config: ${cflags[*]} ${libs[*]}"

"$CC" "${san[@]}" "$here/app.c" "${cflags[@]}" "${libs[@]}" -ldl -Wl,-rpath,"$libdir" \
    -o "$tmp/pc_shared"
runs_on "$tmp/pc_shared" "$libdir/liblull.so" "${override[@]}"
# Static: liblull.a, then what `pkg-config --static` adds for it (no zlib:
# the heap profile's dump loads libz.so.1 itself).
read -r -a static_libs <<<"$("$PKG_CONFIG" --static --libs-only-l lull)"
static_libs=("${static_libs[@]/#-llull/$libdir/liblull.a}")
echo "pkg-config --static: ${static_libs[*]}"
"$CC" "${san[@]}" "$here/app.c" "${cflags[@]}" "${static_libs[@]}" \
    -o "$tmp/pc_static"
[[ $(nm "$tmp/pc_static") == *" lull_pprof_write"$'\n'* ]] ||
    fail "pc_static: the pprof encoder is not in it"
no_cxx_runtime "$tmp/pc_static"
runs_on "$tmp/pc_static" "$tmp/pc_static" "${override[@]}"
if [ "${LULL_OVERRIDE:-0}" = 1 ]; then
    "$CXX" "${san[@]}" "$here/app.cc" "${cflags[@]}" "${libs[@]}" -Wl,-rpath,"$libdir" \
        -o "$tmp/pc_cxx_shared"
    "${run[@]}" "$tmp/pc_cxx_shared" || fail "pc_cxx_shared"
    "$CXX" "${san[@]}" "$here/app.cc" "${cflags[@]}" "${static_libs[@]}" \
        -o "$tmp/pc_cxx_static"
    "${run[@]}" "$tmp/pc_cxx_static" || fail "pc_cxx_static"
fi

# ---- find_package(lull) --------------------------------------------------------
if ! "$CMAKE" -S "$here/consumer" -B "$tmp/consumer" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$CC" -DCMAKE_C_FLAGS="${san[*]}" \
    -DCMAKE_EXE_LINKER_FLAGS="${san[*]}" >"$tmp/consumer.log" 2>&1; then
    cat "$tmp/consumer.log" >&2
    fail "configuring consumer/"
fi
grep -q "lull_DIR=$prefix/" "$tmp/consumer.log" ||
    fail "find_package(lull) found $(grep lull_DIR= "$tmp/consumer.log"), not $prefix's"
"$CMAKE" --build "$tmp/consumer" -j2 >"$tmp/consumer-build.log" 2>&1 ||
    { cat "$tmp/consumer-build.log" >&2; fail "building consumer/"; }
runs_on "$tmp/consumer/app_shared" "$libdir/liblull.so" "${override[@]}"
no_cxx_runtime "$tmp/consumer/app_static"
runs_on "$tmp/consumer/app_static" "$tmp/consumer/app_static" "${override[@]}"
echo "ok"
