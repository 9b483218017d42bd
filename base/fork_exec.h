/* What a fork+exec runs of lull, kept on as few pages as possible: a fork
 * child's handlers (src/init.c fork_child and the hooks it runs) and the
 * exec and exit wrappers it goes through, then the library constructor of
 * the program it execs. Neither process has these pages mapped yet (a
 * child gets no page table entries for the library's text, and every
 * page it writes is a copy; an exec starts from nothing), and each page
 * fault costs some 4 us on a Firecracker guest.
 *
 * LULL_FORK_EXEC_TEXT: the functions go to .text.sorted.*, which GNU ld's
 * default script lays out ahead of the rest of .text, the same name from
 * every object file together (a plain section(".text.x") would be laid
 * out object by object among the other functions): near _init, in the
 * 64 KiB fault-around window the constructor's _init faults in anyway.
 *
 * LULL_FORK_EXEC_DATA: the variables they read or write go to .data1,
 * which the default script puts after every object's .data, right before
 * .bss: together, on the page the dynamic loader clears up to the end of
 * the file's data (written at every start anyway).
 *
 * Another linker, or an older one, lays them out as it likes: nothing but
 * the fault count depends on it. */
#ifndef LULL_FORK_EXEC_H
#define LULL_FORK_EXEC_H

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#define LULL_FORK_EXEC_TEXT __attribute__((section(".text.sorted.lull_fork_exec")))
#define LULL_FORK_EXEC_DATA __attribute__((section(".data1")))

/* A default mutex that fork's prepare handler took, free again in the
 * child: its initializer assigned, not pthread_mutex_init(), whose libc
 * page the child would fault in for nothing (the forking thread is the
 * only one there, and a default mutex holds no other state).
 *
 * Under ThreadSanitizer, held (a trylock: free if the prepare handler did
 * not take it, as arena.c's locks past lull_arena_count) and unlocked
 * instead: TSan sees no unlock in the assignment, and in a child of a
 * parent with one thread (after a fork of more, it ignores the child's
 * synchronization) the first other thread to take the mutex, the child's
 * reclaim thread at its first step, was reported as a double lock of a
 * mutex the forking thread still held (tests/test_reclaim_start_fork.c). */
#if defined(__SANITIZE_THREAD__)
#define LULL_FORK_EXEC_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LULL_FORK_EXEC_TSAN 1
#endif
#endif
static inline void lull_mutex_reset_in_child(pthread_mutex_t *m) {
#ifdef LULL_FORK_EXEC_TSAN
    (void)pthread_mutex_trylock(m);
    pthread_mutex_unlock(m);
#else
    *m = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
#endif
}

/* close(fd) for what a fork child runs: the system call itself, not the C library's
 * wrapper, whose page of libc's text the child has not mapped (a page
 * fault of every child whose parent's reclaim thread had opened its ring
 * or its refault monitor). The result is not looked at, as the callers
 * never did. */
static inline void lull_close_unwrapped(int fd) {
#if defined(__x86_64__)
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"((long)SYS_close), "D"((long)fd)
                     : "rcx", "r11", "memory");
    (void)ret;
#else
    (void)syscall(SYS_close, fd);
#endif
}

#endif
