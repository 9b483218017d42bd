/* The heap profile's stacks (profile_stack.h).
 *
 * libgcc's _Unwind_Backtrace finds the FDE of every frame and interprets
 * its call frame instructions at every walk: about 19,000 instructions for
 * the ten frames of a benchmark's stack (bench/callgrind.sh), 19 a
 * malloc+free pair at profile_sample_kb=512. Almost every x86-64 frame,
 * though, gets to its caller by one rule: its CFA is rsp + k or rbp + k,
 * its return address is at CFA + j, and the caller's rbp is either the
 * same or saved at CFA + m. That rule is read here from the FDE
 * (_Unwind_Find_FDE finds it) the first time a return address is seen,
 * and cached by return address; a walk of a stack seen before then costs
 * a lookup and two loads a frame. Whatever the rule cannot say makes the
 * walk start over with _Unwind_Backtrace: a signal frame (its FDE's 'S'),
 * a CFA or register given by a DWARF expression, a register saved in
 * another, a return address without an FDE (libgcc looks there for a
 * signal trampoline), a stack that is not the thread's own (sigaltstack,
 * a coroutine's), or a read outside the thread's stack (no read ever
 * faults). So the frames are always _Unwind_Backtrace's;
 * tests/test_profile_stack.c compares the two on many stacks. As in
 * libgcc, a frame whose return address is undefined (_start, a thread's
 * clone) is the last; a return address of 0 ends the walk before it.
 *
 * Invariant: every cached rule was read from the FDE of an object that
 * was loaded when it was read, for a return address on the reading
 * thread's stack (so the object stayed loaded while that thread was in
 * it); the cache is emptied when an object has been unloaded since its
 * last check (dl_iterate_phdr's dlpi_subs), before a walk reads any rule.
 * One lock guards the cache; it is never held while a rule is read from
 * the FDEs (libgcc may allocate there). */
#define _GNU_SOURCE
#include "src/profile_stack.h"
#include "base/fork_exec.h"

#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <unwind.h>

/* libgcc's (unwind-dw2-fde.h, not installed): the FDE whose range holds
 * pc, and the bases of its object; func is the function's first byte */
struct dwarf_eh_bases {
    void *tbase, *dbase, *func;
};
extern const void *_Unwind_Find_FDE(void *pc, struct dwarf_eh_bases *bases);

/* ---- a frame's rule --------------------------------------------------- */

enum {
    RULE_NONE,     /* an empty cache slot */
    RULE_FROM_RSP, /* CFA = rsp + cfa_offset */
    RULE_FROM_RBP, /* CFA = rbp + cfa_offset */
    RULE_LAST,     /* the return address is undefined: the outermost frame */
    RULE_SLOW,     /* not a rule of this kind: _Unwind_Backtrace walks */
};

typedef struct {
    uintptr_t ra; /* the key; 0 in an empty slot */
    int32_t cfa_offset;
    int16_t rbp_offset; /* the caller's rbp is at CFA + rbp_offset; 0: rbp is the same */
    int8_t ra_offset;   /* the return address is at CFA + ra_offset */
    uint8_t how;
} frame_rule;

/* DWARF register numbers of x86-64 (the psABI's table) */
#define REG_RBP 6
#define REG_RSP 7
#define REG_RA 16

/* a register's rule, for the three a rule follows */
enum { SAVED_NOT, SAVED_AT_OFFSET, SAVED_UNDEFINED, SAVED_OTHERWISE };
typedef struct {
    uint8_t how;
    int64_t offset;
} reg_rule;

typedef struct {
    uint64_t cfa_reg;
    int64_t cfa_offset;
    reg_rule rbp, rsp, ra;
} cfa_row;

typedef struct {
    const uint8_t *p, *end;
    bool bad;
} cursor;

static uint8_t read_u8(cursor *c) {
    if (c->p >= c->end) {
        c->bad = true;
        return 0;
    }
    return *c->p++;
}

static uint64_t read_fixed(cursor *c, unsigned bytes) {
    if ((size_t)(c->end - c->p) < bytes) {
        c->bad = true;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, c->p, bytes); /* little-endian */
    c->p += bytes;
    return v;
}

static uint64_t read_uleb(cursor *c) {
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        uint8_t b = read_u8(c);
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    c->bad = true;
    return 0;
}

static int64_t read_sleb(cursor *c) {
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        uint8_t b = read_u8(c);
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            if (shift + 7 < 64 && (b & 0x40)) v |= ~(uint64_t)0 << (shift + 7);
            return (int64_t)v;
        }
    }
    c->bad = true;
    return 0;
}

/* Past a pointer of DW_EH_PE encoding enc (its value is not needed: the
 * FDE's function start comes from _Unwind_Find_FDE). */
static void skip_encoded(cursor *c, uint8_t enc) {
    if (enc == 0xff) return;    /* DW_EH_PE_omit */
    if ((enc & 0x70) == 0x50) { /* DW_EH_PE_aligned */
        c->bad = true;
        return;
    }
    switch (enc & 0x0f) {
    case 0x00: /* absptr */
    case 0x04: /* udata8 */
    case 0x0c: /* sdata8 */
        read_fixed(c, 8);
        return;
    case 0x02: /* udata2 */
    case 0x0a: /* sdata2 */
        read_fixed(c, 2);
        return;
    case 0x03: /* udata4 */
    case 0x0b: /* sdata4 */
        read_fixed(c, 4);
        return;
    case 0x01: /* uleb128 */
        read_uleb(c);
        return;
    case 0x09: /* sleb128 */
        read_sleb(c);
        return;
    default:
        c->bad = true;
    }
}

static reg_rule *tracked(cfa_row *r, uint64_t reg) {
    return reg == REG_RBP ? &r->rbp : reg == REG_RSP ? &r->rsp : reg == REG_RA ? &r->ra : NULL;
}

static void set_rule(cfa_row *r, uint64_t reg, uint8_t how, int64_t offset) {
    reg_rule *t = tracked(r, reg);
    if (t) *t = (reg_rule){.how = how, .offset = offset};
}

#define MAX_REMEMBERED 8

/* Runs call frame instructions from *loc while the row's address is below
 * ra (libgcc's rule: the row of the call instruction, ra - 1). False for
 * an instruction this rule cannot follow. */
static bool run_cfa_program(cursor *c, cfa_row *row, uintptr_t *loc, uintptr_t ra,
                            uint64_t code_align, int64_t data_align) {
    cfa_row remembered[MAX_REMEMBERED];
    unsigned depth = 0;
    while (c->p < c->end && *loc < ra && !c->bad) {
        uint8_t op = read_u8(c);
        uint64_t reg;
        switch (op & 0xc0) {
        case 0x40: /* DW_CFA_advance_loc */
            *loc += (op & 0x3f) * code_align;
            continue;
        case 0x80: /* DW_CFA_offset */
            set_rule(row, op & 0x3f, SAVED_AT_OFFSET, (int64_t)read_uleb(c) * data_align);
            continue;
        case 0xc0: /* DW_CFA_restore: libgcc makes it "not saved", not the CIE's rule */
            if ((op & 0x3f) == REG_RA) return false;
            set_rule(row, op & 0x3f, SAVED_NOT, 0);
            continue;
        }
        switch (op) {
        case 0x00: /* DW_CFA_nop */
            break;
        case 0x02: /* DW_CFA_advance_loc1 */
            *loc += read_fixed(c, 1) * code_align;
            break;
        case 0x03: /* DW_CFA_advance_loc2 */
            *loc += read_fixed(c, 2) * code_align;
            break;
        case 0x04: /* DW_CFA_advance_loc4 */
            *loc += read_fixed(c, 4) * code_align;
            break;
        case 0x05: /* DW_CFA_offset_extended */
            reg = read_uleb(c);
            set_rule(row, reg, SAVED_AT_OFFSET, (int64_t)read_uleb(c) * data_align);
            break;
        case 0x06: /* DW_CFA_restore_extended */
            reg = read_uleb(c);
            if (reg == REG_RA) return false;
            set_rule(row, reg, SAVED_NOT, 0);
            break;
        case 0x07: /* DW_CFA_undefined */
            set_rule(row, read_uleb(c), SAVED_UNDEFINED, 0);
            break;
        case 0x08: /* DW_CFA_same_value */
            set_rule(row, read_uleb(c), SAVED_NOT, 0);
            break;
        case 0x09: /* DW_CFA_register */
            reg = read_uleb(c);
            read_uleb(c);
            set_rule(row, reg, SAVED_OTHERWISE, 0);
            break;
        case 0x0a: /* DW_CFA_remember_state: the whole row, the CFA's rule too */
            if (depth == MAX_REMEMBERED) return false;
            remembered[depth++] = *row;
            break;
        case 0x0b: /* DW_CFA_restore_state */
            if (depth == 0) return false;
            *row = remembered[--depth];
            break;
        case 0x0c: /* DW_CFA_def_cfa */
            row->cfa_reg = read_uleb(c);
            row->cfa_offset = (int64_t)read_uleb(c);
            break;
        case 0x0d: /* DW_CFA_def_cfa_register */
            row->cfa_reg = read_uleb(c);
            break;
        case 0x0e: /* DW_CFA_def_cfa_offset */
            row->cfa_offset = (int64_t)read_uleb(c);
            break;
        case 0x0f:        /* DW_CFA_def_cfa_expression */
            return false; /* a CFA computed by an expression (a realigned stack) */
        case 0x10:        /* DW_CFA_expression */
        case 0x16:        /* DW_CFA_val_expression */
            reg = read_uleb(c);
            {
                uint64_t len = read_uleb(c);
                if (len > (uint64_t)(c->end - c->p)) return false;
                c->p += len;
            }
            set_rule(row, reg, SAVED_OTHERWISE, 0);
            break;
        case 0x11: /* DW_CFA_offset_extended_sf */
            reg = read_uleb(c);
            set_rule(row, reg, SAVED_AT_OFFSET, read_sleb(c) * data_align);
            break;
        case 0x12: /* DW_CFA_def_cfa_sf */
            row->cfa_reg = read_uleb(c);
            row->cfa_offset = read_sleb(c) * data_align;
            break;
        case 0x13: /* DW_CFA_def_cfa_offset_sf */
            row->cfa_offset = read_sleb(c) * data_align;
            break;
        case 0x14: /* DW_CFA_val_offset */
            reg = read_uleb(c);
            read_uleb(c);
            set_rule(row, reg, SAVED_OTHERWISE, 0);
            break;
        case 0x15: /* DW_CFA_val_offset_sf */
            reg = read_uleb(c);
            read_sleb(c);
            set_rule(row, reg, SAVED_OTHERWISE, 0);
            break;
        case 0x2e: /* DW_CFA_GNU_args_size */
            read_uleb(c);
            break;
        case 0x2f: /* DW_CFA_GNU_negative_offset_extended */
            reg = read_uleb(c);
            set_rule(row, reg, SAVED_AT_OFFSET, -(int64_t)read_uleb(c) * data_align);
            break;
        default: /* DW_CFA_set_loc (an encoded address), vendor extensions */
            return false;
        }
    }
    return !c->bad;
}

static uint32_t read_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The rule of the frame whose return address is ra, from its FDE. */
static frame_rule rule_from_cfi(uintptr_t ra) {
    frame_rule slow = {.ra = ra, .how = RULE_SLOW};
    struct dwarf_eh_bases bases;
    const uint8_t *fde = _Unwind_Find_FDE((void *)(ra - 1), &bases);
    if (!fde) return slow; /* libgcc would look for a signal trampoline there */
    uint32_t fde_len = read_u32(fde);
    if (fde_len == 0 || fde_len == 0xffffffff) return slow; /* 64-bit DWARF: none on x86-64 */
    const uint8_t *cie = fde + 4 - read_u32(fde + 4);
    uint32_t cie_len = read_u32(cie);
    if (cie_len == 0 || cie_len == 0xffffffff) return slow;

    cursor c = {.p = cie + 8, .end = cie + 4 + cie_len}; /* past the length and the id */
    uint8_t version = read_u8(&c);
    if (version != 1 && version != 3) return slow;
    const char *aug = (const char *)c.p;
    while (c.p < c.end && *c.p)
        c.p++;
    read_u8(&c);
    uint64_t code_align = read_uleb(&c);
    int64_t data_align = read_sleb(&c);
    uint64_t ra_column = version == 1 ? read_u8(&c) : read_uleb(&c);
    if (ra_column != REG_RA) return slow;
    uint8_t fde_encoding = 0; /* DW_EH_PE_absptr */
    bool has_z = aug[0] == 'z';
    if (has_z) {
        uint64_t len = read_uleb(&c);
        if (c.bad || len > (uint64_t)(c.end - c.p)) return slow;
        const uint8_t *after = c.p + len;
        for (const char *a = aug + 1; *a && !c.bad; a++) {
            if (*a == 'R')
                fde_encoding = read_u8(&c);
            else if (*a == 'L')
                read_u8(&c);
            else if (*a == 'P')
                skip_encoded(&c, read_u8(&c));
            else /* 'S', a signal frame; anything else is unknown */
                return slow;
        }
        c.p = after;
    } else if (aug[0]) {
        return slow;
    }
    if (c.bad) return slow;

    cfa_row row = {.cfa_reg = REG_RSP};
    uintptr_t loc = (uintptr_t)bases.func;
    if (!run_cfa_program(&c, &row, &loc, ra, code_align, data_align)) return slow;
    cursor f = {.p = fde + 8, .end = fde + 4 + fde_len};
    skip_encoded(&f, fde_encoding);        /* the function's start */
    skip_encoded(&f, fde_encoding & 0x0f); /* its length */
    if (has_z) {
        uint64_t len = read_uleb(&f);
        if (f.bad || len > (uint64_t)(f.end - f.p)) return slow;
        f.p += len;
    }
    if (f.bad || !run_cfa_program(&f, &row, &loc, ra, code_align, data_align)) return slow;

    if (row.ra.how == SAVED_UNDEFINED) return (frame_rule){.ra = ra, .how = RULE_LAST};
    if ((row.cfa_reg != REG_RSP && row.cfa_reg != REG_RBP) || row.cfa_offset < INT32_MIN ||
        row.cfa_offset > INT32_MAX || row.rsp.how != SAVED_NOT || row.ra.how != SAVED_AT_OFFSET ||
        row.ra.offset < INT8_MIN || row.ra.offset > INT8_MAX)
        return slow;
    frame_rule r = {.ra = ra,
                    .how = row.cfa_reg == REG_RSP ? RULE_FROM_RSP : RULE_FROM_RBP,
                    .cfa_offset = (int32_t)row.cfa_offset,
                    .ra_offset = (int8_t)row.ra.offset};
    if (row.rbp.how == SAVED_AT_OFFSET) {
        if (row.rbp.offset == 0 || row.rbp.offset < INT16_MIN || row.rbp.offset > INT16_MAX)
            return slow;
        r.rbp_offset = (int16_t)row.rbp.offset;
    } else if (row.rbp.how != SAVED_NOT) {
        return slow;
    }
    return r;
}

/* ---- the cache -------------------------------------------------------- */

#define CACHE_SLOTS 4096 /* return addresses; a power of two, 64 KiB */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static frame_rule *cache; /* mapped at the first walk */
static uint32_t cache_used;
static unsigned long long cache_subs; /* dlpi_subs when the cache was last checked */

/* Walks in progress, and a fork waiting for them to end. A walk calls
 * into glibc and libgcc (dl_iterate_phdr, _Unwind_Backtrace), whose locks
 * glibc's fork does not take: a child copied from a walk inside
 * dl_iterate_phdr waited for ever on its lock at its first sample
 * (tests/test_profile_fork.c). So fork's prepare handler waits until no
 * walk runs, and new walks wait for the fork: no lock is held across a
 * walk (libgcc's unwinder takes its own, and allocates under it). */
static _Atomic unsigned walks;
static _Atomic bool fork_waiting;

static void walk_begin(void) {
    for (;;) {
        atomic_fetch_add(&walks, 1);
        if (!atomic_load(&fork_waiting)) return;
        atomic_fetch_sub(&walks, 1);
        while (atomic_load(&fork_waiting))
            sched_yield();
    }
}

static void walk_end(void) {
    atomic_fetch_sub(&walks, 1);
}

void lull_stack_fork_prepare(void) {
    atomic_store(&fork_waiting, true);
    while (atomic_load(&walks))
        sched_yield();
    pthread_mutex_lock(&cache_lock);
}

void lull_stack_fork_parent(void) {
    pthread_mutex_unlock(&cache_lock);
    atomic_store(&fork_waiting, false);
}

LULL_FORK_EXEC_TEXT void lull_stack_fork_child(void) {
    lull_mutex_reset_in_child(&cache_lock);
    atomic_store(&walks, 0);
    atomic_store(&fork_waiting, false);
}

static int read_subs(struct dl_phdr_info *info, size_t size, void *arg) {
    unsigned long long *subs = arg;
    *subs = size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs
                ? info->dlpi_subs
                : ~0ULL;
    return 1; /* the first object is enough */
}

static uint32_t slot_of(uintptr_t ra) {
    return (uint32_t)(((uint64_t)ra * 0x9e3779b97f4a7c15ULL) >> 52) & (CACHE_SLOTS - 1);
}

/* Under the lock: the cached rule for ra, or NULL. */
static const frame_rule *cache_find(uintptr_t ra) {
    if (!cache) return NULL;
    for (uint32_t i = slot_of(ra);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        if (cache[i].ra == ra) return &cache[i];
        if (!cache[i].ra) return NULL;
    }
}

/* Under the lock: keeps r unless the cache is full (at most 3/4, so that a
 * miss ends soon); a rule not kept is read again at its next walk. */
static void cache_put(const frame_rule *r) {
    if (!cache || cache_used >= CACHE_SLOTS / 4 * 3) return;
    uint32_t i = slot_of(r->ra);
    while (cache[i].ra && cache[i].ra != r->ra)
        i = (i + 1) & (CACHE_SLOTS - 1);
    if (!cache[i].ra) cache_used++;
    cache[i] = *r;
}

/* Under the lock, at the start of a walk: the cache, mapped and with no
 * rule of an object unloaded since. False if it cannot be used. */
static bool cache_ready(unsigned long long subs) {
    if (subs == ~0ULL) return false;
    if (!cache) {
        void *m = mmap(NULL, CACHE_SLOTS * sizeof *cache, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return false;
        cache = m;
        cache_subs = subs;
    }
    if (subs != cache_subs) {
        memset(cache, 0, CACHE_SLOTS * sizeof *cache);
        cache_used = 0;
        cache_subs = subs;
    }
    return true;
}

/* ---- the thread's stack ------------------------------------------------ */

/* [low, high) of the calling thread's stack; high is 1 if it is not known */
static __thread uintptr_t tl_stack_low, tl_stack_high __attribute__((tls_model("initial-exec")));

static bool thread_stack(uintptr_t *low, uintptr_t *high) {
    if (!tl_stack_high) {
        /* once a thread; it may allocate (reading /proc/self/maps for the
         * main thread), which the profile's caller allows */
        pthread_attr_t attr;
        void *addr;
        size_t size;
        tl_stack_high = 1;
        if (pthread_getattr_np(pthread_self(), &attr) == 0) {
            if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
                tl_stack_low = (uintptr_t)addr;
                tl_stack_high = (uintptr_t)addr + size;
            }
            pthread_attr_destroy(&attr);
        }
    }
    *low = tl_stack_low;
    *high = tl_stack_high;
    return *high != 1;
}

/* ---- walks ------------------------------------------------------------- */

/* Keeps the frame if the filter lets it; false when the stack is full. */
static bool keep_frame(lull_stack *s, uintptr_t below, uintptr_t ra, uintptr_t sp) {
    if (sp < below || (ra >= s->skip_from && ra < s->skip_to)) return true;
    s->ra[s->depth] = ra;
    s->sp[s->depth] = sp;
    return ++s->depth < LULL_PROFILE_MAX_DEPTH;
}

/* From the frame (ra, sp, rbp) up, with the cached rules. False if a
 * frame needs _Unwind_Backtrace. */
static bool walk_cached(lull_stack *s, uintptr_t ra, uintptr_t sp, uintptr_t rbp) {
    uintptr_t low, high;
    if (!thread_stack(&low, &high) || sp < low || sp >= high) return false;
    unsigned long long subs;
    if (dl_iterate_phdr(read_subs, &subs) != 1) subs = ~0ULL;
    uintptr_t below = s->below > sp ? s->below : sp;
    pthread_mutex_lock(&cache_lock);
    bool cached = cache_ready(subs), done = true;
    while (ra && keep_frame(s, below, ra, sp)) {
        frame_rule r;
        const frame_rule *found = cached ? cache_find(ra) : NULL;
        if (found) {
            r = *found;
        } else {
            pthread_mutex_unlock(&cache_lock);
            r = rule_from_cfi(ra);
            pthread_mutex_lock(&cache_lock);
            if (cached) cache_put(&r);
        }
        if (r.how == RULE_LAST) break;
        uintptr_t cfa = (r.how == RULE_FROM_RSP ? sp : rbp) + (uintptr_t)(intptr_t)r.cfa_offset;
        uintptr_t ra_at = cfa + (uintptr_t)(intptr_t)r.ra_offset;
        uintptr_t rbp_at = cfa + (uintptr_t)(intptr_t)r.rbp_offset;
        /* a caller's frame is above its callee's, all of it in the stack:
         * sp < cfa <= high, and the words read in [sp, high) (an unsigned
         * difference checks both ends) */
        uintptr_t room = high - sp;
        if (r.how == RULE_SLOW || room < 8 || cfa - sp - 1 >= room || ra_at - sp > room - 8 ||
            (r.rbp_offset && rbp_at - sp > room - 8)) {
            done = false;
            break;
        }
        ra = *(const uintptr_t *)ra_at;
        if (r.rbp_offset) rbp = *(const uintptr_t *)rbp_at;
        sp = cfa;
    }
    pthread_mutex_unlock(&cache_lock);
    return done;
}

typedef struct {
    lull_stack *s;
    uintptr_t below;
} slow_walk;

static _Unwind_Reason_Code slow_frame(struct _Unwind_Context *ctx, void *arg) {
    slow_walk *w = arg;
    uintptr_t ra = _Unwind_GetIP(ctx);
    if (!ra) return _URC_END_OF_STACK;
    /* the CFA that the unwinder gives a frame is its stack pointer at its
     * call */
    return keep_frame(w->s, w->below, ra, _Unwind_GetCFA(ctx)) ? _URC_NO_REASON : _URC_END_OF_STACK;
}

/* The frames from the one whose stack pointer is sp up (the frames of the
 * walk itself are below it). */
static void walk_slow(lull_stack *s, uintptr_t sp) {
    slow_walk w = {.s = s, .below = s->below > sp ? s->below : sp};
    s->depth = 0;
    _Unwind_Backtrace(slow_frame, &w);
}

/* noinline, and its frame pointer kept (__builtin_frame_address makes gcc
 * and clang keep one): the walk starts from the caller's frame, whose
 * stack pointer is this function's CFA and whose rbp this one saved */
__attribute__((noinline)) bool lull_stack_take(lull_stack *s) {
    const uintptr_t *frame = __builtin_frame_address(0);
    uintptr_t sp = (uintptr_t)__builtin_dwarf_cfa();
    s->depth = 0;
    walk_begin();
    bool cached = walk_cached(s, (uintptr_t)__builtin_return_address(0), sp, frame[0]);
    if (!cached) walk_slow(s, sp);
    walk_end();
    return cached;
}

__attribute__((noinline)) bool lull_stack_take_slow(lull_stack *s) {
    uintptr_t sp = (uintptr_t)__builtin_dwarf_cfa();
    walk_begin();
    walk_slow(s, sp);
    walk_end();
    return false;
}
