/* Configuration parsing; see config.h. Runs before anything can allocate,
 * so it reads the environment in place and keeps no copies. */
#include "base/config.h"
#include "base/message.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

lull_config_t lull_config = {
    .purge_delay_ms = LULL_PURGE_DELAY_AUTO,
    .purge_mode = LULL_MODE_AUTO,
    .backend = LULL_BACKEND_AUTO,
    .refault_monitor = LULL_SWITCH_AUTO,
    .numa = LULL_NUMA_LOCAL,
    .counter_page = true,
    .warm_reserve_bytes = (size_t)64 << 20,
    /* enough for a few buffers of the sizes servers churn (tens to hundreds
     * of MiB) to skip mmap and page faults; purged ones cost address space
     * only, and all go after 10 s unused */
    .huge_cache_bytes = (size_t)1024 << 20,
    .huge_cache_idle_ms = 10000,
};

static bool loaded;
static bool started;
/* lull_config_load() is running (once, at the first allocation, before any
 * other thread can allocate: see lull_ensure_init) */
static bool loading;

/* The start-up configuration's problems: the first LOAD_MESSAGES are
 * printed, the rest only counted (a LULL_CONF of 12,000 unknown keys would
 * otherwise print 12,000 lines). */
#define LOAD_MESSAGES 8
static unsigned load_problems;

/* Where the configuration comes from, in the order it is read. */
enum origin { FROM_NONE, FROM_PROGRAM, FROM_LULL_CONF, FROM_VARIABLE, FROM_CONFIGURE };

/* A program that links lull may define this string ("key=value,...");
 * read before the environment, which wins. Like jemalloc's malloc_conf. */
extern const char *lull_conf __attribute__((weak));

void lull_config_mark_started(void) {
    started = true;
}

typedef bool (*setter)(const char *v, size_t len);

static bool word_is(const char *v, size_t len, const char *word) {
    return strlen(word) == len && strncasecmp(v, word, len) == 0;
}

/* A number: decimal digits, with a leading '-' for a negative one, and
 * nothing else (no space on either side, no '+', no base prefix): what
 * strtol() would skip or stop at is refused, as is a value past
 * [min, max] (also one too long for a long). */
static bool parse_long(const char *v, size_t len, long min, long max, long *out) {
    bool neg = len > 0 && v[0] == '-';
    size_t i = neg;
    if (i == len || (neg && min >= 0)) return false;
    /* the magnitude, never past the range's bound on its side (min > LONG_MIN) */
    unsigned long limit = neg ? (unsigned long)-min : (unsigned long)max, x = 0;
    for (; i < len; i++) {
        if (v[i] < '0' || v[i] > '9') return false;
        unsigned long d = (unsigned long)(v[i] - '0');
        if (d > limit || x > (limit - d) / 10) return false;
        x = x * 10 + d;
    }
    if (neg && x == 0) return false; /* "-0" */
    long r = neg ? -(long)x : (long)x;
    if (r < min || r > max) return false;
    *out = r;
    return true;
}

static bool parse_bool(const char *v, size_t len, bool *out) {
    if (word_is(v, len, "1") || word_is(v, len, "on") || word_is(v, len, "true") ||
        word_is(v, len, "yes"))
        return *out = true, true;
    if (word_is(v, len, "0") || word_is(v, len, "off") || word_is(v, len, "false") ||
        word_is(v, len, "no"))
        return *out = false, true;
    return false;
}

/* Digits at v[*i] as a number below limit; false for none, or for one of
 * limit or more (however many digits: it never wraps). */
static bool parse_index(const char *v, size_t len, size_t *i, unsigned limit, unsigned *out) {
    if (*i >= len || !isdigit((unsigned char)v[*i])) return false;
    unsigned x = 0;
    while (*i < len && isdigit((unsigned char)v[*i])) {
        x = x * 10 + (unsigned)(v[(*i)++] - '0');
        if (x >= limit) return false;
    }
    *out = x;
    return true;
}

/* "0-3,6" into a bit mask of at most `limit` bits (CPUs or nodes). */
static bool parse_list(const char *v, size_t len, void (*set)(unsigned, void *), void *arg,
                       unsigned limit) {
    size_t i = 0;
    bool any = false;
    while (i < len) {
        unsigned a, b;
        if (!parse_index(v, len, &i, limit, &a)) return false;
        b = a;
        if (i < len && v[i] == '-') {
            i++;
            if (!parse_index(v, len, &i, limit, &b)) return false;
        }
        if (b < a || b >= limit) return false;
        for (unsigned x = a; x <= b; x++)
            set(x, arg);
        any = true;
        if (i < len) {
            if (v[i] != ':' && v[i] != '+' && v[i] != ',') return false;
            if (++i == len) return false; /* a separator ends it: "3:" */
        }
    }
    return any;
}

static void set_cpu(unsigned cpu, void *arg) {
    CPU_SET(cpu, (cpu_set_t *)arg);
}
static void set_node(unsigned node, void *arg) {
    *(uint64_t *)arg |= (uint64_t)1 << node;
}

/* The words of the enumerated keys, in enum order: parsed and printed. */
static const char *const mode_names[] = {"auto", "dontneed", "free"};
static const char *const backend_names[] = {"auto", "uring", "process_madvise", "madvise"};
static const char *const switch_names[] = {"auto", "on", "off"};
static const char *const numa_names[] = {"local", "interleave", "bind", "off"};
static const char *const sched_names[] = {"normal", "batch", "idle"};
#define COUNT(a) ((int)(sizeof(a) / sizeof(a)[0]))

/* Index of the word v in names, or -1. */
static int word_index(const char *v, size_t len, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (word_is(v, len, names[i])) return i;
    return -1;
}

static bool set_purge_delay(const char *v, size_t len) {
    long x;
    if (word_is(v, len, "auto"))
        x = LULL_PURGE_DELAY_AUTO;
    else if (word_is(v, len, "never"))
        x = LULL_PURGE_DELAY_NEVER;
    /* -1 (never) is the one negative number: -2, auto's value inside, is
     * refused as the message's range says */
    else if (!parse_long(v, len, LULL_PURGE_DELAY_NEVER, LULL_PURGE_DELAY_MAX_MS, &x))
        return false;
    __atomic_store_n(&lull_config.purge_delay_ms, x, __ATOMIC_RELAXED);
    return true;
}
/* Keys that change at run time are stored atomically: the reclaim thread
 * reads them on every tick. */
static bool set_purge_mode(const char *v, size_t len) {
    int m = word_index(v, len, mode_names, COUNT(mode_names));
    if (m < 0) return false;
    __atomic_store_n(&lull_config.purge_mode, (lull_purge_mode)m, __ATOMIC_RELAXED);
    return true;
}
static bool set_backend(const char *v, size_t len) {
    int b = word_is(v, len, "syscall") ? LULL_BACKEND_MADVISE
                                       : word_index(v, len, backend_names, COUNT(backend_names));
    if (b < 0) return false;
    lull_config.backend = (lull_backend_kind)b;
    return true;
}
static bool set_switch(lull_switch *out, const char *v, size_t len) {
    bool b;
    if (word_is(v, len, "auto"))
        *out = LULL_SWITCH_AUTO;
    else if (parse_bool(v, len, &b))
        *out = b ? LULL_SWITCH_ON : LULL_SWITCH_OFF;
    else
        return false;
    return true;
}
static bool set_refault(const char *v, size_t len) {
    return set_switch(&lull_config.refault_monitor, v, len);
}
static bool set_reclaim_cpu(const char *v, size_t len) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (!parse_list(v, len, set_cpu, &set, CPU_SETSIZE)) return false;
    lull_config.reclaim_cpus = set;
    lull_config.reclaim_cpus_set = true;
    return true;
}
static bool set_reclaim_sched(const char *v, size_t len) {
    int c = word_index(v, len, sched_names, COUNT(sched_names));
    if (c < 0) return false;
    lull_config.reclaim_sched = (lull_reclaim_sched)c;
    return true;
}
static bool set_numa(const char *v, size_t len) {
    int p = word_index(v, len, numa_names, COUNT(numa_names));
    if (p < 0) return false;
    lull_config.numa = (lull_numa_policy)p;
    return true;
}
static bool set_numa_nodes(const char *v, size_t len) {
    uint64_t mask = 0;
    if (!parse_list(v, len, set_node, &mask, 64)) return false;
    lull_config.numa_nodes = mask;
    return true;
}
static bool set_counter_page(const char *v, size_t len) {
    bool b;
    if (parse_bool(v, len, &b)) {
        lull_config.counter_page = b;
        lull_config.counter_page_name[0] = 0;
        return true;
    }
    if (len == 0 || len >= sizeof lull_config.counter_page_name - 1) return false;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)v[i]) && v[i] != '.' && v[i] != '_' && v[i] != '-')
            return false;
    /* the directory's own entries: no page can have those names */
    if ((len == 1 && v[0] == '.') || (len == 2 && v[0] == '.' && v[1] == '.')) return false;
    lull_config.counter_page = true;
    lull_config.counter_page_name[0] = '/';
    memcpy(lull_config.counter_page_name + 1, v, len);
    lull_config.counter_page_name[len + 1] = 0;
    return true;
}
static bool set_flag(bool *flag, const char *v, size_t len) {
    bool b;
    if (!parse_bool(v, len, &b)) return false;
    __atomic_store_n(flag, b, __ATOMIC_RELAXED);
    return true;
}
static bool set_verbose(const char *v, size_t len) {
    if (!set_flag(&lull_config.verbose, v, len)) return false;
    lull_message_set_verbose(lull_config.verbose);
    return true;
}
static bool set_strict(const char *v, size_t len) {
    return set_flag(&lull_config.strict_checks, v, len);
}
static bool set_inline_purge(const char *v, size_t len) {
    return set_flag(&lull_config.inline_purge, v, len);
}
static bool set_warm(const char *v, size_t len) {
    long x;
    if (!parse_long(v, len, 0, 1L << 20, &x)) return false;
    __atomic_store_n(&lull_config.warm_reserve_bytes, (size_t)x << 20, __ATOMIC_RELAXED);
    return true;
}
static bool set_huge_cache(const char *v, size_t len) {
    long x;
    if (!parse_long(v, len, 0, 1L << 26, &x)) return false;
    __atomic_store_n(&lull_config.huge_cache_bytes, (size_t)x << 20, __ATOMIC_RELAXED);
    return true;
}
static bool set_heap_limit(const char *v, size_t len) {
    long x;
    if (!parse_long(v, len, 0, 1L << 26, &x)) return false;
    __atomic_store_n(&lull_config.heap_limit_bytes, (size_t)x << 20, __ATOMIC_RELAXED);
    return true;
}
static const char *const thp_names[] = {"never", "auto", "always"};
static bool set_thp(const char *v, size_t len) {
    int m = word_index(v, len, thp_names, COUNT(thp_names));
    if (m < 0) return false;
    lull_config.thp = (lull_thp_mode)m;
    return true;
}
static bool set_profile_sample(const char *v, size_t len) {
    long x;
    if (!parse_long(v, len, 0, 1L << 20, &x)) return false;
    __atomic_store_n(&lull_config.profile_sample_bytes, (size_t)x << 10, __ATOMIC_RELAXED);
    return true;
}
static bool set_huge_cache_idle(const char *v, size_t len) {
    long x;
    if (!parse_long(v, len, 0, 86400000L, &x)) return false;
    __atomic_store_n(&lull_config.huge_cache_idle_ms, x, __ATOMIC_RELAXED);
    return true;
}

static const struct {
    const char *key;
    setter set;
    const char *expect;
    const char *dflt;   /* the default, as the message names it */
    bool at_start_only; /* shapes start-up: the reclaim thread, NUMA, the page */
} keys[] = {
    {"purge_delay_ms", set_purge_delay, "auto, never, or milliseconds -1 to 86400000", "auto",
     false},
    {"purge_mode", set_purge_mode, "auto, dontneed or free", "auto", false},
    {"backend", set_backend, "auto, uring, process_madvise or madvise", "auto", true},
    {"refault_monitor", set_refault, "auto, on or off", "auto", true},
    {"reclaim_cpu", set_reclaim_cpu,
     "a CPU list such as 3 or 2-3 (':' between ranges), CPUs 0 to 1023", "any", true},
    {"reclaim_sched", set_reclaim_sched, "normal, batch or idle", "normal", true},
    {"numa", set_numa, "local, interleave, bind or off", "local", true},
    {"numa_nodes", set_numa_nodes, "a node list such as 0-1, nodes 0 to 63", "all", true},
    {"counter_page", set_counter_page, "on, off or a name of 1 to 62 of [A-Za-z0-9._-]", "on",
     true},
    {"verbose", set_verbose, "on or off", "off", false},
    {"strict_checks", set_strict, "on or off", "off", false},
    {"warm_reserve_mb", set_warm, "MiB, 0 to 1048576", "64", false},
    {"inline_purge", set_inline_purge, "on or off", "off", false},
    {"huge_cache_mb", set_huge_cache, "MiB, 0 to 67108864", "1024", false},
    {"huge_cache_idle_ms", set_huge_cache_idle, "milliseconds, 0 to 86400000", "10000", false},
    {"heap_limit_mb", set_heap_limit, "MiB, 0 (no limit) to 67108864", "0: no limit", false},
    {"profile_sample_kb", set_profile_sample, "KiB, 0 (off) to 1048576", "0: off", true},
    {"thp", set_thp, "never, auto or always", "never", true},
};
#define KEY_COUNT (sizeof keys / sizeof keys[0])

/* While loading: the value in force of each key and where it came from
 * (pointers into the program's string and the environment, which outlive
 * the load), so that a bad value given after a good one says what stays. */
static struct {
    enum origin from;
    const char *value;
    size_t len;
} load_value[KEY_COUNT];

static const char *origin_name(enum origin from, size_t key, char *buf, size_t len) {
    switch (from) {
    case FROM_PROGRAM:
        return "lull_conf";
    case FROM_LULL_CONF:
        return "LULL_CONF";
    case FROM_VARIABLE: { /* LULL_<KEY>; len is well above 5 + the longest key */
        size_t k = 5;
        memcpy(buf, "LULL_", k);
        for (const char *c = keys[key].key; *c && k + 1 < len; c++)
            buf[k++] = (char)toupper((unsigned char)*c);
        buf[k] = 0;
        return buf;
    }
    default:
        return "lull_configure";
    }
}

/* One problem of the configuration: printed, unless the start-up
 * configuration has had LOAD_MESSAGES already (lull_config_load then
 * prints how many more there were). */
static void problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void problem(const char *fmt, ...) {
    if (loading && load_problems++ >= LOAD_MESSAGES) return;
    char buf[480]; /* values are cut at 100 bytes: a message fits */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    lull_message("%s", buf);
}

static bool set_one(const char *key, size_t klen, const char *v, size_t vlen, const char *origin,
                    enum origin from) {
    for (size_t i = 0; i < KEY_COUNT; i++) {
        if (strlen(keys[i].key) != klen || strncasecmp(keys[i].key, key, klen) != 0) continue;
        if (started && keys[i].at_start_only) {
            problem("%s: %s applies at start only; set it in LULL_CONF, its LULL_ variable or "
                    "the program's lull_conf string",
                    origin, keys[i].key);
            return false;
        }
        if (keys[i].set(v, vlen)) {
            if (loading) {
                load_value[i].from = from;
                load_value[i].value = v;
                load_value[i].len = vlen;
            }
            return true;
        }
        char kept[160], where[48];
        if (!loading)
            snprintf(kept, sizeof kept, "keeping the value in force");
        else if (load_value[i].from == FROM_NONE)
            snprintf(kept, sizeof kept, "using the default (%s)", keys[i].dflt);
        else
            snprintf(kept, sizeof kept, "keeping %s=%.*s from %s", keys[i].key,
                     (int)(load_value[i].len > 64 ? 64 : load_value[i].len), load_value[i].value,
                     origin_name(load_value[i].from, i, where, sizeof where));
        problem("%s: bad value '%.*s' for %s (expected %s); %s", origin,
                (int)(vlen > 100 ? 100 : vlen), v, keys[i].key, keys[i].expect, kept);
        return false;
    }
    problem("%s: unknown key '%.*s'; ignored", origin, (int)(klen > 100 ? 100 : klen), key);
    return false;
}

bool lull_config_set(const char *key, const char *value) {
    if (!key || !value) return false;
    return set_one(key, strlen(key), value, strlen(value), "lull_configure", FROM_CONFIGURE);
}

static void load_list(const char *conf, const char *origin, enum origin from) {
    while (conf && *conf) {
        size_t len = strcspn(conf, ",");
        const char *eq = memchr(conf, '=', len);
        if (eq)
            set_one(conf, (size_t)(eq - conf), eq + 1, len - (size_t)(eq - conf) - 1, origin, from);
        else if (len)
            problem("%s: '%.*s' is not key=value; ignored", origin, (int)(len > 100 ? 100 : len),
                    conf);
        conf += len;
        if (*conf == ',') conf++;
    }
}

void lull_config_load(void) {
    if (loaded) return;
    loaded = true;
    loading = true;
    /* The environment belongs to whoever runs the program: a setuid, setgid
     * or setcap program (secure mode, AT_SECURE) takes none of it
     * (secure_getenv returns NULL there). The program's own lull_conf
     * string is part of the program, and applies. */
    if (&lull_conf && lull_conf) load_list(lull_conf, "lull_conf", FROM_PROGRAM);
    load_list(secure_getenv("LULL_CONF"), "LULL_CONF", FROM_LULL_CONF);
    for (size_t i = 0; i < KEY_COUNT; i++) {
        char name[48];
        origin_name(FROM_VARIABLE, i, name, sizeof name);
        const char *v = secure_getenv(name);
        if (v) set_one(keys[i].key, strlen(keys[i].key), v, strlen(v), name, FROM_VARIABLE);
    }
    loading = false;
    if (load_problems > LOAD_MESSAGES)
        lull_message("%u more configuration problems not shown (only the first %d are)",
                     load_problems - LOAD_MESSAGES, LOAD_MESSAGES);
}

size_t lull_config_format(char *buf, size_t len) {
    /* Every key at its longest takes about 360 bytes; the counter page has
     * 256 (the defaults take 253), so the text is made whole here and cut
     * below. */
    char full[512], delay[24];
    /* the run-time keys may change on another thread meanwhile */
    long d = __atomic_load_n(&lull_config.purge_delay_ms, __ATOMIC_RELAXED);
    if (d == LULL_PURGE_DELAY_AUTO)
        snprintf(delay, sizeof delay, "auto");
    else
        snprintf(delay, sizeof delay, "%ld", d);
    int n = snprintf(
        full, sizeof full,
        "purge_delay_ms=%s,purge_mode=%s,backend=%s,refault_monitor=%s,numa=%s,"
        "counter_page=%s,verbose=%d,strict_checks=%d,warm_reserve_mb=%zu,"
        "inline_purge=%d,reclaim_cpu=%s,reclaim_sched=%s,huge_cache_mb=%zu,"
        "huge_cache_idle_ms=%ld,heap_limit_mb=%zu",
        delay, mode_names[__atomic_load_n(&lull_config.purge_mode, __ATOMIC_RELAXED)],
        backend_names[lull_config.backend], switch_names[lull_config.refault_monitor],
        numa_names[lull_config.numa],
        lull_config.counter_page
            ? (lull_config.counter_page_name[0] ? lull_config.counter_page_name + 1 : "on")
            : "off",
        __atomic_load_n(&lull_config.verbose, __ATOMIC_RELAXED),
        __atomic_load_n(&lull_config.strict_checks, __ATOMIC_RELAXED),
        __atomic_load_n(&lull_config.warm_reserve_bytes, __ATOMIC_RELAXED) >> 20,
        __atomic_load_n(&lull_config.inline_purge, __ATOMIC_RELAXED),
        lull_config.reclaim_cpus_set ? "set" : "any", sched_names[lull_config.reclaim_sched],
        __atomic_load_n(&lull_config.huge_cache_bytes, __ATOMIC_RELAXED) >> 20,
        __atomic_load_n(&lull_config.huge_cache_idle_ms, __ATOMIC_RELAXED),
        __atomic_load_n(&lull_config.heap_limit_bytes, __ATOMIC_RELAXED) >> 20);
    size_t m = n < 0 ? 0 : (size_t)n < sizeof full ? (size_t)n : sizeof full - 1;
    if (len == 0) return m;
    if (m < len) {
        memcpy(buf, full, m);
        buf[m] = 0;
        return m;
    }
    /* Too long for buf: end at the last whole key=value that leaves room
     * for ",...". A value cut short reads as another value
     * ("heap_limit_mb=102" for 1024), and a key left out as its default. */
    size_t cut = len >= 5 ? len - 5 : 0;
    while (cut > 0 && full[cut] != ',')
        cut--;
    memcpy(buf, full, cut);
    if (cut > 0) {
        memcpy(buf + cut, ",...", 4);
        cut += 4;
    }
    buf[cut] = 0;
    return m;
}
