/* The PATH search of execvp() and execvpe(), done as the C library does it
 * (glibc's posix/execvpe.c), through an execve() the caller gives. lull's
 * exec wrappers (src/counter_page.c) call the C library's own search, which
 * they look up when lull starts, at a process's first allocation; a process
 * that execs before it allocates anything (/usr/bin/time does) gets this
 * one instead. No allocation and no lookup: the candidate paths and a
 * script's shell arguments are on the stack, so it is safe in a vfork
 * child too. */
#ifndef LULL_EXEC_SEARCH_H
#define LULL_EXEC_SEARCH_H

typedef int (*lull_execve_fn)(const char *path, char *const argv[], char *const envp[]);

/* Execs `file`: itself if it holds a '/', else the first entry of $PATH
 * (/bin:/usr/bin when unset; an empty entry is the working directory) that
 * execs. A file the kernel cannot exec (ENOEXEC) is run by /bin/sh as a
 * script. Entries that fail with EACCES, ENOENT, ENOTDIR, ESTALE, ENODEV or
 * ETIMEDOUT are passed over; any other error ends the search. Returns -1
 * with errno set (EACCES if an entry was denied and none ran). */
int lull_exec_search(const char *file, char *const argv[], char *const envp[],
                     lull_execve_fn execve_fn);

#endif
