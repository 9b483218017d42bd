/* The slice state machine (docs/architecture.md, "Reclaim claim, purge,
 * finish"): every slice of a segment is IN_USE, FREE_DIRTY, PURGING,
 * FREE_CLEAN (LAZY: purged with MADV_FREE, not known to be zero) or WARM,
 * recorded in the segment's atomic maps, and this module is the only code
 * that changes them. Each transition is an atomic claim of bits, so of a
 * request thread taking a slice and the reclaim thread claiming it exactly
 * one wins: a PURGING slice is never handed out, a live block never
 * purged. The arena (numa/arena.c) decides which slices to take and when;
 * the statistics (src/stats.c) and the refault monitor (reclaim/refault.c)
 * read the states through lull_slices_word(). */
#ifndef LULL_SLICE_STATE_H
#define LULL_SLICE_STATE_H

#include "base/types.h"

/* The segment's part of this module (base/types.h, LULL_META_SLICE_MAPS):
 * a slice is IN_USE exactly when its bit is set in none of these maps. A
 * request thread claims a free slice by atomically clearing its bit in
 * dirty/clean/warm; the reclaim thread claims a dirty slice by atomically
 * clearing its dirty bit and setting its purging bit, so exactly one of
 * them wins and nothing hands out a PURGING slice. */
typedef struct lull_slice_maps {
    _Atomic uint64_t dirty[LULL_SLICE_WORDS];   /* FREE_DIRTY: free, maybe resident */
    _Atomic uint64_t purging[LULL_SLICE_WORDS]; /* PURGING: claimed by the reclaim thread */
    _Atomic uint64_t clean[LULL_SLICE_WORDS];   /* FREE_CLEAN: purged or never touched */
    _Atomic uint64_t lazy[LULL_SLICE_WORDS];    /* subset of clean: MADV_FREE, not zeroed */
    _Atomic uint64_t warm[LULL_SLICE_WORDS];    /* WARM: clean, prefaulted by the reserve */
} lull_slice_maps;
LULL_META_PART_CHECK(lull_slice_maps, SLICE_MAPS);

/* The maps of s. Only this module writes them; others read a word of them
 * with lull_slices_word() (tests read the maps themselves). */
static inline lull_slice_maps *lull_slice_maps_of(const lull_segment *s) {
    return lull_segment_part(s, LULL_META_SLICE_MAPS_AT);
}

/* A run of slices of one segment, moved through the states together. */
typedef struct lull_slice_run {
    lull_segment *segment;
    uint16_t first, count;
    /* claimed from a state the resident estimate counts (dirty, warm), not
     * from clean: its finish knows what the estimate gains or loses */
    bool resident;
} lull_slice_run;

/* A state a claim takes slices out of, or a finish puts them into. */
typedef enum {
    LULL_SLICES_DIRTY,
    LULL_SLICES_CLEAN,
    LULL_SLICES_CLEAN_LAZY, /* into CLEAN and LAZY (a finish only) */
    LULL_SLICES_WARM,
} lull_slice_state;

/* One word (64 slices) of every map, each read atomically. */
typedef struct lull_slice_word {
    uint64_t dirty, purging, clean, lazy, warm;
} lull_slice_word;

void lull_slices_word(const lull_segment *s, unsigned w, lull_slice_word *out);
/* The slices of a word read so that are free in any state (not IN_USE). */
static inline uint64_t lull_slice_word_free(const lull_slice_word *x) {
    return x->dirty | x->purging | x->clean | x->warm;
}
/* Slices of word w that are free in any state (not IN_USE). */
uint64_t lull_slices_free_word(const lull_segment *s, unsigned w);

/* Request side (arena mutex held) ------------------------------------- */

/* A new segment: every slice but the metadata's FREE_CLEAN (its creator
 * counted the header in the resident estimate already, base/resident.h). */
void lull_slices_init_segment(lull_segment *s);
typedef enum {
    LULL_TAKE_OK,
    LULL_TAKE_RACED,      /* a slice was not free (the reclaim thread claimed it) */
    LULL_TAKE_OVER_LIMIT, /* its clean slices would take the estimate past the limit */
} lull_take_result;
/* Take [first, first + n) to IN_USE from dirty, warm or clean, all or
 * nothing (bits taken before a failure go back where they came from); the
 * clean ones grow the resident estimate, within the heap limit. On
 * success: *zeroed (no slice was dirty or lazy), and lazy[] the lazy bits
 * of the taken slices, per word. */
lull_take_result lull_slices_take(lull_segment *s, unsigned first, unsigned n, bool *zeroed,
                                  uint64_t lazy[LULL_SLICE_WORDS]);
/* Clean slices taken so far (a count, any thread): memory that was not
 * resident, the demand the warm reserve meets when thp is on. */
uint64_t lull_slices_fresh_taken(void);
/* IN_USE -> FREE_DIRTY (any thread: a span given back). */
void lull_slices_give_back(lull_segment *s, unsigned first, unsigned n);

/* Reclaim side ---------------------------------------------------------- */

/* Claim the `want` bits of word w from state `from` into PURGING (the bits
 * a request thread took meanwhile are not ours), as runs cut at 2 MiB
 * extents, at most `max` of them; what does not fit goes back. Returns the
 * runs and, in *emitted, their bits. */
size_t lull_slices_claim(lull_segment *s, unsigned w, lull_slice_state from, uint64_t want,
                         lull_slice_run *out, size_t max, uint64_t *emitted);
/* PURGING -> `to`; the resident estimate follows (dirty and warm count,
 * clean does not). */
void lull_slices_finish(const lull_slice_run *r, lull_slice_state to);
/* Clear the lazy bits `bits` of word w (a lazy slice claimed to be purged
 * again is lazy no more). */
void lull_slices_clear_lazy(lull_segment *s, unsigned w, uint64_t bits);
/* In a fork child: PURGING -> FREE_DIRTY (a claim outside the reclaim
 * thread's steps; theirs are never half done at fork). */
void lull_slices_after_fork(lull_segment *s);

#endif
