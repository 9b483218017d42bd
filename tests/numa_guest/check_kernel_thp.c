/* Kernel check: transparent huge pages and MADV_COLLAPSE (group "kernel").
 *
 *   kernel_thp   /sys/kernel/mm/transparent_hugepage/{enabled,defrag}; a 4 MiB
 *                region aligned to 2 MiB given MADV_HUGEPAGE and written: its
 *                AnonHugePages (/proc/self/smaps_rollup); a 2 MiB region written
 *                in 4 KiB pages (MADV_NOHUGEPAGE), then MADV_HUGEPAGE and
 *                MADV_COLLAPSE (25, Linux 6.1): whether the kernel has it and
 *                whether it made a huge page; and a block of lull's written,
 *                for what lull's own memory gets today.
 *
 * It fails only when the kernel contradicts itself: THP enabled but no huge
 * page for an advised aligned region, a MADV_COLLAPSE that succeeds without
 * a huge page, or MADV_HUGEPAGE refused while THP is built in. A kernel
 * without THP (Debian's PREEMPT_RT 6.1 is built without it) or without
 * MADV_COLLAPSE is reported, not failed. */
#ifndef LULL_GUEST_NO_LIB
#define _GNU_SOURCE
#define GUEST_GROUP "kernel"
#include "guest.h"
#include "guest_lull.h"

#include "base/linux_compat.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_PAGE (2 * MIB)

/* The file's first line without the newline, or "absent". */
static void read_line(const char *path, char *buf, size_t len) {
    snprintf(buf, len, "absent");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n <= 0) {
        snprintf(buf, len, "unreadable");
        return;
    }
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
}

/* The mode in brackets ("always" of "[always] madvise never"). */
static void bracketed(const char *line, char *mode, size_t len) {
    const char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
    if (!a || !b) {
        snprintf(mode, len, "%s", line);
        return;
    }
    snprintf(mode, len, "%.*s", (int)(b - a - 1), a + 1);
}

/* len bytes aligned to 2 MiB (the mapping is not unmapped: the check's
 * process ends soon). */
static char *map_aligned(size_t len) {
    char *p = guest_map(len + HUGE_PAGE);
    if (!p) return NULL;
    return (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
}

static int err_of(int r) {
    return r == 0 ? 0 : -errno;
}

/* The AnonHugePages of an 8 MiB block of lull's, written; the sub-check's
 * detail carries it back ("lull_block_kb=N"). */
static int sub_thp_lull(void) {
    long ahp = smaps_kb("AnonHugePages");
    char *b = malloc(8 * MIB);
    GUEST_SUB_REQUIRE(b, "malloc failed");
    memset(b, 1, 8 * MIB);
    long got = smaps_kb("AnonHugePages") - ahp;
    guest_sub_info("an 8 MiB block of lull's at %p (%zu KiB past a 2 MiB boundary), written: "
                   "AnonHugePages +%ld KiB",
                   (void *)b, (size_t)((uintptr_t)b & (HUGE_PAGE - 1)) / KIB, got);
    guest_sub_detail("lull_block_kb=%ld", got);
    free(b);
    return GUEST_PASS;
}
GUEST_SUB("kernel_thp_lull", sub_thp_lull);

GUEST_CHECK_TIMEOUT(kernel_thp, 60) {
    char enabled[128], defrag[128], mode[32], dmode[32];
    read_line("/sys/kernel/mm/transparent_hugepage/enabled", enabled, sizeof enabled);
    read_line("/sys/kernel/mm/transparent_hugepage/defrag", defrag, sizeof defrag);
    bracketed(enabled, mode, sizeof mode);
    bracketed(defrag, dmode, sizeof dmode);
    bool built = strcmp(enabled, "absent") != 0;
    guest_info("transparent_hugepage/enabled: %s; defrag: %s", enabled, defrag);
    GUEST_REQUIRE(smaps_kb("AnonHugePages") >= 0, "no AnonHugePages in /proc/self/smaps_rollup");

    /* MADV_HUGEPAGE on an aligned region, then written */
    const size_t len = 2 * HUGE_PAGE;
    char *r1 = map_aligned(len);
    GUEST_REQUIRE(r1, "mmap failed");
    long ahp0 = smaps_kb("AnonHugePages");
    int mh = err_of(madvise(r1, len, MADV_HUGEPAGE));
    guest_touch(r1, len);
    long ahp1 = smaps_kb("AnonHugePages");
    long got1 = ahp1 - ahp0;
    guest_info("MADV_HUGEPAGE on 4 MiB aligned: %s; written: AnonHugePages +%ld KiB",
               kernel_answer(mh), got1);

    /* 4 KiB pages first, then MADV_COLLAPSE */
    char *r2 = map_aligned(HUGE_PAGE);
    GUEST_REQUIRE(r2, "mmap failed");
    int nh = err_of(madvise(r2, HUGE_PAGE, MADV_NOHUGEPAGE));
    guest_touch(r2, HUGE_PAGE);
    long ahp2 = smaps_kb("AnonHugePages");
    int mh2 = err_of(madvise(r2, HUGE_PAGE, MADV_HUGEPAGE));
    int mc = -EAGAIN;
    for (int i = 0; i < 5 && (mc == -EAGAIN || mc == -ENOMEM); i++)
        mc = err_of(madvise(r2, HUGE_PAGE, MADV_COLLAPSE));
    long ahp3 = smaps_kb("AnonHugePages");
    long got2 = ahp3 - ahp2;
    guest_info("2 MiB in 4 KiB pages (MADV_NOHUGEPAGE %s), MADV_HUGEPAGE %s, MADV_COLLAPSE %s: "
               "AnonHugePages +%ld KiB",
               kernel_answer(nh), kernel_answer(mh2), kernel_answer(mc), got2);

    /* lull's own memory, as it is advised today, in a fresh process (this
     * one is a fork of /init, whose lull touched its segments first) */
    GUEST_REQUIRE(guest_sub_run("kernel_thp_lull", NULL) == GUEST_PASS,
                  "the sub-check of lull's block failed: %s", guest_detail_text());
    long got3 = -1;
    sscanf(guest_detail_text(), "lull_block_kb=%ld", &got3);

    if (!built) {
        GUEST_REQUIRE(mh == -EINVAL, "no THP in sysfs but MADV_HUGEPAGE answers %s",
                      kernel_answer(mh));
        GUEST_REQUIRE(mc != 0, "no THP in sysfs but MADV_COLLAPSE succeeds");
        guest_detail("THP not built in (no /sys/kernel/mm/transparent_hugepage): MADV_HUGEPAGE "
                     "%s, MADV_COLLAPSE %s; lull's 8 MiB block: AnonHugePages +%ld KiB",
                     kernel_answer(mh), kernel_answer(mc), got3);
        return GUEST_PASS;
    }
    GUEST_REQUIRE(mh == 0, "THP %s but MADV_HUGEPAGE answers %s", mode, kernel_answer(mh));
    if (strcmp(mode, "never") != 0)
        GUEST_REQUIRE(got1 >= (long)(HUGE_PAGE / KIB),
                      "THP %s, MADV_HUGEPAGE: only %ld KiB of 4 MiB in huge pages", mode, got1);
    if (mc == 0)
        GUEST_REQUIRE(got2 >= (long)(HUGE_PAGE / KIB),
                      "MADV_COLLAPSE succeeded but AnonHugePages grew by %ld KiB", got2);
    const char *collapse = mc == 0 ? "yes" : mc == -EINVAL ? "no (EINVAL)" : kernel_answer(mc);
    guest_detail("THP %s (defrag %s): MADV_HUGEPAGE 4 MiB -> %ld KiB huge; MADV_COLLAPSE %s (%ld "
                 "KiB huge); lull's 8 MiB block: %ld KiB huge",
                 mode, dmode, got1, collapse, got2, got3);
    return GUEST_PASS;
}

#endif /* LULL_GUEST_NO_LIB */
