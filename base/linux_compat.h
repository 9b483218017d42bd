/* Kernel constants newer than the Linux 6.1 headers of Debian 12.
 * Every definition is guarded, so newer headers win; values are the
 * kernel's ABI and never change. Only constants live here: whether the
 * running kernel supports a feature is probed at start, never assumed. */
#ifndef LULL_LINUX_COMPAT_H
#define LULL_LINUX_COMPAT_H

#include <linux/types.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>

/* userfaultfd features (6.4 / 6.7) */
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

/* madvise advice */
#ifndef MADV_FREE
#define MADV_FREE 8
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#ifndef __NR_process_madvise
#define __NR_process_madvise 440
#endif
#ifndef __NR_rseq
#define __NR_rseq 334
#endif

/* PAGEMAP_SCAN (6.7): include/uapi/linux/fs.h */
#ifndef PAGEMAP_SCAN
#define PAGE_IS_WPALLOWED (1 << 0)
#define PAGE_IS_WRITTEN (1 << 1)
#define PAGE_IS_FILE (1 << 2)
#define PAGE_IS_PRESENT (1 << 3)
#define PAGE_IS_SWAPPED (1 << 4)
#define PAGE_IS_PFNZERO (1 << 5)
#define PAGE_IS_HUGE (1 << 6)
#define PAGE_IS_SOFT_DIRTY (1 << 7)

struct page_region {
    __u64 start;
    __u64 end;
    __u64 categories;
};

#define PM_SCAN_WP_MATCHING (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)

struct pm_scan_arg {
    __u64 size;
    __u64 flags;
    __u64 start;
    __u64 end;
    __u64 walk_end;
    __u64 vec;
    __u64 vec_len;
    __u64 max_pages;
    __u64 category_inverted;
    __u64 category_mask;
    __u64 category_anyof_mask;
    __u64 return_mask;
};

#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#endif

/* rseq feature size in the auxiliary vector (6.3+): node_id and mm_cid are
 * kept up to date when it covers them. Appended by numa/. */
#ifndef AT_RSEQ_FEATURE_SIZE
#define AT_RSEQ_FEATURE_SIZE 27
#endif
#ifndef AT_RSEQ_ALIGN
#define AT_RSEQ_ALIGN 28
#endif

#endif
