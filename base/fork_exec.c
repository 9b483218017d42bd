/* The start of the fork+exec variables (base/fork_exec.h). */
#include "base/fork_exec.h"

/* The first of them in the library's link order (base/ is linked first,
 * its files by name, and config.c and fault.c have none): page aligned, it
 * starts .data1 at a page, so that the group, under 4 KiB, is on one page
 * (.data1 may straddle two otherwise: it did, 2.8 KiB of it across a page
 * boundary). */
LULL_FORK_EXEC_DATA __attribute__((aligned(4096))) char lull_fork_exec_first;
