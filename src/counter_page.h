/* The writer of the shared-memory counter page (include/lull/counters.h).
 *
 * One page per process, with one writer: the thread that called
 * counter_page_open() (the reclaim thread) is the only one whose
 * counter_page_publish() calls write the page; calls from any other thread
 * are ignored (once reported with lull_verbose). So open the page on the
 * thread that will publish. Nothing here allocates.
 *
 * Life cycle, for the caller:
 *   - at start:  counter_page_open(lull_config.counter_page_name)
 *   - each tick: fill a struct lull_counters, counter_page_publish(&c)
 *   - at exit:   counter_page_close() from an atexit handler or destructor.
 *                It may run while the reclaim thread is inside
 *                counter_page_publish(): close waits for that publication to
 *                end, and later publications do nothing.
 *   - in a fork child (pthread_atfork child handler): counter_page_after_fork_child(),
 *                then counter_page_open() again if the child should have a
 *                page. With the default name the child's page is /lull.<child
 *                pid>; an explicit name is still used by the parent, so a
 *                child reopening it fails (-EEXIST): give the child its own.
 */
#ifndef LULL_COUNTER_PAGE_H
#define LULL_COUNTER_PAGE_H

#include "lull/counters.h"

/* Create and map the page; the calling thread becomes its writer.
 * name: NULL or "" for "/lull.<pid>"; otherwise a
 * shm_open name (a leading '/' is added if missing; no other '/'; at most
 * 200 characters). The object is created O_EXCL with mode 0600, and its
 * blocks are reserved (posix_fallocate) before it is mapped, so that a full
 * /dev/shm is an error here rather than a SIGBUS at the first store. If the
 * name is taken by a stale page (a regular file of this process's user with
 * lull's header, whose writer, identified by pid and start time, no longer
 * runs) the stale page is removed and creation retried. Anything else at the
 * name is left alone and open fails: a live process's page, an object with
 * no lull header (another program's object, a semaphore), another user's
 * file, a FIFO, socket or device (opened O_NONBLOCK, never blocking), a
 * symbolic link (O_NOFOLLOW). lull never removes what it did not create.
 * The header (magic, version, size, pid, start time) is written; seq is 0
 * until the first publication.
 * Returns 0, or -errno (and one lull_message): -EEXIST name in use by a live
 * process or by something lull did not create, -EACCES (also the
 * LULL_FAULT_SHM_OPEN fault point), -EINVAL bad name, -EBUSY a page is
 * already open, -ENOSPC no room in /dev/shm, or the error of shm_open,
 * ftruncate, posix_fallocate or mmap. */
int counter_page_open(const char *name);

/* Publish *c: seq becomes odd, the published part of the page (from
 * publish_mono_ns to the end) is copied from *c, seq becomes even. Only from
 * the thread that opened the page (see above); the seq update is a
 * compare-and-swap all the same, so two writers could never mix. The
 * header fields of *c (magic .. seq) are ignored, and publish_mono_ns and
 * publish_real_ns are set here from the clocks, and page_size if *c has 0.
 * Does nothing if no page is open. No system call except the vDSO clock reads. */
void counter_page_publish(const struct lull_counters *c);

/* Unmap the page and shm_unlink its name. The name is unlinked only by the
 * process that created it (a fork child that did not call
 * counter_page_after_fork_child() unmaps but leaves the parent's page alone).
 * Safe to call more than once, and with no page open. */
void counter_page_close(void);

/* In a fork child: forget the parent's page (unmap it, never unlink or
 * write it). Call before anything else could publish. */
void counter_page_after_fork_child(void);

/* The shm_open name of the open page ("/lull.1234"), or NULL if none. */
const char *counter_page_name(void);

/* The mapped page (read-only view; NULL if none): for in-process readers
 * and tests. Read it with lull_counters_snapshot(). */
const volatile struct lull_counters *counter_page_mapping(void);

#endif
