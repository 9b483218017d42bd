/* Heap profile requests from the counter page (include/lull/counters.h,
 * "Requests"): served on the reclaim thread, at each of its ticks. */
#ifndef LULL_PROFILE_REQUEST_H
#define LULL_PROFILE_REQUEST_H

/* From the counter page's tick hook, on the page's writer thread: if the
 * page's request block holds a request not yet answered, write the
 * profile file and answer it. Does nothing otherwise (one atomic load). */
void profile_request_serve(void);

#endif
