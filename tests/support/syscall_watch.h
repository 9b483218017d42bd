/* Syscall watcher: the proof harness for invariant 2 ("no request thread
 * executes madvise, munmap, mremap, process_madvise or io_uring_*").
 *
 * A thread that calls syscall_watch_install_on_this_thread() gets a seccomp
 * filter of its own (no SECCOMP_FILTER_FLAG_TSYNC) that turns each of the
 * watched system calls into a SECCOMP_RET_USER_NOTIF. A supervisor thread
 * receives every notification, records who made which call with which
 * arguments, and answers SECCOMP_USER_NOTIF_FLAG_CONTINUE: the call then runs
 * as if nothing had watched it, so the program is never broken by the watch.
 * (SECCOMP_RET_TRAP would kill the process at glibc's thread exit, which
 * madvises the thread's own stack.)
 *
 * Properties worth knowing:
 * - Synchronous: a watched call blocks until the supervisor has recorded it,
 *   so once the call has returned in the calling thread, its event is
 *   visible to syscall_watch_count()/syscall_watch_get() from any thread.
 * - Inherited: a seccomp filter is copied into every thread (and process)
 *   that a watched thread creates, and their calls are recorded too, with
 *   their own tid. So install on the request threads AFTER lull's reclaim
 *   thread exists, and create unwatched helper threads from an unwatched
 *   thread. A process forked by a watched thread reports to the same
 *   supervisor while it lives: do not fork from a watched thread.
 * - A thread can be watched once; a second install on it (or on a thread
 *   that inherited the filter) is a no-op that returns 0.
 * - Exempt events: glibc's thread exit madvises the exiting thread's own
 *   stack. Events that are madvise calls inside the calling thread's own
 *   stack (known for threads that installed the filter themselves) are
 *   recorded but flagged SYSCALL_WATCH_OWN_STACK, and every event a thread
 *   makes after syscall_watch_thread_done() is flagged
 *   SYSCALL_WATCH_AFTER_DONE. syscall_watch_count() leaves flagged events
 *   out; syscall_watch_count_all() does not. Likewise calls whose
 *   instruction pointer lies in the code of a shared sanitizer runtime
 *   (libasan, libtsan, libubsan, liblsan: gcc's -fsanitize links these),
 *   which makes raw madvise/munmap calls of its own in every thread; such
 *   calls are flagged SYSCALL_WATCH_RUNTIME. A call that goes through libc
 *   (lull's, or a sanitizer interceptor's REAL(munmap)) is never flagged so.
 * - No malloc on the supervisor's path: events go into a fixed array
 *   (SYSCALL_WATCH_MAX_EVENTS; later events are counted, not stored), and
 *   listener fds into a fixed table (SYSCALL_WATCH_MAX_LISTENERS; a listener
 *   whose threads have all exited is closed and its slot reused).
 * - Needs seccomp user notification (Linux 5.0+, CONTINUE 5.5+, HUP of a
 *   listener whose threads are gone 5.8+) and either CAP_SYS_ADMIN or
 *   no_new_privs (set on the calling thread when needed).
 */
#ifndef LULL_TESTS_SYSCALL_WATCH_H
#define LULL_TESTS_SYSCALL_WATCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SYSCALL_WATCH_MAX_EVENTS 65536
#define SYSCALL_WATCH_MAX_LISTENERS 256

/* Event flags. */
#define SYSCALL_WATCH_OWN_STACK 0x1u  /* madvise inside the caller's own stack */
#define SYSCALL_WATCH_AFTER_DONE 0x2u /* made after syscall_watch_thread_done() */
#define SYSCALL_WATCH_FOREIGN 0x4u    /* not an x86-64 syscall (i386 or x32 ABI) */
#define SYSCALL_WATCH_RUNTIME 0x8u    /* made by a sanitizer runtime's own code */
#define SYSCALL_WATCH_EXEMPT                                                                       \
    (SYSCALL_WATCH_OWN_STACK | SYSCALL_WATCH_AFTER_DONE | SYSCALL_WATCH_RUNTIME)

struct syscall_watch_event {
    uint64_t seq;     /* 0, 1, 2, ... since the last reset */
    pid_t tid;        /* calling thread, as gettid() in the caller's namespace */
    uint32_t arch;    /* AUDIT_ARCH_* of the call */
    long nr;          /* system call number */
    uint64_t args[6]; /* raw arguments */
    uint64_t ip;      /* instruction pointer of the call */
    unsigned flags;   /* SYSCALL_WATCH_* flags above */
};

/* Start the supervisor thread (once per process; later calls return 0).
 * Must be called from a thread that is not itself watched (the supervisor
 * would inherit the filter and wait for itself): returns -1 with errno
 * EDEADLK there. Returns 0 or -1 with errno set. */
int syscall_watch_start(void);

/* Install the watch filter on the calling thread only. Starts the
 * supervisor first if needed. Returns 0 or -1 with errno set (EINVAL or
 * ENOSYS: no seccomp user notification; ENOSPC: listener table full). */
int syscall_watch_install_on_this_thread(void);

/* The same, and also watch the x86-64 system calls extra[0..n) (n <= 16),
 * e.g. SYS_mmap, on this thread only: for a test that asks more of its
 * threads than invariant 2 does. */
int syscall_watch_install_also(const long *extra, size_t n);

/* The same, watching every x86-64 system call of this thread except those
 * in allowed[0..n) (n <= 16): for "no system call at all" over a stretch of
 * code (compare syscall_watch_count() before and after it; the count is an
 * atomic read, no call). i386 calls: the base set. */
int syscall_watch_install_all_but(const long *allowed, size_t n);

/* Whether the calling thread installed the filter itself. */
int syscall_watch_installed_here(void);

/* The calling thread is about to finish: events it makes from now on (its
 * TLS destructors, glibc's stack madvise at exit) are flagged
 * SYSCALL_WATCH_AFTER_DONE and left out of syscall_watch_count(). */
void syscall_watch_thread_done(void);

/* Events recorded since the last reset, leaving out exempt ones. */
size_t syscall_watch_count(void);
/* All events recorded since the last reset, exempt ones included, and
 * those that did not fit the array. */
size_t syscall_watch_count_all(void);
/* Non-exempt events made by thread tid. */
size_t syscall_watch_count_tid(pid_t tid);

/* Copy up to max stored events (exempt ones included, in order) into out;
 * returns the number copied. */
size_t syscall_watch_get(struct syscall_watch_event *out, size_t max);

/* Forget all events (thread registrations and done marks are kept). */
void syscall_watch_reset(void);

/* Wait until every notification pending in the kernel when this was called
 * has been recorded (calls still blocked in other threads included). Not
 * needed for the caller's own calls, which are recorded before they return.
 * Returns 0, or -1 with errno ETIMEDOUT after timeout_ms. */
int syscall_watch_sync(int timeout_ms);

/* "madvise", "munmap", ... or "syscall_<nr>" for others (static storage,
 * one buffer per thread for unknown numbers). */
const char *syscall_watch_name(long nr);

/* Print the non-exempt events (or all with all != 0) to stderr, one a line;
 * for test failure messages. */
void syscall_watch_dump(int all);

#endif
