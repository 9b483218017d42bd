/* The allocator core's only calls into the kernel for memory: reserving
 * segments and huge mappings. Request threads may call these (mmap is not a
 * purge); they never madvise, munmap or mremap: that is reclaim/'s job. */
#ifndef LULL_OS_H
#define LULL_OS_H

#include <stddef.h>

/* Reserve the address range segments grow into; called once at start. */
void lull_os_init(void);
/* A new 32 MiB segment at a 32 MiB boundary, zeroed, or NULL (errno ENOMEM). */
void *lull_os_segment_map(void);
/* A mapping of at least len bytes that contains a 32 MiB-aligned address at
 * which `aligned_len` bytes fit; returns the aligned address, and the real
 * base/length through the pointers. NULL with errno ENOMEM. */
void *lull_os_huge_map(size_t aligned_len, void **base, size_t *len);
size_t lull_os_page_size(void);

#endif
