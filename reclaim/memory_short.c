/* Is memory short; see memory_short.h. Files are read with open/read into
 * the reclaim thread's stack (base/text_file.h): no allocation. */
#include "reclaim/memory_short.h"
#include "base/text_file.h"
#include "reclaim/policy.h"
#include "reclaim/reclaim_steps.h"

#include <string.h>

bool (*lull_memory_short_probe)(void);

bool lull_meminfo_short(const char *meminfo) {
    uint64_t total = lull_meminfo_bytes(meminfo, "MemTotal");
    /* "MemAvailable" since Linux 3.14; without it, not short */
    if (!strstr(meminfo, "MemAvailable")) return false;
    uint64_t available = lull_meminfo_bytes(meminfo, "MemAvailable");
    return total && available < total / 16;
}

bool lull_cgroup_short(const char *current, const char *max) {
    unsigned long used, limit;
    if (!lull_parse_ulong(current, &used) || !lull_parse_ulong(max, &limit) || !limit)
        return false; /* "max": no limit */
    return used > limit - limit / 16;
}

/* The process's cgroup v2 directory ("/sys/fs/cgroup" + the path of
 * /proc/self/cgroup's "0::" line), or "" when there is none (cgroup v1,
 * no /proc): found at the first look of each process. */
static char cgroup_dir[512];
static bool cgroup_looked;

static void find_cgroup_dir(void) {
    cgroup_looked = true;
    char text[1024];
    if (lull_read_text_file("/proc/self/cgroup", text, sizeof text) <= 0) return;
    const char *line = strncmp(text, "0::", 3) == 0 ? text : strstr(text, "\n0::");
    if (!line) return;
    line += line == text ? 3 : 4;
    size_t len = strcspn(line, "\n");
    static const char root[] = "/sys/fs/cgroup";
    if (sizeof root - 1 + len + 1 > sizeof cgroup_dir) return;
    memcpy(cgroup_dir, root, sizeof root - 1);
    memcpy(cgroup_dir + sizeof root - 1, line, len);
    cgroup_dir[sizeof root - 1 + len] = '\0';
}

static bool cgroup_file(const char *name, char *buf, size_t size) {
    char path[sizeof cgroup_dir + 32];
    size_t at = strlen(cgroup_dir), n = strlen(name);
    memcpy(path, cgroup_dir, at);
    path[at] = '/';
    memcpy(path + at + 1, name, n + 1);
    return lull_read_text_file(path, buf, size) > 0;
}

static bool look(void) {
    if (lull_memory_short_probe) return lull_memory_short_probe();
    char text[4096];
    if (lull_read_text_file("/proc/meminfo", text, sizeof text) > 0 && lull_meminfo_short(text))
        return true;
    if (!cgroup_looked) find_cgroup_dir();
    char current[32], max[32];
    return cgroup_dir[0] && cgroup_file("memory.max", max, sizeof max) &&
           cgroup_file("memory.current", current, sizeof current) &&
           lull_cgroup_short(current, max);
}

static uint32_t last_look_ms;
static bool short_now;

bool lull_memory_short_poll(uint32_t now_ms) {
    if (last_look_ms == 0 || (int32_t)(now_ms - last_look_ms) >= LULL_POLICY_PERIOD_MS) {
        last_look_ms = now_ms ? now_ms : 1;
        /* its files are open for a few microseconds: under the step lock,
         * which fork's prepare handler takes, so that a fork child never
         * keeps one of their descriptors (tests/test_race_reclaim_open.c) */
        lull_steps_lock();
        short_now = look();
        lull_steps_unlock();
    }
    return short_now;
}
