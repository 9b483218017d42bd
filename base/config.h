/* Configuration: LULL_CONF="key=value,...", the same keys as LULL_<KEY>
 * variables (which win over LULL_CONF), and lull_config_set() from the C
 * API. Read once at start without allocating. A bad value is reported once
 * on stderr, naming the key, and the default is kept. */
#ifndef LULL_CONFIG_H
#define LULL_CONFIG_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base/hidden.h"
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LULL_PURGE_DELAY_AUTO (-2L)
#define LULL_PURGE_DELAY_NEVER (-1L)
/* The longest purge delay (a day). The reclaim thread compares 32-bit
 * millisecond times: a delay of 2^31 ms or more would wrap (2^32 - 1 and up
 * used to mean "purge at once"); "never" is the way to keep memory for good. */
#define LULL_PURGE_DELAY_MAX_MS 86400000L

typedef enum { LULL_MODE_AUTO, LULL_MODE_DONTNEED, LULL_MODE_FREE } lull_purge_mode;
typedef enum {
    LULL_BACKEND_AUTO,
    LULL_BACKEND_URING,
    LULL_BACKEND_PROCESS_MADVISE,
    LULL_BACKEND_MADVISE,
} lull_backend_kind;
typedef enum {
    LULL_NUMA_LOCAL,
    LULL_NUMA_INTERLEAVE,
    LULL_NUMA_BIND,
    LULL_NUMA_OFF
} lull_numa_policy;
typedef enum { LULL_SWITCH_AUTO, LULL_SWITCH_ON, LULL_SWITCH_OFF } lull_switch;
/* the reclaim thread's scheduling class (SCHED_OTHER, SCHED_BATCH, SCHED_IDLE) */
typedef enum { LULL_SCHED_NORMAL, LULL_SCHED_BATCH, LULL_SCHED_IDLE } lull_reclaim_sched;
/* transparent huge pages (numa/thp.h) */
typedef enum { LULL_THP_NEVER, LULL_THP_AUTO, LULL_THP_ALWAYS } lull_thp_mode;

typedef struct {
    long purge_delay_ms; /* auto (-2), never (-1), 0 = immediate, else ms */
    lull_purge_mode purge_mode;
    lull_backend_kind backend;
    lull_switch refault_monitor;
    lull_numa_policy numa;
    uint64_t numa_nodes;        /* node mask for bind / interleave; 0 = all */
    bool counter_page;          /* publish the shared-memory counter page */
    char counter_page_name[64]; /* "" = default name /lull.<pid> */
    bool verbose;
    bool strict_checks; /* costlier invalid/double free detection */
    bool reclaim_cpus_set;
    cpu_set_t reclaim_cpus;           /* reclaim thread and its io-wq workers */
    lull_reclaim_sched reclaim_sched; /* inherited by its io-wq workers too */
    size_t warm_reserve_bytes;        /* upper bound of the prefaulted warm reserve */
    bool inline_purge;                /* purge on the freeing thread if no reclaim thread */
    size_t huge_cache_bytes;          /* bound of the freed huge mappings kept for reuse */
    long huge_cache_idle_ms;          /* a cached huge mapping unused this long is unmapped */
    size_t heap_limit_bytes;          /* hard limit on the resident estimate; 0 = none */
    size_t profile_sample_bytes;      /* heap profile: mean bytes between samples; 0 = off */
    lull_thp_mode thp;
} lull_config_t;

extern LULL_HIDDEN lull_config_t lull_config;

/* Load from the environment (once; later calls do nothing). */
void lull_config_load(void);
/* Set one key from text; false (and one message) on an unknown key or bad value. */
bool lull_config_set(const char *key, const char *value);
/* Start-up keys (backend, reclaim_cpu, numa, counter_page, ...) are
 * refused from now on, with a message. */
void lull_config_mark_started(void);
/* Write the configuration in force as "key=value,..." into buf. A text
 * longer than buf ends at a whole key=value and ",..."; returns the length
 * of the whole text. */
size_t lull_config_format(char *buf, size_t len);

#endif
