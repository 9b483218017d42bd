/* Small kernel text files (/proc, /sys) read and parsed without malloc or
 * buffered stdio: the topology at start-up (numa/topology.c) and the
 * reclaim thread's look at free memory (reclaim/memory_short.c) run where
 * an allocation would recurse into lull. */
#ifndef LULL_TEXT_FILE_H
#define LULL_TEXT_FILE_H

#include <stddef.h>
#include <stdint.h>

/* A whole small file into buf (NUL-terminated, cut at size - 1 bytes);
 * its length, or -errno. */
int lull_read_text_file(const char *path, char *buf, size_t size);
/* The decimal digits at s into *out (ULONG_MAX for a number past it,
 * never wrapped); the first character past them, or NULL when s starts
 * with none. */
const char *lull_parse_ulong(const char *s, unsigned long *out);
/* The figure after `key` in a meminfo text ("MemTotal:   16318356 kB",
 * also a node's "Node 0 MemTotal: ..."), in bytes (UINT64_MAX past it);
 * 0 when the key is not there. */
uint64_t lull_meminfo_bytes(const char *text, const char *key);

#endif
