/* A program linked with liblull.a exports glibc's malloc calls
 * (malloc_trim, mallinfo2, mallinfo, malloc_stats, malloc_info) with
 * malloc, also when it calls none of them itself: its plugins (dlopen'ed
 * libraries, which bind these names in the global scope) and the
 * libraries it links then reach lull's, not glibc's. Before, the archive
 * member that holds them (src/glibc_malloc.c) came only with a call of
 * the program's own: a plugin's malloc_trim(0) trimmed glibc's empty arena
 * and said 0, and its mallinfo2() read glibc's figures (hblkhd 0 with a
 * 64 MiB block live). glibc's __libc_* names of the malloc family
 * (tests/support/libc_names.h) are in malloc's own member and come with
 * it: a plugin's __libc_free(malloc(100)) must reach lull's free.
 *
 * This test program links liblull.a and must call none of those names, nor
 * the lull_* ones of the same file: it finds them by dlsym() as a plugin's
 * references are bound. Only in LULL_OVERRIDE builds (glibc's names are
 * lull's there). */
#define _GNU_SOURCE
#include "tests/support/libc_names.h"

#include <criterion/criterion.h>

#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

/* the object whose definition of `name` the global scope binds */
static const char *defining_object(const char *name) {
    void *sym = dlsym(RTLD_DEFAULT, name);
    cr_assert_not_null(sym, "%s: not found", name);
    Dl_info info;
    cr_assert(dladdr(sym, &info) && info.dli_fname, "%s: dladdr found no object", name);
    return info.dli_fname;
}

Test(glibc_calls_exported, with_malloc_from_a_program_that_calls_none) {
#ifndef LULL_OVERRIDE
    cr_skip_test("LULL_OVERRIDE is off: glibc's names are glibc's");
#endif
    /* malloc is this program's (liblull.a): the names must be found there */
    char *mine = strdup(defining_object("malloc"));
    static const char *const names[] = {"malloc_trim",  "mallinfo2",   "mallinfo",
                                        "malloc_stats", "malloc_info", LIBC_NAMES};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        cr_expect_str_eq(defining_object(names[i]), mine, "%s is bound in %s, malloc in %s",
                         names[i], defining_object(names[i]), mine);
    free(mine);
}

/* what a plugin's call reads: lull's heap, with a huge block in it */
Test(glibc_calls_exported, a_plugins_mallinfo2_sees_lulls_blocks) {
#ifndef LULL_OVERRIDE
    cr_skip_test("LULL_OVERRIDE is off: glibc's names are glibc's");
#endif
    struct mallinfo2 (*info)(void) = (struct mallinfo2(*)(void))dlsym(RTLD_DEFAULT, "mallinfo2");
    cr_assert_not_null(info);
    char *volatile p = malloc(64 * MiB);
    cr_assert_not_null(p);
    struct mallinfo2 m = info();
    cr_expect_geq(m.hblkhd, 64 * MiB, "hblkhd %zu with a 64 MiB block live", m.hblkhd);
    free(p);
}
