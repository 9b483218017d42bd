/* The pprof file format (github.com/google/pprof, proto/profile.proto),
 * gzip-compressed: what lull_profile_dump() writes. Only an encoder: the
 * samples come from src/profile.c, already aggregated by stack and scaled
 * to unbiased estimates. Runs outside malloc (the dumping thread samples
 * nothing while it runs), so it may allocate. */
#ifndef LULL_PPROF_WRITE_H
#define LULL_PPROF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#define LULL_PROFILE_MAX_DEPTH 32

/* One stack and its figures. pc[0] is the innermost frame (the caller of
 * malloc), pc[depth - 1] the outermost; every pc but pc[0] is a return
 * address less one (inside the call instruction), so that it symbolizes
 * to the line of the call. */
typedef struct lull_profile_record {
    uintptr_t pc[LULL_PROFILE_MAX_DEPTH];
    uint32_t depth;
    /* estimates: sampled allocations scaled by the inverse of their
     * sampling probability */
    int64_t alloc_objects, alloc_space; /* every sampled allocation so far */
    int64_t inuse_objects, inuse_space; /* those still live */
    int64_t peak_objects, peak_space;   /* those live when the heap was at its peak */
} lull_profile_record;

/* Writes the profile to fd: sample types alloc_objects/count,
 * alloc_space/bytes, inuse_objects/count, inuse_space/bytes,
 * peak_objects/count, peak_space/bytes, default inuse_space; period_type
 * space/bytes with `period_bytes` (the sampling interval); time_nanos; one
 * Sample per record, one Location per distinct pc, one Mapping per
 * executable file mapping of this process (/proc/self/maps), so that
 * `go tool pprof` symbolizes from the files. 0, or -1 with errno. */
int lull_pprof_write(int fd, const lull_profile_record *records, size_t n, int64_t period_bytes,
                     int64_t time_nanos);

#endif
