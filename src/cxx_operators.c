/* The C++ allocation operators (LULL_OVERRIDE builds) under their Itanium
 * ABI names: new and new[] (plain, nothrow, align_val_t, both), delete and
 * delete[] (plain, sized, aligned, sized and aligned, nothrow). C++ code
 * then reaches lull without libstdc++'s operators in between (their fast
 * paths are malloc's and free's, inline here), and a sized delete reaches
 * lull's size check.
 *
 * Written in C so that neither library needs the C++ runtime: a preloaded
 * liblull.so still needs only libc (and libz), and a C program links liblull.a
 * without -lstdc++, even all of it. What needs C++ (the new_handler,
 * throwing std::bad_alloc, and catching it in the nothrow forms) is
 * libstdc++'s own code, found once an allocation has failed. The file is
 * built with -fexceptions: an exception thrown by a new_handler or by
 * libstdc++ unwinds through these frames. */
#include "lull.h"
#include "src/alloc.h"
#include "src/entry_text.h"
#include "src/free_errors.h"
#include "base/message.h"

#ifdef LULL_OVERRIDE
#include <dlfcn.h>

typedef void (*new_handler)(void);

/* libstdc++'s std::get_new_handler() and std::__throw_bad_alloc(), as
 * weak references: a C program that takes all of liblull.a
 * (--whole-archive, so that its malloc replaces libc's without a call of
 * its own) must link without libstdc++, and a preloaded liblull.so load
 * into it. They are null when libstdc++ came after the program's start (a
 * C++ plugin that a C program dlopen()s: libstdcxx_sym() finds it then)
 * or when a fully static C++ program left that part of libstdc++ out (the
 * program set no handler then; nobody can throw for it, see
 * throw_bad_alloc()). */
__attribute__((weak)) new_handler _ZSt15get_new_handlerv(void);
__attribute__((weak, noreturn)) void _ZSt17__throw_bad_allocv(void);

/* libstdc++'s own definition of a symbol, if the process has libstdc++.so
 * loaded at all (also into a plugin's local scope); never lull's: a lookup
 * in a library's handle searches it first. The reference RTLD_NOLOAD takes
 * is given back at once: the library stays loaded for its user, whose code
 * is the one calling. */
static void *libstdcxx_sym(const char *name) {
    void *lib = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (!lib) return NULL;
    void *sym = dlsym(lib, name);
    dlclose(lib);
    return sym;
}

static new_handler installed_handler(void) {
    new_handler (*get)(void) = _ZSt15get_new_handlerv;
    if (!get) get = (new_handler(*)(void))libstdcxx_sym("_ZSt15get_new_handlerv");
    return get ? get() : NULL; /* no C++ runtime: nobody can have set one */
}

/* A fully static C++ program that throws nothing itself has no
 * std::__throw_bad_alloc() unless linked with -Wl,-u,_ZSt17__throw_bad_allocv
 * (README): lull aborts with its message there. */
__attribute__((noreturn)) static void throw_bad_alloc(size_t size) {
    void (*throw_it)(void) = _ZSt17__throw_bad_allocv;
    if (!throw_it) throw_it = (void (*)(void))libstdcxx_sym("_ZSt17__throw_bad_allocv");
    if (throw_it) throw_it();
    lull_fatal("operator new: out of memory (%zu bytes), and no libstdc++ to throw std::bad_alloc",
               size);
}

static bool power_of_two(size_t x) {
    return x && !(x & (x - 1));
}

/* alignment 0: the plain forms */
static inline void *allocate(size_t size, size_t alignment) {
    return alignment ? lull_aligned_alloc(alignment, size) : lull_malloc_inline(size);
}

/* The throwing forms' failure, as the standard has it: while a new_handler
 * is installed, call it and try again; then throw std::bad_alloc. An
 * alignment that is not a power of two never succeeds: no handler call
 * (libstdc++ throws at once too). */
LULL_ENTRY_TEXT __attribute__((noinline, cold)) static void *new_failed(size_t size, size_t alignment) {
    if (alignment && !power_of_two(alignment)) throw_bad_alloc(size);
    for (;;) {
        new_handler handler = installed_handler();
        if (!handler) throw_bad_alloc(size);
        handler();
        void *p = allocate(size, alignment);
        if (p) return p;
    }
}

/* The nothrow forms' failure: what the throwing form would do, with
 * nullptr for its std::bad_alloc. With no handler that is nullptr at once.
 * With one, the handler may throw, which C cannot catch: libstdc++'s own
 * nothrow form is that catch around the throwing form (it calls it through
 * its PLT, so it runs new_failed() above). Without libstdc++.so (a runtime
 * linked statically) the loop runs here, and a handler that throws is not
 * turned into nullptr: its exception goes on to the caller. */
enum nothrow_form { NEW, NEW_ARRAY, NEW_ALIGNED, NEW_ARRAY_ALIGNED };
static const char *const nothrow_names[] = {
    [NEW] = "_ZnwmRKSt9nothrow_t",
    [NEW_ARRAY] = "_ZnamRKSt9nothrow_t",
    [NEW_ALIGNED] = "_ZnwmSt11align_val_tRKSt9nothrow_t",
    [NEW_ARRAY_ALIGNED] = "_ZnamSt11align_val_tRKSt9nothrow_t",
};
static const char nothrow_tag; /* std::nothrow is an empty object: only its address is passed */

LULL_ENTRY_TEXT __attribute__((noinline, cold)) static void *nothrow_failed(size_t size, size_t alignment,
                                                            enum nothrow_form form) {
    if (alignment && !power_of_two(alignment)) return NULL;
    if (!installed_handler()) return NULL;
    void *catching = libstdcxx_sym(nothrow_names[form]);
    if (catching) {
        if (alignment)
            return ((void *(*)(size_t, size_t, const void *))catching)(size, alignment,
                                                                       &nothrow_tag);
        return ((void *(*)(size_t, const void *))catching)(size, &nothrow_tag);
    }
    for (;;) {
        new_handler handler = installed_handler();
        if (!handler) return NULL;
        handler();
        void *p = allocate(size, alignment);
        if (p) return p;
    }
}

/* ---- new ------------------------------------------------------------------------- */

#define LIKELY(x) __builtin_expect(!!(x), 1)

LULL_EXPORT LULL_ENTRY_TEXT void *_Znwm(size_t size) {
    void *p = lull_malloc_inline(size);
    return LIKELY(p) ? p : new_failed(size, 0);
}

LULL_EXPORT LULL_ENTRY_TEXT void *_Znam(size_t size) {
    void *p = lull_malloc_inline(size);
    return LIKELY(p) ? p : new_failed(size, 0);
}

LULL_EXPORT LULL_ENTRY_TEXT void *_ZnwmRKSt9nothrow_t(size_t size, const void *nothrow) {
    (void)nothrow;
    void *p = lull_malloc_inline(size);
    return LIKELY(p) ? p : nothrow_failed(size, 0, NEW);
}

LULL_EXPORT LULL_ENTRY_TEXT void *_ZnamRKSt9nothrow_t(size_t size, const void *nothrow) {
    (void)nothrow;
    void *p = lull_malloc_inline(size);
    return LIKELY(p) ? p : nothrow_failed(size, 0, NEW_ARRAY);
}

LULL_EXPORT LULL_ENTRY_TEXT void *_ZnwmSt11align_val_t(size_t size, size_t alignment) {
    void *p = lull_aligned_alloc(alignment, size);
    return LIKELY(p) ? p : new_failed(size, alignment);
}

LULL_EXPORT LULL_ENTRY_TEXT void *_ZnamSt11align_val_t(size_t size, size_t alignment) {
    void *p = lull_aligned_alloc(alignment, size);
    return LIKELY(p) ? p : new_failed(size, alignment);
}

LULL_EXPORT LULL_ENTRY_TEXT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t size, size_t alignment,
                                                     const void *nothrow) {
    (void)nothrow;
    void *p = lull_aligned_alloc(alignment, size);
    return LIKELY(p) ? p : nothrow_failed(size, alignment, NEW_ALIGNED);
}

LULL_EXPORT LULL_ENTRY_TEXT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t size, size_t alignment,
                                                     const void *nothrow) {
    (void)nothrow;
    void *p = lull_aligned_alloc(alignment, size);
    return LIKELY(p) ? p : nothrow_failed(size, alignment, NEW_ARRAY_ALIGNED);
}

/* ---- delete ---------------------------------------------------------------------- */

/* The sized forms check the size as free_sized() does (the alignment too:
 * an aligned block's class is the first whose blocks have it). */
__attribute__((always_inline)) static inline void delete_sized(const char *who, void *p,
                                                               size_t size, size_t alignment) {
    if (alignment <= 8) {
        lull_free_sized_inline(who, p, size);
        return;
    }
    if (p) lull_check_sized_free(who, p, alignment, size);
    lull_free_inline(p);
}

LULL_EXPORT void _ZdlPv(void *p) {
    lull_free_inline(p);
}

LULL_EXPORT void _ZdaPv(void *p) {
    lull_free_inline(p);
}

LULL_EXPORT void _ZdlPvm(void *p, size_t size) {
    delete_sized("operator delete", p, size, 1);
}

LULL_EXPORT void _ZdaPvm(void *p, size_t size) {
    delete_sized("operator delete[]", p, size, 1);
}

LULL_EXPORT void _ZdlPvSt11align_val_t(void *p, size_t alignment) {
    (void)alignment;
    lull_free_inline(p);
}

LULL_EXPORT void _ZdaPvSt11align_val_t(void *p, size_t alignment) {
    (void)alignment;
    lull_free_inline(p);
}

LULL_EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t size, size_t alignment) {
    delete_sized("operator delete", p, size, alignment);
}

LULL_EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t size, size_t alignment) {
    delete_sized("operator delete[]", p, size, alignment);
}

/* the nothrow deletes: what a constructor's exception in a nothrow new
 * calls */
LULL_EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const void *nothrow) {
    (void)nothrow;
    lull_free_inline(p);
}

LULL_EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const void *nothrow) {
    (void)nothrow;
    lull_free_inline(p);
}

LULL_EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t alignment,
                                                     const void *nothrow) {
    (void)alignment;
    (void)nothrow;
    lull_free_inline(p);
}

LULL_EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t alignment,
                                                     const void *nothrow) {
    (void)alignment;
    (void)nothrow;
    lull_free_inline(p);
}
#else
/* not an override build: the sanitizer (or libstdc++) owns new and delete */
typedef int lull_no_cxx_operators;
#endif
