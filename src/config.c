/* Configuration parsing; see config.h. Runs before anything can allocate,
 * so it reads the environment in place and keeps no copies. */
#include "src/config.h"
#include "src/message.h"

#include <ctype.h>
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

static bool parse_long(const char *v, size_t len, long *out) {
    char buf[32];
    if (len == 0 || len >= sizeof buf) return false;
    memcpy(buf, v, len);
    buf[len] = 0;
    char *end;
    long x = strtol(buf, &end, 10);
    if (*end) return false;
    *out = x;
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

/* "0-3,6" into a bit mask of at most `limit` bits (CPUs or nodes). */
static bool parse_list(const char *v, size_t len, void (*set)(unsigned, void *), void *arg,
                       unsigned limit) {
    size_t i = 0;
    bool any = false;
    while (i < len) {
        if (!isdigit((unsigned char)v[i])) return false;
        unsigned a = 0, b;
        while (i < len && isdigit((unsigned char)v[i]))
            a = a * 10 + (unsigned)(v[i++] - '0');
        b = a;
        if (i < len && v[i] == '-') {
            i++;
            if (i >= len || !isdigit((unsigned char)v[i])) return false;
            b = 0;
            while (i < len && isdigit((unsigned char)v[i]))
                b = b * 10 + (unsigned)(v[i++] - '0');
        }
        if (b < a || b >= limit) return false;
        for (unsigned x = a; x <= b; x++)
            set(x, arg);
        any = true;
        if (i < len) {
            if (v[i] != ':' && v[i] != '+' && v[i] != ',') return false;
            i++;
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
    else if (!parse_long(v, len, &x) || x < -2)
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
    return set_flag(&lull_config.verbose, v, len);
}
static bool set_strict(const char *v, size_t len) {
    return set_flag(&lull_config.strict_checks, v, len);
}
static bool set_inline_purge(const char *v, size_t len) {
    return set_flag(&lull_config.inline_purge, v, len);
}
static bool set_warm(const char *v, size_t len) {
    long x;
    if (!parse_long(v, len, &x) || x < 0 || x > (1L << 20)) return false;
    __atomic_store_n(&lull_config.warm_reserve_bytes, (size_t)x << 20, __ATOMIC_RELAXED);
    return true;
}
static bool set_huge_cache(const char *v, size_t len) {
    long x;
    if (!parse_long(v, len, &x) || x < 0 || x > (1L << 26)) return false;
    __atomic_store_n(&lull_config.huge_cache_bytes, (size_t)x << 20, __ATOMIC_RELAXED);
    return true;
}
static bool set_huge_cache_idle(const char *v, size_t len) {
    long x;
    if (!parse_long(v, len, &x) || x < 0 || x > 86400000L) return false;
    __atomic_store_n(&lull_config.huge_cache_idle_ms, x, __ATOMIC_RELAXED);
    return true;
}

static const struct {
    const char *key;
    setter set;
    const char *expect;
    bool at_start_only; /* shapes start-up: the reclaim thread, NUMA, the page */
} keys[] = {
    {"purge_delay_ms", set_purge_delay, "auto, never, or milliseconds >= -1", false},
    {"purge_mode", set_purge_mode, "auto, dontneed or free", false},
    {"backend", set_backend, "auto, uring, process_madvise or madvise", true},
    {"refault_monitor", set_refault, "auto, on or off", true},
    {"reclaim_cpu", set_reclaim_cpu, "a CPU list such as 3 or 2-3 (':' between ranges)", true},
    {"reclaim_sched", set_reclaim_sched, "normal, batch or idle", true},
    {"numa", set_numa, "local, interleave, bind or off", true},
    {"numa_nodes", set_numa_nodes, "a node list such as 0-1", true},
    {"counter_page", set_counter_page, "on, off or a name of [A-Za-z0-9._-]", true},
    {"verbose", set_verbose, "on or off", false},
    {"strict_checks", set_strict, "on or off", false},
    {"warm_reserve_mb", set_warm, "MiB, 0 to 1048576", false},
    {"inline_purge", set_inline_purge, "on or off", false},
    {"huge_cache_mb", set_huge_cache, "MiB, 0 to 67108864", false},
    {"huge_cache_idle_ms", set_huge_cache_idle, "milliseconds, 0 to 86400000", false},
};

static bool set_one(const char *key, size_t klen, const char *v, size_t vlen, const char *origin) {
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (strlen(keys[i].key) != klen || strncasecmp(keys[i].key, key, klen) != 0) continue;
        if (started && keys[i].at_start_only) {
            lull_message("%s: %s applies at start only; set it in LULL_CONF, its LULL_ variable "
                         "or the program's lull_conf string",
                         origin, keys[i].key);
            return false;
        }
        if (keys[i].set(v, vlen)) return true;
        lull_message("%s: bad value '%.*s' for %s (expected %s); using the default", origin,
                     (int)vlen, v, keys[i].key, keys[i].expect);
        return false;
    }
    lull_message("%s: unknown key '%.*s'; ignored", origin, (int)klen, key);
    return false;
}

bool lull_config_set(const char *key, const char *value) {
    if (!key || !value) return false;
    return set_one(key, strlen(key), value, strlen(value), "lull_configure");
}

static void load_list(const char *conf, const char *origin) {
    while (conf && *conf) {
        size_t len = strcspn(conf, ",");
        const char *eq = memchr(conf, '=', len);
        if (eq)
            set_one(conf, (size_t)(eq - conf), eq + 1, len - (size_t)(eq - conf) - 1, origin);
        else if (len)
            lull_message("%s: '%.*s' is not key=value; ignored", origin, (int)len, conf);
        conf += len;
        if (*conf == ',') conf++;
    }
}

void lull_config_load(void) {
    if (loaded) return;
    loaded = true;
    if (&lull_conf && lull_conf) load_list(lull_conf, "lull_conf");
    load_list(getenv("LULL_CONF"), "LULL_CONF");
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char name[48] = "LULL_";
        size_t k = 5;
        for (const char *c = keys[i].key; *c && k < sizeof name - 1; c++)
            name[k++] = (char)toupper((unsigned char)*c);
        name[k] = 0;
        const char *v = getenv(name);
        if (v) set_one(keys[i].key, strlen(keys[i].key), v, strlen(v), name);
    }
}

size_t lull_config_format(char *buf, size_t len) {
    char delay[24];
    /* the run-time keys may change on another thread meanwhile */
    long d = __atomic_load_n(&lull_config.purge_delay_ms, __ATOMIC_RELAXED);
    if (d == LULL_PURGE_DELAY_AUTO)
        snprintf(delay, sizeof delay, "auto");
    else
        snprintf(delay, sizeof delay, "%ld", d);
    int n = snprintf(
        buf, len,
        "purge_delay_ms=%s,purge_mode=%s,backend=%s,refault_monitor=%s,numa=%s,"
        "counter_page=%s,verbose=%d,strict_checks=%d,warm_reserve_mb=%zu,"
        "inline_purge=%d,reclaim_cpu=%s,reclaim_sched=%s,huge_cache_mb=%zu,"
        "huge_cache_idle_ms=%ld",
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
        __atomic_load_n(&lull_config.huge_cache_idle_ms, __ATOMIC_RELAXED));
    return n < 0 ? 0 : (size_t)n;
}
