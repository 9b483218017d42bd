/* Is memory short? purge_mode=auto purges with MADV_FREE only while it is
 * not (policy.h): pages freed that way stay in the process's RSS, and in
 * its cgroup's usage, until the kernel needs them, which is exactly when a
 * machine or a container is short. Short: the system's MemAvailable below
 * a sixteenth of MemTotal, or the process's cgroup (v2) using more than
 * fifteen sixteenths of its memory.max. The reclaim thread looks once a
 * policy period (LULL_POLICY_PERIOD_MS), with purge_mode=auto and
 * purge_delay_ms=auto only: nothing else reads the answer. */
#ifndef LULL_MEMORY_SHORT_H
#define LULL_MEMORY_SHORT_H

#include "base/hidden.h"
#include <stdbool.h>
#include <stdint.h>

/* The answer, looked at again when a period has passed since the last
 * look (now: the reclaim thread's clock, ms). */
bool lull_memory_short_poll(uint32_t now_ms);

/* The two tests, on the files' text (for the tests): a meminfo text with
 * MemAvailable and MemTotal; a cgroup's memory.current and memory.max
 * ("max" when it has no limit). A text that lacks its figures is not
 * short. */
bool lull_meminfo_short(const char *meminfo);
bool lull_cgroup_short(const char *current, const char *max);

/* The look itself, replaced by tests (NULL: the files). */
extern LULL_HIDDEN bool (*lull_memory_short_probe)(void);

#endif
