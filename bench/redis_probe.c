/*
 * redis_probe.c: a minimal Redis client that measures what one connection
 * sees while redis.sh drives the server. Loopback only (127.0.0.1), bounded
 * in time and in request count; it stops by itself.
 *
 *   redis_probe flush --port P [--cmd "FLUSHALL SYNC"] [--before-ms 300]
 *                     [--after-ms 1000]
 *       one connection PINGs back to back; after --before-ms a second
 *       connection sends --cmd (space-separated words) and waits for its
 *       reply; PINGs go on --after-ms longer. Reports how long the command
 *       took and the PING latency (max, p99, p99.9).
 *
 *   redis_probe load --port P [--duration-ms 3000] [--max-requests N]
 *       one connection alternating SET and GET of 256-byte values on 10000
 *       keys until the duration, the count or SIGTERM ends it, reporting
 *       p50/p99/p99.9/p99.99/max latency; run it next to redis-benchmark
 *       to see the tail under load.
 *
 * This program is not run under the allocator being measured.
 */
#include "bench_common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>

#define SC "redis"

struct conn {
    int fd;
    char buf[1 << 16];
    size_t len, pos;
};

static int conn_open(struct conn *c, int port) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {.tv_sec = 30};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof a) != 0) return -1;
    c->len = c->pos = 0;
    return 0;
}

static int send_all(struct conn *c, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int fill(struct conn *c) {
    if (c->pos == c->len) c->pos = c->len = 0;
    if (c->len == sizeof c->buf) {
        memmove(c->buf, c->buf + c->pos, c->len - c->pos);
        c->len -= c->pos;
        c->pos = 0;
    }
    ssize_t r;
    do
        r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
    while (r < 0 && errno == EINTR);
    if (r <= 0) return -1;
    c->len += (size_t)r;
    return 0;
}

/* Reads one line (without CRLF) into out; returns its length or -1. */
static long read_line(struct conn *c, char *out, size_t cap) {
    for (;;) {
        char *nl = memchr(c->buf + c->pos, '\n', c->len - c->pos);
        if (nl) {
            size_t n = (size_t)(nl - (c->buf + c->pos));
            size_t k = n && nl[-1] == '\r' ? n - 1 : n;
            if (k >= cap) k = cap - 1;
            memcpy(out, c->buf + c->pos, k);
            out[k] = '\0';
            c->pos += n + 1;
            return (long)k;
        }
        if (fill(c) != 0) return -1;
    }
}

static int skip_bytes(struct conn *c, size_t n) {
    while (n) {
        if (c->pos == c->len && fill(c) != 0) return -1;
        size_t k = c->len - c->pos < n ? c->len - c->pos : n;
        c->pos += k;
        n -= k;
    }
    return 0;
}

/* Reads one complete reply; returns 0, or -1 on error (an error reply is
 * printed and counts as an error). */
static int read_reply(struct conn *c) {
    char line[512];
    if (read_line(c, line, sizeof line) < 0) return -1;
    switch (line[0]) {
    case '+':
    case ':':
        return 0;
    case '-':
        fprintf(stderr, "redis error: %s\n", line);
        return -1;
    case '$': {
        long n = atol(line + 1);
        return n < 0 ? 0 : skip_bytes(c, (size_t)n + 2);
    }
    case '*': {
        long n = atol(line + 1);
        for (long i = 0; i < n; i++)
            if (read_reply(c) != 0) return -1;
        return 0;
    }
    default:
        return -1;
    }
}

/* Sends argv as a RESP array. */
static int send_cmd(struct conn *c, int argc, const char *const *argv, const size_t *lens) {
    char hdr[64];
    int n = snprintf(hdr, sizeof hdr, "*%d\r\n", argc);
    if (send_all(c, hdr, (size_t)n)) return -1;
    for (int i = 0; i < argc; i++) {
        size_t l = lens ? lens[i] : strlen(argv[i]);
        n = snprintf(hdr, sizeof hdr, "$%zu\r\n", l);
        if (send_all(c, hdr, (size_t)n) || send_all(c, argv[i], l) || send_all(c, "\r\n", 2))
            return -1;
    }
    return 0;
}

/* ---- flush ---------------------------------------------------------------- */

static _Atomic int stop;
static hist_t h_ping;
static uint64_t ping_errors;
static int g_port;
static uint64_t max_requests = 50000000;

static void *pinger(void *arg) {
    (void)arg;
    static struct conn c;
    if (conn_open(&c, g_port) != 0) {
        perror("pinger connect");
        ping_errors++;
        return NULL;
    }
    while (!atomic_load(&stop) && h_ping.n < max_requests) {
        uint64_t t0 = now_ns();
        if (send_all(&c, "PING\r\n", 6) || read_reply(&c)) {
            ping_errors++;
            break;
        }
        hist_add(&h_ping, now_ns() - t0);
    }
    close(c.fd);
    return NULL;
}

static int run_flush(const char *cmd, uint64_t before_ms, uint64_t after_ms) {
    pthread_t th;
    if (pthread_create(&th, NULL, pinger, NULL) != 0) return 1;
    static struct conn c;
    if (conn_open(&c, g_port) != 0) {
        perror("connect");
        atomic_store(&stop, 1);
        pthread_join(th, NULL);
        return 1;
    }
    const char *words[16];
    char copy[256];
    snprintf(copy, sizeof copy, "%s", cmd);
    int nw = 0;
    for (char *s = strtok(copy, " "); s && nw < 16; s = strtok(NULL, " "))
        words[nw++] = s;
    sleep_ms(before_ms);
    uint64_t t0 = now_ns();
    int err = send_cmd(&c, nw, words, NULL) || read_reply(&c);
    uint64_t t1 = now_ns();
    sleep_ms(after_ms);
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    close(c.fd);
    if (err) {
        fprintf(stderr, "command %s failed\n", cmd);
        return 1;
    }
    printf("INFO %s flush command: %s\n", SC, cmd);
    result(SC, "flush_cmd_ms", (double)(t1 - t0) / 1e6, "ms");
    result(SC, "flush_ping_max_ms", (double)h_ping.max / 1e6, "ms");
    result(SC, "flush_ping_p99_us", (double)hist_quantile(&h_ping, 0.99) / 1e3, "us");
    result(SC, "flush_ping_p999_us", (double)hist_quantile(&h_ping, 0.999) / 1e3, "us");
    result(SC, "flush_pings", (double)h_ping.n, "requests");
    return ping_errors ? 1 : 0;
}

/* ---- load ----------------------------------------------------------------- */

static volatile sig_atomic_t load_stop;

static void on_term(int sig) {
    (void)sig;
    load_stop = 1;
}

static int run_load(uint64_t duration_ms) {
    static struct conn c;
    if (conn_open(&c, g_port) != 0) {
        perror("connect");
        return 1;
    }
    static hist_t h;
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    char val[256], key[32];
    memset(val, 'v', sizeof val);
    uint64_t rng = 5, end = now_ns() + duration_ms * 1000000ull;
    for (uint64_t i = 0; i < max_requests && !load_stop && now_ns() < end; i++) {
        int kl =
            snprintf(key, sizeof key, "probe:%llu", (unsigned long long)(rng_next(&rng) % 10000));
        uint64_t t0 = now_ns();
        int err;
        if (i & 1) {
            const char *argv[] = {"GET", key};
            size_t lens[] = {3, (size_t)kl};
            err = send_cmd(&c, 2, argv, lens) || read_reply(&c);
        } else {
            const char *argv[] = {"SET", key, val};
            size_t lens[] = {3, (size_t)kl, sizeof val};
            err = send_cmd(&c, 3, argv, lens) || read_reply(&c);
        }
        if (err) {
            fprintf(stderr, "load: request failed\n");
            close(c.fd);
            return 1;
        }
        hist_add(&h, now_ns() - t0);
    }
    close(c.fd);
    hist_report(&h, SC, "probe_latency", 1e-3, "us");
    result(SC, "probe_requests", (double)h.n, "requests");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) goto usage;
    const char *sub = argv[1], *cmd = "FLUSHALL SYNC";
    uint64_t port = 0, before = 300, after = 1000, duration = 3000;
    for (int i = 2; i < argc; i++) {
        if (!arg_u64(argc, argv, &i, "--port", &port) &&
            !arg_value(argc, argv, &i, "--cmd", &cmd) &&
            !arg_u64(argc, argv, &i, "--before-ms", &before) &&
            !arg_u64(argc, argv, &i, "--after-ms", &after) &&
            !arg_u64(argc, argv, &i, "--duration-ms", &duration) &&
            !arg_u64(argc, argv, &i, "--max-requests", &max_requests))
            goto usage;
    }
    if (!port || port > 65535) goto usage;
    g_port = (int)port;
    if (strcmp(sub, "flush") == 0) return run_flush(cmd, before, after);
    if (strcmp(sub, "load") == 0) return run_load(duration);
usage:
    fprintf(stderr, "usage: redis_probe flush --port P [--cmd CMD] [--before-ms N] [--after-ms N]\n"
                    "       redis_probe load --port P [--duration-ms N] [--max-requests N]\n");
    return 2;
}
