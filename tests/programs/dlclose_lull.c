/* A program that loads liblull.so with dlopen (argv[1]), not preloaded nor
 * linked: a plugin that links -llull, loaded and unloaded by a host. It
 * starts the reclaim thread (a touched huge block freed, then a tick),
 * dlcloses the library and checks that the library stayed (RTLD_NOLOAD)
 * and that its reclaim thread still answers. Prints "OK" and exits 0;
 * exits 3 when the library was unloaded under its running thread (which
 * then ran code that was no longer mapped: SIGSEGV at its next tick). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    void *(*lull_malloc)(size_t) = (void *(*)(size_t))dlsym(lib, "lull_malloc");
    void (*lull_free)(void *) = (void (*)(void *))dlsym(lib, "lull_free");
    bool (*lull_reclaim_now)(void) = (bool (*)(void))dlsym(lib, "lull_reclaim_now");
    if (!lull_malloc || !lull_free || !lull_reclaim_now) return 2;
    const size_t size = (size_t)64 << 20;
    char *p = lull_malloc(size);
    if (!p) return 2;
    memset(p, 1, size);
    lull_free(p);
    if (!lull_reclaim_now()) return 4; /* no reclaim thread: nothing to test */
    if (dlclose(lib) != 0) return 2;
    void *again = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    if (!again) return 3;
    lull_reclaim_now = (bool (*)(void))dlsym(again, "lull_reclaim_now");
    if (!lull_reclaim_now || !lull_reclaim_now()) return 4;
    puts("OK");
    return 0;
}
