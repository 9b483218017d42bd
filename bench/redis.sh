#!/usr/bin/env bash
# bench/redis.sh: Debian's redis-server under one allocator.
#
#   bench/redis.sh [--quick] ALLOCATOR
#
# Starts redis-server on 127.0.0.1 at a random free high port (no
# persistence, lazy freeing off), with the allocator preloaded, and checks
# /proc/<pid>/maps that it took effect. Then:
#   1. fill: redis-benchmark SETs 64 KiB values (16384 keys, ~1 GiB;
#      --quick: 1024 keys) - RSS when full;
#   2. flush: bench_redis_probe PINGs on one connection while another sends
#      FLUSHALL SYNC: how long the flush took and the worst PING meanwhile,
#      then RSS right after and 2 s later (VmRSS of /proc/<pid>/status);
#   3. load: redis-benchmark GET/SET of 256 B values (50000 requests each,
#      50 clients; --quick: 20000) while bench_redis_probe measures the
#      latency one more connection sees (p99.9, max).
# Prints "RESULT redis <metric> <value> <unit>" lines. Every client call is
# bounded by `timeout` and a request count; the server is shut down (and
# killed if need be) on exit. Loopback only.
#
# Debian's redis-server links libjemalloc.so.2 itself, so "no preload" would
# measure jemalloc. For glibc the script preloads libc.so.6, which puts
# glibc's malloc ahead of jemalloc's in symbol lookup; that it took effect is
# checked from INFO memory: redis's own allocator_allocated (jemalloc's
# statistics) stays near zero while used_memory holds the data set.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

quick=0
alloc=
for a in "$@"; do
    case $a in
    --quick) quick=1 ;;
    -h | --help)
        sed -n '2,27p' "$0"
        exit 0
        ;;
    *) alloc=$a ;;
    esac
done
[ -n "$alloc" ] || die "usage: redis.sh [--quick] ALLOCATOR"
command -v redis-server >/dev/null || die "redis-server is not installed (apt-get install redis-server)"
command -v redis-benchmark >/dev/null || die "redis-benchmark is not installed (apt-get install redis-tools)"
[ "$(alloc_status "$alloc")" = ok ] || {
    echo "INFO redis allocator $alloc missing ($(alloc_lib "$alloc"))"
    exit 0
}
[ -x "$(bench_bin redis_probe)" ] || bench_build
probe=$(bench_bin redis_probe)

if [ $quick = 1 ]; then
    nkeys=1024 nreq=20000
else
    nkeys=16384 nreq=50000
fi

if [ "$alloc" = glibc ]; then
    lib=$(readlink -f /lib/x86_64-linux-gnu/libc.so.6)
else
    lib=$(readlink -f "$(alloc_lib "$alloc")")
fi

tmp=$(mktemp -d)
server_pid= # redis-server itself
timeout_pid= # the `timeout` that started it (its parent)
cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        timeout 5 redis-cli -h 127.0.0.1 -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
        for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$server_pid" 2>/dev/null || true
    fi
    if [ -n "$timeout_pid" ]; then
        # SIGTERM to timeout is passed on to redis-server if it still runs
        kill -TERM "$timeout_pid" 2>/dev/null || true
        wait "$timeout_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
cli() { timeout 30 redis-cli -h 127.0.0.1 -p "$port" "$@"; }
info_field() { cli INFO "$1" | tr -d '\r' | awk -F: -v k="$2" '$1 == k {print $2}'; }
rss_mib() { awk '/^VmRSS:/ {printf "%.1f\n", $2 / 1024}' "/proc/$server_pid/status"; }

for _ in $(seq 20); do
    port=$((20000 + RANDOM % 40000))
    port_free "$port" && break
done

# The server itself is bounded too: at most 15 minutes.
LD_PRELOAD="$lib" timeout 900 redis-server --port "$port" --bind 127.0.0.1 \
    --save '' --appendonly no --dir "$tmp" --logfile "$tmp/redis.log" \
    --lazyfree-lazy-user-del no --lazyfree-lazy-user-flush no \
    --lazyfree-lazy-server-del no --lazyfree-lazy-eviction no &
timeout_pid=$!
for _ in $(seq 100); do
    [ "$(cli PING 2>/dev/null)" = PONG ] && break
    sleep 0.1
done
[ "$(cli PING 2>/dev/null)" = PONG ] || {
    cat "$tmp/redis.log" >&2 || true
    die "redis-server did not start on port $port"
}
server_pid=$(info_field server process_id)
[ -r "/proc/$server_pid/maps" ] || die "no /proc/$server_pid/maps"

# Preload check: the library must be mapped into the server.
if grep -qF " $lib" "/proc/$server_pid/maps"; then
    echo "INFO redis preload_ok $lib (pid $server_pid, /proc/$server_pid/maps)"
else
    echo "ERROR redis preload $lib is not mapped in redis-server (pid $server_pid)"
    exit 3
fi
grep -oE '/[^ ]*(jemalloc|mimalloc|tcmalloc|liblull)[^ ]*' "/proc/$server_pid/maps" | sort -u |
    sed 's/^/INFO redis mapped /' || true
echo "INFO redis port $port mem_allocator=$(info_field memory mem_allocator)"

rss0=$(rss_mib)

# 1. fill
timeout 600 redis-benchmark -h 127.0.0.1 -p "$port" -t set -n "$nkeys" -r 100000000 \
    -d 65536 -c 8 -P 4 -q >"$tmp/fill.out" 2>&1 || die "fill failed: $(tail -3 "$tmp/fill.out")"
keys=$(cli DBSIZE)
used=$(info_field memory used_memory)
je=$(info_field memory allocator_allocated)
rss_full=$(rss_mib)
echo "INFO redis filled $keys keys, used_memory=$used, jemalloc allocator_allocated=$je"
if [ "$alloc" != jemalloc ] && [ "${je:-0}" -gt $((used / 4)) ]; then
    echo "ERROR redis jemalloc holds the data set ($je of $used bytes): the preload did not take effect"
    exit 3
fi
[ "$alloc" = glibc ] && echo "INFO redis preload_ok glibc (jemalloc allocator_allocated=$je of used_memory=$used)"

# 2. flush
timeout 120 "$probe" flush --port "$port" --cmd "FLUSHALL SYNC" --before-ms 300 --after-ms 300 ||
    die "flush probe failed"
rss_flush=$(rss_mib)
sleep 2
rss_flush2=$(rss_mib)

# 3. load
timeout 120 "$probe" load --port "$port" --duration-ms 100000 >"$tmp/probe.out" &
probe_pid=$!
timeout 300 redis-benchmark -h 127.0.0.1 -p "$port" -t set,get -n "$nreq" -r 100000 -d 256 \
    -c 50 --csv >"$tmp/load.csv" 2>"$tmp/load.err" || die "load failed: $(tail -3 "$tmp/load.err")"
kill -TERM "$probe_pid" 2>/dev/null || true
wait "$probe_pid" || true
grep -E '^(RESULT|INFO)' "$tmp/probe.out" || true
tr -d '"' <"$tmp/load.csv" | awk -F, '$1 == "SET" || $1 == "GET" {
    t = tolower($1);
    printf "RESULT redis %s_rps %s req/s\n", t, $2;
    printf "RESULT redis %s_p50_ms %s ms\n", t, $5;
    printf "RESULT redis %s_p99_ms %s ms\n", t, $7;
    printf "RESULT redis %s_max_ms %s ms\n", t, $8 }'
rss_end=$(rss_mib)

echo "RESULT redis rss_start_mib $rss0 MiB"
echo "RESULT redis rss_full_mib $rss_full MiB"
echo "RESULT redis rss_after_flush_mib $rss_flush MiB"
echo "RESULT redis rss_after_flush_2s_mib $rss_flush2 MiB"
echo "RESULT redis rss_after_load_mib $rss_end MiB"
