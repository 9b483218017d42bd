/* Purge everything lull holds free, now, whatever the purge delay (even
 * "never"): lull_purge_all, and the purge the heap limit asks for when an
 * allocation finds no room (base/resident.h). What goes: every cached and
 * queued huge mapping (unmapped), the warm reserve, every dirty and every
 * MADV_FREE'd slice and every parked page (MADV_DONTNEED, so RSS drops at
 * once), after the remote frees into the heaps of exited threads are
 * collected (the spans they empty go too). What stays: the free blocks of
 * spans in use that no page of their own holds alone, and what live
 * threads keep for themselves (their kept empty spans and held remote
 * frees: each thread gives those back with lull_thread_collect, which
 * lull_purge_all calls for its caller first).
 *
 * Runs as a forced tick of the reclaim thread (reclaim_thread.c); with no
 * reclaim thread, on the caller of lull_purge_all, which asked for it. */
#ifndef LULL_PURGE_NOW_H
#define LULL_PURGE_NOW_H

#include "reclaim/reclaim.h"

#include <stdbool.h>

struct purge_backend;

/* Every step once, through b; true if anything was done. */
bool lull_purge_now(struct purge_backend *b, lull_reclaim_stats *st);
/* The same on a thread that is not the reclaim thread, with a backend of
 * its own (plain madvise). */
void lull_purge_now_on_caller(lull_reclaim_stats *st);

#endif
