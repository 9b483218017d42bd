/* The slice-state invariant over every arena: see slice_check.h. */
#define _GNU_SOURCE
#include "slice_check.h"
#include "numa/arena.h"
#include "numa/slice_state.h"
#include "numa/span_table.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

enum { DIRTY, PURGING, CLEAN, WARM, MAPS };
static const char *const map_name[MAPS] = {"dirty", "purging", "clean", "warm"};

typedef struct {
    uint64_t map[MAPS];
    uint64_t lazy;
} word_state;

static word_state load_word(const lull_segment *s, unsigned w) {
    /* the maps are _Atomic; const-casting only to load them */
    lull_slice_maps *m = lull_slice_maps_of(s);
    word_state ws;
    ws.map[DIRTY] = atomic_load_explicit(&m->dirty[w], memory_order_acquire);
    ws.map[PURGING] = atomic_load_explicit(&m->purging[w], memory_order_acquire);
    ws.map[CLEAN] = atomic_load_explicit(&m->clean[w], memory_order_acquire);
    ws.map[WARM] = atomic_load_explicit(&m->warm[w], memory_order_acquire);
    ws.lazy = atomic_load_explicit(&m->lazy[w], memory_order_acquire);
    return ws;
}

static bool report(char *msg, size_t len, const lull_segment *s, unsigned slice, const char *what,
                   const char *a, const char *b) {
    if (msg && len)
        snprintf(msg, len, "segment %p (node %d, #%u), slice %u: %s%s%s%s", (const void *)s,
                 s->node, s->index, slice, what, a ? a : "", b ? " and " : "", b ? b : "");
    return false;
}

static unsigned first_bit(uint64_t bits) {
    return (unsigned)__builtin_ctzll(bits);
}

/* The maps of word w, pairwise disjoint and lazy within clean. */
static bool check_maps(const lull_segment *s, unsigned w, const word_state *ws, char *msg,
                       size_t len) {
    for (int i = 0; i < MAPS; i++)
        for (int j = i + 1; j < MAPS; j++)
            if (ws->map[i] & ws->map[j])
                return report(msg, len, s, w * 64 + first_bit(ws->map[i] & ws->map[j]), "in ",
                              map_name[i], map_name[j]);
    if (ws->lazy & ~ws->map[CLEAN])
        return report(msg, len, s, w * 64 + first_bit(ws->lazy & ~ws->map[CLEAN]),
                      "lazy but not clean", NULL, NULL);
    return true;
}

/* Free slices of word w are covered by no span; with strict, the others
 * (IN_USE) are covered by one. */
static bool check_spans(const lull_segment *s, unsigned w, const word_state *ws, bool strict,
                        slice_check_counts *c, char *msg, size_t len) {
    uint64_t free_bits = ws->map[DIRTY] | ws->map[PURGING] | ws->map[CLEAN] | ws->map[WARM];
    for (unsigned b = 0; b < 64; b++) {
        unsigned slice = w * 64 + b;
        bool meta = slice < LULL_META_SLICES;
        bool in_map = (free_bits >> b) & 1;
        bool covered = lull_span_table_of(s)->span_head[slice] != 0;
        if (in_map && meta)
            return report(msg, len, s, slice, "metadata slice in a map", NULL, NULL);
        if (in_map && covered) {
            char what[96];
            snprintf(what, sizeof what, "free but covered by the span of slice %zu",
                     (size_t)lull_span_table_of(s)->span_head[slice] / sizeof(lull_span));
            return report(msg, len, s, slice, what, NULL, NULL);
        }
        if (meta || in_map) continue;
        if (covered) {
            c->in_use++;
        } else {
            c->leaked++;
            if (strict)
                return report(msg, len, s, slice, "in no map and covered by no span (leaked)", NULL,
                              NULL);
        }
    }
    return true;
}

static void count_word(const word_state *ws, slice_check_counts *c) {
    c->dirty += (size_t)__builtin_popcountll(ws->map[DIRTY]);
    c->purging += (size_t)__builtin_popcountll(ws->map[PURGING]);
    c->clean += (size_t)__builtin_popcountll(ws->map[CLEAN]);
    c->warm += (size_t)__builtin_popcountll(ws->map[WARM]);
    c->lazy += (size_t)__builtin_popcountll(ws->lazy);
}

bool slice_check(bool strict, slice_check_counts *counts, char *msg, size_t len) {
    slice_check_counts local = {0};
    slice_check_counts *c = counts ? counts : &local;
    *c = (slice_check_counts){0};
    if (msg && len) msg[0] = '\0';
    for (int a = 0; a < LULL_MAX_NODES; a++)
        for (lull_segment *s = atomic_load(&lull_arenas[a].segments); s; s = s->next) {
            c->segments++;
            for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
                word_state ws = load_word(s, w);
                count_word(&ws, c);
                if (!check_maps(s, w, &ws, msg, len)) return false;
                if (!check_spans(s, w, &ws, strict, c, msg, len)) return false;
            }
        }
    return true;
}
