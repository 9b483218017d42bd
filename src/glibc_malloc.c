/* glibc's own malloc calls (<malloc.h>) answered from lull's heap:
 * malloc_trim, mallinfo2, mallinfo, malloc_stats and malloc_info. Without
 * them a program that replaced glibc's malloc with lull still got glibc's
 * answers: the figures of glibc's empty main arena, and a trim of nothing.
 *
 * Every figure comes from the accounting identity (src/stats.h): each byte
 * lull has mapped is in exactly one term, so arena = uordblks + fordblks
 * holds in every answer, and hblkhd is apart from both, as in glibc. The
 * figures count what may be resident (lull_counters_resident_bound: every
 * term but purged), so arena shrinks when lull gives memory back, as
 * glibc's does when it trims its heap's top. docs/architecture.md,
 * "glibc's malloc calls", has the table. */
#include "lull.h"
#include "src/stats.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>

LULL_EXPORT int lull_malloc_trim(size_t pad) {
    /* lull has no heap top to keep pad bytes at (its memory is 32 MiB
     * segments and huge mappings); the free memory it keeps ready is the
     * warm reserve (warm_reserve_mb), which a purge drains too */
    (void)pad;
    uint64_t before = lull_stats_given_back();
    lull_purge_all();
    return lull_stats_given_back() != before;
}

static size_t as_size(uint64_t v) {
    return v > SIZE_MAX ? SIZE_MAX : (size_t)v;
}

static struct lull_mallinfo2 mallinfo_of(const struct lull_counters *c,
                                         const lull_stats_huge *huge) {
    const struct lull_counters_accounting *a = &c->total;
    uint64_t hblkhd = huge->live + huge->metadata;
    uint64_t keep = a->dirty + a->purging + a->warm;
    uint64_t free_bytes = a->span_free + keep;
    /* live, rounding and metadata, less the huge blocks' own: the
     * identity's terms are these reads, so nothing goes below 0 */
    uint64_t used = a->live - huge->live + a->rounding + a->metadata - huge->metadata;
    return (struct lull_mallinfo2){
        .arena = as_size(used + free_bytes),
        .hblks = as_size(huge->blocks),
        .hblkhd = as_size(hblkhd),
        .uordblks = as_size(used),
        .fordblks = as_size(free_bytes),
        .keepcost = as_size(keep),
    };
}

LULL_EXPORT struct lull_mallinfo2 lull_mallinfo2(void) {
    struct lull_counters c;
    lull_stats_huge huge;
    lull_stats_memory(&c, &huge);
    return mallinfo_of(&c, &huge);
}

/* One element of identity terms: mapped="..." live="..." ... */
static void write_terms(FILE *fp, const char *element, const struct lull_counters_accounting *a) {
    fprintf(fp, "<%s mapped=\"%llu\"", element, (unsigned long long)a->mapped);
#define TERM(field, text) fprintf(fp, " " #field "=\"%llu\"", (unsigned long long)a->field);
    LULL_COUNTERS_TERMS(TERM)
#undef TERM
    fprintf(fp, "/>\n");
}

LULL_EXPORT int lull_malloc_info(int options, FILE *fp) {
    /* glibc 2.36 returns EINVAL here and leaves errno (its manual page
     * says -1 and errno): its value, and errno too */
    if (options != 0 || !fp) {
        errno = EINVAL;
        return EINVAL;
    }
    struct lull_counters c;
    lull_stats_huge huge;
    lull_stats_memory(&c, &huge);
    struct lull_mallinfo2 m = mallinfo_of(&c, &huge);
    fprintf(fp, "<malloc version=\"1\" allocator=\"lull\" lull_version=\"%s\">\n",
            LULL_VERSION_STRING);
    /* a heap per NUMA node, as glibc's per arena */
    for (uint64_t n = 0; n < c.node_count && n < LULL_COUNTERS_MAX_NODES; n++) {
        const struct lull_counters_node *node = &c.nodes[n];
        if (node->node_id == LULL_COUNTERS_NODE_OTHER)
            fprintf(fp, "<heap nr=\"%llu\" node=\"other\">\n", (unsigned long long)n);
        else
            fprintf(fp, "<heap nr=\"%llu\" node=\"%llu\">\n", (unsigned long long)n,
                    (unsigned long long)node->node_id);
        fprintf(fp, "<system type=\"current\" size=\"%llu\"/>\n",
                (unsigned long long)lull_counters_resident_bound(&node->acct));
        fprintf(fp, "<aspace type=\"total\" size=\"%llu\"/>\n",
                (unsigned long long)node->acct.mapped);
        write_terms(fp, "accounting", &node->acct);
        fprintf(fp, "</heap>\n");
    }
    /* glibc's totals, by its names, then mallinfo2's fields and the identity */
    fprintf(fp, "<total type=\"rest\" size=\"%zu\"/>\n", m.fordblks);
    fprintf(fp, "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n", m.hblks, m.hblkhd);
    fprintf(fp, "<system type=\"current\" size=\"%llu\"/>\n",
            (unsigned long long)lull_counters_resident_bound(&c.total));
    fprintf(fp, "<aspace type=\"total\" size=\"%llu\"/>\n", (unsigned long long)c.total.mapped);
    fprintf(fp,
            "<mallinfo arena=\"%zu\" hblks=\"%zu\" hblkhd=\"%zu\" uordblks=\"%zu\" "
            "fordblks=\"%zu\" keepcost=\"%zu\"/>\n",
            m.arena, m.hblks, m.hblkhd, m.uordblks, m.fordblks, m.keepcost);
    write_terms(fp, "accounting", &c.total);
    fprintf(fp, "</malloc>\n");
    return ferror(fp) ? -1 : 0;
}

#ifdef LULL_OVERRIDE
LULL_EXPORT int malloc_trim(size_t pad) {
    return lull_malloc_trim(pad);
}

/* glibc's fields, in struct lull_mallinfo2's order (lull.h) */
/* clang-format off */
#define MALLINFO_FIELDS(X) \
    X(arena) X(ordblks) X(smblks) X(hblks) X(hblkhd) \
    X(usmblks) X(fsmblks) X(uordblks) X(fordblks) X(keepcost)
/* clang-format on */

LULL_EXPORT struct mallinfo2 mallinfo2(void) {
    struct lull_mallinfo2 m = lull_mallinfo2();
    struct mallinfo2 out;
#define COPY(field) out.field = m.field;
    MALLINFO_FIELDS(COPY)
#undef COPY
    return out;
}

/* glibc (2.36) converts each field to int, which wraps past 2 GiB: 5 GiB
 * read as 1 GiB. Saturated instead: INT_MAX says "at least that much". */
static int saturated(size_t v) {
    return v > INT_MAX ? INT_MAX : (int)v;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
LULL_EXPORT struct mallinfo mallinfo(void) {
    struct lull_mallinfo2 m = lull_mallinfo2();
    struct mallinfo out;
#define SATURATE(field) out.field = saturated(m.field);
    MALLINFO_FIELDS(SATURATE)
#undef SATURATE
    return out;
}
#pragma GCC diagnostic pop

LULL_EXPORT void malloc_stats(void) {
    fflush(stderr); /* what the program wrote there first comes first */
    lull_print_stats(2);
}

LULL_EXPORT int malloc_info(int options, FILE *fp) {
    return lull_malloc_info(options, fp);
}
#endif
