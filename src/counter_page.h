/* The writer of the shared-memory counter page (include/lull/counters.h).
 *
 * One page per process, with one writer: the thread that called
 * counter_page_open() (the reclaim thread) is the only one whose
 * counter_page_publish() calls write the page; calls from any other thread
 * are ignored (once reported with lull_verbose). So open the page on the
 * thread that will publish. Nothing here allocates.
 *
 * Life cycle, for the caller:
 *   - at start:  counter_page_register_exit() (from the library constructor),
 *                counter_page_process_start() (at the first allocation),
 *                then, on the reclaim thread, counter_page_open(name) and
 *                counter_page_sweep()
 *   - each tick: fill a struct lull_counters, counter_page_publish(&c); and
 *                if counter_page_take_reopen(), counter_page_open() again
 *   - at exit:   counter_page_at_exit() from an atexit handler (it is also
 *                registered with at_quick_exit). It may run while the reclaim
 *                thread is inside counter_page_publish(): close waits for
 *                that publication to end, and later publications do nothing.
 *   - around a fork: counter_page_fork_prepare(), counter_page_fork_parent()
 *   - in a fork child (pthread_atfork child handler): counter_page_after_fork_child(),
 *                then counter_page_open() again if the child should have a
 *                page. With the default name the child's page is /lull.<child
 *                pid>; an explicit name is still used by the parent, so a
 *                child reopening it fails (-EEXIST): give the child its own.
 *
 * A page is removed by every end of its process lull can see: exit and
 * quick_exit (their handlers), _exit and _Exit, and the exec family
 * (LULL_OVERRIDE builds wrap them: the name goes before the call, and when
 * an exec fails the page comes back under the same name at the next tick).
 * Its heap profile file (the name plus ".heap", left by a request that
 * nobody collected) goes with it, if it is a regular file of this user.
 * Nothing else can remove it at the moment the process ends: Linux removes
 * no file name when a process exits or execs (a name in /dev/shm goes only
 * by unlink), _exit runs no user code, and exec runs none of the old
 * image's after it succeeds. So a process killed by a signal, or ending by a
 * raw exit_group or execve system call, leaves its page; it is then stale,
 * and removed by the next lull process of the same user when that one
 * creates its page (counter_page_sweep) or by lullstat --clean.
 *
 * Liveness: the writer holds an exclusive flock on its page from before the
 * header is written; the lock belongs to the mapping's open file, so the
 * kernel drops it when the process exits, execs or is killed, in whatever
 * PID namespace it runs. A locked page is alive. An unlocked page with the
 * default name of a PID namespace (lull.<pid>.<ns>) is stale; other unlocked
 * pages (an older lull did not lock) are judged by the header's pid and
 * start time, where /proc can tell (see counter_page.c).
 *
 * Names: the default is /lull.<pid> in the initial PID namespace and
 * /lull.<pid>.<ns> in any other, <ns> the inode of /proc/self/ns/pid and
 * <pid> the pid in the process's own namespace (also the header's pid), so
 * that pid 1 of two namespaces sharing /dev/shm have two pages.
 */
#ifndef LULL_COUNTER_PAGE_H
#define LULL_COUNTER_PAGE_H

#include "lull/counters.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Create and map the page; the calling thread becomes its writer.
 * name: NULL or "" for the default name (above); otherwise a
 * shm_open name (a leading '/' is added if missing; no other '/'; at most
 * 200 characters). The object is created O_EXCL with mode 0600, and its
 * blocks are reserved (posix_fallocate) before it is mapped, so that a full
 * /dev/shm is an error here rather than a SIGBUS at the first store. If the
 * name is taken by a stale page (a regular file of this process's user with
 * lull's header, not locked, whose writer no longer runs: see Liveness
 * above) the stale page is removed and creation retried. Anything else at the
 * name is left alone and open fails: a live process's page, an object with
 * no lull header (another program's object, a semaphore), another user's
 * file, a FIFO, socket or device (opened O_NONBLOCK, never blocking), a
 * symbolic link (O_NOFOLLOW). lull never removes what it did not create.
 * The header (magic, version, size, pid, start time) is written; seq is 0
 * until the first publication.
 * Returns 0, or -errno (and one lull_message): -EEXIST name in use by a live
 * process or by something lull did not create, -EACCES (also the
 * LULL_FAULT_SHM_OPEN fault point), -EINVAL bad name, -EBUSY a page is
 * already open, -ENOSPC no room in /dev/shm, -ECANCELED (no message) an
 * exec or exit is under way on another thread (counter_page_take_reopen()
 * then says to try again), or the error of shm_open, flock, ftruncate,
 * posix_fallocate or mmap. */
int counter_page_open(const char *name);

/* Remove the stale pages of this process's user from /dev/shm: regular
 * files with a default name (lull.<pid>, lull.<pid>.<ns>), owned by this
 * user, with lull's header, not locked, whose writer is gone (see
 * Liveness). Nothing else is touched (named pages are left to their
 * configuration and to lullstat --clean), nothing blocks (O_NONBLOCK,
 * O_NOFOLLOW), and the work is bounded: the first 4096 entries of the
 * directory, of which at most 256 pages are examined. Returns the number
 * removed. Allocates nothing. */
int counter_page_sweep(void);

/* True once after an exec failed (its page was removed before the exec) or
 * an open gave up because of an exec: the writer should open the page
 * again. */
bool counter_page_take_reopen(void);

/* Once, at the modules' start (the process's first allocation): this
 * process is lull's (a vfork child, with another pid, then touches
 * nothing), the C library's _exit and exec functions are looked up for the
 * wrappers. */
void counter_page_process_start(void);

/* Once, from the library constructor: counter_page_at_exit() becomes a
 * quick_exit handler. Not at the modules' start: that runs inside the
 * process's first allocation, which may be the C library's own under its
 * exit-handler lock (the 33rd atexit callocs a block holding it), and
 * at_quick_exit takes that lock: the process hung there
 * (tests/test_start_in_atexit.c). The handler does nothing in a process
 * that never started (no page). */
void counter_page_register_exit(void);

/* The page's end at exit (atexit, at_quick_exit): no page is created from
 * now on (one being created is waited for), and the page is closed. */
void counter_page_at_exit(void);

/* Publish *c: seq becomes odd, the published part of the page (from
 * publish_mono_ns to the end) is copied from *c, seq becomes even. Only from
 * the thread that opened the page (see above); the seq update is a
 * compare-and-swap all the same, so two writers could never mix. The
 * header fields of *c (magic .. seq) are ignored, and publish_mono_ns and
 * publish_real_ns are set here from the clocks, and page_size if *c has 0.
 * Does nothing if no page is open. No system call except the vDSO clock reads. */
void counter_page_publish(const struct lull_counters *c);

/* Heap profile requests (include/lull/counters.h, "Requests"; served by
 * src/profile_request.c). Only the page's writer thread gets or answers
 * one; both do nothing (false) when no page is open. */

/* true, with *req, when the request block's profile_request differs from
 * the last value answered: a request to serve. Reads that one word. */
bool counter_page_take_request(uint64_t *req);

/* Answer request req: profile_status = status (an errno, or 0), then
 * profile_done = req (release); req is the last value served from now on. */
void counter_page_answer(uint64_t req, int status);

/* The profile file's name in LULL_COUNTERS_SHM_DIR, without a directory:
 * the page's name (no leading '/') plus LULL_COUNTERS_PROFILE_SUFFIX.
 * 0, -ENOENT with no page, -ENAMETOOLONG if len is too small. */
int counter_page_profile_file(char *buf, size_t len);

/* shm_unlink the page's name, then unmap it (which drops its lock). The
 * name is unlinked only by the process that created it (a fork child that
 * did not call counter_page_after_fork_child() leaves the parent's page
 * alone; it has no copy of the mapping either: MADV_DONTFORK). Safe to call
 * more than once, and with no page open. */
void counter_page_close(void);

/* fork's prepare and parent handlers: no open is under way while a fork
 * copies the process (the child would keep the page's descriptor, its
 * lock and its mapping). */
void counter_page_fork_prepare(void);
void counter_page_fork_parent(void);

/* In a fork child: forget the parent's page (never unlink or write it; the
 * child has no copy of its mapping). Call before anything else could
 * publish. */
void counter_page_after_fork_child(void);

/* The shm_open name of the open page ("/lull.1234"), or NULL if none. */
const char *counter_page_name(void);

/* The mapped page (read-only view; NULL if none): for in-process readers
 * and tests. Read it with lull_counters_snapshot(). */
const volatile struct lull_counters *counter_page_mapping(void);

#endif
