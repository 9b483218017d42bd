/* The allocator core's only calls into the kernel for memory: reserving
 * segments and huge mappings. Request threads may call these (mmap is not a
 * purge); they never madvise, munmap or mremap: that is reclaim/'s job. */
#ifndef LULL_OS_H
#define LULL_OS_H

#include <stddef.h>
#include <stdint.h>

/* Reserve the address range segments grow into; called once at start. */
void lull_os_init(void);
/* A new 32 MiB segment at a 32 MiB boundary, zeroed, or NULL (errno ENOMEM). */
void *lull_os_segment_map(void);
/* A mapping of exactly len bytes at a 32 MiB boundary, for a huge block
 * whose header starts it, placed as segments are but in a region of its
 * own (the next free boundaries of the huge blocks' range, above the
 * segments'), with its start plus `at` a multiple of `align` (a power of
 * two, 32 MiB or more: a block aligned past a segment). NULL with errno
 * EEXIST when that range has no room or the kernel refused it (ENOMEM: a
 * limit, or past the address space's end): the caller then maps with
 * slack, which fails too at a limit. ENOMEM for a size past
 * LULL_MAX_ALLOC or any other error. */
void *lull_os_huge_map_aligned(size_t len, size_t align, size_t at);
/* A mapping of len bytes for a huge block (the caller places its aligned
 * header inside; the slack around it is address space only, never touched).
 * Returns the base, also through *base / *map_len; NULL with errno ENOMEM. */
void *lull_os_huge_map(size_t len, void **base, size_t *map_len);
/* The huge blocks' region (its hint starts over at lo when it passes hi);
 * for the tests. */
void lull_os_huge_region(uintptr_t *lo, uintptr_t *hi);
/* The kernel's page size (AT_PAGESZ): what valloc and pvalloc align to, and
 * the unit of a madvise range. LULL_PAGE_SIZE (4 KiB) is lull's own unit of
 * parked pages and of its metadata's layout, not the kernel's. */
size_t lull_os_page_size(void);
/* MADV_COLLAPSE of [addr, addr + len) into huge pages: 0 or the errno. The
 * reclaim thread's only (numa/thp.h): it may take milliseconds. */
int lull_os_collapse(void *addr, size_t len);
/* MADV_POPULATE_WRITE of [addr, addr + len): its pages made resident and
 * writable without touching their contents (safe while other threads write
 * them); 0 or the errno (EINVAL before Linux 5.14). The reclaim thread's. */
int lull_os_populate(void *addr, size_t len);
/* MADV_HUGEPAGE of [addr, addr + len) (the reclaim thread's, thp=always). */
void lull_os_advise_huge(void *addr, size_t len);

#endif
